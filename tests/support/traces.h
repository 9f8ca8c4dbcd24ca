// Deterministic request traces for the accuracy test and benchmarks: accuracy is measured on
// steady, bursty and window-edge traces (docs/benchmarks.md).
//
// Every generator is a pure function of its TraceParams: a seeded std::mt19937_64 and no clock.
// The random variates are computed here from the raw 64-bit engine output (not with
// std::*_distribution, whose algorithms differ between standard libraries), so a seed names the
// same trace on every platform. Events come out sorted by time; events of one millisecond keep
// their generation order.
//
// Traces (names as accepted by make_trace):
//   steady-0.5x, steady-1x, steady-2x  Poisson arrivals on one key at 0.5, 1 and 2 times the
//                                      limit rate (limit / window).
//   on-off      one key: Poisson bursts at 3x the limit rate for a quarter window, then silence
//               for three quarters, repeating every window (average 0.75x); the phase of the
//               bursts against the epoch comes from the seed.
//   edge-burst  the window-edge burst on one key: `limit` hits spread over the last 5% of
//               a window before an epoch-aligned window (and so bucket) boundary and `limit` more
//               over the first 5% after it, then silence; repeating every 2 windows. A fixed
//               window admits both halves (2x the limit); an exact sliding window admits one.
//   mixed       modelled on Cloudflare's measurement: 10,000 keys with Zipf(s = 1.1) popularity,
//               the total rate set so the hottest key runs at 10x its limit; then keys 1-4 run at
//               2x to 10x, only ~15 keys (0.15%) reach 0.5x and the rest stay far below. Bounded
//               by max_events.
//   cloudflare  modelled on Cloudflare's published measurement of its sliding window (400 million
//               requests from 270,000 distinct sources, 0.003% wrongly decided): kCloudflareSources
//               = 270,000 keys over a run of p.windows windows (the bench runs 40 windows with a
//               limit of 100 in every window case). Rates are factors of the limit rate
//               (limit / window); arrivals are Poisson at the source's rate (exponential gaps):
//               - normal sources, keys 270 .. 269,999 (99.9%): factor r from a Pareto with
//                 alpha = 1 bounded to [0.0002, 1): P(r > x) = (0.0002/x - 0.0002) / 0.9998, so
//                 the median is 0.0004, 99.8% are below 0.1, 0.02% (about 54) are at 0.5 to 1,
//                 none is above 1, mean 0.0017. Each arrives at a uniform time in the run, sends
//                 one request then, then Poisson at r until the end of the run;
//               - abusive sources, keys 0 .. 269 (kCloudflareAbusive, 0.1%): factor f =
//                 2 * 10^u (log-uniform in [2, 20)), one episode starting at a uniform time in the
//                 run and lasting a uniform [1, 4) windows (cut at the end of the run). Even keys
//                 are steady: a request at the episode's start, then Poisson at f until its end.
//                 Odd keys send bursts: a burst lasts a uniform [0.1, 0.5) of a window (cut at the
//                 episode's end), sends a request at its start, then Poisson at f until it ends;
//                 then silence for a uniform [0.5, 2) windows; repeated while the next burst starts
//                 before the episode's end.
//               Parameters are drawn in key order (abusive: f, start, length, first burst length;
//               normal: r, arrival), then requests in time order (a heap over the sources, ties by
//               key), so the trace is bounded by max_events in time like mixed. Expected size
//               with limit L over D windows: normal 269,730 * (1 + 0.0017 * L * D / 2) requests
//               (1.19M at L = 100, D = 40); abusive about 135 * 7.8 * L * 2.5 (steady) plus a
//               fifth of that (bursts): ~0.3M at L = 100.
// Each request costs a uniform number of hits in [1, max_hits]; rates above are in hits, so with
// max_hits > 1 there are proportionally fewer requests.
#pragma once

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::testing {

struct Event {
  int64_t t_ms;
  uint32_t key;
  uint32_t hits;
};

// 2023-11-14T00:00:00Z: a whole day since the epoch, so it is aligned to every bucket and window
// boundary (1 s .. 1 d) and traces start on one.
inline constexpr int64_t kTraceStartMs = 19'675LL * 86'400'000LL;

struct TraceParams {
  int64_t window_ms = 60'000;
  uint64_t limit = 600;   // hits per window the traces are scaled to
  int64_t windows = 100;  // duration, in windows
  uint64_t seed = 1;
  uint32_t max_hits = 1;  // each request costs uniform [1, max_hits] hits
  int64_t start_ms = kTraceStartMs;
  size_t max_events = 2'000'000;  // generation stops here (it bounds mixed in practice)
};

inline constexpr std::array<std::string_view, 7> kTraceNames = {
    "steady-0.5x", "steady-1x", "steady-2x", "on-off", "edge-burst", "mixed", "cloudflare"};

namespace trace_detail {

// Uniform in [0, 1) with 53 random bits.
inline double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Uniform in [0, n); the modulo bias is below 2^-40 for the n used here.
inline uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  assert(n > 0);
  return rng() % n;
}

// Exponential inter-arrival time for a Poisson process of `rate` events per ms.
inline double exponential(std::mt19937_64& rng, double rate) {
  return -std::log1p(-uniform01(rng)) / rate;
}

inline uint32_t draw_hits(std::mt19937_64& rng, uint32_t max_hits) {
  return max_hits <= 1 ? 1u : 1u + static_cast<uint32_t>(uniform_below(rng, max_hits));
}

inline double mean_hits(uint32_t max_hits) {
  return max_hits <= 1 ? 1.0 : (1.0 + static_cast<double>(max_hits)) / 2.0;
}

// Hits per millisecond at `factor` times the limit rate.
inline double hit_rate(const TraceParams& p, double factor) {
  return factor * static_cast<double>(p.limit) / static_cast<double>(p.window_ms);
}

// Appends Poisson arrivals on `key` over [from, to) (ms offsets from start) at `req_rate`
// requests per ms. Returns false once max_events is reached.
inline bool poisson(std::mt19937_64& rng, const TraceParams& p, double from, double to,
                    double req_rate, uint32_t key, std::vector<Event>& out) {
  double t = from;
  while (true) {
    t += exponential(rng, req_rate);
    if (t >= to) return true;
    if (out.size() >= p.max_events) return false;
    out.push_back({p.start_ms + static_cast<int64_t>(t), key, draw_hits(rng, p.max_hits)});
  }
}

// Appends requests worth exactly `total` hits at uniform random times in [lo, hi) (absolute ms),
// sorted by time.
inline bool spread(std::mt19937_64& rng, const TraceParams& p, int64_t lo, int64_t hi,
                   uint64_t total, uint32_t key, std::vector<Event>& out) {
  const size_t first = out.size();
  uint64_t left = total;
  while (left > 0) {
    if (out.size() >= p.max_events) return false;
    const uint32_t h = static_cast<uint32_t>(std::min<uint64_t>(draw_hits(rng, p.max_hits), left));
    const auto t = lo + static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(hi - lo)));
    out.push_back({t, 0, h});
    left -= h;
  }
  for (size_t i = first; i < out.size(); ++i)
    out[i].key = key;
  std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                   [](const Event& a, const Event& b) { return a.t_ms < b.t_ms; });
  return true;
}

}  // namespace trace_detail

