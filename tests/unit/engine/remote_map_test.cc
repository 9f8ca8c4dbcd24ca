// FlatKeyMap (lib/engine/remote_map.h), the shard's map of what other nodes reported per counter:
// every operation against std::unordered_map on random traces, with erases that shift runs across
// the end of the slot array.
#include "engine/remote_map.h"

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <unordered_map>
#include <vector>

using sluice::engine::FlatKeyMap;

namespace {

void check_same(FlatKeyMap<std::vector<int>>& m, const std::unordered_map<uint64_t, int>& ref,
                const std::vector<uint64_t>& universe) {
  REQUIRE(m.size() == ref.size());
  for (uint64_t k : universe) {
    const auto it = ref.find(k);
    const std::vector<int>* v = m.find(k);
    if (it == ref.end()) {
      REQUIRE(v == nullptr);
    } else {
      REQUIRE(v != nullptr);
      REQUIRE(v->size() == 1);
      REQUIRE((*v)[0] == it->second);
    }
  }
}

}  // namespace

TEST_CASE("FlatKeyMap: an empty map finds nothing and erases nothing") {
  FlatKeyMap<std::vector<int>> m;
  CHECK(m.size() == 0);
  CHECK(m.find(0) == nullptr);
  CHECK(m.find(42) == nullptr);
  CHECK_FALSE(m.erase(42));
  m.prefetch(42);  // no storage yet: a no-op
}

TEST_CASE("FlatKeyMap: key 0 is a key like any other, operator[] default-constructs once") {
  FlatKeyMap<std::vector<int>> m;
  m[0].push_back(7);
  m[0].push_back(8);
  REQUIRE(m.find(0) != nullptr);
  CHECK(*m.find(0) == std::vector<int>{7, 8});
  CHECK(m.size() == 1);
  CHECK(m.erase(0));
  CHECK(m.find(0) == nullptr);
  CHECK(m[0].empty());  // a fresh value, not the erased one
}

TEST_CASE("FlatKeyMap matches std::unordered_map over random inserts, updates and erases") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::mt19937_64 rng(seed);
    // Few distinct keys for many operations: the table stays small, so runs wrap around its end
    // and erases shift entries back across it.
    const size_t distinct = seed % 2 == 0 ? 40 : 400;
    std::vector<uint64_t> universe(distinct);
    for (auto& k : universe)
      k = rng();
    FlatKeyMap<std::vector<int>> m;
    std::unordered_map<uint64_t, int> ref;
    for (int op = 0; op < 20'000; ++op) {
      const uint64_t k = universe[rng() % distinct];
      const int v = static_cast<int>(rng() % 1000);
      switch (rng() % 3) {
        case 0:
        case 1: {
          auto& slot = m[k];
          slot.assign(1, v);
          ref[k] = v;
          break;
        }
        default:
          REQUIRE(m.erase(k) == (ref.erase(k) == 1));
          break;
      }
      if (op % 997 == 0) check_same(m, ref, universe);
    }
    check_same(m, ref, universe);
    // Emptied completely, then refilled: nothing of the old entries is found.
    for (uint64_t k : universe)
      m.erase(k);
    ref.clear();
    check_same(m, ref, universe);
    m[universe[0]].assign(1, 5);
    ref[universe[0]] = 5;
    check_same(m, ref, universe);
  }
}

TEST_CASE("FlatKeyMap keeps every entry across growth to a million keys") {
  FlatKeyMap<std::vector<int>> m;
  std::mt19937_64 rng(99);
  std::vector<uint64_t> keys(1'000'000);
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = rng();
    m[keys[i]].assign(1, static_cast<int>(i));
  }
  REQUIRE(m.size() == keys.size());
  size_t found = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto* v = m.find(keys[i]);
    if (v != nullptr && (*v)[0] == static_cast<int>(i)) ++found;
  }
  CHECK(found == keys.size());
  for (size_t i = 0; i < keys.size(); i += 2)
    REQUIRE(m.erase(keys[i]));
  CHECK(m.size() == keys.size() / 2);
  size_t odd = 0, even = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (m.find(keys[i]) != nullptr) ++(i % 2 ? odd : even);
  }
  CHECK(odd == keys.size() / 2);
  CHECK(even == 0);
}
