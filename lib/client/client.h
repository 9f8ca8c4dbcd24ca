// libsluice: the client library services link to ask Sluice nodes "may this request go ahead?".
//
// A Client talks to one or more nodes over UDP or TCP (lib/wire's protocol, docs/protocol.md).
// Checks from any number of threads are queued, coalesced into one request per node (one UDP
// datagram or one TCP frame, TCP requests pipelined and answered in any order, matched by id) and
// sent by one background I/O thread that the Client owns. Every check ends within its timeout:
// when no node answers in time the caller's fail mode decides (fail-open: allowed, fail-closed:
// denied) and the result says so. docs/client.md is the guide; this header is the contract.
//
//   auto client = sluice::Client::create({.nodes = {"127.0.0.1:7350"}}, &error);
//   sluice::Result r = client->check("api", {{"client_id", "shop-17"}, {"user", "42"}});
//   if (!r.allowed) return reply_429(r);            // r.limits has the RateLimit-* details
//
// Concurrency limits (docs/protocol.md, "Leases") grant an admitted check a lease, held until it
// is released or its lease_ttl is over. acquire() returns it in a Lease, which releases it when
// it goes out of scope:
//
//   auto [r, lease] = client->acquire("jobs", {{"tenant", "t1"}});
//   if (!r.allowed) return reply_429(r);
//   run_job();                                      // ~Lease releases the slot
//
// Thread safety: every member function may be called from any number of threads at once, except
// the destructor. Callbacks (async_check) run on the Client's I/O thread: they must be short,
// must not block, must not call the blocking check()/check_batch() (that throws
// std::logic_error: it could only deadlock) and must not destroy the Client.
//
// Lifetime: the destructor stops the I/O thread after completing every pending check with the
// fail mode (outcome kUnavailable), so every callback runs exactly once and every coroutine
// resumes. Coroutines awaiting co_check are resumed through their own executor, whose execution
// context must outlive the Client.
#pragma once

#include <utility>  // before Asio: Boost 1.74 + g++ 12 in C++20 miss std::exchange otherwise

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/protocol.h"

namespace sluice {

// What a check names: views, copied by the Client before any call returns.
using Entry = wire::Entry;              // {key, value}, e.g. {"user", "42"}
using Check = wire::Check;              // {domain, entries, hits = 1}; is_release: a release
using LimitStatus = wire::LimitStatus;  // one applied limit: name, limit, remaining, reset, ...

enum class Transport : uint8_t {
  kUdp,  // one datagram per request, no connection; a lost datagram costs one attempt timeout
  kTcp,  // one connection per node, opened on first use, requests pipelined as frames
};

enum class FailMode : uint8_t {
  kOpen,    // no answer: allowed = true (protect availability; the usual choice)
  kClosed,  // no answer: allowed = false (protect the backend; for abuse-sensitive endpoints)
};

struct ClientOptions {
  // Nodes as "host:port" in order of preference: "127.0.0.1:7350", "[::1]:7350",
  // "localhost:7350". A check goes to the first node not known to be down and, when an attempt
  // fails or times out, to the next one. Names are resolved once, by create().
  std::vector<std::string> nodes;
  Transport transport = Transport::kUdp;
  FailMode fail_mode = FailMode::kOpen;

  // The whole budget of one check, from the call to its result, retries included. The default
  // fits a check on the request path of an API server (a loopback answer takes ~0.1 ms).
  std::chrono::microseconds timeout = std::chrono::milliseconds(20);
  // Sends per check at most (>= 1). Attempt k waits (time left) / (attempts left) before the next
  // node is tried; an attempt that fails outright (connection refused, reset) moves on at once.
  // With one node, a retry goes to the same node (a lost datagram).
  uint32_t attempts = 2;

  // How long the first queued check waits for others to share its request. 0: send at once;
  // checks queued while the I/O thread is busy still share the next request.
  std::chrono::microseconds batch_window{0};
  // Checks per request (1..wire::kMaxChecks). A request is also split when it would exceed the
  // largest datagram (UDP) or frame (TCP).
  uint32_t max_checks_per_request = 64;
  // UDP only: a node never answers with more bytes than the request carried, so requests are
  // padded to 64 + this many bytes per check. An answer takes about 25 bytes per check plus 80
  // per limit (names of ~20 characters), so the default leaves room for three limits per check.
  // 0 = no padding: answers may come back truncated (decisions without details,
  // Result::truncated). Across hosts, keep datagrams under the path MTU (fewer checks per
  // request) or use TCP.
  uint32_t udp_answer_room_per_check = 288;

