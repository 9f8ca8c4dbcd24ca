// Shared by tests that hand-craft Cap'n Proto messages word by word (wire and peer codec tests):
// the pointer words of the encoding spec. An offset counts words from the end of the pointer.
#pragma once

#include <cstdint>

namespace sluice::testing {

inline uint64_t struct_ptr(int64_t offset, uint16_t data_words, uint16_t ptr_count) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2)) |
         (uint64_t{data_words} << 32) | (uint64_t{ptr_count} << 48);
}
enum ElementSize : uint32_t { kVoid = 0, kByte = 2, kEightBytes = 5, kInlineComposite = 7 };
inline uint64_t list_ptr(int64_t offset, ElementSize size, uint32_t count) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2) | 1u) |
         (uint64_t{size | (count << 3)} << 32);
}
inline uint64_t far_ptr(uint32_t landing_word, bool double_far, uint32_t segment) {
  return uint64_t{(landing_word << 3) | (double_far ? 4u : 0u) | 2u} | (uint64_t{segment} << 32);
}

}  // namespace sluice::testing
