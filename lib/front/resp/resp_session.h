// The RESP door's per-connection session: what a stock Redis client (redis-py, ioredis,
// node-redis, go-redis, Jedis, Lettuce, redis-cli, redis-benchmark) sends, answered in Redis's
// own words, and the rate-limit commands handed to a Backend that the node implements. Pure
// code: the front that owns the socket feeds it bytes and writes what it answers.
//
// Commands the session answers itself, as redis-server 7.2 does (texts from its networking.c,
// server.c, acl.c, multi.c): HELLO, AUTH, PING, ECHO, QUIT, SELECT (0-15, passed to the backend
// as `db`), CLIENT SETNAME|GETNAME|SETINFO|ID, INFO (sections server, persistence with
// `loading:0`, replication), COMMAND (the door's commands), COMMAND INFO|COUNT, CONFIG GET (`save`
// and `appendonly`, for redis-benchmark), MULTI/EXEC/DISCARD. COMMAND DOCS is Redis's "unknown
// subcommand" error, so redis-cli falls back to its built-in help. Anything else is Redis's
// `ERR unknown command '<name>', with args beginning with: '<arg>' ... `.
//
// Commands handed to the Backend, their arguments checked here first:
//   CL.THROTTLE key max_burst count_per_period period [quantity]
//       redis-cell's command: i64 arguments (`Cell error: Store error: ...` texts as
//       redis-cell sends them, no ERR), answered [limited, limit, remaining, retry_after,
//       reset_after] as integers; the arithmetic is the backend's.
//   DEL key [key ...]
//       resets CL.THROTTLE keys; answered with how many existed.
//   SLUICE.CHECK domain key value [key value ...] [HITS n]
//       a check against the rules file: the descriptors of `domain`, `hits` (default 1, 0 peeks).
//       A last pair whose key is HITS (any case), after at least one other pair, is the option,
//       so a descriptor named "hits" goes anywhere but last. Answered, for the most restrictive
//       enforcing limit, and the decision's modes:
//         RESP3 (after HELLO 3): %7 allowed (1|0), limit, remaining, retry_after_s, reset_s,
//                                shadow (1|0), would_deny (1|0)
//         RESP2: *7 [allowed, limit, remaining, retry_after_s, reset_s, shadow, would_deny]
//       all integers; limit and remaining are -1 when no limit applies. shadow: denied by shadow
//       rules only (the caller should fail silently); would_deny: a dry-run rule would deny.
//   SLUICE.ACQUIRE domain key value [key value ...] [HITS n]
//       a check that takes a concurrency lease: answered as SLUICE.CHECK with an eighth field
//       `lease`, 16 lowercase hex digits (a bulk string), or null when refused.
//   SLUICE.RELEASE domain lease key value [key value ...]
//       gives the lease back (the same domain and descriptors as its acquire): `:1` released,
//       `:0` nothing to release (released before, expired, or unknown).
//
// Order. Replies go out strictly in request order. Each command has a reply slot; the backend
// fills a slot through its Answer, now or later (a check forwarded to the key's owner), and
// output() holds the filled prefix. EXEC writes its array header, then runs the queued commands:
// their slots follow it, so the array is whole and in order even when the answers come late.
//
// Authentication: with Config::password set, only HELLO (with AUTH), AUTH, PING and QUIT are
// served until AUTH succeeds; the rest get `NOAUTH Authentication required.`, as Redis does,
// except PING: Redis answers it NOAUTH too, here it answers PONG so that a health probe
// (`PING` from nc, a load balancer, a kubelet) needs no password. PING reads no counter.
// The password is compared in constant time; failures are counted.
//
// Errors that end a connection (a ProtocolError, QUIT, an HTTP request): the session answers
// what came before and the error (none for HTTP), reads nothing more, and is finished() once
// every reply is in output(); the front writes it and closes.
//
// Threads: a session, its Backend calls and every Answer belong to the connection's thread. A
// backend that answers from another thread posts the Answer back to it first. An Answer that
// outlives its session is ignored when used.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "front/resp/resp_parser.h"
#include "front/resp/resp_writer.h"

