// Unit tests of lib/rules: the rules file (each seed's scenario, every kind of error with its line
// and field path), resolve() (matching, allowlist, plans, overrides, input limits), counter
// identity across compiles, the overrides table, and the shipped example file.
#include "rules/rules.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "alloc_counter.h"  // this binary counts its heap allocations
#include "parse_results.h"

using namespace sluice::rules;
using sluice::window::Estimator;
using sluice::window::make_spec;
using sluice::window::WindowSpec;

namespace {

constexpr int64_t kSec = 1'000;
constexpr int64_t kMin = 60 * kSec;
constexpr int64_t kNow = 1'700'000'000'000;
constexpr uint64_t kSeed = 0x5eed;

ParseResult parse(std::string_view text) {
  return parse_rules(text, "rules.yaml");
}

using sluice::testing::all_errors;

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Parses text that must be valid.
RuleSet must_parse(std::string_view text) {
  return sluice::testing::require_rules(parse(text));
}

// Parses text that must fail with exactly one error, and returns it.
ParseError only_error(std::string_view text) {
  return sluice::testing::require_one_error(parse(text));
}

// Seed 000 (Allegro OAuth): tokens limited per client for client credentials, per (client, user)
// for user grants, the company's own app never limited, and a new rule tried out in dry-run.
constexpr std::string_view kSeed000 = R"(domains:
  - name: oauth
    allowlist:
      - {client_id: allegro-mobile}
    rules:
      - name: token-per-client
        match: {grant_type: client_credentials}
        key: [client_id]
        limits: [500/1m]
      - name: token-per-user
        match: {grant_type: authorization_code}
        key: [client_id, user]
        limits: [50/1m]
        count_denied: true
      - name: refresh-per-user
        match: {grant_type: refresh_token}
        key: [client_id, user]
        limits: [100/1h]
        mode: dry-run
)";

// Seed 001: 10/s and 3000/10min on one key; PerNMinute(10000, 15).
constexpr std::string_view kSeed001 = R"(domains:
  - name: api
    rules:
      - name: per-key
        key: [api_key]
        limits: [10/1s, 3000/10m]
      - name: per-user
        key: [user]
        limits: [10000/15m]
        estimator: strict
)";

// Seed 003: plans by subscription under an overarching per-IP cap.
constexpr std::string_view kSeed003 = R"(domains:
  - name: dns
    plans:
      free: [100/1m]
      starter: [3000/1m]
      pro: [20000/1m]
    rules:
      - name: per-ip
        key: [ip]
        limits: [50000/1m]
      - name: per-user
        key: [user]
        plan: {from: plan, default: free}
)";

std::string seeds_text() {
  // Three single-domain documents joined into one domains list.
  std::string s(kSeed000);
  s += std::string(kSeed001).substr(std::string_view("domains:\n").size());
  s += std::string(kSeed003).substr(std::string_view("domains:\n").size());
  return s;
}

std::shared_ptr<const Policy> compile_text(std::string_view text, const Overrides& ov = {},
                                           uint64_t seed = kSeed, InputLimits input = {}) {
  return Policy::compile(must_parse(text), ov, seed, input);
}

// One resolved request, with its rules and limits copied out for easy checking.
struct Resolved {
  ResolvedRequest req;
  std::vector<AppliedRule> rules;
  std::vector<AppliedLimit> limits;

  const AppliedRule* rule(std::string_view name) const {
    for (const AppliedRule& r : rules) {
      if (r.rule->name == name) return &r;
    }
    return nullptr;
  }
  std::vector<AppliedLimit> limits_of(const AppliedRule& r) const {
    return {limits.begin() + r.first_limit, limits.begin() + r.first_limit + r.num_limits};
  }
  std::vector<std::string> rule_names() const {
    std::vector<std::string> names;
    for (const AppliedRule& r : rules)
      names.push_back(r.rule->name);
    return names;
  }
};

Resolved resolve(const Policy& p, std::string_view domain, std::vector<Descriptor> desc,
                 int64_t now = kNow, uint64_t hits = 1) {
  Resolution out;
  Resolved r;
  r.req = p.resolve(CheckRequest{domain, desc, hits}, now, out);
  r.rules.assign(out.rules.begin() + r.req.first_rule,
                 out.rules.begin() + r.req.first_rule + r.req.num_rules);
  r.limits = out.limits;
  return r;
}

Limit limit_of(uint64_t n, int64_t window_ms, std::string name = "") {
  return Limit{std::move(name), n, make_spec(window_ms)};
}

}  // namespace

// ---- durations and limits ---------------------------------------------------------------------

