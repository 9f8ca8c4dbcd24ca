// Helpers shared by the unit tests of lib/wire (wire_test.cc, wire_hostile_test.cc,
// wire_framing_test.cc): requests built from owned data and checked against it, hand-crafted
// messages written word by word, answers built from owned decisions and checked field by field.
//
// Hand-crafted messages use the layout `capnp compile -ocapnp schema/check.capnp` prints
// (CheckRequest: 2 data words, 2 pointers; Check: 1 data word, 2 pointers; Entry: 2 pointers).
#pragma once

#include "wire/protocol.h"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "capnp_words.h"

namespace sluice::wire::testing {

using Bytes = std::vector<uint8_t>;

inline constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
inline constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
inline constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// ---- building requests from owned data ---------------------------------------------------------

struct OwnedCheck {
  std::string domain;
  std::vector<std::pair<std::string, std::string>> entries;
  int64_t hits = 1;
};

inline Bytes encode(uint64_t id, const std::vector<OwnedCheck>& owned, size_t pad_to = 0) {
  std::vector<std::vector<Entry>> entries(owned.size());
  std::vector<Check> checks(owned.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    for (const auto& [k, v] : owned[i].entries)
      entries[i].push_back({k, v});
    checks[i] = {owned[i].domain, entries[i], owned[i].hits};
  }
  Bytes out;
  encode_request(id, checks, pad_to, out);
  return out;
}

// Checks that the decoder holds exactly `want` (every check with code kOk).
inline void require_checks(const RequestDecoder& d, const std::vector<OwnedCheck>& want) {
  REQUIRE(d.checks().size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const Check& c = d.checks()[i];
    CAPTURE(i);
    CHECK(d.check_code(i) == Code::kOk);
    CHECK(c.domain == want[i].domain);
    CHECK(c.hits == want[i].hits);
    REQUIRE(c.entries.size() == want[i].entries.size());
    for (size_t j = 0; j < c.entries.size(); ++j) {
      CHECK(c.entries[j].key == want[i].entries[j].first);
      CHECK(c.entries[j].value == want[i].entries[j].second);
    }
  }
}

// Reads every byte the decoder exposes (so ASan sees a view that points anywhere it should not)
// and checks the bounds the decoder promises.
inline uint64_t touch_everything(const RequestDecoder& d) {
  uint64_t sum = d.id();
  auto add = [&](std::string_view s) {
    for (char ch : s)
      sum += static_cast<uint8_t>(ch);
  };
  CHECK(d.checks().size() <= kMaxChecks);
  for (size_t i = 0; i < d.checks().size(); ++i) {
    const Check& c = d.checks()[i];
    add(c.domain);
    CHECK(c.entries.size() <= kMaxEntries);
    if (d.check_code(i) == Code::kTooManyEntries) CHECK(c.entries.empty());
    if (d.check_code(i) == Code::kNegativeHits) CHECK(c.hits < 0);
    for (const Entry& e : c.entries) {
      add(e.key);
      add(e.value);
    }
  }
  return sum;
}

// The promise behind the UDP budget: for any request the decoder accepts, an answer with one
// decision per check fits in the request's size once limit details are dropped.
inline void check_answer_fits(const RequestDecoder& d, size_t request_bytes) {
  std::vector<DecisionView> decisions(d.checks().size());
  Bytes out;
  CHECK(encode_answer(d.id(), Code::kOk, decisions, request_bytes, out) <= request_bytes);
}

inline bool is_request_code(Code c) {
  return c == Code::kOk || c == Code::kMalformed || c == Code::kTooManyChecks ||
         c == Code::kUnsupportedVersion || c == Code::kTooLarge;
}

inline std::vector<OwnedCheck> sample_checks() {
  return {
      {"api", {{"client_id", "shop-17"}, {"user", "42"}}, 1},
      {"login", {{"ip", "203.0.113.9"}, {"grant_type", "authorization_code"}}, 3},
      {"", {}, 0},
  };
}

// ---- hand-crafted messages ----------------------------------------------------------------------

// Pointer words (capnp_words.h).
using ::sluice::testing::ElementSize;
using ::sluice::testing::far_ptr;
using ::sluice::testing::kByte;
using ::sluice::testing::kEightBytes;
using ::sluice::testing::kInlineComposite;
using ::sluice::testing::kVoid;
using ::sluice::testing::list_ptr;
using ::sluice::testing::struct_ptr;

// One segment, written word by word.
struct RawSegment {
  std::vector<uint64_t> w;

