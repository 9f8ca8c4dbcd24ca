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
#include <span>
#include <string>
#include <vector>

#include "cluster/delta_sync.h"
#include "cluster/hash_ring.h"
#include "cluster/peer_codec.h"
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

struct Node {
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<cluster::DeltaSync> delta;
  std::unique_ptr<cluster::PeerCodec> codec;
  cluster::PeerMessage msg;                // reused by open()
  std::deque<std::vector<uint8_t>> inbox;  // [0, in_flight) sent to this node; the rest reused
  size_t in_flight = 0;
};

// Three nodes on one ring, and the datagrams in flight between them.
class Cluster {
 public:
  Cluster(uint32_t shards, uint64_t seed) {
    testing::OneRule r{.domain = "g", .rule = "per-key", .limit = 1'000'000'000};
    r.consistency = rules::Consistency::kGossip;
    const auto policy = testing::one_rule_policy(r, seed);
    std::vector<cluster::RingMember> members;
    for (cluster::NodeId id = 1; id <= 3; ++id) {
      members.push_back({id, "node-" + std::to_string(id)});
      auto& n = nodes_[id - 1];
      engine::EngineOptions eo;
      eo.memory_cap_bytes = 8ull << 30;
      eo.shards = shards;
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
      return std::ranges::count(std::span(owners).first(n), id) > 0;
    };
  }

  // One pass of node `id`, every batch sealed and queued; the CPU ms of the pass.
  double pass(cluster::NodeId id, cluster::DeltaSync::Mode mode, int64_t now, uint64_t& bytes) {
    Node& n = node(id);
    const double t0 = thread_cpu_ms();
    n.delta->pass(ring_, mode, false, [&](cluster::NodeId to, cluster::SyncBatch& b) {
      Node& dest = node(to);
      if (dest.in_flight == dest.inbox.size()) dest.inbox.emplace_back();
      std::vector<uint8_t>& d = dest.inbox[dest.in_flight++];
      if (n.codec->seal(b, now, d) != cluster::PeerError::kOk) std::abort();
      bytes += d.size();
    });
    return thread_cpu_ms() - t0;
  }

  // Opens and merges what is in flight to `id`; the CPU ms it took.
  double deliver(cluster::NodeId id, int64_t now) {
    Node& n = node(id);
    const double t0 = thread_cpu_ms();
    for (size_t i = 0; i < n.in_flight; ++i) {
      if (n.codec->open(n.inbox[i], now, n.msg) != cluster::PeerError::kOk) std::abort();
      n.engine->merge(n.msg.sync.totals, now);
    }
    n.in_flight = 0;
    return thread_cpu_ms() - t0;
  }

  void deliver_all(int64_t now) {
    for (cluster::NodeId id = 1; id <= 3; ++id)
      deliver(id, now);
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
  std::array<Node, 3> nodes_;
  cluster::HashRing ring_;
};

}  // namespace

int bench_sync_main(int argc, char** argv) {
  uint64_t key_count = 1'000'000, active_count = 1'000, passes = 300;
  uint32_t shards = 64;
  sluice::bench::Cli cli("sluice-bench-sync");
  cli.keys(key_count, 1, 1e9, "counters held by the node");
  cli.number("--active", active_count, 1, 1e9, "counters that changed since the last pass");
  cli.number("--passes", passes, 1, 1e6, "sync passes measured");
  cli.number("--shards", shards, 1, 4096, "shards of the counter table");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  if (active_count > key_count) return cli.fail("--active is at most --keys");
  const KeyArena keys(key_count, "key-");
  std::vector<uint32_t> idle(key_count);
  std::iota(idle.begin(), idle.end(), 0u);
  // `active` keys among the idle ones, as a node sees them: checked before, now busy again.
  std::vector<uint32_t> active = idle;
  std::mt19937_64 rng(42);
  for (uint64_t i = 0; i < active_count; ++i)
    std::swap(active[i], active[i + rng() % (key_count - i)]);
  active.resize(active_count);

  using Mode = cluster::DeltaSync::Mode;
  struct Samples {
    std::vector<double> ms;  // CPU ms per pass
    uint64_t bytes = 0;      // what node 1 sealed (node rows)
  };
  std::array<Samples, 6> parts;  // [resend * 3 + part], part: engine, node, merge
  // Two identical clusters: one measures the engine's part, the other the whole node pass (a
  // pass clears the flags it reports, so the two cannot share one).
  for (size_t node_pass = 0; node_pass < 2; ++node_pass) {
    Cluster c(shards, 7);
    int64_t now = kStartMs;
    const double t_load = thread_cpu_ms();
    c.check(1, keys, idle, now);
    // Until every node holds the merged state: node 1 reports, the holders push back.
    uint64_t ignored = 0;
    for (int round = 0; round < 3; ++round) {
      now += kPassMs;
      for (cluster::NodeId id = 1; id <= 3; ++id) {
        c.pass(id, round == 2 ? Mode::kResend : Mode::kChanged, now, ignored);
        c.deliver_all(now);
      }
    }
    if (node_pass == 0) {
      std::fprintf(stderr, "# %" PRIu64 " keys checked on node 1 and synced in %.1f s of CPU\n",
                   key_count, (thread_cpu_ms() - t_load) / 1e3);
    }
    for (uint64_t p = 1; p <= passes; ++p) {
      now += kPassMs;
      c.check(1, keys, active, now);
      const bool resend = p % kResendEvery == 0;
      const Mode mode = resend ? Mode::kResend : Mode::kChanged;
      Samples* row = &parts[resend ? 3 : 0];
      if (node_pass == 0) {
        struct : engine::SyncSink {
          void item(const engine::SyncItem&) override {}
        } sink;
        engine::SyncCursor cursor;
        cursor.restart(resend);
        const double t0 = thread_cpu_ms();
        while (!c.node(1).engine->sync_step(cursor, 256, c.holds(1), sink)) {
        }
        row[0].ms.push_back(thread_cpu_ms() - t0);
      } else {
        row[1].ms.push_back(c.pass(1, mode, now, row[1].bytes));
      }
      c.deliver_all(now);  // nodes 2 and 3 merge what node 1 sent
      uint64_t back = 0;
      c.pass(2, mode, now, back);
      c.pass(3, mode, now, back);
      const double merge_ms = c.deliver(1, now);
      if (node_pass == 1) row[2].ms.push_back(merge_ms);
      c.deliver_all(now);
    }
  }

  sluice::bench::Rows out(cli.json);
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::vector<double>& ms = parts[i].ms;
    const auto n = static_cast<double>(ms.size());
    const auto at = [&ms](double q) { return ms.empty() ? 0 : sluice::bench::percentile(ms, q); };
    out.add({{"scenario", "sync-cost"},
             {"part", std::array{"engine", "node", "merge"}[i % 3]},
             {"pass", i < 3 ? "changed" : "resend"},
             {"idle_keys", key_count},
             {"active_keys", active_count},
             {"passes", ms.size()},
             {"cpu_ms_mean", n > 0 ? std::accumulate(ms.begin(), ms.end(), 0.0) / n : 0},
             {"cpu_ms_p50", at(0.5)},
             {"cpu_ms_p99", at(0.99)},
             {"cpu_ms_max", at(1.0)},
             {"bytes_per_pass", n > 0 ? static_cast<double>(parts[i].bytes) / n : 0}});
  }
  out.finish();
  return 0;
}