TEST_CASE("durations parse with every unit and reject malformed text") {
  CHECK(parse_duration_ms("250ms") == 250);
  CHECK(parse_duration_ms("1s") == 1'000);
  CHECK(parse_duration_ms("90s") == 90'000);
  CHECK(parse_duration_ms("15m") == 15 * kMin);
  CHECK(parse_duration_ms("1h") == 3'600'000);
  CHECK(parse_duration_ms("1d") == 86'400'000);
  for (std::string_view bad : {"", "s", "1", "1x", "1 s", " 1s", "1.5s", "-1s", "0s", "1S", "1sec",
                               "99999999999999999999d", "1000000000000000000d"}) {
    INFO(bad);
    CHECK_FALSE(parse_duration_ms(bad).has_value());
  }
}

TEST_CASE("durations format in the largest exact unit") {
  CHECK(format_duration(60'000) == "1m");
  CHECK(format_duration(1'500) == "1500ms");
  CHECK(format_duration(90'000) == "90s");
  CHECK(format_duration(600'000) == "10m");
  CHECK(format_duration(3'600'000) == "1h");
  CHECK(format_duration(86'400'000) == "1d");
  CHECK(format_duration(250) == "250ms");
  for (int64_t ms : {1'000, 10'000, 90'000, 900'000, 7'200'000, 86'400'000, 1'234}) {
    CHECK(parse_duration_ms(format_duration(ms)) == ms);
  }
}

TEST_CASE("parse_limit reads N/duration with the default or a given bucket") {
  Limit l;
  CHECK(parse_limit("100/1m", 0, l).empty());
  CHECK(l.requests == 100);
  CHECK(l.spec == WindowSpec{60'000, 60'000});

  CHECK(parse_limit("10/1s", 0, l).empty());
  CHECK(l.spec == WindowSpec{1'000, 1'000});

  CHECK(parse_limit("3000/10m", 0, l).empty());
  CHECK(l.spec == WindowSpec{600'000, 60'000});

  CHECK(parse_limit("20/90s", 0, l).empty());  // not whole minutes: the window is its own bucket
  CHECK(l.spec == WindowSpec{90'000, 90'000});

  CHECK(parse_limit("500/1d", 0, l).empty());
  CHECK(l.spec == WindowSpec{86'400'000, 60'000});

  CHECK(parse_limit("100/1m", 1'000, l).empty());
  CHECK(l.spec == WindowSpec{60'000, 1'000});

  CHECK(parse_limit("1099511627776/1m", 0, l).empty());  // 2^40, the largest
  CHECK(l.requests == (uint64_t{1} << 40));
}

TEST_CASE("parse_limit explains what is wrong") {
  Limit l;
  l.requests = 7;
  CHECK(contains(parse_limit("100", 0, l), "N/duration"));
  CHECK(contains(parse_limit("0/1m", 0, l), "from 1 to 2^40"));
  CHECK(contains(parse_limit("1099511627777/1m", 0, l), "from 1 to 2^40"));
  CHECK(contains(parse_limit("-5/1m", 0, l), "from 1 to 2^40"));
  CHECK(contains(parse_limit("100/1x", 0, l), "bad window `1x`"));
  CHECK(contains(parse_limit("100/500ms", 0, l), "window: window must be between 1s and 365d"));
  CHECK(contains(parse_limit("100/366d", 0, l), "window must be between 1s and 365d"));
  CHECK(contains(parse_limit("100/1m", 7'000, l), "granularity 7000ms must divide"));
  CHECK(l.requests == 7);  // untouched on failure
}

TEST_CASE("modes, consistency and check errors have stable names") {
  CHECK(to_string(Mode::kEnforce) == "enforce");
  CHECK(to_string(Mode::kDryRun) == "dry-run");
  CHECK(to_string(Mode::kShadow) == "shadow");
  for (Mode m : {Mode::kEnforce, Mode::kDryRun, Mode::kShadow})
    CHECK(parse_mode(to_string(m)) == m);
  CHECK_FALSE(parse_mode("dryrun").has_value());
  CHECK_FALSE(parse_mode("").has_value());
  CHECK(to_string(Consistency::kOwner) == "owner");
  CHECK(to_string(Consistency::kGossip) == "gossip");
  CHECK(to_string(CheckError::kNone) == "none");
  CHECK(to_string(CheckError::kUnknownDomain) == "unknown_domain");
  CHECK(to_string(CheckError::kDuplicateDescriptor) == "duplicate_entry");
}

// ---- the seeds' scenarios ---------------------------------------------------------------------

TEST_CASE("seed 000: per-client and per-(client, user) limits by grant type, allowlist, dry-run") {
  const RuleSet rs = must_parse(kSeed000);
  REQUIRE(rs.domains.size() == 1);
  const Domain& d = rs.domains[0];
  CHECK(d.name == "oauth");
  REQUIRE(d.allowlist.size() == 1);
  CHECK(d.allowlist[0].key == "client_id");
  CHECK(d.allowlist[0].value == "allegro-mobile");
  REQUIRE(d.rules.size() == 3);

  const Rule& per_client = d.rules[0];
  CHECK(per_client.name == "token-per-client");
  CHECK(per_client.line == 6);
  REQUIRE(per_client.match.size() == 1);
  CHECK(per_client.match[0].key == "grant_type");
  CHECK(per_client.match[0].value == "client_credentials");
  CHECK(per_client.key == std::vector<std::string>{"client_id"});
  REQUIRE(per_client.limits.size() == 1);
  CHECK(per_client.limits[0].name == "token-per-client:500/1m");
  CHECK(per_client.limits[0].requests == 500);
  CHECK(per_client.limits[0].spec == WindowSpec{60'000, 60'000});
  CHECK(per_client.mode == Mode::kEnforce);
  CHECK_FALSE(per_client.count_denied);
  CHECK(per_client.estimator == Estimator::kWeighted);
  CHECK(per_client.consistency == Consistency::kOwner);
  CHECK(per_client.plan_from.empty());

  const Rule& per_user = d.rules[1];
  CHECK(per_user.key == std::vector<std::string>{"client_id", "user"});
  CHECK(per_user.count_denied);
  CHECK(per_user.line == 10);

  const Rule& refresh = d.rules[2];
  CHECK(refresh.mode == Mode::kDryRun);
  CHECK(refresh.limits[0].spec == WindowSpec{3'600'000, 60'000});
  CHECK(refresh.limits[0].name == "refresh-per-user:100/1h");
}

TEST_CASE("seed 000: resolve picks the rule of the grant type; the trusted client is allowlisted") {
  auto p = compile_text(kSeed000);

  Resolved cc =
      resolve(*p, "oauth", {{"grant_type", "client_credentials"}, {"client_id", "shop-17"}});
  CHECK(cc.req.error == CheckError::kNone);
  CHECK_FALSE(cc.req.allowlisted);
  CHECK(cc.rule_names() == std::vector<std::string>{"token-per-client"});
  REQUIRE(cc.limits.size() == 1);
  CHECK(cc.limits[0].limit->requests == 500);

  Resolved ac =
      resolve(*p, "oauth",
              {{"client_id", "shop-17"}, {"user", "42"}, {"grant_type", "authorization_code"}});
  CHECK(ac.rule_names() == std::vector<std::string>{"token-per-user"});
  CHECK(ac.rules[0].mode == Mode::kEnforce);

  Resolved rt = resolve(
      *p, "oauth", {{"grant_type", "refresh_token"}, {"client_id", "shop-17"}, {"user", "42"}});
  CHECK(rt.rule_names() == std::vector<std::string>{"refresh-per-user"});
  CHECK(rt.rules[0].mode == Mode::kDryRun);
  CHECK_FALSE(rt.rules[0].overridden);

  Resolved trusted =
      resolve(*p, "oauth", {{"grant_type", "client_credentials"}, {"client_id", "allegro-mobile"}});
  CHECK(trusted.req.error == CheckError::kNone);
  CHECK(trusted.req.allowlisted);
  CHECK(trusted.req.num_rules == 0);
  CHECK(trusted.limits.empty());
}

TEST_CASE("seed 001: two windows on one key, and 10000 per 15 minutes") {
  const RuleSet rs = must_parse(kSeed001);
  const Rule& per_key = rs.domains[0].rules[0];
  REQUIRE(per_key.limits.size() == 2);
  CHECK(per_key.limits[0].name == "per-key:10/1s");
  CHECK(per_key.limits[0].spec == WindowSpec{1'000, 1'000});
  CHECK(per_key.limits[1].name == "per-key:3000/10m");
  CHECK(per_key.limits[1].spec == WindowSpec{600'000, 60'000});
  const Rule& per_user = rs.domains[0].rules[1];
  CHECK(per_user.limits[0].spec == WindowSpec{900'000, 60'000});
  CHECK(per_user.estimator == Estimator::kStrict);

  auto p = Policy::compile(rs, {}, kSeed);
  Resolved r = resolve(*p, "api", {{"api_key", "k1"}, {"user", "u1"}});
  CHECK(r.rule_names() == std::vector<std::string>{"per-key", "per-user"});
  REQUIRE(r.limits.size() == 3);
  // Each window counts in its own counter.
  CHECK(r.limits[0].counter != r.limits[1].counter);
  const auto specs = p->window_specs();
  for (const AppliedLimit& l : r.limits) {
    REQUIRE(l.spec_index < specs.size());
    CHECK(specs[l.spec_index] == l.limit->spec);
  }
}

TEST_CASE("seed 003: plans chosen by a descriptor under a per-IP cap") {
  const RuleSet rs = must_parse(kSeed003);
  const Domain& d = rs.domains[0];
  REQUIRE(d.plans.size() == 3);
  CHECK(d.plans[0].name == "free");
  CHECK(d.plans[0].limits[0].requests == 100);
  CHECK(d.plans[0].limits[0].name == "free:100/1m");
  CHECK(d.plans[1].limits[0].requests == 3000);
  const Rule& per_user = d.rules[1];
  CHECK(per_user.plan_from == "plan");
  CHECK(per_user.default_plan == "free");
  CHECK(per_user.limits.empty());

  auto p = Policy::compile(rs, {}, kSeed);
  auto user_limit = [&](std::vector<Descriptor> desc) {
    Resolved r = resolve(*p, "dns", std::move(desc));
    const AppliedRule* ar = r.rule("per-user");
    REQUIRE(ar != nullptr);
    REQUIRE(ar->num_limits == 1);
    return r.limits[ar->first_limit].limit->requests;
  };
  CHECK(user_limit({{"ip", "203.0.113.9"}, {"user", "7"}, {"plan", "starter"}}) == 3000);
  CHECK(user_limit({{"ip", "203.0.113.9"}, {"user", "7"}, {"plan", "pro"}}) == 20000);
  CHECK(user_limit({{"ip", "203.0.113.9"}, {"user", "7"}}) == 100);                    // absent
  CHECK(user_limit({{"ip", "203.0.113.9"}, {"user", "7"}, {"plan", "gold"}}) == 100);  // unknown

  // The cap and the plan both apply (layered limits).
  Resolved r = resolve(*p, "dns", {{"ip", "203.0.113.9"}, {"user", "7"}, {"plan", "starter"}});
  CHECK(r.rule_names() == std::vector<std::string>{"per-ip", "per-user"});
  CHECK(r.limits[0].limit->requests == 50000);

  // A user switching plans keeps counting in the same counter: the limit changed, not the window.
  Resolved free = resolve(*p, "dns", {{"user", "7"}, {"plan", "free"}});
  Resolved starter = resolve(*p, "dns", {{"user", "7"}, {"plan", "starter"}});
  CHECK(free.limits[0].counter == starter.limits[0].counter);
}

TEST_CASE("a limit in map form takes a name and a granularity; the limit's own granularity wins") {
  const RuleSet rs = must_parse(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        granularity: 1s
        limits:
          - {limit: 10, window: 1m, name: burst}
          - {limit: 500, window: 1h, granularity: 5m}
          - 2000/20m
)");
  const std::vector<Limit>& ls = rs.domains[0].rules[0].limits;
  REQUIRE(ls.size() == 3);
  CHECK(ls[0].name == "burst");
  CHECK(ls[0].requests == 10);
  CHECK(ls[0].spec == WindowSpec{60'000, 1'000});
  CHECK(ls[1].name == "r:500/1h");
  CHECK(ls[1].spec == WindowSpec{3'600'000, 300'000});
  CHECK(ls[2].spec == WindowSpec{1'200'000, 1'000});  // the rule's granularity
}

TEST_CASE("optional fields take their documented values") {
  const RuleSet rs = must_parse(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        match: {tier: "*"}
        limits: [1/1s]
        mode: shadow
        count_denied: false
        estimator: strict
        consistency: gossip
)");
  const Rule& r = rs.domains[0].rules[0];
  CHECK(r.mode == Mode::kShadow);
  CHECK_FALSE(r.count_denied);
  CHECK(r.estimator == Estimator::kStrict);
  CHECK(r.consistency == Consistency::kGossip);
  CHECK(r.match[0].value == "*");
}

TEST_CASE("anchors share one limit set between rules") {
  const RuleSet rs = must_parse(R"(domains:
  - name: api
    rules:
      - name: a
        key: [k]
        limits: &standard [100/1m, 10/1s]
      - name: b
        key: [j]
        limits: *standard
)");
  const Rule& b = rs.domains[0].rules[1];
  REQUIRE(b.limits.size() == 2);
  CHECK(b.limits[0].name == "b:100/1m");  // named after the rule that uses them
  CHECK(b.limits[1].spec == WindowSpec{1'000, 1'000});
}

// ---- errors: each with its line and field ---------------------------------------------------

TEST_CASE("an unknown field is an error at its line, naming the expected fields") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limts: [100/1m]
        limits: [100/1m]
)");
  CHECK(e.file == "rules.yaml");
  CHECK(e.line == 6);
  CHECK(e.field == "domains[0].rules[0].limts");
  CHECK(contains(e.message, "unknown field `limts`"));
  CHECK(contains(e.message, "limits"));
  CHECK(e.to_string().rfind("rules.yaml:6: domains[0].rules[0].limts: unknown field", 0) == 0);
}

TEST_CASE("unknown fields are caught at every level") {
  ParseResult r = parse(R"(version: 2
domains:
  - name: api
    rulez: []
    rules:
      - name: r
        key: [k]
        limits: [{limit: 1, window: 1s, burst: 2}]
        plan: {from: p, default: x, fallback: y}
)");
  INFO(all_errors(r));
  REQUIRE(r.errors.size() >= 4);
  CHECK(r.errors[0].field == "version");
  CHECK(r.errors[0].line == 1);
  CHECK(r.errors[1].field == "domains[0].rulez");
  CHECK(r.errors[1].line == 4);
  CHECK(r.errors[2].field == "domains[0].rules[0].limits[0].burst");
  CHECK(r.errors[2].line == 8);
  bool fallback = false;
  for (const ParseError& e : r.errors)
    fallback |= e.field == "domains[0].rules[0].plan.fallback";
  CHECK(fallback);
}

TEST_CASE("a bad duration is an error at the limit") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits: [100/1m, 10/1x]
)");
  CHECK(e.line == 6);
  CHECK(e.field == "domains[0].rules[0].limits[1]");
  CHECK(contains(e.message, "bad window `1x`"));
}

TEST_CASE("a bad granularity duration is an error at the field") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        granularity: 0s
        limits: [100/1m]
)");
  CHECK(e.line == 6);
  CHECK(e.field == "domains[0].rules[0].granularity");
  CHECK(contains(e.message, "bad duration `0s`"));
}

TEST_CASE("a bad limit count is an error at the limit") {
  const ParseError zero = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits:
          - 100/1m
          - 0/1s
)");
  CHECK(zero.line == 8);
  CHECK(zero.field == "domains[0].rules[0].limits[1]");
  CHECK(contains(zero.message, "from 1 to 2^40"));

  const ParseError map_form = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits:
          - limit: lots
            window: 1m
)");
  CHECK(map_form.line == 7);
  CHECK(map_form.field == "domains[0].rules[0].limits[0].limit");
  CHECK(contains(map_form.message, "got `lots`"));
}

TEST_CASE("a granularity that does not divide the window is an error at the limit") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits:
          - {limit: 10, window: 1m, granularity: 7s}
)");
  CHECK(e.line == 7);
  CHECK(e.field == "domains[0].rules[0].limits[0]");
  CHECK(e.message == "window: granularity 7000ms must divide the window 60000ms");
}

TEST_CASE("a window outside 1s..1d, or needing too many buckets, is an error") {
  const ParseError short_window = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits: [10/500ms]
)");
  CHECK(short_window.line == 6);
  CHECK(contains(short_window.message, "between 1s and 365d"));

  const ParseError too_fine = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        granularity: 1s
        limits: [10/1d]
)");
  CHECK(too_fine.line == 7);
  CHECK(too_fine.field == "domains[0].rules[0].limits[0]");
  CHECK(contains(too_fine.message, "more than 1440 buckets"));
}

TEST_CASE("a missing key is an error at the rule") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: ok
        key: [k]
        limits: [1/1s]
      - name: r
        limits: [100/1m]
)");
  CHECK(e.line == 7);
  CHECK(e.field == "domains[0].rules[1]");
  CHECK(contains(e.message, "missing required field `key`"));
}

TEST_CASE("a key that is not a list, empty, or repeats an entry is an error") {
  CHECK(only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: client_id
        limits: [1/1s]
)")
            .message == "must be a list of entry names, got a single value");

  const ParseError empty = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: []
        limits: [1/1s]
)");
  CHECK(empty.field == "domains[0].rules[0].key");
  CHECK(empty.line == 5);

  const ParseError dup = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [a, b, a]
        limits: [1/1s]
)");
  CHECK(dup.field == "domains[0].rules[0].key[2]");
  CHECK(contains(dup.message, "repeated"));
}

TEST_CASE("a rule with both limits and plan is an error at plan") {
  const ParseError e = only_error(R"(domains:
  - name: api
    plans:
      free: [100/1m]
    rules:
      - name: r
        key: [user]
        limits: [100/1m]
        plan: {from: plan, default: free}
)");
  CHECK(e.line == 9);
  CHECK(e.field == "domains[0].rules[0].plan");
  CHECK(contains(e.message, "either `limits` or `plan`"));
}

TEST_CASE("a rule with neither limits nor plan is an error at the rule") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [user]
)");
  CHECK(e.line == 4);
  CHECK(e.field == "domains[0].rules[0]");
  CHECK(contains(e.message, "needs `limits` or `plan`"));
}

TEST_CASE("an unknown default plan is an error at plan.default, even when plans come later") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [user]
        plan:
          from: plan
          default: gold
    plans:
      free: [100/1m]
      starter: [3000/1m]
)");
  CHECK(e.line == 8);
  CHECK(e.field == "domains[0].rules[0].plan.default");
  CHECK(e.message == "unknown plan `gold` (the domain declares: free, starter)");

  const ParseError no_plans = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [user]
        plan: {from: plan, default: free}
)");
  CHECK(no_plans.line == 6);
  CHECK(contains(no_plans.message, "declares no `plans`"));
}

TEST_CASE("a plan without from or default, or with a rule granularity, is an error") {
  ParseResult r = parse(R"(domains:
  - name: api
    plans:
      free: [100/1m]
    rules:
      - name: r
        key: [user]
        granularity: 1s
        plan: {}
)");
  INFO(all_errors(r));
  REQUIRE(r.errors.size() == 3);
  CHECK(r.errors[0].field == "domains[0].rules[0].granularity");
  CHECK(r.errors[0].line == 8);
  CHECK(contains(r.errors[1].message, "`from`"));
  CHECK(contains(r.errors[2].message, "`default`"));
}

TEST_CASE("a duplicate rule name is an error at the second rule") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [a]
        limits: [1/1s]
      - name: r
        key: [b]
        limits: [1/1s]
)");
  CHECK(e.line == 7);
  CHECK(e.field == "domains[0].rules[1].name");
  CHECK(contains(e.message, "duplicate rule `r`"));
  CHECK(contains(e.message, "line 4"));
}

