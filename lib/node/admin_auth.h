// Private to lib/node: who may use the admin HTTP port (docs/operations.md, "Admin token").
//
// Operator writes (every request that is not GET or HEAD, except the checks /v1/check, /v1/auth
// and /v1/release (a lease's release: the checks' other half) and the read-only POSTs /v1/inspect
// and /v1/ring) need `Authorization: Bearer <token>` when the node has an admin token
// (`admin_token_file`). Unknown paths count as writes, so an endpoint added later is closed until
// someone decides otherwise. With `admin_token_reads` every request but /healthz and the checks
// needs the token too (/healthz stays open for liveness probes; it tells nothing but "ok").
//
// Without a token, writes are refused when the admin listener is bound to an address other than
// loopback (anyone on the network could change limits or drain the node); on loopback they are
// allowed, as before tokens existed.
//
// The token is compared in constant time: both sides are hashed with SHA-256 and the digests are
// compared with CRYPTO_memcmp, so neither the content nor the length of the token leaks through
// the time an answer takes.
//
// Thread-safety: set_token() may be called from any thread (SIGHUP, on the control thread) while
// check() runs on the admin thread; the token's digest is guarded by `mu_`. Counters are atomic.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "front/admin/admin_front.h"

namespace sluice::node {

// True when a and b are equal. Constant time in their content and lengths (SHA-256 of each, then
// CRYPTO_memcmp over the digests).
bool tokens_equal(std::string_view a, std::string_view b);

// Reads an admin token file: the whole file, trailing newlines (and \r, spaces) stripped, or the
// error naming the file (io_error: unreadable; invalid_argument: empty once stripped). Defined in
// config.cc, with the config's other file readers.
StatusOr<std::string> read_admin_token_file(const std::string& path);

// The token of an `Authorization` header value, or nullopt when it is not "Bearer <token>" (the
// scheme is case-insensitive; the token is what follows the spaces after it, not empty).
std::optional<std::string_view> bearer_token(std::string_view authorization);

class AdminAuth {
 public:
  enum class Failure { kMissing, kMalformed, kWrong, kNoTokenConfigured };
  static constexpr size_t kFailureKinds = 4;
  static std::string_view to_string(Failure f);

  // `token` empty: no token configured. `lock_reads`: admin_token_reads.
  AdminAuth(std::string token, bool lock_reads);

  // Replaces the token (SIGHUP re-reads the file). An empty token is refused by the caller.
  void set_token(std::string_view token);
  bool has_token() const;
  // Whether the admin listener is bound to a loopback address (set before serving).
  void set_loopback_listener(bool loopback) { loopback_.store(loopback); }
  bool loopback_listener() const { return loopback_.load(); }

  using Verdict = front::admin::AuthVerdict;
  using Access = front::admin::Access;
  // `authorization`: the header's value, nullopt when absent; `header_count`: how many
  // Authorization headers the request had (more than one is malformed). Counts refusals.
  Verdict check(Access access, std::optional<std::string_view> authorization,
                size_t header_count = 1);
  // check(access_of(method, path), ...).
  Verdict check(std::string_view method, std::string_view path,
                std::optional<std::string_view> authorization, size_t header_count = 1);

  // Refusals so far, by reason ("missing", "malformed", "wrong", "no_token_configured").
  std::vector<std::pair<std::string_view, uint64_t>> failures() const;

  // Whether a request needs the token (or, without one, a loopback listener): see the top.
  static bool is_write(std::string_view method, std::string_view path);
  bool needs_token(std::string_view method, std::string_view path) const;
  bool needs_token(Access access) const;
  // The rules above as a level: kWrite for a write, kOpen for /healthz read and the checks, kRead
  // otherwise. The admin port's route table names each row's level (the same); this one is for
  // requests no row takes (404, 405).
  static Access access_of(std::string_view method, std::string_view path);

 private:
  Verdict refuse(Failure f, unsigned status, std::string message);

  mutable std::mutex mu_;                                // guards digest_ and has_token_
  std::optional<std::array<unsigned char, 32>> digest_;  // nullopt: SHA-256 failed, none matches
  bool has_token_ = false;
  const bool lock_reads_;
  std::atomic<bool> loopback_{true};
  std::array<std::atomic<uint64_t>, kFailureKinds> failures_{};
};

}  // namespace sluice::node
