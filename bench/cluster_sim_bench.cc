// sluice-bench-cluster-sim: the membership protocol (lib/cluster/membership.h) at 10, 100 and
// 1000 nodes, by deterministic discrete-event simulation in one process (issue 10, item 8).
//
// The simulated network: one priority queue of events, (time in µs, insertion order) first.
// An event is either the delivery of a message (one-way delay uniform in [0.2, 2] ms, each
// message lost independently with the current loss probability) or a node's tick at its
// next_deadline_ms(). Nodes see the time in ms (µs / 1000), as Membership's API wants; the µs
// clock only orders deliveries within a millisecond. A killed node is no longer ticked, and
// messages to it are dropped on arrival. Every random choice (each node's rng seed, delays,
// losses, kill times, victims) comes from one generator seeded with --seed and N, so a row is a
// function of (seed, N, flags). Every message a node sends is sealed with the real peer codec
// (peer_codec.h: Cap'n Proto envelope + 32-byte HMAC tag) to count its bytes; the UDP and IP
// headers (28 bytes a datagram) are not included.
//
// Per N, two clusters (a row per phase):
//   converge    a cluster bootstrapped by join: node 0 starts alone, nodes 1..N-1 join it one per
//               ms (a burst). converge_s = from the last join until every node lists every node
//               Alive; converge_99_s until 99 % of the (observer, member) pairs are. Only for
//               N <= --converge-max-nodes (100 by default: at 1000 nodes this row alone takes
//               about 5 minutes of wall time, see below).
//   The other phases run on a second cluster whose nodes each call join(node 0) and are handed
//   node 0's full member list at once (kJoinReply entries, as a seed would send): converged from
//   the start with empty gossip queues, the state a joined cluster settles into, without the
//   cost of simulating the join burst. Membership's real kJoin/kJoinReply exchange still runs.
//   steady      from 30 s after the last join (from then on a 60 s window holds exactly two
//               anti-entropy pulls per node: one per 30 s, the first 30 to 60 s after start),
//               --steady-seconds without loss: messages and bytes sent per node per second, mean
//               over nodes and the busiest node
//   false-dead  --loss-seconds at --loss (1 %) on every message: members declared Dead although
//               alive (false_dead: distinct members; false_dead_views: (observer, member) pairs),
//               suspicions raised (MembershipStats::suspicions_raised, summed), and the load
//   detect      loss back to 0 and every node Alive everywhere again; then --kills times: wait 1 to
//               3 s, kill a random live node, record per survivor the time until it lists the
//               victim Dead, wait until every survivor has (at most 120 s), settle 5 s.
//               detect_p50_s / detect_p99_s over every (victim, survivor) pair; detect_max_s the
//               slowest pair
//
// Wall time: Membership walks its whole member map (a std::map) several times per call (next
// deadline, piggyback choice, live count) and sorts its gossip queue per message, so simulating N
// nodes costs O(N) per event and O(N^2) per simulated second, over N^2 map entries that do not fit
// in cache at N = 1000 (265 MB resident). Measured on the 2-core machine of docs/benchmarks.md: at
// 1000 nodes one steady simulated second takes about 0.3 s; a join burst, with 1000-entry gossip
// queues sorted for every message, about 4 s (the converge row at 1000 nodes: 71 simulated s in
// 275 s). In a real node the same walks cost milliseconds of CPU per second.
//
//   sluice-bench-cluster-sim [--nodes 10,100,1000] [--seed S] [--quick] [--json]
//                            [--scenario converge,steady,false-dead,detect] [--steady-seconds S]
//                            [--loss-seconds S] [--loss P] [--kills K] [--converge-max-nodes N]
//                            [--encode-every K] [--max-events E]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/membership.h"
#include "cluster/peer_codec.h"
#include "json_rows.h"

