// sim::Cluster, the simulated cluster of the cluster-sim scenario (bench/scenarios/cluster_sim.cc
// says what it measures): N Membership nodes (membership_nodes.h) on the one simulated network
// (network.h; its comment says how delays, loss and the order of events go), and, once
// start_overrides() is called, on each node an OverrideTable (lib/cluster/override_table.h) spread
// by an OverrideSpread (lib/cluster/override_spread.h), as a node's OverrideSync runs them; and
// what the bench observes: who lists whom in which state, and the messages and bytes the nodes
// send.
//
// Every message a node sends is sealed with the real peer codec (peer_codec.h: Cap'n Proto
// envelope + 32-byte HMAC tag) to count its bytes, UDP and IP headers (28 bytes a datagram) not
// included; membership messages may be sampled (encode_every), override messages are all sealed.
// A node's override tick is an event every 100 ms (OverrideSync::kTickMs) from a random phase.
//
// What the table side of OverrideSync does on the node's merge thread is done inline here: a
// received record is checked (check_record) and merged (OverrideTable::merge), as
// NodeState::merge_overrides does without the disk; the answer is answer_to() and full_table().
//
// Single-threaded, like the nodes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/membership.h"
#include "cluster/override_spread.h"
#include "cluster/override_table.h"
#include "cluster/peer_codec.h"
#include "sim/membership_nodes.h"
#include "sim/network.h"

namespace sluice::sim {

using cluster::anti_entropy_interval_ms;
using cluster::Member;
using cluster::MembershipStats;
using cluster::MemberState;

inline constexpr int64_t kUsPerMs = 1'000;
inline constexpr int64_t kUsPerS = 1'000'000;
inline constexpr int64_t kStartUs = 1'000'000 * kUsPerMs;  // any origin; the tests use 1'000'000 ms
// MembershipKind and OverrideSyncKind values.
inline const std::vector<std::string> kKindNames = {"ping", "ack",  "ping_req",
                                                    "nack", "join", "join_reply"};
inline const std::vector<std::string> kOverrideKindNames = {"push", "digest", "full"};

Member member_of(size_t index);  // id index + 1, name node-0000, host 10.a.b.c

// Messages of one layer (membership or overrides) sent by the nodes live at the end of a
// measurement window, from its reset to now.
struct Load {
  double seconds = 0;
  size_t nodes = 0;      // live
  double msgs_mean = 0;  // per live node per second
  double msgs_max = 0;   // the busiest node
  double bytes_mean = 0;
  double bytes_max = 0;
  std::vector<uint64_t> msgs;  // datagrams sent (before loss) by kind, summed over the nodes
  std::vector<uint64_t> bytes;
  // Of the probes and their answers (kPing, kAck, kPingReq, kNack) sent by every node, live or
  // not: the records they carried, and the messages that carried their sender's own record.
  uint64_t swim_records = 0;
  uint64_t swim_own_records = 0;
};

// The network (the clock, the generator, loss, up(), run_until()) and its nodes.
class Cluster : public Network {
 public:
  Cluster(size_t n, uint64_t seed, uint64_t encode_every, uint64_t max_events);

  uint64_t encode_errors() const { return encode_errors_; }

  // Every live node lists every live node Alive.
  bool converged() const { return alive_pairs_ == up_count_ * up_count_; }
  // Of the (live observer, live member) pairs, the share listed Alive.
  double alive_share() const {
    return static_cast<double>(alive_pairs_) / static_cast<double>(up_count_ * up_count_);
  }

  void join(size_t i, size_t seed) { members_.join(i, seed); }
  // Node i joins `seed` and is handed, at once, the seed's answer for a cluster where every node
  // is Alive at incarnation 0: every member, in kJoinReply messages of max_join_reply_entries.
  // Not sent through the network, so not counted as load.
  void join_preseeded(size_t i, size_t seed);
  // The node stops: no more ticks, and what reaches it is dropped. Survivors' first Dead time of
  // it is recorded (dead_seen_us) until the next kill.
  void kill(size_t v);

  // ---- what the observers saw ----

