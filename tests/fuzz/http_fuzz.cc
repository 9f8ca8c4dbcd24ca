// libFuzzer target for what the admin HTTP port reads from clients and operators (lib/node:
// admin_input.h, admin_auth.h), behind the same HTTP parser and limits as the port itself.
//
// Input: [mode][bytes...]. Mode % 5:
//   0  a raw HTTP/1.1 request, parsed by Boost.Beast with the port's header and body limits, then
//      routed like the port does: the admin token check, then the parser of the endpoint
//   1  a /v1/check body, and the same bytes as a /v1/release body
//   2  /v1/auth: a query string, then "Name: value" header lines
//   3  an override body (/v1/overrides); bit 3 of the mode: a plan assignment (/v1/plans)
//   4  a query string
//
// Properties beyond "no crash, no sanitizer report":
//  - a parse that succeeds gives what its endpoint needs: a domain, hits at most kMaxHits, an
//    override with entries, at most kMaxLimitsPerOverride limits and a non-negative expiry; a
//    release a non-zero lease that format_lease spells back as the body had it;
//  - a decoded query, encoded again, decodes to the same pairs;
//  - the admin token check lets a write through only with exactly "Bearer <token>" (any case of
//    the scheme, spaces after it), and its refusals are 401 or 403.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 in C++20 needs std::exchange declared

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "node/admin_auth.h"
#include "node/admin_input.h"
#include "rules/rules.h"

namespace {

namespace http = boost::beast::http;
using namespace sluice::node;
using Json = nlohmann::json;
using Headers = std::vector<std::pair<std::string_view, std::string_view>>;

constexpr std::string_view kToken = "s3cret-token";
constexpr int64_t kNow = 1'795'000'000'000;

void check_input(const CheckInput& in) {
  FUZZ_REQUIRE(in.has_domain);
  FUZZ_REQUIRE(in.hits <= kMaxHits);
}

void fuzz_check_body(std::string_view body) {
  CheckInput in;
  if (parse_check_body(body, in).ok()) check_input(in);
}

void fuzz_release_body(std::string_view body) {
  CheckInput in;
  if (!parse_release_body(body, in).ok()) return;
  check_input(in);
  FUZZ_REQUIRE(in.release != 0);
  // One spelling per lease: the body's, exactly.
  Json j;
  FUZZ_REQUIRE(parse_json_object(body, j).ok());
  FUZZ_REQUIRE(j["lease"].get<std::string>() == format_lease(in.release));
}

void fuzz_auth(std::string_view query, const Headers& headers) {
  CheckInput in;
  if (parse_auth_input(query, headers, in).ok()) check_input(in);
}

void fuzz_override(std::string_view body, bool plan_only) {
  Json j;
  if (!parse_json_object(body, j).ok()) return;
  sluice::rules::Override o;
  if (!parse_override_body(j, plan_only, kNow, o).ok()) return;
  FUZZ_REQUIRE(!o.entries.empty());
  FUZZ_REQUIRE(o.limits.size() <= kMaxLimitsPerOverride);
  FUZZ_REQUIRE(o.expires_at_ms == 0 || o.expires_at_ms > kNow);
  FUZZ_REQUIRE(!plan_only || !o.plan.empty());
}

std::string encode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0 || c == '-' || c == '_' || c == '.') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

void fuzz_query(std::string_view query) {
  Entries first;
  if (!parse_query(query, first)) return;
  std::string again;
  for (const auto& [k, v] : first) {
    if (!again.empty()) again.push_back('&');
    again += encode(k) + "=" + encode(v);
  }
  Entries second;
  FUZZ_REQUIRE(parse_query(again, second));
  // An empty key with an empty value ("=" or "&&") is kept as ("", ""), and so is "=" again.
  FUZZ_REQUIRE(second == first);
}

// Splits "query\nName: value\n..." into the query and the header lines.
void fuzz_auth_text(std::string_view text) {
  const size_t nl = text.find('\n');
  const std::string_view query = text.substr(0, nl);
  Headers headers;
  std::string_view rest = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
  while (!rest.empty() && headers.size() < 64) {
    const size_t end = rest.find('\n');
    const std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ')
      value.remove_prefix(1);
    headers.emplace_back(line.substr(0, colon), value);
  }
  fuzz_auth(query, headers);
}

