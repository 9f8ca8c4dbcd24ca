// Unit tests of lib/wire: request and answer round trips, UDP padding and the answer budget,
// message sizes, enum mappings and names, leased-quota slices and the no-allocation promise once
// warm. Hostile input is in wire_hostile_test.cc, TCP framing in wire_framing_test.cc, the helpers
// the three share in wire_test_util.h.
#include "wire/protocol.h"

#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "check.capnp.h"
#include "wire_test_util.h"

#include "alloc_counter.h"  // this binary counts its heap allocations

using namespace sluice::wire;
using namespace sluice::wire::testing;

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
    const size_t tag = s.alloc(1 + 8);
    s.point_list(req + 3, tag, kInlineComposite, 8);
    s.w[tag] = struct_ptr(1, 2, 6);
    s.w[tag + 1] = 2 ^ 1;   // hits 2
    s.w[tag + 2] = 0x1234;  // unknown
    const size_t dom = s.text("login");
    s.point_text(tag + 3, dom, 5);
    // Pointers 2 (limitOverride), 3 (release) and 4 (cellLimit) left null; pointer 5 is beyond
    // this schema.
    const size_t extra = s.text("unknown pointer field");
    s.point_text(tag + 8, extra, 21);
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
  CHECK(encode(1, {{"", {}, 1}}).size() == 56 + 8 + 48);
  CHECK(encode(1, {{"api", {{"", ""}}, 1}}).size() == 56 + 8 + 48 + 8 + 8 + 16);
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

// ==== allocation =================================================================================

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
