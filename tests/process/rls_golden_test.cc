// Golden cases: envoyproxy/ratelimit's documented behaviour (its README's configuration examples
// 2 to 7 and 9, the per-descriptor limit override, several descriptors in one request), loaded as
// upstream's own YAML with `envoy_rules:` and asserted through sluiced's real gRPC port. Each
// case is a request and the response upstream documents for it, in order, on one node.
//
// Units: the README's examples use seconds; here they use minutes and hours, so that a sequence
// of calls never straddles the boundary of a 1 s bucket (Sluice's windows slide; upstream's are
// fixed blocks, docs/envoy.md, "What matches, what differs"). The matching, the counting and
// the answers are what is under test.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "rls_client.h"
#include "sluiced_process.h"

namespace {

using sluice::testing::RlsClient;
using sluice::testing::rlspb::RateLimitRequest;
using sluice::testing::rlspb::RateLimitResponse;
using Unit = RateLimitResponse::RateLimit::Unit;
using Entries = std::vector<std::pair<std::string, std::string>>;

constexpr uint32_t kMax = std::numeric_limits<uint32_t>::max();

// The README's examples, one file per domain, as upstream reads them from a directory.
const std::vector<std::pair<std::string, std::string>> kFiles = {
    {"messaging.yaml", R"(domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
)"},
    {"edge.yaml", R"(domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 10
  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: minute
      requests_per_unit: 0
)"},
    {"example4.yaml", R"(domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: minute
)"},
    {"internal.yaml", R"(domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
)"},
    {"example6.yaml", R"(domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: minute
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: minute
)"},
    {"example7.yml", R"(domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: hour
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: hour
)"},
    {"example9.yaml", R"(domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/orders*
    rate_limit:
      unit: hour
      requests_per_unit: 3
)"},
};

// One descriptor of a request: its entries, and optionally its own limit or hits.
struct Desc {
  Desc(Entries e, std::optional<std::pair<uint32_t, Unit>> l = std::nullopt,
       std::optional<uint64_t> h = std::nullopt)
      : entries(std::move(e)), limit(l), hits(h) {}
  Entries entries;
  std::optional<std::pair<uint32_t, Unit>> limit;  // RateLimitOverride
  std::optional<uint64_t> hits;                    // per-descriptor hits_addend
};

// What one status should say; `unit` UNKNOWN with rpu 0 and no name: no current_limit.
struct Want {
  RateLimitResponse::Code code = RateLimitResponse::OK;
  bool has_limit = false;
  uint32_t rpu = 0;
  Unit unit = RateLimitResponse::RateLimit::UNKNOWN;
  std::string name;
  uint32_t remaining = 0;
};

Want ok_no_limit() {
  return Want{};
}
Want ok(uint32_t rpu, Unit unit, uint32_t remaining, std::string name = "") {
  return Want{RateLimitResponse::OK, true, rpu, unit, std::move(name), remaining};
}
Want over(uint32_t rpu, Unit unit, std::string name = "") {
  return Want{RateLimitResponse::OVER_LIMIT, true, rpu, unit, std::move(name), 0};
}
Want unlimited() {
  Want w;
  w.remaining = kMax;
  return w;
}

struct Case {
  std::string what;
  std::string domain;
  std::vector<Desc> descriptors;
  RateLimitResponse::Code overall;
  std::vector<Want> statuses;
};

constexpr Unit kMinute = RateLimitResponse::RateLimit::MINUTE;
constexpr Unit kHour = RateLimitResponse::RateLimit::HOUR;
constexpr Unit kDay = RateLimitResponse::RateLimit::DAY;
constexpr auto kOk = RateLimitResponse::OK;
constexpr auto kOver = RateLimitResponse::OVER_LIMIT;

std::vector<Case> golden_cases() {
  std::vector<Case> c;
  const Desc marketing{{{"message_type", "marketing"}, {"to_number", "2061111111"}}};
  const Desc number{{{"to_number", "2061111111"}}};
  // Example 2: nested descriptors; two descriptors in one request, an aggregate answer.
  for (uint32_t i = 1; i <= 5; ++i) {
    c.push_back({"ex2: marketing to one number, call " + std::to_string(i),
                 "messaging",
                 {marketing, number},
                 kOk,
                 {ok(5, kDay, 5 - i), ok(100, kDay, 100 - i)}});
  }
  c.push_back({"ex2: the 6th marketing message is over; the per-number limit still counts it",
               "messaging",
               {marketing, number},
               kOver,
               {over(5, kDay), ok(100, kDay, 94)}});
  c.push_back({"ex2: another number has its own 5",
               "messaging",
               {{{{"message_type", "marketing"}, {"to_number", "2062222222"}}}},
               kOk,
               {ok(5, kDay, 4)}});
  c.push_back({"ex2: a message type without a config entry matches nothing",
               "messaging",
               {{{{"message_type", "transactional"}, {"to_number", "2061111111"}}}},
               kOk,
               {ok_no_limit()}});
  // Example 3: key and value before key only; a limit of 0 blocks.
  c.push_back({"ex3: any address gets the default 10",
               "edge_proxy_per_ip",
               {{{{"remote_address", "50.0.0.1"}}}},
               kOk,
               {ok(10, kMinute, 9)}});
  c.push_back({"ex3: the blacklisted address matches its own entry: 0 per unit",
               "edge_proxy_per_ip",
               {{{{"remote_address", "50.0.0.5"}}}},
               kOver,
               {over(0, kMinute)}});
  // Example 4: a limit applies only at the request's depth.
  c.push_back({"ex4: two entries reach the nested limit",
               "example4",
               {{{{"key", "value"}, {"subkey", "subvalue"}}}},
               kOk,
               {ok(300, kMinute, 299)}});
  c.push_back({"ex4: one entry stops above the limit: none applies",
               "example4",
               {{{{"key", "value"}}}},
               kOk,
               {ok_no_limit()}});
  c.push_back({"ex4: three entries go past it: none applies",
               "example4",
               {{{{"key", "value"}, {"subkey", "subvalue"}, {"extra", "x"}}}},
               kOk,
               {ok_no_limit()}});
  // Example 5: unlimited is OK with the largest remaining and no limit.
  c.push_back({"ex5: ldap is unlimited", "internal", {{{{"ldap", "x"}}}}, kOk, {unlimited()}});
  c.push_back({"ex5: azure has 100 a minute",
               "internal",
               {{{{"azure", "x"}}}},
               kOk,
               {ok(100, kMinute, 99)}});
  // Example 6: shadow_mode counts but always answers OK.
  for (uint32_t i = 1; i <= 12; ++i) {
    c.push_back({"ex6: user-a in shadow mode, call " + std::to_string(i),
                 "example6",
                 {{{{"service", "auth-service"}, {"user", "user-a"}}}},
                 kOk,
                 {ok(10, kMinute, i <= 10 ? 10 - i : 0)}});
  }
  for (uint32_t i = 1; i <= 21; ++i) {
    const Desc b{{{"service", "auth-service"}, {"user", "user-b"}}};
    c.push_back({"ex6: user-b enforced, call " + std::to_string(i),
                 "example6",
                 {b},
                 i <= 20 ? kOk : kOver,
                 {i <= 20 ? ok(20, kMinute, 20 - i) : over(20, kMinute)}});
  }
  // Example 7: `replaces`: with both descriptors in a request, the named limit is not applied
  // (nor counted); alone, it applies with its own count.
  const Desc k1{{{"key_1", "value_1"}, {"user", "bkthomps"}}};
  const Desc k2{{{"key_2", "value_2"}, {"user", "bkthomps"}}};
  for (uint32_t i = 1; i <= 11; ++i) {
    c.push_back({"ex7: both descriptors, call " + std::to_string(i),
                 "example7",
                 {k1, k2},
                 i <= 10 ? kOk : kOver,
                 {ok_no_limit(), i <= 10 ? ok(10, kHour, 10 - i) : over(10, kHour)}});
  }
  for (uint32_t i = 1; i <= 6; ++i) {
    c.push_back(
        {"ex7: key_1 alone keeps its untouched 5, call " + std::to_string(i),
         "example7",
         {k1},
         i <= 5 ? kOk : kOver,
         {i <= 5 ? ok(5, kHour, 5 - i, "specific_limit") : over(5, kHour, "specific_limit")}});
  }
  // Example 9: value wildcards, each matching value with its own count.
  c.push_back({"ex9: value1 matches value*",
               "example9",
               {{{{"key1", "value1"}}}},
               kOk,
               {ok(20, kMinute, 19)}});
  c.push_back({"ex9: value2 has a count of its own",
               "example9",
               {{{{"key1", "value2"}}}},
               kOk,
               {ok(20, kMinute, 19)}});
  c.push_back(
      {"ex9: valu is not a match", "example9", {{{{"key1", "valu"}}}}, kOk, {ok_no_limit()}});
  c.push_back({"ex9: a middle wildcard",
               "example9",
               {{{{"path", "/api/v2/orders/17"}}}},
               kOk,
               {ok(3, kHour, 2)}});
  c.push_back({"ex9: a middle wildcard that does not match",
               "example9",
               {{{{"path", "/api/v2/users"}}}},
               kOk,
               {ok_no_limit()}});
  // The request's own limit (RateLimitDescriptor.limit), before any config entry.
  for (uint32_t i = 1; i <= 3; ++i) {
    Desc d{{{"to_number", "2069999999"}}, std::make_pair(2u, kMinute)};
    c.push_back({"override: 2 a minute in place of 100 a day, call " + std::to_string(i),
                 "messaging",
                 {d},
                 i <= 2 ? kOk : kOver,
                 {i <= 2 ? ok(2, kMinute, 2 - i) : over(2, kMinute)}});
  }
  {
    Desc d{{{"anything", "x"}}, std::make_pair(2u, kMinute)};
    c.push_back({"override: applies where no config entry matches",
                 "messaging",
                 {d},
                 kOk,
                 {ok(2, kMinute, 1)}});
    c.push_back({"override: an unknown domain has no limits at all",
                 "unknown_domain",
                 {d},
                 kOk,
                 {ok_no_limit()}});
  }
  // hits: per descriptor 0 looks without counting; denied hits are counted (upstream).
  {
    Desc peek{{{"remote_address", "50.0.0.9"}}, std::nullopt, 0};
    c.push_back(
        {"hits 0 on a fresh key: full", "edge_proxy_per_ip", {peek}, kOk, {ok(10, kMinute, 10)}});
    Desc five{{{"remote_address", "50.0.0.9"}}, std::nullopt, 12};
    c.push_back({"12 hits at once: over, and counted",
                 "edge_proxy_per_ip",
                 {five},
                 kOver,
                 {over(10, kMinute)}});
    c.push_back(
        {"then even a look is over", "edge_proxy_per_ip", {peek}, kOver, {over(10, kMinute)}});
  }
  return c;
}

RateLimitRequest to_request(const Case& k) {
  RateLimitRequest r;
  r.set_domain(k.domain);
  for (const Desc& d : k.descriptors) {
    auto* pd = r.add_descriptors();
    for (const auto& [key, value] : d.entries) {
      auto* e = pd->add_entries();
      e->set_key(key);
      e->set_value(value);
    }
    if (d.limit) {
      pd->mutable_limit()->set_requests_per_unit(d.limit->first);
      pd->mutable_limit()->set_unit(static_cast<envoy::type::v3::RateLimitUnit>(d.limit->second));
    }
    if (d.hits) pd->mutable_hits_addend()->set_value(*d.hits);
  }
  return r;
}

}  // namespace

