// libFuzzer target for everything in lib/wire that parses hostile bytes: RequestDecoder (the
// node's side), decode_answer (the client's side) and FrameReader (TCP streams).
//
// Beyond "no crash, no sanitizer report" it checks the properties the daemon relies on:
//  - decode() returns a request-level code only, and its views are readable and within bounds;
//  - an accepted request re-encodes and decodes to the same checks;
//  - an answer to an accepted request, limited to the request's size, fits (no UDP amplification);
//  - an accepted answer re-encodes and decodes to the same answer.
//
// Seeds: with SLUICE_FUZZ_WRITE_SEEDS=DIR set, the binary writes valid encodings into DIR and
// exits (tests/fuzz/run.sh does this before fuzzing).
#include "fuzz_util.h"
#include "wire/protocol.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace sluice::wire;
using Bytes = std::vector<uint8_t>;

bool is_request_code(Code c) {
  return c == Code::kOk || c == Code::kMalformed || c == Code::kTooManyChecks ||
         c == Code::kUnsupportedVersion || c == Code::kTooLarge;
}

// Reads every exposed byte, so ASan reports a view that points anywhere it should not.
uint64_t touch(std::string_view s) {
  uint64_t sum = 0;
  for (char c : s)
    sum += static_cast<uint8_t>(c);
  return sum;
}

bool same_checks(const RequestDecoder& a, const RequestDecoder& b) {
  if (a.id() != b.id() || a.checks().size() != b.checks().size()) return false;
  for (size_t i = 0; i < a.checks().size(); ++i) {
    const Check& x = a.checks()[i];
    const Check& y = b.checks()[i];
    // A check with too many entries is re-encoded without them, so it comes back judged by its
    // hits alone.
    Code want = a.check_code(i);
    if (want == Code::kTooManyEntries) want = x.hits < 0 ? Code::kNegativeHits : Code::kOk;
    if (b.check_code(i) != want || x.domain != y.domain || x.hits != y.hits ||
        x.entries.size() != y.entries.size() || x.has_limit_override != y.has_limit_override ||
        x.limit_override_requests != y.limit_override_requests ||
        x.limit_override_window_ms != y.limit_override_window_ms) {
      return false;
    }
    for (size_t j = 0; j < x.entries.size(); ++j) {
      if (x.entries[j].key != y.entries[j].key || x.entries[j].value != y.entries[j].value) {
        return false;
      }
    }
  }
  return true;
}

