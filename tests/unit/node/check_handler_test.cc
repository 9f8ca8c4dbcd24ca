// Unit tests of sluice::node::CheckHandler (lib/node/check_handler.cc): wire bytes in, wire bytes
// out, with a real engine built from the rules below and time passed in. Covers local decisions
// and the answer's fields, malformed input, the no-amplification cap, and cluster owner mode:
// splitting a request by owner (a fake CheckRouter), a client's untrusted claim to be forwarded,
// and a tagged part from another node that is decided here and never split again.
#include "node/check_handler.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "rules/rules.h"
#include "wire/protocol.h"

namespace {

using namespace sluice;
using node::CheckHandler;
using node::CheckRouter;
using node::ForwardPlan;
using Outcome = CheckHandler::Outcome;

// An epoch-aligned minute (2023-11-14 22:13) plus 15 s: one-minute buckets are 15 s old. The
// `per-minute` limit is on one-minute buckets (the default before windows under ten minutes got
// ten buckets), which its reset and retry-after values below were worked out for.
constexpr int64_t kMinute = 28'333'333LL * 60'000;
constexpr int64_t kT0 = kMinute + 15'000;
constexpr uint64_t kSeed = 0x5eed;

// `api` is decided by each key's owner; `feed` is gossip (decided where it arrives).
constexpr const char* kRules = R"(domains:
  - name: api
    rules:
      - name: per-user
        key: [user]
        limits:
          - {limit: 3, window: 1m, granularity: 1m, name: per-minute}
        consistency: owner
  - name: feed
    rules:
      - name: per-ip
        key: [ip]
        limits: [100/1m]
        consistency: gossip
)";

std::unique_ptr<engine::Engine> make_engine() {
  rules::ParseResult parsed = rules::parse_rules(kRules, "rules.yaml");
  REQUIRE(parsed.errors.empty());
  REQUIRE(parsed.rules.has_value());
  return std::make_unique<engine::Engine>(
      rules::Policy::compile(std::move(*parsed.rules), rules::Overrides{}, kSeed));
}

// One check as the test writes it; strings owned here.
struct CheckSpec {
  std::string domain;
  std::vector<std::pair<std::string, std::string>> entries;
  int64_t hits = 1;
};

CheckSpec user(const std::string& name, int64_t hits = 1) {
  return {"api", {{"user", name}}, hits};
}
CheckSpec ip(const std::string& addr) {
  return {"feed", {{"ip", addr}}, 1};
}

std::vector<uint8_t> encode(uint64_t id, const std::vector<CheckSpec>& specs,
                            bool forwarded = false, size_t pad_to = 0, bool redirected = false) {
  std::vector<std::vector<wire::Entry>> entries(specs.size());
  std::vector<wire::Check> checks;
  for (size_t i = 0; i < specs.size(); ++i) {
    for (const auto& [k, v] : specs[i].entries)
      entries[i].push_back({k, v});
    checks.push_back({specs[i].domain, entries[i], specs[i].hits});
  }
  std::vector<uint8_t> out;
  wire::encode_request(id, checks, pad_to, out, forwarded, redirected);
  return out;
}

wire::Answer decode(const std::vector<uint8_t>& bytes) {
  wire::Answer a;
  REQUIRE(wire::decode_answer(bytes, a) == wire::Code::kOk);
  return a;
}

// The routing key the engine uses for a check (nullopt when it is not owner mode).
std::optional<uint64_t> routing_key(engine::Engine& e, const CheckSpec& c) {
  std::vector<rules::Descriptor> ds;
  for (const auto& [k, v] : c.entries)
    ds.push_back({k, v});
  return e.owner_routing_key({c.domain, ds, static_cast<uint64_t>(c.hits)}, kT0);
}

// A router that knows a fixed owner per routing key (0 = this node, also for unknown keys) and
// records every key it is asked about. `joining`: the keys in `previous` are this node's, and
// stay with the node named there for now (forwarded checks of them go on, redirected).
class FakeRouter final : public CheckRouter {
 public:
  Route route(uint64_t routing_key, bool forwarded) override {
    asked.push_back(routing_key);
    if (joining) {
      auto p = previous.find(routing_key);
      if (p != previous.end()) return {p->second, true};
    }
    if (auto t = taken_over.find(routing_key); t != taken_over.end()) {
      Route r;
      r.takeover = true;
      r.fallback_since_ms = t->second;
      return r;
    }
    if (forwarded) return {};
    if (auto l = lost.find(routing_key); l != lost.end()) {
      Route r;
      r.fallback = true;
      r.fallback_since_ms = l->second;
      return r;
    }
    auto it = owners.find(routing_key);
    return {it == owners.end() ? default_owner : it->second, false};
  }
  bool routes_forwarded() override { return joining || !taken_over.empty(); }
  std::map<uint64_t, uint16_t> owners;
  std::map<uint64_t, uint16_t> previous;
  // Keys whose owner and replicas are all out of reach, and since when: decided here by fallback.
  std::map<uint64_t, int64_t> lost;
  // Keys this node decides as their replica, their owner out of reach since then (takeover),
  // whether the check came from a client or was forwarded here.
  std::map<uint64_t, int64_t> taken_over;
  bool joining = false;
  uint16_t default_owner = 0;
  std::vector<uint64_t> asked;
};

