// Which nodes own a key: consistent hashing of the engine's 64-bit counter ids over the live
// members, the owner first, then R-1 replicas on other nodes (docs/architecture.md, "The cluster").
//
// Rendezvous (highest-random-weight) hashing: every member gets a weight per key and the R
// heaviest members own the key, heaviest first. weight = the top 48 bits of
// mix(mix(key) ^ seed(member)) above the member's 16-bit id, so one integer comparison orders two
// members and equal hashes go to the larger id; seed = XXH3-64 of the member's name seeded with
// its id; mix = the splitmix64 finalizer.
//
// Why not virtual nodes: rendezvous meets each requirement by construction instead of
// statistically, and at Sluice's cluster sizes its O(N) lookup is as fast as a ring's binary
// search. Measured with sluice-bench-ring (--vnodes adds a virtual-node ring for comparison;
// today's figures in docs/benchmarks.md, the first run in docs/bench-log/2026-11-22-cluster.md):
//   - balance: the max/mean primary load is the spread of an ideal random assignment, where a
//     virtual-node ring with 100 or even 1000 vnodes per member is several times more uneven;
//   - movement: a join moves exactly the keys the newcomer wins, a departure exactly the keys
//     the leaver held; no other key changes owner ("stray" keys: 0), and an owner list changes
//     only where the joining or leaving node enters or leaves it, so when an owner leaves, its
//     first replica (which already holds the key) takes over;
//   - placement depends only on the member set (members are kept sorted by id, ties by id), so
//     every node computes the same owners whatever order it learnt members in;
//   - a lookup scans 10 bytes per member and allocates nothing, and up to 50 members is faster
//     than a 1000-vnode ring's binary search. The top-R selection is branch-free: with branches
//     it was twice as slow, the predictor losing the coin toss of whether each member enters
//     the top R.
// Past a few hundred members the linear scan would call for a ring (or hierarchical rendezvous).
//
// Thread safety: a HashRing is a value. Mutators (add, remove, clear) need exclusive access; the
// const methods may run on any number of threads at once. The intended use is to build a new ring
// when membership changes and publish it as std::shared_ptr<const HashRing>.
//
// Allocation: owners(), owner() and share() allocate nothing; add() and shares() do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster/messages.h"

namespace sluice::cluster {

struct RingMember {
  NodeId id = 0;
  std::string name;
};

class HashRing {
 public:
  static constexpr size_t kDefaultReplicas = 2;  // the owner and one replica
  static constexpr size_t kMaxReplicas = 8;
  static constexpr size_t kShareSamples = 1u << 16;  // share(): ~0.15% standard error at 5 nodes

  // `replicas` is R, the owner included: 1..kMaxReplicas, else std::invalid_argument.
  explicit HashRing(size_t replicas = kDefaultReplicas);
  // A ring of `members`; a repeated id or name is a caller bug (std::invalid_argument).
  explicit HashRing(std::span<const RingMember> members, size_t replicas = kDefaultReplicas);

  // Adds a member. False, and nothing changes, if its id or its name is already in the ring.
  bool add(NodeId id, std::string_view name);
  // Removes a member. False if it is not in the ring.
  bool remove(NodeId id);
  void clear();

  size_t size() const { return ids_.size(); }
  bool empty() const { return ids_.empty(); }
  size_t replicas() const { return replicas_; }
  bool contains(NodeId id) const;
  std::span<const NodeId> members() const { return ids_; }  // ascending id
  std::string_view name_of(NodeId id) const;                // "" when not a member

  // Writes the owner of `key` then its replicas, distinct nodes by decreasing weight, into `out`
  // and returns how many: min(replicas(), size(), out.size()). 0 for an empty ring.
  size_t owners(uint64_t key, std::span<NodeId> out) const noexcept;
  // The owner alone; nullopt for an empty ring.
  std::optional<NodeId> owner(uint64_t key) const noexcept;

  // The fraction of keys `id` owns as primary, from `samples` keys of a fixed pseudo-random
  // sequence (the same answer on every node and every call); 0 for a non-member.
  double share(NodeId id, size_t samples = kShareSamples) const;
  // share() of every member in one pass, in members() order.
  std::vector<std::pair<NodeId, double>> shares(size_t samples = kShareSamples) const;

 private:
  size_t index_of(NodeId id) const;  // size() when absent

  size_t replicas_;
  // Sorted by id, side by side: the lookup scans ids_ and seeds_ only.
  std::vector<NodeId> ids_;
  std::vector<uint64_t> seeds_;
  std::vector<std::string> names_;
};

}  // namespace sluice::cluster
