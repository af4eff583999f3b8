// The one list splitter of the project: every parser of a list text (a flag's "0.9,0.999", the
// synthetic spec's "28x28x1", a cpuset file's "0-3,8", a --save file's input_shape "32,32,3")
// splits with it, so they all agree on what an empty item and an empty text are.
#pragma once

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

}  // namespace dpt
