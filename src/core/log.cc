// Logging (include/dpt/log.h): levels, rank-0-only output, and whole lines written once each to
// stdout and stderr, which training outlives (a closed pipe stops the writing, not the run).
#include "dpt/log.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "dpt/error.h"

namespace dpt {

namespace {
LogLevel g_level = LogLevel::kInfo;
int g_rank = 0;
// Set by the first failed write to the stream. Training never depends on being watched: with
// SIGPIPE ignored (main) a closed pipe makes writes fail with EPIPE, and we stop writing there
// instead of paying a failing syscall per line (or dying, as SIGPIPE would have us).
std::atomic<bool> g_stdout_gone{false};
std::atomic<bool> g_stderr_gone{false};

// One whole line per call, so lines of threads and ranks do not interleave mid-line.
bool write_line(FILE* stream, const std::string& line) {
  const bool ok = std::fwrite(line.data(), 1, line.size(), stream) == line.size();
  return std::fflush(stream) == 0 && ok;
}

// stderr: a failure just ends writing there (there is nowhere left to say so).
void write_stderr(const std::string& line) {
  if (g_stderr_gone.load(std::memory_order_relaxed)) return;
  if (!write_line(stderr, line)) g_stderr_gone.store(true, std::memory_order_relaxed);
}

// stdout: the first failure is reported once on stderr (a warning: not under --log-level error), if
// that still works; later lines are dropped. Said of "the run": evaluate and predict write here
// too.
void write_stdout(const std::string& line) {
  if (g_stdout_gone.load(std::memory_order_relaxed)) return;
  errno = 0;
  if (write_line(stdout, line)) return;
  const int err = errno;
  if (g_stdout_gone.exchange(true)) return;  // another thread already reported it
  std::clearerr(stdout);
  if (g_level < LogLevel::kWarn) return;
  const std::string why = err == EPIPE ? "the reader closed the pipe"
                          : err        ? std::strerror(err)
                                       : "a write failed";
  write_stderr(rank_prefix() + "warning: stdout is gone (" + why +
               "): the run goes on; later stdout lines are dropped\n");
}
}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }
void set_log_rank(int rank) { g_rank = rank; }
bool stdout_gone() { return g_stdout_gone.load(std::memory_order_relaxed); }

LogLevel parse_log_level(const std::string& s) {
  if (s == "error") return LogLevel::kError;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  throw Error(ErrorKind::kInput, "--log-level: '" + s + "' is not one of error|warn|info|debug");
}

void log_info(const std::string& msg) {
  if (g_rank != 0 || g_level < LogLevel::kInfo) return;
  write_stdout(msg + "\n");
}
void log_result(const std::string& msg) {
  if (g_rank != 0) return;
  write_stdout(msg + "\n");
}
void log_debug(const std::string& msg) {
  if (g_level < LogLevel::kDebug) return;
  write_stderr(rank_prefix() + "debug: " + msg + "\n");
}
void log_warn(const std::string& msg) {
  if (g_level < LogLevel::kWarn) return;
  write_stderr(rank_prefix() + "warning: " + msg + "\n");
}
void log_error(const std::string& msg) { write_stderr(rank_prefix() + "error: " + msg + "\n"); }

}  // namespace dpt
