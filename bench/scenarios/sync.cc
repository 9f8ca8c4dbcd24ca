// sluice-bench-sync: what a cluster sync pass costs a node, in one process and without sockets
// (the goal: "with 1M idle keys and 1k active keys, <= 0.5 ms CPU per pass").
//
// Three nodes, each an Engine with a DeltaSync and a PeerCodec as lib/node wires them
// (node_cluster.cc), one gossip rule with one 1-minute limit (never reached), the default ring
// (owner and one replica). A datagram sealed by one node is opened by its destination's codec and
// merged into its engine: everything a running node does on its control thread except the
// sendto/recvfrom calls. Node 1 is checked --keys distinct keys once; passes run until every node
// holds the merged state; then --passes passes run 100 simulated ms apart (every 50th a resend,
// the 5 s anti-entropy interval), each after one check of every one of --active keys (a fixed
// random set) on node 1.
//
// Per pass of node 1, the thread's CPU time (CLOCK_THREAD_CPUTIME_ID) for:
//   engine  Engine::sync_step until done, with a sink that only counts (the engine's part)
//   node    DeltaSync::pass with every batch sealed (HMAC-SHA256): the control thread's pass
//   merge   opening and merging, on node 1, what nodes 2 and 3 send it after their own passes
// and the peer bytes node 1 sealed per pass. The engine and node rows run on two copies of the
// same cluster state, one after the other, so each pass has the same work.
//
// Usage: sluice-bench-sync [--json] [--keys N] [--active N] [--passes N] [--shards N]
#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cluster/delta_sync.h"
#include "cluster/hash_ring.h"
#include "cluster/peer_codec.h"
#include "common/json_rows.h"
#include "common/key_arena.h"
#include "common/percentile.h"
#include "common/proc_stats.h"
#include "common/scenario.h"
#include "engine/engine.h"
#include "one_rule_policy.h"
#include "rules/rules.h"

namespace {

namespace cluster = sluice::cluster;
namespace engine = sluice::engine;
namespace rules = sluice::rules;
namespace testing = sluice::testing;
using sluice::bench::KeyArena;
using sluice::bench::thread_cpu_ms;

constexpr int64_t kStartMs = 1'800'000'000'000;  // a fixed wall-clock time (2027)
constexpr int64_t kPassMs = 100;
constexpr uint64_t kResendEvery = 50;
constexpr size_t kBatch = 32;
constexpr const char* kSecret = "bench-secret-bench-secret-bench-secret";

struct Options {
  bool json = false;
  uint64_t keys = 1'000'000;
  uint64_t active = 1'000;
  uint64_t passes = 300;
  uint32_t shards = 64;
};

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse(int argc, char** argv, Options& o) {
  sluice::bench::Cli cli("sluice-bench-sync");
  cli.keys(o.keys, 1, 1e9, "counters held by the node");
  cli.number("--active", o.active, 1, 1e9, "counters that changed since the last pass");
  cli.number("--passes", o.passes, 1, 1e6, "sync passes measured");
  cli.number("--shards", o.shards, 1, 4096, "shards of the counter table");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return exit;
  o.json = cli.json;
  if (o.active > o.keys) return cli.fail("--active is at most --keys");
  return std::nullopt;
}

struct Node {
  cluster::NodeId id = 0;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<cluster::DeltaSync> delta;
  std::unique_ptr<cluster::PeerCodec> codec;
  cluster::PeerMessage msg;  // reused by open()
};

struct Datagram {
  cluster::NodeId to = 0;
  std::vector<uint8_t> bytes;
};

// Three nodes on one ring, and the datagrams in flight between them.
class Cluster {
 public:
  Cluster(const Options& o, uint64_t seed) {
    testing::OneRule r;
    r.domain = "g";
    r.rule = "per-key";
    r.key = "k";
    r.limit = 1'000'000'000;
    r.consistency = rules::Consistency::kGossip;
    const auto policy = testing::one_rule_policy(r, seed);
    std::vector<cluster::RingMember> members;
    for (cluster::NodeId id = 1; id <= 3; ++id) {
      members.push_back({id, "node-" + std::to_string(id)});
      auto& n = nodes_[id - 1];
      n.id = id;
      engine::EngineOptions eo;
      eo.memory_cap_bytes = 8ull << 30;
      eo.shards = o.shards;
      eo.node_id = id;
      n.engine = std::make_unique<engine::Engine>(policy, eo);
      n.delta = std::make_unique<cluster::DeltaSync>(*n.engine, id);
      n.codec = std::make_unique<cluster::PeerCodec>(kSecret, id, 1000 + id);
    }
    ring_ = cluster::HashRing(members);
  }

