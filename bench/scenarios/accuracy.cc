// sluice-bench-accuracy: wrongly allowed and wrongly denied requests of the engine against an
// exact reference (the goals in docs/benchmarks.md; the Cloudflare figure to beat is 0.003% of
// requests wrongly decided).
//
// For each trace x window x mode (x granularity) x counting it builds a one-rule policy in code,
// replays the trace through Engine::check in time order and judges every decision with SHARED
// HISTORY: the reference of a key holds exactly what the rule counted, so before each request it
// says what an exact limiter would decide given the same past (an independent exact limiter would
// let one early disagreement shift both histories apart and be counted again and again).
//
//   wrongly_allowed_pct  engine allowed, exact would deny; of all requests in the row
//   wrongly_denied_pct   engine denied, exact would allow
//   allowed_pct          allowed, of all requests; seconds: the replay's time
//
// Counting (--counting), one row each:
//   admitted  the rule counts only admitted requests (count_denied: false, Sluice's default), and
//             the reference holds what the engine admitted;
//   all       the rule counts every request (count_denied: true), and the reference holds the
//             whole trace. This is how Cloudflare measured its 0.003%: the rate of a source is the
//             rate of everything it sends, so the history does not depend on the decisions.
//
// Window rows (--mode weighted, strict): the reference is an exact sliding log per key.
// avg_rate_error_pct is how far the limiter's estimate of a key's count is from the true count,
// as Cloudflare reported it (6% on its traffic): at every check whose key has a true count c > 0
// in (now - W, now] just before the request (over the history the rule counts), the estimate e
// of the same window at the same moment, read before the request is counted (the count the
// decision compares with the limit: e + hits <= limit); the mean of |e - c| / c * 100 over those
// checks (null if there are none). The estimate comes from a window::SlidingWindow per key with
// the rule's spec and estimator, fed by its own try_acquire: the engine runs the same window code,
// so the two must decide alike; if they do not, the program names the first such request and
// fails (exit 1) after the rows.
//
// max_window_over_limit is the largest number of hits the engine admitted into any true window
// (now - W, now] of any key, over the limit: above 1 means the limit was exceeded somewhere (never
// for strict).
//
// The cloudflare trace (tests/support/traces.h: 270,000 sources, 0.1% of them abusive at 2x to
// 20x, the rest far below their limit) is replayed with a limit of 100 in every window case over
// 40 windows (--windows overrides): with the usual 600/1m and 3600/1h its 270 abusive sources
// alone would send millions of requests per window. Each row is ~1.5M requests; how many sources
// sent requests and the abusive share go to stderr.
//
// Reading the figures: when a key is over its limit rate (steady-1x/2x, the few hot keys of
// mixed) nearly every decision is marginal, so a limiter off by a fraction of one request or a
// few ms disagrees with the exact log on many of them: such rows say how a limiter shapes
// overload. The Cloudflare figure is about traffic mostly well below its limits.
//
// GCRA rows (--mode gcra): the limit is parse_gcra("<L>/<W>", burst) with L the window case's
// limit (100/1s, 600/1m, 3600/1h) and burst = max(1, L/10) (fields burst, rate). The reference
// is an independent exact token bucket per key (GcraReference below; nothing of window/gcra.h):
// integers in nanoseconds, interval = W * 1e6 / L rounded down, tokens scaled by the interval and
// capped at burst * interval, full at a key's first request, refilled by the ns elapsed since its
// previous request; h hits are admitted iff tokens >= h * interval. Counting "admitted" takes
// h * interval for what the engine admitted, "all" for every request (the bucket may go into
// debt). GCRA is decided exactly, so every gcra row must show 0 wrong decisions; and a token
// bucket admits at most burst + L hits into any true window, so the program fails (exit 1) if
// max_window_over_limit exceeds gcra_bound = (burst + L) / L. avg_rate_error_pct is null.
//
// Concurrency rows (--mode concurrency, trace "leases"): a concurrency limit
// (parse_concurrency(M, lease_ttl, granularity)) on 3 keys, one row per case of kLeaseCases and
// counting ("all" sets count_denied, which must change nothing), replayed and judged operation by
// operation with shared history against the exact reference model: the randomized lease traces of
// tests/support/concurrency_trace.h (what they hold and what counts as wrong is written there),
// --lease-ops operations per row, --seed names them, Engine::sweep every second of trace time as
// the daemon's sweep timer does. Their figures:
//   requests             every operation sent: checks and releases; allowed_pct is checks
//                        admitted plus releases answered ok, over all operations;
//   wrongly_allowed_pct  checks admitted that the reference denies, of all operations;
//   wrongly_denied_pct   checks denied that the reference admits;
//   wrong_other_pct      the other wrong answers: releases answered unlike the reference, leases
//                        unlike the contract, errors on a check;
//   max_window_over_limit  the most hits any key held in leases at once, as the reference counts
//                        the leases the engine granted, over M (above 1: the limit was exceeded);
//   avg_rate_error_pct   null: a concurrency limit counts leases exactly and estimates nothing.
// Any wrong answer fails the program (exit 1) after the rows, with the first one described and
// the smallest trace found that still shows one; remaining_mismatches (`remaining`, `exceeded`)
// are only warned about. --trace, --window and --granularity do not select among these rows,
// except that --trace without "leases" leaves them out.
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