  size_t alloc(size_t n) {
    const size_t at = w.size();
    w.resize(at + n, 0);
    return at;
  }
  static int64_t offset(size_t from, size_t to) {
    return static_cast<int64_t>(to) - static_cast<int64_t>(from) - 1;
  }
  void point_struct(size_t at, size_t target, uint16_t data_words, uint16_t ptrs) {
    w[at] = struct_ptr(offset(at, target), data_words, ptrs);
  }
  void point_list(size_t at, size_t target, ElementSize size, uint32_t count) {
    w[at] = list_ptr(offset(at, target), size, count);
  }
  // Writes s with its NUL; returns where it starts.
  size_t text(std::string_view s) {
    const size_t at = alloc((s.size() + 1 + 7) / 8);
    std::memcpy(w.data() + at, s.data(), s.size());
    return at;
  }
  void point_text(size_t at, size_t target, size_t len) {
    point_list(at, target, kByte, static_cast<uint32_t>(len + 1));
  }
};

// The standard framing: segment count - 1, segment sizes, padding to a word, then the segments.
inline Bytes raw_message(const std::vector<RawSegment>& segments) {
  std::vector<uint32_t> table;
  table.push_back(static_cast<uint32_t>(segments.size() - 1));
  for (const auto& s : segments)
    table.push_back(static_cast<uint32_t>(s.w.size()));
  if (table.size() % 2) table.push_back(0);
  Bytes out(table.size() * 4);
  std::memcpy(out.data(), table.data(), out.size());  // the test hosts are little-endian
  for (const auto& s : segments) {
    const size_t at = out.size();
    out.resize(at + s.w.size() * 8);
    std::memcpy(out.data() + at, s.w.data(), s.w.size() * 8);
  }
  return out;
}

inline Bytes words_to_bytes(std::initializer_list<uint64_t> words) {
  Bytes out(words.size() * 8);
  std::memcpy(out.data(), std::data(words), out.size());
  return out;
}

// A CheckRequest root (version 1, `id`) whose checks list holds `n` Check structs; returns the
// position of the first Check. Pointers of the checks are left null for the caller to fill.
inline size_t raw_request(RawSegment& s, uint64_t id, uint32_t n) {
  const size_t root = s.alloc(1);
  const size_t req = s.alloc(4);
  s.point_struct(root, req, 2, 2);
  s.w[req] = 0;  // version 1, stored XOR its default 1
  s.w[req + 1] = id;
  const size_t tag = s.alloc(1 + 3 * size_t{n});
  s.point_list(req + 2, tag, kInlineComposite, 3 * n);
  s.w[tag] = struct_ptr(n, 1, 2);  // a tag's offset field is the element count
  for (uint32_t i = 0; i < n; ++i)
    s.w[tag + 1 + 3 * i] = 1 ^ 1;  // hits 1
  return tag + 1;
}

// ---- answers --------------------------------------------------------------------------------

struct OwnedDecision {
  DecisionView view;
  std::vector<LimitView> limits;
};

inline std::vector<DecisionView> views(std::vector<OwnedDecision>& owned) {
  std::vector<DecisionView> out;
  for (auto& d : owned) {
    d.view.limits = d.limits;
    out.push_back(d.view);
  }
  return out;
}

inline LimitView limit_view(std::string_view name, uint64_t limit, int64_t retry, Mode mode,
                            bool exceeded) {
  LimitView l;
  l.name = name;
  l.limit = limit;
  l.window_ms = 60'000;
  l.remaining = exceeded ? 0 : limit - 1;
  l.reset_ms = 12'345;
  l.retry_after_ms = retry;
  l.mode = mode;
  l.exceeded = exceeded;
  return l;
}

inline void check_decision(const Decision& got, const DecisionView& want, bool with_limits,
                           bool with_names) {
  CHECK(got.code == want.code);
  CHECK(got.allowed == want.allowed);
  CHECK(got.would_deny == want.would_deny);
  CHECK(got.shadow == want.shadow);
  CHECK(got.allowlisted == want.allowlisted);
  if (!with_limits) {
    CHECK(got.limits.empty());
    return;
  }
  REQUIRE(got.limits.size() == want.limits.size());
  for (size_t j = 0; j < want.limits.size(); ++j) {
    const LimitStatus& g = got.limits[j];
    const LimitView& w = want.limits[j];
    CHECK(g.name == (with_names ? w.name : std::string_view{}));
    CHECK(g.limit == w.limit);
    CHECK(g.window_ms == w.window_ms);
    CHECK(g.remaining == w.remaining);
    CHECK(g.reset_ms == w.reset_ms);
    CHECK(g.retry_after_ms == w.retry_after_ms);
    CHECK(g.mode == w.mode);
    CHECK(g.exceeded == w.exceeded);
  }
}

}  // namespace sluice::wire::testing