TEST_CASE("rls golden: envoyproxy/ratelimit's documented answers through the gRPC port") {
  sluice::testing::DaemonConfig cfg;
  cfg.rules = "domains:\n  - name: sluice-native\n    rules: []\n";
  sluice::testing::Daemon d(cfg, /*start_now=*/false);
  const std::filesystem::path dir = d.dir / "envoy";
  std::filesystem::create_directories(dir);
  for (const auto& [name, text] : kFiles)
    std::ofstream(dir / name) << text;
  d.config().extra_config = {"envoy_rules: " + dir.string()};
  d.start();
  RlsClient c(d.grpc);

  for (const Case& k : golden_cases()) {
    CAPTURE(k.what);
    RateLimitResponse r;
    const grpc::Status s = c.call(to_request(k), r);
    REQUIRE_MESSAGE(s.ok(), s.error_message());
    CHECK(r.overall_code() == k.overall);
    REQUIRE(r.statuses_size() == static_cast<int>(k.statuses.size()));
    for (size_t i = 0; i < k.statuses.size(); ++i) {
      CAPTURE(i);
      const auto& got = r.statuses(static_cast<int>(i));
      const Want& want = k.statuses[i];
      CHECK(got.code() == want.code);
      CHECK(got.has_current_limit() == want.has_limit);
      CHECK(got.limit_remaining() == want.remaining);
      if (want.has_limit) {
        CHECK(got.current_limit().requests_per_unit() == want.rpu);
        CHECK(got.current_limit().unit() == want.unit);
        CHECK(got.current_limit().name() == want.name);
        CHECK(got.has_duration_until_reset());
      }
    }
  }
}