// Samples ranks 0..n-1 with P(k) proportional to 1/(k+1)^s, by binary search in the precomputed
// CDF: O(log n) per draw and 8 bytes per rank (80 MB for 10M ranks; build it, draw what you
// need, then drop it). n = 0 is treated as 1 (every draw is rank 0).
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s) : cdf_(std::max<uint64_t>(n, 1)) {
    double sum = 0;
    for (uint64_t k = 0; k < cdf_.size(); ++k) {
      sum += std::pow(static_cast<double>(k + 1), -s);
      cdf_[k] = sum;
    }
    for (double& c : cdf_)
      c /= sum;
    cdf_.back() = 1.0;
  }
  // P(rank k): how popular a rank is, for scaling rates.
  double probability(uint64_t k) const { return k == 0 ? cdf_[0] : cdf_[k] - cdf_[k - 1]; }
  uint64_t operator()(std::mt19937_64& rng) const {
    const double u = trace_detail::uniform01(rng);
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    const auto k = static_cast<uint64_t>(it - cdf_.begin());
    return std::min<uint64_t>(k, cdf_.size() - 1);
  }
  uint64_t size() const { return cdf_.size(); }

 private:
  std::vector<double> cdf_;  // cdf_[k] = P(rank <= k)
};

inline std::vector<Event> steady(const TraceParams& p, double rate_factor) {
  std::mt19937_64 rng(p.seed);
  std::vector<Event> out;
  const double rate = trace_detail::hit_rate(p, rate_factor) / trace_detail::mean_hits(p.max_hits);
  trace_detail::poisson(rng, p, 0.0, static_cast<double>(p.windows * p.window_ms), rate, 0, out);
  return out;
}

