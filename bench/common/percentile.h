// The one percentile of the benchmarks: nearest rank, q in 0..1.
//
//   percentile(v, q) = the ceil(q * n)-th smallest of the n samples (1-based; q = 0 gives the
//   smallest, q = 1 the largest), or NaN when there are none.
//
// Every sample reported is one that was measured; nothing is interpolated. The load generator's
// histogram (load/histogram.h) keeps its buckets: it never holds the samples.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace sluice::bench {

// The rank (0-based index into the sorted samples) of quantile q among n > 0 samples.
inline std::size_t nearest_rank(std::size_t n, double q) {
  const double r = std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(n));
  return r < 1 ? 0 : std::min(n - 1, static_cast<std::size_t>(r) - 1);
}

// The quantile q of samples already sorted ascending.
template <class T>
double percentile_sorted(const std::vector<T>& sorted, double q) {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(sorted[nearest_rank(sorted.size(), q)]);
}

// The quantile q of samples in any order (copied and partly sorted; the input stays as it is).
template <class T>
double percentile(std::vector<T> samples, double q) {
  if (samples.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto k = samples.begin() + static_cast<std::ptrdiff_t>(nearest_rank(samples.size(), q));
  std::nth_element(samples.begin(), k, samples.end());
  return static_cast<double>(*k);
}

}  // namespace sluice::bench