// The cluster's tag as the forwarder appends it: 32 bytes after a single-segment message.
std::vector<uint8_t> tagged(std::vector<uint8_t> message) {
  for (uint8_t i = 0; i < 32; ++i)
    message.push_back(static_cast<uint8_t>(0xa0 + i));
  return message;
}

// One fresh node: an engine and its handler.
struct Fixture {
  std::unique_ptr<engine::Engine> engine = make_engine();
  CheckHandler handler{*engine};
  std::vector<uint8_t> out;

  // Handles locally (no router) with no answer cap; REQUIREs an answer.
  wire::Answer check(const std::vector<uint8_t>& request, int64_t now = kT0) {
    REQUIRE(handler.handle(request, 0, now, out));
    return decode(out);
  }
  // remaining of the single limit of one `api` check, asked without counting (hits 0).
  uint64_t remaining(const std::string& name) {
    const wire::Answer a = check(encode(999, {user(name, 0)}));
    REQUIRE(a.decisions.size() == 1);
    REQUIRE(a.decisions[0].limits.size() == 1);
    return a.decisions[0].limits[0].remaining;
  }
};

}  // namespace

// ---- local decisions ---------------------------------------------------------------------------

TEST_CASE("a local check is allowed up to the limit, then denied with every limit field") {
  Fixture f;
  for (uint64_t n = 1; n <= 3; ++n) {
    CAPTURE(n);
    const wire::Answer a = f.check(encode(100 + n, {user("alice")}));
    CHECK(a.id == 100 + n);
    CHECK(a.code == wire::Code::kOk);
    CHECK_FALSE(a.truncated);
    REQUIRE(a.decisions.size() == 1);
    const wire::Decision& d = a.decisions[0];
    CHECK(d.code == wire::Code::kOk);
    CHECK(d.allowed);
    CHECK_FALSE(d.would_deny);
    CHECK_FALSE(d.shadow);
    CHECK_FALSE(d.allowlisted);
    REQUIRE(d.limits.size() == 1);
    const wire::LimitStatus& l = d.limits[0];
    CHECK(l.name == "per-minute");
    CHECK(l.limit == 3);
    CHECK(l.window_ms == 60'000);
    CHECK(l.remaining == 3 - n);
    CHECK(l.retry_after_ms == 0);
    CHECK(l.mode == wire::Mode::kEnforce);
    CHECK_FALSE(l.exceeded);
    // Every hit is 15 s into this minute's bucket: it leaves the window at the end of the next.
    CHECK(l.reset_ms == 60'000 + 60'000 - 15'000);
    CHECK(f.handler.last_code() == wire::Code::kOk);
  }
  const wire::Answer denied = f.check(encode(200, {user("alice")}));
  CHECK(denied.id == 200);
  CHECK(denied.code == wire::Code::kOk);
  REQUIRE(denied.decisions.size() == 1);
  CHECK(denied.decisions[0].code == wire::Code::kOk);
  CHECK_FALSE(denied.decisions[0].allowed);
  REQUIRE(denied.decisions[0].limits.size() == 1);
  const wire::LimitStatus& l = denied.decisions[0].limits[0];
  CHECK(l.exceeded);
  CHECK(l.remaining == 0);
  CHECK(l.limit == 3);
  // Weighted: 45 s to the next minute, then 3 * (60000 - e) / 60000 <= 2 once e >= 20 s.
  CHECK(l.retry_after_ms == 45'000 + 20'000);
  CHECK(l.reset_ms == 105'000);

  // At the retry time one more is admitted.
  CHECK(f.check(encode(201, {user("alice")}), kT0 + 65'000).decisions.at(0).allowed);
  // Another key is independent.
  CHECK(f.check(encode(202, {user("bob")})).decisions.at(0).allowed);
}

TEST_CASE("hits above the limit are denied with retry_after -1 (never)") {
  Fixture f;
  const wire::Answer a = f.check(encode(1, {user("carol", 4)}));
  REQUIRE(a.decisions.size() == 1);
  CHECK_FALSE(a.decisions[0].allowed);
  REQUIRE(a.decisions[0].limits.size() == 1);
  CHECK(a.decisions[0].limits[0].exceeded);
  CHECK(a.decisions[0].limits[0].retry_after_ms == -1);
  CHECK(f.remaining("carol") == 3);  // nothing counted
}

TEST_CASE("the checks of one request are answered in order, each with its own code") {
  Fixture f;
  std::vector<CheckSpec> checks = {
      user("dave"),
      {"nowhere", {{"user", "dave"}}, 1},               // unknown domain
      user("dave", -2),                                 // negative cost: refused by the decoder
      {"", {{"user", "dave"}}, 1},                      // empty domain
      {"api", {{"user", "dave"}, {"user", "eve"}}, 1},  // repeated entry key
      user("dave", 1'000'000'001),                      // over the hits bound
      ip("192.0.2.1"),
  };
  CheckSpec too_many{"api", {}, 1};
  for (int i = 0; i < 65; ++i)
    too_many.entries.push_back({"k" + std::to_string(i), "v"});
  checks.push_back(too_many);  // over the wire's 64 entries: refused by the decoder
  CheckSpec over_rules{"api", {}, 1};
  for (int i = 0; i < 33; ++i)
    over_rules.entries.push_back({"k" + std::to_string(i), "v"});
  checks.push_back(over_rules);  // over the rules' 32: refused by the engine

  const wire::Answer a = f.check(encode(77, checks));
  CHECK(a.id == 77);
  CHECK(a.code == wire::Code::kOk);
  REQUIRE(a.decisions.size() == checks.size());
  CHECK(a.decisions[0].code == wire::Code::kOk);
  CHECK(a.decisions[0].allowed);
  CHECK(a.decisions[1].code == wire::Code::kUnknownDomain);
  CHECK(a.decisions[2].code == wire::Code::kNegativeHits);
  CHECK(a.decisions[3].code == wire::Code::kEmptyDomain);
  CHECK(a.decisions[4].code == wire::Code::kDuplicateEntry);
  CHECK(a.decisions[5].code == wire::Code::kHitsTooLarge);
  CHECK(a.decisions[6].code == wire::Code::kOk);
  CHECK(a.decisions[6].allowed);
  CHECK(a.decisions[7].code == wire::Code::kTooManyEntries);
  CHECK(a.decisions[8].code == wire::Code::kTooManyEntries);
  for (size_t i : std::initializer_list<size_t>{1, 2, 3, 4, 5, 7, 8}) {
    CAPTURE(i);
    CHECK_FALSE(a.decisions[i].allowed);
    CHECK(a.decisions[i].limits.empty());
  }
  CHECK(f.remaining("dave") == 2);  // only the first check counted
}

// ---- malformed input ---------------------------------------------------------------------------

TEST_CASE("bytes from which no id can be read are dropped") {
  Fixture f;
  const std::vector<std::vector<uint8_t>> junk = {
      {},
      {1, 2, 3},
      std::vector<uint8_t>(16, 0xff),
      std::vector<uint8_t>(64, 0x00),
  };
  for (const auto& bytes : junk) {
    CAPTURE(bytes.size());
    f.out.assign(5, 0xee);
    CHECK_FALSE(f.handler.handle(bytes, 0, kT0, f.out));
    CHECK(f.handler.last_code() != wire::Code::kOk);
    ForwardPlan plan;
    FakeRouter router;
    CHECK(f.handler.handle_routed(bytes, 0, kT0, f.out, &router, 1, plan) == Outcome::kDrop);
    CHECK(router.asked.empty());
    CHECK(plan.used == 0);
  }
  // A valid request followed by stray bytes is not one message: no id is read from it.
  std::vector<uint8_t> trailing = encode(5, {user("alice")});
  trailing.resize(trailing.size() + 8, 0);
  CHECK_FALSE(f.handler.handle(trailing, 0, kT0, f.out));
  CHECK(f.handler.last_code() == wire::Code::kMalformed);
  CHECK(f.remaining("alice") == 3);
}

TEST_CASE("a request-level error with a readable id is answered with that id and the code") {
  Fixture f;
  std::vector<CheckSpec> checks(wire::kMaxChecks + 1, user("alice"));
  const std::vector<uint8_t> request = encode(4242, checks);
  REQUIRE(f.handler.handle(request, 0, kT0, f.out));
  CHECK(f.handler.last_code() == wire::Code::kTooManyChecks);
  const wire::Answer a = decode(f.out);
  CHECK(a.id == 4242);
  CHECK(a.code == wire::Code::kTooManyChecks);
  CHECK(a.decisions.empty());
  CHECK(f.remaining("alice") == 3);  // nothing decided

  // Routed: the same answer, nothing split.
  ForwardPlan plan;
  FakeRouter router;
  router.default_owner = 2;
  CHECK(f.handler.handle_routed(request, 0, kT0, f.out, &router, 1, plan) == Outcome::kAnswer);
  CHECK(decode(f.out).code == wire::Code::kTooManyChecks);
  CHECK(router.asked.empty());
}

// ---- no amplification --------------------------------------------------------------------------

TEST_CASE("an answer that cannot fit max_answer_bytes is dropped, never sent larger") {
  Fixture f;
  const std::vector<uint8_t> request = encode(9, {user("alice")});
  // Even the smallest answer (no limit details) is larger than 16 bytes.
  CHECK_FALSE(f.handler.handle(request, 16, kT0, f.out));
  ForwardPlan plan;
  CHECK(f.handler.handle_routed(request, 16, kT0, f.out, nullptr, 0, plan) == Outcome::kDrop);

  // An error answer is capped the same way.
  std::vector<CheckSpec> checks(wire::kMaxChecks + 1, user("alice"));
  CHECK_FALSE(f.handler.handle(encode(10, checks), 8, kT0, f.out));
}

TEST_CASE("an answer over max_answer_bytes is trimmed: limit names first, then limit details") {
  Fixture f;
  const std::vector<uint8_t> ask = encode(11, {user("alice", 0)});  // hits 0: counts nothing
  REQUIRE(f.handler.handle(ask, 0, kT0, f.out));
  const size_t full_size = f.out.size();
  const wire::Answer full = decode(f.out);
  CHECK_FALSE(full.truncated);
  REQUIRE(full.decisions.size() == 1);
  REQUIRE(full.decisions[0].limits.size() == 1);
  CHECK(full.decisions[0].limits[0].name == "per-minute");

  REQUIRE(f.handler.handle(ask, full_size - 8, kT0, f.out));
  const size_t no_names_size = f.out.size();
  CHECK(no_names_size <= full_size - 8);
  const wire::Answer no_names = decode(f.out);
  CHECK(no_names.id == 11);
  CHECK_FALSE(no_names.truncated);  // set only when limit details are dropped (docs/protocol.md)
  REQUIRE(no_names.decisions.size() == 1);
  CHECK(no_names.decisions[0].allowed);
  REQUIRE(no_names.decisions[0].limits.size() == 1);
  CHECK(no_names.decisions[0].limits[0].name == "");
  CHECK(no_names.decisions[0].limits[0].limit == 3);
  CHECK(no_names.decisions[0].limits[0].remaining == 3);

  REQUIRE(f.handler.handle(ask, no_names_size - 8, kT0, f.out));
  CHECK(f.out.size() <= no_names_size - 8);
  const wire::Answer bare = decode(f.out);
  CHECK(bare.id == 11);
  CHECK(bare.truncated);
  REQUIRE(bare.decisions.size() == 1);
  CHECK(bare.decisions[0].allowed);
  CHECK(bare.decisions[0].limits.empty());

  // Below that, dropped (the test above); with the request's own size as the cap (UDP), the
  // answer is never larger than the request.
  const std::vector<uint8_t> request = encode(12, {user("alice"), ip("192.0.2.1")});
  REQUIRE(f.handler.handle(request, request.size(), kT0, f.out));
  CHECK(f.out.size() <= request.size());
  const wire::Answer a = decode(f.out);
  CHECK(a.id == 12);
  REQUIRE(a.decisions.size() == 2);
  CHECK(a.decisions[0].allowed);
  CHECK(a.decisions[1].allowed);
}

// ---- owner mode: splitting by owner ------------------------------------------------------------

TEST_CASE("handle_routed splits owner-mode checks by owner into forwarded parts") {
  Fixture f;
  const CheckSpec a1 = user("a1"), b = user("b"), local = user("c"), a2 = user("a2", 2);
  FakeRouter router;
  const auto key_a1 = routing_key(*f.engine, a1), key_a2 = routing_key(*f.engine, a2),
             key_b = routing_key(*f.engine, b), key_local = routing_key(*f.engine, local);
  REQUIRE(key_a1);
  REQUIRE(key_a2);
  REQUIRE(key_b);
  REQUIRE(key_local);
  REQUIRE_FALSE(routing_key(*f.engine, ip("192.0.2.1")));  // gossip: no owner
  router.owners[*key_a1] = 2;
  router.owners[*key_a2] = 2;
  router.owners[*key_b] = 3;
  router.owners[*key_local] = 0;
  router.default_owner = 9;  // nothing else may be routed

  const std::vector<CheckSpec> checks = {
      a1,                                // 0 -> node 2
      local,                             // 1 -> here
      b,                                 // 2 -> node 3
      ip("192.0.2.1"),                   // 3 gossip -> here
      a2,                                // 4 -> node 2
      {"nowhere", {{"user", "a1"}}, 1},  // 5 unknown domain -> here
      user("a1", -1),                    // 6 refused by the decoder: in no part
  };
  const std::vector<uint8_t> request = encode(31337, checks);
  ForwardPlan plan;
  f.out.clear();
  const Outcome o =
      f.handler.handle_routed(request, request.size(), kT0, f.out, &router, 1000, plan);
  REQUIRE(o == Outcome::kForward);
  CHECK(f.out.empty());  // no answer yet: the caller merges the parts' answers
  CHECK(f.handler.untrusted_forwards() == 0);
  // The router is asked only about valid owner-mode checks: 0, 1, 2, 4.
  CHECK(router.asked == std::vector<uint64_t>{*key_a1, *key_local, *key_b, *key_a2});

  CHECK(plan.client_id == 31337);
  CHECK(plan.num_checks == checks.size());
  REQUIRE(plan.used == 3);
  // Parts in order of their first check; one per owner.
  CHECK(plan.parts[0].owner == 2);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0, 4});
  CHECK(plan.parts[1].owner == 0);
  CHECK(plan.parts[1].checks == std::vector<uint32_t>{1, 3, 5});
  CHECK(plan.parts[2].owner == 3);
  CHECK(plan.parts[2].checks == std::vector<uint32_t>{2});
  // The decoder's refusal is answered with its code by the caller (the Forwarder).
  CHECK(plan.refused ==
        std::vector<std::pair<uint32_t, wire::Code>>{{6, wire::Code::kNegativeHits}});

  // Each part is a request of its own: marked forwarded, id first_id + index, the client's checks.
  wire::RequestDecoder dec;
  for (size_t p = 0; p < plan.used; ++p) {
    CAPTURE(p);
    const ForwardPlan::Part& part = plan.parts[p];
    REQUIRE(dec.decode(part.request) == wire::Code::kOk);
    CHECK(dec.id() == 1000 + p);
    CHECK(dec.forwarded());
    REQUIRE(dec.checks().size() == part.checks.size());
    for (size_t k = 0; k < part.checks.size(); ++k) {
      const CheckSpec& want = checks[part.checks[k]];
      const wire::Check& got = dec.checks()[k];
      CHECK(got.domain == want.domain);
      CHECK(got.hits == want.hits);
      REQUIRE(got.entries.size() == want.entries.size());
      for (size_t e = 0; e < want.entries.size(); ++e) {
        CHECK(got.entries[e].key == want.entries[e].first);
        CHECK(got.entries[e].value == want.entries[e].second);
      }
    }
  }

  // Splitting decided and counted nothing here.
  CHECK(f.remaining("a1") == 3);
  CHECK(f.remaining("c") == 3);

  // The owner-0 part is decided here: an answer per check, in the part's order.
  const wire::Answer here = f.check(plan.parts[1].request);
  CHECK(here.id == 1001);
  REQUIRE(here.decisions.size() == 3);
  CHECK(here.decisions[0].allowed);  // user c
  CHECK(here.decisions[1].allowed);  // gossip ip
  CHECK(here.decisions[2].code == wire::Code::kUnknownDomain);
  CHECK(f.remaining("c") == 2);
  CHECK(f.handler.untrusted_forwards() == 1);  // an untagged part claims `forwarded`

  // A remote part is padded so its owner can answer with every detail within its size.
  Fixture owner2;
  REQUIRE(
      owner2.handler.handle(plan.parts[0].request, plan.parts[0].request.size(), kT0, owner2.out));
  const wire::Answer remote = decode(owner2.out);
  CHECK(remote.id == 1000);
  CHECK_FALSE(remote.truncated);
  REQUIRE(remote.decisions.size() == 2);
  REQUIRE(remote.decisions[0].limits.size() == 1);
  CHECK(remote.decisions[0].limits[0].name == "per-minute");
  CHECK(remote.decisions[0].limits[0].remaining == 2);  // a1, one hit
  REQUIRE(remote.decisions[1].limits.size() == 1);
  CHECK(remote.decisions[1].limits[0].remaining == 1);  // a2, two hits
}

TEST_CASE("a request whose checks are all remote has no local part") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 5;
  const std::vector<uint8_t> request = encode(8, {user("x"), user("y")});
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(request, 0, kT0, f.out, &router, 50, plan) == Outcome::kForward);
  REQUIRE(plan.used == 1);
  CHECK(plan.parts[0].owner == 5);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0, 1});
  wire::RequestDecoder dec;
  REQUIRE(dec.decode(plan.parts[0].request) == wire::Code::kOk);
  CHECK(dec.id() == 50);
  CHECK(dec.forwarded());
  CHECK(dec.checks().size() == 2);
}