inline std::vector<Event> on_off(const TraceParams& p) {
  std::mt19937_64 rng(p.seed);
  std::vector<Event> out;
  const double rate = trace_detail::hit_rate(p, 3.0) / trace_detail::mean_hits(p.max_hits);
  const int64_t end = p.windows * p.window_ms;
  const auto phase =
      static_cast<int64_t>(trace_detail::uniform_below(rng, static_cast<uint64_t>(p.window_ms)));
  for (int64_t on = phase; on < end; on += p.window_ms) {
    const int64_t off = std::min(on + p.window_ms / 4, end);
    if (!trace_detail::poisson(rng, p, static_cast<double>(on), static_cast<double>(off), rate, 0,
                               out)) {
      break;
    }
  }
  return out;
}

inline std::vector<Event> edge_burst(const TraceParams& p) {
  std::mt19937_64 rng(p.seed);
  std::vector<Event> out;
  const int64_t end = p.start_ms + p.windows * p.window_ms;
  const int64_t edge = std::max<int64_t>(1, p.window_ms / 20);  // 5% of the window
  // Boundaries at start + W, start + 3W, ...: each is a multiple of W since the epoch, hence a
  // bucket boundary for any valid granularity.
  for (int64_t b = p.start_ms + p.window_ms; b + edge <= end; b += 2 * p.window_ms) {
    if (!trace_detail::spread(rng, p, b - edge, b, p.limit, 0, out)) break;
    if (!trace_detail::spread(rng, p, b, b + edge, p.limit, 0, out)) break;
  }
  return out;
}

inline constexpr uint32_t kMixedKeys = 10'000;
inline constexpr double kMixedZipfS = 1.1;
inline constexpr double kMixedHottestFactor = 10.0;  // hottest key at 10x its limit

inline std::vector<Event> mixed(const TraceParams& p) {
  std::mt19937_64 rng(p.seed);
  const ZipfSampler zipf(kMixedKeys, kMixedZipfS);
  std::vector<Event> out;
  // Total rate such that rank 0 alone gets kMixedHottestFactor x the limit rate.
  const double rate = trace_detail::hit_rate(p, kMixedHottestFactor / zipf.probability(0)) /
                      trace_detail::mean_hits(p.max_hits);
  const auto end = static_cast<double>(p.windows * p.window_ms);
  out.reserve(std::min<size_t>(p.max_events, static_cast<size_t>(rate * end * 1.01) + 16));
  double t = 0;
  while (out.size() < p.max_events) {
    t += trace_detail::exponential(rng, rate);
    if (t >= end) break;
    const auto key = static_cast<uint32_t>(zipf(rng));
    out.push_back(
        {p.start_ms + static_cast<int64_t>(t), key, trace_detail::draw_hits(rng, p.max_hits)});
  }
  return out;
}

inline constexpr uint32_t kCloudflareSources = 270'000;
inline constexpr uint32_t kCloudflareAbusive = 270;   // keys 0 .. 269: 0.1% of the sources
inline constexpr double kCloudflareRateMin = 0.0002;  // normal sources' factor: Pareto(1) on
inline constexpr double kCloudflareRateMax = 1.0;     // [min, max)

