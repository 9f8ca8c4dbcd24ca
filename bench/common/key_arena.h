// Keys "<prefix>0", "<prefix>1", ... in one block of bytes, each read as a string_view: what the
// in-process scenarios (engine, sync) check, without a std::string per key (32 B of object each,
// request-side memory a measurement must keep small and out of its deltas).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::bench {

struct KeyArena {
  KeyArena(uint64_t n, std::string_view prefix) {
    offset.reserve(n + 1);
    bytes.reserve(n * (prefix.size() + 7));
    for (uint64_t i = 0; i < n; ++i) {
      offset.push_back(bytes.size());
      bytes += prefix;
      bytes += std::to_string(i);
    }
    offset.push_back(bytes.size());
  }
  std::string_view operator[](uint64_t i) const {
    return {bytes.data() + offset[i], static_cast<size_t>(offset[i + 1] - offset[i])};
  }

  std::string bytes;
  std::vector<uint64_t> offset;
};

}  // namespace sluice::bench