TEST_CASE("a reused ForwardPlan holds only the parts of the latest split") {
  Fixture f;
  FakeRouter router;
  ForwardPlan plan;
  // First: three owners.
  router.owners[*routing_key(*f.engine, user("p"))] = 2;
  router.owners[*routing_key(*f.engine, user("q"))] = 3;
  REQUIRE(f.handler.handle_routed(encode(1, {user("p"), user("q"), user("r")}), 0, kT0, f.out,
                                  &router, 10, plan) == Outcome::kForward);
  REQUIRE(plan.used == 3);
  // Then: one remote owner and local checks.
  REQUIRE(f.handler.handle_routed(encode(2, {user("r"), user("q")}), 0, kT0, f.out, &router, 20,
                                  plan) == Outcome::kForward);
  CHECK(plan.client_id == 2);
  CHECK(plan.num_checks == 2);
  REQUIRE(plan.used == 2);
  CHECK(plan.parts[0].owner == 0);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0});
  CHECK(plan.parts[1].owner == 3);
  CHECK(plan.parts[1].checks == std::vector<uint32_t>{1});
  wire::RequestDecoder dec;
  for (size_t p = 0; p < plan.used; ++p) {
    REQUIRE(dec.decode(plan.parts[p].request) == wire::Code::kOk);
    CHECK(dec.id() == 20 + p);
    CHECK(dec.checks().size() == 1);
  }
}