namespace {

using namespace sluice::cluster;
using WallClock = std::chrono::steady_clock;

constexpr int64_t kUsPerMs = 1'000;
constexpr int64_t kUsPerS = 1'000'000;
constexpr int64_t kStartUs = 1'000'000 * kUsPerMs;  // any origin; the tests use 1'000'000 ms
constexpr uint16_t kPeerPort = 7946;
constexpr uint8_t kUnknown = 0xff;  // a member an observer has not heard of
constexpr size_t kKinds = 6;        // MembershipKind values
constexpr const char* kKindNames[kKinds] = {"ping", "ack",  "ping_req",
                                            "nack", "join", "join_reply"};

double secs_since(WallClock::time_point t) {
  return std::chrono::duration<double>(WallClock::now() - t).count();
}

std::string host_of(size_t index) {
  const size_t n = index + 1;
  return "10." + std::to_string(n >> 16) + "." + std::to_string((n >> 8) & 0xff) + "." +
         std::to_string(n & 0xff);
}

Member member_of(size_t index) {
  Member m;
  m.id = static_cast<NodeId>(index + 1);
  char name[32];
  std::snprintf(name, sizeof name, "node-%04zu", index);
  m.name = name;
  m.host = host_of(index);
  m.peer_port = kPeerPort;
  m.check_port = 7947;
  m.admin_port = 7948;
  return m;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(p * static_cast<double>(v.size()));  // nearest rank
  const size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return v[std::min(i, v.size() - 1)];
}

struct NetOptions {
  int64_t min_delay_us = 200;
  int64_t max_delay_us = 2'000;
};

// Sent by the nodes during a measurement window.
struct Load {
  double seconds = 0;
  double msgs_mean = 0;  // per node per second, over the live nodes
  double msgs_max = 0;   // the busiest node
  double bytes_mean = 0;
  double bytes_max = 0;
  std::array<double, kKinds> bytes_share{};  // of all bytes, by kind
  double bytes_per_msg = 0;
  // Per node per second, probing and piggybacked gossip only (kPing, kAck, kPingReq, kNack): what
  // is left without the joins and the anti-entropy pulls (kJoin, kJoinReply).
  double swim_msgs_mean = 0;
  double swim_bytes_mean = 0;
};

// N Membership nodes, the network between them and what the test observes. Owns the nodes and
// their transports; single-threaded, like the nodes.
class Simulation {
 public:
  Simulation(size_t n, uint64_t seed, NetOptions net, uint64_t encode_every, uint64_t max_events)
      : n_(n),
        rng_(seed),
        net_(net),
        encode_every_(encode_every),
        max_events_(max_events),
        codec_("sluice-bench-cluster-sim-secret", 0, 1),
        nodes_(n),
        view_(n * n, kUnknown) {
    for (size_t i = 0; i < n; ++i) {
      by_host_.emplace(host_of(i), i);
      Node& node = nodes_[i];
      node.transport = std::make_unique<Transport>(this, i);
      node.membership =
          std::make_unique<Membership>(member_of(i), MembershipOptions{}, *node.transport, rng_());
      node.membership->on_change([this, i](const Member& m) { observe(i, m); });
      view_[i * n + i] = static_cast<uint8_t>(MemberState::kAlive);  // itself, from the start
    }
    up_count_ = n;
    alive_pairs_ = n;
    reset_false_deaths();
    watch_victim(kNoVictim);
  }

  int64_t now_us() const { return now_us_; }
  bool up(size_t i) const { return nodes_[i].up; }
  uint64_t events() const { return events_; }
  bool out_of_events() const { return events_ >= max_events_; }
  uint64_t encode_errors() const { return encode_errors_; }
  std::mt19937_64& rng() { return rng_; }
  void set_loss(double p) { loss_ = p; }

  // Every live node lists every live node Alive.
  bool converged() const { return alive_pairs_ == up_count_ * up_count_; }

  void join(size_t i, size_t seed) {
    const Endpoint e{host_of(seed), kPeerPort};
    nodes_[i].membership->join(std::span<const Endpoint>(&e, 1), now_ms());
    rearm(i);
  }

  // Node i joins `seed` and is handed, at once, the seed's answer for a cluster where every node
  // is Alive at incarnation 0: every member, in kJoinReply messages of max_join_reply_entries.
  // Not sent through the network, so not counted as load.
  void join_preseeded(size_t i, size_t seed) {
    join(i, seed);
    const size_t per_message = MembershipOptions{}.max_join_reply_entries;
    MembershipMessage reply;
    reply.kind = MembershipKind::kJoinReply;
    reply.from = member_of(seed).id;
    reply.target = member_of(i).id;
    for (size_t first = 0; first < n_; first += per_message) {
      reply.gossip.clear();
      for (size_t j = first; j < std::min(n_, first + per_message); ++j)
        reply.gossip.push_back(member_of(j));
      nodes_[i].membership->on_message(Endpoint{host_of(seed), kPeerPort}, reply, now_ms());
    }
    rearm(i);
  }

  // Of the (live observer, live member) pairs, the share listed Alive.
  double alive_share() const {
    return static_cast<double>(alive_pairs_) / static_cast<double>(up_count_ * up_count_);
  }

