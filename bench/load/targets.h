// The targets of the load benchmark: the protocols the generator speaks, one Conn type each,
// and the blocking helpers used around a row (readiness probes, script load, preloading).
//
//   sluiced UDP / TCP   the check protocol of lib/wire (one check domain "bench", entry k=<key>)
//   Redis               the Lua sliding log (a sorted set per key), Figma's hash of minute
//                       counters, plain INCR, GCRA as a Lua script (kGcraScript); the same RESP
//                       client drives sluiced's Redis-protocol door with CL.THROTTLE
//   memcached           the memcached sliding window's two counters (get of both buckets, then
//                       incr or add)
//
// sluiced's connections are in targets.cc, the RESP and memcached clients in targets_kv.cc, all
// on the StreamConn of stream_conn.h (HTTP and gRPC: http_target.h, grpc_target.h).
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/process.h"
#include "load/driver.h"

namespace sluice::bench {

// 127.0.0.1:port.
sockaddr_in loopback(uint16_t port);

// A TCP socket connected to 127.0.0.1:port (connect bounded by timeout_ms), non-blocking and
// TCP_NODELAY; -1 with `err` set.
int tcp_connect(uint16_t port, int timeout_ms, std::string& err);

// The same keyspace for every target: key i is "u<i>".
struct Keyspace {
  std::vector<std::string> names;
  explicit Keyspace(uint32_t n);
};

// ---- sluiced ----------------------------------------------------------------------------------

inline constexpr std::string_view kSluiceDomain = "bench";
inline constexpr std::string_view kSluiceEntryKey = "k";  // each check's one entry: k=<key>

struct SluiceConnOptions {
  uint16_t port = 0;
  uint32_t batch = 1;               // checks per datagram / frame
  uint32_t window = 1;              // datagrams or frames in flight per socket / connection
  uint32_t udp_room_per_check = 0;  // UDP padding, as libsluice: 64 + this many bytes per check
  const Keyspace* keys = nullptr;
  // The server is the bare echo (load/echo_server.h): an "answer" is the request itself, matched
  // to the requests in the order they were sent.
  bool echo = false;
};
// UDP requests unanswered after 200 ms count as lost.
std::unique_ptr<Conn> make_sluice_udp(const SluiceConnOptions& o, ThreadContext& ctx);
std::unique_ptr<Conn> make_sluice_tcp(const SluiceConnOptions& o, ThreadContext& ctx);

// Sends one check (key "probe") over TCP and one over UDP and waits for both answers; "" when
// both came.
std::string sluice_probe(uint16_t port, int timeout_ms);

// One check (key "probe") through a connection `make` opens (with `o`, its keys the probe's),
// driven until it is answered: "" when it was, else the first error or "timed out". The probes of
// every door are made of it.
std::string probe_conn(
    const std::function<std::unique_ptr<Conn>(const Keyspace&, ThreadContext&)>& make,
    int timeout_ms);
template <typename O>
std::string probe_conn(O o, std::unique_ptr<Conn> (*make)(const O&, ThreadContext&),
                       int timeout_ms) {
  return probe_conn(
      [&](const Keyspace& keys, ThreadContext& ctx) {
        o.keys = &keys;
        return make(o, ctx);
      },
      timeout_ms);
}

// One sluiced for a scenario: UDP and TCP on a free loopback port, the admin door on another,
// gRPC and RESP on ports of their own when asked for (off otherwise), its rules one limit on every
// key (domain kSluiceDomain, entry kSluiceEntryKey), its config, log and data directory in `dir`.
// start() returns once every open door answers (sluice_probe, grpc_probe, redis_probe) and throws
// std::runtime_error when it is missing, fails or does not answer in 15 s.
struct SluicedChild {
  std::string exe;           // "" = the sluiced beside this program
  std::string written_by;    // the program, named in the first line of the files written
  std::string limits;        // the rule's limits entry: "1000/1m"
  std::string rule_extra;    // more lines under the rule, each "        name: value\n"
  std::string config_extra;  // more lines of sluiced.yaml, each "name: value\n"
  uint32_t threads = 1;
  bool data = true;                 // a fresh data directory (snapshots); false: none, no RocksDB
  bool grpc = false, resp = false;  // open the gRPC / Redis-protocol door
  uint16_t port = 0, admin_port = 0, grpc_port = 0, resp_port = 0;
  ChildProcess process;

