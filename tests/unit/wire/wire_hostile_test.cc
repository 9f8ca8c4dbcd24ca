// Unit tests of lib/wire against hostile input: short, garbage, truncated, bit-flipped,
// oversized, hand-crafted pointer tricks (segment tables, far pointers, loops, amplification),
// field bounds, and decoder reuse after good and bad messages.
//
// Hand-crafted messages are written word by word (RawSegment, wire_test_util.h) with the layout
// `capnp compile -ocapnp schema/check.capnp` prints (CheckRequest: 2 data words, 2 pointers;
// Check: 1 data word, 2 pointers; Entry: 2 pointers). Randomness comes from seeded
// std::mt19937_64.
#include "wire/protocol.h"

#include <doctest/doctest.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "check.capnp.h"
#include "wire_test_util.h"

using namespace sluice::wire;
using namespace sluice::wire::testing;

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

// ==== decoder reuse ==============================================================================

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
