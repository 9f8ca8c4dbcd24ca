// Unit tests of lib/window: spec validation, bucket arithmetic, the weighted and strict estimates
// (with published worked examples), admission at the exact boundary, the limit state reported to
// callers (remaining, reset, retry-after, the latter checked exhaustively against admits() over
// random rings), ring maintenance, and the single-key SlidingWindow.
//
// Everything is deterministic: times are literals, randomness comes from seeded std::mt19937_64.
#include "window/sliding_window.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "text.h"

using namespace sluice::window;
using sluice::testing::contains;

namespace {

constexpr int64_t kSec = 1'000;
constexpr int64_t kMin = 60 * kSec;
constexpr int64_t kHour = 60 * kMin;
constexpr int64_t kDay = 24 * kHour;

// 2023-11-14T22:20:00Z: a realistic epoch time that is a whole hour (and so a whole minute).
constexpr int64_t kHourStart = 1'700'000'400'000 - 1'700'000'400'000 % kHour;
static_assert(kHourStart % kHour == 0);

constexpr uint32_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// A ring built bucket by bucket through the public advance()/add(), in increasing bucket order.
struct TestRing {
  WindowSpec spec;
  std::vector<uint32_t> own;
  std::vector<uint32_t> others;  // empty: single node
  int64_t head;

  TestRing(WindowSpec s, int64_t first_bucket)
      : spec(s), own(s.ring_size(), 0u), head(first_bucket) {}

