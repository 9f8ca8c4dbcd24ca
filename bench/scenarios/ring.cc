// sluice-bench-ring: balance, movement and lookup cost of the cluster's hash ring
// (lib/cluster/hash_ring.h, rendezvous hashing).
//
// Per row (N nodes, named node-1..node-N with ids 1..N, and K seeded pseudo-random 64-bit keys,
// like the engine's counter ids):
//   - max/mean and min/mean of the primary load over the N nodes;
//   - the fraction of keys whose primary changes when node N+1 joins (ideal 1/(N+1)) and when
//     node 1 leaves (ideal 1/N), and "stray": keys whose primary moved without the joining or
//     leaving node being involved (0 for a consistent hash);
//   - ns per owners() lookup (owner + replicas, R = --replicas) and per owner() (primary only),
//     timed with std::chrono::steady_clock over all K keys, best of --repeat passes.
// With --vnodes V[,V..] (e.g. 100,1000) rows of scheme vnodes-<V> show a classic ring of V virtual
// nodes per member (binary search, then a walk to R distinct nodes), built here only for
// comparison.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cluster/hash_ring.h"
#include "common/scenario.h"

namespace {

using sluice::cluster::HashRing;
using sluice::cluster::NodeId;
using sluice::cluster::RingMember;

// Nodes first..last, ids and names alike (node-<id>).
std::vector<RingMember> members(uint64_t first, uint64_t last) {
  std::vector<RingMember> out;
  for (uint64_t i = first; i <= last; ++i)
    out.push_back({static_cast<NodeId>(i), "node-" + std::to_string(i)});
  return out;
}

// The comparison: a ring of virtual nodes, with HashRing's lookups.
class VnodeRing {
 public:
  VnodeRing(const std::vector<RingMember>& ms, uint64_t vnodes, size_t replicas)
      : replicas_(std::min(replicas, ms.size())) {
    for (const RingMember& m : ms) {
      for (uint64_t v = 0; v < vnodes; ++v) {
        const std::string label = m.name + "#" + std::to_string(v);
        points_.push_back({XXH3_64bits(label.data(), label.size()), m.id});
      }
    }
    std::sort(points_.begin(), points_.end(), [](const Point& a, const Point& b) {
      return a.hash < b.hash || (a.hash == b.hash && a.id < b.id);
    });
  }
  std::optional<NodeId> owner(uint64_t key) const { return points_[first(key)].id; }
  size_t owners(uint64_t key, std::span<NodeId> out) const {
    const size_t want = std::min(replicas_, out.size());
    size_t got = 0;
    for (size_t i = first(key), seen = 0; got < want && seen < points_.size(); ++seen) {
      const NodeId id = points_[i].id;
      if (std::ranges::count(out.first(got), id) == 0) out[got++] = id;
      if (++i == points_.size()) i = 0;
    }
    return got;
  }

 private:
  struct Point {
    uint64_t hash;
    NodeId id;
  };
  size_t first(uint64_t key) const {
    auto it = std::lower_bound(points_.begin(), points_.end(), key,
                               [](const Point& p, uint64_t k) { return p.hash < k; });
    return it == points_.end() ? 0 : static_cast<size_t>(it - points_.begin());
  }
  size_t replicas_;
  std::vector<Point> points_;
};

}  // namespace

int bench_ring_main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {5, 3, 10, 50}, vnodes;  // no vnodes: the comparison is opt-in
  uint64_t key_count = 1'000'000, replicas = 2, repeat = 3, seed = 42;
  sluice::bench::Cli cli("sluice-bench-ring");
  cli.numbers("--nodes", sizes, 2, 1'000, "ring sizes, N[,N..]");
  cli.keys(key_count, 1, 100'000'000, "keys placed on the ring");
  cli.number("--replicas", replicas, 1, HashRing::kMaxReplicas, "owners per key");
  cli.number("--repeat", repeat, 1, 1e9, "rings measured per size");
  cli.numbers("--vnodes", vnodes, 0, 1e9, "virtual nodes compared, V[,V..] (0s dropped)");
  cli.app().add_option("--seed", seed, "seed of the keys and node names");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  std::erase(vnodes, 0);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> keys(key_count);
  for (auto& k : keys)
    k = rng();
  // Best of `repeat` passes over every key, in ns per lookup. The answers add up in `sink`, so
  // the compiler cannot drop the lookups.
  uint64_t sink = 0;
  const auto ns_per = [&](auto lookup) {
    using Clock = std::chrono::steady_clock;
    Clock::duration best = Clock::duration::max();
    for (uint64_t r = 0; r < repeat; ++r) {
      const auto t0 = Clock::now();
      uint64_t sum = 0;
      for (uint64_t k : keys)
        sum += lookup(k);
      best = std::min(best, Clock::now() - t0);
      sink += sum;
    }
    return std::chrono::duration<double, std::nano>(best).count() /
           static_cast<double>(keys.size());
  };
  sluice::bench::Rows rows(cli.json);
  // One row: `make` builds the scheme's ring of some members.
  const auto measure = [&](const std::string& scheme, uint64_t n, auto make) {
    const auto ring = make(members(1, n));
    const auto grown = make(members(1, n + 1));  // node n+1 joins
    const auto shrunk = make(members(2, n));     // node 1 leaves
    std::vector<uint64_t> load(n + 1, 0);
    uint64_t moved_add = 0, moved_remove = 0, stray = 0;
    for (uint64_t k : keys) {
      const NodeId o = *ring.owner(k), a = *grown.owner(k), r = *shrunk.owner(k);
      ++load[o];
      moved_add += a != o;
      moved_remove += r != o;
      stray += (a != o && a != n + 1) + (r != o && o != 1);
    }
    std::array<NodeId, HashRing::kMaxReplicas> out{};
    const std::span<NodeId> span(out.data(), replicas);
    const double ns_owners = ns_per([&](uint64_t k) {
      ring.owners(k, span);
      return uint64_t{out[0]} + out[replicas - 1];
    });
    const double ns_owner = ns_per([&](uint64_t k) { return uint64_t{*ring.owner(k)}; });
    const auto [lo, hi] = std::minmax_element(load.begin() + 1, load.end());
    const double mean = static_cast<double>(keys.size()) / static_cast<double>(n);
    const auto frac = [&](uint64_t x) {
      return static_cast<double>(x) / static_cast<double>(keys.size());
    };
    rows.add({{"scheme", scheme},
              {"nodes", n},
              {"keys", keys.size()},
              {"max_mean", static_cast<double>(*hi) / mean},
              {"min_mean", static_cast<double>(*lo) / mean},
              {"moved_add", frac(moved_add)},
              {"ideal_add", 1.0 / static_cast<double>(n + 1)},
              {"moved_remove", frac(moved_remove)},
              {"ideal_remove", 1.0 / static_cast<double>(n)},
              {"stray", stray},
              {"ns_per_owners", ns_owners},
              {"ns_per_owner", ns_owner}});
  };
  for (uint64_t n : sizes)
    measure("rendezvous", n,
            [&](const std::vector<RingMember>& ms) { return HashRing(ms, replicas); });
  for (uint64_t v : vnodes) {
    for (uint64_t n : sizes) {
      measure("vnodes-" + std::to_string(v), n,
              [&](const std::vector<RingMember>& ms) { return VnodeRing(ms, v, replicas); });
    }
  }
  std::fprintf(stderr,
               "# %" PRIu64 " keys (seed %" PRIu64 "), R = %" PRIu64 ", best of %" PRIu64
               " timed passes; checksum %" PRIu64 "\n",
               key_count, seed, replicas, repeat, sink % 1000);
  rows.finish();
  return 0;
}
