// The list splitter and the number reader of include/dpt/text.h (their rules are explained
// there).
#include "dpt/text.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <type_traits>

namespace dpt {

std::vector<std::string> split_list(std::string_view text, char sep) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  for (size_t at = 0;;) {
    const size_t end = std::min(text.find(sep, at), text.size());
    items.emplace_back(text.substr(at, end - at));
    if (end == text.size()) return items;
    at = end + 1;
  }
}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Whether a decimal text that from_chars found out of a double's range is too large (else too
// small): the power of ten of its first nonzero digit, from the digits around the point and the
// exponent, is above 0 for every text too large and below -300 for every one too small.
bool beyond_largest(std::string_view text) {
  if (!text.empty() && text[0] == '-') text.remove_prefix(1);
  const size_t e = text.find_first_of("eE");
  const std::string_view mantissa = text.substr(0, e);
  const size_t point = std::min(mantissa.find('.'), mantissa.size());
  const size_t first = mantissa.find_first_of("123456789");
  if (first == std::string_view::npos) return false;  // no nonzero digit: 0, never out of range
  // Digits before the point from the first nonzero one, or minus the zeros after the point.
  long long power = first < point ? static_cast<long long>(point - first)
                                  : -static_cast<long long>(first - point - 1);
  if (e != std::string_view::npos) {
    std::string_view exp = text.substr(e + 1);
    const bool negative = !exp.empty() && exp[0] == '-';
    if (!exp.empty() && (exp[0] == '-' || exp[0] == '+')) exp.remove_prefix(1);
    long long x = 0;
    const auto [end, ec] = std::from_chars(exp.data(), exp.data() + exp.size(), x);
    // An exponent beyond long long decides alone; else both terms are far from overflowing.
    if (ec == std::errc::result_out_of_range) return !negative;
    if (x > (1LL << 60)) return !negative;
    power += negative ? -x : x;
  }
  return power > 0;
}

}  // namespace

template <typename T>
std::optional<T> read_number(std::string_view text, NumberError* error) {
  NumberError ignored;
  NumberError& why = error ? *error : ignored;
  why = NumberError::kSyntax;
  const char *first = text.data(), *last = text.data() + text.size();
  // from_chars takes no blank and no '+' already; what it takes beyond the forms above is a
  // double's "inf", "infinity", "nan" and "nan(...)": a number here starts with a digit or a
  // point after its optional '-'.
  const std::string_view body = !text.empty() && text[0] == '-' ? text.substr(1) : text;
  if (body.empty() || !(is_digit(body[0]) || (std::is_floating_point_v<T> && body[0] == '.')))
    return std::nullopt;
  T value{};
  std::from_chars_result r;
  if constexpr (std::is_floating_point_v<T>)
    r = std::from_chars(first, last, value, std::chars_format::general);  // never hex
  else
    r = std::from_chars(first, last, value, 10);
  if (r.ptr != last) return std::nullopt;  // stopped early: "0x10" at 'x', "1.5" (integer) at '.'
  if (r.ec == std::errc::result_out_of_range) {
    if constexpr (std::is_floating_point_v<T>)
      why = beyond_largest(text) ? NumberError::kTooLarge : NumberError::kTooSmall;
    else
      why = NumberError::kTooLarge;
    return std::nullopt;
  }
  if (r.ec != std::errc()) return std::nullopt;
  why = NumberError::kNone;
  return value;
}

template <typename T>
std::string number_error_text(NumberError error) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (error) {
      case NumberError::kTooLarge:
        return "is not a number a double can hold: it is too large";
      case NumberError::kTooSmall:
        return "is not a number a double can hold: it is too small, and would be 0";
      default:
        return "is not a number";
    }
  } else {
    if (error == NumberError::kTooLarge)
      return "is out of range (a whole number from " +
             std::to_string(std::numeric_limits<T>::min()) + " to " +
             std::to_string(std::numeric_limits<T>::max()) + ")";
    return std::is_signed_v<T> ? "is not a whole number (decimal digits, '-' before a negative one)"
                               : "is not a whole number (decimal digits)";
  }
}

#define DPT_READ_NUMBER(T)                                                              \
  template std::optional<T> read_number<T>(std::string_view text, NumberError * error); \
  template std::string number_error_text<T>(NumberError error);
DPT_READ_NUMBER(int)
DPT_READ_NUMBER(long)
DPT_READ_NUMBER(long long)
DPT_READ_NUMBER(unsigned)
DPT_READ_NUMBER(unsigned long)
DPT_READ_NUMBER(unsigned long long)
DPT_READ_NUMBER(double)
#undef DPT_READ_NUMBER

}  // namespace dpt