TEST_CASE("a duplicate domain name is an error at the second domain") {
  const ParseError e = only_error(R"(domains:
  - name: api
  - name: web
  - name: api
)");
  CHECK(e.line == 4);
  CHECK(e.field == "domains[2].name");
  CHECK(contains(e.message, "duplicate domain `api`"));
}

TEST_CASE("two limits with the same window are an error at the second") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits: [100/1m, {limit: 50, window: 60s, granularity: 1s}]
)");
  CHECK(e.line == 6);
  CHECK(e.field == "domains[0].rules[0].limits[1]");
  CHECK(contains(e.message, "two limits with the window 1m"));
}

TEST_CASE("a YAML syntax error is one error with its line") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k
        limits: [1/1s]
)");
  CHECK(e.line == 6);  // where yaml-cpp notices the unclosed list
  CHECK(e.field.empty());
  CHECK(contains(e.message, "YAML syntax"));
  CHECK(e.to_string().rfind("rules.yaml:" + std::to_string(e.line) + ": YAML syntax", 0) == 0);

  const ParseError indent = only_error("domains:\n  - name: api\n   rules: []\n");
  CHECK(indent.line == 3);
}

TEST_CASE("every error is reported, in file order") {
  ParseResult r = parse(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits: [100/1x]
        mode: loud
      - name: bad name
        key: [k]
        limits: [1/1s]
        count_denied: yes
)");
  INFO(all_errors(r));
  REQUIRE_FALSE(r.rules.has_value());
  REQUIRE(r.errors.size() == 4);
  CHECK(r.errors[0].line == 6);
  CHECK(r.errors[0].field == "domains[0].rules[0].limits[0]");
  CHECK(r.errors[1].line == 7);
  CHECK(r.errors[1].field == "domains[0].rules[0].mode");
  CHECK(r.errors[1].message == "must be enforce | dry-run | shadow, got `loud`");
  CHECK(r.errors[2].line == 8);
  CHECK(r.errors[2].field == "domains[0].rules[1].name");
  CHECK(contains(r.errors[2].message, "not a valid name"));
  CHECK(r.errors[3].line == 11);
  CHECK(r.errors[3].field == "domains[0].rules[1].count_denied");
  CHECK(r.errors[3].message == "must be true or false, got `yes`");
}