TEST_CASE("a router that says local for every key: decided here, nothing split") {
  Fixture f;
  FakeRouter router;  // default owner 0
  ForwardPlan plan;
  plan.used = 7;  // untouched when nothing is split
  const std::vector<uint8_t> request = encode(64, {user("alice"), ip("192.0.2.9"), user("bob")});
  REQUIRE(f.handler.handle_routed(request, 0, kT0, f.out, &router, 1, plan) == Outcome::kAnswer);
  CHECK(router.asked.size() == 2);  // the two owner-mode checks
  CHECK(plan.used == 7);
  const wire::Answer a = decode(f.out);
  CHECK(a.id == 64);
  REQUIRE(a.decisions.size() == 3);
  for (const auto& d : a.decisions)
    CHECK(d.allowed);
  CHECK(a.decisions[0].limits.at(0).remaining == 2);
  CHECK(f.remaining("alice") == 2);
  CHECK(f.remaining("bob") == 2);
  CHECK(f.handler.untrusted_forwards() == 0);
}

TEST_CASE("a request with only gossip checks is decided here without asking the router") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 4;
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(encode(3, {ip("192.0.2.1"), ip("192.0.2.2")}), 0, kT0, f.out,
                                  &router, 1, plan) == Outcome::kAnswer);
  CHECK(router.asked.empty());
  CHECK(plan.used == 0);
  const wire::Answer a = decode(f.out);
  REQUIRE(a.decisions.size() == 2);
  CHECK(a.decisions[0].allowed);
  REQUIRE(a.decisions[0].limits.size() == 1);
  CHECK(a.decisions[0].limits[0].remaining == 99);
}

