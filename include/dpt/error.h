// dpt::Error and the one check-macro family of the project.
// Every failure becomes a typed dpt::Error carrying an exit code: 2 for bad input (files, flags,
// checkpoints), 3 for internal/library failures. main() prints it once and ends every rank.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dpt {

enum class ErrorKind : int {
  kInput = 2,     // the user's data, flags or files are wrong: exit code 2
  kInternal = 3,  // a library call or an invariant failed: exit code 3
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return static_cast<int>(kind_); }

 private:
  ErrorKind kind_;
};

// An input error every rank knows about (agreed by a collective), so no MPI_Abort is needed.
// Ranks that were not themselves at fault carry quiet = true and print nothing.
struct AgreedInputError : Error {
  AgreedInputError(const std::string& message, bool quiet_rank)
      : Error(ErrorKind::kInput, message), quiet(quiet_rank) {}
  bool quiet;
};

// "[rank r@host] " once MPI is up (set by the bootstrap), empty before.
const std::string& rank_prefix();
void set_rank_prefix(const std::string& prefix);

// Text read from a file (a checkpoint's metadata, a header, a name found in a directory), made safe
// to quote in a message: control bytes and bytes above 0x7e become escapes ("\n", "\x1b"), so a
// newline or a terminal escape in a file cannot forge or recolour a log line, and text past `limit`
// bytes is cut ("... (100000 bytes)"), so a huge field cannot make a huge line. Every message that
// quotes a file's content goes through this.
std::string printable(std::string_view text, size_t limit = 120);
// A list for a message: the first `shown` items, printable(), then "and 2,997 more".
std::string summarize(const std::vector<std::string>& items, size_t shown = 3);

namespace detail {
[[noreturn]] void throw_error(ErrorKind kind, const char* library, const std::string& message,
                              const char* file, int line, const char* expr);
}  // namespace detail

// Builds a message from stream pieces: DPT_MSG("bad " << x).
#define DPT_MSG(stream_expr) \
  (static_cast<std::ostringstream&&>(std::ostringstream() << stream_expr)).str()

// Bad user input: a message that names the file/flag/rank and what is wrong; exit code 2.
#define DPT_INPUT_CHECK(cond, stream_expr)                                           \
  do {                                                                               \
    if (!(cond)) throw ::dpt::Error(::dpt::ErrorKind::kInput, DPT_MSG(stream_expr)); \
  } while (0)

// The generator of the library check family: evaluates `call`, and if `failed(status)` throws
// "<library> error: <message> at file:line: <expr>". Each library macro below is one line of it.
#define DPT_LIB_CHECK(library, call, failed, message_of)                                        \
  do {                                                                                          \
    auto dpt_status_ = (call);                                                                  \
    if (failed(dpt_status_))                                                                    \
      ::dpt::detail::throw_error(::dpt::ErrorKind::kInternal, library, message_of(dpt_status_), \
                                 __FILE__, __LINE__, #call);                                    \
  } while (0)

// Internal invariant (not the user's fault).
#define DPT_CHECK(cond, stream_expr)                                                           \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::dpt::detail::throw_error(::dpt::ErrorKind::kInternal, "dptrain", DPT_MSG(stream_expr), \
                                 __FILE__, __LINE__, #cond);                                   \
  } while (0)

}  // namespace dpt
