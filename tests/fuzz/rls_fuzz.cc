// libFuzzer target for the gRPC front's input (lib/rls/rls_translate.h): RateLimitRequest bytes
// as Envoy sends them, parsed by protobuf, planned into checks, and answered.
//
// Properties beyond "no crash, no sanitizer report":
//  - a request the plan accepts becomes a check request the node's decoder accepts, with one
//    check per planned descriptor and no per-check refusal (the front validates everything the
//    decoder and the engine would refuse);
//  - whatever the node answers for those checks fills a response with one status per descriptor;
//  - a refused request names why.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "fuzz_util.h"
#include "rls/rls_translate.h"
#include "rules/rules.h"
#include "wire/protocol.h"

namespace {

using namespace sluice;

std::shared_ptr<const rules::Policy> policy() {
  static const std::shared_ptr<const rules::Policy> p = [] {
    rules::ParseResult native = rules::parse_rules(R"(domains:
  - name: api
    rules:
      - name: per-user
        key: [user]
        limits: [5/1m]
)",
                                                   "native.yaml");
    rules::ParseResult envoy = rules::parse_envoy_rules(R"(domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10, name: ip}
  - key: path
    value: /x*
    rate_limit: {unit: hour, requests_per_unit: 3, replaces: [{name: ip}]}
    quota_mode: true
  - key: ldap
    rate_limit: {unlimited: true}
)",
                                                        "envoy.yaml", {});
    FUZZ_REQUIRE(native.rules && envoy.rules);
    FUZZ_REQUIRE(
        rules::merge_rule_sets(*native.rules, std::move(*envoy.rules), "native.yaml", "envoy.yaml")
            .empty());
    return rules::Policy::compile(std::move(*native.rules), rules::Overrides{}, 42);
  }();
  return p;
}

void fuzz_rls(std::span<const uint8_t> in) {
  static rls::RateLimitRequest req;
  if (!req.ParseFromArray(in.data(), static_cast<int>(in.size()))) return;
  static rls::Plan plan;
  const rls::PlanError err = rls::plan_request(req, policy().get(), rls::RlsOptions{}, plan);
  if (err.refusal != rls::Refusal::kNone) {
    FUZZ_REQUIRE(!err.message.empty());
    return;
  }
  FUZZ_REQUIRE(plan.kind.size() == static_cast<size_t>(req.descriptors_size()));
  static std::vector<uint8_t> bytes;
  wire::encode_request(1, plan.checks, 0, bytes);
  static wire::RequestDecoder decoder;
  FUZZ_REQUIRE(decoder.decode(bytes) == wire::Code::kOk);
  FUZZ_REQUIRE(decoder.checks().size() == plan.checks.size());
  for (size_t i = 0; i < plan.checks.size(); ++i)
    FUZZ_REQUIRE(decoder.check_code(i) == wire::Code::kOk);

  // An answer: each check allowed or not by turns, with a limit of the check's own window.
  wire::Answer answer;
  for (size_t i = 0; i < plan.checks.size(); ++i) {
    wire::Decision d;
    d.allowed = i % 2 == 0;
    wire::LimitStatus l;
    l.name = "l";
    l.limit = plan.checks[i].has_limit_override ? plan.checks[i].limit_override_requests : 5;
    l.window_ms =
        plan.checks[i].has_limit_override ? plan.checks[i].limit_override_window_ms : 60'000;
    l.exceeded = !d.allowed;
    l.retry_after_ms = d.allowed ? 0 : 1'000;
    d.limits.push_back(l);
    answer.decisions.push_back(std::move(d));
  }
  static rls::RateLimitResponse resp;
  FUZZ_REQUIRE(rls::fill_response(plan, &answer, true, resp).ok());
  FUZZ_REQUIRE(resp.statuses_size() == req.descriptors_size());
}

void write_seeds(const std::string& dir) {
  rls::RateLimitRequest r;
  r.set_domain("edge");
  r.set_hits_addend(2);
  auto* d = r.add_descriptors();
  auto* e = d->add_entries();
  e->set_key("remote_address");
  e->set_value("10.0.0.1");
  d = r.add_descriptors();
  e = d->add_entries();
  e->set_key("path");
  e->set_value("/xyz");
  d->mutable_hits_addend()->set_value(0);
  d = r.add_descriptors();
  e = d->add_entries();
  e->set_key("user");
  e->set_value("u");
  d->mutable_limit()->set_requests_per_unit(3);
  d->mutable_limit()->set_unit(envoy::type::v3::MINUTE);
  sluice::fuzz::write_seed(dir, "rls-seed-edge", r.SerializeAsString());
  r.set_domain("api");
  sluice::fuzz::write_seed(dir, "rls-seed-api", r.SerializeAsString());
}

}  // namespace

SLUICE_FUZZ_TARGET(fuzz_rls, write_seeds)
