// sluice-bench-accuracy: wrongly allowed and wrongly denied requests of the engine against an
// exact sliding log (the goals in docs/benchmarks.md; the Cloudflare figure to beat is 0.003% of
// requests wrongly decided).
//
// For each trace x window x estimator (x granularity) it builds a one-rule policy in code, replays
// the trace through Engine::check in time order and judges every decision with SHARED HISTORY:
// the reference log of a key holds exactly the requests the engine admitted, so before each
// request it says what an exact limiter would decide given the same past. Judging against an
// independent exact limiter instead would let one early disagreement shift both histories apart
// and be counted again and again.
//
//   wrongly allowed: engine allowed, exact would deny (ref.count(t) + hits > limit)
//   wrongly denied:  engine denied, exact would allow
//
// Two ways of counting, one row each (--counting):
//   admitted  the rule counts only admitted requests (count_denied: false, Sluice's default), and
//             the reference log holds what the engine admitted;
//   all       the rule counts every request (count_denied: true), and the reference log holds the
//             whole trace. This is how Cloudflare measured its 0.003%: the rate of a source is the
//             rate of everything it sends, so the history does not depend on the decisions.
//
// Both are percentages of all requests in the row. avg_rate_error_pct (window rows; null for gcra
// rows) is how far the limiter's estimate of a key's count is from the true count, as Cloudflare
// reported it (6% on its traffic): at every check whose key has a true count c > 0 in the window
// (now - W, now] just before the request (ref.count(t) from the exact log, i.e. over the history
// the rule counts: admitted requests, or every request with counting "all"), the estimate e is
// the weighted or strict estimate of the same window at the same moment over the same history,
// read before the request is counted, and the row gives the mean of |e - c| / c * 100 over those
// checks (checks of keys with c = 0, such as a key's first request, are left out; null if there
// are none). It is the count the decision compares with the limit (e + hits <= limit), not the
// count after the request. The estimate comes from a window::SlidingWindow per key with the
// rule's spec and estimator, fed by its own try_acquire (count_denied as the rule): the engine
// runs the same window code, so the two must decide alike; if they do not, the program names the
// first such request and fails (exit 1) after the rows. Every row also gives allowed_pct and the
// seconds its replay took.
//
// max_window_over_limit is the largest number of hits the engine admitted into any true window
// (now - W, now] of any key, over the limit: above 1 means the limit was exceeded somewhere (never
// for strict).
//
// The cloudflare trace (tests/support/traces.h: 270,000 sources, 0.1% of them abusive at 2x to
// 20x, the rest far below their limit) is replayed with a limit of 100 in every window case (so
// 100/1s, 100/1m, 100/1h) over 40 windows (--windows overrides): with the usual 600/1m and
// 3600/1h its 270 abusive sources alone would send millions of requests per window. Its rows give
// "limit"; how many sources sent requests and the abusive share go to stderr. The default window
// count makes each row ~1.5M requests.
//
// Reading the figures: when a key is over its limit rate (steady-1x/2x, the few hot keys of
// mixed) nearly every decision is marginal, so a limiter off by a fraction of one request or a
// few ms disagrees with the exact log on many of them: such rows say how a limiter shapes
// overload. The Cloudflare figure is about traffic mostly well below its limits
// (docs/benchmarks.md).
//
// GCRA rows (--mode gcra): the rule's limit is parse_gcra("<L>/<W>", burst, ...) with L the
// window case's limit (100/1s, 600/1m, 3600/1h) and burst = max(1, L/10), bucket_ms 0. They are
// judged, with shared history as above, against an independent exact token bucket per key
// (GcraReference below; it calls nothing in window/gcra.h): integers in nanoseconds, interval =
// W * 1e6 / L rounded down, tokens scaled by the interval and capped at burst * interval, full
// at a key's first request, refilled by the ns elapsed since the key's previous request; h hits
// are admitted iff tokens >= h * interval. Counting:
//   admitted  the bucket takes h * interval for what the engine admitted;
//   all       (count_denied) it takes them for every request, admitted or not, and may go into
//             debt (tokens below 0; the engine's arrival time then runs ahead of now by more
//             than the burst), as the window rows' log holds the whole trace.
// The engine decides GCRA exactly, so every gcra row must show 0 wrong decisions. A token
// bucket admits at most burst + L hits into any true window (t - W, t], so gcra rows also give
// gcra_bound = (burst + L) / L, and the program fails (exit 1) if max_window_over_limit of a
// gcra row exceeds it.
//
// Concurrency rows (--mode concurrency, trace "leases"): a concurrency limit
// (parse_concurrency(M, lease_ttl, granularity)) on 3 keys, judged operation by operation with
// shared history against the exact reference model (tests/support/concurrency_reference.h,
// written from the contract, sharing no code with lib/window/concurrency.*). The operations are
// randomized lease traces (tests/support/concurrency_trace.h): checks of mostly 1 hit (some 0,
// 2..M and M + 1) at 0.5x to 4x of what keeps M leases busy, releases within the ttl, clients
// that crash (their leases must expire at E = (floor(t/B) + n + 1) * B, probed at E - 1 and E),
// releases at E - 1, E and around it, second releases, releases with another key's entries, long
// after E, and forged ids; --lease-ops operations per row (default 100,000), --seed names them.
// Engine::sweep runs every second of the trace's time, as the daemon's sweep timer does.
// One row per (M, lease_ttl, granularity) case of kLeaseCases and counting ("all" sets
// count_denied, which must change nothing). Their figures:
//   requests             every operation sent: checks and releases; allowed_pct is checks
//                        admitted plus releases answered ok, over all operations;
//   wrongly_allowed_pct  checks admitted that the reference denies, of all operations;
//   wrongly_denied_pct   checks denied that the reference admits;
//   wrong_other_pct      the other wrong answers: a release answered with another code than the
//                        reference's (lease_expired, lease_released, lease_unknown or ok), an
//                        admitted check without a lease or with an id unlike the contract's
//                        (floor(E / 1000) in the high 32 bits, new for its key), a lease on a
//                        denied check or a check of 0 hits, an error on a check;
//   max_window_over_limit  the most hits any key held in leases at once, as the reference counts
//                        the leases the engine granted, over M (above 1: the limit was exceeded);
//   avg_rate_error_pct   null, as for gcra rows: a concurrency limit counts leases exactly and
//                        estimates nothing.
// The contract is exact, so any wrong answer fails the program (exit 1) after the rows, with the
// first one described and the smallest trace found that still shows one. `remaining` and
// `exceeded` of the limit are compared too (remaining_mismatches in the JSON) but only warned
// about: the contract does not fix them. --trace, --window and --granularity do not select
// among these rows, except that --trace without "leases" leaves them out.
//
// Build Release. --trace cloudflare alone (18 rows at the default granularity, ~0.55 GB peak RSS
// in its counting "all" rows) takes about half a minute on one core; the default run includes it.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_rows.h"
#include "common/scenario.h"
#include "concurrency_reference.h"
#include "concurrency_trace.h"
#include "engine/engine.h"
#include "exact_log.h"
#include "one_rule_policy.h"
#include "rules/rules.h"
#include "traces.h"
#include "window/sliding_window.h"

