// redis-cell's CL.THROTTLE (window/cell.h) from the arithmetic to the engine and the wire:
// - redis-cell's own unit table (`it_rate_limits`, src/cell/mod.rs: 15 cases, exact ns) and the
//   README's example, on the formula and through Engine::check with a cell check;
// - its parameters (T from period / count as it divides), its refusals and Sluice's, the reply's
//   seconds;
// - peek, refund, over-refund (refused, nothing written), parameters changed between calls with
//   the arrival time carried over, a limited call writing nothing, reset, a store record;
// - random traces against a reference written here from redis-cell's algorithm (i64 ns, its
//   store with Redis's millisecond expiry), on the formula and through the engine;
// - a cell check and a limit's exact reset across the check protocol.
//
// Deterministic: times are literals, randomness comes from seeded std::mt19937_64.
#include "window/cell.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "record_collector.h"
#include "rules/rules.h"
#include "wire/protocol.h"

namespace {

using namespace sluice;
using window::CellError;
using window::CellOutcome;
using window::CellParams;
using window::CellReply;

constexpr int64_t kNsPerMs = 1'000'000;
constexpr int64_t kNsPerS = 1'000'000'000;
constexpr int64_t kT0Ms = 28'333'333LL * 60'000;  // an epoch-aligned minute, in ms
constexpr int64_t kT0 = kT0Ms * kNsPerMs;         // the same in ns

CellParams params(int64_t max_burst, int64_t count, int64_t period_s) {
  CellParams p;
  REQUIRE(window::make_cell(max_burst, count, period_s, p) == CellError::kNone);
  return p;
}

// One key's state under the formula alone, as a store would keep it.
struct FormulaKey {
  int64_t tat = 0;
  CellOutcome call(const CellParams& p, int64_t now_ns, int64_t quantity) {
    const CellOutcome o = window::cell_decide(tat, p, now_ns, quantity);
    if (o.error == CellError::kNone && o.write) tat = o.new_tat;
    return o;
  }
};

// redis-cell's `it_rate_limits`: limit 5 (max_burst 4), one per second, times from `start`.
struct TableCase {
  int num;
  int64_t at_ms;  // after start
  int64_t volume;
  int64_t remaining;
  int64_t reset_after_ns;
  int64_t retry_after_ns;  // -1 s: none
  bool limited;
};
constexpr int64_t kNone = -kNsPerS;
constexpr TableCase kTable[] = {
    // You can never make a request larger than the maximum.
    {0, 0, 6, 5, 0, kNone, true},
    // Rate limit normal requests appropriately.
    {1, 0, 1, 4, 1 * kNsPerS, kNone, false},
    {2, 0, 1, 3, 2 * kNsPerS, kNone, false},
    {3, 0, 1, 2, 3 * kNsPerS, kNone, false},
    {4, 0, 1, 1, 4 * kNsPerS, kNone, false},
    {5, 0, 1, 0, 5 * kNsPerS, kNone, false},
    {6, 0, 1, 0, 5 * kNsPerS, 1 * kNsPerS, true},
    {7, 3'000, 1, 2, 3'000 * kNsPerMs, kNone, false},
    {8, 3'100, 1, 1, 3'900 * kNsPerMs, kNone, false},
    {9, 4'000, 1, 1, 4'000 * kNsPerMs, kNone, false},
    {10, 8'000, 1, 4, 1'000 * kNsPerMs, kNone, false},
    {11, 9'500, 1, 4, 1'000 * kNsPerMs, kNone, false},
    // Zero-volume request just peeks at the state.
    {12, 9'500, 0, 4, 1 * kNsPerS, kNone, false},
    // High-volume request uses up more of the limit.
    {13, 9'500, 2, 2, 3 * kNsPerS, kNone, false},
    // Large requests cannot exceed limits.
    {14, 9'500, 5, 2, 3 * kNsPerS, 3 * kNsPerS, true},
};

// A domain with no rules: cell checks need only the domain.
std::shared_ptr<const rules::Policy> cell_policy() {
  rules::Domain d;
  d.name = "redis";
  rules::RuleSet set;
  set.domains.push_back(std::move(d));
  return rules::Policy::compile(std::move(set), rules::Overrides{}, 7);
}

// Cell checks of one key through an engine.
struct CellClient {
  engine::Engine& engine;
  std::string key = "foo";
  engine::BatchResult out{};

  const engine::Decision& call(const CellParams& p, int64_t now_ns, int64_t quantity,
                               bool reset = false) {
    const rules::Descriptor desc{"key", key};
    rules::CellCheck cell;
    cell.interval_ns = p.interval_ns;
    cell.limit = p.limit;
    cell.quantity = quantity;
    cell.reset = reset;
    cell.now_ns = now_ns;
    rules::CheckRequest req{"redis", {&desc, 1}};
    req.cell = &cell;
    engine.check({&req, 1}, now_ns / kNsPerMs, out);
    return out.decisions.at(0);
  }
  const engine::LimitResult& limit() const { return out.limits_of(out.decisions.at(0)).front(); }
};

// The same numbers as the formula's reply, from what the engine answered.
CellReply engine_reply(const CellParams& p, int64_t quantity, const CellClient& c) {
  return window::cell_reply(p, quantity, !c.out.decisions.at(0).allowed,
                            engine::cell_ttl_ns(c.limit()));
}

// ---- the reference: redis-cell's rate_limit and its Redis store, transcribed ------------------
// Written from redis-cell (src/cell/mod.rs, src/cell/store.rs, src/lib.rs), sharing no code with
// cell.cc: i64 ns, its f64 steps, and a key that Redis expires by PEXPIRE of the ttl's whole
// milliseconds (toward zero) at the time of the write, now being whole milliseconds. One
// deliberate difference, Sluice's (cell.h): an over-refund writes nothing.
int64_t rust_as_i64(double x) {
  if (x != x) return 0;
  if (x >= 9.2233720368547758e18) return INT64_MAX;
  if (x <= -9.2233720368547758e18) return INT64_MIN;
  return static_cast<int64_t>(x);
}

struct RefResult {
  bool error = false;
  bool limited = false;
  int64_t remaining = 0;
  int64_t retry_after_ns = kNone;
  int64_t reset_after_ns = kNone;
  bool corner = false;  // a stored TAT before now that Redis still holds (cell.h)
};

struct RefStore {
  bool present = false;
  int64_t value = 0;
  int64_t expire_at_ms = 0;
  bool held(int64_t now_ms) const {
    return present && now_ms <= expire_at_ms;
  }  // Redis: now > when
};

RefResult ref_throttle(RefStore& store, int64_t now, int64_t max_burst, int64_t count,
                       int64_t period_s, int64_t quantity) {
  const int64_t interval = rust_as_i64(static_cast<double>(period_s * kNsPerS) /
                                       static_cast<double>(count));  // test periods stay small
  const int64_t dvt = interval * (max_burst + 1);
  const int64_t increment = interval * quantity;
  RefResult r;
  const bool held = store.held(now / kNsPerMs);
  const int64_t tat = held ? store.value : now;
  r.corner = held && store.value < now;
  const int64_t new_tat = now > tat ? now + increment : tat + increment;
  const int64_t allow_at = new_tat - dvt;
  const int64_t diff = now - allow_at;
  int64_t ttl = 0;
  if (diff < 0) {
    if (increment <= dvt) r.retry_after_ns = -diff;
    r.limited = true;
    ttl = tat - now;
  } else {
    ttl = new_tat - now;
    if (ttl / kNsPerMs < 0) {  // set_expire fails (Sluice: refused before writing)
      r.error = true;
      return r;
    }
    store = {true, new_tat, now / kNsPerMs + ttl / kNsPerMs};
  }
  const int64_t next = dvt - ttl;
  if (next > -interval) {
    r.remaining =
        rust_as_i64(static_cast<double>(next / 1000) / static_cast<double>(interval / 1000));
  }
  r.reset_after_ns = ttl;
  return r;
}

// lib.rs: seconds, + 1 when the sub-second milliseconds are > 0.
int64_t ref_seconds(int64_t ns) {
  const int64_t secs = ns / kNsPerS;
  const int64_t nanos = ns % kNsPerS;
  int64_t s = rust_as_i64(static_cast<double>(secs) + static_cast<double>(nanos) / 1e9);
  if (nanos / kNsPerMs > 0) ++s;
  return s;
}

// Random parameters within what tests keep exact (period small enough for i64 ns products).
struct RandomParams {
  int64_t max_burst, count, period_s;
};
RandomParams random_params(std::mt19937_64& rng) {
  static constexpr int64_t kCounts[] = {1, 3, 7, 10, 30, 60, 1'000, 3'000, 999'999, 2'000'000};
  static constexpr int64_t kPeriods[] = {1, 2, 7, 60};
  return {static_cast<int64_t>(rng() % 20), kCounts[rng() % std::size(kCounts)],
          kPeriods[rng() % std::size(kPeriods)]};
}

}  // namespace

TEST_CASE("redis-cell's unit table (it_rate_limits) holds for the formula, in exact ns") {
  const CellParams p = params(4, 1, 1);
  FormulaKey key;
  for (const TableCase& tc : kTable) {
    CAPTURE(tc.num);
    const CellOutcome o = key.call(p, kT0 + tc.at_ms * kNsPerMs, tc.volume);
    REQUIRE(o.error == CellError::kNone);
    const CellReply r = window::cell_reply(p, tc.volume, o.limited, o.ttl_ns);
    CHECK(o.limited == tc.limited);
    CHECK(r.limit == 5);
    CHECK(r.remaining == tc.remaining);
    CHECK(o.ttl_ns == tc.reset_after_ns);
    CHECK(o.retry_after_ns == tc.retry_after_ns);
    CHECK(r.retry_after_s == window::cell_seconds(tc.retry_after_ns));
    CHECK(r.reset_after_s == window::cell_seconds(tc.reset_after_ns));
  }
}

TEST_CASE("redis-cell's unit table holds through the engine with a cell check") {
  engine::Engine e(cell_policy());
  CellClient c{e};
  const CellParams p = params(4, 1, 1);
  for (const TableCase& tc : kTable) {
    CAPTURE(tc.num);
    const engine::Decision& d = c.call(p, kT0 + tc.at_ms * kNsPerMs, tc.volume);
    REQUIRE(d.error == rules::CheckError::kNone);
    REQUIRE(d.num_limits == 1);
    CHECK(d.allowed == !tc.limited);
    CHECK(c.limit().exceeded == tc.limited);
    CHECK(c.limit().requests == 5);
    CHECK(engine::cell_ttl_ns(c.limit()) == tc.reset_after_ns);
    const CellReply r = engine_reply(p, tc.volume, c);
    CHECK(r.remaining == tc.remaining);
    CHECK(r.retry_after_s == window::cell_seconds(tc.retry_after_ns));
    CHECK(r.reset_after_s == window::cell_seconds(tc.reset_after_ns));
  }
}

TEST_CASE("the README's CL.THROTTLE user123 15 30 60 answers 0 16 15 -1 2") {
  const CellParams p = params(15, 30, 60);
  CHECK(p.interval_ns == 2 * kNsPerS);
  CHECK(p.limit == 16);
  FormulaKey key;
  const CellOutcome o = key.call(p, kT0, 1);
  CHECK(window::cell_reply(p, 1, o.limited, o.ttl_ns) == CellReply{0, 16, 15, -1, 2});

  engine::Engine e(cell_policy());
  CellClient c{e, "user123"};
  REQUIRE(c.call(p, kT0, 1).allowed);
  CHECK(engine_reply(p, 1, c) == CellReply{0, 16, 15, -1, 2});
}

TEST_CASE("a cell's T is period / count as redis-cell divides it, and zero rates are refused") {
  CHECK(params(0, 24, 86'400).interval_ns == 3'600 * kNsPerS);  // per_day(24): an hour
  CHECK(params(0, 6, 120).interval_ns == 20 * kNsPerS);         // per_period(6, 2 min)
  CHECK(params(0, 5, 1).interval_ns == 200 * kNsPerMs);         // per_second(5)
  CHECK(params(0, 3, 1).interval_ns == 333'333'333);            // truncated
  CHECK(params(0, 7, 60).interval_ns == 8'571'428'571);
  CHECK(params(0, 1'000'000'000, 1).interval_ns == 1);
  CHECK(params(2, 1, 1).tolerance_ns == 3 * kNsPerS);
  CellParams p;
  CHECK(window::make_cell(1, 0, 60, p) == CellError::kZeroRate);
  CHECK(window::make_cell(1, 10, 0, p) == CellError::kZeroRate);
  CHECK(window::make_cell(1, 2'000'000'000, 1, p) == CellError::kZeroRate);  // T under 1 ns
  CHECK(window::make_cell(1, -10, 60, p) == CellError::kNegativeRate);
  CHECK(window::make_cell(1, 10, -60, p) == CellError::kNegativeRate);
  CHECK(window::make_cell(-1, 10, 60, p) == CellError::kNegativeBurst);
  CHECK(window::make_cell(INT64_MAX, 10, 60, p) == CellError::kOverflow);
  CHECK(window::make_cell(1'000'000'000, 1, 60, p) == CellError::kOverflow);  // 60 s x 10^9
  CHECK(window::make_cell(0, 1, INT64_MAX, p) == CellError::kNone);  // T saturates, tau = T
  CHECK(p.interval_ns == INT64_MAX);
  CHECK(window::cell_error_message(CellError::kZeroRate) == "Zero rates are not supported");
  CHECK(window::kCellErrorPrefix == "Cell error: Store error: ");
  // A quantity whose T x quantity overflows is refused, whatever the state.
  CHECK(window::cell_decide(0, params(0, 1, 1), kT0, INT64_MAX).error == CellError::kOverflow);
  // A TAT past int64 ns is refused rather than wrapped.
  CHECK(window::cell_decide(0, params(0, 1, INT64_MAX / kNsPerS), kT0, 1).error ==
        CellError::kOverflow);
}

TEST_CASE("a cell reply's seconds round up at millisecond granularity, as redis-cell's do") {
  CHECK(window::cell_seconds(0) == 0);
  CHECK(window::cell_seconds(-kNsPerS) == -1);  // "none"
  CHECK(window::cell_seconds(999'999) == 0);    // under a millisecond: not rounded up
  CHECK(window::cell_seconds(kNsPerMs) == 1);
  CHECK(window::cell_seconds(kNsPerS) == 1);
  CHECK(window::cell_seconds(kNsPerS + 999'999) == 1);
  CHECK(window::cell_seconds(kNsPerS + kNsPerMs) == 2);
  CHECK(window::cell_seconds(10 * kNsPerS) == 10);  // Dragonfly answers 11 here
  CHECK(window::cell_seconds(-500 * kNsPerMs) == 0);
}

TEST_CASE("a peek consumes nothing, a refund gives back, an over-refund is refused") {
  const CellParams p = params(4, 1, 1);  // limit 5, one a second
  FormulaKey key;
  // A peek of a fresh key: remaining = limit, reset 0.
  CellOutcome o = key.call(p, kT0, 0);
  CHECK(window::cell_reply(p, 0, o.limited, o.ttl_ns) == CellReply{0, 5, 5, -1, 0});
  o = key.call(p, kT0, 3);
  CHECK(window::cell_reply(p, 3, o.limited, o.ttl_ns) == CellReply{0, 5, 2, -1, 3});
  o = key.call(p, kT0, 0);
  CHECK(window::cell_reply(p, 3, o.limited, o.ttl_ns) == CellReply{0, 5, 2, -1, 3});
  o = key.call(p, kT0, -2);  // refund 2
  CHECK(window::cell_reply(p, -2, o.limited, o.ttl_ns) == CellReply{0, 5, 4, -1, 1});
  // Refunding 2 more than the 1 in use: refused, the state kept.
  const int64_t before = key.tat;
  o = key.call(p, kT0, -3);
  CHECK(o.error == CellError::kOverRefund);
  CHECK(key.tat == before);
  // Exactly what is in use: allowed, back to a full allowance.
  o = key.call(p, kT0, -1);
  CHECK(window::cell_reply(p, -1, o.limited, o.ttl_ns) == CellReply{0, 5, 5, -1, 0});

  engine::Engine e(cell_policy());
  CellClient c{e};
  REQUIRE(c.call(p, kT0, 0).allowed);
  CHECK(engine_reply(p, 0, c) == CellReply{0, 5, 5, -1, 0});
  REQUIRE(c.call(p, kT0, 3).allowed);
  REQUIRE(c.call(p, kT0, -2).allowed);
  CHECK(engine_reply(p, -2, c) == CellReply{0, 5, 4, -1, 1});
  const engine::Decision& d = c.call(p, kT0, -3);
  CHECK(d.error == rules::CheckError::kHitsTooLarge);
  CHECK(d.num_limits == 0);
  REQUIRE(c.call(p, kT0, 0).allowed);  // the refused refund wrote nothing
  CHECK(engine_reply(p, 0, c) == CellReply{0, 5, 4, -1, 1});
}

TEST_CASE("a limited cell call writes nothing, and a key's parameters may change on every call") {
  engine::Engine e(cell_policy());
  CellClient c{e};
  RefStore ref;
  struct Call {
    int64_t max_burst, count, period_s, quantity, at_ms;
  };
  // The same key under three limits, as a caller that reconfigures it on the fly.
  const Call calls[] = {{15, 30, 60, 10, 0},    {15, 30, 60, 6, 0},    {15, 30, 60, 1, 0},
                        {4, 10, 60, 1, 100},    {4, 10, 60, 0, 100},   {100, 1, 1, 50, 200},
                        {100, 1, 1, 60, 200},   {0, 1, 3'600, 1, 300}, {15, 30, 60, -5, 400},
                        {15, 30, 60, 1, 60'000}};
  for (const Call& k : calls) {
    CAPTURE(k.at_ms);
    const CellParams p = params(k.max_burst, k.count, k.period_s);
    const int64_t now = kT0 + k.at_ms * kNsPerMs;
    const RefResult want = ref_throttle(ref, now, k.max_burst, k.count, k.period_s, k.quantity);
    const engine::Decision& d = c.call(p, now, k.quantity);
    REQUIRE(d.error == (want.error ? rules::CheckError::kHitsTooLarge : rules::CheckError::kNone));
    if (want.error) continue;
    const CellReply r = engine_reply(p, k.quantity, c);
    CHECK(r.limited == (want.limited ? 1 : 0));
    CHECK(r.remaining == want.remaining);
    CHECK(r.retry_after_s == ref_seconds(want.retry_after_ns));
    CHECK(r.reset_after_s == ref_seconds(want.reset_after_ns));
    CHECK(engine::cell_ttl_ns(c.limit()) == want.reset_after_ns);
  }
  // A limited call leaves the arrival time where it was: the same peek before and after.
  const CellParams p = params(0, 1, 60);
  const int64_t now = kT0 + 120'000 * kNsPerMs;
  REQUIRE(c.call(p, now, 1).allowed);
  const int64_t ttl = engine::cell_ttl_ns(c.limit());
  REQUIRE_FALSE(c.call(p, now, 1).allowed);
  REQUIRE(c.call(params(10, 1, 60), now, 0).allowed);
  CHECK(engine::cell_ttl_ns(c.limit()) == ttl);
}

TEST_CASE("a cell reset drops the key's state and says whether it held any") {
  engine::Engine e(cell_policy());
  CellClient c{e};
  const CellParams p = params(1, 1, 10);
  CHECK_FALSE(c.call(p, kT0, 0, true).allowed);  // nothing there
  CHECK(c.out.decisions[0].num_limits == 0);
  REQUIRE(c.call(p, kT0, 2).allowed);
  REQUIRE_FALSE(c.call(p, kT0, 1).allowed);
  CHECK(c.call(p, kT0 + kNsPerS, 0, true).allowed);             // DEL answers 1
  CHECK(c.call(p, kT0 + kNsPerS, 2).allowed);                   // a full allowance again
  CHECK_FALSE(c.call(p, kT0 + 30 * kNsPerS, 0, true).allowed);  // its TAT had passed: gone
  // A peek of a fresh key writes now, as redis-cell does: a reset at that instant finds it.
  REQUIRE(c.call(p, kT0 + 40 * kNsPerS, 0).allowed);
  CHECK(c.call(p, kT0 + 40 * kNsPerS, 0, true).allowed);
  // Another key's state is not touched.
  REQUIRE(c.call(p, kT0 + 50 * kNsPerS, 2).allowed);
  CellClient other{e, "bar"};
  CHECK_FALSE(other.call(p, kT0 + 50 * kNsPerS, 0, true).allowed);
  CHECK_FALSE(c.call(p, kT0 + 50 * kNsPerS, 1).allowed);
}

TEST_CASE("cell checks count in the domain's cell slot, need a known domain, refuse bad values") {
  engine::Engine e(cell_policy());
  CellClient c{e};
  const CellParams p = params(1, 1, 10);
  REQUIRE(c.call(p, kT0, 2).allowed);
  REQUIRE_FALSE(c.call(p, kT0, 1).allowed);
  bool seen = false;
  for (const engine::RuleStats& rs : e.stats().rules) {
    if (rs.name != "redis/cell") continue;
    seen = true;
    CHECK(rs.allowed == 1);
    CHECK(rs.denied == 1);
  }
  CHECK(seen);
  const std::vector<engine::HotKey> hot = e.hot_keys(kT0Ms, 10);
  REQUIRE(hot.size() == 1);
  CHECK(hot[0].rule == "redis/cell");
  CHECK(hot[0].key == "key=foo");

  const rules::Descriptor desc{"key", "foo"};
  rules::CellCheck bad;
  bad.interval_ns = 0;
  bad.limit = 1;
  rules::CheckRequest req{"redis", {&desc, 1}};
  req.cell = &bad;
  engine::BatchResult out{};
  e.check({&req, 1}, kT0Ms, out);
  CHECK(out.decisions[0].error == rules::CheckError::kBadLimitOverride);
  bad.interval_ns = INT64_MAX / 2;
  bad.limit = 3;  // T x L overflows
  e.check({&req, 1}, kT0Ms, out);
  CHECK(out.decisions[0].error == rules::CheckError::kBadLimitOverride);
  bad.limit = 1;
  bad.quantity = 3;  // T x quantity overflows
  e.check({&req, 1}, kT0Ms, out);
  CHECK(out.decisions[0].error == rules::CheckError::kBadLimitOverride);
  req.domain = "nope";
  e.check({&req, 1}, kT0Ms, out);
  CHECK(out.decisions[0].error == rules::CheckError::kUnknownDomain);
}

TEST_CASE("a cell key's arrival time survives a store record") {
  engine::Engine e(cell_policy());
  CellClient c{e};
  const CellParams p = params(4, 1, 60);  // limit 5, one a minute
  REQUIRE(c.call(p, kT0, 4).allowed);
  testing::RecordCollector recs;
  recs.export_all(e);
  REQUIRE(recs.puts.size() == 1);
  REQUIRE(engine::Engine::record_spec(recs.puts[0].first).has_value());
  CHECK(*engine::Engine::record_spec(recs.puts[0].first) == rules::cell_window_spec());
  engine::Engine restored(cell_policy());
  for (const auto& [k, v] : recs.puts)
    REQUIRE(restored.import_record(k, v, kT0Ms + 1'000) == engine::ImportResult::kImported);
  CellClient r{restored};
  REQUIRE(r.call(p, kT0 + kNsPerS, 0).allowed);
  CHECK(engine_reply(p, 0, r) == CellReply{0, 5, 1, -1, 239});
  CHECK_FALSE(r.call(p, kT0 + kNsPerS, 2).allowed);
}

TEST_CASE("random CL.THROTTLE traces decide as redis-cell's algorithm, formula and engine") {
  std::mt19937_64 rng(35);
  engine::Engine e(cell_policy());
  std::vector<CellClient> clients;
  std::vector<RefStore> refs(4);
  std::vector<FormulaKey> formula(4);
  std::vector<RandomParams> in_force(4);
  for (int k = 0; k < 4; ++k) {
    clients.push_back(CellClient{e, "k" + std::to_string(k)});
    in_force[static_cast<size_t>(k)] = random_params(rng);
  }
  int64_t now = kT0;
  size_t compared = 0, limited = 0, never = 0, refunded = 0, refused = 0;
  for (int i = 0; i < 20'000; ++i) {
    const size_t k = rng() % refs.size();
    // A key's parameters change now and then, as a caller reconfiguring it on the fly.
    if (rng() % 50 == 0) in_force[k] = random_params(rng);
    const RandomParams rp = in_force[k];
    const CellParams p = params(rp.max_burst, rp.count, rp.period_s);
    // Whole milliseconds (redis-cell's key expiry is Redis's millisecond clock), in steps of up
    // to a few intervals of the key's rate.
    const auto interval_ms = static_cast<uint64_t>(p.interval_ns / kNsPerMs);
    now += rng() % 3 == 0 ? 0 : static_cast<int64_t>(rng() % (3 * interval_ms / 4 + 2)) * kNsPerMs;
    const uint64_t roll = rng() % 10;
    const int64_t quantity = roll == 0   ? 0
                             : roll <= 2 ? -static_cast<int64_t>(rng() % 4)
                             : roll == 3 ? static_cast<int64_t>(rng() % 30)
                                         : 1;
    CAPTURE(i);
    const RefResult want =
        ref_throttle(refs[k], now, rp.max_burst, rp.count, rp.period_s, quantity);
    const CellOutcome o = formula[k].call(p, now, quantity);
    const engine::Decision& d = clients[k].call(p, now, quantity);
    REQUIRE(o.error == (want.error ? CellError::kOverRefund : CellError::kNone));
    REQUIRE(d.error == (want.error ? rules::CheckError::kHitsTooLarge : rules::CheckError::kNone));
    refused += want.error ? 1 : 0;
    if (want.error || (want.corner && want.limited)) continue;  // cell.h: not reproduced
    ++compared;
    limited += want.limited ? 1 : 0;
    never += want.limited && want.retry_after_ns == kNone ? 1 : 0;
    refunded += !want.limited && quantity < 0 ? 1 : 0;
    const CellReply r = window::cell_reply(p, quantity, o.limited, o.ttl_ns);
    REQUIRE(o.limited == want.limited);
    REQUIRE(o.ttl_ns == want.reset_after_ns);
    REQUIRE(o.retry_after_ns == want.retry_after_ns);
    REQUIRE(r.remaining == want.remaining);
    REQUIRE(r.retry_after_s == ref_seconds(want.retry_after_ns));
    REQUIRE(r.reset_after_s == ref_seconds(want.reset_after_ns));
    REQUIRE(engine_reply(p, quantity, clients[k]) == r);
  }
  MESSAGE("compared " << compared << ", limited " << limited << ", never fits " << never
                      << ", refunds " << refunded << ", over-refunds " << refused);
  CHECK(compared > 15'000);
  CHECK(limited > 1'000);
  CHECK(never > 100);
  CHECK(refunded > 1'000);
  CHECK(refused > 100);
}

TEST_CASE("random traces with a nanosecond clock decide as the formula, through the engine") {
  std::mt19937_64 rng(36);
  engine::Engine e(cell_policy());
  CellClient c{e};
  FormulaKey key;
  int64_t now = kT0;
  for (int i = 0; i < 5'000; ++i) {
    now += static_cast<int64_t>(rng() % (3 * kNsPerMs));
    const RandomParams rp = random_params(rng);
    const int64_t quantity = static_cast<int64_t>(rng() % 5) - 1;
    const CellParams p = params(rp.max_burst, rp.count, rp.period_s);
    const CellOutcome o = key.call(p, now, quantity);
    const engine::Decision& d = c.call(p, now, quantity);
    CAPTURE(i);
    REQUIRE((d.error == rules::CheckError::kHitsTooLarge) == (o.error == CellError::kOverRefund));
    if (o.error != CellError::kNone) continue;
    REQUIRE(d.allowed == !o.limited);
    REQUIRE(engine::cell_ttl_ns(c.limit()) == o.ttl_ns);
  }
}

TEST_CASE("a cell check and a limit's exact reset cross the check protocol") {
  const wire::Entry entry{"key", "user123"};
  wire::Check check;
  check.domain = "redis";
  check.entries = {&entry, 1};
  check.has_cell_limit = true;
  check.cell_interval_ns = 2 * kNsPerS;
  check.cell_limit = 16;
  check.cell_quantity = -3;
  check.cell_reset = false;
  std::vector<uint8_t> bytes;
  wire::encode_request(9, {&check, 1}, 0, bytes, true);
  wire::RequestDecoder dec;
  REQUIRE(dec.decode(bytes) == wire::Code::kOk);
  REQUIRE(dec.checks().size() == 1);
  CHECK(dec.check_code(0) == wire::Code::kOk);
  const wire::Check& got = dec.checks()[0];
  CHECK(got.has_cell_limit);
  CHECK(got.cell_interval_ns == 2 * kNsPerS);
  CHECK(got.cell_limit == 16);
  CHECK(got.cell_quantity == -3);
  CHECK_FALSE(got.cell_reset);
  check.cell_reset = true;
  check.cell_quantity = 0;
  wire::encode_request(9, {&check, 1}, 0, bytes, true);
  REQUIRE(dec.decode(bytes) == wire::Code::kOk);
  CHECK(dec.checks()[0].cell_reset);
  CHECK(dec.checks()[0].cell_quantity == 0);
  // Invalid values are malformed, as a bad limit override is.
  check.cell_interval_ns = 0;
  CHECK(wire::check_code(check) == wire::Code::kMalformed);
  check.cell_interval_ns = INT64_MAX / 2;
  check.cell_limit = 3;
  CHECK(wire::check_code(check) == wire::Code::kMalformed);
  check.cell_limit = 1;
  check.cell_quantity = 3;
  CHECK(wire::check_code(check) == wire::Code::kMalformed);
  // A cell limit costs a check 32 bytes (docs/protocol.md, "Sizing the padding").
  check.cell_interval_ns = kNsPerS;
  check.cell_limit = 1;
  wire::encode_request(9, {&check, 1}, 0, bytes);
  const size_t with_cell = bytes.size();
  check.has_cell_limit = false;
  wire::encode_request(9, {&check, 1}, 0, bytes);
  CHECK(with_cell == bytes.size() + 32);
  // A check without one reads as none.
  wire::Check plain;
  plain.domain = "redis";
  wire::encode_request(10, {&plain, 1}, 128, bytes);
  REQUIRE(dec.decode(bytes) == wire::Code::kOk);
  CHECK_FALSE(dec.checks()[0].has_cell_limit);

  wire::LimitView lv;
  lv.name = "cell";
  lv.limit = 16;
  lv.reset_ms = 2'000;
  lv.reset_ns_short = 1;  // 1.999999999 s
  const wire::DecisionView dv{wire::Code::kOk, true, false, false, false, {&lv, 1}, 0};
  wire::encode_answer(9, wire::Code::kOk, {&dv, 1}, 0, bytes);
  wire::Answer ans;
  REQUIRE(wire::decode_answer(bytes, ans) == wire::Code::kOk);
  REQUIRE(ans.decisions.size() == 1);
  REQUIRE(ans.decisions[0].limits.size() == 1);
  CHECK(ans.decisions[0].limits[0].reset_ns_short == 1);
  // The exact reset costs an answer nothing: it sits in a limit's spare bits.
  std::vector<uint8_t> plain_answer;
  lv.reset_ns_short = 0;
  CHECK(wire::encode_answer(9, wire::Code::kOk, {&dv, 1}, 0, plain_answer) == bytes.size());
}