  // The node stops: no more ticks, and what reaches it is dropped.
  void kill(size_t v) {
    for (size_t s = 0; s < n_; ++s)
      if (up(s) && view(v, s) == MemberState::kAlive) --alive_pairs_;
    for (size_t o = 0; o < n_; ++o)
      if (o != v && up(o) && view(o, v) == MemberState::kAlive) --alive_pairs_;
    nodes_[v].up = false;
    ++nodes_[v].tick_gen;
    --up_count_;
  }

  // Runs events until `until_us`, or until stop() holds after an event (then returns true).
  template <class Stop>
  bool run_until(int64_t until_us, Stop&& stop) {
    while (!queue_.empty() && queue_.top().at_us <= until_us) {
      if (out_of_events()) return false;
      const Event e = queue_.top();
      queue_.pop();
      now_us_ = std::max(now_us_, e.at_us);
      ++events_;
      Node& node = nodes_[e.node];
      if (e.slot == kTickSlot) {
        if (e.gen != node.tick_gen || !node.up) continue;
        node.armed_us = kNever;
        node.membership->tick(now_ms());
        rearm(e.node);
      } else {
        if (node.up) {
          node.membership->on_message(Endpoint{host_of(e.from), kPeerPort}, slab_[e.slot],
                                      now_ms());
          rearm(e.node);
        }
        free_.push_back(e.slot);
      }
      if (stop()) return true;
    }
    now_us_ = std::max(now_us_, until_us);
    return stop();
  }
  void run_for(int64_t us) {
    run_until(now_us_ + us, [] { return false; });
  }

  // ---- what the observers saw ----

  MemberState view(size_t observer, size_t subject) const {
    return static_cast<MemberState>(view_[observer * n_ + subject]);
  }

  // The victim of the current kill: survivors' first Dead time is recorded.
  void watch_victim(size_t v) {
    victim_ = v;
    dead_seen_us_.assign(n_, -1);
    dead_seen_count_ = 0;
  }
  int64_t dead_seen_us(size_t observer) const { return dead_seen_us_[observer]; }
  // Call after kill(victim): every live node has listed it Dead.
  bool all_survivors_saw_victim_dead() const { return dead_seen_count_ == up_count_; }

  // False deaths: a live member listed Dead by a live observer, since the last reset.
  void reset_false_deaths() {
    false_dead_views_ = 0;
    false_dead_subjects_.assign(n_, false);
  }
  uint64_t false_dead_views() const { return false_dead_views_; }
  uint64_t false_dead_members() const {
    return static_cast<uint64_t>(
        std::count(false_dead_subjects_.begin(), false_dead_subjects_.end(), true));
  }

  uint64_t suspicions_raised() const {
    uint64_t sum = 0;
    for (const Node& node : nodes_)
      sum += node.membership->stats().suspicions_raised;
    return sum;
  }

  // ---- load ----

  void reset_load() {
    load_start_us_ = now_us_;
    for (Node& node : nodes_) {
      node.msgs = 0;
      node.bytes = 0;
    }
    kind_msgs_.fill(0);
    kind_bytes_.fill(0);
  }

  Load load() const {
    Load l;
    l.seconds = static_cast<double>(now_us_ - load_start_us_) / static_cast<double>(kUsPerS);
    if (l.seconds <= 0) return l;
    uint64_t msgs = 0;
    uint64_t bytes = 0;
    for (const Node& node : nodes_) {
      if (!node.up) continue;
      msgs += node.msgs;
      bytes += node.bytes;
      l.msgs_max = std::max(l.msgs_max, static_cast<double>(node.msgs) / l.seconds);
      l.bytes_max = std::max(l.bytes_max, static_cast<double>(node.bytes) / l.seconds);
    }
    const double live = static_cast<double>(up_count_);
    l.msgs_mean = static_cast<double>(msgs) / live / l.seconds;
    l.bytes_mean = static_cast<double>(bytes) / live / l.seconds;
    uint64_t all_msgs = 0;
    uint64_t all_bytes = 0;
    for (size_t k = 0; k < kKinds; ++k) {
      all_msgs += kind_msgs_[k];
      all_bytes += kind_bytes_[k];
    }
    for (size_t k = 0; k < kKinds; ++k) {
      l.bytes_share[k] =
          all_bytes ? static_cast<double>(kind_bytes_[k]) / static_cast<double>(all_bytes) : 0;
    }
    l.bytes_per_msg = all_msgs ? static_cast<double>(all_bytes) / static_cast<double>(all_msgs) : 0;
    const auto swim = [](const std::array<uint64_t, kKinds>& by_kind) {
      uint64_t sum = 0;
      for (MembershipKind k : {MembershipKind::kPing, MembershipKind::kAck,
                               MembershipKind::kPingReq, MembershipKind::kNack})
        sum += by_kind[static_cast<size_t>(k)];
      return static_cast<double>(sum);
    };
    l.swim_msgs_mean = swim(kind_msgs_) / live / l.seconds;
    l.swim_bytes_mean = swim(kind_bytes_) / live / l.seconds;
    return l;
  }

