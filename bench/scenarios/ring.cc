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
// comparison. The default run (5 nodes first, then 3, 10 and 50; 1M keys) takes about 3 s on one
// core.
//
// Usage: sluice-bench-ring [--json] [--nodes N[,N..]] [--keys K] [--replicas R] [--repeat P]
//          [--vnodes V[,V..]] [--seed S]
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/hash_ring.h"
#include "common/json_rows.h"
#include "common/scenario.h"

namespace {

using sluice::cluster::HashRing;
using sluice::cluster::NodeId;
using sluice::cluster::RingMember;
using Clock = std::chrono::steady_clock;
using sluice::bench::Row;

struct Options {
  bool json = false;
  std::vector<uint64_t> nodes = {5, 3, 10, 50};
  uint64_t keys = 1'000'000;
  uint64_t replicas = 2;
  uint64_t repeat = 3;
  std::vector<uint64_t> vnodes;  // none: the comparison is opt-in
  uint64_t seed = 42;
};

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse_args(int argc, char** argv, Options& o) {
  sluice::bench::Cli cli("sluice-bench-ring");
  cli.numbers("--nodes", o.nodes, 2, 1'000, "ring sizes, N[,N..]");
  cli.keys(o.keys, 1, 100'000'000, "keys placed on the ring");
  cli.number("--replicas", o.replicas, 1, HashRing::kMaxReplicas, "owners per key");
  cli.number("--repeat", o.repeat, 1, 1e9, "rings measured per size");
  cli.numbers("--vnodes", o.vnodes, 0, 1e9, "virtual nodes compared, V[,V..] (0s dropped)");
  cli.app().add_option("--seed", o.seed, "seed of the keys and node names");
  const std::optional<int> exit = cli.parse(argc, argv);
  o.json = cli.json;
  std::erase(o.vnodes, 0);
  return exit;
}

std::vector<RingMember> members(uint64_t n) {
  std::vector<RingMember> out;
  for (uint64_t i = 1; i <= n; ++i)
    out.push_back({static_cast<NodeId>(i), "node-" + std::to_string(i)});
  return out;
}

// ---- the comparison: a ring of virtual nodes ------------------------------------------------

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
  NodeId owner(uint64_t key) const { return points_[first(key)].id; }
  size_t owners(uint64_t key, std::span<NodeId> out) const {
    const size_t want = std::min(replicas_, out.size());
    size_t got = 0;
    for (size_t i = first(key), seen = 0; got < want && seen < points_.size(); ++seen) {
      const NodeId id = points_[i].id;
      if (std::find(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(got), id) ==
          out.begin() + static_cast<std::ptrdiff_t>(got))
        out[got++] = id;
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

// ---- measurements ----------------------------------------------------------------------------

// max/mean and min/mean of the primary load over the nodes.
template <typename Ring>
std::pair<double, double> balance(const Ring& ring, const std::vector<uint64_t>& keys,
                                  uint64_t nodes) {
  std::vector<uint64_t> load(nodes + 1, 0);
  for (uint64_t k : keys)
    ++load[ring.owner(k)];
  const double mean = static_cast<double>(keys.size()) / static_cast<double>(nodes);
  const auto [lo, hi] = std::minmax_element(load.begin() + 1, load.end());
  return {static_cast<double>(*hi) / mean, static_cast<double>(*lo) / mean};
}

// The fraction of keys whose primary differs between `before` and `after`; `stray` counts those
// where neither side is `node` (the one that joined or left).
template <typename Ring>
double moved(const Ring& before, const Ring& after, const std::vector<uint64_t>& keys, NodeId node,
             uint64_t& stray) {
  uint64_t n = 0;
  for (uint64_t k : keys) {
    const NodeId b = before.owner(k);
    const NodeId a = after.owner(k);
    if (a != b) {
      ++n;
      if (a != node && b != node) ++stray;
    }
  }
  return static_cast<double>(n) / static_cast<double>(keys.size());
}

// Best of `repeat` passes over every key, in ns per lookup. The sum of the answers is returned
// through `sink` so the compiler cannot drop the lookups.
template <typename Fn>
double time_lookups(const std::vector<uint64_t>& keys, uint64_t repeat, Fn lookup, uint64_t& sink) {
  double best = 1e300;
  for (uint64_t r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    uint64_t sum = 0;
    for (uint64_t k : keys)
      sum += lookup(k);
    const auto t1 = Clock::now();
    sink += sum;
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    best = std::min(best, ns / static_cast<double>(keys.size()));
  }
  return best;
}

template <typename Ring, typename MakeRing>
Row measure(const std::string& scheme, uint64_t n, const Options& opt,
            const std::vector<uint64_t>& keys, MakeRing make, uint64_t& sink) {
  const Ring ring = make(members(n));
  const auto [max_mean, min_mean] = balance(ring, keys, n);
  // Join: node n+1. Leave: node 1.
  const Ring grown = make(members(n + 1));
  auto fewer = members(n);
  fewer.erase(fewer.begin());
  const Ring shrunk = make(fewer);
  uint64_t stray = 0;
  const double moved_add = moved(ring, grown, keys, static_cast<NodeId>(n + 1), stray);
  const double moved_remove = moved(ring, shrunk, keys, NodeId{1}, stray);
  std::array<NodeId, HashRing::kMaxReplicas> out{};
  const std::span<NodeId> span(out.data(), opt.replicas);
  const double ns_owners = time_lookups(
      keys, opt.repeat,
      [&](uint64_t k) {
        ring.owners(k, span);
        return uint64_t{out[0]} + out[opt.replicas - 1];
      },
      sink);
  const double ns_owner = time_lookups(
      keys, opt.repeat, [&](uint64_t k) { return uint64_t{ring.owner(k)}; }, sink);
  return {{"scheme", scheme},
          {"nodes", n},
          {"keys", keys.size()},
          {"max_mean", max_mean},
          {"min_mean", min_mean},
          {"moved_add", moved_add},
          {"ideal_add", 1.0 / static_cast<double>(n + 1)},
          {"moved_remove", moved_remove},
          {"ideal_remove", 1.0 / static_cast<double>(n)},
          {"stray", stray},
          {"ns_per_owners", ns_owners},
          {"ns_per_owner", ns_owner}};
}

// HashRing::owner returns an optional: the comparison helpers want a NodeId.
struct Rendezvous {
  HashRing ring;
  NodeId owner(uint64_t k) const { return *ring.owner(k); }
  size_t owners(uint64_t k, std::span<NodeId> out) const { return ring.owners(k, out); }
};

}  // namespace

int bench_ring_main(int argc, char** argv) {
  Options opt;
  if (const std::optional<int> exit = parse_args(argc, argv, opt)) return *exit;
  std::mt19937_64 rng(opt.seed);
  std::vector<uint64_t> keys(opt.keys);
  for (auto& k : keys)
    k = rng();
  const size_t replicas = opt.replicas;
  uint64_t sink = 0;

  std::fprintf(stderr,
               "# %" PRIu64 " keys (seed %" PRIu64 "), R = %zu, best of %" PRIu64 " timed passes\n",
               opt.keys, opt.seed, replicas, opt.repeat);
  sluice::bench::Rows rows(opt.json);
  for (uint64_t n : opt.nodes) {
    rows.add(measure<Rendezvous>(
        "rendezvous", n, opt, keys,
        [&](const std::vector<RingMember>& ms) { return Rendezvous{HashRing(ms, replicas)}; },
        sink));
  }
  // For comparison: a ring of virtual nodes.
  for (uint64_t v : opt.vnodes) {
    for (uint64_t n : opt.nodes) {
      rows.add(measure<VnodeRing>(
          "vnodes-" + std::to_string(v), n, opt, keys,
          [&](const std::vector<RingMember>& ms) { return VnodeRing(ms, v, replicas); }, sink));
    }
  }
  std::fprintf(stderr, "# checksum %" PRIu64 "\n", sink % 1000);
  rows.finish();
  return 0;
}