void fuzz_request(std::span<const uint8_t> bytes) {
  static RequestDecoder decoder;  // reused across inputs, as the daemon does
  static RequestDecoder again;
  static Bytes scratch;
  const Code c = decoder.decode(bytes);
  FUZZ_REQUIRE(is_request_code(c));
  if (c != Code::kOk) {
    FUZZ_REQUIRE(decoder.checks().empty());
    return;
  }
  const auto checks = decoder.checks();
  FUZZ_REQUIRE(checks.size() <= kMaxChecks);
  uint64_t sum = 0;
  std::vector<DecisionView> decisions(checks.size());
  std::vector<LimitView> limits(checks.size());
  for (size_t i = 0; i < checks.size(); ++i) {
    const Code cc = decoder.check_code(i);
    FUZZ_REQUIRE(cc == Code::kOk || cc == Code::kTooManyEntries || cc == Code::kNegativeHits ||
                 cc == Code::kMalformed);
    FUZZ_REQUIRE(checks[i].entries.size() <= kMaxEntries);
    if (cc == Code::kTooManyEntries) FUZZ_REQUIRE(checks[i].entries.empty());
    FUZZ_REQUIRE((cc == Code::kNegativeHits) ==
                 (checks[i].hits < 0 && cc != Code::kTooManyEntries));
    // A limit override the engine may see names one of the units and a bounded count; any other,
    // like an invalid cell limit, is the check's kMalformed (when nothing above refused it).
    const Check& k = checks[i];
    const bool unit =
        std::find(std::begin(kLimitOverrideWindowsMs), std::end(kLimitOverrideWindowsMs),
                  k.limit_override_window_ms) != std::end(kLimitOverrideWindowsMs);
    const bool bad_override =
        k.has_limit_override && (!unit || k.limit_override_requests > kMaxLimitOverride);
    // A cell limit the engine may see has T >= 1, L >= 1, and T x L and T x quantity in int64.
    int64_t product = 0;
    const bool bad_cell =
        k.has_cell_limit && (k.cell_interval_ns < 1 || k.cell_limit < 1 ||
                             __builtin_mul_overflow(k.cell_interval_ns, k.cell_limit, &product) ||
                             __builtin_mul_overflow(k.cell_interval_ns, k.cell_quantity, &product));
    FUZZ_REQUIRE(
        (cc == Code::kMalformed) ==
        ((bad_override || bad_cell) && cc != Code::kTooManyEntries && cc != Code::kNegativeHits));
    sum += touch(checks[i].domain);
    for (const Entry& e : checks[i].entries)
      sum += touch(e.key) + touch(e.value);
    limits[i].name = checks[i].domain;  // names as long as the domains: forces trimming
    limits[i].retry_after_ms = -1;
    decisions[i] = {cc, cc == Code::kOk, false, false, false, std::span(&limits[i], 1)};
  }
  FUZZ_REQUIRE(sum != 0xffff'ffff'ffff'ffff);  // keeps the reads

  // The UDP budget holds for every request the decoder accepts.
  const size_t answer_size =
      encode_answer(decoder.id(), Code::kOk, decisions, bytes.size(), scratch);
  FUZZ_REQUIRE(answer_size == scratch.size());
  FUZZ_REQUIRE(answer_size <= bytes.size());
  Answer answer;
  FUZZ_REQUIRE(decode_answer(scratch, answer) == Code::kOk);
  FUZZ_REQUIRE(answer.id == decoder.id() && answer.decisions.size() == checks.size());

  // Accepted requests re-encode to the same checks. Shared objects may make the re-encoding
  // larger (up to the 4x traversal allowance), which is only a problem past the frame limit.
  encode_request(decoder.id(), checks, 0, scratch);
  if (scratch.size() > kMaxFrameBytes) return;
  FUZZ_REQUIRE(again.decode(scratch) == Code::kOk);
  FUZZ_REQUIRE(same_checks(decoder, again));
}

void fuzz_answer(std::span<const uint8_t> bytes) {
  static Answer answer;
  static Answer again;
  static Bytes scratch;
  const Code c = decode_answer(bytes, answer);
  FUZZ_REQUIRE(c == Code::kOk || c == Code::kMalformed || c == Code::kTooLarge);
  if (c != Code::kOk) {
    FUZZ_REQUIRE(answer.decisions.empty());
    return;
  }
  FUZZ_REQUIRE(answer.decisions.size() <= kMaxChecks);
  // Re-encode what was read and compare.
  std::vector<std::vector<LimitView>> limits(answer.decisions.size());
  std::vector<DecisionView> decisions(answer.decisions.size());
  for (size_t i = 0; i < answer.decisions.size(); ++i) {
    const Decision& d = answer.decisions[i];
    for (const LimitStatus& l : d.limits) {
      limits[i].push_back({l.name, l.limit, l.window_ms, l.remaining, l.reset_ms, l.retry_after_ms,
                           l.mode, l.exceeded});
    }
    decisions[i] = {d.code, d.allowed, d.would_deny, d.shadow, d.allowlisted, limits[i]};
  }
  encode_answer(answer.id, answer.code, decisions, 0, scratch);
  FUZZ_REQUIRE(decode_answer(scratch, again) == Code::kOk);
  FUZZ_REQUIRE(again.id == answer.id && again.code == answer.code);
  FUZZ_REQUIRE(again.decisions.size() == answer.decisions.size());
  for (size_t i = 0; i < answer.decisions.size(); ++i) {
    const Decision& x = answer.decisions[i];
    const Decision& y = again.decisions[i];
    FUZZ_REQUIRE(x.code == y.code && x.allowed == y.allowed && x.would_deny == y.would_deny &&
                 x.shadow == y.shadow && x.allowlisted == y.allowlisted);
    FUZZ_REQUIRE(x.limits.size() == y.limits.size());
    for (size_t j = 0; j < x.limits.size(); ++j) {
      const LimitStatus& p = x.limits[j];
      const LimitStatus& q = y.limits[j];
      FUZZ_REQUIRE(p.name == q.name && p.limit == q.limit && p.window_ms == q.window_ms &&
                   p.remaining == q.remaining && p.reset_ms == q.reset_ms &&
                   p.retry_after_ms == q.retry_after_ms && p.mode == q.mode &&
                   p.exceeded == q.exceeded);
    }
  }
}

// The input as a TCP stream, fed in pieces whose sizes come from the input itself; every frame
// that comes out goes to the request decoder.
void fuzz_frames(std::span<const uint8_t> bytes) {
  FrameReader reader(4096);
  size_t at = 0;
  size_t frames = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(1 + bytes[at] % 64, bytes.size() - at);
    reader.feed(bytes.subspan(at, n));
    at += n;
    while (auto frame = reader.next()) {
      FUZZ_REQUIRE(!frame->empty() && frame->size() <= 4096);
      if (++frames <= 4) fuzz_request(*frame);
    }
    if (reader.failed()) {
      FUZZ_REQUIRE(!reader.next());
      return;
    }
  }
}