// The cloudflare trace's limit and duration in every window case.
constexpr uint64_t kCloudflareLimit = 100;
constexpr int64_t kCloudflareWindows = 40;

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

// One row: its JSON as printed, its name for messages, and why it fails the program (exit 1),
// "" when it is sound.
struct Row {
  Row(std::string_view trace, const WindowCase& wc, std::string_view mode, bool count_all,
      int64_t bucket_ms)
      : json({{"trace", trace},
              {"window_s", wc.window_ms / 1000},
              {"mode", mode},
              {"counting", count_all ? "all" : "admitted"},
              {"bucket_ms", bucket_ms},  // 0 for gcra rows
              {"limit", wc.limit}}),
        name(std::string(trace) + " " + wc.label + " " + std::string(mode) + " " +
             (count_all ? "all" : "admitted")) {}

  // The counts, as percentages of the requests; avg_rate_error_pct null unless given.
  void set(uint64_t requests, uint64_t allowed, uint64_t wrongly_allowed, uint64_t wrongly_denied,
           double max_window_over_limit, std::optional<double> avg_rate_error_pct = {}) {
    json["requests"] = requests;
    json["allowed_pct"] = pct(allowed, requests);
    json["wrongly_allowed_pct"] = pct(wrongly_allowed, requests);
    json["wrongly_denied_pct"] = pct(wrongly_denied, requests);
    json["max_window_over_limit"] = max_window_over_limit;
    json["avg_rate_error_pct"] = nullptr;
    if (avg_rate_error_pct) json["avg_rate_error_pct"] = *avg_rate_error_pct;
    json["seconds"] = 0;  // the replay's, set when it is done
  }

  static double pct(uint64_t part, uint64_t whole) {
    return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
  }

  sluice::bench::Row json;
  std::string name;
  std::string failure;
};

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return v.empty() || std::find(v.begin(), v.end(), s) != v.end();
}

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse_args(int argc, char** argv, Options& o) {
  sluice::bench::Cli cli("sluice-bench-accuracy");
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
  // "default" is read as 0, "1/N" as N.
  cli.app()
      .add_option("--granularity", o.granularities, "buckets, default|1/N[,..] (default)")
      ->delimiter(',')
      ->type_name("TEXT")
      ->transform([](const std::string& g) {
        const unsigned long n = g.starts_with("1/") ? std::strtoul(g.c_str() + 2, nullptr, 10) : 0;
        if (g != "default" && (n < 1 || n > window::kMaxBuckets))
          throw CLI::ValidationError("takes default or 1/N, 1 <= N <= 1440");
        return std::to_string(n);
      });
  const std::optional<int> exit = cli.parse(argc, argv);
  o.json = cli.json;
  return exit;
}

EngineOptions engine_options() {
  EngineOptions opts;
  opts.memory_cap_bytes = 1ull << 30;
  return opts;
}

void warn_evicted(const Engine& engine, const Row& row) {
  if (const uint64_t evicted = engine.stats().evicted_live; evicted != 0) {
    std::fprintf(stderr,
                 "warning: %s: engine evicted %" PRIu64
                 " live counters; the row is not a pure accuracy figure\n",
                 row.name.c_str(), evicted);
  }
}