  Node& node(cluster::NodeId id) { return nodes_[id - 1]; }

  // DeltaSync's owns(): whether `id` is among the holders of a counter.
  std::function<bool(uint64_t)> holds(cluster::NodeId id) const {
    return [this, id](uint64_t counter) {
      std::array<cluster::NodeId, cluster::HashRing::kMaxReplicas> owners{};
      const size_t n = ring_.owners(rules::routing_key(counter), owners);
      return std::find(owners.begin(), owners.begin() + static_cast<std::ptrdiff_t>(n), id) !=
             owners.begin() + static_cast<std::ptrdiff_t>(n);
    };
  }

  // One pass of node `id`, every batch sealed and queued; the CPU ms of the pass.
  double pass(cluster::NodeId id, cluster::DeltaSync::Mode mode, int64_t now, uint64_t& bytes) {
    Node& n = node(id);
    const double t0 = thread_cpu_ms();
    n.delta->pass(ring_, mode, false, [&](cluster::NodeId to, cluster::SyncBatch& b) {
      Datagram& d = next_slot();
      d.to = to;
      if (n.codec->seal(b, now, d.bytes) != cluster::PeerError::kOk) std::abort();
      bytes += d.bytes.size();
    });
    return thread_cpu_ms() - t0;
  }

  // Opens and merges what is in flight to `id` (or to anyone, id 0); the CPU ms it took.
  double deliver(int64_t now, cluster::NodeId only = 0) {
    const double t0 = thread_cpu_ms();
    size_t kept = 0;
    for (size_t i = 0; i < used_; ++i) {
      Datagram& d = flight_[i];
      if (only != 0 && d.to != only) {
        std::swap(flight_[kept++], d);
        continue;
      }
      Node& n = node(d.to);
      if (n.codec->open(d.bytes, now, n.msg) != cluster::PeerError::kOk) std::abort();
      n.engine->merge(n.msg.sync.totals, now);
    }
    used_ = kept;
    return thread_cpu_ms() - t0;
  }

  void check(cluster::NodeId id, const KeyArena& keys, const std::vector<uint32_t>& which,
             int64_t now) {
    std::vector<rules::Descriptor> descs(kBatch);
    std::vector<rules::CheckRequest> batch(kBatch);
    engine::BatchResult out;
    for (size_t i = 0; i < which.size(); i += kBatch) {
      const size_t n = std::min(kBatch, which.size() - i);
      for (size_t j = 0; j < n; ++j) {
        descs[j] = {"k", keys[which[i + j]]};
        batch[j] = {"g", {&descs[j], 1}, 1};
      }
      node(id).engine->check({batch.data(), n}, now, out);
    }
  }

 private:
  Datagram& next_slot() {
    if (used_ == flight_.size()) flight_.emplace_back();
    return flight_[used_++];
  }

  std::array<Node, 3> nodes_;
  cluster::HashRing ring_;
  std::deque<Datagram> flight_;  // [0, used_) in flight; the rest reused buffers
  size_t used_ = 0;
};

// One row: a part's CPU ms per pass, and what node 1 sealed (node rows).
struct Row {
  const char* part;  // engine, node, merge
  const char* pass;  // changed, resend
  std::vector<double> ms;
  uint64_t bytes = 0;
};

}  // namespace