// ---- seeds ------------------------------------------------------------------------------------

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_seeds(const std::string& dir) {
  int n = 0;
  auto put = [&](const Bytes& b) { write_file(dir + "/seed-" + std::to_string(n++), b); };

  const Entry user[] = {{"client_id", "shop-17"}, {"user", "42"}};
  const Entry ip[] = {{"ip", "203.0.113.9"}};
  std::vector<Entry> many_entries(kMaxEntries, Entry{"k", "v"});
  const Check small[] = {{"api", user, 1}};
  const Check mixed[] = {{"api", user, 1}, {"login", ip, 0}, {"bulk", {}, -3}, {"", {}, 1}};
  const Check wide[] = {{"api", many_entries, 5}};
  std::vector<Check> many_checks(200, Check{"api", ip, 1});

  Bytes b;
  for (size_t pad : {size_t{0}, size_t{512}}) {
    encode_request(1, small, pad, b);
    put(b);
    encode_request(2, mixed, pad, b);
    put(b);
  }
  encode_request(3, wide, 0, b);
  put(b);
  encode_request(4, many_checks, 0, b);
  put(b);
  encode_request(5, {}, 0, b);
  put(b);
  // Checks with their own limit (Envoy's per-descriptor override): a valid one, a bad window.
  Check own[] = {{"api", user, 1}, {"api", ip, 2}};
  own[0].has_limit_override = true;
  own[0].limit_override_requests = 5;
  own[0].limit_override_window_ms = 60'000;
  own[1].has_limit_override = true;
  own[1].limit_override_requests = 7;
  own[1].limit_override_window_ms = 1'234;
  encode_request(6, own, 0, b);
  put(b);

  // Answers: full, trimmed to a budget, and request-level errors.
  LimitView limits[] = {{"per-user", 100, 60'000, 0, 1'000, 500, Mode::kEnforce, true},
                        {"per-ip", 3000, 3'600'000, 2999, 5'000, -1, Mode::kDryRun, false},
                        {"ban", 1, 1'000, 0, 1'000, 0, Mode::kShadow, true}};
  const DecisionView decisions[] = {{Code::kOk, false, true, true, false, limits},
                                    {Code::kUnknownDomain, false, false, false, false, {}},
                                    {Code::kOk, true, false, false, true, {}}};
  encode_answer(6, Code::kOk, decisions, 0, b);
  put(b);
  encode_answer(6, Code::kOk, decisions, 100, b);
  put(b);
  encode_answer(7, Code::kUnsupportedVersion, {}, 0, b);
  put(b);

  // A TCP stream of two requests.
  Bytes stream;
  encode_request(8, small, 0, b);
  append_frame(b, stream);
  encode_request(9, mixed, 0, b);
  append_frame(b, stream);
  put(stream);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("SLUICE_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  fuzz_request(bytes);
  fuzz_answer(bytes);
  fuzz_frames(bytes);
  return 0;
}