// ---- window and GCRA rows ----------------------------------------------------------------------

__extension__ typedef __int128 i128;  // signed: with counting "all" the bucket goes into debt
__extension__ typedef unsigned __int128 u128;

constexpr int64_t kNsPerMs = 1'000'000;

// The exact reference of gcra rows: a token bucket of one key in integer nanoseconds, written
// without window/gcra.h. Tokens are scaled by the interval (one request = interval_ns), so the
// bucket holds burst * interval_ns when full. Products are taken in 128 bits.
struct GcraReference {
  i128 interval_ns;
  i128 cap_ns;
  i128 tokens_ns = cap_ns;
  int64_t last_ms = -1;  // the key's previous request; -1 before the first (the bucket is full)

  // Refills by the time since the previous request, then says whether `hits` fit.
  bool admits(int64_t now_ms, uint64_t hits) {
    if (last_ms >= 0) tokens_ns = std::min(cap_ns, tokens_ns + i128{now_ms - last_ms} * kNsPerMs);
    last_ms = now_ms;
    return tokens_ns >= i128{hits} * interval_ns;
  }
};

// The reference of a window or gcra row, one per key, fed with shared history: allows(e) says
// what it decides for event e given the history so far, record(e, allowed) then counts what the
// rule counts (every request with counting "all", else what the engine admitted).
struct Judge {
  Judge(const WindowCase& wc, const window::WindowSpec& spec, std::string_view mode, bool all,
        uint32_t keys, std::string row_name)
      : gcra(mode == "gcra"),
        count_all(all),
        limit(wc.limit),
        where(std::move(row_name)),
        log(gcra ? 0 : keys, ExactSlidingLog(wc.window_ms)),
        admitted(gcra || all ? keys : 0, ExactSlidingLog(wc.window_ms)) {
    if (!gcra) {
      mirror.assign(keys, window::SlidingWindow(
                              spec, mode == "strict" ? Estimator::kStrict : Estimator::kWeighted));
      return;
    }
    // W in ns over L, rounded down.
    const auto interval_ns =
        static_cast<int64_t>(static_cast<u128>(wc.window_ms) * kNsPerMs / wc.limit);
    const i128 cap = i128{interval_ns} * std::max<uint64_t>(1, wc.limit / 10);
    bucket.assign(keys, GcraReference{interval_ns, cap});
  }

  bool allows(const Event& e) {
    if (gcra) return exact = bucket[e.key].admits(e.t_ms, e.hits);
    const uint64_t c = log[e.key].count(e.t_ms);
    if (c > 0) {
      const double est = mirror[e.key].estimate(e.t_ms);
      rate_error_sum += std::fabs(est - static_cast<double>(c)) / static_cast<double>(c);
      ++rate_error_checks;
    }
    return exact = c + e.hits <= limit;
  }

  void record(const Event& e, bool allowed) {
    // gcra: the engine against the reference; window: against its SlidingWindow.
    const bool other = gcra ? exact : mirror[e.key].try_acquire(e.t_ms, e.hits, limit, count_all);
    if (other != allowed && disagreements++ == 0) {
      std::fprintf(stderr,
                   "error: %s: key %" PRIu32 " t_ms %" PRId64 " (trace start + %" PRId64
                   " ms) hits %" PRIu32 ": engine %s, %s %s%s\n",
                   where.c_str(), e.key, e.t_ms, e.t_ms - testing::kTraceStartMs, e.hits,
                   allowed ? "allowed" : "denied", gcra ? "token bucket" : "SlidingWindow",
                   other ? "allows" : "denies", gcra ? gcra_tokens(e.key).c_str() : "");
    }
    if (gcra && (allowed || count_all))
      bucket[e.key].tokens_ns -= i128{e.hits} * bucket[e.key].interval_ns;
    else if (!gcra && (allowed || count_all))
      log[e.key].record(e.t_ms, e.hits);
    if (allowed && !admitted.empty()) admitted[e.key].record(e.t_ms, e.hits);
  }

  std::string gcra_tokens(uint32_t key) const {
    return "; its tokens_ns " + std::to_string(static_cast<long long>(bucket[key].tokens_ns)) +
           " of " + std::to_string(static_cast<long long>(bucket[key].cap_ns));
  }