TEST_CASE("an empty file, a missing domains list and wrong top-level types are errors") {
  for (std::string_view text : {"", "# nothing but a comment\n"}) {
    const ParseError e = only_error(text);
    CHECK(contains(e.message, "empty"));
    CHECK(e.line == 1);
  }
  const ParseError missing = only_error("{}\n");
  CHECK(missing.field == "domains");
  CHECK(contains(missing.message, "missing required field `domains`"));

  const ParseError not_map = only_error("- a\n- b\n");
  CHECK(contains(not_map.message, "got a list"));

  const ParseError not_list = only_error("domains: {name: api}\n");
  CHECK(not_list.field == "domains");
  CHECK(not_list.message == "must be a list, got a map");

  const ParseError two_docs = only_error("domains: []\n---\ndomains: []\n");
  CHECK(contains(two_docs.message, "more than one YAML document"));
}

TEST_CASE("an empty domains list is valid and every check is then unknown_domain") {
  auto p = Policy::compile(must_parse("domains: []\n"), {}, kSeed);
  CHECK(p->num_stats_slots() == 0);
  CHECK(p->window_specs().empty());
  CHECK(resolve(*p, "api", {{"k", "v"}}).req.error == CheckError::kUnknownDomain);
}

TEST_CASE("malformed or hostile text yields errors, never an exception") {
  const std::string deep(100'000, '[');
  const std::string binary("domains:\n  - name: \xff\xfe\x00\x01\n", 25);
  const std::string tabs = "domains:\n\t- name: api\n";
  const std::string huge = "domains:\n  - name: " + std::string(1'000'000, 'a') + "\n";
  for (const std::string& text : {deep, binary, tabs, std::string("{{{{"), std::string("&a *a")}) {
    ParseResult r;
    CHECK_NOTHROW(r = parse_rules(text, "hostile.yaml"));
    CHECK_FALSE(r.errors.empty());
    CHECK_FALSE(r.rules.has_value());
  }
  // A long but valid name is accepted: the file is trusted configuration, not request input.
  CHECK(parse(huge).errors.empty());
}

TEST_CASE("a repeated field is an error, not a silent override") {
  const ParseError e = only_error(R"(domains:
  - name: api
    rules:
      - name: r
        key: [k]
        limits: [1/1s]
        limits: [2/1s]
)");
  CHECK(e.line == 7);
  CHECK(e.field == "domains[0].rules[0].limits");
  CHECK(contains(e.message, "repeated (first on line 6)"));
}

TEST_CASE("allowlist entries are single key: value maps") {
  const ParseError e = only_error(R"(domains:
  - name: api
    allowlist:
      - {client_id: a}
      - {client_id: b, user: c}
)");
  CHECK(e.line == 5);
  CHECK(e.field == "domains[0].allowlist[1]");

  const ParseError scalar = only_error(R"(domains:
  - name: api
    allowlist: [client_id]
)");
  CHECK(scalar.field == "domains[0].allowlist[0]");
}

TEST_CASE("empty values, wrong types and repeated match conditions are errors") {
  ParseResult r = parse(R"(domains:
  - name: api
    plans:
      free: 100/1m
    rules:
      - name:
        key: [k]
        limits: []
        match: {grant_type: [a, b]}
        estimator: exact
        consistency: quorum
)");
  INFO(all_errors(r));
  REQUIRE(r.errors.size() == 6);
  CHECK(r.errors[0].field == "domains[0].plans.free");
  CHECK(r.errors[0].line == 4);
  CHECK(r.errors[1].field == "domains[0].rules[0].name");
  CHECK(r.errors[1].line == 6);  // an empty value is reported on its key's line
  CHECK(r.errors[2].field == "domains[0].rules[0].limits");
  CHECK(r.errors[2].message == "must hold at least one limit");
  CHECK(r.errors[3].field == "domains[0].rules[0].match.grant_type");
  CHECK(r.errors[4].field == "domains[0].rules[0].estimator");
  CHECK(r.errors[5].field == "domains[0].rules[0].consistency");
}

TEST_CASE("errors render as file:line: field: message") {
  CHECK(ParseError{"r.yaml", 12, "domains[0].rules[2].limits[1]", "bad"}.to_string() ==
        "r.yaml:12: domains[0].rules[2].limits[1]: bad");
  CHECK(ParseError{"r.yaml", 0, "", "cannot read"}.to_string() == "r.yaml: cannot read");
  CHECK(ParseError{"r.yaml", 3, "", "YAML syntax: x"}.to_string() == "r.yaml:3: YAML syntax: x");
}

TEST_CASE("an unreadable rules file is one error naming it") {
  ParseResult r = load_rules_file("/nonexistent/sluice/rules.yaml");
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].file == "/nonexistent/sluice/rules.yaml");
  CHECK(r.errors[0].line == 0);
  CHECK(contains(r.errors[0].message, "cannot read"));
  CHECK_FALSE(r.rules.has_value());

  ParseResult dir = load_rules_file("/");
  REQUIRE(dir.errors.size() == 1);
  CHECK(contains(dir.errors[0].message, "cannot read"));
}

TEST_CASE("the example rules file loads without errors and holds the seeds' scenarios") {
  const std::string path = std::string(SLUICE_SOURCE_DIR) + "/deploy/rules.example.yaml";
  ParseResult r = load_rules_file(path);
  INFO(all_errors(r));
  REQUIRE(r.errors.empty());
  REQUIRE(r.rules.has_value());
  std::vector<std::string> names;
  for (const Domain& d : r.rules->domains)
    names.push_back(d.name);
  CHECK(names == std::vector<std::string>{"oauth", "api", "dns"});

  auto p = Policy::compile(std::move(*r.rules), {}, kSeed);
  CHECK(
      resolve(*p, "oauth", {{"grant_type", "client_credentials"}, {"client_id", "allegro-mobile"}})
          .req.allowlisted);
  Resolved api = resolve(*p, "api", {{"api_key", "k1"}});
  CHECK(api.limits.size() >= 2);
  Resolved dns = resolve(*p, "dns", {{"ip", "198.51.100.1"}, {"user", "1"}, {"plan", "starter"}});
  CHECK(dns.req.num_rules == 2);
}