 private:
  static constexpr uint32_t kTickSlot = std::numeric_limits<uint32_t>::max();
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  static constexpr size_t kNoVictim = std::numeric_limits<size_t>::max();

  struct Transport : MembershipTransport {
    Transport(Simulation* s, size_t i) : sim(s), index(i) {}
    void send(const Endpoint& to, const MembershipMessage& m) override { sim->send(index, to, m); }
    Simulation* sim;
    size_t index;
  };

  struct Node {
    std::unique_ptr<Transport> transport;
    std::unique_ptr<Membership> membership;
    bool up = true;
    int64_t armed_us = kNever;  // the time of the tick event that counts; kNever if none
    uint32_t tick_gen = 0;      // tick events of older generations are stale
    uint64_t msgs = 0;          // sent in the current load window
    uint64_t bytes = 0;
  };

  struct Event {
    int64_t at_us = 0;
    uint64_t order = 0;  // insertion order: equal times run first in, first out
    uint32_t node = 0;   // the receiver, or the node to tick
    uint32_t from = 0;   // delivery: the sender
    uint32_t slot = 0;   // delivery: the message in slab_; kTickSlot for a tick
    uint32_t gen = 0;    // tick: the node's tick_gen when armed
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.at_us != b.at_us ? a.at_us > b.at_us : a.order > b.order;
    }
  };

  int64_t now_ms() const { return now_us_ / kUsPerMs; }

  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  void push(Event e) {
    e.order = ++order_;
    queue_.push(e);
  }

  // After every call into node i: its tick event at its (possibly new) deadline.
  void rearm(size_t i) {
    Node& node = nodes_[i];
    const int64_t deadline = node.membership->next_deadline_ms();
    const int64_t at = deadline == std::numeric_limits<int64_t>::max()
                           ? kNever
                           : std::max(deadline * kUsPerMs, now_us_);
    if (at == node.armed_us) return;
    node.armed_us = at;
    ++node.tick_gen;
    if (at == kNever) return;
    push({at, 0, static_cast<uint32_t>(i), 0, kTickSlot, node.tick_gen});
  }

  void observe(size_t observer, const Member& m) {
    const size_t subject = static_cast<size_t>(m.id) - 1;
    uint8_t& seen = view_[observer * n_ + subject];
    const auto was = static_cast<MemberState>(seen);
    if (seen != kUnknown && was == m.state) return;  // an incarnation change only
    if (up(observer) && up(subject)) {
      if (seen != kUnknown && was == MemberState::kAlive) --alive_pairs_;
      if (m.state == MemberState::kAlive) ++alive_pairs_;
    }
    seen = static_cast<uint8_t>(m.state);
    if (m.state != MemberState::kDead) return;
    if (subject == victim_ && dead_seen_us_[observer] < 0 && up(observer)) {
      dead_seen_us_[observer] = now_us_;
      ++dead_seen_count_;
    }
    if (up(subject) && up(observer)) {
      ++false_dead_views_;
      false_dead_subjects_[subject] = true;
    }
  }

  void send(size_t from, const Endpoint& to, const MembershipMessage& m) {
    Node& sender = nodes_[from];
    ++sender.msgs;
    const size_t kind = std::min(static_cast<size_t>(m.kind), kKinds - 1);
    ++kind_msgs_[kind];
    if (++sent_ % encode_every_ == 0) {
      if (codec_.seal(m, now_ms(), datagram_) == PeerError::kOk) {
        sender.bytes += datagram_.size() * encode_every_;
        kind_bytes_[kind] += datagram_.size() * encode_every_;
      } else {
        ++encode_errors_;
      }
    }
    const auto it = by_host_.find(to.host);
    if (it == by_host_.end() || to.port != kPeerPort) return;
    if (loss_ > 0 && uniform() < loss_) return;
    const uint64_t span = static_cast<uint64_t>(net_.max_delay_us - net_.min_delay_us + 1);
    const int64_t delay = net_.min_delay_us + static_cast<int64_t>(rng_() % span);
    uint32_t slot = 0;
    if (free_.empty()) {
      slot = static_cast<uint32_t>(slab_.size());
      slab_.push_back(m);  // a deque: references held by a delivery in progress stay valid
    } else {
      slot = free_.back();
      free_.pop_back();
      slab_[slot] = m;
    }
    push({now_us_ + delay, 0, static_cast<uint32_t>(it->second), static_cast<uint32_t>(from), slot,
          0});
  }

