// Unit tests of lib/wire: request and answer round trips, UDP padding and the answer budget,
// hostile input (short, garbage, truncated, bit-flipped, oversized, hand-crafted pointer tricks,
// field bounds), TCP framing, decoder reuse and the no-allocation promise once warm.
//
// Hand-crafted messages are written word by word with the layout `capnp compile -ocapnp
// schema/check.capnp` prints (CheckRequest: 2 data words, 2 pointers; Check: 1 data word, 2
// pointers; Entry: 2 pointers). Randomness comes from seeded std::mt19937_64.
#include "wire/protocol.h"

#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "check.capnp.h"

#include "alloc_counter.h"  // this binary counts its heap allocations

namespace {

using namespace sluice::wire;
using Bytes = std::vector<uint8_t>;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();

// ---- building requests from owned data ---------------------------------------------------------

struct OwnedCheck {
  std::string domain;
  std::vector<std::pair<std::string, std::string>> entries;
  int64_t hits = 1;
};

Bytes encode(uint64_t id, const std::vector<OwnedCheck>& owned, size_t pad_to = 0) {
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
void require_checks(const RequestDecoder& d, const std::vector<OwnedCheck>& want) {
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
uint64_t touch_everything(const RequestDecoder& d) {
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
void check_answer_fits(const RequestDecoder& d, size_t request_bytes) {
  std::vector<DecisionView> decisions(d.checks().size());
  Bytes out;
  CHECK(encode_answer(d.id(), Code::kOk, decisions, request_bytes, out) <= request_bytes);
}

bool is_request_code(Code c) {
  return c == Code::kOk || c == Code::kMalformed || c == Code::kTooManyChecks ||
         c == Code::kUnsupportedVersion || c == Code::kTooLarge;
}

std::vector<OwnedCheck> sample_checks() {
  return {
      {"api", {{"client_id", "shop-17"}, {"user", "42"}}, 1},
      {"login", {{"ip", "203.0.113.9"}, {"grant_type", "authorization_code"}}, 3},
      {"", {}, 0},
  };
}

// ---- hand-crafted messages ----------------------------------------------------------------------

// Pointer words (capnp encoding spec): the offset counts words from the end of the pointer.
uint64_t struct_ptr(int64_t offset, uint16_t data_words, uint16_t ptr_count) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2)) |
         (uint64_t{data_words} << 32) | (uint64_t{ptr_count} << 48);
}
enum ElementSize : uint32_t { kVoid = 0, kByte = 2, kEightBytes = 5, kInlineComposite = 7 };
uint64_t list_ptr(int64_t offset, ElementSize size, uint32_t count) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2) | 1u) |
         (uint64_t{size | (count << 3)} << 32);
}
uint64_t far_ptr(uint32_t landing_word, bool double_far, uint32_t segment) {
  return uint64_t{(landing_word << 3) | (double_far ? 4u : 0u) | 2u} | (uint64_t{segment} << 32);
}

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
Bytes raw_message(const std::vector<RawSegment>& segments) {
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

Bytes words_to_bytes(std::initializer_list<uint64_t> words) {
  Bytes out(words.size() * 8);
  std::memcpy(out.data(), std::data(words), out.size());
  return out;
}

// A CheckRequest root (version 1, `id`) whose checks list holds `n` Check structs; returns the
// position of the first Check. Pointers of the checks are left null for the caller to fill.
size_t raw_request(RawSegment& s, uint64_t id, uint32_t n) {
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

std::vector<DecisionView> views(std::vector<OwnedDecision>& owned) {
  std::vector<DecisionView> out;
  for (auto& d : owned) {
    d.view.limits = d.limits;
    out.push_back(d.view);
  }
  return out;
}

LimitView limit_view(std::string_view name, uint64_t limit, int64_t retry, Mode mode,
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

void check_decision(const Decision& got, const DecisionView& want, bool with_limits,
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

}  // namespace

// ==== requests: round trips ======================================================================

TEST_CASE("a request round-trips: id, domains, entries, hits including 0 and large values") {
  const std::vector<OwnedCheck> checks = {
      {"api", {{"client_id", "shop-17"}, {"user", "42"}}, 1},
      {"login", {{"ip", "203.0.113.9"}}, 0},
      {"bulk", {{"plan", "starter"}}, kI64Max},
      {"big", {{"k", std::string(1000, 'x')}}, 1'000'000'000'000},
      {"", {{"", ""}}, 7},  // empties are the engine's call
      {"nul", {{std::string("a\0b", 3), std::string("\0", 1)}}, 2},  // lengths, not C strings
  };
  for (uint64_t id : {uint64_t{0}, uint64_t{1}, uint64_t{0xdead'beef'cafe}, kU64Max}) {
    RequestDecoder d;
    REQUIRE(d.decode(encode(id, checks)) == Code::kOk);
    CHECK(d.id() == id);
    require_checks(d, checks);
  }
}

TEST_CASE("a request with no checks, and one with kMaxChecks checks of 0..64 entries, round-trip") {
  RequestDecoder d;
  REQUIRE(d.decode(encode(5, {})) == Code::kOk);
  CHECK(d.id() == 5);
  CHECK(d.checks().empty());

  // Many entries in total: entries_ reallocates many times while decoding, so every check's span
  // must have been set after the last reallocation.
  std::vector<OwnedCheck> many(kMaxChecks);
  for (size_t i = 0; i < many.size(); ++i) {
    many[i].domain = "d" + std::to_string(i);
    many[i].hits = static_cast<int64_t>(i);
    // Mostly a few entries (the message must stay under kMaxFrameBytes), now and then up to 64.
    const size_t n = i % 16 == 0 ? i % (kMaxEntries + 1) : i % 4;
    for (size_t j = 0; j < n; ++j) {
      many[i].entries.emplace_back("k" + std::to_string(j), std::to_string(i * 1000 + j));
    }
  }
  REQUIRE(d.decode(encode(6, many)) == Code::kOk);
  require_checks(d, many);
}

TEST_CASE("hits default to 1 when the field is absent from the message") {
  ::capnp::MallocMessageBuilder b;
  auto req = b.initRoot<sluice::schema::CheckRequest>();
  req.setId(9);
  req.initChecks(1)[0].setDomain("api");  // hits never set
  auto flat = ::capnp::messageToFlatArray(b);
  auto bytes = flat.asBytes();
  RequestDecoder d;
  REQUIRE(d.decode({bytes.begin(), bytes.size()}) == Code::kOk);
  CHECK(d.checks()[0].hits == 1);
}

TEST_CASE("a multi-segment request (far pointers) decodes like a single-segment one") {
  // FIXED_SIZE with tiny segments puts nearly every object in its own segment.
  ::capnp::MallocMessageBuilder b(4, ::capnp::AllocationStrategy::FIXED_SIZE);
  auto req = b.initRoot<sluice::schema::CheckRequest>();
  req.setId(77);
  auto checks = req.initChecks(2);
  checks[0].setDomain("api");
  checks[0].setHits(4);
  auto entries = checks[0].initEntries(2);
  entries[0].setKey("user");
  entries[0].setValue("42");
  entries[1].setKey("ip");
  entries[1].setValue("203.0.113.9");
  checks[1].setDomain("login");
  REQUIRE(b.getSegmentsForOutput().size() > 3);
  auto flat = ::capnp::messageToFlatArray(b);
  auto bytes = flat.asBytes();
  RequestDecoder d;
  REQUIRE(d.decode({bytes.begin(), bytes.size()}) == Code::kOk);
  CHECK(d.id() == 77);
  require_checks(d, {{"api", {{"user", "42"}, {"ip", "203.0.113.9"}}, 4}, {"login", {}, 1}});
}

TEST_CASE(
    "messages from older and newer writers decode: missing fields default, extra are skipped") {
  SUBCASE("older: a CheckRequest with one data word and one pointer (no id, no padding)") {
    RawSegment s;
    const size_t root = s.alloc(1);
    const size_t req = s.alloc(2);
    s.point_struct(root, req, 1, 1);
    s.w[req] = 0;  // version 1
    const size_t tag = s.alloc(4);
    s.point_list(req + 1, tag, kInlineComposite, 3);
    s.w[tag] = struct_ptr(1, 1, 2);
    s.w[tag + 1] = 5 ^ 1;  // hits 5
    // (A domain long enough that the request pays for its answer: an answer is never larger.)
    const size_t dom = s.text("api.example.internal");
    s.point_text(tag + 2, dom, 20);
    RequestDecoder d;
    REQUIRE(d.decode(raw_message({s})) == Code::kOk);
    CHECK(d.id() == 0);
    require_checks(d, {{"api.example.internal", {}, 5}});
  }
  SUBCASE("newer: structs with more data words and pointers than this schema knows") {
    RawSegment s;
    const size_t root = s.alloc(1);
    const size_t req = s.alloc(3 + 3);
    s.point_struct(root, req, 3, 3);
    s.w[req + 1] = 31;      // id
    s.w[req + 2] = 0xffff;  // an unknown field
    const size_t tag = s.alloc(1 + 7);
    s.point_list(req + 3, tag, kInlineComposite, 7);
    s.w[tag] = struct_ptr(1, 2, 5);
    s.w[tag + 1] = 2 ^ 1;   // hits 2
    s.w[tag + 2] = 0x1234;  // unknown
    const size_t dom = s.text("login");
    s.point_text(tag + 3, dom, 5);
    // Pointers 2 (limitOverride) and 3 (release) left null; pointer 4 is beyond this schema.
    const size_t extra = s.text("unknown pointer field");
    s.point_text(tag + 7, extra, 21);
    RequestDecoder d;
    REQUIRE(d.decode(raw_message({s})) == Code::kOk);
    CHECK(d.id() == 31);
    require_checks(d, {{"login", {}, 2}});
  }
}

// ==== requests: padding ==========================================================================

TEST_CASE("padding makes the request at least pad_to bytes, and does not change what decodes") {
  const auto checks = sample_checks();
  const size_t bare = encode(1, checks).size();
  REQUIRE(bare % 8 == 0);
  CHECK(encode(1, checks, 1).size() == bare);     // already larger: no padding
  CHECK(encode(1, checks, bare).size() == bare);  // exactly: no padding
  for (size_t pad_to : {bare + 1, bare + 7, bare + 8, bare + 9, size_t{1000}, size_t{8192},
                        size_t{20'000}, kMaxDatagramBytes}) {
    CAPTURE(pad_to);
    const Bytes b = encode(1, checks, pad_to);
    CHECK(b.size() == (pad_to + 7) / 8 * 8);  // the smallest whole-word size >= pad_to
    RequestDecoder d;
    REQUIRE(d.decode(b) == Code::kOk);
    require_checks(d, checks);
  }
}

TEST_CASE("encoders write one-segment messages whatever their size (no far pointers)") {
  auto segments = [](const Bytes& b) {
    uint32_t count_minus_one;
    std::memcpy(&count_minus_one, b.data(), 4);
    return count_minus_one + 1;
  };
  std::vector<OwnedCheck> checks(kMaxChecks);
  for (size_t i = 0; i < checks.size(); ++i) {
    checks[i] = {"domain-" + std::to_string(i), {{"user", std::to_string(i)}, {"ip", "::1"}}, 1};
  }
  CHECK(segments(encode(1, checks)) == 1);
  CHECK(segments(encode(1, checks, 500'000)) == 1);
  CHECK(segments(encode(1, {}, kMaxDatagramBytes)) == 1);

  std::vector<OwnedDecision> owned(kMaxChecks);
  for (auto& o : owned) {
    o.limits = {limit_view("a-fairly-long-limit-name", 1, 0, Mode::kEnforce, false),
                limit_view("another", 2, 0, Mode::kEnforce, false)};
  }
  Bytes out;
  CHECK(encode_answer(1, Code::kOk, views(owned), 0, out) > kMaxDatagramBytes);
  CHECK(segments(out) == 1);
}

TEST_CASE("message sizes are those docs/protocol.md gives for sizing the padding") {
  Bytes out;
  CHECK(encode_answer(1, Code::kMalformed, {}, 0, out) == 48);
  std::vector<OwnedDecision> owned(1);
  CHECK(encode_answer(1, Code::kOk, views(owned), 0, out) == 48 + 8 + 24);
  owned[0].limits = {limit_view("per-user", 100, 0, Mode::kEnforce, false),
                     limit_view("per-ip", 3000, 0, Mode::kEnforce, false)};
  CHECK(encode_answer(1, Code::kOk, views(owned), 0, out) == 224);
  CHECK(encode(1, {}).size() == 56);
  CHECK(encode(1, {{"", {}, 1}}).size() == 56 + 8 + 40);
  CHECK(encode(1, {{"api", {{"", ""}}, 1}}).size() == 56 + 8 + 40 + 8 + 8 + 16);
}

// ==== answers ====================================================================================

TEST_CASE("an answer round-trips every field: codes, flags, limits, -1 retry-after, every mode") {
  std::vector<OwnedDecision> owned(4);
  owned[0].view = {Code::kOk, true, false, false, false, {}};
  owned[0].limits = {limit_view("per-user", 100, 0, Mode::kEnforce, false),
                     limit_view("per-ip", 3000, 0, Mode::kEnforce, false)};
  owned[1].view = {Code::kOk, false, false, false, false, {}};
  owned[1].limits = {limit_view("burst", 10, 1500, Mode::kEnforce, true),
                     limit_view("cost-above-limit", 5, -1, Mode::kEnforce, true)};
  owned[2].view = {Code::kOk, true, true, false, false, {}};
  owned[2].limits = {limit_view("trial", 1, 999, Mode::kDryRun, true)};
  owned[3].view = {Code::kOk, false, false, true, false, {}};
  owned[3].limits = {limit_view("ban", 1, kI64Max, Mode::kShadow, true)};
  std::vector<OwnedDecision> more(2);
  more[0].view = {Code::kUnknownDomain, false, false, false, false, {}};
  more[1].view = {Code::kOk, true, false, false, true, {}};  // allowlisted: no limits
  for (auto& m : more)
    owned.push_back(std::move(m));
  const auto decisions = views(owned);

  Bytes out;
  const size_t n = encode_answer(kU64Max, Code::kOk, decisions, 0, out);
  CHECK(n == out.size());
  Answer a;
  REQUIRE(decode_answer(out, a) == Code::kOk);
  CHECK(a.id == kU64Max);
  CHECK(a.code == Code::kOk);
  CHECK_FALSE(a.truncated);
  REQUIRE(a.decisions.size() == decisions.size());
  for (size_t i = 0; i < decisions.size(); ++i)
    check_decision(a.decisions[i], decisions[i], true, true);
}

TEST_CASE("every Code and Mode survives the wire (the enum mappings are complete)") {
  for (uint8_t c = 0; c <= static_cast<uint8_t>(Code::kTooLarge); ++c) {
    const auto code = static_cast<Code>(c);
    std::vector<OwnedDecision> owned(1);
    owned[0].view.code = code;
    for (Mode m : {Mode::kEnforce, Mode::kDryRun, Mode::kShadow}) {
      owned[0].limits.push_back(limit_view("l", 1, 0, m, false));
    }
    Bytes out;
    encode_answer(c, code, views(owned), 0, out);
    Answer a;
    REQUIRE(decode_answer(out, a) == Code::kOk);
    CHECK(a.code == code);
    CHECK(a.decisions.at(0).code == code);
    CHECK(a.decisions[0].limits.at(0).mode == Mode::kEnforce);
    CHECK(a.decisions[0].limits.at(1).mode == Mode::kDryRun);
    CHECK(a.decisions[0].limits.at(2).mode == Mode::kShadow);
  }
}

TEST_CASE("a request-level error answer carries the id and no decisions") {
  Bytes out;
  encode_answer(12, Code::kTooManyChecks, {}, 0, out);
  Answer a;
  a.decisions.resize(3);  // left over from an earlier answer: must be cleared
  a.truncated = true;
  REQUIRE(decode_answer(out, a) == Code::kOk);
  CHECK(a.id == 12);
  CHECK(a.code == Code::kTooManyChecks);
  CHECK_FALSE(a.truncated);
  CHECK(a.decisions.empty());
}

TEST_CASE("UDP budget: long limit names for a small request are dropped, then all limit details") {
  const Bytes request = encode(3, {{"api", {{"user", "42"}}, 1}});
  const std::string long_name(300, 'n');
  std::vector<OwnedDecision> owned(1);
  owned[0].view = {Code::kOk, false, true, true, false, {}};
  owned[0].limits = {limit_view(long_name, 10, 500, Mode::kDryRun, true),
                     limit_view(long_name, 20, -1, Mode::kShadow, true),
                     limit_view(long_name, 30, 0, Mode::kEnforce, false)};
  const auto decisions = views(owned);

  Bytes full;
  const size_t full_size = encode_answer(3, Code::kOk, decisions, 0, full);
  REQUIRE(full_size > request.size());

  SUBCASE("budget too small for any limit: decisions intact, truncated") {
    Bytes out;
    const size_t n = encode_answer(3, Code::kOk, decisions, request.size(), out);
    CHECK(n == out.size());
    CHECK(n <= request.size());
    Answer a;
    REQUIRE(decode_answer(out, a) == Code::kOk);
    CHECK(a.id == 3);
    CHECK(a.truncated);
    REQUIRE(a.decisions.size() == 1);
    check_decision(a.decisions[0], decisions[0], false, false);
  }
  SUBCASE("budget that fits the limits without their names: limits kept, names empty") {
    const Bytes padded = encode(3, {{"api", {{"user", "42"}}, 1}}, 400);
    Bytes out;
    const size_t n = encode_answer(3, Code::kOk, decisions, padded.size(), out);
    CHECK(n <= padded.size());
    Answer a;
    REQUIRE(decode_answer(out, a) == Code::kOk);
    CHECK_FALSE(a.truncated);
    REQUIRE(a.decisions.size() == 1);
    check_decision(a.decisions[0], decisions[0], true, false);
  }
  SUBCASE("a request padded to the full answer's size gets every detail") {
    const Bytes padded = encode(3, {{"api", {{"user", "42"}}, 1}}, full_size);
    Bytes out;
    CHECK(encode_answer(3, Code::kOk, decisions, padded.size(), out) == full_size);
    CHECK(out == full);
  }
}

TEST_CASE(
    "UDP budget: an answer to many checks stays within the request's size, decisions intact") {
  std::vector<OwnedCheck> checks(200, {"api", {{"user", "1"}}, 1});
  const Bytes request = encode(8, checks);
  const std::string name(64, 'q');
  std::vector<OwnedDecision> owned(checks.size());
  for (size_t i = 0; i < owned.size(); ++i) {
    owned[i].view = {i % 3 == 0 ? Code::kEmptyEntryKey : Code::kOk,
                     i % 2 == 0,
                     i % 5 == 0,
                     false,
                     i % 7 == 0,
                     {}};
    // Two limits each: without their names one limit per decision would now fit (a check grew
    // by the limit-override pointer), and this case is about dropping the details entirely.
    owned[i].limits = {limit_view(name, 100, -1, Mode::kEnforce, i % 2 == 1),
                       limit_view(name, 7, -1, Mode::kEnforce, false)};
  }
  const auto decisions = views(owned);
  Bytes out;
  CHECK(encode_answer(8, Code::kOk, decisions, request.size(), out) <= request.size());
  Answer a;
  REQUIRE(decode_answer(out, a) == Code::kOk);
  CHECK(a.truncated);
  REQUIRE(a.decisions.size() == decisions.size());
  for (size_t i = 0; i < decisions.size(); ++i)
    check_decision(a.decisions[i], decisions[i], false, false);
}

TEST_CASE("a budget below even the bare decisions still yields the smallest complete answer") {
  std::vector<OwnedDecision> owned(4);
  owned[0].limits = {limit_view("x", 1, 0, Mode::kEnforce, false)};
  Bytes out;
  const size_t n = encode_answer(1, Code::kOk, views(owned), 8, out);
  CHECK(n > 8);  // the decisions are never dropped
  Answer a;
  REQUIRE(decode_answer(out, a) == Code::kOk);
  CHECK(a.truncated);
  CHECK(a.decisions.size() == 4);
}

// ==== hostile input: sizes =======================================================================

TEST_CASE("empty, 1-byte, 7-byte, 9-byte and other non-word-sized inputs are malformed") {
  RequestDecoder d;
  Answer a;
  const Bytes valid = encode(1, sample_checks());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{9}, size_t{15}, valid.size() - 1}) {
    CAPTURE(n);
    const Bytes b(valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK(d.decode(b) == Code::kMalformed);
    CHECK(d.checks().empty());
    CHECK(decode_answer(b, a) == Code::kMalformed);
  }
  // Eight zero bytes: one empty segment, without even a root pointer.
  CHECK(d.decode(Bytes(8, 0)) == Code::kMalformed);
  CHECK(decode_answer(Bytes(8, 0), a) == Code::kMalformed);
}

TEST_CASE("input over kMaxFrameBytes is kTooLarge before any parsing") {
  const Bytes huge(kMaxFrameBytes + 8, 0);
  RequestDecoder d;
  CHECK(d.decode(huge) == Code::kTooLarge);
  CHECK(d.id() == 0);
  Answer a;
  CHECK(decode_answer(huge, a) == Code::kTooLarge);
  // Exactly kMaxFrameBytes is parsed (and, being zeros, is one empty segment plus garbage).
  CHECK(d.decode(Bytes(kMaxFrameBytes, 0)) == Code::kMalformed);
}

TEST_CASE("a 64 KiB entry value decodes: length limits are the engine's job, not the wire's") {
  const std::vector<OwnedCheck> checks = {{"api", {{"blob", std::string(64 * 1024, 'v')}}, 1}};
  RequestDecoder d;
  REQUIRE(d.decode(encode(2, checks)) == Code::kOk);
  require_checks(d, checks);
}

TEST_CASE("bytes after a complete message make it malformed (one message per datagram or frame)") {
  Bytes b = encode(4, sample_checks());
  b.resize(b.size() + 8, 0);
  RequestDecoder d;
  CHECK(d.decode(b) == Code::kMalformed);
  Bytes out;
  encode_answer(4, Code::kOk, {}, 0, out);
  out.resize(out.size() + 8, 0);
  Answer a;
  CHECK(decode_answer(out, a) == Code::kMalformed);
}

// ==== hostile input: garbage, truncation, bit flips ==============================================

TEST_CASE("random garbage never crashes: 4000 seeds, raw and behind a plausible segment table") {
  RequestDecoder d;
  Answer a;
  uint64_t sink = 0;
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    std::mt19937_64 rng(seed);
    size_t n = rng() % 512;
    if (seed % 4 != 0) n -= n % 8;  // mostly word-sized, to get past the size check
    Bytes b(n);
    for (auto& x : b)
      x = static_cast<uint8_t>(rng());
    if (seed % 2 == 1 && n >= 16) {
      // One segment of exactly the remaining words, so the reader goes on to the pointers.
      const uint32_t table[2] = {0, static_cast<uint32_t>(n / 8 - 1)};
      std::memcpy(b.data(), table, 8);
    }
    CAPTURE(seed);
    const Code c = d.decode(b);
    CHECK(is_request_code(c));
    if (c == Code::kOk) {
      sink += touch_everything(d);
      check_answer_fits(d, b.size());
    }
    const Code ac = decode_answer(b, a);
    CHECK((ac == Code::kOk || ac == Code::kMalformed));
  }
  CHECK(sink < kU64Max);  // keeps the reads
}

TEST_CASE("every strict prefix of a valid message is malformed") {
  const Bytes valid = encode(11, sample_checks(), 200);
  RequestDecoder d;
  for (size_t n = 0; n < valid.size(); ++n) {
    CAPTURE(n);
    CHECK(d.decode(std::span(valid).first(n)) == Code::kMalformed);
  }
  CHECK(d.decode(valid) == Code::kOk);

  std::vector<OwnedDecision> owned(2);
  owned[0].limits = {limit_view("per-user", 100, -1, Mode::kEnforce, true)};
  Bytes answer;
  encode_answer(11, Code::kOk, views(owned), 0, answer);
  Answer a;
  for (size_t n = 0; n < answer.size(); ++n) {
    CAPTURE(n);
    CHECK(decode_answer(std::span(answer).first(n), a) == Code::kMalformed);
  }
}

TEST_CASE("a valid message with any single bit flipped decodes to kOk or an error, never a crash") {
  const Bytes valid = encode(0x0123'4567'89ab'cdef, sample_checks());
  RequestDecoder d;
  uint64_t sink = 0;
  size_t ok = 0;
  for (size_t bit = 0; bit < valid.size() * 8; ++bit) {
    Bytes b = valid;
    b[bit / 8] = static_cast<uint8_t>(b[bit / 8] ^ (1u << (bit % 8)));
    CAPTURE(bit);
    const Code c = d.decode(b);
    CHECK(is_request_code(c));
    if (c == Code::kOk) {
      ++ok;
      sink += touch_everything(d);
      check_answer_fits(d, b.size());
    }
  }
  CHECK(ok > 0);  // most flips land in data (ids, hits, text bytes) and still decode
  CHECK(sink > 0);

  std::vector<OwnedDecision> owned(2);
  owned[0].limits = {limit_view("per-user", 100, -1, Mode::kShadow, true)};
  owned[1].view.code = Code::kNegativeHits;
  Bytes answer;
  encode_answer(5, Code::kOk, views(owned), 0, answer);
  Answer a;
  for (size_t bit = 0; bit < answer.size() * 8; ++bit) {
    Bytes b = answer;
    b[bit / 8] = static_cast<uint8_t>(b[bit / 8] ^ (1u << (bit % 8)));
    CAPTURE(bit);
    const Code c = decode_answer(b, a);
    CHECK((c == Code::kOk || c == Code::kMalformed));
    if (c == Code::kOk) CHECK(a.decisions.size() <= kMaxChecks);
  }
}

// ==== hostile input: crafted segment tables and pointers =========================================

TEST_CASE("a segment table that claims huge sizes or counts is malformed") {
  RequestDecoder d;
  // One segment of 2^32-1 words in a 3-word message.
  CHECK(d.decode(words_to_bytes({0xffff'ffff'0000'0000, 0, 0})) == Code::kMalformed);
  // 2^32 segments (the count wraps to 0 in 32 bits).
  CHECK(d.decode(words_to_bytes({0x0000'0001'ffff'ffff, 0, 0})) == Code::kMalformed);
  // 2^31 segments: the table alone would be 8 GiB.
  CHECK(d.decode(words_to_bytes({0x0000'0001'7fff'ffff, 0, 0})) == Code::kMalformed);
  // A second segment larger than what is left.
  CHECK(d.decode(words_to_bytes({0x0000'0001'0000'0001, 0x0000'0000'1000'0000, 0, 0})) ==
        Code::kMalformed);
  // Claims fewer words than it carries: trailing bytes.
  CHECK(d.decode(words_to_bytes({0x0000'0001'0000'0000, 0, 0})) == Code::kMalformed);
}

TEST_CASE("far pointers to missing segments, to themselves, or chained are malformed") {
  RequestDecoder d;
  // Root is a far pointer into segment 7 of a 1-segment message.
  CHECK(d.decode(raw_message({RawSegment{{far_ptr(0, false, 7)}}})) == Code::kMalformed);
  // Root is a far pointer whose landing pad is itself (a far pointer again).
  CHECK(d.decode(raw_message({RawSegment{{far_ptr(0, false, 0)}}})) == Code::kMalformed);
  // Landing pad past the end of its segment.
  CHECK(d.decode(raw_message({RawSegment{{far_ptr(1000, false, 0)}}})) == Code::kMalformed);
  // Double-far whose landing pad's first word is a far pointer to itself.
  CHECK(d.decode(raw_message({RawSegment{{far_ptr(0, true, 1)}},
                              RawSegment{{far_ptr(0, false, 1), struct_ptr(0, 2, 2)}}})) ==
        Code::kMalformed);
  // Two segments that point at each other's far pointers.
  CHECK(d.decode(raw_message({RawSegment{{far_ptr(0, false, 1)}},
                              RawSegment{{far_ptr(0, false, 0)}}})) == Code::kMalformed);
}

TEST_CASE("pointers that loop back on their own struct or point out of bounds are malformed") {
  RequestDecoder d;
  // The root struct is the root pointer itself (offset -1), and its checks pointer is that same
  // struct pointer: a struct where a list is expected.
  CHECK(d.decode(raw_message({RawSegment{{struct_ptr(-1, 0, 1)}}})) == Code::kMalformed);
  {
    // checks: a list of 2^29-1 eight-byte elements in a tiny message.
    RawSegment s;
    const size_t first = raw_request(s, 1, 1);
    s.w[first - 3] = list_ptr(0, kEightBytes, (1u << 29) - 1);  // req + 2 is first - 3
    CHECK(d.decode(raw_message({s})) == Code::kMalformed);
    CHECK(d.id() == 1);  // read before the bad pointer: an error answer can carry it
  }
  {
    // A Check's domain pointer aims far outside the segment.
    RawSegment s;
    const size_t first = raw_request(s, 2, 1);
    s.w[first + 1] = list_ptr(1 << 20, kByte, 4);
    CHECK(d.decode(raw_message({s})) == Code::kMalformed);
  }
  {
    // A Check's entries pointer aims back at the checks list: structs whose pointers are not
    // text where the Entry's key and value should be.
    RawSegment s;
    const size_t first = raw_request(s, 3, 2);
    s.point_list(first + 2, first - 1, kInlineComposite, 6);
    CHECK(d.decode(raw_message({s})) == Code::kMalformed);
  }
  {
    // A domain that is not NUL-terminated.
    RawSegment s;
    const size_t first = raw_request(s, 4, 1);
    const size_t dom = s.alloc(1);
    s.w[dom] = 0x6162'6364'6566'6768;  // "hgfedcba", no NUL
    s.point_list(first + 1, dom, kByte, 8);
    CHECK(d.decode(raw_message({s})) == Code::kMalformed);
  }
  {
    // A list of 2^29-1 zero-sized checks in a few words: capnp charges them to the traversal
    // limit, and kMaxChecks refuses them anyway.
    RawSegment s;
    const size_t first = raw_request(s, 5, 0);
    s.w[first - 1] = struct_ptr((1u << 29) - 1, 0, 0);  // the tag: 0-word elements
    const Code c = d.decode(raw_message({s}));
    CHECK((c == Code::kMalformed || c == Code::kTooManyChecks));
    CHECK(d.checks().empty());
  }
}

TEST_CASE(
    "amplification: checks packed tighter than their answers (zero-sized structs) are "
    "malformed") {
  // 16 Check structs of zero words each: a 56-byte datagram whose bare answer (16 decisions)
  // would be 304 bytes. Cap'n Proto accepts it (16 words of traversal); the decoder must not.
  RawSegment s;
  const size_t first = raw_request(s, 61, 0);
  s.w[first - 1] = struct_ptr(16, 0, 0);
  const Bytes b = raw_message({s});
  REQUIRE(b.size() == 56);
  RequestDecoder d;
  CHECK(d.decode(b) == Code::kMalformed);
  CHECK(d.id() == 61);
  // One data word per check (hits only) is still tighter than a decision.
  RawSegment t;
  const size_t at = raw_request(t, 62, 0);
  t.w[at - 1] = struct_ptr(4, 1, 0);
  t.point_list(at - 3, at - 1, kInlineComposite, 4);  // the checks pointer
  t.alloc(4);
  CHECK(d.decode(raw_message({t})) == Code::kMalformed);
  // The smallest honest shape, one data word and two pointers per check, passes.
  RawSegment u;
  raw_request(u, 63, 4);
  REQUIRE(d.decode(raw_message({u})) == Code::kOk);
  CHECK(d.checks().size() == 4);
  check_answer_fits(d, raw_message({u}).size());
}

TEST_CASE(
    "amplification: checks that all share one entries list are refused by the traversal "
    "limit") {
  // 1024 checks, each pointing at the same 64 entries, each entry at the same key and value: a
  // ~30 KiB datagram that would hand the engine 65,536 entries. Cap'n Proto's default limit (64 MiB
  // of traversal) would let it through; ours (4 x the message size) does not.
  const auto build = [](bool shared) {
    RawSegment s;
    const uint32_t n = kMaxChecks;
    const size_t first = raw_request(s, 99, n);
    const size_t dom = s.text("api");
    const size_t key = s.text("user");
    const size_t value = s.text("0123456789abcdef0123");
    const size_t tag = s.alloc(1 + 2 * kMaxEntries);
    s.w[tag] = struct_ptr(kMaxEntries, 0, 2);
    for (size_t j = 0; j < kMaxEntries; ++j) {
      s.point_text(tag + 1 + 2 * j, key, 4);
      s.point_text(tag + 2 + 2 * j, value, 20);
    }
    for (uint32_t i = 0; i < (shared ? n : 1); ++i) {
      const size_t check = first + 3 * i;
      s.point_text(check + 1, dom, 3);
      s.point_list(check + 2, tag, kInlineComposite, 2 * kMaxEntries);
    }
    return raw_message({s});
  };
  RequestDecoder d;
  const Bytes honest = build(false);  // the same words, only the first check uses the list
  REQUIRE(d.decode(honest) == Code::kOk);
  CHECK(d.checks().size() == kMaxChecks);
  CHECK(d.checks()[0].entries.size() == kMaxEntries);
  CHECK(d.checks()[0].entries[63].value == "0123456789abcdef0123");

  const Bytes hostile = build(true);
  CHECK(hostile.size() == honest.size());
  CHECK(d.decode(hostile) == Code::kMalformed);
  CHECK(d.id() == 99);
  CHECK(d.checks().empty());
}

// ==== hostile input: field bounds ================================================================

TEST_CASE("more than kMaxChecks checks is kTooManyChecks, exactly kMaxChecks is fine") {
  RequestDecoder d;
  std::vector<OwnedCheck> checks(10'000, {"api", {}, 1});
  CHECK(d.decode(encode(21, checks)) == Code::kTooManyChecks);
  CHECK(d.id() == 21);
  CHECK(d.checks().empty());
  checks.resize(kMaxChecks + 1);
  CHECK(d.decode(encode(22, checks)) == Code::kTooManyChecks);
  checks.resize(kMaxChecks);
  CHECK(d.decode(encode(23, checks)) == Code::kOk);
  CHECK(d.checks().size() == kMaxChecks);
}

TEST_CASE(
    "a check with more than kMaxEntries entries gets kTooManyEntries, its neighbours decode") {
  std::vector<std::pair<std::string, std::string>> hundred;
  for (int i = 0; i < 100; ++i)
    hundred.emplace_back("k" + std::to_string(i), "v");
  auto sixty_four = hundred;
  sixty_four.resize(kMaxEntries);
  auto sixty_five = hundred;
  sixty_five.resize(kMaxEntries + 1);
  RequestDecoder d;
  REQUIRE(d.decode(encode(31, {{"a", {{"user", "1"}}, 1},
                               {"b", hundred, 1},
                               {"c", sixty_four, 1},
                               {"d", sixty_five, 1}})) == Code::kOk);
  REQUIRE(d.checks().size() == 4);
  CHECK(d.check_code(0) == Code::kOk);
  CHECK(d.checks()[0].entries.size() == 1);
  CHECK(d.check_code(1) == Code::kTooManyEntries);
  CHECK(d.checks()[1].entries.empty());  // never shown to the engine
  CHECK(d.checks()[1].domain == "b");
  CHECK(d.check_code(2) == Code::kOk);
  CHECK(d.checks()[2].entries.size() == kMaxEntries);
  CHECK(d.checks()[2].entries[63].key == "k63");
  CHECK(d.check_code(3) == Code::kTooManyEntries);
}

TEST_CASE("negative hits give the check kNegativeHits, not a wrapped huge cost") {
  RequestDecoder d;
  REQUIRE(d.decode(encode(41, {{"a", {{"u", "1"}}, -1}, {"b", {}, kI64Min}, {"c", {}, 0}})) ==
          Code::kOk);
  CHECK(d.check_code(0) == Code::kNegativeHits);
  CHECK(d.checks()[0].hits == -1);
  CHECK(d.check_code(1) == Code::kNegativeHits);
  CHECK(d.checks()[1].hits == kI64Min);
  CHECK(d.check_code(2) == Code::kOk);
  CHECK(d.checks()[2].hits == 0);
}

TEST_CASE("a major version other than 1 is kUnsupportedVersion, and the id is still reported") {
  for (uint16_t version : {uint16_t{0}, uint16_t{2}, uint16_t{0xffff}}) {
    ::capnp::MallocMessageBuilder b;
    auto req = b.initRoot<sluice::schema::CheckRequest>();
    req.setVersion(version);
    req.setId(51);
    req.initChecks(1)[0].setDomain("api");
    auto flat = ::capnp::messageToFlatArray(b);
    auto bytes = flat.asBytes();
    RequestDecoder d;
    CAPTURE(version);
    CHECK(d.decode({bytes.begin(), bytes.size()}) == Code::kUnsupportedVersion);
    CHECK(d.id() == 51);
    CHECK(d.checks().empty());
  }
}

// ==== decoder reuse and allocation ===============================================================

TEST_CASE("decoding a second message leaves exactly the second message's views") {
  RequestDecoder d;
  const std::vector<OwnedCheck> first = {
      {std::string(500, 'A'), {{"k1", std::string(300, 'B')}, {"k2", "v2"}}, 9},
      {"second", {{"x", "y"}}, 1}};
  const std::vector<OwnedCheck> second = {{"z", {{"short", "s"}}, 2}};
  REQUIRE(d.decode(encode(1, first)) == Code::kOk);
  require_checks(d, first);
  REQUIRE(d.decode(encode(2, second)) == Code::kOk);
  CHECK(d.id() == 2);
  require_checks(d, second);
  // A failed decode leaves nothing behind.
  CHECK(d.decode(Bytes(7, 0)) == Code::kMalformed);
  CHECK(d.id() == 0);
  CHECK(d.checks().empty());
  // A larger message after a smaller one (the aligned buffer grows).
  const std::vector<OwnedCheck> third = {{"big", {{"v", std::string(40'000, 'C')}}, 3}};
  REQUIRE(d.decode(encode(3, third)) == Code::kOk);
  require_checks(d, third);
  REQUIRE(d.decode(encode(4, second)) == Code::kOk);
  require_checks(d, second);
}

TEST_CASE("the views do not point into the caller's bytes: they survive the input changing") {
  RequestDecoder d;
  Bytes b = encode(1, sample_checks());
  REQUIRE(d.decode(b) == Code::kOk);
  std::fill(b.begin(), b.end(), uint8_t{0xee});
  b.clear();
  b.shrink_to_fit();
  require_checks(d, sample_checks());
}

TEST_CASE("once warm, decoding requests and encoding and decoding answers allocate nothing") {
  std::vector<OwnedCheck> checks(300);
  for (size_t i = 0; i < checks.size(); ++i) {
    checks[i] = {"api", {{"client_id", "shop-" + std::to_string(i)}, {"user", "42"}}, 1};
  }
  const Bytes big = encode(1, checks);
  const Bytes small = encode(2, sample_checks());
  std::vector<OwnedDecision> owned(300);
  for (auto& o : owned)
    o.limits = {limit_view("per-client", 100, 0, Mode::kEnforce, false)};
  const auto decisions = views(owned);

  RequestDecoder d;
  Bytes out;
  Answer a;
  REQUIRE(d.decode(big) == Code::kOk);
  encode_answer(1, Code::kOk, decisions, 0, out);
  REQUIRE(decode_answer(out, a) == Code::kOk);

  uint64_t before = sluice::testing::allocations();
  for (int i = 0; i < 50; ++i)
    REQUIRE(d.decode(i % 2 ? small : big) == Code::kOk);
  CHECK(sluice::testing::allocations() - before == 0);
  before = sluice::testing::allocations();
  for (int i = 0; i < 50; ++i)
    encode_answer(1, Code::kOk, decisions, 0, out);
  CHECK(sluice::testing::allocations() - before == 0);
  before = sluice::testing::allocations();
  for (int i = 0; i < 50; ++i)
    REQUIRE(decode_answer(out, a) == Code::kOk);
  CHECK(sluice::testing::allocations() - before == 0);
}

// ==== names ======================================================================================

TEST_CASE("leased quotas between nodes: slices asked, returned and granted round-trip") {
  const Check checks[] = {{"api", {}, 1}, {"api", {}, 0}};
  const uint32_t wants[] = {5, 0};
  const uint32_t uses_a[] = {1, 0, 2};
  const SliceReturn returns[] = {{11, 22, 3, uses_a, 2}, {33, 44, 0, {}, 0}};
  const SliceAsk ask{7, wants, returns};
  Bytes req;
  encode_request(9, checks, 0, req, /*forwarded=*/true, false, &ask);
  RequestDecoder d;
  REQUIRE(d.decode(req) == Code::kOk);
  CHECK(d.slice_node() == 7);
  REQUIRE(d.slice_wants().size() == 2);
  CHECK(d.slice_wants()[0] == 5);
  CHECK(d.slice_wants()[1] == 0);
  REQUIRE(d.slice_returns().size() == 2);
  CHECK(d.slice_returns()[0].counter == 11);
  CHECK(d.slice_returns()[0].id == 22);
  CHECK(d.slice_returns()[0].used == 3);
  CHECK(std::vector<uint32_t>(d.slice_returns()[0].uses.begin(), d.slice_returns()[0].uses.end()) ==
        std::vector<uint32_t>{1, 0, 2});
  CHECK(d.slice_returns()[0].step_ms == 2);
  CHECK(d.slice_returns()[1].uses.empty());
  // Only a forwarded request carries them: a client's are ignored.
  encode_request(9, checks, 0, req, /*forwarded=*/false, false, &ask);
  REQUIRE(d.decode(req) == Code::kOk);
  CHECK(d.slice_node() == 0);
  CHECK(d.slice_wants().empty());
  CHECK(d.slice_returns().empty());
  // Wants that do not match the checks one for one are dropped; too many uses is malformed.
  const uint32_t one_want[] = {5};
  const SliceAsk short_ask{7, one_want, {}};
  encode_request(9, checks, 0, req, true, false, &short_ask);
  REQUIRE(d.decode(req) == Code::kOk);
  CHECK(d.slice_wants().empty());
  const std::vector<uint32_t> many(kMaxSliceUses + 1, 1);
  const SliceReturn too_many[] = {{1, 2, 3, many, 1}};
  const SliceAsk bad{7, {}, too_many};
  encode_request(9, {}, 0, req, true, false, &bad);
  CHECK(d.decode(req) == Code::kMalformed);
  // A request of returns alone, and the answer's grants.
  encode_request(9, {}, 0, req, true, false, &ask);
  CHECK(d.decode(req) == Code::kOk);
  const SliceGrant grants[] = {{1, 40, 100, 0xABCDEF}};
  std::vector<OwnedDecision> owned(2);
  Bytes out;
  encode_answer(9, Code::kOk, views(owned), 0, out, grants);
  Answer a;
  REQUIRE(decode_answer(out, a) == Code::kOk);
  REQUIRE(a.grants.size() == 1);
  CHECK(a.grants[0].check == 1);
  CHECK(a.grants[0].hits == 40);
  CHECK(a.grants[0].ttl_ms == 100);
  CHECK(a.grants[0].id == 0xABCDEF);
  encode_answer(9, Code::kOk, views(owned), 0, out);
  REQUIRE(decode_answer(out, a) == Code::kOk);
  CHECK(a.grants.empty());
}

TEST_CASE("codes and modes have stable snake_case names") {
  const std::pair<Code, std::string_view> names[] = {
      {Code::kOk, "ok"},
      {Code::kEmptyDomain, "empty_domain"},
      {Code::kUnknownDomain, "unknown_domain"},
      {Code::kTooManyEntries, "too_many_entries"},
      {Code::kEntryTooLong, "entry_too_long"},
      {Code::kEmptyEntryKey, "empty_entry_key"},
      {Code::kDuplicateEntry, "duplicate_entry"},
      {Code::kHitsTooLarge, "hits_too_large"},
      {Code::kNegativeHits, "negative_hits"},
      {Code::kNoRoom, "no_room"},
      {Code::kMalformed, "malformed"},
      {Code::kTooManyChecks, "too_many_checks"},
      {Code::kUnsupportedVersion, "unsupported_version"},
      {Code::kTooLarge, "too_large"},
  };
  for (const auto& [c, s] : names)
    CHECK(to_string(c) == s);
  CHECK(to_string(Mode::kEnforce) == "enforce");
  CHECK(to_string(Mode::kDryRun) == "dry-run");
  CHECK(to_string(Mode::kShadow) == "shadow");
}

// ==== TCP framing ================================================================================

TEST_CASE("append_frame writes a little-endian u32 length, then the message") {
  Bytes message(0x0102 + 3, 0x5a);
  Bytes out = {0xaa};  // appends, keeps what was there
  append_frame(message, out);
  REQUIRE(out.size() == 1 + 4 + message.size());
  CHECK(out[1] == 0x05);
  CHECK(out[2] == 0x01);
  CHECK(out[3] == 0x00);
  CHECK(out[4] == 0x00);
  CHECK(std::equal(message.begin(), message.end(), out.begin() + 5));
}

TEST_CASE("frames split at every byte boundary reassemble exactly") {
  const Bytes m1 = encode(1, sample_checks());
  const Bytes m2 = encode(2, {{"x", {}, 1}});
  const Bytes m3 = {1, 2, 3};  // framing does not care what the message is
  Bytes stream;
  append_frame(m1, stream);
  append_frame(m2, stream);
  append_frame(m3, stream);
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    CAPTURE(cut);
    FrameReader r;
    std::vector<Bytes> got;
    auto drain = [&] {
      while (auto f = r.next())
        got.emplace_back(f->begin(), f->end());
    };
    r.feed(std::span(stream).first(cut));
    drain();
    r.feed(std::span(stream).subspan(cut));
    drain();
    REQUIRE(got.size() == 3);
    CHECK(got[0] == m1);
    CHECK(got[1] == m2);
    CHECK(got[2] == m3);
    CHECK_FALSE(r.failed());
    CHECK(r.buffered() == 0);
  }
}

TEST_CASE("several frames in one feed come out one by one, a partial one waits for more bytes") {
  Bytes stream;
  for (uint8_t i = 1; i <= 5; ++i)
    append_frame(Bytes(i * 8u, i), stream);
  Bytes tail;
  append_frame(Bytes(16, 9), tail);
  stream.insert(stream.end(), tail.begin(), tail.begin() + 10);  // header + 6 of 16 bytes
  FrameReader r;
  r.feed(stream);
  for (uint8_t i = 1; i <= 5; ++i) {
    auto f = r.next();
    REQUIRE(f);
    CHECK(f->size() == i * 8u);
    CHECK((*f)[0] == i);
  }
  CHECK_FALSE(r.next());
  CHECK(r.buffered() == 10);
  r.feed(std::span(tail).subspan(10));
  auto f = r.next();
  REQUIRE(f);
  CHECK(Bytes(f->begin(), f->end()) == Bytes(16, 9));
  CHECK_FALSE(r.next());
}

TEST_CASE("a long stream fed in random-sized chunks yields every frame in order") {
  std::mt19937_64 rng(7);
  std::vector<Bytes> messages;
  Bytes stream;
  for (int i = 0; i < 2000; ++i) {
    Bytes m(1 + rng() % 300);
    for (auto& x : m)
      x = static_cast<uint8_t>(rng());
    append_frame(m, stream);
    messages.push_back(std::move(m));
  }
  FrameReader r;
  size_t at = 0;
  size_t next_message = 0;
  while (at < stream.size()) {
    const size_t n = std::min<size_t>(1 + rng() % 700, stream.size() - at);
    r.feed(std::span(stream).subspan(at, n));
    at += n;
    while (auto f = r.next()) {
      REQUIRE(next_message < messages.size());
      CHECK(Bytes(f->begin(), f->end()) == messages[next_message++]);
    }
    CHECK(r.buffered() < 700 + 304);  // consumed bytes are not kept around
  }
  CHECK(next_message == messages.size());
}

TEST_CASE("a frame length over the maximum fails the reader for good") {
  FrameReader r(64);
  Bytes ok;
  append_frame(Bytes(64, 1), ok);
  r.feed(ok);
  REQUIRE(r.next());
  Bytes bad;
  append_frame(Bytes(65, 2), bad);
  r.feed(bad);
  CHECK_FALSE(r.next());
  CHECK(r.failed());
  r.feed(ok);  // valid frames afterwards cannot resynchronise the stream
  CHECK_FALSE(r.next());
  CHECK(r.failed());

  FrameReader big;  // the default: kMaxFrameBytes, judged from the header alone
  const uint32_t n = kMaxFrameBytes + 1;
  const uint8_t header[4] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
                             static_cast<uint8_t>(n >> 16), static_cast<uint8_t>(n >> 24)};
  big.feed(header);
  CHECK_FALSE(big.next());
  CHECK(big.failed());
  const uint8_t all_ones[4] = {0xff, 0xff, 0xff, 0xff};
  FrameReader huge;
  huge.feed(all_ones);
  CHECK_FALSE(huge.next());
  CHECK(huge.failed());
}

TEST_CASE("a zero-length frame fails the reader (no message is empty)") {
  FrameReader r;
  Bytes stream = {0, 0, 0, 0};
  append_frame(Bytes(8, 1), stream);
  r.feed(stream);
  CHECK_FALSE(r.next());
  CHECK(r.failed());
  CHECK_FALSE(r.next());
}

TEST_CASE("frames carry requests end to end: append, reassemble, decode") {
  Bytes stream;
  for (uint64_t id = 1; id <= 3; ++id)
    append_frame(encode(id, sample_checks()), stream);
  FrameReader r;
  r.feed(stream);
  RequestDecoder d;
  for (uint64_t id = 1; id <= 3; ++id) {
    auto f = r.next();
    REQUIRE(f);
    REQUIRE(d.decode(*f) == Code::kOk);  // frame bytes are not word-aligned: decode copies
    CHECK(d.id() == id);
    require_checks(d, sample_checks());
  }
}