// ---- resolve ---------------------------------------------------------------------------------

TEST_CASE("a rule applies only when its conditions hold and all its key entries are present") {
  auto p = compile_text(R"(domains:
  - name: api
    rules:
      - name: any-tier
        match: {tier: "*"}
        key: [user]
        limits: [10/1s]
      - name: gold
        match: {tier: gold, region: eu}
        key: [user]
        limits: [20/1s]
      - name: pair
        key: [user, device]
        limits: [30/1s]
)");
  CHECK(resolve(*p, "api", {{"user", "u"}}).rule_names().empty());
  CHECK(resolve(*p, "api", {{"user", "u"}, {"tier", "silver"}}).rule_names() ==
        std::vector<std::string>{"any-tier"});
  CHECK(resolve(*p, "api", {{"user", "u"}, {"tier", "gold"}}).rule_names() ==
        std::vector<std::string>{"any-tier"});  // region missing
  CHECK(resolve(*p, "api", {{"region", "eu"}, {"user", "u"}, {"tier", "gold"}}).rule_names() ==
        std::vector<std::string>{"any-tier", "gold"});
  CHECK(resolve(*p, "api", {{"tier", "gold"}, {"region", "eu"}}).rule_names().empty());  // no key
  CHECK(resolve(*p, "api", {{"device", "d"}, {"user", "u"}}).rule_names() ==
        std::vector<std::string>{"pair"});
  // "*" requires presence, even of an empty value.
  CHECK(resolve(*p, "api", {{"user", "u"}, {"tier", ""}}).rule_names() ==
        std::vector<std::string>{"any-tier"});
}

TEST_CASE("resolve appends to the caller's Resolution and indexes into it") {
  auto p = compile_text(kSeed001);
  Resolution out;
  const std::vector<Descriptor> a{{"api_key", "k1"}};
  const std::vector<Descriptor> b{{"user", "u1"}, {"api_key", "k2"}};
  const ResolvedRequest ra = p->resolve({"api", a}, kNow, out);
  const ResolvedRequest rb = p->resolve({"api", b}, kNow, out);
  CHECK(ra.first_rule == 0);
  CHECK(ra.num_rules == 1);
  CHECK(rb.first_rule == 1);
  CHECK(rb.num_rules == 2);
  REQUIRE(out.rules.size() == 3);
  CHECK(out.rules[1].first_limit == 2);
  CHECK(out.rules[2].first_limit == 4);
  CHECK(out.rules[2].num_limits == 1);
  CHECK(out.limits.size() == 5);
  // Same api_key rule, different values: different counters.
  CHECK(out.limits[0].counter != out.limits[2].counter);
}

TEST_CASE("stats slots cover every rule of every domain in declaration order") {
  auto p = compile_text(seeds_text());
  // 7 rules, then one slot per domain for checks with their own limit (limit overrides).
  REQUIRE(p->num_stats_slots() == 10);
  CHECK(p->stats_name(0) == "oauth/token-per-client");
  CHECK(p->stats_name(2) == "oauth/refresh-per-user");
  CHECK(p->stats_name(3) == "api/per-key");
  CHECK(p->stats_name(6) == "dns/per-user");
  CHECK(p->stats_name(7) == "oauth/limit-override");
  CHECK(p->stats_name(9) == "dns/limit-override");
  CHECK(p->stats_name(10).empty());
  Resolved r = resolve(*p, "dns", {{"ip", "1.2.3.4"}, {"user", "9"}});
  REQUIRE(r.rules.size() == 2);
  CHECK(r.rules[0].stats_index == 5);
  CHECK(r.rules[1].stats_index == 6);
  CHECK(p->hash_seed() == kSeed);
  CHECK(p->rules().domains.size() == 3);
}

TEST_CASE("window_specs lists every distinct spec once, including plans and overrides") {
  Overrides ov;
  REQUIRE(ov.set(Override{"api", {{"api_key", "k1"}}, {limit_of(5, 2 * kMin)}, "", {}, 0}) == "");
  auto p = compile_text(seeds_text(), ov);
  const auto specs = p->window_specs();
  // 1m, 1h, 1s, 10m, 15m from the rules and plans, 2m from the override, then the limit
  // override units not already there: 1d, 7d, 30d, 365d.
  CHECK(specs.size() == 10);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      CHECK_FALSE(specs[i] == specs[j]);
  }
  Resolved r = resolve(*p, "api", {{"api_key", "k1"}});
  REQUIRE(r.limits.size() == 1);
  CHECK(specs[r.limits[0].spec_index] == make_spec(2 * kMin));
}

TEST_CASE("a long allowlist is looked up as fast as a short one, with the same answers") {
  std::string text = "domains:\n  - name: api\n    allowlist:\n";
  for (int i = 0; i < 50; ++i)
    text += "      - {client_id: trusted-" + std::to_string(i) + "}\n";
  text += "      - {ip: 10.0.0.1}\n";
  text += "    rules:\n      - name: r\n        key: [client_id]\n        limits: [1/1s]\n";
  auto p = compile_text(text);
  CHECK(resolve(*p, "api", {{"client_id", "trusted-0"}}).req.allowlisted);
  CHECK(resolve(*p, "api", {{"client_id", "trusted-49"}}).req.allowlisted);
  CHECK(resolve(*p, "api", {{"client_id", "x"}, {"ip", "10.0.0.1"}}).req.allowlisted);
  // Same value under another key is not allowlisted.
  Resolved other = resolve(*p, "api", {{"client_id", "x"}, {"user", "trusted-1"}});
  CHECK_FALSE(other.req.allowlisted);
  CHECK(other.req.num_rules == 1);
  CHECK_FALSE(resolve(*p, "api", {{"client_id", "trusted-50"}}).req.allowlisted);
}

// ---- input limits ---------------------------------------------------------------------------

TEST_CASE("every check error, with nothing appended") {
  InputLimits lim;
  lim.max_descriptors = 3;
  lim.max_entry_bytes = 8;
  lim.max_hits = 100;
  auto p = compile_text(kSeed001, {}, kSeed, lim);
  CHECK(p->input_limits().max_descriptors == 3);

  auto error_of = [&](std::string_view domain, std::vector<Descriptor> desc, uint64_t hits = 1) {
    Resolution out;
    const ResolvedRequest r = p->resolve(CheckRequest{domain, desc, hits}, kNow, out);
    if (r.error != CheckError::kNone) {
      CHECK(out.rules.empty());
      CHECK(out.limits.empty());
      CHECK(r.num_rules == 0);
      CHECK_FALSE(r.allowlisted);
    }
    return r.error;
  };
  CHECK(error_of("api", {{"api_key", "k"}}) == CheckError::kNone);
  CHECK(error_of("", {{"api_key", "k"}}) == CheckError::kEmptyDomain);
  CHECK(error_of("api", {{"api_key", "k"}}, 101) == CheckError::kHitsTooLarge);
  CHECK(error_of("api", {{"api_key", "k"}}, 100) == CheckError::kNone);
  CHECK(error_of("api", {{"api_key", "k"}}, 0) == CheckError::kNone);
  CHECK(error_of("api", {{"a", "1"}, {"b", "2"}, {"c", "3"}, {"d", "4"}}) ==
        CheckError::kTooManyDescriptors);
  CHECK(error_of("api", {{"api_key", "k"}, {"", "v"}}) == CheckError::kEmptyDescriptorKey);
  CHECK(error_of("api", {{"api_key", "123456789"}}) == CheckError::kEntryTooLong);
  CHECK(error_of("api", {{"api_key", "12345678"}}) == CheckError::kNone);  // exactly the limit
  CHECK(error_of("api", {{"a_very_long_key", "v"}}) == CheckError::kEntryTooLong);
  CHECK(error_of("api", {{"api_key", "k"}, {"user", "u"}, {"api_key", "j"}}) ==
        CheckError::kDuplicateDescriptor);
  CHECK(error_of("web", {{"api_key", "k"}}) == CheckError::kUnknownDomain);
}

