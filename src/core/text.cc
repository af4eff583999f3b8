// The list splitter of include/dpt/text.h (its empty-text and empty-item rules are explained
// there).
#include "dpt/text.h"

#include <algorithm>

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

}  // namespace dpt
