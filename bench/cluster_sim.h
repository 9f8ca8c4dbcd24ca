// The simulated cluster of sluice-bench-cluster-sim (scenarios/cluster_sim.cc says what it measures):
// N nodes, each a Membership (lib/cluster/membership.h) and, once start_overrides() is called,
// an OverrideTable (lib/cluster/override_table.h) spread by an OverrideSpread
// (lib/cluster/override_spread.h), as a node's OverrideSync runs them; the network between the
// nodes; and what the bench observes.
//
// The network: one priority queue of events, (time in µs, insertion order) first. An event is the
// delivery of a message (one-way delay uniform in [min, max], each message lost independently
// with the current loss probability), a node's membership tick at its next_deadline_ms(), or a
// node's override tick (every 100 ms, OverrideSync::kTickMs, from a random phase). Nodes see the
// time in ms (µs / 1000); the µs clock only orders deliveries within a millisecond. A killed node
// is no longer ticked and messages to it are dropped on arrival. Every random choice comes from
// one generator seeded by the caller. Every message a node sends is sealed with the real peer
// codec (peer_codec.h: Cap'n Proto envelope + 32-byte HMAC tag) to count its bytes, UDP and IP
// headers (28 bytes a datagram) not included; membership messages may be sampled
// (encode_every), override messages are all sealed.
//
// What the table side of OverrideSync does on the node's merge thread is done inline here: a
// received record is checked (check_record) and merged (OverrideTable::merge), as
// NodeState::merge_overrides does without the disk; the answer is answer_to() and full_table().
//
// Single-threaded, like the nodes. Owns the nodes and their transports.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/membership.h"
#include "cluster/override_spread.h"
#include "cluster/override_table.h"
#include "cluster/peer_codec.h"

namespace sluice::bench::sim {

using cluster::Member;
using cluster::MembershipMessage;
using cluster::MemberState;
using cluster::NodeId;
using cluster::OverrideSyncMessage;

inline constexpr int64_t kUsPerMs = 1'000;
inline constexpr int64_t kUsPerS = 1'000'000;
inline constexpr int64_t kStartUs = 1'000'000 * kUsPerMs;  // any origin; the tests use 1'000'000 ms
inline constexpr size_t kKinds = 6;                        // MembershipKind values
inline constexpr const char* kKindNames[kKinds] = {"ping", "ack",  "ping_req",
                                                   "nack", "join", "join_reply"};
inline constexpr size_t kOverrideKinds = 3;  // OverrideSyncKind values
inline constexpr const char* kOverrideKindNames[kOverrideKinds] = {"push", "digest", "full"};
inline constexpr int64_t kOverrideTickMs = 100;  // OverrideSync::kTickMs

std::string host_of(size_t index);
Member member_of(size_t index);  // id index + 1, name node-0000, host 10.a.b.c

struct NetOptions {
  int64_t min_delay_us = 200;
  int64_t max_delay_us = 2'000;
};

// Membership messages sent by the nodes during a measurement window.
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

// Override messages sent by the nodes during a measurement window.
struct OverrideLoad {
  double seconds = 0;
  double msgs_mean = 0;  // per node per second, over the live nodes, every kind
  double bytes_mean = 0;
  double bytes_max = 0;                         // the busiest node
  std::array<uint64_t, kOverrideKinds> msgs{};  // datagrams sent (before loss), in all, by kind
  std::array<uint64_t, kOverrideKinds> bytes{};
};

class Simulation {
 public:
  Simulation(size_t n, uint64_t seed, NetOptions net, uint64_t encode_every, uint64_t max_events);
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  size_t size() const { return n_; }
  int64_t now_us() const { return now_us_; }
  bool up(size_t i) const { return nodes_[i].up; }
  uint64_t events() const { return events_; }
  bool out_of_events() const { return events_ >= max_events_; }
  uint64_t encode_errors() const { return encode_errors_; }
  std::mt19937_64& rng() { return rng_; }
  void set_loss(double p) { loss_ = p; }
  // Messages to node i are lost with probability p besides the loss of every message (the two
  // drawn as one: kept with probability (1 - loss) * (1 - p)); one-way loss into one node.
  void set_loss_into(size_t i, double p) { loss_into_[i] = p; }

  // Every live node lists every live node Alive.
  bool converged() const { return alive_pairs_ == up_count_ * up_count_; }
  // Of the (live observer, live member) pairs, the share listed Alive.
  double alive_share() const {
    return static_cast<double>(alive_pairs_) / static_cast<double>(up_count_ * up_count_);
  }

  void join(size_t i, size_t seed);
  // Node i joins `seed` and is handed, at once, the seed's answer for a cluster where every node
  // is Alive at incarnation 0: every member, in kJoinReply messages of max_join_reply_entries.
  // Not sent through the network, so not counted as load.
  void join_preseeded(size_t i, size_t seed);
  // The node stops: no more ticks, and what reaches it is dropped.
  void kill(size_t v);

