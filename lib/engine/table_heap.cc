#include "engine/table_heap.h"

#include <sys/mman.h>

#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace sluice::engine::table_heap {
namespace {

constexpr size_t kUnitsPerRegion = kRegionBytes / kUnit;
constexpr size_t kUnitsPerPage = kHugePage / kUnit;
constexpr size_t kPagesPerRegion = kRegionBytes / kHugePage;
constexpr size_t kWords = kUnitsPerRegion / 64;
static_assert(kUnitsPerRegion % 64 == 0 && kRegionBytes % kHugePage == 0);

struct Region {
  char* base = nullptr;
  std::array<uint64_t, kWords> used{};           // a bit per unit
  std::array<uint32_t, kPagesPerRegion> live{};  // units in use per huge page
  size_t units_used = 0;
};

struct Heap {
  std::mutex mu;
  std::vector<std::unique_ptr<Region>> regions;
  Stats stats;
};

Heap& heap() {
  static Heap* h = new Heap;  // never destroyed: tables of static engines may outlive main
  return *h;
}

std::unique_ptr<Region> map_region() {
  void* p = map_huge(kRegionBytes);
  if (p == nullptr) return nullptr;
  auto r = std::make_unique<Region>();
  r->base = static_cast<char*>(p);
  return r;
}

bool is_used(const Region& r, size_t u) {
  return (r.used[u / 64] >> (u % 64) & 1) != 0;
}

// The first unit of the smallest run of at least `n` free units in `r` (the lowest of equals),
// and that run's length; {kUnitsPerRegion, 0} when there is none. Best fit: tables grow by half
// at a time, and the runs they free are reused by the next ones to grow before a larger run is
// cut into (at 1M keys and one bucket, first fit held 44.4 B per key and best fit 42.3).
std::pair<size_t, size_t> best_run(const Region& r, size_t n) {
  std::pair<size_t, size_t> best{kUnitsPerRegion, 0};
  size_t run = 0;
  size_t start = 0;
  const auto close = [&] {
    if (run >= n && (best.second == 0 || run < best.second)) best = {start, run};
    run = 0;
  };
  for (size_t w = 0; w < kWords; ++w) {
    const uint64_t word = r.used[w];
    if (word == ~uint64_t{0}) {
      close();
      continue;
    }
    if (word == 0) {
      if (run == 0) start = w * 64;
      run += 64;
      continue;
    }
    for (size_t b = 0; b < 64; ++b) {
      if (word >> b & 1) {
        close();
        continue;
      }
      if (run == 0) start = w * 64 + b;
      ++run;
    }
  }
  close();
  return best;
}

}  // namespace

void* map_huge(size_t len) {
  // Mapped one huge page longer, so that it can start on a huge-page boundary; the unused head
  // and tail are unmapped at once.
  const size_t span = len + kHugePage;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t start = (at + kHugePage - 1) & ~(kHugePage - 1);
  if (start > at) munmap(p, start - at);
  if (at + span > start + len) {
    munmap(reinterpret_cast<void*>(start + len), at + span - start - len);
  }
  madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE);  // advice: failure is harmless
  return reinterpret_cast<void*>(start);
}

void* allocate(size_t bytes) {
  const size_t n = (bytes + kUnit - 1) / kUnit;
  if (n == 0 || n > kUnitsPerPage) return nullptr;
  Heap& h = heap();
  std::lock_guard g(h.mu);
  Region* r = nullptr;
  size_t first = kUnitsPerRegion;
  size_t fit = 0;
  for (auto& candidate : h.regions) {
    if (kUnitsPerRegion - candidate->units_used < n) continue;
    const auto [at, len] = best_run(*candidate, n);
    if (len != 0 && (fit == 0 || len < fit)) {
      r = candidate.get();
      first = at;
      fit = len;
    }
  }
  if (r == nullptr) {
    std::unique_ptr<Region> fresh = map_region();
    if (!fresh) return nullptr;
    r = h.regions.emplace_back(std::move(fresh)).get();
    ++h.stats.regions;
    first = 0;
  }
  for (size_t u = first; u < first + n; ++u) {
    r->used[u / 64] |= uint64_t{1} << (u % 64);
    if (r->live[u / kUnitsPerPage]++ == 0) h.stats.resident += kHugePage;
  }
  r->units_used += n;
  h.stats.allocated += n * kUnit;
  char* p = r->base + first * kUnit;
  // Units freed before (in a page that stayed in use) still hold old slots.
  std::memset(p, 0, n * kUnit);
  return p;
}

void release(void* p, size_t bytes) {
  if (p == nullptr) return;
  const size_t n = (bytes + kUnit - 1) / kUnit;
  Heap& h = heap();
  std::lock_guard g(h.mu);
  const auto at = static_cast<char*>(p);
  for (auto it = h.regions.begin(); it != h.regions.end(); ++it) {
    Region& r = **it;
    if (at < r.base || at >= r.base + kRegionBytes) continue;
    const auto first = static_cast<size_t>(at - r.base) / kUnit;
    for (size_t u = first; u < first + n; ++u) {
      if (!is_used(r, u)) continue;  // not handed out: a caller bug, but never count it twice
      r.used[u / 64] &= ~(uint64_t{1} << (u % 64));
      --r.units_used;
      h.stats.allocated -= kUnit;
      const size_t page = u / kUnitsPerPage;
      if (--r.live[page] == 0) {
        h.stats.resident -= kHugePage;
        ++h.stats.pages_released;
        if (r.units_used != 0) {  // a region unmapped below gives all its pages back at once
          madvise(r.base + page * kHugePage, kHugePage, MADV_DONTNEED);
        }
      }
    }
    if (r.units_used == 0) {
      munmap(r.base, kRegionBytes);
      h.regions.erase(it);
      --h.stats.regions;
    }
    return;
  }
}

Stats stats() {
  Heap& h = heap();
  std::lock_guard g(h.mu);
  return h.stats;
}

}  // namespace sluice::engine::table_heap