TEST_CASE("check errors come in a fixed order when a request has several faults") {
  InputLimits lim;
  lim.max_descriptors = 2;
  lim.max_entry_bytes = 4;
  lim.max_hits = 10;
  auto p = compile_text(kSeed001, {}, kSeed, lim);
  auto error_of = [&](std::string_view domain, std::vector<Descriptor> desc, uint64_t hits) {
    Resolution out;
    return p->resolve(CheckRequest{domain, desc, hits}, kNow, out).error;
  };
  const std::vector<Descriptor> three{{"a", "1"}, {"b", "2"}, {"c", "3"}};
  CHECK(error_of("", three, 11) == CheckError::kEmptyDomain);
  CHECK(error_of("nope", three, 11) == CheckError::kHitsTooLarge);
  CHECK(error_of("nope", three, 1) == CheckError::kTooManyDescriptors);
  // An empty key anywhere wins over a long entry before it.
  CHECK(error_of("nope", {{"a", "too-long"}, {"", "v"}}, 1) == CheckError::kEmptyDescriptorKey);
  CHECK(error_of("nope", {{"a", "too-long"}, {"a", "v"}}, 1) == CheckError::kEntryTooLong);
  CHECK(error_of("nope", {{"a", "1"}, {"a", "2"}}, 1) == CheckError::kDuplicateDescriptor);
  CHECK(error_of("nope", {{"a", "1"}}, 1) == CheckError::kUnknownDomain);
}

TEST_CASE("a warm resolve allocates nothing") {
  Overrides ov;
  REQUIRE(ov.set(Override{
              "oauth", {{"client_id", "shop-17"}}, {limit_of(5000, kMin)}, "", {}, 0}) == "");
  const size_t before_compile = sluice::testing::allocations();
  auto p = compile_text(seeds_text(), ov);
  CHECK(sluice::testing::allocations() >
        before_compile);  // the counter does see the library's allocations
  const std::vector<Descriptor> oauth{{"grant_type", "client_credentials"},
                                      {"client_id", "shop-17"}};
  const std::vector<Descriptor> dns{{"ip", "1.2.3.4"}, {"user", "7"}, {"plan", "starter"}};
  const std::string long_value(255, 'x');  // two of them outgrow the stack buffer
  const std::vector<Descriptor> long_key{{"device", long_value},
                                         {"user", long_value},
                                         {"client_id", long_value},
                                         {"grant_type", "authorization_code"}};
  Resolution out;
  out.rules.reserve(64);
  out.limits.reserve(64);
  const size_t before = sluice::testing::allocations();
  for (int i = 0; i < 100; ++i) {
    out.clear();
    p->resolve({"oauth", oauth}, kNow, out);
    p->resolve({"dns", dns}, kNow, out);
    p->resolve({"api", std::span<const Descriptor>(dns).first(1)}, kNow, out);
    p->resolve({"oauth", long_key}, kNow, out);
    p->resolve({"unknown", dns}, kNow, out);
  }
  CHECK(sluice::testing::allocations() == before);
  CHECK(out.rules.size() == 4);  // per-client, per-ip, per-user, token-per-user
}

// ---- counter identity ----------------------------------------------------------------------

TEST_CASE("a rule that survives a reload keeps its counters") {
  auto first = compile_text(kSeed000);
  // The same rule, now in another position among other rules and with another limit value.
  auto second = compile_text(R"(domains:
  - name: web
    rules:
      - name: token-per-client
        key: [client_id]
        limits: [500/1m]
  - name: oauth
    rules:
      - name: new-rule
        key: [client_id]
        limits: [1/1m]
      - name: token-per-client
        match: {grant_type: client_credentials}
        key: [client_id]
        limits: [900/1m]
)");
  const std::vector<Descriptor> desc{{"grant_type", "client_credentials"},
                                     {"client_id", "shop-17"}};
  Resolved a = resolve(*first, "oauth", desc);
  Resolved b = resolve(*second, "oauth", desc);
  REQUIRE(a.limits.size() == 1);
  const AppliedRule* kept = b.rule("token-per-client");
  REQUIRE(kept != nullptr);
  const AppliedLimit& bl = b.limits[kept->first_limit];
  CHECK(bl.limit->requests == 900);
  CHECK(a.limits[0].counter == bl.counter);
  // A rule of the same name in another domain counts separately; so does another rule.
  Resolved web = resolve(*second, "web", desc);
  CHECK(web.limits[0].counter != a.limits[0].counter);
  CHECK(b.limits[b.rule("new-rule")->first_limit].counter != a.limits[0].counter);
}

TEST_CASE("a changed window or granularity, or another hash seed, starts a new counter") {
  const std::vector<Descriptor> desc{{"k", "v"}};
  auto counter = [&](std::string_view limits, uint64_t seed = kSeed) {
    auto p = compile_text(
        "domains:\n  - name: d\n    rules:\n      - name: r\n        key: [k]\n"
        "        limits: " +
            std::string(limits) + "\n",
        {}, seed);
    return resolve(*p, "d", desc).limits.at(0).counter;
  };
  const uint64_t base = counter("[100/1m]");
  CHECK(counter("[100/1m]") == base);
  CHECK(counter("[7/1m]") == base);
  CHECK(counter("[100/2m]") != base);
  CHECK(counter("[{limit: 100, window: 1m, granularity: 1s}]") != base);
  CHECK(counter("[100/1m]", kSeed + 1) != base);
}

TEST_CASE("key_hash and counter_id give what resolve uses") {
  auto p = compile_text(kSeed000);
  Resolved r =
      resolve(*p, "oauth",
              {{"user", "42"}, {"grant_type", "authorization_code"}, {"client_id", "shop-17"}});
  REQUIRE(r.limits.size() == 1);
  const std::string_view values[] = {"shop-17", "42"};  // in the rule's key order
  const Rule& per_user = *r.rules.at(0).rule;
  REQUIRE(per_user.name == "token-per-user");
  const uint64_t kh = key_hash(kSeed, "oauth", per_user, values);
  CHECK(counter_id(kh, r.limits[0].limit->spec) == r.limits[0].counter);

  const std::string_view swapped[] = {"42", "shop-17"};
  CHECK(key_hash(kSeed, "oauth", per_user, swapped) != kh);
  // Length prefixes keep value boundaries apart.
  const std::string_view ab_c[] = {"ab", "c"};
  const std::string_view a_bc[] = {"a", "bc"};
  Rule rr;
  rr.name = "r";
  rr.key = {"k", "j"};
  Rule rr2 = rr;
  rr2.name = "r2";
  Rule rr_other_keys = rr;  // same name, keyed by other entries: must not share counters
  rr_other_keys.key = {"user", "j"};
  CHECK(key_hash(kSeed, "d", rr, ab_c) != key_hash(kSeed, "d", rr, a_bc));
  CHECK(key_hash(kSeed, "d", rr, ab_c) != key_hash(kSeed, "d", rr2, ab_c));
  CHECK(key_hash(kSeed, "d", rr, ab_c) != key_hash(kSeed, "d", rr_other_keys, ab_c));
  CHECK(key_hash(kSeed, "d", rr, ab_c) != key_hash(kSeed + 1, "d", rr, ab_c));
  CHECK(counter_id(kh, make_spec(kMin)) != counter_id(kh, make_spec(2 * kMin)));
  CHECK(counter_id(kh, make_spec(kMin)) != counter_id(kh, make_spec(kMin, kSec)));
  CHECK(counter_id(0, make_spec(kMin)) != 0);
}