int bench_sync_main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> exit = parse(argc, argv, o)) return *exit;
  const KeyArena keys(o.keys, "key-");
  std::mt19937_64 rng(42);
  std::vector<uint32_t> idle(o.keys), active;
  for (uint32_t i = 0; i < o.keys; ++i)
    idle[i] = i;
  // `active` keys among the idle ones, as a node sees them: checked before, now busy again.
  std::vector<uint32_t> pick = idle;
  for (uint64_t i = 0; i < o.active; ++i)
    std::swap(pick[i], pick[i + rng() % (o.keys - i)]);
  active.assign(pick.begin(), pick.begin() + static_cast<std::ptrdiff_t>(o.active));

  using Mode = cluster::DeltaSync::Mode;
  std::vector<Row> rows;  // [resend * 3 + part]
  for (const char* pass : {"changed", "resend"})
    for (const char* part : {"engine", "node", "merge"})
      rows.push_back({part, pass, {}, 0});
  // Two identical clusters: one measures the engine's part, the other the whole node pass (a
  // pass clears the flags it reports, so the two cannot share one).
  for (int part = 0; part < 2; ++part) {
    Cluster c(o, 7);
    int64_t now = kStartMs;
    const double t_load = thread_cpu_ms();
    c.check(1, keys, idle, now);
    // Until every node holds the merged state: node 1 reports, the holders push back.
    uint64_t ignored = 0;
    for (int round = 0; round < 3; ++round) {
      now += kPassMs;
      for (cluster::NodeId id = 1; id <= 3; ++id) {
        c.pass(id, round == 2 ? Mode::kResend : Mode::kChanged, now, ignored);
        c.deliver(now);
      }
    }
    if (part == 0) {
      std::fprintf(stderr, "# %" PRIu64 " keys checked on node 1 and synced in %.1f s of CPU\n",
                   o.keys, (thread_cpu_ms() - t_load) / 1e3);
    }
    for (uint64_t p = 1; p <= o.passes; ++p) {
      now += kPassMs;
      c.check(1, keys, active, now);
      const bool resend = p % kResendEvery == 0;
      const Mode mode = resend ? Mode::kResend : Mode::kChanged;
      Row& pr = rows[(resend ? 3 : 0) + static_cast<size_t>(part)];
      if (part == 0) {
        struct : engine::SyncSink {
          void item(const engine::SyncItem&) override {}
        } sink;
        engine::SyncCursor cursor;
        cursor.restart(resend);
        const double t0 = thread_cpu_ms();
        while (!c.node(1).engine->sync_step(cursor, 256, c.holds(1), sink)) {
        }
        pr.ms.push_back(thread_cpu_ms() - t0);
      } else {
        pr.ms.push_back(c.pass(1, mode, now, pr.bytes));
      }
      c.deliver(now);  // nodes 2 and 3 merge what node 1 sent
      uint64_t back = 0;
      c.pass(2, mode, now, back);
      c.pass(3, mode, now, back);
      const double merge_ms = c.deliver(now, 1);
      if (part == 1) rows[resend ? 5 : 2].ms.push_back(merge_ms);
      c.deliver(now);
    }
  }

  sluice::bench::Rows out(o.json);
  for (const Row& r : rows) {
    const auto n = static_cast<double>(r.ms.size());
    const auto at = [&r](double q) {
      return r.ms.empty() ? 0 : sluice::bench::percentile(r.ms, q);
    };
    out.add({{"scenario", "sync-cost"},
             {"part", r.part},
             {"pass", r.pass},
             {"idle_keys", o.keys},
             {"active_keys", o.active},
             {"passes", r.ms.size()},
             {"cpu_ms_mean", n > 0 ? std::accumulate(r.ms.begin(), r.ms.end(), 0.0) / n : 0},
             {"cpu_ms_p50", at(0.5)},
             {"cpu_ms_p99", at(0.99)},
             {"cpu_ms_max", at(1.0)},
             {"bytes_per_pass", n > 0 ? static_cast<double>(r.bytes) / n : 0}});
  }
  out.finish();
  return 0;
}
