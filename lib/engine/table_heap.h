// Private to lib/engine: storage for counter tables smaller than one huge page, packed side by
// side into regions that transparent huge pages back.
//
// A check's slot is a random address in its table, so at a million keys nearly every check also
// misses the TLB, and in a virtual machine a TLB miss is a nested page walk. A table of two MiB or
// more gets a mapping of its own on huge pages (CounterTable::allocate); the smaller ones, which
// is every table of a 64-shard engine below about 1.5 million keys, could not hold a huge page
// alone. Here they share: a region of kRegionBytes is mapped once, advised MADV_HUGEPAGE, and
// handed out in kUnit runs. The kernel backs a huge page when it is first touched.
//
// - allocate() gives zeroed storage (a run of units in the first region with room, else a new
//   region), or nullptr when no region can be mapped: the caller then uses the C heap.
// - release() frees the run. A huge page none of whose units is in use goes back to the kernel
//   (MADV_DONTNEED), and a region with no unit in use is unmapped.
// - Resident bytes count every huge page that holds a unit in use: what the process pays,
//   including the free units beside live ones (docs/architecture.md, "Memory").
//
// Thread-safe (one mutex; tables are allocated only when they are made or grow).
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice::engine::table_heap {

constexpr size_t kUnit = 4096;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kRegionBytes = size_t{64} << 20;
// Tables from this size up to kHugePage come from here; smaller ones waste too much of a unit.
constexpr size_t kFrom = size_t{64} << 10;

// `len` bytes (a multiple of 4 KiB) of zeroed memory mapped on their own, starting on a huge-page
// boundary and advised MADV_HUGEPAGE; nullptr if they cannot be mapped. munmap frees them.
void* map_huge(size_t len);

// Zeroed storage of `bytes` (kFrom <= bytes < kHugePage) rounded up to a whole unit, aligned to
// kUnit; nullptr if no region could be mapped.
void* allocate(size_t bytes);
// Gives back what allocate(bytes) returned, with the same `bytes`.
void release(void* p, size_t bytes);

struct Stats {
  uint64_t regions = 0;         // mapped regions
  uint64_t allocated = 0;       // bytes handed out (whole units)
  uint64_t resident = 0;        // bytes of the huge pages that hold a unit in use
  uint64_t pages_released = 0;  // huge pages given back to the kernel, since the start
};
Stats stats();

}  // namespace sluice::engine::table_heap