void fuzz_request(std::string_view raw) {
  http::request_parser<http::string_body> parser;
  parser.header_limit(static_cast<uint32_t>(kMaxHeaderBytes));
  parser.body_limit(kMaxBodyBytes);
  parser.eager(true);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(raw.data(), raw.size()), ec);
  if (!ec && !parser.is_done()) parser.put_eof(ec);
  if (ec || !parser.is_done()) return;
  const auto& req = parser.get();
  FUZZ_REQUIRE(req.body().size() <= kMaxBodyBytes);

  const std::string_view target(req.target().data(), req.target().size());
  const size_t q = target.find('?');
  const std::string_view path = target.substr(0, q);
  const std::string_view query =
      q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
  const std::string_view method(req.method_string().data(), req.method_string().size());

  AdminAuth auth{std::string(kToken), /*lock_reads=*/false};
  const auto h = req.find(http::field::authorization);
  const std::optional<std::string_view> authorization =
      h == req.end()
          ? std::nullopt
          : std::optional<std::string_view>(std::string_view(h->value().data(), h->value().size()));
  const size_t count = req.count(http::field::authorization);
  const AdminAuth::Verdict v = auth.check(method, path, authorization, count);
  if (!v.allowed) FUZZ_REQUIRE(v.status == 401 || v.status == 403);
  if (v.allowed && auth.needs_token(method, path)) {
    FUZZ_REQUIRE(count == 1 && authorization.has_value());
    const auto token = bearer_token(*authorization);
    FUZZ_REQUIRE(token.has_value() && *token == kToken);
  }

  const std::string_view body = req.body();
  if (path == "/v1/check") {
    fuzz_check_body(body);
  } else if (path == "/v1/release") {
    fuzz_release_body(body);
  } else if (path == "/v1/auth") {
    Headers headers;
    for (const auto& f : req) {
      headers.emplace_back(std::string_view(f.name_string().data(), f.name_string().size()),
                           std::string_view(f.value().data(), f.value().size()));
    }
    fuzz_auth(query, headers);
  } else if (path == "/v1/overrides" || path == "/v1/plans") {
    fuzz_override(body, path == "/v1/plans");
  } else {
    fuzz_query(query);
  }
}

void fuzz_http(std::span<const uint8_t> in) {
  if (in.empty()) return;
  const uint8_t mode = in[0];
  const std::string_view text(reinterpret_cast<const char*>(in.data()) + 1, in.size() - 1);
  switch (mode % 5) {
    case 0:
      fuzz_request(text);
      break;
    case 1:
      fuzz_check_body(text);
      fuzz_release_body(text);
      break;
    case 2:
      fuzz_auth_text(text);
      break;
    case 3:
      fuzz_override(text, (mode & 8) != 0);
      break;
    default:
      fuzz_query(text);
      break;
  }
}

void write_seeds(const std::string& dir) {
  using sluice::fuzz::write_seed;
  const auto seed = [&](const std::string& name, uint8_t mode, std::string_view text) {
    std::string bytes(1, static_cast<char>(mode));
    bytes += text;
    write_seed(dir, name, bytes);
  };
  seed("request-check", 0,
       "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
       "Content-Length: "
       "61\r\n\r\n{\"domain\":\"api\",\"descriptors\":{\"api_key\":\"k1\"},\"hits\":2}\r\n");
  seed("request-auth", 0,
       "GET /v1/auth?domain=api&api_key=k%201&hits=1 HTTP/1.1\r\nHost: x\r\n"
       "X-Sluice-Path: /login\r\nX-Sluice-Client-Id: 7\r\n\r\n");
  seed("request-override", 0,
       "POST /v1/overrides HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret-token\r\n"
       "Transfer-Encoding: chunked\r\n\r\n"
       "3a\r\n{\"domain\":\"api\",\"descriptors\":{\"api_key\":\"k\"},\"limits\":[\"5/"
       "1m\"]}\r\n0\r\n\r\n");
  seed("request-drain-wrong-token", 0,
       "POST /v1/drain HTTP/1.1\r\nHost: x\r\nAuthorization: bearer   nope\r\nContent-Length: "
       "0\r\n\r\n");
  seed("request-healthz", 0, "GET /healthz?ready HTTP/1.1\r\nHost: x\r\n\r\n");
  seed("check-body", 1, R"({"domain":"api","descriptors":{"user":"42","path":"/a"},"hits":0})");
  seed("check-body-negative", 1, R"({"domain":"api","hits":-1})");
  seed("release-body", 1,
       R"({"domain":"jobs","descriptors":{"tenant":"t1"},"lease":"00c0ffee12345678"})");
  seed("auth", 2, "domain=api&user=%E2%82%AC&hits=3\nX-Sluice-Plan: pro\nX-Other: 1\n");
  seed("override", 3,
       R"({"domain":"api","descriptors":{"client_id":"shop-17"},"limits":["2000/1m","50/1s"],)"
       R"("granularity":"1s","mode":"enforce","ttl":"24h"})");
  seed("plan", 3 | 8, R"({"domain":"dns","descriptors":{"user":"7"},"plan":"pro","ttl":2592000})");
  seed("query", 4, "n=20&full=1&a+b=c%2Bd&&=");
}

}  // namespace

SLUICE_FUZZ_TARGET(fuzz_http, write_seeds)