  // The most hits the engine admitted into one true window of any key, over the limit.
  double max_window_over_limit() const {
    uint64_t most = 0;
    for (const ExactSlidingLog& l : admitted.empty() ? log : admitted)
      most = std::max(most, l.max_window_count());
    return static_cast<double>(most) / static_cast<double>(limit);
  }

  bool gcra;
  bool count_all;
  uint64_t limit;
  std::string where;                 // the row's name, for the first disagreement
  std::vector<ExactSlidingLog> log;  // window rows: the history the rule counts
  // What the engine admitted, for max_window_over_limit, when `log` does not hold exactly that.
  std::vector<ExactSlidingLog> admitted;
  std::vector<window::SlidingWindow> mirror;  // window rows: the limiter outside the engine
  std::vector<GcraReference> bucket;          // gcra rows
  bool exact = false;                         // the reference's decision for the event being judged
  double rate_error_sum = 0;
  uint64_t rate_error_checks = 0;
  uint64_t disagreements = 0;
};

// A policy of one rule keyed by "k" in domain "bench" holding `limit`.
std::shared_ptr<const rules::Policy> policy_of(rules::Limit limit, bool count_all, uint64_t seed) {
  rules::Rule rule;
  rule.name = "r";
  rule.key = {"k"};
  rule.limits = {std::move(limit)};
  rule.count_denied = count_all;
  rules::RuleSet set;
  set.domains.emplace_back().name = "bench";
  set.domains.back().rules.push_back(std::move(rule));
  return rules::Policy::compile(std::move(set), rules::Overrides{}, seed);
}