// ---- owner mode: trusting `forwarded` ----------------------------------------------------------

TEST_CASE("a client's claim to be forwarded, without the tag, is routed anyway and counted") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 2;
  const std::vector<uint8_t> claim = encode(70, {user("mallory")}, /*forwarded=*/true);
  ForwardPlan plan;

  // Without a cluster verifier.
  REQUIRE(f.handler.handle_routed(claim, 0, kT0, f.out, &router, 500, plan) == Outcome::kForward);
  CHECK(f.handler.untrusted_forwards() == 1);
  REQUIRE(plan.used == 1);
  CHECK(plan.parts[0].owner == 2);
  CHECK(router.asked.size() == 1);

  // With one: an untagged message never reaches it, and is routed the same way.
  int verified = 0;
  f.handler.set_forward_auth([&](std::span<const uint8_t>) {
    ++verified;
    return true;
  });
  REQUIRE(f.handler.handle_routed(claim, 0, kT0, f.out, &router, 600, plan) == Outcome::kForward);
  CHECK(f.handler.untrusted_forwards() == 2);
  CHECK(verified == 0);
  CHECK(plan.used == 1);
  CHECK(router.asked.size() == 2);
  CHECK(f.remaining("mallory") == 3);  // never decided here

  // handle() (no router) decides it, and still counts the untrusted claim.
  const wire::Answer a = f.check(claim);
  CHECK(a.decisions.at(0).allowed);
  CHECK(f.handler.untrusted_forwards() == 3);
  // A malformed message is not counted, whatever it claims.
  std::vector<uint8_t> junk = claim;
  junk.resize(junk.size() + 8, 0);
  CHECK_FALSE(f.handler.handle(junk, 0, kT0, f.out));
  CHECK(f.handler.untrusted_forwards() == 3);
}

