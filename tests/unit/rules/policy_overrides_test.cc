// Unit tests of lib/rules over time: counter identity across compiles (a reloaded rule keeps its
// counters, a changed one starts new ones), overrides in the compiled policy, and the overrides
// table.
#include "rules/rules.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "rules_fixtures.h"

// ---- counter identity ----------------------------------------------------------------------

TEST_CASE("a rule that survives a reload keeps its counters") {
  auto first = compile_text(kOauthRules);
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
  auto p = compile_text(kOauthRules);
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
  auto plain = compile_text(kOauthRules);
  Overrides ov;
  REQUIRE(ov.set(Override{"oauth", {{"client_id", "shop-17"}}, {limit_of(5000, kMin)}, "", {}, 0})
              .ok());
  auto p = compile_text(kOauthRules, ov);

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
                          0})
              .ok());
  auto p = compile_text(kApiRules, ov);
  Resolved r = resolve(*p, "api", {{"api_key", "k1"}});
  REQUIRE(r.limits.size() == 2);
  CHECK(r.limits[0].limit->name == "tight");
  CHECK(r.limits[1].limit->name == "per-key:100/10m");
  auto plain = compile_text(kApiRules);
  Resolved before = resolve(*plain, "api", {{"api_key", "k1"}});
  CHECK(r.limits[0].counter == before.limits[0].counter);  // 1s window in both
  CHECK(r.limits[1].counter == before.limits[1].counter);  // 10m window in both
}

TEST_CASE("an override can change only the mode") {
  Overrides ov;
  REQUIRE(ov.set(Override{"oauth", {{"client_id", "shop-17"}}, {}, "", Mode::kShadow, 0}).ok());
  auto p = compile_text(kOauthRules, ov);
  Resolved r =
      resolve(*p, "oauth", {{"grant_type", "client_credentials"}, {"client_id", "shop-17"}});
  REQUIRE(r.rules.size() == 1);
  CHECK(r.rules[0].overridden);
  CHECK(r.rules[0].mode == Mode::kShadow);
  CHECK(r.limits[0].limit->requests == 500);
}

TEST_CASE("an override applies to every rule keyed by exactly its entries, in any order") {
  Overrides ov;
  REQUIRE(
      ov.set(Override{
                 "oauth", {{"user", "42"}, {"client_id", "shop-17"}}, {}, "", Mode::kEnforce, 0})
          .ok());
  auto p = compile_text(kOauthRules, ov);
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
                     "oauth", {{"client_id", "shop-17"}}, {limit_of(5000, kMin)}, "", {}, kNow + 1})
              .ok());
  auto p = compile_text(kOauthRules, ov);
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
  REQUIRE(ov.set(Override{"dns", {{"user", "7"}}, {}, "pro", {}, 0}).ok());
  REQUIRE(ov.set(Override{"dns", {{"user", "8"}}, {}, "no-such-plan", {}, 0}).ok());
  auto p = compile_text(kDnsRules, ov);
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
  REQUIRE(ov.set(Override{"nope", {{"client_id", "shop-17"}}, {}, "", Mode::kShadow, 0}).ok());
  REQUIRE(ov.set(Override{"oauth", {{"ip", "1.2.3.4"}}, {}, "", Mode::kShadow, 0}).ok());
  auto p = compile_text(kOauthRules, ov);
  Resolved r =
      resolve(*p, "oauth",
              {{"grant_type", "client_credentials"}, {"client_id", "shop-17"}, {"ip", "1.2.3.4"}});
  CHECK_FALSE(r.rules[0].overridden);
  CHECK(r.rules[0].mode == Mode::kEnforce);
}

// ---- the overrides table -------------------------------------------------------------------

TEST_CASE("overrides are set, replaced, read, listed and deleted by domain and entries") {
  Overrides ov;
  CHECK(ov.set(Override{"oauth", {{"user", "42"}, {"client_id", "a"}}, {}, "", Mode::kDryRun, 0})
            .ok());
  CHECK(ov.set(Override{"api", {{"api_key", "k"}}, {limit_of(1, kSec)}, "", {}, 0}).ok());
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
  CHECK(ov.set(Override{"oauth", swapped, {}, "starter", {}, 0}).ok());
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
    REQUIRE(ov.set(Override{"d", {{"k", v}}, {}, "", Mode::kShadow, 0}).ok());
  }
  REQUIRE(ov.set(Override{"a", {{"k", "z"}}, {}, "", Mode::kShadow, 0}).ok());
  const std::vector<Override> all = ov.list();
  REQUIRE(all.size() == 4);
  CHECK(all[0].domain == "a");
  CHECK(all[1].entries[0].second == "a");
  CHECK(all[2].entries[0].second == "b");
  CHECK(all[3].entries[0].second == "c");
}

TEST_CASE("entries that look alike do not share an override id") {
  Overrides ov;
  REQUIRE(ov.set(Override{"d", {{"a", "b:c"}}, {}, "", Mode::kShadow, 0}).ok());
  REQUIRE(ov.set(Override{"d", {{"a:b", "c"}}, {}, "", Mode::kShadow, 0}).ok());
  REQUIRE(ov.set(Override{"d:a", {{"b", "c"}}, {}, "", Mode::kShadow, 0}).ok());
  CHECK(ov.size() == 3);
}

TEST_CASE("prune drops overrides that expired at or before now") {
  Overrides ov;
  REQUIRE(ov.set(Override{"d", {{"k", "never"}}, {}, "", Mode::kShadow, 0}).ok());
  REQUIRE(ov.set(Override{"d", {{"k", "early"}}, {}, "", Mode::kShadow, 100}).ok());
  REQUIRE(ov.set(Override{"d", {{"k", "late"}}, {}, "", Mode::kShadow, 200}).ok());
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
    const sluice::Status why = ov.set(std::move(o));
    CHECK(why.code() == sluice::StatusCode::invalid_argument);
    CHECK(ov.size() == 0);
    return why.message();
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
