// The out-of-line half of include/dpt/error.h: the rank prefix and the message format shared by
// every check macro, so each error reads "[rank r@host] <library> error: <message> at file:line:
// <expr>".
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

std::string printable(std::string_view text, size_t limit) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  size_t i = 0;
  for (; i < text.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += "\\\\";  // so an escape stays unambiguous: a "\n" in the file reads "\\n"
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

namespace {
// 2997 -> "2,997": counts in messages are read by people.
std::string grouped(size_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}
}  // namespace

std::string summarize(const std::vector<std::string>& items, size_t shown) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < shown; ++i)
    out += (i ? ", " : "") + printable(items[i]);
  if (items.size() > shown) out += " and " + grouped(items.size() - shown) + " more";
  return out;
}

namespace detail {
void throw_error(ErrorKind kind, const char* library, const std::string& message, const char* file,
                 int line, const char* expr) {
  std::ostringstream os;
  os << library << " error: " << message << " at " << file << ":" << line << ": " << expr;
  throw Error(kind, os.str());
}
}  // namespace detail

}  // namespace dpt
