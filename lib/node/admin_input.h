// Private to lib/node: the admin port's parsers of what clients and operators send, free of any
// node, so they can be tested and fuzzed alone (tests/fuzz/http_fuzz.cc). Every parser returns a
// Status: ok, or invalid_argument with the error a 400 answer carries (docs/http.md); none throws
// on any input.
//
//   query strings     "a=1&b=%2F" (percent-escapes, '+' is a space)
//   JSON bodies       an object, nested at most kMaxJsonDepth deep
//   /v1/check         {"domain","descriptors":{..},"hits"}
//   /v1/release       {"domain","descriptors":{..},"lease":"00c0ffee12345678"}
//   /v1/auth          ?domain=&hits=&KEY=VALUE and X-Sluice-KEY headers (nginx auth_request)
//   /v1/overrides {"domain","descriptors","limits":["500/1m"],"granularity","mode","ttl","plan"}
//   /v1/plans         {"domain","descriptors","plan","ttl"}
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace sluice::rules {
struct Override;
}

namespace sluice::node {

using Entries = std::vector<std::pair<std::string, std::string>>;

inline constexpr size_t kMaxHeaderBytes = 8 * 1024;  // a request's start line and headers
inline constexpr size_t kMaxBodyBytes = 64 * 1024;
inline constexpr int kMaxJsonDepth = 8;
inline constexpr uint64_t kMaxHits = 1'000'000'000;
inline constexpr size_t kMaxLimitsPerOverride = 8;

// Percent-decodes a query component ('+' is a space). False on a malformed escape.
bool percent_decode(std::string_view in, std::string& out);
// Splits and decodes "a=1&b=2". False on a malformed escape.
bool parse_query(std::string_view query, Entries& out);

// A request body that must be a JSON object, nesting bounded.
Status parse_json_object(std::string_view body, nlohmann::json& out);
// "descriptors": an object of strings, into entries.
Status parse_descriptors(const nlohmann::json& value, Entries& entries);
// The domain and descriptors (at least one) every operator body names.
Status parse_target(const nlohmann::json& j, std::string& domain, Entries& entries);
// Every field of `j` is one of `allowed`.
Status check_fields(const nlohmann::json& j, std::initializer_list<std::string_view> allowed);
// "ttl": "24h" | "90s" | seconds as a number; 0 or absent = no expiry (expires_at_ms 0).
Status parse_ttl(const nlohmann::json& j, int64_t now_ms, int64_t& expires_at_ms);

// The check shared by /v1/check, /v1/auth and /v1/release.
struct CheckInput {
  std::string domain;
  bool has_domain = false;
  Entries entries;
  uint64_t hits = 1;
  // /v1/release: not a check but the release of this lease (never 0: no lease has that id).
  uint64_t release = 0;
};
// "hits" given as text (a query parameter or a header): 0..kMaxHits.
Status parse_hits_text(std::string_view s, uint64_t& out);
// The /v1/check body.
Status parse_check_body(std::string_view body, CheckInput& in);
// A lease id as JSON carries it: exactly 16 lowercase hex digits ("00c0ffee12345678"), a string
// because a JSON number loses precision past 2^53 in many clients.
std::string format_lease(uint64_t lease);
// The inverse of format_lease. "0000000000000000" is refused: 0 means "no lease".
Status parse_lease(const nlohmann::json& value, uint64_t& out);
// The /v1/release body: the domain and descriptors of the check that was granted the lease, and
// the lease (into in.release). No "hits": a release has no cost.
Status parse_release_body(std::string_view body, CheckInput& in);
// /v1/auth: the query, then the headers named X-Sluice-KEY (any case; '-' in KEY becomes '_');
// `headers` may hold every header of the request, the others are skipped.
Status parse_auth_input(std::string_view query,
                        std::span<const std::pair<std::string_view, std::string_view>> headers,
                        CheckInput& in);

// An override (plan_only: a plan assignment) as the operator wrote it. The node still checks it
// against the rules in force (Node::set_override).
Status parse_override_body(const nlohmann::json& j, bool plan_only, int64_t now_ms,
                           rules::Override& out);

}  // namespace sluice::node
