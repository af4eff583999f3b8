// Logging: rank 0 prints progress; warnings and errors from any rank carry "[rank r@host]".
// A stream that cannot be written (the reader of a pipe went away) never ends the run: the first
// failed write to stdout is warned about once on stderr, later lines are dropped (see log.cc).
#pragma once

#include <string>

namespace dpt {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses "error|warn|info|debug"; throws an input error naming --log-level otherwise.
LogLevel parse_log_level(const std::string& s);
// Printed on rank 0 only (info), to stdout.
void log_info(const std::string& msg);
// Printed on rank 0 only, to stdout, whatever the log level: the result line that --quiet keeps.
void log_result(const std::string& msg);
void log_debug(const std::string& msg);
// Printed by whichever rank calls it, to stderr, prefixed with the rank.
void log_warn(const std::string& msg);
void log_error(const std::string& msg);
// Whether this process prints info lines (rank 0); set by the bootstrap.
void set_log_rank(int rank);
// Whether a write to stdout has failed (it is then no longer written to).
bool stdout_gone();

}  // namespace dpt
