// Unit tests of the envoyproxy/ratelimit import (docs/envoy-config.md): parsing every field and
// every error with its file, line and field; loading files and directories; upstream's
// descriptor walk through Policy::resolve and Policy::envoy_rule; requests_per_unit 0; week,
// month and year windows against an exact sliding log; the per-check limit override through
// resolve, the engine and the wire; and `sluicectl rules convert`'s output.
#include "rules/rules.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "alloc_counter.h"  // this binary counts its heap allocations
#include "engine/engine.h"
#include "exact_log.h"
#include "parse_results.h"
#include "text.h"
#include "wire/protocol.h"

using namespace sluice::rules;
namespace engine = sluice::engine;
namespace wire = sluice::wire;
namespace window = sluice::window;

namespace {

constexpr int64_t kSec = 1'000;
constexpr int64_t kMin = 60 * kSec;
constexpr int64_t kHour = 60 * kMin;
constexpr int64_t kDay = 24 * kHour;
constexpr int64_t kNow = 1'700'000'000'000;
constexpr uint64_t kSeed = 0x5eed;
const std::string kData = std::string(SLUICE_SOURCE_DIR) + "/tests/data/envoy/";

using sluice::testing::all_errors;
using sluice::testing::contains;

ParseResult parse(std::string_view text, EnvoyImportOptions o = {}) {
  return parse_envoy_rules(text, "rl.yaml", o);
}

RuleSet must_load(const std::string& path, EnvoyImportOptions o = {}) {
  return sluice::testing::require_rules(load_envoy_rules(path, o));
}

ParseError only_error(std::string_view text) {
  return sluice::testing::require_one_error(parse(text));
}

const Rule* rule_named(const Domain& d, std::string_view name) {
  for (const Rule& r : d.rules) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

// What resolve says about one request: the rules applied (names), their limits, allowlisted.
struct Outcome {
  CheckError error = CheckError::kNone;
  bool allowlisted = false;
  std::vector<std::string> rules;
  std::vector<AppliedLimit> limits;
  std::string only() const {
    return rules.size() == 1 ? rules[0] : "<" + std::to_string(rules.size()) + " rules>";
  }
};

Outcome resolve(const Policy& p, std::string_view domain,
                std::vector<std::pair<std::string, std::string>> entries, CheckRequest req = {}) {
  std::vector<Descriptor> desc;
  for (const auto& [k, v] : entries)
    desc.push_back({k, v});
  req.domain = domain;
  req.descriptors = desc;
  Resolution out;
  const ResolvedRequest rr = p.resolve(req, kNow, out);
  Outcome o;
  o.error = rr.error;
  o.allowlisted = rr.allowlisted;
  for (uint32_t i = 0; i < rr.num_rules; ++i)
    o.rules.push_back(out.rules[rr.first_rule + i].rule->name);
  o.limits = out.limits;
  return o;
}

std::shared_ptr<const Policy> compile_files(std::initializer_list<std::string> files,
                                            const Overrides& ov = {}) {
  RuleSet all;
  for (const std::string& f : files) {
    RuleSet one = must_load(kData + f);
    REQUIRE(merge_rule_sets(all, std::move(one), "", f).empty());
  }
  return Policy::compile(std::move(all), ov, kSeed);
}

// A fresh temporary directory, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/sluice-envoy-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, std::string_view text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

}  // namespace

// ==== parsing ====================================================================================

TEST_CASE("a basic config becomes one rule per limited node, named by upstream's key path") {
  const RuleSet rs = must_load(kData + "basic.yaml");
  REQUIRE(rs.domains.size() == 1);
  const Domain& d = rs.domains[0];
  CHECK(d.name == "shop");
  CHECK(d.envoy);
  CHECK(d.source == kData + "basic.yaml");
  std::vector<std::string> names;
  for (const Rule& r : d.rules)
    names.push_back(r.name);
  CHECK(names == std::vector<std::string>{"tenant_acme.route", "tenant_acme.route_checkout",
                                          "tenant.plan", "client", "client_partner", "ip",
                                          "region_eu", "region_eu.user_alice"});
  const Rule* r = rule_named(d, "tenant_acme.route_checkout");
  REQUIRE(r != nullptr);
  CHECK(r->key == std::vector<std::string>{"tenant", "route"});
  CHECK(r->match.empty());
  REQUIRE(r->limits.size() == 1);
  CHECK(r->limits[0].requests == 10);
  CHECK(r->limits[0].spec == window::make_spec(kSec));
  CHECK(r->limits[0].name.empty());
  CHECK(r->mode == Mode::kEnforce);
  CHECK(r->count_denied);  // upstream counts every hit
  CHECK(r->line == 12);    // the descriptor's `- key:` line
  CHECK(r->consistency == Consistency::kOwner);

  // Units in any case; the limit name carried.
  CHECK(rule_named(d, "client_partner")->limits[0].spec.window_ms == kMin);
  const Rule* ip = rule_named(d, "ip");
  CHECK(ip->limits[0].spec.window_ms == kHour);
  CHECK(ip->limits[0].name == "per_ip");
  CHECK(rule_named(d, "region_eu")->limits[0].spec.window_ms == kDay);
  // shadow_mode is Sluice's dry-run (answers OK, counts), not Sluice's shadow.
  const Rule* alice = rule_named(d, "region_eu.user_alice");
  CHECK(alice->mode == Mode::kDryRun);
  CHECK(alice->limits[0].spec == window::WindowSpec{7 * kDay, kHour});

  // The tree: client_internal has no rule (exempt), health is unlimited and has no rule.
  REQUIRE(d.envoy_tree.size() == 8);
  CHECK(d.envoy_tree[4].key == "client");
  CHECK(d.envoy_tree[4].value == "internal");
  CHECK(d.envoy_tree[4].rule == -1);
  CHECK(d.envoy_tree[6].key == "health");
  CHECK(d.envoy_tree[6].unlimited);
  CHECK(d.envoy_tree[6].rule == -1);
  CHECK(d.envoy_tree[0].children.size() == 2);
  CHECK(d.rules[static_cast<size_t>(d.envoy_tree[0].children[1].rule)].name ==
        "tenant_acme.route_checkout");
}

TEST_CASE("every upstream field is accepted, replaces, quota_mode and 0..2^32-1 carry over") {
  EnvoyImportOptions o;
  o.count_denied = false;
  const RuleSet rs = must_load(kData + "full.yaml", o);
  const Domain& d = rs.domains[0];
  REQUIRE(d.rules.size() == 2);
  const Rule& gold = d.rules[0];
  CHECK(gold.name == "api_key_gold");
  CHECK(gold.limits[0].name == "gold");
  CHECK(gold.limits[0].requests == 0);
  CHECK(gold.replaces == std::vector<std::string>{"silver", "bronze"});
  CHECK(gold.quota_mode);
  CHECK_FALSE(gold.count_denied);
  const Rule& silver = d.rules[1];
  CHECK(silver.limits[0].requests == 4'294'967'295ull);
  CHECK(silver.limits[0].spec == window::WindowSpec{365 * kDay, kDay});
  CHECK(silver.replaces.empty());
  CHECK_FALSE(silver.quota_mode);
}

TEST_CASE("units: second to year, case-insensitive, and their windows") {
  CHECK(envoy_unit_ms("second") == kSec);
  CHECK(envoy_unit_ms("MINUTE") == kMin);
  CHECK(envoy_unit_ms("Hour") == kHour);
  CHECK(envoy_unit_ms("day") == kDay);
  CHECK(envoy_unit_ms("week") == 7 * kDay);
  CHECK(envoy_unit_ms("month") == 30 * kDay);
  CHECK(envoy_unit_ms("year") == 365 * kDay);
  CHECK_FALSE(envoy_unit_ms("unknown").has_value());
  CHECK_FALSE(envoy_unit_ms("").has_value());
  CHECK_FALSE(envoy_unit_ms("seconds").has_value());
  CHECK(envoy_unit_name(30 * kDay) == "month");
  CHECK(envoy_unit_name(90 * kSec).empty());
}

TEST_CASE("every error names the file, the line and the field") {
  struct Case {
    std::string_view text;
    int line;
    std::string_view field;
    std::string_view message;
  };
  const Case cases[] = {
      {"domain: \"\"\ndescriptors: []\n", 1, "domain", "the domain must not be empty"},
      {"descriptors: []\n", 1, "domain", "the domain must not be empty"},
      {"domain: d\ndescriptors:\n  - value: v\n", 3, "descriptors[0].key",
       "needs a non-empty `key`"},
      {"domain: d\ndescriptors:\n  - key: a\n  - key: b\n    descriptors:\n      - key: c\n"
       "        value: v\n      - key: c\n        value: v\n",
       8, "descriptors[1].descriptors[1]",
       "duplicate descriptor composite key `b.c_v` (first on line 6)"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n"
       "      requests_per_unit: 1\n",
       5, "descriptors[0].rate_limit.unit", "invalid unit `fortnight`"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 1\n", 5,
       "descriptors[0].rate_limit.unit", "invalid unit ``"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n"
       "      unit: second\n",
       6, "descriptors[0].rate_limit.unit", "takes no unit"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
       "      replaces:\n        - name: \"\"\n",
       7, "descriptors[0].rate_limit.replaces[0]", "needs a non-empty `name`"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: me\n      unit: second\n"
       "      replaces:\n        - name: me\n",
       8, "descriptors[0].rate_limit.replaces[0]", "cannot replace itself (`me`)"},
      {"domain: d\ndescriptors:\n  - key: a\n    value: plain\n    share_threshold: true\n", 3,
       "descriptors[0].share_threshold", "needs a wildcard ('*')"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
       "      requests_per_unit: -1\n",
       6, "descriptors[0].rate_limit.requests_per_unit", "from 0 to 4294967295, got `-1`"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
       "      requests_per_unit: 4294967296\n",
       6, "descriptors[0].rate_limit.requests_per_unit", "got `4294967296`"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
       "      requests_per_unit: many\n",
       6, "descriptors[0].rate_limit.requests_per_unit", "got `many`"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n"
       "      requestsperunit: 5\n",
       6, "descriptors[0].rate_limit.requestsperunit", "unknown field `requestsperunit`"},
      {"domain: d\ndescriptors:\n  - a\n  - b\n", 3, "descriptors[0]", "list items must be maps"},
      {"0.25: d\ndescriptors: []\n", 1, "", "field names must be strings, got `0.25`"},
      {"domain: d\ndescriptors: 5\n", 2, "descriptors", "must be a list of descriptors"},
      {"domain: d\ndescriptors:\n  - key: a\n    rate_limit: [1]\n", 4, "descriptors[0].rate_limit",
       "must be a map"},
      {"domain: [d]\n", 1, "domain", "must be a single value"},
      {"domain: d\ndescriptors:\n  - key: a\n    shadow_mode: sometimes\n", 4,
       "descriptors[0].shadow_mode", "must be true or false, got `sometimes`"},
      {"domain: d\ndescriptors:\n  - key: a\n   value: b\n", 4, "", "YAML syntax"},
      {"- a\n", 1, "", "a map with `domain` and `descriptors`"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    ParseResult r = parse(c.text);
    INFO(all_errors(r));
    CHECK_FALSE(r.rules.has_value());
    REQUIRE_FALSE(r.errors.empty());
    const ParseError& e = r.errors[0];
    CHECK(e.file == "rl.yaml");
    CHECK(e.line == c.line);
    CHECK(e.field == c.field);
    CHECK(contains(e.message, c.message));
  }
}

TEST_CASE("every problem of a file is reported, in line order, not only the first") {
  ParseResult r = parse(
      "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: eon}\n  - key: \"\"\n"
      "  - key: b\n    colour: red\n");
  REQUIRE(r.errors.size() == 3);
  CHECK(r.errors[0].line == 4);
  CHECK(r.errors[1].line == 5);
  CHECK(r.errors[2].line == 7);
  CHECK(r.errors[2].to_string() ==
        "rl.yaml:7: descriptors[2].colour: unknown field `colour` "
        "(upstream's fields: domain, descriptors, key, value, "
        "rate_limit, unit, requests_per_unit, unlimited, name, "
        "replaces, shadow_mode, quota_mode, detailed_metric, "
        "value_to_metric, share_threshold, metadata)");
}

TEST_CASE("upstream quirks are kept: known keys anywhere, metadata free-form, a bare key") {
  // Upstream checks key names, not their place: `domain` inside rate_limit is accepted.
  ParseResult r = parse(
      "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, "
      "domain: x}\n    metadata: {anything: [1, {deep: true}], colour: red}\n  - key: b\n");
  INFO(all_errors(r));
  REQUIRE(r.rules.has_value());
  CHECK(r.rules->domains[0].rules.size() == 1);
  CHECK(r.rules->domains[0].envoy_tree.size() == 2);
  // key "a_b" and key "a" value "b" are one composite key upstream.
  const ParseError e =
      only_error("domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n");
  CHECK(contains(e.message, "duplicate descriptor composite key `a_b`"));
  // An empty descriptors list is a domain that limits nothing.
  CHECK(parse("domain: d\n").rules.has_value());
}

// ==== loading ====================================================================================

TEST_CASE("a directory loads every .yaml/.yml file by name, other files are ignored") {
  TempDir dir;
  dir.write(
      "b.yml",
      "domain: second\ndescriptors: [{key: k, rate_limit: {unit: hour, requests_per_unit: 3}}]\n");
  dir.write("a.yaml", "domain: first\ndescriptors: []\n");
  dir.write("notes.txt", "not yaml: [\n");
  std::filesystem::create_directory(dir.path / "sub.yaml");  // not recursive, not a file
  const RuleSet rs = must_load(dir.path.string());
  REQUIRE(rs.domains.size() == 2);
  CHECK(rs.domains[0].name == "first");
  CHECK(rs.domains[1].name == "second");
  CHECK(rs.domains[1].source == (dir.path / "b.yml").string());
}

TEST_CASE("two files with one domain is an error naming both, bad files are all reported") {
  TempDir dir;
  const std::string a = dir.write("a.yaml", "domain: same\n");
  const std::string b = dir.write("b.yaml", "domain: same\n");
  const std::string c = dir.write("c.yaml", "domain: d\ndescriptors: [{key: \"\"}]\n");
  ParseResult r = load_envoy_rules(dir.path.string(), {});
  CHECK_FALSE(r.rules.has_value());
  REQUIRE(r.errors.size() == 2);
  CHECK(r.errors[0].file == b);
  CHECK(contains(r.errors[0].message, "duplicate domain `same` (also in " + a + ")"));
  CHECK(r.errors[1].file == c);

  ParseResult missing = load_envoy_rules((dir.path / "nope").string(), {});
  REQUIRE(missing.errors.size() == 1);
  CHECK(contains(missing.errors[0].message, "no envoy rate limit config here"));
}

TEST_CASE("merging a native rule set with envoy domains refuses a domain in both, naming both") {
  ParseResult native = parse_rules(
      "domains:\n  - name: shop\n    rules:\n      - {name: r, key: [k], limits: [1/1s]}\n",
      "rules.yaml");
  REQUIRE(native.rules.has_value());
  RuleSet envoy = must_load(kData + "basic.yaml");
  const auto errors = merge_rule_sets(*native.rules, std::move(envoy), "rules.yaml", "envoy/");
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].file == kData + "basic.yaml");
  CHECK(contains(errors[0].message, "duplicate domain `shop` (also in rules.yaml)"));
}

// ==== the walk ===================================================================================

TEST_CASE("resolve walks the tree as upstream's GetLimit") {
  auto p = compile_files({"basic.yaml", "wildcard.yaml"});
  // Nested: key+value then key-only default; the value beats the key-only sibling.
  CHECK(resolve(*p, "shop", {{"tenant", "acme"}, {"route", "x"}}).only() == "tenant_acme.route");
  CHECK(resolve(*p, "shop", {{"tenant", "acme"}, {"route", "checkout"}}).only() ==
        "tenant_acme.route_checkout");
  CHECK(resolve(*p, "shop", {{"client", "anyone"}}).only() == "client");
  CHECK(resolve(*p, "shop", {{"client", "partner"}}).only() == "client_partner");
  // A key+value node without a limit exempts that value from the key-only default.
  Outcome internal = resolve(*p, "shop", {{"client", "internal"}});
  CHECK(internal.rules.empty());
  CHECK_FALSE(internal.allowlisted);
  // Depth must match: too deep or too shallow gives no limit.
  CHECK(resolve(*p, "shop", {{"client", "anyone"}, {"extra", "1"}}).rules.empty());
  CHECK(resolve(*p, "shop", {{"tenant", "acme"}}).rules.empty());
  CHECK(resolve(*p, "shop", {{"region", "eu"}}).only() == "region_eu");
  CHECK(resolve(*p, "shop", {{"region", "eu"}, {"user", "alice"}}).only() ==
        "region_eu.user_alice");
  CHECK(resolve(*p, "shop", {{"region", "eu"}, {"user", "bob"}}).rules.empty());
  // No backtracking: tenant_acme has no `plan` child; the key-only `tenant` branch is not tried.
  CHECK(resolve(*p, "shop", {{"tenant", "acme"}, {"plan", "p"}}).rules.empty());
  CHECK(resolve(*p, "shop", {{"tenant", "other"}, {"plan", "p"}}).only() == "tenant.plan");
  // Order matters: entries are walked in the request's order.
  CHECK(resolve(*p, "shop", {{"route", "x"}, {"tenant", "acme"}}).rules.empty());
  // Unknown first entry, and no entries at all.
  CHECK(resolve(*p, "shop", {{"nothing", "here"}}).rules.empty());
  CHECK(resolve(*p, "shop", {}).rules.empty());
  // Unlimited: never limited nor counted.
  Outcome health = resolve(*p, "shop", {{"health", "x"}});
  CHECK(health.allowlisted);
  CHECK(health.rules.empty());

  // Wildcards: trailing, middle and several '*', the first match in declaration order, then
  // the key-only default.
  CHECK(resolve(*p, "files", {{"path", "/static/app.js"}}).only() == "path_/static/*");
  CHECK(resolve(*p, "files", {{"path", "/static/"}}).only() == "path_/static/*");
  CHECK(resolve(*p, "files", {{"path", "/img/1/thumb.png"}}).only() == "path_/img/*/thumb*");
  CHECK(resolve(*p, "files", {{"path", "/img/thumb"}}).only() == "path");  // shorter than fixed
  CHECK(resolve(*p, "files", {{"path", "/img//thumb"}}).only() == "path_/img/*/thumb*");
  CHECK(resolve(*p, "files", {{"path", "/img/x/big"}}).only() == "path");
  CHECK(resolve(*p, "files", {{"path", "/abc"}}).only() == "path_/a*");
  CHECK(resolve(*p, "files", {{"path", "/zzz"}}).only() == "path");
  // area=europe matches eu* (first) and e*: eu* wins, and its subtree decides (no backtracking
  // into e*'s user_bob).
  CHECK(resolve(*p, "files", {{"area", "europe"}, {"user", "bob"}}).only() == "area_eu*.user");
  CHECK(resolve(*p, "files", {{"area", "east"}, {"user", "bob"}}).only() == "area_e*.user_bob");
  CHECK(resolve(*p, "files", {{"area", "east"}, {"user", "carol"}}).rules.empty());
}

TEST_CASE("wildcards match against key_value, so a pattern can span the separator") {
  ParseResult r = parse(
      "domain: d\ndescriptors:\n  - key: a\n    value: \"*x\"\n    rate_limit: {unit: second, "
      "requests_per_unit: 1}\n  - key: \"b*\"\n    rate_limit: {unit: second, requests_per_unit: "
      "2}\n");
  INFO(all_errors(r));
  REQUIRE(r.rules.has_value());
  auto p = Policy::compile(std::move(*r.rules), {}, kSeed);
  CHECK(resolve(*p, "d", {{"a", "x"}}).only() == "a_*x");
  CHECK(resolve(*p, "d", {{"a", "boxx"}}).only() == "a_*x");
  CHECK(resolve(*p, "d", {{"a", "y"}}).rules.empty());
  // A key-only node whose key holds '*' is a pattern over "key_value" too, as upstream.
  CHECK(resolve(*p, "d", {{"bee", "1"}}).only() == "b*");
  CHECK(resolve(*p, "d", {{"b", ""}}).only() == "b*");
}

TEST_CASE("the counter key is the request's values: other values count apart, same ones together") {
  auto p = compile_files({"basic.yaml"});
  const Outcome a1 = resolve(*p, "shop", {{"tenant", "acme"}, {"route", "x"}});
  const Outcome a2 = resolve(*p, "shop", {{"tenant", "acme"}, {"route", "x"}});
  const Outcome b = resolve(*p, "shop", {{"tenant", "acme"}, {"route", "y"}});
  REQUIRE(a1.limits.size() == 1);
  CHECK(a1.limits[0].counter == a2.limits[0].counter);
  CHECK(a1.limits[0].counter != b.limits[0].counter);
  CHECK(a1.limits[0].requests == 5);
  const Rule* rule = rule_named(p->rules().domains[0], "tenant_acme.route");
  const std::string_view values[] = {"acme", "x"};
  CHECK(a1.limits[0].counter ==
        counter_id(key_hash(kSeed, "shop", *rule, values), rule->limits[0].spec));
}

TEST_CASE("envoy requests may repeat a key, native domains still refuse it") {
  ParseResult r = parse(
      "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: k\n        rate_limit: "
      "{unit: minute, requests_per_unit: 3}\n");
  REQUIRE(r.rules.has_value());
  ParseResult native = parse_rules(
      "domains:\n  - name: n\n    rules:\n      - {name: r, key: [k], limits: [1/1s]}\n", "r.yaml");
  REQUIRE(native.rules.has_value());
  REQUIRE(merge_rule_sets(*r.rules, std::move(*native.rules), "", "r.yaml").empty());
  auto p = Policy::compile(std::move(*r.rules), {}, kSeed);
  const Outcome env = resolve(*p, "d", {{"k", "1"}, {"k", "2"}});
  CHECK(env.error == CheckError::kNone);
  CHECK(env.only() == "k.k");
  CHECK(resolve(*p, "n", {{"k", "1"}, {"k", "2"}}).error == CheckError::kDuplicateDescriptor);
}

TEST_CASE("envoy_rule, is_envoy_domain and domain_has_replaces answer the gRPC front") {
  RuleSet rs = must_load(kData + "full.yaml");
  RuleSet basic = must_load(kData + "basic.yaml");
  REQUIRE(merge_rule_sets(rs, std::move(basic), "", "basic.yaml").empty());
  auto p = Policy::compile(std::move(rs), {}, kSeed);
  CHECK(p->is_envoy_domain("billing"));
  CHECK_FALSE(p->is_envoy_domain("nope"));
  CHECK(p->domain_has_replaces("billing"));
  CHECK_FALSE(p->domain_has_replaces("shop"));
  const Descriptor gold[] = {{"api_key", "gold"}};
  bool unlimited = true;
  const Rule* r = p->envoy_rule("billing", gold, unlimited);
  REQUIRE(r != nullptr);
  CHECK_FALSE(unlimited);
  CHECK(r->quota_mode);
  CHECK(r->replaces == std::vector<std::string>{"silver", "bronze"});
  const Descriptor health[] = {{"health", "1"}};
  CHECK(p->envoy_rule("shop", health, unlimited) == nullptr);
  CHECK(unlimited);
  const Descriptor none[] = {{"zzz", "1"}};
  CHECK(p->envoy_rule("shop", none, unlimited) == nullptr);
  CHECK_FALSE(unlimited);
  CHECK(p->envoy_rule("nope", none, unlimited) == nullptr);
}

TEST_CASE("overrides work on envoy rules: the override's entries are the rule's key entries") {
  Overrides ov;
  Limit l;
  l.requests = 99;
  l.spec = window::make_spec(kMin);
  REQUIRE(ov.set(Override{"shop", {{"tenant", "acme"}, {"route", "x"}}, {l}, "", Mode::kDryRun, 0})
              .ok());
  auto p = compile_files({"basic.yaml"}, ov);
  std::vector<Descriptor> desc = {{"tenant", "acme"}, {"route", "x"}};
  Resolution out;
  const ResolvedRequest rr = p->resolve(CheckRequest{"shop", desc, 1}, kNow, out);
  REQUIRE(rr.num_rules == 1);
  CHECK(out.rules[0].overridden);
  CHECK(out.rules[0].mode == Mode::kDryRun);
  REQUIRE(out.limits.size() == 1);
  CHECK(out.limits[0].requests == 99);
  CHECK(out.limits[0].limit->spec.window_ms == kMin);
  // Another value of the same rule is not overridden.
  CHECK(resolve(*p, "shop", {{"tenant", "acme"}, {"route", "y"}}).limits[0].requests == 5);
}

TEST_CASE("the walk allocates nothing once the Resolution is warm") {
  auto p = compile_files({"basic.yaml", "wildcard.yaml"});
  const std::vector<Descriptor> reqs[] = {{{"tenant", "acme"}, {"route", "checkout"}},
                                          {{"path", "/img/1/thumb.png"}},
                                          {{"area", "europe"}, {"user", "bob"}},
                                          {{"client", "internal"}},
                                          {{"health", "1"}}};
  Resolution out;
  for (const auto& d : reqs)
    p->resolve(CheckRequest{"files", d, 1}, kNow, out);
  for (const auto& d : reqs)
    p->resolve(CheckRequest{"shop", d, 1}, kNow, out);
  CheckRequest over{"shop", reqs[0], 1};
  over.has_limit_override = true;
  over.limit_override_requests = 3;
  over.limit_override_window_ms = kHour;
  p->resolve(over, kNow, out);
  const uint64_t before = sluice::testing::allocations();
  for (int i = 0; i < 100; ++i) {
    out.clear();
    for (const auto& d : reqs) {
      p->resolve(CheckRequest{"files", d, 1}, kNow, out);
      p->resolve(CheckRequest{"shop", d, 1}, kNow, out);
    }
    p->resolve(over, kNow, out);
  }
  CHECK(sluice::testing::allocations() == before);
}

// ==== decisions through the engine ===============================================================

namespace {

struct Checker {
  engine::Engine eng;
  engine::BatchResult res;
  explicit Checker(std::shared_ptr<const Policy> p) : eng(std::move(p)) {}
  // One check; returns its decision (limits in res.limits).
  engine::Decision check(std::string_view domain, std::vector<Descriptor> desc, int64_t now,
                         uint64_t hits = 1, uint64_t override_requests = 0,
                         int64_t override_window = 0) {
    CheckRequest req{domain, desc, hits};
    if (override_window != 0) {
      req.has_limit_override = true;
      req.limit_override_requests = override_requests;
      req.limit_override_window_ms = override_window;
    }
    eng.check(std::span<const CheckRequest>(&req, 1), now, res);
    return res.decisions[0];
  }
};

}  // namespace

TEST_CASE(
    "requests_per_unit 0 denies every hit, a hits=0 check on it is allowed (0 > 0 is false)") {
  Checker c(compile_files({"full.yaml"}));
  const engine::Decision ask = c.check("billing", {{"api_key", "gold"}}, kNow, 0);
  CHECK(ask.allowed);
  for (int i = 0; i < 3; ++i) {
    const engine::Decision d = c.check("billing", {{"api_key", "gold"}}, kNow + i);
    CHECK_FALSE(d.allowed);
    REQUIRE(d.num_limits == 1);
    CHECK(c.res.limits[d.first_limit].requests == 0);
    CHECK(c.res.limits[d.first_limit].exceeded);
  }
  // Denied hits counted (upstream's INCRBY happens whatever the outcome): now over the limit.
  CHECK_FALSE(c.check("billing", {{"api_key", "gold"}}, kNow + 5, 0).allowed);
}

TEST_CASE("shadow_mode answers OK and reports would-deny, unlimited is never counted") {
  Checker c(compile_files({"basic.yaml"}));
  for (int i = 0; i < 30; ++i)
    CHECK(c.check("shop", {{"region", "eu"}, {"user", "alice"}}, kNow + i).allowed);
  const engine::Decision d = c.check("shop", {{"region", "eu"}, {"user", "alice"}}, kNow + 40);
  CHECK(d.allowed);
  CHECK(d.would_deny);
  const engine::Decision h = c.check("shop", {{"health", "x"}}, kNow, 1'000'000);
  CHECK(h.allowed);
  CHECK(h.allowlisted);
  CHECK(h.num_limits == 0);
}

TEST_CASE("week, month and year windows track an exact sliding log on a randomized trace") {
  // Per unit: a Poisson trace at twice the limit over four windows, requests of 1..3 hits at
  // random milliseconds, decided by the engine through an imported rule (weighted estimator,
  // denied hits not counted) and, apart, by an exact sliding log admitting whenever the true
  // window has room. Published in docs/envoy-config.md.
  struct Unit {
    std::string_view name;
    int64_t window;
  };
  for (const Unit u :
       {Unit{"week", 7 * kDay}, Unit{"month", 30 * kDay}, Unit{"year", 365 * kDay}}) {
    CAPTURE(u.name);
    const uint64_t limit = 1'000;
    EnvoyImportOptions o;
    o.count_denied = false;
    ParseResult r =
        parse("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: " + std::string(u.name) +
                  ", requests_per_unit: 1000}\n",
              o);
    REQUIRE(r.rules.has_value());
    Checker c(Policy::compile(std::move(*r.rules), {}, kSeed));
    sluice::testing::ExactSlidingLog exact(u.window);
    sluice::testing::ExactSlidingLog admitted_log(u.window);  // what the engine admitted
    std::mt19937_64 rng(42);
    const double mean_gap =
        static_cast<double>(u.window) / (2.0 * static_cast<double>(limit) / 2.0);
    std::exponential_distribution<double> gap(1.0 / mean_gap);
    std::uniform_int_distribution<uint64_t> cost(1, 3);
    const int64_t start = 19'675LL * kDay;  // a whole number of days since the epoch
    uint64_t engine_admitted = 0, exact_admitted = 0, offered = 0;
    for (auto t = static_cast<double>(start); t < static_cast<double>(start + 4 * u.window);
         t += gap(rng)) {
      const auto now = static_cast<int64_t>(t);
      const uint64_t hits = cost(rng);
      offered += hits;
      if (c.check("d", {{"k", "v"}}, now, hits).allowed) {
        engine_admitted += hits;
        admitted_log.record(now, hits);
      }
      if (exact.count(now) + hits <= limit) {
        exact.record(now, hits);
        exact_admitted += hits;
      }
    }
    const double error =
        (static_cast<double>(engine_admitted) - static_cast<double>(exact_admitted)) /
        static_cast<double>(exact_admitted);
    MESSAGE(u.name << ": offered " << offered << ", exact log admitted " << exact_admitted
                   << ", sliding window admitted " << engine_admitted << " (" << error * 100.0
                   << " %), largest true window " << admitted_log.max_window_count() << " / "
                   << limit);
    CHECK(std::abs(error) < 0.05);
    // Weighted estimates can over-admit within one bucket's share of the window, no more.
    const double bucket_share =
        static_cast<double>(window::make_spec(u.window).bucket_ms) / static_cast<double>(u.window);
    CHECK(static_cast<double>(admitted_log.max_window_count()) <=
          static_cast<double>(limit) * (1.0 + bucket_share) + 3.0);
  }
}

TEST_CASE("a year counter is kept for its whole window, then swept, memory as documented") {
  Checker c(compile_files({"full.yaml"}));  // api_key: 4294967295 per year, 1-day buckets
  REQUIRE(c.check("billing", {{"api_key", "k"}}, kNow).allowed);
  CHECK(c.eng.stats().live_counters == 1);
  // The engine's table holds whole year slots: 16 + 8 x 366 bytes each (docs/envoy-config.md,
  // "Windows and memory").
  const uint64_t table_bytes = c.eng.stats().table_bytes;
  CHECK(table_bytes > 0);
  CHECK(table_bytes % 2'944 == 0);
  // 364 days later the hit is still inside the window: kept (a check would advance the ring's
  // head, and the counter would then live a year from that check instead).
  CHECK(c.eng.sweep(kNow + 364 * kDay) == 0);
  CHECK(c.eng.stats().live_counters == 1);
  // Once every bucket (365 + the straddling one) has left the window it is dropped.
  CHECK(c.eng.sweep(kNow + 367 * kDay) == 1);
  CHECK(c.eng.stats().live_counters == 0);
}

// ==== the per-check limit override ===============================================================

TEST_CASE("a limit override replaces every rule, counts under the domain and all entries") {
  auto p = compile_files({"basic.yaml"});
  CheckRequest o;
  o.has_limit_override = true;
  o.limit_override_requests = 2;
  o.limit_override_window_ms = kHour;
  const Outcome a = resolve(*p, "shop", {{"client", "partner"}}, o);
  CHECK(a.only() == "limit-override");
  REQUIRE(a.limits.size() == 1);
  CHECK(a.limits[0].requests == 2);
  CHECK(a.limits[0].limit->spec == window::make_spec(kHour));
  // Keys count too: same values under other keys is another counter.
  const Outcome b = resolve(*p, "shop", {{"user", "partner"}}, o);
  CHECK(b.limits[0].counter != a.limits[0].counter);
  // Another window is another counter; the same entries under the rule are too.
  o.limit_override_window_ms = kDay;
  const Outcome c = resolve(*p, "shop", {{"client", "partner"}}, o);
  CHECK(c.limits[0].counter != a.limits[0].counter);
  CHECK(resolve(*p, "shop", {{"client", "partner"}}).limits[0].counter != a.limits[0].counter);
  // Even an exempt or unlimited request is limited by its own limit (upstream checks it first).
  CHECK(resolve(*p, "shop", {{"health", "x"}}, o).only() == "limit-override");
  // Native domains too; unknown domains stay unknown; a window that is no unit is refused.
  ParseResult native = parse_rules(
      "domains:\n  - name: n\n    rules:\n      - {name: r, key: [k], limits: [1/1s]}\n", "r.yaml");
  auto np = Policy::compile(std::move(*native.rules), {}, kSeed);
  CHECK(resolve(*np, "n", {{"k", "1"}}, o).only() == "limit-override");
  CHECK(resolve(*np, "zz", {{"k", "1"}}, o).error == CheckError::kUnknownDomain);
  o.limit_override_window_ms = 90 * kSec;
  CHECK(resolve(*np, "n", {{"k", "1"}}, o).error == CheckError::kBadLimitOverride);
  CHECK(to_string(CheckError::kBadLimitOverride) == "bad_limit_override");
}

TEST_CASE("the engine decides and reports a limit override by its value, not the rule's") {
  Checker c(compile_files({"basic.yaml"}));
  for (int i = 0; i < 3; ++i) {
    const engine::Decision d = c.check("shop", {{"client", "x"}}, kNow + i, 1, 3, kMin);
    CHECK(d.allowed);
    REQUIRE(d.num_limits == 1);
    const engine::LimitResult& l = c.res.limits[d.first_limit];
    CHECK(l.requests == 3);
    CHECK(l.remaining == static_cast<uint64_t>(2 - i));
  }
  CHECK_FALSE(c.check("shop", {{"client", "x"}}, kNow + 10, 1, 3, kMin).allowed);
  // The rule's own counter (20/min) was not touched.
  const engine::Decision rule = c.check("shop", {{"client", "x"}}, kNow + 20);
  CHECK(rule.allowed);
  CHECK(c.res.limits[rule.first_limit].requests == 20);
  CHECK(c.res.limits[rule.first_limit].remaining == 19);
}

TEST_CASE("a limit override travels on the wire, a window that is no unit is malformed") {
  const wire::Entry entries[] = {{"client", "x"}};
  wire::Check checks[4] = {};
  for (wire::Check& ch : checks) {
    ch.domain = "shop";
    ch.entries = entries;
  }
  checks[1].has_limit_override = true;
  checks[1].limit_override_requests = 7;
  checks[1].limit_override_window_ms = 30 * kDay;
  checks[2].has_limit_override = true;
  checks[2].limit_override_requests = 7;
  checks[2].limit_override_window_ms = 90 * kSec;
  checks[3].has_limit_override = true;
  checks[3].limit_override_requests = (uint64_t{1} << 40) + 1;
  checks[3].limit_override_window_ms = kSec;
  std::vector<uint8_t> bytes;
  wire::encode_request(9, checks, 0, bytes);
  wire::RequestDecoder d;
  REQUIRE(d.decode(bytes) == wire::Code::kOk);
  REQUIRE(d.checks().size() == 4);
  CHECK_FALSE(d.checks()[0].has_limit_override);
  CHECK(d.check_code(0) == wire::Code::kOk);
  CHECK(d.checks()[1].has_limit_override);
  CHECK(d.checks()[1].limit_override_requests == 7);
  CHECK(d.checks()[1].limit_override_window_ms == 30 * kDay);
  CHECK(d.check_code(1) == wire::Code::kOk);
  CHECK(d.check_code(2) == wire::Code::kMalformed);
  CHECK(d.check_code(3) == wire::Code::kMalformed);
  // Every unit window is accepted.
  for (int64_t w : wire::kLimitOverrideWindowsMs) {
    CAPTURE(w);
    CHECK(envoy_unit_name(w) != "");
    checks[1].limit_override_window_ms = w;
    wire::encode_request(9, std::span<const wire::Check>(checks, 2), 0, bytes);
    REQUIRE(d.decode(bytes) == wire::Code::kOk);
    CHECK(d.check_code(1) == wire::Code::kOk);
  }
}

// ==== sluicectl rules convert ====================================================================

TEST_CASE("convert prints Sluice rules that parse, with comments where the walk differs") {
  RuleSet rs = must_load(kData + "basic.yaml");
  RuleSet more = must_load(kData + "wildcard.yaml");
  REQUIRE(merge_rule_sets(rs, std::move(more), "", "").empty());
  RuleSet full = must_load(kData + "full.yaml");
  REQUIRE(merge_rule_sets(rs, std::move(full), "", "").empty());
  const std::string yaml = to_rules_yaml(rs);
  INFO(yaml);
  ParseResult back = parse_rules(yaml, "converted.yaml");
  INFO(all_errors(back));
  REQUIRE(back.rules.has_value());
  REQUIRE(back.rules->domains.size() == 3);
  const Domain& shop = back.rules->domains[0];
  const Rule* checkout = rule_named(shop, "tenant_acme.route_checkout");
  REQUIRE(checkout != nullptr);
  CHECK(checkout->key == std::vector<std::string>{"tenant", "route"});
  REQUIRE(checkout->match.size() == 2);
  CHECK(checkout->match[1].key == "route");
  CHECK(checkout->match[1].value == "checkout");
  CHECK(checkout->count_denied);
  CHECK(rule_named(shop, "region_eu.user_alice")->mode == Mode::kDryRun);
  CHECK(rule_named(shop, "region_eu.user_alice")->limits[0].spec.window_ms == 7 * kDay);
  CHECK(rule_named(back.rules->domains[1], "path_-static--") != nullptr);  // '/' and '*' -> '-'
  CHECK(contains(yaml, "a key+value node beats the key-only one"));
  CHECK(contains(yaml, "cannot be expressed: this rule matches any value of `path`"));
  CHECK(contains(yaml, "requests_per_unit 0 (deny all) cannot be written"));
  CHECK(contains(yaml, "are unlimited upstream"));
  CHECK(contains(yaml,
                 "# replaces / quota_mode of \"api_key_gold\" are handled by the gRPC front only"));
}