  size_t n_;
  std::mt19937_64 rng_;
  NetOptions net_;
  double loss_ = 0;
  uint64_t encode_every_;
  uint64_t max_events_;
  PeerCodec codec_;
  std::vector<uint8_t> datagram_;
  uint64_t sent_ = 0;
  uint64_t encode_errors_ = 0;

  std::vector<Node> nodes_;
  std::unordered_map<std::string, size_t> by_host_;
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  std::deque<MembershipMessage> slab_;
  std::vector<uint32_t> free_;
  uint64_t order_ = 0;
  uint64_t events_ = 0;
  int64_t now_us_ = kStartUs;

  std::vector<uint8_t> view_;  // [observer * n + subject]: MemberState, or kUnknown
  size_t up_count_ = 0;
  size_t alive_pairs_ = 0;  // (live observer, live subject) with the subject seen Alive
  size_t victim_ = kNoVictim;
  std::vector<int64_t> dead_seen_us_;  // per observer: when it first listed victim_ Dead
  size_t dead_seen_count_ = 0;
  uint64_t false_dead_views_ = 0;
  std::vector<bool> false_dead_subjects_;

  int64_t load_start_us_ = kStartUs;
  std::array<uint64_t, kKinds> kind_msgs_{};
  std::array<uint64_t, kKinds> kind_bytes_{};
};

struct Row {
  std::string scenario;
  size_t nodes = 0;
  double loss = 0;
  std::optional<double> converge_s;
  std::optional<double> converge_99_s;
  std::optional<double> detect_p50_s;
  std::optional<double> detect_p99_s;
  std::optional<double> detect_max_s;
  std::optional<uint64_t> detect_samples;
  std::optional<uint64_t> undetected;
  std::optional<uint64_t> false_dead;
  std::optional<uint64_t> false_dead_views;
  std::optional<uint64_t> suspicions;
  std::optional<Load> load;
  double sim_s = 0;
  double wall_s = 0;
  std::string note;
};

Row make_row(const char* scenario, size_t nodes, double loss = 0) {
  Row r;
  r.scenario = scenario;
  r.nodes = nodes;
  r.loss = loss;
  return r;
}

struct Settings {
  std::vector<size_t> nodes = {10, 100, 1000};
  uint64_t seed = 1;
  bool quick = false;
  double steady_s = 60;
  double loss_s = 300;
  size_t converge_max_nodes = 100;
  std::vector<std::string> scenarios = {"converge", "steady", "false-dead", "detect"};
  double loss = 0.01;
  size_t kills = 5;
  uint64_t encode_every = 1;
  uint64_t max_events = 400'000'000;
};

constexpr int64_t kConvergeLimitUs = 600 * kUsPerS;
constexpr int64_t kDetectLimitUs = 120 * kUsPerS;

int64_t us_of(double seconds) {
  return static_cast<int64_t>(std::llround(seconds * static_cast<double>(kUsPerS)));
}
double s_of(int64_t us) {
  return static_cast<double>(us) / static_cast<double>(kUsPerS);
}

bool wanted(const Settings& st, const char* scenario) {
  return std::find(st.scenarios.begin(), st.scenarios.end(), scenario) != st.scenarios.end();
}

uint64_t cluster_seed(const Settings& st, size_t n, uint64_t which) {
  return st.seed * 1'000'003 + n * 4 + which;
}

// A join burst of `n` nodes; appends the converge row.
void run_converge(const Settings& st, size_t n, std::vector<Row>& rows) {
  Simulation sim(n, cluster_seed(st, n, 0), NetOptions{}, st.encode_every, st.max_events);
  const auto wall = WallClock::now();
  const int64_t phase_start = sim.now_us();
  sim.join(0, 0);  // the first node: alone until someone joins it
  for (size_t i = 1; i < n; ++i) {
    sim.run_for(kUsPerMs);
    sim.join(i, 0);
  }
  const int64_t last_join = sim.now_us();
  Row conv = make_row("converge", n);
  if (sim.run_until(last_join + kConvergeLimitUs, [&sim] { return sim.alive_share() >= 0.99; }))
    conv.converge_99_s = s_of(sim.now_us() - last_join);
  if (sim.run_until(last_join + kConvergeLimitUs, [&sim] { return sim.converged(); })) {
    conv.converge_s = s_of(sim.now_us() - last_join);
  } else {
    conv.note = "not converged within 600 s";
  }
  conv.sim_s = s_of(sim.now_us() - phase_start);
  conv.wall_s = secs_since(wall);
  if (sim.out_of_events()) conv.note += "; stopped at the event bound";
  rows.push_back(conv);
  std::fprintf(
      stderr,
      "  %zu nodes: converged (99 %%) %.2f s, (all) %.2f s after the last join (%.1f s wall)\n", n,
      conv.converge_99_s.value_or(-1), conv.converge_s.value_or(-1), conv.wall_s);
}