TEST_CASE("key_hash is XXH3 over length-prefixed values, whatever their length") {
  // The documented layout: seed = XXH3(domain '\0' rule ('\0' key)*, hash_seed); key_hash = XXH3
  // over each value prefixed by its LEB128 length. Another implementation (or a tool) can
  // rebuild it.
  Rule rr;
  rr.name = "r";
  rr.key = {"k", "j"};
  auto expected = [](uint64_t hash_seed, std::vector<std::string> values) {
    const std::string name = std::string("d") + '\0' + "r" + '\0' + "k" + '\0' + "j";
    const uint64_t seed = XXH3_64bits_withSeed(name.data(), name.size(), hash_seed);
    std::string bytes;
    for (const std::string& v : values) {
      uint64_t n = v.size();
      while (n >= 0x80) {
        bytes.push_back(static_cast<char>((n & 0x7f) | 0x80));
        n >>= 7;
      }
      bytes.push_back(static_cast<char>(n));
      bytes += v;
    }
    return XXH3_64bits_withSeed(bytes.data(), bytes.size(), seed);
  };
  for (size_t len : {0u, 1u, 127u, 128u, 300u, 511u, 600u, 5000u}) {
    INFO(len);
    const std::string a(len, 'a');
    const std::string b(len / 2, 'b');
    const std::string_view values[] = {a, b};
    CHECK(key_hash(kSeed, "d", rr, values) == expected(kSeed, {a, b}));
  }

  // Values that end just short of the stack buffer, then one that overflows it.
  const std::string a(500, 'a');
  const std::string b(100, 'b');
  const std::string_view edge[] = {a, "", "", "", "", "", "", "", "", "", b};
  CHECK(key_hash(kSeed, "d", rr, edge) ==
        expected(kSeed, {a, "", "", "", "", "", "", "", "", "", b}));

  // Resolve takes the same path for keys longer than its stack buffer.
  InputLimits lim;
  lim.max_entry_bytes = 4096;
  auto p = compile_text(
      "domains:\n  - name: d\n    rules:\n      - name: r\n        key: [k, j]\n"
      "        limits: [1/1s]\n",
      {}, kSeed, lim);
  const std::string big(3000, 'z');
  Resolved r = resolve(*p, "d", {{"j", "small"}, {"k", big}});
  REQUIRE(r.limits.size() == 1);
  CHECK(r.limits[0].counter == counter_id(expected(kSeed, {big, "small"}), make_spec(kSec)));
}

// ---- overrides in the policy ---------------------------------------------------------------

TEST_CASE("an override replaces a key's limits and keeps its counter") {
  const std::vector<Descriptor> desc{{"grant_type", "client_credentials"},
                                     {"client_id", "shop-17"}};
  auto plain = compile_text(kSeed000);
  Overrides ov;
  REQUIRE(ov.set(Override{
              "oauth", {{"client_id", "shop-17"}}, {limit_of(5000, kMin)}, "", {}, 0}) == "");
  auto p = compile_text(kSeed000, ov);

  Resolved before = resolve(*plain, "oauth", desc);
  Resolved r = resolve(*p, "oauth", desc);
  REQUIRE(r.rules.size() == 1);
  CHECK(r.rules[0].overridden);
  CHECK(r.rules[0].mode == Mode::kEnforce);
  REQUIRE(r.limits.size() == 1);
  CHECK(r.limits[0].limit->requests == 5000);
  CHECK(r.limits[0].limit->name == "token-per-client:5000/1m");
  CHECK(r.limits[0].counter == before.limits[0].counter);

  // Other clients keep the rule's limits.
  Resolved other = resolve(*p, "oauth", {{"grant_type", "client_credentials"}, {"client_id", "x"}});
  CHECK_FALSE(other.rules[0].overridden);
  CHECK(other.limits[0].limit->requests == 500);
}

TEST_CASE("an override with limits of another window counts in that window's counter") {
  Overrides ov;
  REQUIRE(ov.set(Override{"api",
                          {{"api_key", "k1"}},
                          {limit_of(5, kSec, "tight"), limit_of(100, 10 * kMin)},
                          "",
                          {},
                          0}) == "");
  auto p = compile_text(kSeed001, ov);
  Resolved r = resolve(*p, "api", {{"api_key", "k1"}});
  REQUIRE(r.limits.size() == 2);
  CHECK(r.limits[0].limit->name == "tight");
  CHECK(r.limits[1].limit->name == "per-key:100/10m");
  auto plain = compile_text(kSeed001);
  Resolved before = resolve(*plain, "api", {{"api_key", "k1"}});
  CHECK(r.limits[0].counter == before.limits[0].counter);  // 1s window in both
  CHECK(r.limits[1].counter == before.limits[1].counter);  // 10m window in both
}

TEST_CASE("an override can change only the mode") {
  Overrides ov;
  REQUIRE(ov.set(Override{"oauth", {{"client_id", "shop-17"}}, {}, "", Mode::kShadow, 0}) == "");
  auto p = compile_text(kSeed000, ov);
  Resolved r =
      resolve(*p, "oauth", {{"grant_type", "client_credentials"}, {"client_id", "shop-17"}});
  REQUIRE(r.rules.size() == 1);
  CHECK(r.rules[0].overridden);
  CHECK(r.rules[0].mode == Mode::kShadow);
  CHECK(r.limits[0].limit->requests == 500);
}

TEST_CASE("an override applies to every rule keyed by exactly its entries, in any order") {
  Overrides ov;
  REQUIRE(ov.set(Override{
              "oauth", {{"user", "42"}, {"client_id", "shop-17"}}, {}, "", Mode::kEnforce, 0}) ==
          "");
  auto p = compile_text(kSeed000, ov);
  Resolved refresh = resolve(
      *p, "oauth", {{"grant_type", "refresh_token"}, {"client_id", "shop-17"}, {"user", "42"}});
  REQUIRE(refresh.rules.size() == 1);
  CHECK(refresh.rules[0].overridden);
  CHECK(refresh.rules[0].mode == Mode::kEnforce);  // the dry-run rule now enforces for this key
  Resolved code =
      resolve(*p, "oauth",
              {{"grant_type", "authorization_code"}, {"client_id", "shop-17"}, {"user", "42"}});
  CHECK(code.rules[0].overridden);
  // Not the per-client rule (its key is client_id alone), and not another user.
  CHECK_FALSE(
      resolve(*p, "oauth",
              {{"grant_type", "client_credentials"}, {"client_id", "shop-17"}, {"user", "42"}})
          .rules[0]
          .overridden);
  CHECK_FALSE(resolve(*p, "oauth",
                      {{"grant_type", "refresh_token"}, {"client_id", "shop-17"}, {"user", "43"}})
                  .rules[0]
                  .overridden);
}

TEST_CASE("an expired override is ignored") {
  Overrides ov;
  REQUIRE(ov.set(Override{
              "oauth", {{"client_id", "shop-17"}}, {limit_of(5000, kMin)}, "", {}, kNow + 1}) ==
          "");
  auto p = compile_text(kSeed000, ov);
  const std::vector<Descriptor> desc{{"grant_type", "client_credentials"},
                                     {"client_id", "shop-17"}};
  Resolved live = resolve(*p, "oauth", desc, kNow);
  CHECK(live.rules[0].overridden);
  CHECK(live.limits[0].limit->requests == 5000);
  Resolved expired = resolve(*p, "oauth", desc, kNow + 1);
  CHECK_FALSE(expired.rules[0].overridden);
  CHECK(expired.limits[0].limit->requests == 500);
}

TEST_CASE("a plan assignment override wins over the descriptor's plan") {
  Overrides ov;
  REQUIRE(ov.set(Override{"dns", {{"user", "7"}}, {}, "pro", {}, 0}) == "");
  REQUIRE(ov.set(Override{"dns", {{"user", "8"}}, {}, "no-such-plan", {}, 0}) == "");
  auto p = compile_text(kSeed003, ov);
  auto user_limit = [&](std::vector<Descriptor> desc) {
    Resolved r = resolve(*p, "dns", std::move(desc));
    REQUIRE(r.rules.size() == 1);
    return r.limits.at(r.rules[0].first_limit).limit->requests;
  };
  CHECK(user_limit({{"user", "7"}, {"plan", "free"}}) == 20000);
  CHECK(user_limit({{"user", "7"}}) == 20000);
  // An unknown plan in an override keeps the descriptor's plan (or the default).
  CHECK(user_limit({{"user", "8"}, {"plan", "starter"}}) == 3000);
  CHECK(user_limit({{"user", "8"}}) == 100);
}

TEST_CASE("overrides for unknown domains or unmatched keys have no effect") {
  Overrides ov;
  REQUIRE(ov.set(Override{"nope", {{"client_id", "shop-17"}}, {}, "", Mode::kShadow, 0}) == "");
  REQUIRE(ov.set(Override{"oauth", {{"ip", "1.2.3.4"}}, {}, "", Mode::kShadow, 0}) == "");
  auto p = compile_text(kSeed000, ov);
  Resolved r =
      resolve(*p, "oauth",
              {{"grant_type", "client_credentials"}, {"client_id", "shop-17"}, {"ip", "1.2.3.4"}});
  CHECK_FALSE(r.rules[0].overridden);
  CHECK(r.rules[0].mode == Mode::kEnforce);
}