  // A node that refused or dropped a connection, or left two attempts in a row unanswered, is
  // skipped for a backoff that doubles from backoff_min up to backoff_max and resets on an answer.
  // TCP reconnects lazily, on the first check after the backoff.
  std::chrono::milliseconds backoff_min{10};
  std::chrono::milliseconds backoff_max{1000};
  std::chrono::milliseconds connect_timeout{1000};  // TCP: a connect that takes longer fails
};

// How a result came about. Every outcome but kDecided is decided by the client, not a node.
enum class Outcome : uint8_t {
  kDecided,      // a node decided; `code` may still name a problem with this check
                 // (kUnknownDomain, kNoRoom, ...), in which case `allowed` is the node's verdict
  kRefused,      // a node refused the whole request (`code`: kMalformed, kTooManyChecks,
                 // kUnsupportedVersion, kTooLarge); the fail mode decided
  kInvalid,      // the client would not send this check (`code`: kEmptyDomain, kTooManyEntries,
                 // kNegativeHits, kTooLarge): a caller bug, never allowed whatever the fail mode
  kUnavailable,  // no node answered within the timeout, or the Client shut down; the fail mode
                 // decided
};
std::string_view to_string(Outcome o);  // "decided", "refused", "invalid", "unavailable"

struct Result {
  Outcome outcome = Outcome::kUnavailable;
  wire::Code code = wire::Code::kOk;
  bool allowed = false;      // the caller may go ahead
  bool would_deny = false;   // a dry-run rule would have denied it (allowed anyway)
  bool shadow = false;       // denied by shadow rules only: fail silently, like a shadow ban
  bool allowlisted = false;  // an allowlist entry matched: allowed, nothing counted
  bool truncated = false;    // the node dropped limit details to fit the UDP answer budget

  // One per applied limit, for RateLimit-* and Retry-After headers (empty unless decided).
  std::vector<LimitStatus> limits;

  // Granted by the check's concurrency limits when they admitted it; 0 = none (no such limit,
  // denied, or not decided by a node: a fail-open check holds no slot and needs no release).
  // Release it with Client::release and the check's domain and entries, or hold it in a Lease.
  uint64_t lease = 0;

  bool decided() const { return outcome == Outcome::kDecided; }
  // No node decided and the fail mode let the request through: log it, count it, alert on it.
  bool failed_open() const { return !decided() && allowed; }
};

// What a release came to (Client::release, Lease::release).
struct ReleaseResult {
  // kDecided: a node answered, `code` says what it did. kUnavailable / kRefused: no node
  // decided; the lease stays held until it is released or its lease_ttl is over. kInvalid: not
  // sent (`code`: kEmptyDomain, kTooManyEntries, kTooLarge; kLeaseUnknown for lease 0).
  Outcome outcome = Outcome::kUnavailable;
  // With kDecided: kOk (released: its slots are free), kLeaseReleased (released before; nothing
  // changed. A retried release whose first answer was lost sees this too: its own first attempt
  // released it), kLeaseExpired (its lease_ttl was over: the slots were freed then; also any id
  // the node does not hold whose expiry time, kept in the id, is over), kLeaseUnknown (no such
  // lease for this domain and these entries: other entries, mistyped, granted by a node that has
  // restarted since, or the rules changed), kNoRoom (the node's memory cap left no room to count
  // the release: nothing changed), or a check error (kUnknownDomain, ...).
  wire::Code code = wire::Code::kOk;

  bool released() const { return outcome == Outcome::kDecided && code == wire::Code::kOk; }
  // The lease holds nothing any more: released now or before, or expired.
  bool gone() const {
    return outcome == Outcome::kDecided &&
           (code == wire::Code::kOk || code == wire::Code::kLeaseReleased ||
            code == wire::Code::kLeaseExpired);
  }
};
std::string_view to_string(const ReleaseResult& r);  // "released", "lease_expired", "unavailable"

// Counters since create(), for metrics and tests. Reading them is cheap and lock-free.
struct ClientStats {
  uint64_t checks = 0;               // submitted
  uint64_t requests = 0;             // datagrams / frames sent
  uint64_t retries = 0;              // attempts after a check's first
  uint64_t answers = 0;              // answers matched to a request
  uint64_t dropped_answers = 0;      // malformed, unknown id, from the wrong node, wrong shape
  uint64_t unavailable = 0;          // checks that ended with Outcome::kUnavailable
  uint64_t link_failures = 0;        // refused/broken connections, ICMP unreachable, send errors
  uint64_t callback_exceptions = 0;  // exceptions thrown by callbacks (caught and dropped)
};

namespace client_detail {
class Core;
}

class Client;

// A granted lease that releases itself: the destructor (and move assignment over a held lease)
// releases it unless release() was called or it was detach()ed. Movable, not copyable.
//
// The destructor's release is fire-and-forget: queued on the Client like async_release, sent
// with the Client's timeout, retries and failover, its result dropped. A destructor must not
// block the request path (a blocking release waits up to the Client's timeout) nor throw, and it
// may run on the Client's I/O thread (a Lease destroyed in a callback), where a blocking call
// is refused. A release that never arrives costs the slot until the lease_ttl is over, as for a
// process that dies holding it. Call release() to know the outcome.
//
// Thread safety: one Lease is used by one thread at a time (as a std::unique_ptr); different
// Leases may be used at once. The Client must outlive every Lease made with it; a release queued
// just before the Client is destroyed may not be sent (TCP) and is left to expire.
class Lease {
 public:
  Lease() = default;  // holds nothing
  // Takes over the lease `decision` granted (decision.lease, 0: holds nothing) for the check of
  // this domain and these entries, which are copied: a release must name the same ones.
  Lease(Client& client, std::string_view domain, std::span<const Entry> entries,
        const Result& decision);
  ~Lease();
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  bool held() const { return id_ != 0; }
  explicit operator bool() const { return held(); }
  uint64_t id() const { return id_; }  // 0 when it holds nothing