// A pre-seeded cluster of `n` nodes through steady, false-dead and detect; appends their rows.
void run_phases(const Settings& st, size_t n, std::vector<Row>& rows) {
  Simulation sim(n, cluster_seed(st, n, 1), NetOptions{}, st.encode_every, st.max_events);
  auto converged = [&sim] { return sim.converged(); };
  auto wall = WallClock::now();
  for (size_t i = 0; i < n; ++i) {
    sim.join_preseeded(i, i == 0 ? 1 : 0);
    sim.run_for(kUsPerMs);
  }
  const int64_t last_join = sim.now_us();
  if (!sim.converged()) {
    Row r = make_row("steady", n);
    r.note = "not converged after the pre-seeded start";
    rows.push_back(r);
    return;
  }
  // Whatever phase comes first also carries the pre-seeded start and the settling in its wall_s.
  sim.run_until(last_join + 30 * kUsPerS, [] { return false; });

  // A window of `seconds` at `loss`: load, false deaths, suspicions.
  auto window = [&](const char* scenario, double loss, double seconds) {
    const int64_t phase_start = sim.now_us();
    sim.set_loss(loss);
    sim.reset_load();
    sim.reset_false_deaths();
    const uint64_t suspicions_before = sim.suspicions_raised();
    sim.run_for(us_of(seconds));
    Row r = make_row(scenario, n, loss);
    r.load = sim.load();
    r.false_dead = sim.false_dead_members();
    r.false_dead_views = sim.false_dead_views();
    r.suspicions = sim.suspicions_raised() - suspicions_before;
    r.sim_s = s_of(sim.now_us() - phase_start);
    r.wall_s = secs_since(wall);
    sim.set_loss(0);
    std::fprintf(stderr,
                 "  %zu nodes: %s, %.0f s at %.1f %% loss: %.2f msgs/node/s, %.0f B/node/s, %llu "
                 "false dead, %llu suspicions (%.1f s wall)\n",
                 n, scenario, seconds, loss * 100, r.load->msgs_mean, r.load->bytes_mean,
                 static_cast<unsigned long long>(*r.false_dead),
                 static_cast<unsigned long long>(*r.suspicions), r.wall_s);
    wall = WallClock::now();
    return r;
  };
  if (wanted(st, "steady")) rows.push_back(window("steady", 0, st.steady_s));
  if (wanted(st, "false-dead")) rows.push_back(window("false-dead", st.loss, st.loss_s));

  if (wanted(st, "detect")) {
    const int64_t phase_start = sim.now_us();
    Row det = make_row("detect", n);
    if (!sim.run_until(sim.now_us() + kConvergeLimitUs, converged))
      det.note = "not converged again after the lossy run";
    sim.reset_false_deaths();
    std::vector<double> samples;
    size_t kills = 0;
    uint64_t undetected = 0;
    for (size_t k = 0; k < st.kills && det.note.empty(); ++k) {
      sim.run_for(kUsPerS + static_cast<int64_t>(sim.rng()() % static_cast<uint64_t>(2 * kUsPerS)));
      std::vector<size_t> live;
      for (size_t i = 0; i < n; ++i)
        if (sim.up(i)) live.push_back(i);
      if (live.size() < 3) break;
      const size_t victim = live[static_cast<size_t>(sim.rng()() % live.size())];
      const int64_t killed_at = sim.now_us();
      sim.watch_victim(victim);
      sim.kill(victim);
      ++kills;
      sim.run_until(killed_at + kDetectLimitUs,
                    [&sim] { return sim.all_survivors_saw_victim_dead(); });
      double worst = 0;
      for (size_t o = 0; o < n; ++o) {
        if (!sim.up(o)) continue;
        if (sim.dead_seen_us(o) < 0) {
          ++undetected;
          continue;
        }
        const double d = s_of(sim.dead_seen_us(o) - killed_at);
        samples.push_back(d);
        worst = std::max(worst, d);
      }
      std::fprintf(stderr,
                   "  %zu nodes: kill %zu (node %zu): the last survivor listed it Dead after "
                   "%.2f s\n",
                   n, k + 1, victim, worst);
      if (!sim.run_until(sim.now_us() + kConvergeLimitUs, converged))
        det.note = "survivors did not converge after a kill";
      sim.run_for(5 * kUsPerS);
    }
    if (!samples.empty()) {
      det.detect_p50_s = percentile(samples, 0.50);
      det.detect_p99_s = percentile(samples, 0.99);
      det.detect_max_s = *std::max_element(samples.begin(), samples.end());
    }
    det.detect_samples = samples.size();
    det.undetected = undetected;
    det.false_dead = sim.false_dead_members();
    det.false_dead_views = sim.false_dead_views();
    det.sim_s = s_of(sim.now_us() - phase_start);
    det.wall_s = secs_since(wall);
    if (det.note.empty()) det.note = std::to_string(kills) + " kills";
    rows.push_back(det);
  }

  if (!rows.empty() && sim.out_of_events()) rows.back().note += "; stopped at the event bound";
  if (!rows.empty() && sim.encode_errors() > 0)
    rows.back().note += "; " + std::to_string(sim.encode_errors()) + " messages failed to seal";
  std::fprintf(stderr, "  %zu nodes: %llu events\n", n,
               static_cast<unsigned long long>(sim.events()));
}

