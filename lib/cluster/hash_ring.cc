// Rendezvous hashing (hash_ring.h).
#include "cluster/hash_ring.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <stdexcept>

namespace sluice::cluster {

namespace {

// The splitmix64 finalizer: a bijection of 64-bit values with full avalanche.
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t member_seed(NodeId id, std::string_view name) {
  return XXH3_64bits_withSeed(name.data(), name.size(), id);
}

// A member's weight for a (pre-mixed) key: 48 bits of hash above the member's id, so one integer
// comparison orders members, ties in the hash go to the larger id (placement never depends on the
// order members were added), and the winner's id is read back from the weight.
inline uint64_t weight(uint64_t k, uint64_t seed, NodeId id) {
  return (mix(k ^ seed) & ~uint64_t{0xffff}) | id;
}
inline NodeId id_of(uint64_t weight) {
  return static_cast<NodeId>(weight & 0xffff);
}

// The keys share() samples: a fixed sequence, so every node computes the same figure.
inline uint64_t sample_key(size_t i) {
  return mix(0x5eed0f5a1cebeefULL + i);
}

}  // namespace

HashRing::HashRing(size_t replicas) : replicas_(replicas) {
  if (replicas < 1 || replicas > kMaxReplicas)
    throw std::invalid_argument("hash ring: replicas must be between 1 and " +
                                std::to_string(kMaxReplicas) + ", got " + std::to_string(replicas));
}

HashRing::HashRing(std::span<const RingMember> members, size_t replicas) : HashRing(replicas) {
  for (const RingMember& m : members) {
    if (!add(m.id, m.name))
      throw std::invalid_argument("hash ring: member " + std::to_string(m.id) + " (" + m.name +
                                  ") repeats an id or a name");
  }
}

size_t HashRing::index_of(NodeId id) const {
  auto it = std::lower_bound(ids_.begin(), ids_.end(), id);
  if (it == ids_.end() || *it != id) return ids_.size();
  return static_cast<size_t>(it - ids_.begin());
}

bool HashRing::contains(NodeId id) const {
  return index_of(id) != ids_.size();
}

std::string_view HashRing::name_of(NodeId id) const {
  const size_t i = index_of(id);
  return i == ids_.size() ? std::string_view{} : std::string_view{names_[i]};
}

bool HashRing::add(NodeId id, std::string_view name) {
  if (contains(id) || std::find(names_.begin(), names_.end(), name) != names_.end()) return false;
  const auto at = std::lower_bound(ids_.begin(), ids_.end(), id) - ids_.begin();
  ids_.insert(ids_.begin() + at, id);
  seeds_.insert(seeds_.begin() + at, member_seed(id, name));
  names_.insert(names_.begin() + at, std::string(name));
  return true;
}

bool HashRing::remove(NodeId id) {
  const size_t i = index_of(id);
  if (i == ids_.size()) return false;
  const auto at = static_cast<std::ptrdiff_t>(i);
  ids_.erase(ids_.begin() + at);
  seeds_.erase(seeds_.begin() + at);
  names_.erase(names_.begin() + at);
  return true;
}

void HashRing::clear() {
  ids_.clear();
  seeds_.clear();
  names_.clear();
}

std::optional<NodeId> HashRing::owner(uint64_t key) const noexcept {
  const size_t n = ids_.size();
  if (n == 0) return std::nullopt;
  const uint64_t k = mix(key);
  uint64_t best = weight(k, seeds_[0], ids_[0]);
  for (size_t i = 1; i < n; ++i)
    best = std::max(best, weight(k, seeds_[i], ids_[i]));
  return id_of(best);
}

namespace {

// The R heaviest of `n` members, heaviest first, into `out`. Branch-free: every member passes
// through R max/min steps (compiled to conditional moves), since whether a member enters the top
// R is a coin toss the branch predictor would lose at small N.
template <size_t R>
void top_r(uint64_t k, const uint64_t* seeds, const NodeId* ids, size_t n, NodeId* out) {
  uint64_t top[R] = {};  // 0 is below every weight but one of probability 2^-48 (see weight())
  for (size_t i = 0; i < n; ++i) {
    uint64_t x = weight(k, seeds[i], ids[i]);
    for (size_t j = 0; j < R; ++j) {
      // Swap top[j] and x when x is heavier, with a mask: g++ turns std::max/std::min here into
      // branches, which measured twice as slow.
      const uint64_t swap = (top[j] ^ x) & (uint64_t{0} - static_cast<uint64_t>(top[j] < x));
      top[j] ^= swap;
      x ^= swap;
    }
  }
  for (size_t j = 0; j < R; ++j)
    out[j] = id_of(top[j]);
}

}  // namespace

static_assert(HashRing::kMaxReplicas == 8, "owners() dispatches R = 1..8");

size_t HashRing::owners(uint64_t key, std::span<NodeId> out) const noexcept {
  const size_t want = std::min({replicas_, ids_.size(), out.size()});
  const uint64_t k = mix(key);
  const uint64_t* seeds = seeds_.data();
  const NodeId* ids = ids_.data();
  const size_t n = ids_.size();
  NodeId* o = out.data();
  switch (want) {
    case 0:
      return 0;
    case 1:
      o[0] = *owner(key);
      return 1;
    case 2:
      top_r<2>(k, seeds, ids, n, o);
      return 2;
    case 3:
      top_r<3>(k, seeds, ids, n, o);
      return 3;
    case 4:
      top_r<4>(k, seeds, ids, n, o);
      return 4;
    case 5:
      top_r<5>(k, seeds, ids, n, o);
      return 5;
    case 6:
      top_r<6>(k, seeds, ids, n, o);
      return 6;
    case 7:
      top_r<7>(k, seeds, ids, n, o);
      return 7;
    default:
      top_r<kMaxReplicas>(k, seeds, ids, n, o);
      return kMaxReplicas;
  }
}

double HashRing::share(NodeId id, size_t samples) const {
  if (samples == 0 || !contains(id)) return 0.0;
  size_t owned = 0;
  for (size_t i = 0; i < samples; ++i)
    owned += *owner(sample_key(i)) == id ? size_t{1} : size_t{0};
  return static_cast<double>(owned) / static_cast<double>(samples);
}

std::vector<std::pair<NodeId, double>> HashRing::shares(size_t samples) const {
  std::vector<size_t> owned(ids_.size(), 0);
  for (size_t i = 0; i < samples && !ids_.empty(); ++i)
    ++owned[index_of(*owner(sample_key(i)))];
  std::vector<std::pair<NodeId, double>> out;
  out.reserve(ids_.size());
  for (size_t i = 0; i < ids_.size(); ++i) {
    out.emplace_back(
        ids_[i], samples == 0 ? 0.0 : static_cast<double>(owned[i]) / static_cast<double>(samples));
  }
  return out;
}

}  // namespace sluice::cluster
