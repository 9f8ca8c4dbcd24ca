// Counts heap allocations, so a test can show that a warm hot path allocates nothing. Include it
// in exactly ONE translation unit of a test binary: it replaces the global operator new/delete
// (every replaceable form that pairs with them, so sanitizers see malloc/free on both sides).
// malloc and free sit behind out-of-line helpers: once inlined, g++ -O3 would see free() of a
// pointer from operator new and warn (-Wmismatched-new-delete).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace sluice::testing {

inline std::atomic<uint64_t> g_allocations{0};

// Heap allocations made by this process so far.
inline uint64_t allocations() {
  return g_allocations.load(std::memory_order_relaxed);
}

[[gnu::noinline]] inline void* counted_malloc(std::size_t n) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
[[gnu::noinline]] inline void counted_free(void* p) noexcept {
  std::free(p);
}

}  // namespace sluice::testing

void* operator new(std::size_t n) {
  if (void* p = sluice::testing::counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  return ::operator new(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return sluice::testing::counted_malloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return sluice::testing::counted_malloc(n);
}
void operator delete(void* p) noexcept {
  sluice::testing::counted_free(p);
}
void operator delete[](void* p) noexcept {
  sluice::testing::counted_free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  sluice::testing::counted_free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  sluice::testing::counted_free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  sluice::testing::counted_free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  sluice::testing::counted_free(p);
}
