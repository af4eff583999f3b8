// The one list splitter and the one number reader of the project: every parser of a list text (a
// flag's "0.9,0.999", the synthetic spec's "28x28x1", a cpuset file's "0-3,8", a --save file's
// input_shape "32,32,3") splits with split_list, and every number a user types (a flag's value or
// list item, a DPT_* variable, a model file's metadata) is read by read_number, so they all agree
// on what an empty item, an empty text and a number are.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dpt {

// The items of `text` between its `sep`s, in order, empty ones kept: "a,,b" is {"a", "", "b"},
// "a," is {"a", ""} and ",a" is {"", "a"}, so a parser sees the empty item and refuses it by name
// instead of reading "1,,2" as "1,2" or "1," as "1".
//
// The empty text is no items ({}), not one empty item ({""}), deliberately: for the lists that may
// be empty it is the empty list (a cpuset file of no CPUs; --normalize "/", refused as "gives no
// means" rather than as a mean '' that is not a number), and a parser that needs a count (B1,B2;
// HxWxC; H,W,C) refuses zero items with the same message as one. The cost: a list of one empty
// item cannot be written, and no caller takes one.
//
// Named split_list, not split: "split" is the project's word for a data set's train/test part.
std::vector<std::string> split_list(std::string_view text, char sep);

// Why read_number refused a text.
enum class NumberError {
  kNone,
  kSyntax,    // not a number of the type's form (below)
  kTooLarge,  // a number of that form, beyond the type's range (an integer's either way)
  kTooSmall,  // floating point: not 0, but nearer 0 than the smallest double (it would be 0)
};

// The number `text` is, read strictly with std::from_chars, or nothing (and `*error`, when given,
// says why). Decimal only, the whole text and nothing else: no blank before or after it, no '+',
// no "0x" (hex integer or hex float), no digit-group or locale separator (',' is never a decimal
// point). An integer (T integral) is an optional '-' (signed types only) and digits, leading zeros
// allowed ("08" is 8); one outside T's range is kTooLarge, never clamped or wrapped. A floating
// point number (T = double) is an optional '-', digits with an optional '.' (".5" and "5." too),
// and an optional exponent (e or E, an optional sign, digits): "0.1", "-2.5e-3", "1E5". "nan",
// "inf" and "infinity" are refused (kSyntax) wherever a number is read: no caller takes them. The
// value is the nearest double, bit for bit what strtod gives the same decimal text (subnormals
// included); above the largest double is kTooLarge and a nonzero value that would round to 0
// kTooSmall (strtod gives HUGE_VAL or 0 with ERANGE, which its callers used to take).
// Instantiated for int, long, long long, unsigned, unsigned long, unsigned long long and double.
template <typename T>
std::optional<T> read_number(std::string_view text, NumberError* error = nullptr);

// A clause for a refusal message: what read_number's error means for a text read as T ("is not a
// whole number (decimal digits only)", "is too large for a double", ...), after "'TEXT' ".
template <typename T>
std::string number_error_text(NumberError error);

}  // namespace dpt