TEST_CASE("a part under the cluster's tag is decided here and never split again") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 2;  // would send every key elsewhere
  const std::vector<uint8_t> part = encode(1234, {user("alice"), user("bob", 2)}, true, 512);
  const std::vector<uint8_t> datagram = tagged(part);
  std::vector<std::vector<uint8_t>> seen;
  f.handler.set_forward_auth([&](std::span<const uint8_t> d) {
    seen.emplace_back(d.begin(), d.end());
    return true;
  });
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(datagram, datagram.size(), kT0, f.out, &router, 1, plan) ==
          Outcome::kAnswer);
  // The verifier saw the whole datagram, tag included; the tag was stripped before decoding.
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == datagram);
  CHECK(router.asked.empty());
  CHECK(plan.used == 0);
  CHECK(f.handler.untrusted_forwards() == 0);
  const wire::Answer a = decode(f.out);
  CHECK(a.id == 1234);
  CHECK_FALSE(a.truncated);
  REQUIRE(a.decisions.size() == 2);
  CHECK(a.decisions[0].allowed);
  CHECK(a.decisions[0].limits.at(0).remaining == 2);
  CHECK(a.decisions[1].allowed);
  CHECK(a.decisions[1].limits.at(0).remaining == 1);
  CHECK(f.remaining("alice") == 2);  // decided and counted here
  CHECK(f.remaining("bob") == 1);
}

TEST_CASE("a tagged message the verifier rejects, or with no verifier, is not a message") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 2;
  const std::vector<uint8_t> datagram = tagged(encode(99, {user("alice")}, true));
  ForwardPlan plan;
  // No verifier (a single node): 32 stray bytes after the message, no id read.
  CHECK(f.handler.handle_routed(datagram, 0, kT0, f.out, &router, 1, plan) == Outcome::kDrop);
  // A verifier that refuses the tag: the same.
  int verified = 0;
  f.handler.set_forward_auth([&](std::span<const uint8_t>) {
    ++verified;
    return false;
  });
  CHECK(f.handler.handle_routed(datagram, 0, kT0, f.out, &router, 1, plan) == Outcome::kDrop);
  CHECK(verified == 1);
  CHECK(f.handler.last_code() == wire::Code::kMalformed);
  CHECK(router.asked.empty());
  CHECK(plan.used == 0);
  CHECK(f.handler.untrusted_forwards() == 0);
  CHECK(f.remaining("alice") == 3);
}

// ---- joining: keys stay with their previous owner, redirected ----------------------------------

TEST_CASE(
    "while joining, a forwarded part of keys this node now owns goes on, redirected, to their "
    "previous owner") {
  Fixture f;
  FakeRouter router;
  router.joining = true;
  router.previous[*routing_key(*f.engine, user("moved"))] = 4;
  f.handler.set_forward_auth([](std::span<const uint8_t>) { return true; });
  const std::vector<uint8_t> datagram =
      tagged(encode(77, {user("moved"), user("stays"), ip("10.0.0.1")}, true, 512));
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(datagram, datagram.size(), kT0, f.out, &router, 100, plan) ==
          Outcome::kForward);
  CHECK(plan.client_id == 77);  // the forwarding node's id: the answer goes back under it
  REQUIRE(plan.used == 2);
  CHECK(plan.parts[0].owner == 4);
  CHECK(plan.parts[0].redirected);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0});
  CHECK(plan.parts[1].owner == 0);  // not a moved key: decided here, as forwarded
  CHECK_FALSE(plan.parts[1].redirected);
  CHECK(plan.parts[1].checks == std::vector<uint32_t>{1, 2});
  wire::RequestDecoder dec;
  REQUIRE(dec.decode(plan.parts[0].request) == wire::Code::kOk);
  CHECK(dec.forwarded());
  CHECK(dec.redirected());
  REQUIRE(dec.checks().size() == 1);
  CHECK(dec.checks()[0].entries[0].value == "moved");
  CHECK(f.remaining("moved") == 3);  // nothing counted here for it
}

