// The admin port's authorization (admin_auth.h).
#include "node/admin_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cctype>

namespace sluice::node {
namespace {

using Digest = std::array<unsigned char, 32>;

// nullopt only when OpenSSL cannot compute SHA-256 (no default provider): then nothing matches.
std::optional<Digest> sha256(std::string_view s) {
  Digest d{};
  unsigned int len = 0;
  if (EVP_Digest(s.data(), s.size(), d.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != d.size()) {
    return std::nullopt;
  }
  return d;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool tokens_equal(std::string_view a, std::string_view b) {
  const std::optional<Digest> da = sha256(a);
  const std::optional<Digest> db = sha256(b);
  return da && db && CRYPTO_memcmp(da->data(), db->data(), da->size()) == 0;
}

std::optional<std::string_view> bearer_token(std::string_view h) {
  // RFC 6750: "Bearer" 1*SP token68. Leading and trailing spaces of a field value are not part of
  // it (Beast keeps none; be lenient with a hand-built value).
  while (!h.empty() && (h.front() == ' ' || h.front() == '\t'))
    h.remove_prefix(1);
  while (!h.empty() && (h.back() == ' ' || h.back() == '\t'))
    h.remove_suffix(1);
  constexpr std::string_view kScheme = "Bearer";
  if (h.size() <= kScheme.size() || !iequals(h.substr(0, kScheme.size()), kScheme)) {
    return std::nullopt;
  }
  std::string_view rest = h.substr(kScheme.size());
  if (rest.front() != ' ' && rest.front() != '\t') return std::nullopt;  // "Bearerx"
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t'))
    rest.remove_prefix(1);
  if (rest.empty()) return std::nullopt;
  return rest;
}

std::string_view AdminAuth::to_string(Failure f) {
  switch (f) {
    case Failure::kMissing:
      return "missing";
    case Failure::kMalformed:
      return "malformed";
    case Failure::kWrong:
      return "wrong";
    case Failure::kNoTokenConfigured:
      return "no_token_configured";
  }
  return "?";
}

AdminAuth::AdminAuth(std::string token, bool lock_reads) : lock_reads_(lock_reads) {
  if (!token.empty()) set_token(token);
}

void AdminAuth::set_token(std::string_view token) {
  const std::optional<Digest> d = sha256(token);
  std::lock_guard g(mu_);
  digest_ = d;
  has_token_ = !token.empty();
}

bool AdminAuth::has_token() const {
  std::lock_guard g(mu_);
  return has_token_;
}

bool AdminAuth::is_write(std::string_view method, std::string_view path) {
  if (method == "GET" || method == "HEAD") return false;
  // The checks count requests, as UDP checks do: the service's data path, not an operator's.
  // /v1/release is that path's other half: whoever may take a concurrency limit's lease with
  // /v1/check must be able to give it back, or every lease taken over HTTP would hold its slot
  // until it expires. It frees only the lease it names, with the domain and descriptors it was
  // granted for, as a release over UDP/TCP does (which has no token either).
  // /v1/inspect and /v1/ring take a body to name a key, and only read.
  return !(path == "/v1/check" || path == "/v1/auth" || path == "/v1/release" ||
           path == "/v1/inspect" || path == "/v1/ring");
}

AdminAuth::Access AdminAuth::access_of(std::string_view method, std::string_view path) {
  if (is_write(method, path)) return Access::kWrite;
  // The checks, /v1/release with them (see is_write), stay open: a service needs no token.
  if (path == "/healthz" || path == "/readyz" || path == "/v1/check" || path == "/v1/auth" ||
      path == "/v1/release") {
    return Access::kOpen;
  }
  return Access::kRead;
}

bool AdminAuth::needs_token(Access access) const {
  return access == Access::kWrite || (access == Access::kRead && lock_reads_);
}

bool AdminAuth::needs_token(std::string_view method, std::string_view path) const {
  return needs_token(access_of(method, path));
}

AdminAuth::Verdict AdminAuth::refuse(Failure f, unsigned status, std::string message) {
  failures_[static_cast<size_t>(f)].fetch_add(1, std::memory_order_relaxed);
  Verdict v;
  v.allowed = false;
  v.status = status;
  v.challenge = status == 401;
  v.message = std::move(message);
  return v;
}

AdminAuth::Verdict AdminAuth::check(std::string_view method, std::string_view path,
                                    std::optional<std::string_view> authorization,
                                    size_t header_count) {
  return check(access_of(method, path), authorization, header_count);
}

AdminAuth::Verdict AdminAuth::check(Access access, std::optional<std::string_view> authorization,
                                    size_t header_count) {
  if (!needs_token(access)) return {};
  std::optional<Digest> want;
  bool configured = false;
  {
    std::lock_guard g(mu_);
    want = digest_;
    configured = has_token_;
  }
  if (!configured) {
    if (loopback_.load()) return {};
    return refuse(Failure::kNoTokenConfigured, 403,
                  "operator writes are refused: the admin port listens on an address other than "
                  "loopback and the node has no admin_token_file (docs/operations.md, \"Admin "
                  "token\")");
  }
  if (!authorization) {
    return refuse(Failure::kMissing, 401, "this endpoint needs Authorization: Bearer <token>");
  }
  const std::optional<std::string_view> token =
      header_count == 1 ? bearer_token(*authorization) : std::nullopt;
  if (!token) {
    return refuse(Failure::kMalformed, 401,
                  "malformed Authorization header: expected one \"Bearer <token>\"");
  }
  const std::optional<Digest> got = sha256(*token);
  if (!got || !want || CRYPTO_memcmp(got->data(), want->data(), got->size()) != 0) {
    return refuse(Failure::kWrong, 403, "wrong admin token");
  }
  return {};
}

std::vector<std::pair<std::string_view, uint64_t>> AdminAuth::failures() const {
  std::vector<std::pair<std::string_view, uint64_t>> out;
  for (size_t i = 0; i < kFailureKinds; ++i) {
    out.emplace_back(to_string(static_cast<Failure>(i)),
                     failures_[i].load(std::memory_order_relaxed));
  }
  return out;
}

}  // namespace sluice::node