  // Releases it now and waits for the answer (Client::release); afterwards it holds nothing,
  // whatever the outcome. Holding nothing: nothing sent, {kInvalid, kLeaseUnknown}. Not from a
  // Client callback (std::logic_error, as a blocking check).
  ReleaseResult release();
  // Gives the lease up without releasing it and returns its id (0 when it held none): the caller
  // releases it (Client::release) or lets it expire.
  uint64_t detach();

 private:
  void release_async() noexcept;
  std::string_view domain() const;
  std::vector<Entry> entries() const;  // views into text_

  Client* client_ = nullptr;
  uint64_t id_ = 0;
  std::string text_;               // the domain, then each entry's key and value, back to back
  std::vector<uint32_t> lengths_;  // their lengths, in that order
};

class Client {
 public:
  using Callback = std::function<void(Result)>;

  // Resolves the nodes and starts the I/O thread. Returns nullptr, with the reason in *error when
  // error is not null, if the options are unusable (no nodes, a node that is not host:port, a
  // name that does not resolve, a setting out of range).
  static std::unique_ptr<Client> create(ClientOptions options, std::string* error = nullptr);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Blocking checks: return within timeout + a few milliseconds whatever the network does (the
  // wait itself is bounded, should the I/O thread be stalled by a slow callback).
  Result check(const Check& check);
  Result check(std::string_view domain, std::span<const Entry> entries, int64_t hits = 1);
  Result check(std::string_view domain, std::initializer_list<Entry> entries, int64_t hits = 1);
  // One result per check, in order, into `results` (resized; reuse it across calls). The checks
  // share requests; each one still has its own answer.
  void check_batch(std::span<const Check> checks, std::vector<Result>& results);

  // Queues the check and returns at once; `done` runs exactly once, on the I/O thread.
  void async_check(const Check& check, Callback done);

  // For Boost.Asio coroutines: `Result r = co_await client.co_check(check);`. The check is copied
  // when co_check is called; the coroutine resumes on its own executor.
  boost::asio::awaitable<Result> co_check(const Check& check);

  // ---- leases (concurrency limits; docs/protocol.md, "Leases") ----

  // A blocking check (as check()) whose granted lease, if any, comes in a Lease that releases
  // it. `lease` holds nothing when none was granted: denied, no concurrency limit applied, or no
  // node decided (fail-open holds no slot).
  struct Acquired {
    Result result;
    Lease lease;
  };
  Acquired acquire(std::string_view domain, std::span<const Entry> entries, int64_t hits = 1);
  Acquired acquire(std::string_view domain, std::initializer_list<Entry> entries, int64_t hits = 1);

  // Gives back a lease, blocking (as check(), within the timeout). `domain` and `entries` must be
  // those of the check that was granted it: the release goes to the node that holds it (its
  // keys' owner in a cluster) and frees the slots of exactly those keys. Idempotent: a second
  // release answers kLeaseReleased and changes nothing.
  ReleaseResult release(std::string_view domain, std::span<const Entry> entries, uint64_t lease);
  ReleaseResult release(std::string_view domain, std::initializer_list<Entry> entries,
                        uint64_t lease);
  // Queues a release and returns at once; `done` (may be empty: fire-and-forget) runs exactly
  // once, on the I/O thread.
  using ReleaseCallback = std::function<void(ReleaseResult)>;
  void async_release(std::string_view domain, std::span<const Entry> entries, uint64_t lease,
                     ReleaseCallback done);

  ClientStats stats() const;
  const ClientOptions& options() const;

 private:
  explicit Client(std::unique_ptr<client_detail::Core> core);
  std::unique_ptr<client_detail::Core> core_;
};

}  // namespace sluice