namespace {

using sluice::engine::BatchResult;
using sluice::engine::Engine;
using sluice::engine::EngineOptions;
using sluice::testing::Event;
using sluice::testing::ExactSlidingLog;
using sluice::window::Estimator;
namespace rules = sluice::rules;
namespace window = sluice::window;
namespace testing = sluice::testing;

struct WindowCase {
  const char* label;
  int64_t window_ms;
  uint64_t limit;
  int64_t windows;  // default trace duration: fewer long windows keep the run short
};

// Limits give every trace enough requests per window that one request is a small step (1% of the
// limit or less), so the percentages measure the estimator, not rounding.
constexpr WindowCase kWindows[] = {
    {"1s", 1'000, 100, 1'000},
    {"1m", 60'000, 600, 200},
    {"1h", 3'600'000, 3'600, 48},
};

// The cloudflare trace's case: the window's label and length, this limit and duration.
constexpr uint64_t kCloudflareLimit = 100;
constexpr int64_t kCloudflareWindows = 40;

WindowCase case_for(std::string_view trace, const WindowCase& wc) {
  if (trace != "cloudflare") return wc;
  return {wc.label, wc.window_ms, kCloudflareLimit, kCloudflareWindows};
}

constexpr size_t kMaxBatch = 64;

// The concurrency rows' trace name, and their cases: M, lease_ttl and granularity (0 = default).
constexpr std::string_view kLeaseTrace = "leases";
struct LeaseCase {
  uint64_t max_in_flight;
  int64_t lease_ttl_ms;
  int64_t bucket_ms;
};
constexpr LeaseCase kLeaseCases[] = {
    {1, 1'000, 0},         // one at a time; 100 ms buckets
    {4, 1'005, 0},         // 1005 / 10 is not whole: B = ttl, n = 1, E off whole seconds
    {10, 30'000, 0},       // the default 3 s buckets
    {10, 30'000, 30'000},  // n = 1: an unreleased lease lasts up to 2 ttl
    {25, 2'500, 0},        // 250 ms buckets, E off whole seconds
    {100, 10'000, 250},    // 40 buckets
    {3, 60'000, 1'500},    // 40 buckets of 1.5 s
};

struct Options {
  bool json = false;
  std::vector<std::string> traces;            // empty = all
  std::vector<std::string> windows;           // empty = all
  std::vector<std::string> modes;             // empty = all: weighted, strict, gcra, concurrency
  std::vector<std::string> countings;         // empty = both: "admitted", "all"
  std::vector<uint32_t> granularities = {0};  // 0 = the window's default bucket, else 1/N
  uint64_t seed = 1;
  int64_t windows_override = 0;
  size_t max_events = 2'000'000;
  size_t lease_ops = 100'000;  // operations per concurrency row
};

// One row's figures; row_json() prints them.
struct Row {
  std::string trace;
  std::string window_label;
  int64_t window_ms = 0;
  std::string mode;        // weighted, strict, gcra or concurrency
  bool count_all = false;  // counting "all" (count_denied) rather than "admitted"
  int64_t bucket_ms = 0;   // 0 for gcra rows
  uint64_t limit = 0;
  uint64_t requests = 0;
  uint64_t allowed = 0;
  uint64_t wrongly_allowed = 0;
  uint64_t wrongly_denied = 0;
  uint64_t errors = 0;
  double max_window_over_limit = 0;
  std::optional<double> avg_rate_error_pct;  // window rows that judged a counted key only
  sluice::bench::Row extra = sluice::bench::Row::object();  // the gcra or concurrency fields
  std::string failure;  // why the row fails the program (exit 1), "" when it is sound

  std::string name() const {
    return trace + " " + window_label + " " + mode + " " + (count_all ? "all" : "admitted");
  }
};

double pct(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

bool contains(const std::vector<std::string>& v, std::string_view s) {
  if (v.empty()) return true;
  for (const auto& x : v) {
    if (x == s) return true;
  }
  return false;
}

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse_args(int argc, char** argv, Options& o) {
  sluice::bench::Cli cli("sluice-bench-accuracy");
  std::vector<std::string> granularities;
  cli.app()
      .add_option("--trace", o.traces,
                  "traces, NAME[,..]: steady-0.5x steady-1x steady-2x on-off edge-burst mixed "
                  "cloudflare leases (default: all)")
      ->delimiter(',')
      ->check([](const std::string& t) {
        return testing::is_trace_name(t) || t == kLeaseTrace ? "" : "unknown trace " + t;
      });
  cli.words("--window", o.windows, {"1s", "1m", "1h"}, "windows, 1s|1m|1h[,..] (default: all)");
  cli.words("--mode", o.modes, {"weighted", "strict", "gcra", "concurrency"},
            "modes, weighted|strict|gcra|concurrency[,..] (default: all)");
  cli.words("--counting", o.countings, {"admitted", "all"},
            "what a denied hit counts, admitted|all[,..] (default: both)");
  cli.app().add_option("--seed", o.seed, "seed of the traces");
  cli.number("--windows", o.windows_override, 1, 1e15, "windows per trace instead of its own");
  cli.number("--max-events", o.max_events, 0, 1e15, "events per trace at most");
  cli.number("--lease-ops", o.lease_ops, 1, 1e15, "operations per concurrency row");
  cli.app()
      .add_option("--granularity", granularities, "buckets, default|1/N[,..] (default)")
      ->delimiter(',')
      ->check([](const std::string& g) {
        const unsigned long n = g.starts_with("1/") ? std::strtoul(g.c_str() + 2, nullptr, 10) : 0;
        return g == "default" || (n >= 1 && n <= window::kMaxBuckets)
                   ? ""
                   : "--granularity takes default or 1/N, 1 <= N <= 1440";
      });
  const std::optional<int> exit = cli.parse(argc, argv);
  o.json = cli.json;
  if (!granularities.empty()) o.granularities.clear();
  for (const std::string& g : granularities)
    o.granularities.push_back(
        g == "default" ? 0 : static_cast<uint32_t>(std::strtoul(g.c_str() + 2, nullptr, 10)));
  return exit;
}

EngineOptions engine_options() {
  EngineOptions opts;
  opts.memory_cap_bytes = 1ull << 30;
  return opts;
}

std::shared_ptr<const rules::Policy> make_policy(const window::WindowSpec& spec, uint64_t limit,
                                                 Estimator est, bool count_all, uint64_t seed) {
  return testing::one_rule_policy({"bench", "r", "k", limit, spec, est, count_all}, seed);
}

// Replays `trace` through `engine` (a policy of one rule keyed by "k" in domain "bench") and
// judges every decision by `judge`: judge.allows(e) says what the exact reference decides for
// event e given the history so far, judge.record(e, allowed) then feeds it what it must count.
// Fills the counts of `row`.
template <typename Judge>
void replay_trace(Engine& engine, const std::vector<Event>& trace, uint32_t keys, Row& row,
                  Judge& judge) {
  std::vector<std::string> values(keys);
  for (uint32_t k = 0; k < keys; ++k)
    values[k] = std::to_string(k);
  std::vector<rules::Descriptor> descs(kMaxBatch);
  std::vector<rules::CheckRequest> batch(kMaxBatch);
  BatchResult out;
  // Requests of one millisecond go in one batch (up to kMaxBatch): the engine decides a batch in
  // order, each request seeing the hits of the earlier ones, and the reference is walked in the
  // same order below, so batching changes no decision.
  for (size_t i = 0; i < trace.size();) {
    const int64_t now = trace[i].t_ms;
    size_t n = 0;
    while (i + n < trace.size() && n < kMaxBatch && trace[i + n].t_ms == now) {
      const Event& e = trace[i + n];
      descs[n] = {"k", values[e.key]};
      batch[n] = {"bench", {&descs[n], 1}, e.hits};
      ++n;
    }
    engine.check({batch.data(), n}, now, out);
    for (size_t j = 0; j < n; ++j) {
      const Event& e = trace[i + j];
      const auto& d = out.decisions[j];
      ++row.requests;
      if (d.error != rules::CheckError::kNone) {
        ++row.errors;
        continue;
      }
      const bool exact_allows = judge.allows(e);
      if (d.allowed && !exact_allows) ++row.wrongly_allowed;
      if (!d.allowed && exact_allows) ++row.wrongly_denied;
      if (d.allowed) ++row.allowed;
      judge.record(e, d.allowed);
    }
    i += n;
  }
}

void warn_after(const Engine& engine, const Row& row) {
  if (const uint64_t evicted = engine.stats().evicted_live; evicted != 0) {
    std::fprintf(stderr,
                 "warning: %s: engine evicted %" PRIu64
                 " live counters; the row is not a pure accuracy figure\n",
                 row.name().c_str(), evicted);
  }
  if (row.errors != 0) {
    std::fprintf(stderr, "warning: %s: %" PRIu64 " requests were rejected with an error\n",
                 row.name().c_str(), row.errors);
  }
}

// A row of `trace` in window case `wc`, its counts still to be filled.
Row new_row(std::string_view trace, const WindowCase& wc, std::string mode, bool count_all,
            int64_t bucket_ms) {
  Row row;
  row.trace = std::string(trace);
  row.window_label = wc.label;
  row.window_ms = wc.window_ms;
  row.mode = std::move(mode);
  row.count_all = count_all;
  row.bucket_ms = bucket_ms;
  row.limit = wc.limit;
  return row;
}

// The most hits any log holds in one true window, over the limit.
double max_window_over(const std::vector<ExactSlidingLog>& logs, uint64_t limit) {
  uint64_t max_window = 0;
  for (const auto& log : logs)
    max_window = std::max(max_window, log.max_window_count());
  return static_cast<double>(max_window) / static_cast<double>(limit);
}

// Window rows: the reference is an exact sliding log per key.
struct WindowJudge {
  uint64_t limit;
  bool count_all;
  std::vector<ExactSlidingLog> ref;
  // What the engine admitted, for max_window_over_limit (with counting "all" the reference holds
  // every request, admitted or not).
  std::vector<ExactSlidingLog> admitted;
  // The limiter's counter of each key, outside the engine, for its estimate (avg_rate_error_pct).
  std::vector<window::SlidingWindow> mirror;
  std::string where;  // "trace window mode counting", for the first disagreement
  double rate_error_sum = 0;
  uint64_t rate_error_checks = 0;
  uint64_t disagreements = 0;  // requests the mirror decided differently from the engine

  bool allows(const Event& e) {
    const uint64_t exact = ref[e.key].count(e.t_ms);
    if (exact > 0) {
      const double est = mirror[e.key].estimate(e.t_ms);
      const auto c = static_cast<double>(exact);
      rate_error_sum += std::fabs(est - c) / c;
      ++rate_error_checks;
    }
    return exact + e.hits <= limit;
  }
  void record(const Event& e, bool allowed) {
    const bool mirrored = mirror[e.key].try_acquire(e.t_ms, e.hits, limit, count_all);
    if (mirrored != allowed && disagreements++ == 0) {
      std::fprintf(stderr,
                   "error: %s: key %" PRIu32 " t_ms %" PRId64 " hits %" PRIu32
                   ": engine %s, SlidingWindow %s\n",
                   where.c_str(), e.key, e.t_ms, e.hits, allowed ? "allowed" : "denied",
                   mirrored ? "allows" : "denies");
    }
    if (allowed || count_all) ref[e.key].record(e.t_ms, e.hits);
    if (allowed && count_all) admitted[e.key].record(e.t_ms, e.hits);
  }
};

Row replay(std::string_view trace_name, const std::vector<Event>& trace, const WindowCase& wc,
           const window::WindowSpec& spec, Estimator est, bool count_all, uint64_t seed) {
  Row row = new_row(trace_name, wc, std::string(window::to_string(est)), count_all, spec.bucket_ms);
  Engine engine(make_policy(spec, wc.limit, est, count_all, seed), engine_options());
  const uint32_t keys = testing::trace_keys(trace_name);
  WindowJudge judge{
      wc.limit,
      count_all,
      std::vector<ExactSlidingLog>(keys, ExactSlidingLog(wc.window_ms)),
      std::vector<ExactSlidingLog>(count_all ? keys : 0, ExactSlidingLog(wc.window_ms)),
      std::vector<window::SlidingWindow>(keys, window::SlidingWindow(spec, est)),
      row.name()};
  replay_trace(engine, trace, keys, row, judge);
  if (judge.rate_error_checks != 0) {
    row.avg_rate_error_pct =
        100.0 * judge.rate_error_sum / static_cast<double>(judge.rate_error_checks);
  }
  if (judge.disagreements != 0) {
    row.failure = "SlidingWindow decided " + std::to_string(judge.disagreements) +
                  " requests unlike the engine (the first above)";
  }
  row.max_window_over_limit = max_window_over(count_all ? judge.admitted : judge.ref, wc.limit);
  warn_after(engine, row);
  return row;
}

// ---- GCRA rows -------------------------------------------------------------------------------

__extension__ typedef __int128 i128;  // signed: with counting "all" the bucket goes into debt
__extension__ typedef unsigned __int128 u128;

constexpr int64_t kNsPerMs = 1'000'000;

// The exact reference for gcra rows: a token bucket of one key in integer nanoseconds, written
// without window/gcra.h. Tokens are scaled by the interval (one request = interval_ns), so the
// bucket holds burst * interval_ns when full. Products are taken in 128 bits.
class GcraReference {
 public:
  GcraReference(int64_t interval_ns, uint64_t burst)
      : interval_ns_(interval_ns),
        cap_ns_(static_cast<i128>(interval_ns) * static_cast<i128>(burst)),
        tokens_ns_(cap_ns_) {}

  // Refills by the time since the previous request (full before the first).
  void advance(int64_t now_ms) {
    if (seen_) {
      const i128 elapsed = static_cast<i128>(now_ms - last_ms_) * kNsPerMs;
      tokens_ns_ = std::min(cap_ns_, tokens_ns_ + elapsed);
    }
    seen_ = true;
    last_ms_ = now_ms;
  }
  bool admits(uint64_t hits) const { return tokens_ns_ >= cost(hits); }
  void take(uint64_t hits) { tokens_ns_ -= cost(hits); }
  i128 tokens_ns() const { return tokens_ns_; }
  i128 cap_ns() const { return cap_ns_; }

 private:
  i128 cost(uint64_t hits) const {
    return static_cast<i128>(hits) * static_cast<i128>(interval_ns_);
  }

  int64_t interval_ns_;
  i128 cap_ns_;
  i128 tokens_ns_;
  int64_t last_ms_ = 0;
  bool seen_ = false;
};

// A 128-bit value for a message (the ones printed here fit in 64 bits).
long long as_ll(i128 v) {
  return static_cast<long long>(v);
}

struct GcraJudge {
  bool count_all;
  std::vector<GcraReference> ref;
  std::vector<ExactSlidingLog> admitted;  // what the engine admitted, for max_window_over_limit
  std::string where;                      // "trace window counting", for the first disagreement
  bool told = false;
  bool exact = false;  // the reference's decision for the event being judged

  bool allows(const Event& e) {
    GcraReference& b = ref[e.key];
    b.advance(e.t_ms);
    exact = b.admits(e.hits);
    return exact;
  }
  void record(const Event& e, bool allowed) {
    GcraReference& b = ref[e.key];
    if (allowed != exact && !told) {
      told = true;
      std::fprintf(stderr,
                   "gcra disagreement: %s key %" PRIu32 " t_ms %" PRId64 " (trace start + %" PRId64
                   " ms) hits %" PRIu32
                   ": engine %s, reference %s; reference tokens_ns %lld of "
                   "%lld\n",
                   where.c_str(), e.key, e.t_ms, e.t_ms - testing::kTraceStartMs, e.hits,
                   allowed ? "allowed" : "denied", exact ? "allows" : "denies",
                   as_ll(b.tokens_ns()), as_ll(b.cap_ns()));
    }
    if (allowed || count_all) b.take(e.hits);
    if (allowed) admitted[e.key].record(e.t_ms, e.hits);
  }
};

Row replay_gcra(std::string_view trace_name, const std::vector<Event>& trace, const WindowCase& wc,
                bool count_all, uint64_t seed) {
  Row row = new_row(trace_name, wc, "gcra", count_all, 0);
  const uint64_t burst = std::max<uint64_t>(1, wc.limit / 10);
  const std::string rate = std::to_string(wc.limit) + "/" + wc.label;
  const double bound = static_cast<double>(burst + wc.limit) / static_cast<double>(wc.limit);
  row.extra = {{"burst", burst}, {"rate", rate}, {"gcra_bound", bound}};

  rules::Limit lim;
  if (const sluice::Status why = rules::parse_gcra(rate, burst, lim); !why.ok()) {
    std::fprintf(stderr, "error: parse_gcra(%s, %" PRIu64 "): %s\n", rate.c_str(), burst,
                 why.message().c_str());
    std::exit(1);
  }
  lim.name = "r:gcra " + rate + " burst " + std::to_string(burst);
  rules::Rule rule;
  rule.name = "r";
  rule.key = {"k"};
  rule.limits = {lim};
  rule.count_denied = count_all;
  rules::Domain domain;
  domain.name = "bench";
  domain.rules.push_back(std::move(rule));
  rules::RuleSet set;
  set.domains.push_back(std::move(domain));
  Engine engine(rules::Policy::compile(std::move(set), rules::Overrides{}, seed), engine_options());

  // The reference's interval, worked out here: W in ns over L, rounded down.
  const auto interval_ns =
      static_cast<int64_t>(static_cast<u128>(wc.window_ms) * kNsPerMs / wc.limit);
  const uint32_t keys = testing::trace_keys(trace_name);
  GcraJudge judge{count_all, std::vector<GcraReference>(keys, GcraReference(interval_ns, burst)),
                  std::vector<ExactSlidingLog>(keys, ExactSlidingLog(wc.window_ms)), row.name()};
  replay_trace(engine, trace, keys, row, judge);
  row.max_window_over_limit = max_window_over(judge.admitted, wc.limit);
  // GCRA is exact: any decision unlike the token bucket's is a bug, not an estimate's error.
  if (row.wrongly_allowed + row.wrongly_denied != 0) {
    row.failure = std::to_string(row.wrongly_allowed + row.wrongly_denied) +
                  " decisions unlike the token bucket's (the first above)";
  } else if (row.max_window_over_limit > bound) {
    row.failure = "max_window_over_limit over the GCRA bound (burst + L) / L";
  }
  warn_after(engine, row);
  return row;
}

// ---- concurrency rows ------------------------------------------------------------------------

Row replay_concurrency(const LeaseCase& lc, bool count_all, const Options& opt) {
  testing::LeaseTraceParams p;
  p.max_in_flight = lc.max_in_flight;
  p.lease_ttl_ms = lc.lease_ttl_ms;
  p.bucket_ms = lc.bucket_ms;
  p.count_denied = count_all;
  p.operations = opt.lease_ops;
  p.seed = opt.seed;
  p.sweep_every_ms = 1'000;  // sluiced's default sweep_interval_ms
  const std::string ttl = rules::format_duration(lc.lease_ttl_ms);
  Row row = new_row(
      kLeaseTrace, {ttl.c_str(), lc.lease_ttl_ms, lc.max_in_flight, 0}, "concurrency", count_all,
      testing::ConcurrencyReference(p.max_in_flight, p.lease_ttl_ms, p.bucket_ms).bucket_ms());
  std::string why;
  const auto policy = testing::concurrency_policy(p, opt.seed, &why);
  if (policy == nullptr) {
    std::fprintf(stderr, "error: parse_concurrency(%" PRIu64 ", %" PRId64 ", %" PRId64 "): %s\n",
                 p.max_in_flight, p.lease_ttl_ms, p.bucket_ms, why.c_str());
    std::exit(1);
  }
  const std::vector<testing::LeaseOp> ops = testing::make_lease_trace(p);
  Engine engine(policy, engine_options());
  const testing::LeaseTally t = testing::replay_lease_trace(engine, p, ops);
  row.requests = t.operations;
  row.allowed = t.admitted + t.release_ok;
  row.wrongly_allowed = t.wrongly_allowed;
  row.wrongly_denied = t.wrongly_denied;
  row.max_window_over_limit =
      static_cast<double>(t.max_held) / static_cast<double>(lc.max_in_flight);
  row.extra = {
      {"max_in_flight", lc.max_in_flight},
      {"lease_ttl_ms", lc.lease_ttl_ms},
      {"wrong_other_pct", pct(t.check_errors + t.bad_leases + t.wrong_releases, row.requests)},
      {"checks", t.checks},
      {"admitted", t.admitted},
      {"releases", t.releases},
      {"release_answers",
       {{"ok", t.release_ok},
        {"lease_expired", t.release_expired},
        {"lease_released", t.release_released},
        {"lease_unknown", t.release_unknown}}},
      {"wrong_releases", t.wrong_releases},
      {"bad_leases", t.bad_leases},
      {"check_errors", t.check_errors},
      {"remaining_mismatches", t.report_mismatches}};
  const std::string where = row.name() + " M " + std::to_string(lc.max_in_flight) + " bucket " +
                            std::to_string(row.bucket_ms) + " ms";
  if (t.report_mismatches != 0) {
    std::fprintf(stderr,
                 "warning: %s: %" PRIu64
                 " checks whose remaining/exceeded differ from M - in_flight / denied; first: "
                 "%s\n",
                 where.c_str(), t.report_mismatches, t.first_report_mismatch.c_str());
  }
  // The contract is exact as well: any answer unlike the reference model's is a bug.
  if (t.wrong() != 0) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "M %" PRIu64 " bucket %" PRId64 " ms: %" PRIu64
                  " wrong answers (checks wrongly allowed %" PRIu64 ", wrongly denied %" PRIu64
                  ", errors %" PRIu64 ", bad leases %" PRIu64 ", releases %" PRIu64 ")",
                  lc.max_in_flight, row.bucket_ms, t.wrong(), t.wrongly_allowed, t.wrongly_denied,
                  t.check_errors, t.bad_leases, t.wrong_releases);
    row.failure = buf;
    const auto shrunk = testing::shrink_lease_trace(
        [&] { return std::make_unique<Engine>(policy, engine_options()); }, p, ops, 1'000);
    Engine fresh(policy, engine_options());
    std::fprintf(stderr, "%s: first wrong answer: %s\nsmallest trace found (%zu operations):\n%s",
                 where.c_str(), t.first_wrong.c_str(), shrunk.size(),
                 testing::lease_trace_text(fresh, p, shrunk).c_str());
  }
  warn_after(engine, row);
  return row;
}

// The row as printed and in the --json line.
sluice::bench::Row row_json(const Row& r, double seconds) {
  sluice::bench::Row row = {{"trace", r.trace},
                            {"window_s", r.window_ms / 1000},
                            {"mode", r.mode},
                            {"counting", r.count_all ? "all" : "admitted"},
                            {"bucket_ms", r.bucket_ms},
                            {"limit", r.limit},
                            {"requests", r.requests},
                            {"allowed_pct", pct(r.allowed, r.requests)},
                            {"wrongly_allowed_pct", pct(r.wrongly_allowed, r.requests)},
                            {"wrongly_denied_pct", pct(r.wrongly_denied, r.requests)},
                            {"max_window_over_limit", r.max_window_over_limit},
                            {"avg_rate_error_pct", nullptr},
                            {"seconds", seconds}};
  if (r.avg_rate_error_pct) row["avg_rate_error_pct"] = *r.avg_rate_error_pct;
  row.update(r.extra);
  return row;
}

// One line on a cloudflare trace as generated: its size, sources and abusive share.
std::string cloudflare_note(const WindowCase& wc, const testing::TraceParams& p,
                            const std::vector<Event>& trace,
                            std::chrono::steady_clock::time_point generating) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - generating).count();
  std::vector<bool> seen(testing::kCloudflareSources, false);
  uint64_t sources = 0;
  uint64_t abusive_sources = 0;
  uint64_t abusive_requests = 0;
  for (const Event& e : trace) {
    if (!seen[e.key]) {
      seen[e.key] = true;
      ++sources;
      if (testing::cloudflare_abusive(e.key)) ++abusive_sources;
    }
    if (testing::cloudflare_abusive(e.key)) ++abusive_requests;
  }
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "cloudflare %s: limit %" PRIu64 ", %" PRId64 " windows; %zu requests from %" PRIu64
                " sources, %" PRIu64 " of them abusive sending %" PRIu64
                " requests (%.2f%%); generated in %.2f s%s",
                wc.label, p.limit, p.windows, trace.size(), sources, abusive_sources,
                abusive_requests, pct(abusive_requests, trace.size()), secs,
                trace.size() >= p.max_events ? "; cut at --max-events" : "");
  return buf;
}

}  // namespace

int bench_accuracy_main(int argc, char** argv) {
  Options opt;
  if (const std::optional<int> exit = parse_args(argc, argv, opt)) return *exit;
  sluice::bench::Rows out(opt.json);
  bool failed = false;
  // Runs one row's replay, prints the row, and its failure if it has one.
  const auto add = [&](const auto& replay_row) {
    const auto started = std::chrono::steady_clock::now();
    const Row r = replay_row();
    const std::chrono::duration<double> secs = std::chrono::steady_clock::now() - started;
    out.add(row_json(r, secs.count()));
    if (!r.failure.empty())
      std::fprintf(stderr, "error: %s: %s\n", r.name().c_str(), r.failure.c_str());
    failed = failed || !r.failure.empty();
  };
  std::vector<std::string> noted;  // invalid window/granularity pairs already reported
  // The request traces serve the window and gcra rows only.
  const bool trace_modes = contains(opt.modes, "weighted") || contains(opt.modes, "strict") ||
                           contains(opt.modes, "gcra");
  for (const std::string_view name : testing::kTraceNames) {
    if (!trace_modes || !contains(opt.traces, name)) continue;
    for (const WindowCase& window_case : kWindows) {
      if (!contains(opt.windows, window_case.label)) continue;
      const WindowCase wc = case_for(name, window_case);
      testing::TraceParams p;
      p.window_ms = wc.window_ms;
      p.limit = wc.limit;
      p.windows = opt.windows_override > 0 ? opt.windows_override : wc.windows;
      p.seed = opt.seed;
      p.max_events = opt.max_events;
      const auto generating = std::chrono::steady_clock::now();
      const std::vector<Event> trace = *testing::make_trace(name, p);
      if (name == "cloudflare") {
        std::fprintf(stderr, "%s\n", cloudflare_note(wc, p, trace, generating).c_str());
      }
      std::vector<int64_t> buckets_done;  // 1/60 of 1 h is its default: one row, not two
      for (const uint32_t g : opt.granularities) {
        const int64_t bucket = g == 0 ? window::default_bucket_ms(wc.window_ms)
                                      : wc.window_ms / static_cast<int64_t>(g);
        const window::WindowSpec spec{wc.window_ms, bucket};
        if (g != 0 &&
            (wc.window_ms % static_cast<int64_t>(g) != 0 || !window::validate(spec).ok())) {
          const std::string note = std::string(wc.label) + " at granularity 1/" + std::to_string(g);
          if (std::find(noted.begin(), noted.end(), note) == noted.end()) {
            std::fprintf(stderr, "note: skipping %s: not a valid bucket\n", note.c_str());
            noted.push_back(note);
          }
          continue;
        }
        if (std::find(buckets_done.begin(), buckets_done.end(), bucket) != buckets_done.end()) {
          continue;
        }
        buckets_done.push_back(bucket);
        for (const Estimator est : {Estimator::kWeighted, Estimator::kStrict}) {
          if (!contains(opt.modes, window::to_string(est))) continue;
          for (const bool count_all : {false, true}) {
            if (!contains(opt.countings, count_all ? "all" : "admitted")) continue;
            add([&] { return replay(name, trace, wc, spec, est, count_all, opt.seed); });
          }
        }
      }
      // GCRA has no buckets: one row per counting, whatever --granularity says.
      if (contains(opt.modes, "gcra")) {
        for (const bool count_all : {false, true}) {
          if (!contains(opt.countings, count_all ? "all" : "admitted")) continue;
          add([&] { return replay_gcra(name, trace, wc, count_all, opt.seed); });
        }
      }
    }
  }
  // Concurrency rows: their own trace, cases and operations.
  if (contains(opt.traces, kLeaseTrace) && contains(opt.modes, "concurrency")) {
    for (const LeaseCase& lc : kLeaseCases) {
      for (const bool count_all : {false, true}) {
        if (!contains(opt.countings, count_all ? "all" : "admitted")) continue;
        add([&] { return replay_concurrency(lc, count_all, opt); });
      }
    }
  }
  out.finish();
  return failed ? 1 : 0;
}