  MemberState view(size_t observer, size_t subject) const {
    return static_cast<MemberState>(view_[observer * n_ + subject]);
  }
  int64_t dead_seen_us(size_t observer) const { return dead_seen_us_[observer]; }
  // Every live node has listed the last victim Dead.
  bool all_survivors_saw_victim_dead() const { return dead_seen_count_ == up_count_; }
  // From now: the membership load, false deaths (a live member listed Dead by a live observer)
  // and the suspicions raised (summed over the nodes).
  void start_window();
  uint64_t false_dead_views() const { return false_dead_views_; }
  uint64_t false_dead_members() const;
  uint64_t suspicions() const { return summed(&MembershipStats::suspicions_raised) - suspicions_; }
  // A MembershipStats counter summed over every node, live or not (deaths_declared: suspicion
  // timeouts that ended on a node, what partition_test sums over /v1/cluster).
  uint64_t summed(uint64_t MembershipStats::*stat) const;
  // Live observers that list live member `subject` Suspect.
  size_t suspected_by(size_t subject) const;

  // ---- load: membership messages (from start_window()) and override messages ----
  Load load() const { return load_of(membership_); }
  void reset_override_load() { reset(overrides_); }
  Load override_load() const { return load_of(overrides_); }

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
  // Received records check_record refused (none expected: one clock), and records that did not
  // fit a full table's datagrams.
  uint64_t overrides_refused() const { return overrides_refused_; }
  uint64_t overrides_unfit() const { return overrides_unfit_; }

 private:
  // Messages and bytes sent per node and kind since start_us.
  struct Tally {
    size_t kinds = 0;
    int64_t start_us = kStartUs;
    std::vector<uint64_t> msgs, bytes;                // [node * kinds + kind]
    uint64_t swim_records = 0, swim_own_records = 0;  // Load's
  };
  struct Write {
    std::string id;
    cluster::OverrideVersion version;
    int64_t at_us = 0;
    size_t holders = 0;
    int64_t reached_us = -1;
  };

  void observe(size_t observer, const Member& m);
  void reset(Tally& t);
  Load load_of(const Tally& t) const;
  // Counts a message of `kind` from node `from`; seals it to count its bytes times `scale` (0:
  // not sealed, a membership message left out of the sample).
  template <class Message>
  void count(Tally& t, size_t from, size_t kind, const Message& m, uint64_t scale);

  std::vector<cluster::NodeId> live_of(size_t i) const;  // listed Alive or Suspect, not itself
  void tick_overrides(size_t i);
  void send_override(size_t from, cluster::NodeId to, const cluster::OverrideSyncMessage& m);
  void receive_override(size_t i, const cluster::OverrideSyncMessage& m);
  void merge_override(size_t i, const cluster::OverrideRecord& r, int64_t now);

  size_t n_;
  MembershipNodes members_;
  uint64_t encode_every_;
  cluster::PeerCodec codec_;
  std::vector<uint8_t> datagram_;
  uint64_t sent_ = 0;
  uint64_t encode_errors_ = 0;
  Tally membership_, overrides_;

  std::vector<uint8_t> view_;  // [observer * n + subject]: MemberState, or kUnknown
  size_t up_count_ = 0;
  size_t alive_pairs_ = 0;  // (live observer, live subject) with the subject seen Alive
  size_t victim_ = SIZE_MAX;
  std::vector<int64_t> dead_seen_us_;  // per observer: when it first listed victim_ Dead
  size_t dead_seen_count_ = 0;
  uint64_t false_dead_views_ = 0;
  uint64_t suspicions_ = 0;  // raised before the window
  std::vector<bool> false_dead_subjects_;

  std::vector<std::unique_ptr<cluster::OverrideSpread>> spreads_;  // from start_overrides()
  std::vector<cluster::OverrideTable> tables_;
  std::vector<Write> writes_;
  std::unordered_map<std::string, size_t> write_by_id_;
  size_t writes_unreached_ = 0;
  uint64_t overrides_refused_ = 0;
  uint64_t overrides_unfit_ = 0;
  Slots<cluster::OverrideSyncMessage> overrides_in_flight_;
};

}  // namespace sluice::sim
