// The out-of-line half of include/dpt/error.h: the rank prefix and the message format shared by
// every check macro, so each error reads "[rank r@host] <library> error: <message> at file:line: <expr>".
#include "dpt/error.h"

namespace dpt {

namespace {
std::string& prefix_storage() {
  static std::string prefix;
  return prefix;
}
}  // namespace

const std::string& rank_prefix() { return prefix_storage(); }
void set_rank_prefix(const std::string& prefix) { prefix_storage() = prefix; }

namespace detail {
void throw_error(ErrorKind kind, const char* library, const std::string& message, const char* file,
                 int line, const char* expr) {
  std::ostringstream os;
  os << library << " error: " << message << " at " << file << ":" << line << ": " << expr;
  throw Error(kind, os.str());
}
}  // namespace detail

}  // namespace dpt