TEST_CASE("a redirected part is decided here even while this node is joining") {
  Fixture f;
  FakeRouter router;
  router.joining = true;
  router.previous[*routing_key(*f.engine, user("moved"))] = 4;
  f.handler.set_forward_auth([](std::span<const uint8_t>) { return true; });
  const std::vector<uint8_t> datagram = tagged(encode(78, {user("moved")}, true, 512, true));
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(datagram, datagram.size(), kT0, f.out, &router, 100, plan) ==
          Outcome::kAnswer);
  CHECK(router.asked.empty());
  const wire::Answer a = decode(f.out);
  REQUIRE(a.decisions.size() == 1);
  CHECK(a.decisions[0].allowed);
  CHECK(f.remaining("moved") == 2);
}

TEST_CASE(
    "a forwarded part is decided here, without asking the router, when this node is not joining") {
  Fixture f;
  FakeRouter router;
  router.previous[*routing_key(*f.engine, user("moved"))] = 4;  // ignored: not joining
  f.handler.set_forward_auth([](std::span<const uint8_t>) { return true; });
  const std::vector<uint8_t> datagram = tagged(encode(79, {user("moved")}, true, 512));
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(datagram, datagram.size(), kT0, f.out, &router, 100, plan) ==
          Outcome::kAnswer);
  CHECK(router.asked.empty());
  CHECK(f.remaining("moved") == 2);
}

TEST_CASE("what the previous owner admitted for a redirected part is credited to it here") {
  Fixture f;
  const std::vector<uint8_t> part =
      tagged(encode(5, {user("moved", 2), ip("10.0.0.1")}, true, 0, true));
  wire::Answer answer;
  answer.id = 5;
  answer.decisions.resize(2);
  answer.decisions[0].allowed = true;
  answer.decisions[1].allowed = true;
  f.handler.credit(part, answer, 2, kT0);
  CHECK(f.remaining("moved") == 1);  // 2 of 3 admitted by node 2 for us
  // A denied check is not credited.
  wire::Answer denied = answer;
  denied.decisions[0].allowed = false;
  f.handler.credit(part, denied, 2, kT0);
  CHECK(f.remaining("moved") == 1);
  f.handler.credit(tagged(encode(6, {user("moved", 1)}, true, 0, true)), answer, 2, kT0);
  CHECK(f.remaining("moved") == 0);  // a third hit admitted by node 2
}

TEST_CASE(
    "checks whose owners are all out of reach go in one part decided here by fallback, from the "
    "latest loss") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 2;
  router.lost[*routing_key(*f.engine, user("b"))] = kT0 - 100;
  router.lost[*routing_key(*f.engine, user("c"))] = kT0 - 50;
  const std::vector<uint8_t> request = encode(9, {user("a"), user("b"), user("c")});
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(request, 0, kT0, f.out, &router, 100, plan) == Outcome::kForward);
  REQUIRE(plan.used == 2);
  CHECK(plan.parts[0].owner == 2);
  CHECK_FALSE(plan.parts[0].fallback);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0});
  CHECK(plan.parts[1].owner == 0);
  CHECK(plan.parts[1].fallback);
  CHECK(plan.parts[1].fallback_since_ms == kT0 - 50);
  CHECK(plan.parts[1].checks == std::vector<uint32_t>{1, 2});
}

TEST_CASE("a request whose every owner is out of reach is still split: one fallback part") {
  Fixture f;
  FakeRouter router;
  router.lost[*routing_key(*f.engine, user("a"))] = kT0;
  const std::vector<uint8_t> request = encode(3, {user("a")});
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(request, 0, kT0, f.out, &router, 100, plan) == Outcome::kForward);
  REQUIRE(plan.used == 1);
  CHECK(plan.parts[0].owner == 0);
  CHECK(plan.parts[0].fallback);
  CHECK(plan.parts[0].fallback_since_ms == kT0);
}

TEST_CASE("checks a replica takes over go in a part of their own, decided here as a takeover") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 2;
  router.taken_over[*routing_key(*f.engine, user("a"))] = kT0 - 500;
  const std::vector<uint8_t> request = encode(4, {user("a"), user("b"), user("a", 2)});
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(request, 0, kT0, f.out, &router, 100, plan) == Outcome::kForward);
  REQUIRE(plan.used == 2);
  CHECK(plan.parts[0].owner == 0);
  CHECK(plan.parts[0].takeover);
  CHECK_FALSE(plan.parts[0].fallback);
  CHECK(plan.parts[0].fallback_since_ms == kT0 - 500);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0, 2});
  CHECK(plan.parts[1].owner == 2);
  CHECK_FALSE(plan.parts[1].takeover);
}

