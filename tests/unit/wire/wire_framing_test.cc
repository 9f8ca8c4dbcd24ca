// Unit tests of lib/wire's TCP framing: append_frame, FrameReader reassembling frames split at
// any byte or fed in random-sized chunks, frame lengths over the maximum and zero, and requests
// carried end to end. Randomness comes from seeded std::mt19937_64.
#include "wire/protocol.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "wire_test_util.h"

using namespace sluice::wire;
using namespace sluice::wire::testing;

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