// A window (weighted, strict) or gcra row: replays `trace` through the engine and judges every
// decision against the reference.
Row replay(std::string_view trace_name, const std::vector<Event>& trace, const WindowCase& wc,
           const window::WindowSpec& spec, std::string_view mode, bool count_all, uint64_t seed) {
  const bool gcra = mode == "gcra";
  Row row(trace_name, wc, mode, count_all, gcra ? 0 : spec.bucket_ms);
  sluice::bench::Row extra = sluice::bench::Row::object();  // gcra's fields
  std::shared_ptr<const rules::Policy> policy;
  const uint64_t burst = std::max<uint64_t>(1, wc.limit / 10);
  if (gcra) {
    const std::string rate = std::to_string(wc.limit) + "/" + wc.label;
    const double bound = static_cast<double>(burst + wc.limit) / static_cast<double>(wc.limit);
    extra = {{"burst", burst}, {"rate", rate}, {"gcra_bound", bound}};
    rules::Limit lim;
    if (const sluice::Status why = rules::parse_gcra(rate, burst, lim); !why.ok()) {
      std::fprintf(stderr, "error: parse_gcra(%s, %" PRIu64 "): %s\n", rate.c_str(), burst,
                   why.message().c_str());
      std::exit(1);
    }
    lim.name = "r:gcra " + rate + " burst " + std::to_string(burst);
    policy = policy_of(std::move(lim), count_all, seed);
  } else {
    const Estimator est = mode == "strict" ? Estimator::kStrict : Estimator::kWeighted;
    policy = testing::one_rule_policy({"bench", "r", "k", wc.limit, spec, est, count_all}, seed);
  }
  Engine engine(policy, engine_options());
  const uint32_t keys = testing::trace_keys(trace_name);
  Judge judge(wc, spec, mode, count_all, keys, row.name);

  std::vector<std::string> values(keys);
  for (uint32_t k = 0; k < keys; ++k)
    values[k] = std::to_string(k);
  std::vector<rules::Descriptor> descs(kMaxBatch);
  std::vector<rules::CheckRequest> batch(kMaxBatch);
  BatchResult out;
  uint64_t requests = 0, errors = 0, allowed = 0, wrongly_allowed = 0, wrongly_denied = 0;
  // Requests of one millisecond go in one batch (up to kMaxBatch): the engine decides a batch in
  // order, each request seeing the hits of the earlier ones, and the reference is walked in the
  // same order below, so batching changes no decision.
  for (size_t i = 0; i < trace.size();) {
    const int64_t now = trace[i].t_ms;
    size_t n = 0;
    for (; i + n < trace.size() && n < kMaxBatch && trace[i + n].t_ms == now; ++n) {
      descs[n] = {"k", values[trace[i + n].key]};
      batch[n] = {"bench", {&descs[n], 1}, trace[i + n].hits};
    }
    engine.check({batch.data(), n}, now, out);
    for (size_t j = 0; j < n; ++j, ++requests) {
      const Event& e = trace[i + j];
      const auto& d = out.decisions[j];
      if (d.error != rules::CheckError::kNone) {
        ++errors;
        continue;
      }
      const bool exact_allows = judge.allows(e);
      wrongly_allowed += d.allowed && !exact_allows ? 1 : 0;
      wrongly_denied += !d.allowed && exact_allows ? 1 : 0;
      allowed += d.allowed ? 1 : 0;
      judge.record(e, d.allowed);
    }
    i += n;
  }

  const double over = judge.max_window_over_limit();
  row.set(requests, allowed, wrongly_allowed, wrongly_denied, over,
          judge.rate_error_checks == 0
              ? std::optional<double>()
              : 100.0 * judge.rate_error_sum / static_cast<double>(judge.rate_error_checks));
  row.json.update(extra);
  if (!gcra && judge.disagreements != 0) {
    row.failure = "SlidingWindow decided " + std::to_string(judge.disagreements) +
                  " requests unlike the engine (the first above)";
  } else if (gcra && wrongly_allowed + wrongly_denied != 0) {
    // GCRA is exact: any decision unlike the token bucket's is a bug, not an estimate's error.
    row.failure = std::to_string(wrongly_allowed + wrongly_denied) +
                  " decisions unlike the token bucket's (the first above)";
  } else if (gcra && over > extra["gcra_bound"].get<double>()) {
    row.failure = "max_window_over_limit over the GCRA bound (burst + L) / L";
  }
  if (errors != 0) {
    std::fprintf(stderr, "warning: %s: %" PRIu64 " requests were rejected with an error\n",
                 row.name.c_str(), errors);
  }
  warn_evicted(engine, row);
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
  Row row(kLeaseTrace, {ttl.c_str(), lc.lease_ttl_ms, lc.max_in_flight, 0}, "concurrency",
          count_all,
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
  row.set(t.operations, t.admitted + t.release_ok, t.wrongly_allowed, t.wrongly_denied,
          static_cast<double>(t.max_held) / static_cast<double>(lc.max_in_flight));
  row.json.update(sluice::bench::Row{
      {"max_in_flight", lc.max_in_flight},
      {"lease_ttl_ms", lc.lease_ttl_ms},
      {"wrong_other_pct", Row::pct(t.check_errors + t.bad_leases + t.wrong_releases, t.operations)},
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
      {"remaining_mismatches", t.report_mismatches}});
  const std::string where = row.name + " M " + std::to_string(lc.max_in_flight) + " bucket " +
                            row.json["bucket_ms"].dump() + " ms";
  if (t.report_mismatches != 0) {
    std::fprintf(stderr,
                 "warning: %s: %" PRIu64
                 " checks whose remaining/exceeded differ from M - in_flight / denied; first: %s\n",
                 where.c_str(), t.report_mismatches, t.first_report_mismatch.c_str());
  }
  // The contract is exact as well: any answer unlike the reference model's is a bug.
  if (t.wrong() != 0) {
    row.failure = where + ": " + std::to_string(t.wrong()) +
                  " wrong answers (wrongly_allowed, wrongly_denied, check_errors, bad_leases, "
                  "wrong_releases in the row)";
    const auto shrunk = testing::shrink_lease_trace(
        [&] { return std::make_unique<Engine>(policy, engine_options()); }, p, ops, 1'000);
    Engine fresh(policy, engine_options());
    std::fprintf(stderr, "%s: first wrong answer: %s\nsmallest trace found (%zu operations):\n%s",
                 where.c_str(), t.first_wrong.c_str(), shrunk.size(),
                 testing::lease_trace_text(fresh, p, shrunk).c_str());
  }
  warn_evicted(engine, row);
  return row;
}

// One line on a cloudflare trace as generated: its size, sources and abusive share.
void note_cloudflare(const WindowCase& wc, const testing::TraceParams& p,
                     const std::vector<Event>& trace) {
  std::vector<bool> seen(testing::kCloudflareSources, false);
  uint64_t sources = 0, abusive_sources = 0, abusive_requests = 0;
  for (const Event& e : trace) {
    const bool abusive = testing::cloudflare_abusive(e.key);
    if (!seen[e.key]) {
      seen[e.key] = true;
      ++sources;
      abusive_sources += abusive ? 1 : 0;
    }
    abusive_requests += abusive ? 1 : 0;
  }
  std::fprintf(stderr,
               "cloudflare %s: limit %" PRIu64 ", %" PRId64 " windows; %zu requests from %" PRIu64
               " sources, %" PRIu64 " of them abusive sending %" PRIu64 " requests (%.2f%%)%s\n",
               wc.label, p.limit, p.windows, trace.size(), sources, abusive_sources,
               abusive_requests, Row::pct(abusive_requests, trace.size()),
               trace.size() >= p.max_events ? "; cut at --max-events" : "");
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
    Row r = replay_row();
    r.json["seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    out.add(std::move(r.json));
    if (!r.failure.empty())
      std::fprintf(stderr, "error: %s: %s\n", r.name.c_str(), r.failure.c_str());
    failed = failed || !r.failure.empty();
  };
  const auto countings = [&] {
    std::vector<bool> c;
    for (const bool all : {false, true}) {
      if (contains(opt.countings, all ? "all" : "admitted")) c.push_back(all);
    }
    return c;
  }();
  // The rows of each window case: each valid bucket's window modes, then gcra (no buckets: one
  // row per counting, whatever --granularity says).
  std::vector<std::pair<std::string_view, window::WindowSpec>> modes[std::size(kWindows)];
  for (size_t w = 0; w < std::size(kWindows); ++w) {
    const int64_t window_ms = kWindows[w].window_ms;
    for (const uint32_t g : opt.granularities) {
      const window::WindowSpec spec{window_ms, g == 0 ? window::default_bucket_ms(window_ms)
                                                      : window_ms / static_cast<int64_t>(g)};
      if (g != 0 && (window_ms % static_cast<int64_t>(g) != 0 || !window::validate(spec).ok())) {
        std::fprintf(stderr, "note: skipping %s at granularity 1/%" PRIu32 ": not a valid bucket\n",
                     kWindows[w].label, g);
        continue;
      }
      // 1/60 of 1 h is its default: one row, not two.
      const bool done = std::any_of(modes[w].begin(), modes[w].end(), [&](const auto& m) {
        return m.second.bucket_ms == spec.bucket_ms;
      });
      for (const std::string_view mode : {"weighted", "strict"}) {
        if (!done && contains(opt.modes, mode)) modes[w].emplace_back(mode, spec);
      }
    }
    if (contains(opt.modes, "gcra")) modes[w].emplace_back("gcra", window::WindowSpec{});
  }
  // The request traces serve the window and gcra rows only.
  for (const std::string_view name : testing::kTraceNames) {
    for (size_t w = 0; w < std::size(kWindows); ++w) {
      if (!contains(opt.traces, name) || !contains(opt.windows, kWindows[w].label) ||
          modes[w].empty()) {
        continue;
      }
      WindowCase wc = kWindows[w];
      if (name == "cloudflare") {
        wc.limit = kCloudflareLimit;
        wc.windows = kCloudflareWindows;
      }
      testing::TraceParams p;
      p.window_ms = wc.window_ms;
      p.limit = wc.limit;
      p.windows = opt.windows_override > 0 ? opt.windows_override : wc.windows;
      p.seed = opt.seed;
      p.max_events = opt.max_events;
      const std::vector<Event> trace = *testing::make_trace(name, p);
      if (name == "cloudflare") note_cloudflare(wc, p, trace);
      for (const auto& [mode, spec] : modes[w]) {
        for (const bool all : countings)
          add([&] { return replay(name, trace, wc, spec, mode, all, opt.seed); });
      }
    }
  }
  // Concurrency rows: their own trace, cases and operations.
  if (contains(opt.traces, kLeaseTrace) && contains(opt.modes, "concurrency")) {
    for (const LeaseCase& lc : kLeaseCases) {
      for (const bool all : countings)
        add([&] { return replay_concurrency(lc, all, opt); });
    }
  }
  out.finish();
  return failed ? 1 : 0;
}