TEST_CASE("a part forwarded to a replica whose owner is out of reach is decided as a takeover") {
  Fixture f;
  FakeRouter router;
  f.handler.set_forward_auth([](std::span<const uint8_t>) { return true; });
  const std::vector<uint8_t> datagram = tagged(encode(77, {user("a"), user("b")}, true, 512));
  // Nothing out of reach: decided here as asked, the router not consulted.
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(datagram, datagram.size(), kT0, f.out, &router, 1, plan) ==
          Outcome::kAnswer);
  CHECK(router.asked.empty());
  // `a` taken over: its check in a takeover part decided here, `b` with it as before.
  router.taken_over[*routing_key(*f.engine, user("a"))] = kT0;
  REQUIRE(f.handler.handle_routed(datagram, datagram.size(), kT0, f.out, &router, 1, plan) ==
          Outcome::kForward);
  REQUIRE(plan.used == 2);
  CHECK(plan.parts[0].owner == 0);
  CHECK(plan.parts[0].takeover);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0});
  CHECK(plan.parts[1].owner == 0);
  CHECK_FALSE(plan.parts[1].takeover);
  CHECK_FALSE(plan.parts[1].fallback);
}

TEST_CASE(
    "a fallback decision in place of an owner lost just now admits nothing, a window on, a "
    "share") {
  // `api`: 3 per minute; one member: a share of 3, growing from the loss over one minute.
  Fixture f;
  const std::vector<uint8_t> request = encode(5, {user("a")});
  CHECK(f.handler.handle(request, 0, kT0, f.out, engine::StandIn{1, kT0}));
  wire::Answer a;
  REQUIRE(wire::decode_answer(f.out, a) == wire::Code::kOk);
  CHECK_FALSE(a.decisions.at(0).allowed);
  CHECK(f.handler.handle(request, 0, kT0 + 60'000, f.out, engine::StandIn{1, kT0}));
  REQUIRE(wire::decode_answer(f.out, a) == wire::Code::kOk);
  CHECK(a.decisions.at(0).allowed);
}

TEST_CASE("a split request's checks the decoder refused go in no part and keep their code") {
  Fixture f;
  FakeRouter router;
  router.default_owner = 2;  // every valid key elsewhere
  CheckSpec too_many{"api", {}, 1};
  for (int i = 0; i < 65; ++i)
    too_many.entries.push_back({"k" + std::to_string(i), "v"});
  const std::vector<uint8_t> request = encode(31, {user("a"), too_many, user("b", -1)});
  ForwardPlan plan;
  REQUIRE(f.handler.handle_routed(request, 0, kT0, f.out, &router, 100, plan) == Outcome::kForward);
  REQUIRE(plan.used == 1);
  CHECK(plan.parts[0].owner == 2);
  CHECK(plan.parts[0].checks == std::vector<uint32_t>{0});
  REQUIRE(plan.refused.size() == 2);
  CHECK(plan.refused[0] == std::pair<uint32_t, wire::Code>{1, wire::Code::kTooManyEntries});
  CHECK(plan.refused[1] == std::pair<uint32_t, wire::Code>{2, wire::Code::kNegativeHits});
  // A reused plan forgets the refusals of the previous split.
  REQUIRE(f.handler.handle_routed(encode(32, {user("a")}), 0, kT0, f.out, &router, 200, plan) ==
          Outcome::kForward);
  CHECK(plan.refused.empty());
}

TEST_CASE("a check's own limit override is decided by its value and shown in the answer") {
  auto eng = make_engine();
  CheckHandler h(*eng);
  const wire::Entry entries[] = {{"user", "ann"}};
  wire::Check checks[2] = {};
  for (wire::Check& c : checks) {
    c.domain = "api";
    c.entries = entries;
    c.has_limit_override = true;
    c.limit_override_requests = 1;
    c.limit_override_window_ms = 3'600'000;  // hour
  }
  checks[1].limit_override_window_ms = 90'000;  // not a unit
  std::vector<uint8_t> req;
  wire::encode_request(5, checks, 0, req);
  std::vector<uint8_t> out;
  for (int i = 0; i < 2; ++i) {
    REQUIRE(h.handle(req, 0, kT0 + i, out));
    const wire::Answer a = decode(out);
    REQUIRE(a.decisions.size() == 2);
    const wire::Decision& d = a.decisions[0];
    CHECK(d.code == wire::Code::kOk);
    CHECK(d.allowed == (i == 0));  // 1 per hour, not the rule's 3 per minute
    REQUIRE(d.limits.size() == 1);
    CHECK(d.limits[0].limit == 1);
    CHECK(d.limits[0].window_ms == 3'600'000);
    CHECK(d.limits[0].name.empty());
    CHECK(a.decisions[1].code == wire::Code::kMalformed);
    CHECK_FALSE(a.decisions[1].allowed);
  }
  // The rule's own counter for the same user was not touched.
  REQUIRE(h.handle(encode(6, {user("ann")}), 0, kT0, out));
  const wire::Answer a = decode(out);
  CHECK(a.decisions[0].allowed);
  CHECK(a.decisions[0].limits[0].limit == 3);
  CHECK(a.decisions[0].limits[0].remaining == 2);
}