  void start(const std::string& dir);
};

// Sends a request to the echo server (load/echo_server.h) over `transport` ("udp" or "tcp") and
// waits for it back; "" when it came.
std::string echo_probe(const std::string& transport, uint16_t port, int timeout_ms);

// GET `path` from an HTTP port (HTTP/1.1, Connection: close); "" or the error. Body in `body`.
std::string http_get(uint16_t port, const std::string& path, std::string& body);

// ---- Redis ------------------------------------------------------------------------------------

enum class RedisScheme {
  kIncr,         // INCR <key>
  kLuaLog,       // EVALSHA of kLuaSlidingLogScript
  kHashMinutes,  // Figma's: HINCRBY + EXPIRE + HGETALL, summed by the client
  kLuaGcra,      // EVALSHA of kGcraScript: redis-cell's GCRA on redis-server, in Lua
  kClThrottle,   // CL.THROTTLE, to sluiced's Redis-protocol door (or any redis-cell server)
};

// The Lua sliding log's script, verbatim.
extern const char* const kLuaSlidingLogScript;

// GCRA as a team on managed Redis writes it without the redis-cell module: CL.THROTTLE's
// arithmetic and five-integer reply, in microseconds on Redis's clock (TIME), the TAT stored with
// SET ... PX. KEYS[1] the limiter; ARGV max_burst, count_per_period, period (s), quantity.
extern const char* const kGcraScript;

struct RedisConnOptions {
  uint16_t port = 0;
  uint32_t batch = 1;   // checks whose commands are written together (pipelined by `batch`)
  uint32_t window = 1;  // such groups in flight per connection
  RedisScheme scheme = RedisScheme::kIncr;
  std::string lua_sha;  // kLuaLog, kLuaGcra: SHA1 returned by SCRIPT LOAD of the scheme's script
  uint64_t limit = 0;
  // kLuaGcra, kClThrottle: the limiter of every key (max_burst, count_per_period, period in s).
  int64_t gcra_burst = 0, gcra_count = 0, gcra_period_s = 0;
  const Keyspace* keys = nullptr;
};
std::unique_ptr<Conn> make_redis(const RedisConnOptions& o, ThreadContext& ctx);

std::string redis_probe(uint16_t port, int timeout_ms);
// Runs one command; the reply as text (":1", "+OK", "$<bulk>", "-ERR ...") in `reply`.
std::string redis_command(uint16_t port, const std::vector<std::string>& args, std::string& reply);
// Steady state of the minute-counter hash: every key's hash gets one count in each of the 60
// minutes before now.
std::string redis_preload_minutes(uint16_t port, const Keyspace& keys, int64_t now_ms);

// ---- memcached --------------------------------------------------------------------------------

struct MemcachedConnOptions {
  uint16_t port = 0;
  uint64_t limit = 0;
  const Keyspace* keys = nullptr;
};
std::unique_ptr<Conn> make_memcached(const MemcachedConnOptions& o, ThreadContext& ctx);

std::string memcached_probe(uint16_t port, int timeout_ms);
std::string memcached_flush_all(uint16_t port);
// Steady state of the memcached two counters: every key's previous-minute bucket exists (count 1).
std::string memcached_preload_previous(uint16_t port, const Keyspace& keys, int64_t now_ms);

// Bucket TTL of the memcached two counters with a one-minute window: the current and the previous
// bucket are read, so a bucket must live two minutes.
inline constexpr int kMemcachedBucketTtlS = 120;

}  // namespace sluice::bench