  // Counts `n` hits in `bucket`, which must not be older than the head.
  TestRing& put(int64_t bucket, uint32_t n) {
    head = advance(own, others, head, bucket);
    sluice::window::add(own, bucket, n);
    return *this;
  }
  RingView view() const { return {own, others, head}; }
};

// Independent reference of what a ring holds: bucket b's count, by the layout the header states.
uint64_t ref_count(const RingView& v, int64_t b) {
  const auto r = static_cast<int64_t>(v.own.size());
  if (b > v.head || b <= v.head - r) return 0;
  const auto i = static_cast<size_t>(((b % r) + r) % r);
  return uint64_t{v.own[i]} + (v.others.empty() ? 0u : v.others[i]);
}

// The estimate at now scaled by bucket_ms (exact integer), straight from the formula
// (docs/architecture.md, "Counting"). Random tests keep counts small enough for 64 bits. The
// estimate scaled by B. Deciding against `limit`, the weighted estimate counts the straddler at
// least as its hits less limit / n (scaled: straddle * B - floor(limit * B / n)), so that a true
// window never holds more than (1 + 1/n) x the limit; without a limit (display) it does not.
uint64_t ref_scaled(const RingView& v, const WindowSpec& spec, Estimator est, int64_t now,
                    uint64_t limit = UINT64_MAX) {
  const int64_t B = spec.bucket_ms;
  const int64_t c = bucket_of(now, B);
  const int64_t elapsed = now - c * B;
  const auto n = static_cast<int64_t>(spec.buckets());
  uint64_t full = 0;
  for (int64_t b = c - n + 1; b <= c; ++b)
    full += ref_count(v, b);
  const uint64_t straddle = ref_count(v, c - n);
  const auto share = static_cast<uint64_t>(est == Estimator::kStrict ? B : B - elapsed);
  uint64_t straddle_scaled = straddle * share;
  if (est == Estimator::kWeighted && limit != UINT64_MAX) {
    const uint64_t discount = limit * static_cast<uint64_t>(B) / static_cast<uint64_t>(n);
    const uint64_t all = straddle * static_cast<uint64_t>(B);
    straddle_scaled = std::max(straddle_scaled, all > discount ? all - discount : 0);
  }
  return full * static_cast<uint64_t>(B) + straddle_scaled;
}

std::string describe(const RingView& v, const WindowSpec& spec) {
  std::ostringstream os;
  os << "spec{" << spec.window_ms << "ms/" << spec.bucket_ms << "ms} head=" << v.head << " own=[";
  for (uint32_t x : v.own)
    os << x << ' ';
  os << "] others=[";
  for (uint32_t x : v.others)
    os << x << ' ';
  os << ']';
  return os.str();
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Specs: default buckets and validation
// ------------------------------------------------------------------------------------------------

TEST_CASE("the older default bucket: one minute for whole-minute windows, the window otherwise") {
  CHECK(legacy_default_bucket_ms(1 * kSec) == 1 * kSec);
  CHECK(legacy_default_bucket_ms(10 * kSec) == 10 * kSec);
  CHECK(legacy_default_bucket_ms(30 * kSec) == 30 * kSec);
  CHECK(legacy_default_bucket_ms(90 * kSec) == 90 * kSec);  // not a whole number of minutes
  CHECK(legacy_default_bucket_ms(1 * kMin) == kMin);
  CHECK(legacy_default_bucket_ms(15 * kMin) == kMin);
  CHECK(legacy_default_bucket_ms(1 * kHour) == kMin);
  CHECK(legacy_default_bucket_ms(1 * kDay) == kMin);
}

TEST_CASE("the windows rules use (1s, 10s, 1min, 15min, 1h, 1d) are valid with default buckets") {
  struct Want {
    int64_t window;
    int64_t bucket;
    uint32_t buckets;
  };
  // Windows under ten minutes are cut into ten buckets (default_bucket_ms, kDefaultBuckets):
  // 1 s at 100 ms, 10 s at 1 s, 1 min at 6 s. From ten minutes on the bucket stays one minute,
  // so 15 min, 1 h and 1 d keep 15, 60 and 1440 one-minute buckets.
  const Want wants[] = {
      {1 * kSec, 100, 10},   {10 * kSec, 1 * kSec, 10}, {1 * kMin, 6 * kSec, 10},
      {15 * kMin, kMin, 15}, {1 * kHour, kMin, 60},     {1 * kDay, kMin, 1440},
  };
  for (const Want& w : wants) {
    CAPTURE(w.window);
    const WindowSpec s = make_spec(w.window);
    CHECK(s.window_ms == w.window);
    CHECK(s.bucket_ms == w.bucket);
    CHECK(s.buckets() == w.buckets);
    CHECK(s.ring_size() == w.buckets + 1);
    CHECK(validate(s).ok());
  }
}

TEST_CASE("make_spec keeps an explicit granularity and validate accepts it when it fits") {
  const WindowSpec ten_s_at_1s = make_spec(10 * kSec, 1 * kSec);
  CHECK(ten_s_at_1s == WindowSpec{10 * kSec, 1 * kSec});
  CHECK(ten_s_at_1s.buckets() == 10);
  CHECK(validate(ten_s_at_1s).ok());
  CHECK(validate(make_spec(1 * kSec, 10)).ok());         // finest bucket: 100 buckets
  CHECK(validate(make_spec(1 * kDay, 1 * kDay)).ok());   // one bucket per day
  CHECK(validate(make_spec(1 * kDay, 1 * kMin)).ok());   // exactly kMaxBuckets
  CHECK(validate(make_spec(1 * kHour, 5 * kSec)).ok());  // 720 buckets
  CHECK(validate(make_spec(24 * kMin, 1 * kSec)).ok());  // exactly 1440 buckets
}

TEST_CASE(
    "validate rejects more than 1440 buckets (1h at 1s) and says to coarsen the granularity") {
  const std::string err = validate(make_spec(1 * kHour, 1 * kSec)).message();
  CAPTURE(err);
  CHECK(contains(err, "3600000ms"));
  CHECK(contains(err, "1000ms"));
  CHECK(contains(err, "1440"));
  CHECK(contains(err, "granularity"));
  CHECK_FALSE(validate(make_spec(1 * kDay, 30 * kSec)).ok());             // 2880 buckets
  CHECK_FALSE(validate(make_spec(24 * kMin + 1 * kSec, 1 * kSec)).ok());  // 1441 buckets
}

TEST_CASE("validate rejects a granularity that does not divide the window, naming both") {
  const std::string err = validate(make_spec(1 * kMin, 7 * kSec)).message();
  CAPTURE(err);
  CHECK(contains(err, "granularity 7000ms"));
  CHECK(contains(err, "divide"));
  CHECK(contains(err, "60000ms"));
  // A bucket longer than the window does not divide it either.
  const std::string longer = validate(make_spec(1 * kSec, 2 * kSec)).message();
  CAPTURE(longer);
  CHECK(contains(longer, "divide"));
}

TEST_CASE("validate rejects windows shorter than 1s or longer than 365d, naming the range") {
  for (int64_t w : {int64_t{999}, int64_t{0}, int64_t{-1000}, 365 * kDay + 1, 366 * kDay}) {
    CAPTURE(w);
    const std::string err = validate(WindowSpec{w, 10}).message();
    CAPTURE(err);
    CHECK(contains(err, "window must be between 1s and 365d"));
    CHECK(contains(err, std::to_string(w) + "ms"));
  }
  CHECK(validate(WindowSpec{kMinWindowMs, kMinWindowMs}).ok());
  CHECK(validate(WindowSpec{kMaxWindowMs, kDay}).ok());
}

TEST_CASE("windows longer than a day default to coarse buckets that keep the ring within 1441") {
  CHECK(make_spec(7 * kDay) == WindowSpec{7 * kDay, 3'600'000});          // week: 168 buckets
  CHECK(make_spec(30 * kDay) == WindowSpec{30 * kDay, 3'600'000});        // month: 720
  CHECK(make_spec(365 * kDay) == WindowSpec{365 * kDay, kDay});           // year: 365
  CHECK(make_spec(100 * kDay) == WindowSpec{100 * kDay, 6 * 3'600'000});  // 400
  CHECK(make_spec(kDay) == WindowSpec{kDay, kMin});                       // unchanged up to a day
  for (int64_t w : {2 * kDay, 7 * kDay, 30 * kDay, 100 * kDay, 365 * kDay, kDay + kMin}) {
    CAPTURE(w);
    const WindowSpec s = make_spec(w);
    CHECK(validate(s).ok());
    CHECK(s.ring_size() <= kMaxBuckets + 1);
  }
  // One minute over a day divides by none of 1 h, 6 h, 1 d; rather than one bucket (the older
  // default: the window itself), it is cut into the ten buckets every default window has at
  // least (default_bucket_ms, kDefaultBuckets): 1441 min / 10 = 144.1 min each.
  CHECK(legacy_default_bucket_ms(kDay + kMin) == kDay + kMin);
  CHECK(make_spec(kDay + kMin).bucket_ms == (kDay + kMin) / 10);
  // A year at one-minute buckets is refused, naming the bucket count.
  CHECK(validate(WindowSpec{365 * kDay, kMin}).message().find("more than 1440 buckets") !=
        std::string::npos);
}

TEST_CASE("validate rejects buckets under 10ms (and zero or negative ones) without dividing") {
  for (int64_t b : {int64_t{9}, int64_t{5}, int64_t{1}, int64_t{0}, int64_t{-60000}}) {
    CAPTURE(b);
    const std::string err = validate(WindowSpec{1 * kSec, b}).message();
    CAPTURE(err);
    CHECK(contains(err, "granularity must be at least 10ms"));
    CHECK(contains(err, std::to_string(b) + "ms"));
  }
}

TEST_CASE("to_string names the estimators as the rules file spells them") {
  CHECK(to_string(Estimator::kWeighted) == "weighted");
  CHECK(to_string(Estimator::kStrict) == "strict");
}

// ------------------------------------------------------------------------------------------------
// Bucket arithmetic
// ------------------------------------------------------------------------------------------------

TEST_CASE("bucket_of floors, also before the epoch") {
  CHECK(bucket_of(0, kMin) == 0);
  CHECK(bucket_of(1, kMin) == 0);
  CHECK(bucket_of(kMin - 1, kMin) == 0);
  CHECK(bucket_of(kMin, kMin) == 1);
  CHECK(bucket_of(-1, kMin) == -1);
  CHECK(bucket_of(-kMin, kMin) == -1);
  CHECK(bucket_of(-kMin - 1, kMin) == -2);
  CHECK(bucket_of(-2 * kMin, kMin) == -2);
  CHECK(bucket_of(kHourStart + 23 * kMin + 45 * kSec, kMin) == kHourStart / kMin + 23);
  CHECK(bucket_of(std::numeric_limits<int64_t>::min(), 10) ==
        std::numeric_limits<int64_t>::min() / 10 - 1);
  CHECK(bucket_of(std::numeric_limits<int64_t>::max(), 10) ==
        std::numeric_limits<int64_t>::max() / 10);
  // Floor semantics: every time lies in [b*B, (b+1)*B) of its bucket b.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int64_t> t(-int64_t{1} << 50, int64_t{1} << 50);
  for (int64_t B : {int64_t{10}, kSec, kMin, kDay}) {
    for (int i = 0; i < 1000; ++i) {
      const int64_t now = t(rng);
      const int64_t b = bucket_of(now, B);
      CAPTURE(now);
      CAPTURE(B);
      REQUIRE(b * B <= now);
      REQUIRE(now < (b + 1) * B);
    }
  }
}

TEST_CASE("RingView::count sums own and others and holds exactly the ring_size newest buckets") {
  const WindowSpec spec = make_spec(3 * kSec, 1 * kSec);  // ring of 4
  std::vector<uint32_t> own = {1, 2, 3, 4};               // buckets 8, 9, 10, 11 (head 11)
  std::vector<uint32_t> others = {10, 20, 30, 40};
  const RingView single{own, {}, 11};
  const RingView merged{own, others, 11};
  CHECK(single.count(8) == 1);
  CHECK(single.count(11) == 4);
  CHECK(merged.count(8) == 11);
  CHECK(merged.count(10) == 33);
  CHECK(merged.count(11) == 44);
  CHECK(merged.count(12) == 0);  // newer than head
  CHECK(merged.count(7) == 0);   // fell out of the ring (same slot as 11)
  CHECK(merged.count(-1) == 0);
  // Negative bucket numbers map to the same slots as their positive residues.
  const RingView negative{own, others, -1};  // buckets -4..-1 at slots 0..3
  CHECK(negative.count(-4) == 11);
  CHECK(negative.count(-1) == 44);
  CHECK(negative.count(-5) == 0);
  CHECK(negative.count(0) == 0);
  CHECK(spec.ring_size() == own.size());
  // Two full uint32 counters do not wrap.
  std::vector<uint32_t> big = {kU32Max, kU32Max};
  CHECK(RingView{big, big, 0}.count(0) == uint64_t{2} * kU32Max);
}

// ------------------------------------------------------------------------------------------------
// Estimates
// ------------------------------------------------------------------------------------------------

TEST_CASE(
    "weighted estimate: the two-counter example's 400 in minute 22 and 250 in minute 23 give 350 "
    "at 23:45") {
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t m22 = bucket_of(kHourStart + 22 * kMin, kMin);
  TestRing ring(spec, m22);
  ring.put(m22, 400).put(m22 + 1, 250);
  const int64_t at_23_45 = kHourStart + 23 * kMin + 45 * kSec;
  // 15 of minute 22's 60 seconds are still inside the window (22:45, 23:45]: 400/4 + 250.
  CHECK(estimate(ring.view(), spec, Estimator::kWeighted, at_23_45) == 350.0);
  CHECK(estimate(ring.view(), spec, Estimator::kStrict, at_23_45) == 650.0);
}

TEST_CASE(
    "weighted estimate counts the current bucket fully (12 previous, 5 current, 25% in: 14)") {
  // Allegro's two-frame limiter writes value = previous * partOfPreviousFrame + current *
  // partOfCurrentFrame = 12 * 0.75 + 5 * 0.25 = 10.25, scaling the current frame by the share of it
  // that has elapsed. Sluice counts as the two-counter and Figma limiters do instead: every hit of
  // the current bucket happened within the last `elapsed` ms, so all of them are inside the window
  // and count fully; only the oldest (straddling) bucket is weighted, by the share of it still
  // inside the window. The two-frame formula would let a burst at the start of a bucket pass nearly
  // uncounted.
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t prev = bucket_of(kHourStart, kMin);
  TestRing ring(spec, prev);
  ring.put(prev, 12).put(prev + 1, 5);
  const int64_t quarter_in = (prev + 1) * kMin + 15 * kSec;
  CHECK(estimate(ring.view(), spec, Estimator::kWeighted, quarter_in) == 12 * 0.75 + 5);
  CHECK(estimate(ring.view(), spec, Estimator::kWeighted, quarter_in) != 10.25);
  CHECK(admits(ring.view(), spec, Estimator::kWeighted, quarter_in, 1, 15));
  CHECK_FALSE(admits(ring.view(), spec, Estimator::kWeighted, quarter_in, 2, 15));
}

TEST_CASE("1h window at 1min granularity: 60 full buckets plus the weighted straddler") {
  const WindowSpec spec = make_spec(1 * kHour);
  REQUIRE(spec.buckets() == 60);
  // Minute c is 11:00; the straddler c-60 is 10:00, with 120 hits; minute c-k holds k+1 hits.
  const int64_t c = bucket_of(kHourStart + kHour, kMin);
  TestRing ring(spec, c - 60);
  ring.put(c - 60, 120);
  for (int64_t k = 59; k >= 0; --k)
    ring.put(c - k, static_cast<uint32_t>(k + 1));
  const uint64_t full = 60 * 61 / 2;  // 1830
  const int64_t at_11_00_35 = c * kMin + 35 * kSec;
  // 25 s of the 10:00 minute are inside (10:00:35, 11:00:35]: 120 * 25/60 = 50.
  CHECK(estimate(ring.view(), spec, Estimator::kWeighted, at_11_00_35) ==
        static_cast<double>(full + 50));
  CHECK(estimate(ring.view(), spec, Estimator::kStrict, at_11_00_35) ==
        static_cast<double>(full + 120));
  // Deciding against a limit of 5000, the weighted share (50) is above the floor the estimate
  // keeps under the straddler (its 120 hits less 5000 / 60): 5000 - 1880 more fit.
  CHECK(admits(ring.view(), spec, Estimator::kWeighted, at_11_00_35, 3120, 5000));
  CHECK_FALSE(admits(ring.view(), spec, Estimator::kWeighted, at_11_00_35, 3121, 5000));
  // Against full + 70 = 1900 the floor binds: the 120 hits may all have come late in 10:00 and
  // be inside the true window, and the estimate discounts at most 1900 / 60 of them, so it stands
  // at 1830 + 120 - 31.67 = 1918.33, over the limit: nothing more fits.
  CHECK_FALSE(admits(ring.view(), spec, Estimator::kWeighted, at_11_00_35, 0, full + 70));
  CHECK(admits(ring.view(), spec, Estimator::kWeighted, at_11_00_35, 0, full + 89));
  CHECK_FALSE(admits(ring.view(), spec, Estimator::kWeighted, at_11_00_35, 1, full + 89));

  // Figma's example: 3 requests at 10:00:xx and a check at 11:00:35. A plain sum of 60 minute
  // counters ignores them; weighted counts 3 * 25/60 of them, strict all 3 (the "harsher" sum).
  TestRing three(spec, c - 60);
  three.put(c - 60, 3).put(c, 0);
  CHECK(estimate(three.view(), spec, Estimator::kWeighted, at_11_00_35) == 1.25);
  CHECK(estimate(three.view(), spec, Estimator::kStrict, at_11_00_35) == 3.0);
}

TEST_CASE("strict estimate counts the whole straddling bucket for the entire bucket") {
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t b = bucket_of(kHourStart, kMin);
  TestRing ring(spec, b);
  ring.put(b, 40).put(b + 1, 7);
  for (int64_t e : {int64_t{0}, int64_t{1}, 30 * kSec, kMin - 1}) {
    CAPTURE(e);
    CHECK(estimate(ring.view(), spec, Estimator::kStrict, (b + 1) * kMin + e) == 47.0);
  }
  // Once the straddler changes, the old bucket is gone entirely.
  CHECK(estimate(ring.view(), spec, Estimator::kStrict, (b + 2) * kMin) == 7.0);
  CHECK(estimate(ring.view(), spec, Estimator::kStrict, (b + 3) * kMin) == 0.0);
}

TEST_CASE("strict is never below weighted, and both agree at a bucket boundary") {
  std::mt19937_64 rng(1);
  // One-bucket 1 s and 1 min windows (the older defaults), 1 h in 60, 10 s at 1 s, and the
  // current defaults of 1 s and 1 min (ten buckets each).
  for (const WindowSpec spec :
       {make_spec(1 * kSec, kSec), make_spec(1 * kMin, kMin), make_spec(1 * kHour),
        make_spec(10 * kSec, kSec), make_spec(1 * kSec), make_spec(1 * kMin)}) {
    const uint32_t r = spec.ring_size();
    std::uniform_int_distribution<uint32_t> cnt(0, 1000);
    std::uniform_int_distribution<int64_t> elapsed(0, spec.bucket_ms - 1);
    for (int i = 0; i < 300; ++i) {
      std::vector<uint32_t> own(r);
      for (auto& x : own)
        x = cnt(rng);
      const int64_t head = static_cast<int64_t>(rng() % 2000) - 1000;
      const RingView v{own, {}, head};
      const int64_t now = head * spec.bucket_ms + elapsed(rng);
      CAPTURE(describe(v, spec));
      CAPTURE(now);
      const double weighted = estimate(v, spec, Estimator::kWeighted, now);
      const double strict = estimate(v, spec, Estimator::kStrict, now);
      REQUIRE(strict >= weighted);
      const int64_t boundary = head * spec.bucket_ms;
      REQUIRE(estimate(v, spec, Estimator::kWeighted, boundary) ==
              estimate(v, spec, Estimator::kStrict, boundary));
    }
  }
}

TEST_CASE("the weighted estimate falls continuously across a bucket boundary with no new hits") {
  // Just before the boundary the straddler weighs 1/B; just after, it has left and the old
  // current bucket is the straddler at full weight: no jump either way.
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t b = bucket_of(kHourStart, kMin);
  TestRing ring(spec, b);
  ring.put(b, 60'000).put(b + 1, 9);
  const double before = estimate(ring.view(), spec, Estimator::kWeighted, (b + 2) * kMin - 1);
  const double at = estimate(ring.view(), spec, Estimator::kWeighted, (b + 2) * kMin);
  CHECK(before == 10.0);  // 9 + 60000 * 1/60000
  CHECK(at == 9.0);
}

// ------------------------------------------------------------------------------------------------
// Admission
// ------------------------------------------------------------------------------------------------

TEST_CASE("admits at the exact boundary: estimate + hits == limit is admitted, one more is not") {
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t m22 = bucket_of(kHourStart + 22 * kMin, kMin);
  TestRing ring(spec, m22);
  ring.put(m22, 400).put(m22 + 1, 250);
  const int64_t now = kHourStart + 23 * kMin + 45 * kSec;  // weighted 350, strict 650
  const RingView v = ring.view();
  CHECK(admits(v, spec, Estimator::kWeighted, now, 50, 400));
  CHECK_FALSE(admits(v, spec, Estimator::kWeighted, now, 51, 400));
  CHECK(admits(v, spec, Estimator::kStrict, now, 50, 700));
  CHECK_FALSE(admits(v, spec, Estimator::kStrict, now, 51, 700));
  // A fractional estimate: at 23:45.001 the weighted estimate is 349.99333..., so 50 more fit
  // under 400, 51 do not (the comparison is exact, not rounded).
  CHECK(admits(v, spec, Estimator::kWeighted, now + 1, 50, 400));
  CHECK_FALSE(admits(v, spec, Estimator::kWeighted, now + 1, 51, 400));
  // At 23:45 minus 1 ms the estimate is 350.00666...: 50 more no longer fit under 400.
  CHECK_FALSE(admits(v, spec, Estimator::kWeighted, now - 1, 50, 400));
  CHECK(admits(v, spec, Estimator::kWeighted, now - 1, 49, 400));
}

TEST_CASE("a cost above the limit is never admitted, even by an empty window") {
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const std::vector<uint32_t> empty(spec.ring_size(), 0u);
  const RingView v{empty, {}, 100};
  for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
    CHECK(admits(v, spec, est, 100 * kMin, 10, 10));
    CHECK_FALSE(admits(v, spec, est, 100 * kMin, 11, 10));
    CHECK_FALSE(admits(v, spec, est, 100 * kMin, 1, 0));
    CHECK_FALSE(admits(v, spec, est, 100 * kMin, kU64Max, kU64Max - 1));
    CHECK(admits(v, spec, est, 100 * kMin, kU64Max, kU64Max));
  }
}

TEST_CASE("a zero cost is admitted whenever the window is at or under the limit") {
  // Note: when the estimate is above the limit (denied hits counted, a lowered limit, merged
  // peers' counts) admits() follows its header (estimate + hits <= limit) and says false for a
  // zero cost; this case pins only the uncontroversial part.
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t b = bucket_of(kHourStart, kMin);
  TestRing ring(spec, b);
  ring.put(b, 400).put(b + 1, 250);
  const int64_t now = (b + 1) * kMin + 45 * kSec;  // weighted 350, strict 650
  CHECK(admits(ring.view(), spec, Estimator::kWeighted, now, 0, 350));
  CHECK(admits(ring.view(), spec, Estimator::kStrict, now, 0, 650));
  CHECK(admits(ring.view(), spec, Estimator::kWeighted, now, 0, 1000));
  const std::vector<uint32_t> empty(spec.ring_size(), 0u);
  CHECK(admits(RingView{empty, {}, b}, spec, Estimator::kWeighted, b * kMin, 0, 0));
  CHECK(admits(RingView{empty, {}, b}, spec, Estimator::kStrict, b * kMin, 0, 0));
}

// ------------------------------------------------------------------------------------------------
// Limit state
// ------------------------------------------------------------------------------------------------

TEST_CASE("limit_state: remaining is floor(limit - estimate), 0 at or over the limit") {
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t m22 = bucket_of(kHourStart + 22 * kMin, kMin);
  TestRing ring(spec, m22);
  ring.put(m22, 400).put(m22 + 1, 250);
  const RingView v = ring.view();
  const int64_t now = kHourStart + 23 * kMin + 45 * kSec;
  CHECK(limit_state(v, spec, Estimator::kWeighted, now, 1, 400).remaining == 50);
  CHECK(limit_state(v, spec, Estimator::kWeighted, now + 1, 1, 400).remaining == 50);  // 349.99
  CHECK(limit_state(v, spec, Estimator::kWeighted, now - 1, 1, 400).remaining == 49);  // 350.01
  CHECK(limit_state(v, spec, Estimator::kWeighted, now, 1, 350).remaining == 0);
  CHECK(limit_state(v, spec, Estimator::kWeighted, now, 1, 100).remaining == 0);
  CHECK(limit_state(v, spec, Estimator::kStrict, now, 1, 700).remaining == 50);
  CHECK(limit_state(v, spec, Estimator::kStrict, now, 1, 600).remaining == 0);
}

TEST_CASE("limit_state: reset_ms is the time until the newest non-empty bucket leaves the window") {
  const WindowSpec spec = make_spec(1 * kHour);  // 60 one-minute buckets
  const int64_t c = bucket_of(kHourStart + kHour, kMin);
  TestRing ring(spec, c - 30);
  ring.put(c - 30, 5).put(c - 10, 3).put(c, 0);  // newest hits in minute c-10; head c is empty
  const RingView v = ring.view();
  const int64_t now = c * kMin + 20 * kSec;
  // Minute c-10 ends at (c-9)*B and has left the window one hour later.
  const int64_t want = (c - 9) * kMin + kHour - now;
  for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
    const LimitState st = limit_state(v, spec, est, now, 1, 100);
    CHECK(st.reset_ms == want);
    CHECK(estimate(v, spec, est, now + st.reset_ms) == 0.0);
    CHECK(estimate(v, spec, est, now + st.reset_ms - 1) > 0.0);
    CHECK(expired(v.head, spec, now + st.reset_ms) == false);  // the (empty) head is still inside
  }
  // An empty ring resets now.
  const std::vector<uint32_t> empty(spec.ring_size(), 0u);
  CHECK(limit_state(RingView{empty, {}, c}, spec, Estimator::kWeighted, now, 1, 1).reset_ms == 0);
  // A single-bucket window: hits in the current minute leave one minute after it ends.
  const WindowSpec minute = make_spec(1 * kMin, kMin);
  TestRing one(minute, c);
  one.put(c, 1);
  CHECK(limit_state(one.view(), minute, Estimator::kWeighted, now, 1, 10).reset_ms ==
        (c + 2) * kMin - now);
  CHECK(expired(one.head, minute, (c + 2) * kMin));
  CHECK_FALSE(expired(one.head, minute, (c + 2) * kMin - 1));
}

TEST_CASE("limit_state: retry_after_ms is 0 when admitted now and kNever when hits > limit") {
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  const int64_t m22 = bucket_of(kHourStart + 22 * kMin, kMin);
  TestRing ring(spec, m22);
  ring.put(m22, 400).put(m22 + 1, 250);
  const RingView v = ring.view();
  const int64_t now = kHourStart + 23 * kMin + 45 * kSec;
  for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
    CHECK(limit_state(v, spec, est, now, 10, 1000).retry_after_ms == 0);
    CHECK(limit_state(v, spec, est, now, 1001, 1000).retry_after_ms == kNever);
    CHECK(limit_state(v, spec, est, now, kU64Max, 1000).retry_after_ms == kNever);
  }
  // Worked values. Weighted: 400 * (B - e)/B + 250 + 60 <= 400 once 400 * (B - e) <= 90 * B,
  // i.e. B - e <= 13500 ms: e = 46500, 1500 ms after 23:45.
  CHECK(limit_state(v, spec, Estimator::kWeighted, now, 60, 400).retry_after_ms == 1'500);
  // Strict: 650 + 60 <= 400 only when minute 22 has left (at 24:00) and 250 + 60 <= 400.
  CHECK(limit_state(v, spec, Estimator::kStrict, now, 60, 400).retry_after_ms == 15 * kSec);
  // ... and when even minute 23 must leave, at 25:00.
  CHECK(limit_state(v, spec, Estimator::kStrict, now, 200, 400).retry_after_ms == kMin + 15 * kSec);
  // Weighted, minute 23 must fade too: 250 * (B - e)/B + 200 <= 400 at e = 12 s into minute 24.
  CHECK(limit_state(v, spec, Estimator::kWeighted, now, 200, 400).retry_after_ms ==
        15 * kSec + 12 * kSec);
}

namespace {

struct RandomCase {
  WindowSpec spec;
  Estimator est;
  std::vector<uint32_t> own;
  std::vector<uint32_t> others;
  int64_t head;
  int64_t now;
  uint64_t hits;
  uint64_t limit;
};

uint32_t random_count(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0:
    case 1:
    case 2:
      return 0;
    case 8:
      return static_cast<uint32_t>(rng() % 1'000) + 1;
    case 9:
      return static_cast<uint32_t>(rng() % 1'000'000) + 1;
    default:
      return static_cast<uint32_t>(rng() % 20) + 1;
  }
}

RandomCase random_case(std::mt19937_64& rng, WindowSpec spec, Estimator est) {
  RandomCase rc{spec, est, {}, {}, 0, 0, 0, 0};
  const uint32_t r = spec.ring_size();
  const int64_t B = spec.bucket_ms;
  rc.own.resize(r);
  for (auto& x : rc.own)
    x = random_count(rng);
  if (rng() % 3 == 0) {
    rc.others.resize(r);
    for (auto& x : rc.others)
      x = random_count(rng);
  }
  // Heads around the epoch (negative too) and around today.
  rc.head = rng() % 2 == 0 ? static_cast<int64_t>(rng() % 2'000) - 1'000
                           : kHourStart / B + static_cast<int64_t>(rng() % 100'000);
  // Usually now is in the head bucket; sometimes the ring was last written a while ago.
  const int64_t lag = rng() % 4 == 0 ? static_cast<int64_t>(rng() % (r + 2)) : 0;
  rc.now = (rc.head + lag) * B + static_cast<int64_t>(rng() % static_cast<uint64_t>(B));
  uint64_t total = 0;
  for (size_t i = 0; i < r; ++i)
    total += rc.own[i] + (rc.others.empty() ? 0u : rc.others[i]);
  switch (rng() % 4) {
    case 0:  // around the current estimate
      rc.limit = ref_scaled(RingView{rc.own, rc.others, rc.head}, spec, est, rc.now) /
                     static_cast<uint64_t>(B) +
                 rng() % 5;
      break;
    case 1:
      rc.limit = rng() % 5;
      break;
    default:
      rc.limit = rng() % (total + total / 2 + 5);
  }
  switch (rng() % 5) {
    case 0:
      rc.hits = 0;
      break;
    case 1:
      rc.hits = rc.limit;
      break;
    case 2:
      rc.hits = rc.limit + 1 + rng() % 3;
      break;
    default:
      rc.hits = rng() % (rc.limit + 1);
  }
  return rc;
}

// Checks every number limit_state() reports against admits()/estimate() evaluated at later times
// over the same ring (no hits in between), and admits() against the reference formula.
void check_random_case(const RandomCase& rc) {
  const RingView v{rc.own, rc.others, rc.head};
  const WindowSpec& spec = rc.spec;
  const auto B = static_cast<uint64_t>(spec.bucket_ms);
  INFO(describe(v, spec));
  INFO("est=" << to_string(rc.est) << " now=" << rc.now << " hits=" << rc.hits
              << " limit=" << rc.limit);

  auto admitted_at = [&](int64_t t) { return admits(v, spec, rc.est, t, rc.hits, rc.limit); };

  // admits() and remaining against the reference formula (decisions with the weighted floor,
  // the displayed estimate without it).
  const uint64_t used = ref_scaled(v, spec, rc.est, rc.now, rc.limit);
  const uint64_t cap = rc.limit * B;
  const bool ref_admits = rc.hits <= rc.limit && used + rc.hits * B <= cap;
  REQUIRE(admitted_at(rc.now) == ref_admits);
  REQUIRE(estimate(v, spec, rc.est, rc.now) ==
          static_cast<double>(ref_scaled(v, spec, rc.est, rc.now)) /
              static_cast<double>(spec.bucket_ms));
  const LimitState st = limit_state(v, spec, rc.est, rc.now, rc.hits, rc.limit);
  REQUIRE(st.remaining == (used >= cap ? 0 : (cap - used) / B));
  if (used <= cap) {
    REQUIRE(admits(v, spec, rc.est, rc.now, st.remaining, rc.limit));
    REQUIRE_FALSE(admits(v, spec, rc.est, rc.now, st.remaining + 1, rc.limit));
  }

  // reset_ms: the first time the window holds nothing of what the ring holds.
  REQUIRE(st.reset_ms >= 0);
  REQUIRE(estimate(v, spec, rc.est, rc.now + st.reset_ms) == 0.0);
  if (st.reset_ms > 0) REQUIRE(estimate(v, spec, rc.est, rc.now + st.reset_ms - 1) > 0.0);

  // retry_after_ms: exact.
  if (rc.hits > rc.limit) {
    REQUIRE(st.retry_after_ms == kNever);
    REQUIRE_FALSE(admitted_at(rc.now));
    return;
  }
  REQUIRE(st.retry_after_ms != kNever);
  REQUIRE(st.retry_after_ms >= 0);
  if (st.retry_after_ms == 0) {
    REQUIRE(admitted_at(rc.now));
    return;
  }
  const int64_t at = rc.now + st.retry_after_ms;
  REQUIRE_FALSE(admitted_at(rc.now));
  REQUIRE_FALSE(admitted_at(at - 1));
  REQUIRE(admitted_at(at));
  // Waiting never hurts (no hits arrive): the estimate does not rise, so the answer stays yes.
  REQUIRE(admitted_at(at + 1));
  REQUIRE(admitted_at(at + spec.bucket_ms));
  // Nothing in between is admitted either.
  REQUIRE_FALSE(admitted_at(rc.now + st.retry_after_ms / 2));
  REQUIRE_FALSE(admitted_at(rc.now + st.retry_after_ms - st.retry_after_ms / 4 - 1));
}

}  // namespace

TEST_CASE("retry_after_ms is exact: denied 1 ms before it, admitted at it (random rings)") {
  // Specs: 1 s in one bucket, 1 min in one bucket, 1 h in 60, 10 s at 1 s, 1 s at 10 ms, 90 s in
  // one bucket; then the current defaults of 1 min (6 s buckets) and 90 s (9 s buckets).
  const WindowSpec specs[] = {make_spec(1 * kSec, kSec), make_spec(1 * kMin, kMin),
                              make_spec(1 * kHour),      make_spec(10 * kSec, 1 * kSec),
                              make_spec(1 * kSec, 10),   make_spec(90 * kSec, 90 * kSec),
                              make_spec(1 * kMin),       make_spec(90 * kSec)};
  std::mt19937_64 rng(20240601);
  int delayed = 0;     // cases with 0 < retry_after < kNever, so the interesting branch ran
  int mid_bucket = 0;  // ... of which the weighted ones whose answer falls inside a bucket
  for (const WindowSpec& spec : specs) {
    REQUIRE(validate(spec).ok());
    const int iterations = spec.buckets() > 20 ? 400 : 1500;
    for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
      for (int i = 0; i < iterations; ++i) {
        const RandomCase rc = random_case(rng, spec, est);
        check_random_case(rc);
        const LimitState st =
            limit_state(RingView{rc.own, rc.others, rc.head}, spec, est, rc.now, rc.hits, rc.limit);
        if (st.retry_after_ms != 0 && st.retry_after_ms != kNever) {
          ++delayed;
          if ((rc.now + st.retry_after_ms) % spec.bucket_ms != 0) ++mid_bucket;
        }
      }
    }
  }
  CHECK(delayed > 2'000);
  CHECK(mid_bucket > 500);
}

// ------------------------------------------------------------------------------------------------
// Ring maintenance
// ------------------------------------------------------------------------------------------------

TEST_CASE("advance zeroes exactly the buckets that fall out of the ring") {
  // Ring of 4 holding buckets 8..11 (slots 0..3), with a peer's counts alongside.
  std::vector<uint32_t> own = {1, 2, 3, 4};
  std::vector<uint32_t> others = {10, 20, 30, 40};
  CHECK(advance(own, others, 11, 13) == 13);  // buckets 12 and 13 reuse the slots of 8 and 9
  CHECK(own == std::vector<uint32_t>{0, 0, 3, 4});
  CHECK(others == std::vector<uint32_t>{0, 0, 30, 40});
  const RingView v{own, others, 13};
  CHECK(v.count(10) == 33);
  CHECK(v.count(11) == 44);
  CHECK(v.count(12) == 0);
  CHECK(v.count(13) == 0);

  // One step short of a full turn keeps only the old head's slot.
  std::vector<uint32_t> a = {1, 2, 3, 4};
  CHECK(advance(a, {}, 11, 14) == 14);
  CHECK(a == std::vector<uint32_t>{0, 0, 0, 4});

  // Negative bucket numbers: buckets -4..-1 sit in slots 0..3.
  std::vector<uint32_t> neg = {1, 2, 3, 4};
  CHECK(advance(neg, {}, -1, 1) == 1);  // zeroes buckets 0 and 1: slots 0 and 1
  CHECK(neg == std::vector<uint32_t>{0, 0, 3, 4});
}

TEST_CASE("advance by a ring size or more clears everything") {
  for (int64_t jump : {int64_t{4}, int64_t{5}, int64_t{1'000}, int64_t{1} << 40}) {
    CAPTURE(jump);
    std::vector<uint32_t> own = {1, 2, 3, 4};
    std::vector<uint32_t> others = {5, 6, 7, 8};
    CHECK(advance(own, others, 11, 11 + jump) == 11 + jump);
    CHECK(own == std::vector<uint32_t>(4, 0u));
    CHECK(others == std::vector<uint32_t>(4, 0u));
  }
  // From a head far in the past (a never-written ring) to today.
  std::vector<uint32_t> own = {1, 2, 3, 4};
  const int64_t today = bucket_of(kHourStart, kMin);
  CHECK(advance(own, {}, std::numeric_limits<int64_t>::min() / 2, today) == today);
  CHECK(own == std::vector<uint32_t>(4, 0u));
}

TEST_CASE("advance to the head or an older bucket changes nothing") {
  std::vector<uint32_t> own = {1, 2, 3, 4};
  std::vector<uint32_t> others = {5, 6, 7, 8};
  CHECK(advance(own, others, 11, 11) == 11);
  CHECK(advance(own, others, 11, 9) == 11);
  CHECK(advance(own, others, 11, -100) == 11);
  CHECK(own == std::vector<uint32_t>{1, 2, 3, 4});
  CHECK(others == std::vector<uint32_t>{5, 6, 7, 8});
}

TEST_CASE("add counts into the bucket's slot, also for negative buckets") {
  std::vector<uint32_t> counts(4, 0u);
  sluice::window::add(counts, 13, 5);  // slot 1
  sluice::window::add(counts, -1, 7);  // slot 3
  sluice::window::add(counts, -4, 2);  // slot 0
  sluice::window::add(counts, 13, 0);
  CHECK(counts == std::vector<uint32_t>{2, 5, 0, 7});
}

TEST_CASE("add saturates at UINT32_MAX") {
  std::vector<uint32_t> counts = {kU32Max - 2, 0};
  sluice::window::add(counts, 0, 1);
  CHECK(counts[0] == kU32Max - 1);
  sluice::window::add(counts, 0, 5);
  CHECK(counts[0] == kU32Max);
  sluice::window::add(counts, 0, 1);
  CHECK(counts[0] == kU32Max);
  sluice::window::add(counts, 1, uint64_t{1} << 40);
  CHECK(counts[1] == kU32Max);
}

TEST_CASE("add saturates at UINT32_MAX even for a cost near UINT64_MAX") {
  // A huge cost counted anyway (a rule that counts denied hits) must not wrap the counter back
  // to a small number, which would reopen the window.
  std::vector<uint32_t> counts = {5, kU32Max};
  sluice::window::add(counts, 0, kU64Max - 2);
  CHECK(counts[0] == kU32Max);
  sluice::window::add(counts, 1, kU64Max);
  CHECK(counts[1] == kU32Max);
}

TEST_CASE("expired is true once every bucket the ring holds has left the window") {
  const WindowSpec minute = make_spec(1 * kMin, kMin);  // ring of 2
  const int64_t h = bucket_of(kHourStart, kMin);
  CHECK_FALSE(expired(h, minute, h * kMin));
  CHECK_FALSE(expired(h, minute, (h + 1) * kMin));      // h straddles, weighted 1
  CHECK_FALSE(expired(h, minute, (h + 2) * kMin - 1));  // h straddles, weighted 1/B
  CHECK(expired(h, minute, (h + 2) * kMin));
  CHECK(expired(h, minute, (h + 1'000) * kMin));
  CHECK_FALSE(expired(h, minute, (h - 5) * kMin));  // a clock behind the head

  const WindowSpec hour = make_spec(1 * kHour);  // ring of 61
  CHECK_FALSE(expired(h, hour, (h + 61) * kMin - 1));
  CHECK(expired(h, hour, (h + 61) * kMin));

  // Before the epoch too.
  CHECK_FALSE(expired(-3, minute, -2 * kMin + 1));
  CHECK(expired(-3, minute, -1 * kMin));

  // Dropping an expired ring changes no decision: the estimate over it is zero.
  TestRing ring(hour, h);
  ring.put(h, 1'000);
  for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
    CHECK(estimate(ring.view(), hour, est, (h + 61) * kMin) == 0.0);
    CHECK(estimate(ring.view(), hour, est, (h + 61) * kMin - 1) > 0.0);
  }
}

// ------------------------------------------------------------------------------------------------
// SlidingWindow
// ------------------------------------------------------------------------------------------------

TEST_CASE("SlidingWindow admits exactly `limit` hits of a burst and then what the window frees") {
  for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
    CAPTURE(to_string(est));
    SlidingWindow sw(make_spec(1 * kMin, kMin), est);
    const int64_t t0 = kHourStart + 10 * kSec;
    int admitted = 0;
    for (int i = 0; i < 150; ++i)
      admitted += sw.try_acquire(t0, 1, 100) ? 1 : 0;
    CHECK(admitted == 100);
    CHECK(sw.estimate(t0) == 100.0);
    // Half into the next minute: weighted has freed 50, strict nothing.
    const int64_t t1 = kHourStart + kMin + 30 * kSec;
    admitted = 0;
    for (int i = 0; i < 150; ++i)
      admitted += sw.try_acquire(t1, 1, 100) ? 1 : 0;
    CHECK(admitted == (est == Estimator::kWeighted ? 50 : 0));
    // Two minutes on, the burst has left entirely.
    const int64_t t2 = kHourStart + 2 * kMin;
    admitted = 0;
    for (int i = 0; i < 150; ++i)
      admitted += sw.try_acquire(t2, 1, 100) ? 1 : 0;
    CHECK(admitted == (est == Estimator::kWeighted ? 50 : 100));
  }
}

TEST_CASE("SlidingWindow with a multi-hit cost admits only costs that fit whole") {
  SlidingWindow sw(make_spec(10 * kSec, 1 * kSec), Estimator::kWeighted);
  const int64_t t = kHourStart;
  CHECK(sw.try_acquire(t, 7, 10));
  CHECK_FALSE(sw.try_acquire(t, 4, 10));
  CHECK(sw.try_acquire(t, 3, 10));
  CHECK_FALSE(sw.try_acquire(t, 1, 10));
  CHECK(sw.try_acquire(t, 11, 1'000'000));  // the same 11 fit under a larger limit
  CHECK(sw.estimate(t) == 21.0);
}

TEST_CASE("SlidingWindow count_denied counts denied hits against the window") {
  SlidingWindow counted(make_spec(1 * kMin, kMin), Estimator::kWeighted);
  SlidingWindow free_denials(make_spec(1 * kMin, kMin), Estimator::kWeighted);
  const int64_t t = kHourStart + 5 * kSec;
  int admitted = 0;
  for (int i = 0; i < 15; ++i) {
    admitted += counted.try_acquire(t, 1, 10, /*count_denied=*/true) ? 1 : 0;
    free_denials.try_acquire(t, 1, 10);
  }
  CHECK(admitted == 10);
  CHECK(counted.estimate(t) == 15.0);
  CHECK(free_denials.estimate(t) == 10.0);
  // The denied hits keep the counting window shut longer: half into the next minute the
  // estimate is 7.5 (room for 2) against 5 (room for 5).
  const int64_t half = kHourStart + kMin + 30 * kSec;
  CHECK(counted.state(half, 1, 10).remaining == 2);
  CHECK(free_denials.state(half, 1, 10).remaining == 5);
}

TEST_CASE("SlidingWindow clamps a clock that runs behind to the head bucket") {
  const WindowSpec spec = make_spec(1 * kMin, kMin);
  SlidingWindow sw(spec, Estimator::kWeighted);
  const int64_t c = bucket_of(kHourStart, kMin);
  sw.add(c * kMin + 5 * kSec, 3);
  // A caller one minute behind counts into the head bucket, not into the straddler's slot.
  sw.add((c - 1) * kMin + 10 * kSec, 2);
  CHECK(sw.estimate(c * kMin + 30 * kSec) == 5.0);
  // Evaluating at a lagging time is evaluating at the head's start.
  CHECK(sw.estimate((c - 1) * kMin) == sw.estimate(c * kMin));
  CHECK(sw.estimate((c - 100) * kMin) == 5.0);
  CHECK(effective_now((c - 1) * kMin, c, kMin) == c * kMin);
  CHECK(effective_now(c * kMin + 7, c, kMin) == c * kMin + 7);
  // A lagging try_acquire is judged at the head's start too.
  CHECK(sw.try_acquire((c - 3) * kMin, 5, 10));
  CHECK_FALSE(sw.try_acquire((c - 3) * kMin, 1, 10));
  CHECK(sw.estimate(c * kMin) == 10.0);
}

TEST_CASE("SlidingWindow estimate and state match the free functions over the same ring") {
  for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
    CAPTURE(to_string(est));
    const WindowSpec spec = make_spec(1 * kMin, kMin);
    SlidingWindow sw(spec, est);
    const int64_t m22 = bucket_of(kHourStart + 22 * kMin, kMin);
    sw.add(m22 * kMin + 1, 400);
    sw.add((m22 + 1) * kMin + 1, 250);
    TestRing ring(spec, m22);
    ring.put(m22, 400).put(m22 + 1, 250);
    const int64_t now = kHourStart + 23 * kMin + 45 * kSec;
    CHECK(sw.estimate(now) == (est == Estimator::kWeighted ? 350.0 : 650.0));
    CHECK(sw.estimate(now) == estimate(ring.view(), spec, est, now));
    const LimitState a = sw.state(now, 60, 400);
    const LimitState b = limit_state(ring.view(), spec, est, now, 60, 400);
    CHECK(a.remaining == b.remaining);
    CHECK(a.reset_ms == b.reset_ms);
    CHECK(a.retry_after_ms == b.retry_after_ms);
    CHECK(a.reset_ms == (m22 + 3) * kMin - now);
    CHECK(sw.spec() == spec);
  }
}

TEST_CASE("SlidingWindow: a fresh window is empty and admits up to the limit at once") {
  for (Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
    SlidingWindow sw(make_spec(1 * kHour), est);
    CHECK(sw.estimate(kHourStart) == 0.0);
    const LimitState st = sw.state(kHourStart, 5, 5);
    CHECK(st.remaining == 5);
    CHECK(st.reset_ms == 0);
    CHECK(st.retry_after_ms == 0);
    CHECK(sw.try_acquire(kHourStart, 5, 5));
  }
}

TEST_CASE("SlidingWindow works with times before the epoch") {
  // bucket_of is defined for negative times; a window driven by a test clock starting below 0
  // must count in the right buckets: a hit at -1:30 lies in [-2:00, -1:00), which straddles the
  // window ending at -0:30 with half of it inside.
  SlidingWindow sw(make_spec(1 * kMin, kMin), Estimator::kWeighted);
  sw.add(-90 * kSec, 2);
  CHECK(sw.estimate(-90 * kSec) == 2.0);
  CHECK(sw.estimate(-30 * kSec) == 1.0);
  CHECK(sw.estimate(0) == 0.0);
}

TEST_CASE("strict SlidingWindow never admits more than the limit in any true window") {
  // The guarantee of the strict estimator, checked against an exact log of admitted hits.
  std::mt19937_64 rng(99);
  for (const WindowSpec spec :
       {make_spec(1 * kSec, kSec), make_spec(1 * kMin, kMin), make_spec(10 * kSec, 1 * kSec),
        make_spec(1 * kSec), make_spec(1 * kMin)}) {  // one-bucket; then the current defaults
    SlidingWindow sw(spec, Estimator::kStrict);
    const uint64_t limit = 20;
    std::vector<int64_t> log;
    int64_t t = kHourStart;
    for (int i = 0; i < 3'000; ++i) {
      t += static_cast<int64_t>(rng() % static_cast<uint64_t>(spec.window_ms / 8 + 1));
      const uint64_t hits = rng() % 3 + 1;
      if (sw.try_acquire(t, hits, limit)) log.insert(log.end(), hits, t);
    }
    REQUIRE(log.size() > 100);
    for (size_t i = 0; i < log.size(); ++i) {
      // Admitted hits in (log[i] - W, log[i]].
      const auto first = std::upper_bound(log.begin(), log.end(), log[i] - spec.window_ms);
      const auto last = std::upper_bound(log.begin(), log.end(), log[i]);
      CAPTURE(log[i]);
      REQUIRE(static_cast<uint64_t>(last - first) <= limit);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Large numbers
// ------------------------------------------------------------------------------------------------

TEST_CASE(
    "a limit near 2^40 with a one-day bucket decides exactly (scaled counts exceed 64 bits)") {
  const WindowSpec spec = make_spec(kDay, kDay);
  REQUIRE(validate(spec).ok());
  REQUIRE(spec.buckets() == 1);
  const int64_t d = bucket_of(kHourStart, kDay);
  std::vector<uint32_t> own(spec.ring_size(), 0u);
  std::vector<uint32_t> others(spec.ring_size(), 0u);
  sluice::window::add(own, d - 1, kU32Max - 1);  // straddler, counted half at midday
  sluice::window::add(others, d - 1, kU32Max - 1);
  sluice::window::add(own, d, 7);
  const RingView v{own, others, d};
  const int64_t midday = d * kDay + kDay / 2;
  const uint64_t used = 7 + (uint64_t{kU32Max} - 1);  // 7 + 2 * (2^32 - 2) / 2
  const uint64_t limit = (uint64_t{1} << 40) + 12'345;
  const uint64_t room = limit - used;
  // limit * bucket_ms is about 9.5e22, beyond 64 bits.
  {
    const Estimator est = Estimator::kWeighted;
    CHECK(estimate(v, spec, est, midday) == static_cast<double>(used));
    CHECK(admits(v, spec, est, midday, room, limit));
    CHECK_FALSE(admits(v, spec, est, midday, room + 1, limit));
    const LimitState st = limit_state(v, spec, est, midday, room + 1, limit);
    CHECK(st.remaining == room);
    // One more fits once the straddler's weight has dropped by one hit's worth: 1 ms later.
    CHECK(st.retry_after_ms == 1);
    CHECK_FALSE(admits(v, spec, est, midday + st.retry_after_ms - 1, room + 1, limit));
    CHECK(admits(v, spec, est, midday + st.retry_after_ms, room + 1, limit));
    CHECK(st.reset_ms == (d + 2) * kDay - midday);
    CHECK(limit_state(v, spec, est, midday, limit, limit).retry_after_ms == 3 * kDay / 2);
  }
  const uint64_t strict_used = 7 + 2 * uint64_t{kU32Max - 1};
  CHECK(admits(v, spec, Estimator::kStrict, midday, limit - strict_used, limit));
  CHECK_FALSE(admits(v, spec, Estimator::kStrict, midday, limit - strict_used + 1, limit));
  CHECK(limit_state(v, spec, Estimator::kStrict, midday, 1, limit).remaining ==
        limit - strict_used);
  // The largest limits do not overflow either.
  CHECK(admits(v, spec, Estimator::kStrict, midday, kU64Max - strict_used, kU64Max));
  CHECK_FALSE(admits(v, spec, Estimator::kStrict, midday, kU64Max - strict_used + 1, kU64Max));
  CHECK(limit_state(v, spec, Estimator::kStrict, midday, 1, kU64Max).remaining ==
        kU64Max - strict_used);
}

TEST_CASE("default_bucket_ms cuts windows under ten minutes into ten buckets or more") {
  CHECK(default_bucket_ms(1 * kSec) == 100);
  CHECK(default_bucket_ms(10 * kSec) == 1 * kSec);
  CHECK(default_bucket_ms(30 * kSec) == 3 * kSec);
  CHECK(default_bucket_ms(90 * kSec) == 9 * kSec);
  CHECK(default_bucket_ms(1 * kMin) == 6 * kSec);
  CHECK(default_bucket_ms(5 * kMin) == 30 * kSec);
  CHECK(default_bucket_ms(1'001) == 91);  // 11 buckets: the fewest, at least 10, that divide it
  CHECK(default_bucket_ms(10 * kMin) == kMin);  // already ten: the older default
  CHECK(default_bucket_ms(1 * kHour) == kMin);
  CHECK(default_bucket_ms(1 * kDay) == kMin);
  CHECK(default_bucket_ms(7 * kDay) == kHour);
  for (int64_t w = kMinWindowMs; w <= 12 * kMin; w += 997) {
    CAPTURE(w);
    const WindowSpec s = make_spec(w);
    CHECK(validate(s).ok());
    CHECK((s.buckets() >= kDefaultBuckets || s.bucket_ms == legacy_default_bucket_ms(w)));
  }
}

TEST_CASE("weighted: a client timing bursts at bucket edges gets at most (1 + 1/n) x the limit") {
  // Closed loop, as sluice-bench-edges: from a moment in the first bucket, send hits while they
  // are admitted, every millisecond (after the whole limit at once when the start is a bucket's
  // last millisecond); then the most any true window (t - W, t] holds.
  const uint64_t limit = 100;
  for (const WindowSpec spec : {make_spec(1 * kSec), make_spec(1 * kMin), make_spec(10 * kSec),
                                make_spec(1 * kSec, 250), make_spec(1 * kSec, 1 * kSec)}) {
    const uint64_t n = spec.buckets();
    // One bucket: the floor is the whole limit, and the bound is 2x.
    const uint64_t bound = limit + limit / n;
    for (int64_t phase : {int64_t{0}, spec.bucket_ms / 2, spec.bucket_ms - 1}) {
      CAPTURE(spec.window_ms);
      CAPTURE(spec.bucket_ms);
      CAPTURE(phase);
      SlidingWindow sw(spec, Estimator::kWeighted);
      std::deque<std::pair<int64_t, uint64_t>> in_window;
      uint64_t held = 0, most = 0;
      const int64_t start = kHourStart + phase;
      for (int64_t t = start; t < start + 4 * spec.window_ms; ++t) {
        while (!in_window.empty() && in_window.front().first <= t - spec.window_ms) {
          held -= in_window.front().second;
          in_window.pop_front();
        }
        uint64_t sent = 0;
        while (sent < limit && sw.try_acquire(t, 1, limit))
          ++sent;
        if (sent > 0) in_window.emplace_back(t, sent);
        held += sent;
        most = std::max(most, held);
      }
      CHECK(most <= bound);
      // A burst at a bucket's end comes near the bound (at its start the weighting is right).
      if (n >= 10 && phase == spec.bucket_ms - 1) CHECK(most > limit);
    }
  }
}