namespace sluice::front::resp {

// The Redis version HELLO and INFO report: the one whose protocol behaviour the door follows,
// so clients that gate features on it (RESP3, CLIENT SETINFO) take the paths they take with it.
inline constexpr std::string_view kRedisVersion = "7.2.0";
inline constexpr int kDatabases = 16;  // SELECT 0..15, as redis-server's default
// Replies a session may await from the backend before the front should stop reading.
inline constexpr size_t kMaxAwaitedReplies = 4096;
// Output bytes a session may hold before the front should stop reading (a client that sends
// and never reads).
inline constexpr size_t kMaxOutputBytes = 1024 * 1024;
// A MULTI's queue: commands, and their bytes; past either, EXEC answers EXECABORT.
inline constexpr size_t kMaxQueuedCommands = 1024;
inline constexpr size_t kMaxQueuedBytes = 256 * 1024;

struct ThrottleRequest {
  int db = 0;  // SELECT's index
  std::string_view key;
  int64_t max_burst = 0;
  int64_t count_per_period = 0;
  int64_t period_s = 0;
  int64_t quantity = 1;
};

// CL.THROTTLE's five integers, as redis-cell sends them.
struct ThrottleAnswer {
  int64_t limited = 0;
  int64_t limit = 0;
  int64_t remaining = 0;
  int64_t retry_after_s = -1;
  int64_t reset_after_s = 0;
};

struct DelRequest {
  int db = 0;
  std::span<const std::string_view> keys;
};

// SLUICE.CHECK and SLUICE.ACQUIRE.
struct CheckRequest {
  std::string_view domain;
  std::span<const std::string_view> entries;  // key, value, key, value, ...
  uint64_t hits = 1;
};

// The headline limit is the most restrictive enforcing one (the RateLimit headers' limit).
struct CheckAnswer {
  bool allowed = true;
  int64_t limit = -1;
  int64_t remaining = -1;
  int64_t retry_after_s = 0;
  int64_t reset_s = 0;
  bool shadow = false;      // denied by shadow rules only: the caller should fail silently
  bool would_deny = false;  // a dry-run rule would have denied it (it was allowed)
};

struct LeaseAnswer {
  CheckAnswer check;
  uint64_t lease = 0;  // 0: none (refused, or nothing to lease)
};

struct ReleaseRequest {
  std::string_view domain;
  std::span<const std::string_view> entries;
  uint64_t lease = 0;
};

namespace detail {
class SessionCore;
}

// The reply slot of one backend command: call ok() or fail() once, on the connection's thread.
// One that is destroyed unused answers `ERR no answer from the rate limiter`, so a lost answer
// never holds up the replies after it.
template <class T>
class Answer {
 public:
  Answer(Answer&& o) noexcept : core_(std::move(o.core_)), slot_(o.slot_) { o.core_.reset(); }
  Answer& operator=(Answer&&) = delete;
  Answer(const Answer&) = delete;
  ~Answer();

  void ok(const T& value);
  // `text` is the whole error with its code: "ERR ...", "Cell error: Store error: ...".
  void fail(std::string_view text);

 private:
  friend class detail::SessionCore;
  Answer(std::weak_ptr<detail::SessionCore> core, uint64_t slot)
      : core_(std::move(core)), slot_(slot) {}
  std::weak_ptr<detail::SessionCore> core_;
  uint64_t slot_ = 0;
};

// The rate-limit side, implemented by the node. The requests' views are valid during the call
// only. Each call answers its Answer exactly once, now or later.
//
// A backend may hold CL.THROTTLE commands and decide them together (one pass of the node's check
// path for a client's pipeline) as long as their effects keep request order: every other call,
// and flush(), decides what it holds first. feed() calls flush() once it has run the whole
// commands of its input, so held commands are answered before feed() returns.
class Backend {
 public:
  virtual void throttle(const ThrottleRequest& req, Answer<ThrottleAnswer> answer) = 0;
  virtual void del(const DelRequest& req, Answer<int64_t> answer) = 0;
  virtual void check(const CheckRequest& req, Answer<CheckAnswer> answer) = 0;
  virtual void acquire(const CheckRequest& req, Answer<LeaseAnswer> answer) = 0;
  virtual void release(const ReleaseRequest& req, Answer<bool> answer) = 0;
  virtual void flush() {}

 protected:
  virtual ~Backend() = default;
};

// Counted by every session of a front; relaxed atomics (one set per worker thread avoids
// sharing a cache line, summed by the metrics appender).
struct RespCounters {
  std::array<std::atomic<uint64_t>, kProtocolErrorKinds> protocol_errors{};
  std::atomic<uint64_t> auth_failures{0};
  std::atomic<uint64_t> commands{0};
  std::atomic<uint64_t> unknown_commands{0};
};

struct Config {
  std::string password;  // empty: none; AUTH then answers Redis's "without any password" error
  std::string sluice_version = "0.0.0";  // INFO's sluice_version
};

class RespSession {
 public:
  // `config`, `backend` and `counters` outlive the session. `client_id`: CLIENT ID and HELLO's
  // id. `wake` is called when an Answer filled after feed() returned has added to output().
  RespSession(const Config& config, Backend& backend, RespCounters& counters, uint64_t client_id,
              std::function<void()> wake);
  ~RespSession();
  RespSession(const RespSession&) = delete;
  RespSession& operator=(const RespSession&) = delete;

  // Runs the whole commands at the start of `input` (the bytes read and not consumed yet) and
  // returns how many bytes it consumed: the caller drops them and passes the rest again, with
  // more after it. Reads nothing once closing().
  size_t feed(std::string_view input);

  // Replies ready to send, in request order. The front writes them and erases what it wrote.
  std::string& output();
  bool closing() const;    // no more input is read (QUIT, a protocol error, an HTTP request)
  bool finished() const;   // closing() and every reply is in output(): close once written
  size_t awaited() const;  // replies still awaited from the backend
  // Whether the front should read more now: not closing, and awaited() and output() under
  // kMaxAwaitedReplies and kMaxOutputBytes.
  bool wants_input() const;
  Protocol protocol() const;

 private:
  std::shared_ptr<detail::SessionCore> core_;
};

}  // namespace sluice::front::resp
