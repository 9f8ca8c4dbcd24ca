// Unit tests of lib/rules: the rules file (each example scenario, every kind of error with its line
// and field path), resolve() (matching, allowlist, plans, input limits), and the shipped example
// file. Counter identity and overrides: policy_overrides_test.cc.
#include "rules/rules.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "alloc_counter.h"  // this binary counts its heap allocations
#include "parse_results.h"

#include "rules_fixtures.h"

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
  // The default bucket (window::default_bucket_ms) cuts windows under ten minutes into ten
  // buckets: 1 min at 6 s, 1 s at 100 ms, 90 s at 9 s; 10 min and 1 d keep one-minute buckets.
  Limit l;
  CHECK(parse_limit("100/1m", 0, l).ok());
  CHECK(l.requests == 100);
  CHECK(l.spec == WindowSpec{60'000, 6'000});
  CHECK(l.default_bucket);

  CHECK(parse_limit("10/1s", 0, l).ok());
  CHECK(l.spec == WindowSpec{1'000, 100});

  CHECK(parse_limit("3000/10m", 0, l).ok());
  CHECK(l.spec == WindowSpec{600'000, 60'000});

  CHECK(parse_limit("20/90s", 0, l).ok());  // not whole minutes: ten 9 s buckets
  CHECK(l.spec == WindowSpec{90'000, 9'000});

  CHECK(parse_limit("500/1d", 0, l).ok());
  CHECK(l.spec == WindowSpec{86'400'000, 60'000});

  CHECK(parse_limit("100/1m", 1'000, l).ok());
  CHECK(l.spec == WindowSpec{60'000, 1'000});
  CHECK_FALSE(l.default_bucket);

  CHECK(parse_limit("1099511627776/1m", 0, l).ok());  // 2^40, the largest
  CHECK(l.requests == (uint64_t{1} << 40));
}

TEST_CASE("parse_limit explains what is wrong") {
  Limit l;
  l.requests = 7;
  CHECK(contains(parse_limit("100", 0, l).message(), "N/duration"));
  CHECK(contains(parse_limit("0/1m", 0, l).message(), "from 1 to 2^40"));
  CHECK(contains(parse_limit("1099511627777/1m", 0, l).message(), "from 1 to 2^40"));
  CHECK(contains(parse_limit("-5/1m", 0, l).message(), "from 1 to 2^40"));
  CHECK(contains(parse_limit("100/1x", 0, l).message(), "bad window `1x`"));
  CHECK(contains(parse_limit("100/500ms", 0, l).message(),
                 "window: window must be between 1s and 365d"));
  CHECK(contains(parse_limit("100/366d", 0, l).message(), "window must be between 1s and 365d"));
  CHECK(contains(parse_limit("100/1m", 7'000, l).message(), "granularity 7000ms must divide"));
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

// ---- the example scenarios (docs/rules.md, "Examples") ------------------------------------------

TEST_CASE("oauth: per-client and per-(client, user) limits by grant type, allowlist, dry-run") {
  const RuleSet rs = must_parse(kOauthRules);
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
  // Written without a granularity: the default bucket, ten per window under ten minutes.
  CHECK(per_client.limits[0].spec == WindowSpec{60'000, 6'000});
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

TEST_CASE("oauth: resolve picks the rule of the grant type, the trusted client is allowlisted") {
  auto p = compile_text(kOauthRules);

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

TEST_CASE("api: two windows on one key, and 10000 per 15 minutes") {
  const RuleSet rs = must_parse(kApiRules);
  const Rule& per_key = rs.domains[0].rules[0];
  REQUIRE(per_key.limits.size() == 2);
  CHECK(per_key.limits[0].name == "per-key:10/1s");
  CHECK(per_key.limits[0].spec == WindowSpec{1'000, 100});  // default: ten 100 ms buckets
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

TEST_CASE("dns: plans chosen by a descriptor under a per-IP cap") {
  const RuleSet rs = must_parse(kDnsRules);
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

TEST_CASE("a limit in map form takes a name and a granularity, the limit's own granularity wins") {
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
  CHECK(b.limits[0].name == "b:100/1m");              // named after the rule that uses them
  CHECK(b.limits[1].spec == WindowSpec{1'000, 100});  // the default bucket of 1 s: 100 ms
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

TEST_CASE("the example rules file loads without errors and holds the example scenarios") {
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
  auto p = compile_text(kApiRules);
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
  auto p = compile_text(example_rules_text());
  // 7 rules, then one slot per domain for checks with their own limit (limit overrides), then
  // one per domain for checks with a redis-cell limit.
  REQUIRE(p->num_stats_slots() == 13);
  CHECK(p->stats_name(0) == "oauth/token-per-client");
  CHECK(p->stats_name(2) == "oauth/refresh-per-user");
  CHECK(p->stats_name(3) == "api/per-key");
  CHECK(p->stats_name(6) == "dns/per-user");
  CHECK(p->stats_name(7) == "oauth/limit-override");
  CHECK(p->stats_name(9) == "dns/limit-override");
  CHECK(p->stats_name(10) == "oauth/cell");
  CHECK(p->stats_name(12) == "dns/cell");
  CHECK(p->stats_name(13).empty());
  Resolved r = resolve(*p, "dns", {{"ip", "1.2.3.4"}, {"user", "9"}});
  REQUIRE(r.rules.size() == 2);
  CHECK(r.rules[0].stats_index == 5);
  CHECK(r.rules[1].stats_index == 6);
  CHECK(p->hash_seed() == kSeed);
  CHECK(p->rules().domains.size() == 3);
}

TEST_CASE("window_specs lists every distinct spec once, including plans and overrides") {
  Overrides ov;
  REQUIRE(ov.set(Override{"api", {{"api_key", "k1"}}, {limit_of(5, 2 * kMin)}, "", {}, 0}).ok());
  auto p = compile_text(example_rules_text(), ov);
  const auto specs = p->window_specs();
  // 1m (6 s buckets), 1h, 1s (100 ms buckets), 10m, 15m from the rules and plans, 2m from the
  // override, then the limit override units not already there: 1d, 7d, 30d, 365d. And the older
  // default specs of the 1m and 1s limits written without a granularity (1m and 1s in one
  // bucket each), whose counters those limits carry counts from for one window after compile
  // (Limit::default_bucket). 1h, 10m and 15m have the same default bucket as before. And the
  // one spec of every cell limit (cell_window_spec): 13.
  CHECK(specs.size() == 13);
  CHECK(std::find(specs.begin(), specs.end(), cell_window_spec()) != specs.end());
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      CHECK_FALSE(specs[i] == specs[j]);
  }
  auto listed = [&](const WindowSpec& s) {
    return std::find(specs.begin(), specs.end(), s) != specs.end();
  };
  CHECK(listed(WindowSpec{60'000, 6'000}));
  CHECK(listed(WindowSpec{60'000, 60'000}));
  CHECK(listed(WindowSpec{1'000, 100}));
  CHECK(listed(WindowSpec{1'000, 1'000}));
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
  auto p = compile_text(kApiRules, {}, kSeed, lim);
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
  auto p = compile_text(kApiRules, {}, kSeed, lim);
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
  REQUIRE(ov.set(Override{"oauth", {{"client_id", "shop-17"}}, {limit_of(5000, kMin)}, "", {}, 0})
              .ok());
  const size_t before_compile = sluice::testing::allocations();
  auto p = compile_text(example_rules_text(), ov);
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

TEST_CASE(
    "fallback: share by default, deny when asked, an error on a gossip rule or an unknown value") {
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
      {",", 1},
      {",\x01(", 1},
      {" ,", 1},
      {"# c\n,", 2},
      {"\"x\"\n,", 2},
      {"{a: 1}\n,", 2},
      {"domains: []\n---\n,", 2}};  // the second document starts at "---"
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

TEST_CASE(
    "consistency: lease parses, takes a fallback, writes back as read, its limits are windows") {
  const RuleSet rs = must_parse(R"(domains:
  - name: api
    rules:
      - name: leased
        key: [k]
        limits: [100/1s, 1000/1m]
        consistency: lease
        fallback: deny
)");
  const Rule& r = rs.domains[0].rules[0];
  CHECK(r.consistency == Consistency::kLease);
  CHECK(r.fallback == Fallback::kDeny);
  CHECK(to_string(Consistency::kLease) == "lease");
  CHECK(sluice::rules::owner_decides(Consistency::kLease));
  CHECK(sluice::rules::owner_decides(Consistency::kOwner));
  CHECK_FALSE(sluice::rules::owner_decides(Consistency::kGossip));
  const std::string yaml = to_rules_yaml(rs);
  CHECK(yaml.find("consistency: lease") != std::string::npos);
  CHECK(must_parse(yaml).domains[0].rules[0].consistency == Consistency::kLease);
  struct Case {
    std::string limit, words;
  };
  for (const Case& c : {Case{"{algorithm: gcra, rate: 5/1s, burst: 5}", "`algorithm: gcra`"},
                        Case{"{algorithm: concurrency, max_in_flight: 2, lease_ttl: 30s}",
                             "takes `consistency: owner`"}}) {
    CAPTURE(c.limit);
    const ParseError e = sluice::testing::require_one_error(
        parse_rules("domains:\n  - name: api\n    rules:\n      - name: r\n        key: [k]\n"
                    "        limits:\n          - " +
                        c.limit + "\n        consistency: lease\n",
                    "rules.yaml"));
    CHECK(e.field == "domains[0].rules[0].consistency");
    CHECK(e.line == 8);
    CHECK_MESSAGE(e.message.find(c.words) != std::string::npos, e.message);
  }
}

// ---- concurrency limits -------------------------------------------------------------------------

TEST_CASE("bad concurrency limits are errors naming the file, the line and the field") {
  struct Case {
    std::string limit;  // the limit's flow map
    std::string extra;  // rule fields before `limits`
    std::string field;  // the field path the error names
    std::string words;  // part of its message
  };
  const std::vector<Case> cases = {
      {"{algorithm: concurrency, lease_ttl: 30s}", "", "domains[0].rules[0].limits[0]",
       "missing required field `max_in_flight`"},
      {"{algorithm: concurrency, max_in_flight: 20}", "", "domains[0].rules[0].limits[0]",
       "missing required field `lease_ttl`"},
      {"{algorithm: concurrency, max_in_flight: 0, lease_ttl: 30s}", "",
       "domains[0].rules[0].limits[0].max_in_flight", "whole number from 1"},
      {"{algorithm: concurrency, max_in_flight: 4294967296, lease_ttl: 30s}", "",
       "domains[0].rules[0].limits[0].max_in_flight", "whole number from 1"},
      {"{algorithm: concurrency, max_in_flight: 20, lease_ttl: 500ms}", "",
       "domains[0].rules[0].limits[0].lease_ttl", "from 1s to 1d"},
      {"{algorithm: concurrency, max_in_flight: 20, lease_ttl: 2d}", "",
       "domains[0].rules[0].limits[0].lease_ttl", "from 1s to 1d"},
      {"{algorithm: concurrency, max_in_flight: 20, lease_ttl: 30s, granularity: 7s}", "",
       "domains[0].rules[0].limits[0].granularity", "granularity"},
      {"{algorithm: concurrency, max_in_flight: 20, lease_ttl: 30s, limit: 5}", "",
       "domains[0].rules[0].limits[0].limit", "does not apply to `algorithm: concurrency`"},
      {"{algorithm: concurrency, max_in_flight: 20, lease_ttl: 30s, rate: 5/1s}", "",
       "domains[0].rules[0].limits[0].rate", "does not apply to `algorithm: concurrency`"},
      {"{limit: 5, window: 1s, max_in_flight: 20}", "",
       "domains[0].rules[0].limits[0].max_in_flight", "applies to `algorithm: concurrency` only"},
      {"{algorithm: gcra, rate: 5/1s, burst: 5, lease_ttl: 30s}", "",
       "domains[0].rules[0].limits[0].lease_ttl", "does not apply to `algorithm: gcra`"},
      {"{algorithm: concurrency, max_in_flight: 20, lease_ttl: 30s}",
       "        consistency: gossip\n", "domains[0].rules[0].consistency",
       "takes `consistency: owner`"},
      {"{algorithm: semaphore, max_in_flight: 20, lease_ttl: 30s}", "",
       "domains[0].rules[0].limits[0].algorithm", "semaphore"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.limit);
    const std::string yaml =
        "domains:\n  - name: api\n    rules:\n      - name: in-flight\n"
        "        key: [client]\n" +
        c.extra + "        limits:\n          - " + c.limit + "\n";
    const ParseError e = sluice::testing::require_one_error(parse_rules(yaml, "rules.yaml"));
    CHECK(e.file == "rules.yaml");
    CHECK(e.line >= 6);
    CHECK(e.field == c.field);
    CHECK_MESSAGE(e.message.find(c.words) != std::string::npos, e.message);
  }
}

TEST_CASE("sluicectl rules convert writes concurrency limits back as they were read") {
  const RuleSet rs = must_parse(R"(domains:
  - name: api
    rules:
      - name: in-flight
        key: [client]
        limits:
          - {algorithm: concurrency, max_in_flight: 20, lease_ttl: 30s}
          - {algorithm: concurrency, max_in_flight: 5, lease_ttl: 1m, granularity: 1s, name: slow}
)");
  const std::string yaml = to_rules_yaml(rs);
  const RuleSet again = must_parse(yaml);
  const auto& a = rs.domains[0].rules[0].limits;
  const auto& b = again.domains[0].rules[0].limits;
  REQUIRE(b.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CAPTURE(yaml);
    CHECK(b[i].algorithm == Algorithm::kConcurrency);
    CHECK(a[i].name == b[i].name);
    CHECK(a[i].requests == b[i].requests);
    CHECK(a[i].spec == b[i].spec);
  }
  CHECK(a[0].name == "in-flight:20-in-flight");
  CHECK(a[0].spec == WindowSpec{30'000, 3'000});
  CHECK(a[1].spec == WindowSpec{60'000, 1'000});
  // A concurrency limit counts apart from a window limit of the same length and buckets.
  Limit w;
  REQUIRE(parse_limit("20/30s", 3'000, w).ok());
  CHECK(counter_id(0x1234'5678'9abc'def0ull, w) != counter_id(0x1234'5678'9abc'def0ull, a[0]));
  CHECK(routing_key(counter_id(0x1234'5678'9abc'def0ull, w)) ==
        routing_key(counter_id(0x1234'5678'9abc'def0ull, a[0])));
}
