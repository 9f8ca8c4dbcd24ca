// Text checks shared by the tests (std::string::contains is C++23).
#pragma once

#include <string_view>

namespace sluice::testing {

// True when `needle` occurs in `haystack`.
inline bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

}  // namespace sluice::testing