std::string fmt(const std::optional<double>& v, int decimals) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, *v);
  return buf;
}
std::string fmt(const std::optional<uint64_t>& v) {
  return v ? std::to_string(*v) : "-";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "sluice-bench-cluster-sim: SWIM/Lifeguard membership at scale, by deterministic "
      "simulation"};
  Settings st;
  bool json = false;
  app.add_option("--nodes", st.nodes, "cluster sizes, e.g. 10,100,1000")->delimiter(',');
  app.add_option("--seed", st.seed, "every random choice derives from it");
  app.add_flag("--quick", st.quick, "N = 10 and 100 only, shorter phases");
  app.add_flag("--json", json, "last line of stdout: {\"rows\":[...]}");
  app.add_option("--steady-seconds", st.steady_s, "simulated seconds of the steady load window")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--loss-seconds", st.loss_s, "simulated seconds of the lossy run")
      ->check(CLI::Range(1.0, 36000.0));
  app.add_option("--loss", st.loss, "loss probability of every message in the lossy run")
      ->check(CLI::Range(0.0, 0.5));
  app.add_option("--kills", st.kills, "nodes killed one at a time in the detect phase");
  app.add_option("--converge-max-nodes", st.converge_max_nodes,
                 "simulate the join burst (converge row) only up to this N");
  app.add_option("--scenario", st.scenarios, "any of converge, steady, false-dead, detect")
      ->delimiter(',')
      ->check(CLI::IsMember({"converge", "steady", "false-dead", "detect"}));
  app.add_option("--encode-every", st.encode_every,
                 "seal every K-th message and count K times its size (1: every message)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000}));
  app.add_option("--max-events", st.max_events, "bound on simulated events per cluster");
  CLI11_PARSE(app, argc, argv);
  if (st.quick) {
    if (!app.count("--nodes")) st.nodes = {10, 100};
    if (!app.count("--steady-seconds")) st.steady_s = 30;
    if (!app.count("--loss-seconds")) st.loss_s = 60;
    if (!app.count("--kills")) st.kills = 3;
  }
  for (size_t n : st.nodes) {
    if (n < 3 || n > 2'000) {
      std::fprintf(
          stderr,
          "sluice-bench-cluster-sim: --nodes: %zu is not in [3, 2000] (memory grows as N^2)\n", n);
      return 2;
    }
  }

  std::vector<Row> rows;
  const auto t0 = WallClock::now();
  for (size_t n : st.nodes) {
    std::fprintf(stderr, "%zu nodes ...\n", n);
    if (wanted(st, "converge") && n <= st.converge_max_nodes) run_converge(st, n, rows);
    if (wanted(st, "steady") || wanted(st, "false-dead") || wanted(st, "detect"))
      run_phases(st, n, rows);
  }

  std::printf(
      "sluice-bench-cluster-sim: seed %llu, delay 0.2-2 ms, defaults of MembershipOptions; "
      "steady %.0f s, lossy %.0f s at %.1f %% loss, %zu kills; bytes = sealed datagrams%s; "
      "%.0f s in all\n",
      static_cast<unsigned long long>(st.seed), st.steady_s, st.loss_s, st.loss * 100, st.kills,
      st.encode_every == 1 ? " (every message sealed)"
                           : (" (every " + std::to_string(st.encode_every) +
                              "th message sealed, counted that many times)")
                                 .c_str(),
      secs_since(t0));
  std::printf("%-10s %5s %5s %7s %7s %7s %7s %7s %5s %5s %9s %7s %7s %8s %8s %6s %7s  %s\n",
              "scenario", "nodes", "loss", "conv99", "conv_s", "det_p50", "det_p99", "det_max",
              "fdead", "fviews", "suspicion", "msg/s", "msg/max", "B/s", "B/s_max", "sim_s",
              "wall_s", "note");
  for (const Row& r : rows) {
    const auto opt = [&r](double Load::*f) -> std::optional<double> {
      return r.load ? std::optional<double>((*r.load).*f) : std::nullopt;
    };
    std::printf(
        "%-10s %5zu %5.2f %7s %7s %7s %7s %7s %5s %5s %9s %7s %7s %8s %8s %6.0f %7.1f  %s\n",
        r.scenario.c_str(), r.nodes, r.loss, fmt(r.converge_99_s, 2).c_str(),
        fmt(r.converge_s, 2).c_str(), fmt(r.detect_p50_s, 2).c_str(),
        fmt(r.detect_p99_s, 2).c_str(), fmt(r.detect_max_s, 2).c_str(), fmt(r.false_dead).c_str(),
        fmt(r.false_dead_views).c_str(), fmt(r.suspicions).c_str(),
        fmt(opt(&Load::msgs_mean), 2).c_str(), fmt(opt(&Load::msgs_max), 2).c_str(),
        fmt(opt(&Load::bytes_mean), 0).c_str(), fmt(opt(&Load::bytes_max), 0).c_str(), r.sim_s,
        r.wall_s, r.note.c_str());
  }
  for (const Row& r : rows) {
    if (!r.load) continue;
    std::printf(
        "%-10s %5zu: %.0f B/message; probes and gossip only (no kJoin/kJoinReply): %.2f msgs, %.0f "
        "B per node per s; bytes by kind:",
        r.scenario.c_str(), r.nodes, r.load->bytes_per_msg, r.load->swim_msgs_mean,
        r.load->swim_bytes_mean);
    for (size_t k = 0; k < kKinds; ++k)
      std::printf(" %s %.1f%%", kKindNames[k], r.load->bytes_share[k] * 100);
    std::printf("\n");
  }

  if (json) {
    nlohmann::json out = nlohmann::json::array();
    const auto num = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    for (const Row& r : rows) {
      nlohmann::json row = {{"scenario", r.scenario},
                            {"nodes", r.nodes},
                            {"loss", r.loss},
                            {"seed", st.seed},
                            {"converge_s", num(r.converge_s)},
                            {"converge_99_s", num(r.converge_99_s)},
                            {"detect_p50_s", num(r.detect_p50_s)},
                            {"detect_p99_s", num(r.detect_p99_s)},
                            {"detect_max_s", num(r.detect_max_s)},
                            {"detect_samples", num(r.detect_samples)},
                            {"undetected", num(r.undetected)},
                            {"false_dead", num(r.false_dead)},
                            {"false_dead_views", num(r.false_dead_views)},
                            {"suspicions", num(r.suspicions)},
                            {"msgs_per_node_s", nullptr},
                            {"msgs_per_node_s_max", nullptr},
                            {"bytes_per_node_s", nullptr},
                            {"bytes_per_node_s_max", nullptr},
                            {"sim_s", r.sim_s},
                            {"wall_s", r.wall_s},
                            {"note", r.note}};
      if (r.load) {
        row["msgs_per_node_s"] = r.load->msgs_mean;
        row["msgs_per_node_s_max"] = r.load->msgs_max;
        row["bytes_per_node_s"] = r.load->bytes_mean;
        row["bytes_per_node_s_max"] = r.load->bytes_max;
        row["bytes_per_msg"] = r.load->bytes_per_msg;
        row["swim_msgs_per_node_s"] = r.load->swim_msgs_mean;
        row["swim_bytes_per_node_s"] = r.load->swim_bytes_mean;
        nlohmann::json share = nlohmann::json::object();
        for (size_t k = 0; k < kKinds; ++k)
          share[kKindNames[k]] = r.load->bytes_share[k];
        row["bytes_share_by_kind"] = share;
      }
      out.push_back(row);
    }
    sluice::bench::print_json_rows(out);
  }
  return 0;
}