// ---- the overrides table -------------------------------------------------------------------

TEST_CASE("overrides are set, replaced, read, listed and deleted by domain and entries") {
  Overrides ov;
  CHECK(ov.set(Override{"oauth", {{"user", "42"}, {"client_id", "a"}}, {}, "", Mode::kDryRun, 0}) ==
        "");
  CHECK(ov.set(Override{"api", {{"api_key", "k"}}, {limit_of(1, kSec)}, "", {}, 0}) == "");
  CHECK(ov.size() == 2);

  using Entries = std::vector<std::pair<std::string, std::string>>;
  const Entries swapped{{"client_id", "a"}, {"user", "42"}};
  const Override* got = ov.get("oauth", swapped);
  REQUIRE(got != nullptr);
  CHECK(got->mode == Mode::kDryRun);
  CHECK(got->entries == swapped);  // stored sorted by key
  CHECK(ov.get("api", swapped) == nullptr);
  CHECK(ov.get("oauth", Entries{{"client_id", "a"}}) == nullptr);

  // Same domain and entries: replaced, not added.
  CHECK(ov.set(Override{"oauth", swapped, {}, "starter", {}, 0}) == "");
  CHECK(ov.size() == 2);
  got = ov.get("oauth", Entries{{"user", "42"}, {"client_id", "a"}});
  REQUIRE(got != nullptr);
  CHECK(got->plan == "starter");
  CHECK_FALSE(got->mode.has_value());

  const std::vector<Override> all = ov.list();
  REQUIRE(all.size() == 2);
  CHECK(all[0].domain == "api");
  CHECK(all[1].domain == "oauth");

  CHECK(ov.del("oauth", swapped));
  CHECK_FALSE(ov.del("oauth", swapped));
  CHECK(ov.size() == 1);
  CHECK(ov.get("oauth", swapped) == nullptr);
}

TEST_CASE("overrides list sorts by domain, then entries") {
  Overrides ov;
  for (std::string v : {"c", "a", "b"}) {
    REQUIRE(ov.set(Override{"d", {{"k", v}}, {}, "", Mode::kShadow, 0}) == "");
  }
  REQUIRE(ov.set(Override{"a", {{"k", "z"}}, {}, "", Mode::kShadow, 0}) == "");
  const std::vector<Override> all = ov.list();
  REQUIRE(all.size() == 4);
  CHECK(all[0].domain == "a");
  CHECK(all[1].entries[0].second == "a");
  CHECK(all[2].entries[0].second == "b");
  CHECK(all[3].entries[0].second == "c");
}

TEST_CASE("entries that look alike do not share an override id") {
  Overrides ov;
  REQUIRE(ov.set(Override{"d", {{"a", "b:c"}}, {}, "", Mode::kShadow, 0}) == "");
  REQUIRE(ov.set(Override{"d", {{"a:b", "c"}}, {}, "", Mode::kShadow, 0}) == "");
  REQUIRE(ov.set(Override{"d:a", {{"b", "c"}}, {}, "", Mode::kShadow, 0}) == "");
  CHECK(ov.size() == 3);
}

TEST_CASE("prune drops overrides that expired at or before now") {
  Overrides ov;
  REQUIRE(ov.set(Override{"d", {{"k", "never"}}, {}, "", Mode::kShadow, 0}) == "");
  REQUIRE(ov.set(Override{"d", {{"k", "early"}}, {}, "", Mode::kShadow, 100}) == "");
  REQUIRE(ov.set(Override{"d", {{"k", "late"}}, {}, "", Mode::kShadow, 200}) == "");
  CHECK(ov.prune(99) == 0);
  CHECK(ov.prune(100) == 1);
  CHECK(ov.size() == 2);
  using Entries = std::vector<std::pair<std::string, std::string>>;
  CHECK(ov.get("d", Entries{{"k", "early"}}) == nullptr);
  CHECK(ov.prune(1'000'000) == 1);
  CHECK(ov.get("d", Entries{{"k", "never"}}) != nullptr);
}

TEST_CASE("invalid overrides are refused with a reason and change nothing") {
  Overrides ov;
  auto reason = [&](Override o) {
    const std::string why = ov.set(std::move(o));
    CHECK(ov.size() == 0);
    return why;
  };
  const Mode m = Mode::kShadow;
  CHECK(contains(reason(Override{"", {{"k", "v"}}, {}, "", m, 0}), "no domain"));
  CHECK(contains(reason(Override{"d", {}, {}, "", m, 0}), "no descriptor entries"));
  CHECK(contains(reason(Override{"d", {{"", "v"}}, {}, "", m, 0}), "empty key"));
  CHECK(contains(reason(Override{"d", {{"k", "1"}, {"k", "2"}}, {}, "", m, 0}), "`k` twice"));
  CHECK(contains(reason(Override{"d", {{"k", "v"}}, {}, "", {}, 0}), "changes nothing"));
  CHECK(contains(reason(Override{"d", {{"k", "v"}}, {limit_of(0, kMin)}, "", {}, 0}),
                 "from 1 to 2^40"));
  CHECK(contains(reason(Override{"d", {{"k", "v"}}, {limit_of(1, 500)}, "", {}, 0}),
                 "window: window must be between 1s and 365d"));
  CHECK(contains(
      reason(Override{"d", {{"k", "v"}}, {Limit{"", 1, WindowSpec{kMin, 7 * kSec}}}, "", {}, 0}),
      "must divide"));
  CHECK(contains(
      reason(Override{"d", {{"k", "v"}}, {limit_of(1, kMin), limit_of(2, kMin)}, "", {}, 0}),
      "same window 1m"));
  CHECK(contains(reason(Override{"d", {{"k", "v"}}, {}, "", m, -1}), "negative"));
}

TEST_CASE("fallback: share by default, deny when asked, an error on a gossip rule or an unknown value") {
  const RuleSet rs = must_parse(R"(domains:
  - name: api
    rules:
      - name: shared
        key: [k]
        limits: [1/1s]
      - name: strict
        key: [k]
        limits: [1/1s]
        fallback: deny
)");
  CHECK(rs.domains[0].rules[0].fallback == Fallback::kShare);
  CHECK(rs.domains[0].rules[1].fallback == Fallback::kDeny);
  CHECK(to_string(Fallback::kShare) == "share");
  CHECK(to_string(Fallback::kDeny) == "deny");
  ParseResult r = parse(R"(domains:
  - name: api
    rules:
      - name: g
        key: [k]
        limits: [1/1s]
        consistency: gossip
        fallback: deny
      - name: o
        key: [k]
        limits: [1/1s]
        fallback: maybe
)");
  INFO(all_errors(r));
  REQUIRE(r.errors.size() == 2);
  CHECK(r.errors[0].field == "domains[0].rules[0].fallback");
  CHECK(r.errors[0].line == 8);
  CHECK(r.errors[0].message.find("consistency: owner") != std::string::npos);
  CHECK(r.errors[1].field == "domains[0].rules[1].fallback");
}

TEST_CASE("rules: text that makes yaml-cpp 0.7 loop is refused at once, naming its line") {
  // Each of these never returned from yaml-cpp (found by tests/fuzz/rules_fuzz).
  const std::vector<std::pair<std::string, int>> loops = {
      {",", 1}, {",\x01(", 1}, {" ,", 1}, {"# c\n,", 2}, {"\"x\"\n,", 2},
      {"{a: 1}\n,", 2}, {"domains: []\n---\n,", 2}};  // the second document starts at "---"
  for (const auto& [text, line] : loops) {
    CAPTURE(text);
    const auto r = sluice::rules::parse_rules(text, "r.yaml");
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].line == line);
    // The parser sees "another document" there (yaml_guard.h): one document per file.
    CHECK(r.errors[0].message.find("more than one YAML document") != std::string::npos);
    const auto e = sluice::rules::parse_envoy_rules(text, "e.yaml", {});
    CHECK_FALSE(e.errors.empty());
  }
  // Commas where YAML allows them still parse.
  const auto ok = sluice::rules::parse_rules(
      "domains:\n  - name: api\n    rules:\n      - name: r\n        key: [a,\n          b]\n"
      "        limits: [10/1s, 100/1m]\n",
      "ok.yaml");
  CHECK(ok.errors.empty());
}