  // Runs events until `until_us`, or until stop() holds after an event (then returns true).
  template <class Stop>
  bool run_until(int64_t until_us, Stop&& stop) {
    while (!queue_.empty() && queue_.top().at_us <= until_us) {
      if (out_of_events()) return false;
      step();
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
  void watch_victim(size_t v);
  int64_t dead_seen_us(size_t observer) const { return dead_seen_us_[observer]; }
  // Call after kill(victim): every live node has listed it Dead.
  bool all_survivors_saw_victim_dead() const { return dead_seen_count_ == up_count_; }
  // False deaths: a live member listed Dead by a live observer, since the last reset.
  void reset_false_deaths();
  uint64_t false_dead_views() const { return false_dead_views_; }
  uint64_t false_dead_members() const;
  uint64_t suspicions_raised() const;
  // Summed over every node, live or not: MembershipStats::deaths_declared (suspicion timeouts
  // that ended on a node, what partition_test sums over /v1/cluster) and ::refutations.
  uint64_t deaths_declared() const;
  uint64_t refutations() const;
  // Live observers that list live member `subject` Suspect.
  size_t suspected_by(size_t subject) const;

  // ---- membership load ----
  void reset_load();
  Load load() const;

  // ---- overrides ----

  // Every live node starts its override layer now (OverrideSpread::start) and ticks it every
  // 100 ms from a random phase. Its first tick finds every live member new and sends each its
  // digest, as a node does when it meets the others.
  void start_overrides();
  // Node i writes a set of override {domain api, user=<user>}, 100/1m, at the version its table
  // gives it, and pushes it (OverrideSpread::on_local_write). Tracked: the index of the write.
  size_t write_override(size_t i, const std::string& user);
  size_t writes() const { return writes_.size(); }
  int64_t write_at_us(size_t w) const { return writes_[w].at_us; }
  // When the last live node came to hold write w (its version or a newer one); -1 until then.
  int64_t reached_all_us(size_t w) const { return writes_[w].reached_us; }
  bool all_writes_reached() const { return writes_unreached_ == 0; }
  // Received records check_record refused (none expected: one clock).
  uint64_t overrides_refused() const { return overrides_refused_; }
  uint64_t overrides_unfit() const { return overrides_unfit_; }
  void reset_override_load();
  OverrideLoad override_load() const;

 private:
  enum class EventType : uint8_t { kTick, kMembership, kOverrideTick, kOverride };

  struct Transport : cluster::MembershipTransport {
    Transport(Simulation* s, size_t i) : sim(s), index(i) {}
    void send(const cluster::Endpoint& to, const MembershipMessage& m) override {
      sim->send(index, to, m);
    }
    Simulation* sim;
    size_t index;
  };

  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  struct Node {
    std::unique_ptr<Transport> transport;
    std::unique_ptr<cluster::Membership> membership;
    bool up = true;
    int64_t armed_us = kNever;  // the time of the tick event that counts; kNever if none
    uint32_t tick_gen = 0;      // tick events of older generations are stale
    uint64_t msgs = 0;          // membership messages sent in the current load window
    uint64_t bytes = 0;
    std::array<uint64_t, kKinds> kind_msgs{};  // the same, by kind
    std::array<uint64_t, kKinds> kind_bytes{};
    uint64_t override_msgs = 0;  // override messages sent in the current override load window
    uint64_t override_bytes = 0;
    std::unique_ptr<cluster::OverrideSpread> spread;  // from start_overrides()
    cluster::OverrideTable table;
  };
  struct Write {
    std::string id;
    cluster::OverrideVersion version;
    int64_t at_us = 0;
    size_t holders = 0;
    int64_t reached_us = -1;
  };

  struct Event {
    int64_t at_us = 0;
    uint64_t order = 0;  // insertion order: equal times run first in, first out
    uint32_t node = 0;   // the receiver, or the node to tick
    uint32_t from = 0;   // delivery: the sender
    uint32_t slot = 0;   // delivery: the message in its slab
    uint32_t gen = 0;    // membership tick: the node's tick_gen when armed
    EventType type = EventType::kTick;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.at_us != b.at_us ? a.at_us > b.at_us : a.order > b.order;
    }
  };

  static constexpr size_t kNoVictim = std::numeric_limits<size_t>::max();

  int64_t now_ms() const { return now_us_ / kUsPerMs; }
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }
  int64_t delay_us();
  void push(Event e);
  void step();
  void rearm(size_t i);
  void observe(size_t observer, const Member& m);
  void send(size_t from, const cluster::Endpoint& to, const MembershipMessage& m);

  std::vector<NodeId> live_of(size_t i) const;  // members i lists Alive or Suspect, not itself
  void tick_overrides(size_t i);
  void send_override(size_t from, NodeId to, const OverrideSyncMessage& m);
  void receive_override(size_t i, OverrideSyncMessage& m);
  void merge_override(size_t i, const cluster::OverrideRecord& r, int64_t now);

  size_t n_;
  std::mt19937_64 rng_;
  NetOptions net_;
  double loss_ = 0;
  std::vector<double> loss_into_;  // per receiver, besides loss_
  uint64_t encode_every_;
  uint64_t max_events_;
  cluster::PeerCodec codec_;
  std::vector<uint8_t> datagram_;
  uint64_t sent_ = 0;
  uint64_t encode_errors_ = 0;

  std::vector<Node> nodes_;
  std::unordered_map<std::string, size_t> by_host_;
  std::priority_queue<Event, std::vector<Event>, Later> queue_;
  std::deque<MembershipMessage> slab_;  // a deque: references held by a delivery stay valid
  std::vector<uint32_t> free_;
  std::deque<OverrideSyncMessage> override_slab_;
  std::vector<uint32_t> override_free_;
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

  std::vector<Write> writes_;
  std::unordered_map<std::string, size_t> write_by_id_;
  size_t writes_unreached_ = 0;
  uint64_t overrides_refused_ = 0;
  uint64_t overrides_unfit_ = 0;
  int64_t override_load_start_us_ = kStartUs;
  OverrideLoad override_counts_;  // msgs, bytes, datagrams by kind since the reset
};

}  // namespace sluice::bench::sim