inline bool cloudflare_abusive(uint32_t key) {
  return key < kCloudflareAbusive;
}

inline std::vector<Event> cloudflare(const TraceParams& p) {
  using trace_detail::uniform01;
  std::mt19937_64 rng(p.seed);
  const auto w = static_cast<double>(p.window_ms);
  const double run = static_cast<double>(p.windows) * w;
  // Requests per ms at 1x the limit rate.
  const double unit = trace_detail::hit_rate(p, 1.0) / trace_detail::mean_hits(p.max_hits);
  struct Source {
    double rate;       // requests per ms
    double end;        // no request at or after this (ms offset)
    double burst_end;  // the current burst's end (= end for sources without bursts)
    bool bursty;
  };
  std::vector<Source> src(kCloudflareSources);
  using Next = std::pair<double, uint32_t>;  // (ms offset of the source's next request, key)
  std::vector<Next> heap;
  heap.reserve(kCloudflareSources);
  for (uint32_t k = 0; k < kCloudflareSources; ++k) {
    Source& s = src[k];
    double start = 0;
    if (cloudflare_abusive(k)) {
      const double f = 2.0 * std::pow(10.0, uniform01(rng));
      start = uniform01(rng) * run;
      const double len = (1.0 + 3.0 * uniform01(rng)) * w;
      s.rate = f * unit;
      s.end = std::min(run, start + len);
      s.bursty = k % 2 == 1;
      const double burst = (0.1 + 0.4 * uniform01(rng)) * w;
      s.burst_end = s.bursty ? std::min(s.end, start + burst) : s.end;
    } else {
      constexpr double lo = kCloudflareRateMin;
      constexpr double hi = kCloudflareRateMax;
      const double r = lo / (1.0 - uniform01(rng) * (1.0 - lo / hi));
      s.rate = r * unit;
      start = uniform01(rng) * run;
      s.end = run;
      s.burst_end = run;
      s.bursty = false;
    }
    heap.push_back({start, k});
  }
  const std::greater<Next> later;
  std::make_heap(heap.begin(), heap.end(), later);
  std::vector<Event> out;
  while (!heap.empty() && out.size() < p.max_events) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const auto [t, k] = heap.back();
    heap.pop_back();
    out.push_back(
        {p.start_ms + static_cast<int64_t>(t), k, trace_detail::draw_hits(rng, p.max_hits)});
    Source& s = src[k];
    double next = t + trace_detail::exponential(rng, s.rate);
    if (next >= s.burst_end) {
      if (!s.bursty) continue;  // the source is done
      next = s.burst_end + (0.5 + 1.5 * uniform01(rng)) * w;
      if (next >= s.end) continue;
      s.burst_end = std::min(s.end, next + (0.1 + 0.4 * uniform01(rng)) * w);
    }
    heap.push_back({next, k});
    std::push_heap(heap.begin(), heap.end(), later);
  }
  return out;
}

// The trace called `name` (one of kTraceNames), or nullopt for an unknown name.
inline std::optional<std::vector<Event>> make_trace(std::string_view name, const TraceParams& p) {
  if (name == "steady-0.5x") return steady(p, 0.5);
  if (name == "steady-1x") return steady(p, 1.0);
  if (name == "steady-2x") return steady(p, 2.0);
  if (name == "on-off") return on_off(p);
  if (name == "edge-burst") return edge_burst(p);
  if (name == "mixed") return mixed(p);
  if (name == "cloudflare") return cloudflare(p);
  return std::nullopt;
}

inline bool is_trace_name(std::string_view name) {
  return std::find(kTraceNames.begin(), kTraceNames.end(), name) != kTraceNames.end();
}

// Number of distinct keys a trace uses (ids are 0 .. n-1).
inline uint32_t trace_keys(std::string_view name) {
  if (name == "mixed") return kMixedKeys;
  if (name == "cloudflare") return kCloudflareSources;
  return 1;
}

}  // namespace sluice::testing
