// sluice-bench-load: checks per second and latency of sluiced over loopback UDP and TCP, against
// common rate limiter designs run for real on the same machine in the same run:
//   Redis + the Lua sliding log (a sorted set per key), Redis + Figma's hash of minute counters,
//   memcached + the memcached sliding window's two counters, and plain Redis INCR as the floor of
//   any Redis design.
//
// One run starts the servers the selected rows need on free loopback ports, waits until each
// answers (bounded), drives the rows one after another with the same generator settings and stops
// every server (also on error, SIGINT/SIGTERM, or kill -9 of the benchmark: common/process.h).
//
// Rows and what is in flight (defaults; each row's in_flight says it):
//   sluiced-udp-single   8 UDP sockets x 8 datagrams of 1 check
//   sluiced-udp-batch32  8 UDP sockets x 2 datagrams of 32 checks          (512 checks)
//   sluiced-tcp-single   16 connections x 32 frames of 1 check, pipelined (512 checks)
//   sluiced-tcp-batch32  16 connections x 1 frame of 32 checks             (512 checks)
//   redis-*-single       16 connections x 1 check, unpipelined (a request waits for its answer)
//   redis-*-pipe32       16 connections x 1 group of 32 checks' commands  (512 checks)
//   memcached-single     16 connections x 1 check (get, then incr: two round trips)
//   udp-echo-*, tcp-echo-*   the ceilings (load/echo_server.h): sluiced's own requests, the same
//                        sockets, windows and thread count, answered by a bare echo
//   sluiced-http-single  16 keep-alive connections x 1 POST /v1/check (--http-window pipelines)
//   sluiced-resp-single  16 connections x 1 CL.THROTTLE to sluiced's Redis-protocol door
//   sluiced-resp-pipe16  16 connections x 1 group of 16 CL.THROTTLE written at once (as
//                        redis-benchmark -P 16)
//   redis-lua-gcra-single  16 connections x 1 EVALSHA of the same GCRA in Lua (kGcraScript)
//   redis-incr-pipe16    16 connections x 1 group of 16 INCR: Redis's own pipelined ceiling
//   nginx-limitreq-single  the same against nginx's limit_req on the same keys (load/http_target.h)
//   sluiced-udp-single@half  (--half-rate) open loop at half of sluiced-udp-single's max, each
//                        check timed from when it was due (no coordinated omission)
// UDP keeps fewer datagrams in flight than TCP keeps frames: each one is a separate buffer in the
// server's socket (default receive buffer), and more only queue there (measured: 64 and 256 in
// flight give the same checks/s, 4x the latency). Before each Redis row: FLUSHALL (the script
// stays loaded); before the hash row, each key gets the 60 earlier minutes' fields (the steady
// state of an hourly window, so HGETALL returns 61 fields); before the memcached row: flush_all,
// then each key's previous-minute bucket. The Lua sliding log is not preloaded (a steady state
// holds every request of the last minute per key: too much to write), so its sorted sets stay
// small during a row, which flatters that baseline.
//
// --curve: the latency curve of each door of the one sluiced (UDP, TCP, HTTP, gRPC, RESP single
// checks), rows curve-<door>-<pinned|unpinned>-<max|pct>, instead of the rows unless --only names
// some. For each door and pinning: its max (closed loop), then open loop at each --curve-loads
// percent of that max, every check timed from its scheduled send time. Pinned: every thread of
// sluiced on --server-cpu, the generator's on --generator-cpu (sched_setaffinity); unpinned: both
// where they could run at the start, so the two sets side by side show the machine's own jitter.
// The max of each pinning is measured in that pinning, right before its open-loop points.
//
// The generator (load/driver.h; protocol clients: load/targets.h) shares the machine's cores: the
// *_cores fields say what it, the server under test and the rest used over the row. bench/report.py
// judges the goals from the rows (bench/goals.toml).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/json_rows.h"
#include "common/metrics.h"
#include "common/proc_stats.h"
#include "common/process.h"
#include "common/scenario.h"
#include "load/driver.h"
#include "load/echo_server.h"
#include "load/grpc_target.h"
#include "load/http_target.h"
#include "load/targets.h"

namespace {

namespace bench = sluice::bench;
using bench::Row;

// Far above any key's traffic in a row, so every check is allowed and counted everywhere: the
// figures are the cost of the counting path.
constexpr uint64_t kLimit = 1'000'000'000;

struct Options {
  bool half_rate = false;
  bool list = false;
  std::vector<std::string> only;
  bench::DriveOptions drive;  // seconds, warm-up, keys, distribution, --rate, generator threads
  uint32_t connections = 16;
  uint32_t depth = 32;       // sluiced TCP single checks: frames in flight per connection
  uint32_t batch_depth = 1;  // batch rows (sluiced TCP, Redis pipelined): groups per connection
  uint32_t batch = 32;
  uint32_t udp_sockets = 8;
  uint32_t udp_window = 8;
  uint32_t udp_batch_window = 2;
  uint32_t udp_room = 288;   // libsluice's default udp_answer_room_per_check
  uint32_t http_window = 1;  // HTTP rows: requests in flight per connection (pipelined if > 1)
  // The generator takes one core; Redis serves on one thread. Giving sluiced the one core left
  // keeps three busy threads off two cores (measured: 2 threads on this 2-core machine cost
  // scheduler time slices, p99.9 ~4 ms).
  uint32_t server_threads = 1;
  uint32_t busy_poll_us = 0;  // sluiced's udp_busy_poll_us (docs/operations.md)
  std::string sluiced;
  // --curve
  bool curve = false;
  std::vector<std::string> doors;
  std::vector<uint64_t> curve_loads;
  std::vector<bool> pinnings = {true, false};
  int server_cpu = 0, generator_cpu = 1;
  uint32_t grpc_connections = 4;
  uint32_t grpc_window = 32;
};

// The servers, by index into Servers' arrays.
enum Server { kSluiced, kRedis, kMemcached, kEchoUdp, kEchoTcp, kNginx, kServers };

enum class Kind {
  kSluiceUdp,
  kSluiceTcp,
  kRedisLua,
  kRedisHash,
  kRedisIncr,
  kMemcached,
  kEchoUdp,  // the ceilings: load/echo_server.h, driven exactly like sluiced's rows
  kEchoTcp,
  kSluiceHttp,     // POST /v1/check on the admin port (load/http_target.h)
  kNginxLimitReq,  // nginx's limit_req, the HTTP anchor
  kSluiceResp,     // CL.THROTTLE to sluiced's Redis-protocol door
  kRedisLuaGcra,   // the same GCRA as a Lua script on redis-server
  kSluiceGrpc,     // ShouldRateLimit at sluiced's gRPC door (the curve only)
};

// The Redis-protocol rows' pipeline: commands written at once per connection (redis-benchmark -P).
constexpr uint32_t kRespPipeline = 16;
// Their limiter (CL.THROTTLE's max_burst, count_per_period, period): every check allowed, as in
// the other rows, with an emission interval of 60 us (redis-cell's remaining is computed in
// whole microseconds).
constexpr int64_t kGcraBurst = 1'000'000, kGcraCount = 1'000'000, kGcraPeriodS = 60;

struct RowDef {
  std::string name;       // for --only
  std::string target;     // "sluiced", "redis-lua", ...
  std::string transport;  // "udp" | "tcp" | "http" | "resp"
  Kind kind;
  uint32_t batch;  // checks per datagram / frame / pipelined group
  Server server;
};

std::vector<RowDef> all_rows(const Options& o) {
  const uint32_t b = o.batch;
  const std::string bs = std::to_string(b);
  const uint32_t p = kRespPipeline;
  const std::string ps = std::to_string(p);
  std::vector<RowDef> rows = {
      {"sluiced-udp-single", "sluiced", "udp", Kind::kSluiceUdp, 1, kSluiced},
      {"sluiced-udp-batch" + bs, "sluiced", "udp", Kind::kSluiceUdp, b, kSluiced},
      {"sluiced-tcp-single", "sluiced", "tcp", Kind::kSluiceTcp, 1, kSluiced},
      {"sluiced-tcp-batch" + bs, "sluiced", "tcp", Kind::kSluiceTcp, b, kSluiced},
      {"sluiced-http-single", "sluiced", "http", Kind::kSluiceHttp, 1, kSluiced},
      {"nginx-limitreq-single", "nginx-limit-req", "http", Kind::kNginxLimitReq, 1, kNginx},
      {"udp-echo-single", "udp-echo", "udp", Kind::kEchoUdp, 1, kEchoUdp},
      {"udp-echo-batch" + bs, "udp-echo", "udp", Kind::kEchoUdp, b, kEchoUdp},
      {"tcp-echo-single", "tcp-echo", "tcp", Kind::kEchoTcp, 1, kEchoTcp},
      {"tcp-echo-batch" + bs, "tcp-echo", "tcp", Kind::kEchoTcp, b, kEchoTcp},
      {"redis-lua-single", "redis-lua", "tcp", Kind::kRedisLua, 1, kRedis},
      {"redis-lua-pipe" + bs, "redis-lua", "tcp", Kind::kRedisLua, b, kRedis},
      {"redis-hash-single", "redis-hash", "tcp", Kind::kRedisHash, 1, kRedis},
      {"redis-hash-pipe" + bs, "redis-hash", "tcp", Kind::kRedisHash, b, kRedis},
      {"memcached-single", "memcached", "tcp", Kind::kMemcached, 1, kMemcached},
      {"redis-incr-single", "redis-incr", "tcp", Kind::kRedisIncr, 1, kRedis},
      {"redis-incr-pipe" + bs, "redis-incr", "tcp", Kind::kRedisIncr, b, kRedis},
      {"sluiced-resp-single", "sluiced", "resp", Kind::kSluiceResp, 1, kSluiced},
      {"sluiced-resp-pipe" + ps, "sluiced", "resp", Kind::kSluiceResp, p, kSluiced},
      {"redis-lua-gcra-single", "redis-lua-gcra", "tcp", Kind::kRedisLuaGcra, 1, kRedis},
  };
  // With --batch 16 the batch rows already hold redis-incr-pipe16.
  if (b != p)
    rows.push_back({"redis-incr-pipe" + ps, "redis-incr", "tcp", Kind::kRedisIncr, p, kRedis});
  return rows;
}

// The doors of --curve and the kind of row each is driven as (single checks).
const std::map<std::string, Kind> kDoors = {{"udp", Kind::kSluiceUdp},
                                            {"tcp", Kind::kSluiceTcp},
                                            {"http", Kind::kSluiceHttp},
                                            {"grpc", Kind::kSluiceGrpc},
                                            {"redis", Kind::kSluiceResp}};

bool selected(const Options& o, const std::string& name) {
  return o.only.empty() || std::any_of(o.only.begin(), o.only.end(), [&](const std::string& n) {
           return name == n ||
                  (name.starts_with(n) && name.size() > n.size() && name[n.size()] == '-');
         });
}

bool curve_has(const Options& o, const std::string& door) {
  return o.curve && std::find(o.doors.begin(), o.doors.end(), door) != o.doors.end();
}

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse(bench::Cli& cli, int argc, char** argv, Options& o) {
  cli.app().footer(
      "Each row is printed as a name=value line when measured; --json adds the last line "
      "{\"rows\":[...]}, where open-loop rows also carry \"histogram_us\" ([us, checks] pairs). "
      "Each --curve point takes --warmup + --seconds.");
  std::string dist = "uniform", pinning = "both";
  cli.app()
      .add_option("--only", o.only,
                  "NAME[,NAME]: rows to run: a row name (--list) or a prefix of one ending at '-' "
                  "(sluiced, sluiced-udp, redis, redis-lua, ...); default: every row")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cli.flag("--list", o.list, "print the row names and exit");
  cli.flag("--half-rate", o.half_rate, "also sluiced-udp-single at half its max rate (open loop)");
  cli.seconds(o.drive.seconds, 0.1, 600, "measured seconds per row");
  cli.number("--warmup", o.drive.warmup_s, 0, 60, "unmeasured seconds before each row");
  cli.keys(o.drive.keys, 1, 10'000'000, "keyspace, the same for every target");
  cli.word("--dist", dist, {"uniform", "zipf"}, "key popularity (zipf: s = 0.99)");
  cli.number("--rate", o.drive.rate, 0, 1e9, "offered checks/s of every row; 0 = closed loop");
  cli.number("--connections", o.connections, 1, 1024, "TCP connections per row");
  cli.number("--depth", o.depth, 1, 4096, "sluiced TCP single checks: frames in flight per conn");
  cli.number("--batch", o.batch, 2, 1024, "checks per datagram / frame / group in batch rows");
  cli.number("--batch-depth", o.batch_depth, 1, 1024, "TCP batch rows: frames / groups per conn");
  cli.number("--udp-sockets", o.udp_sockets, 1, 1024, "UDP sockets");
  cli.number("--udp-window", o.udp_window, 1, 4096, "UDP single checks: datagrams per socket");
  cli.number("--udp-batch-window", o.udp_batch_window, 1, 4096, "UDP batches: dgrams per socket");
  cli.number("--udp-room", o.udp_room, 0, 2048, "UDP padding per check, as libsluice");
  cli.number("--http-window", o.http_window, 1, 1024, "HTTP rows: requests in flight per conn");
  cli.number("--gen-threads", o.drive.threads, 1, 2, "generator threads");
  cli.server_threads(o.server_threads);
  cli.number("--busy-poll-us", o.busy_poll_us, 0, 10'000, "sluiced's udp_busy_poll_us");
  cli.sluiced(o.sluiced);
  cli.flag("--curve", o.curve,
           "latency curves: for each door its max (closed loop), then open loop at 10, 25, 50 "
           "and 75 % of it, pinned and unpinned; instead of the rows, unless --only names rows "
           "too");
  cli.words("--doors", o.doors, {"udp", "tcp", "http", "grpc", "redis"},
            "D[,D]: doors of the curve: udp, tcp, http, grpc, redis (default: every door)");
  cli.numbers("--curve-loads", o.curve_loads, 1, 99,
              "P[,P]: open-loop points, percent of the door's max (10,25,50,75)");
  cli.word("--pinning", pinning, {"both", "pinned", "unpinned"}, "which sets of points");
  cli.number("--server-cpu", o.server_cpu, 0, CPU_SETSIZE - 1, "pinned: sluiced's CPU");
  cli.number("--generator-cpu", o.generator_cpu, 0, CPU_SETSIZE - 1, "pinned: the generator's CPU");
  cli.number("--grpc-connections", o.grpc_connections, 1, 1024, "gRPC door: HTTP/2 connections");
  cli.number("--grpc-window", o.grpc_window, 1, 4096, "gRPC door: calls in flight per connection");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return exit;
  std::erase(o.only, std::string());
  o.drive.zipf = dist == "zipf";
  if (pinning != "both") o.pinnings = {pinning == "pinned"};
  if (o.doors.empty()) o.doors = {"udp", "tcp", "http", "grpc", "redis"};
  if (o.curve_loads.empty()) o.curve_loads = {10, 25, 50, 75};
  return std::nullopt;
}

// ---- servers ----------------------------------------------------------------------------------

struct Servers {
  bench::TempDir dir;
  bench::SluicedChild sluiced;
  bench::ChildProcess child[kServers];  // all but sluiced
  uint16_t port[kServers] = {};         // kSluiced: the check port (UDP and TCP)
  std::string lua_sha, gcra_sha;        // SCRIPT LOAD of kLuaSlidingLogScript, kGcraScript
  pid_t pid(Server v) const { return v == kSluiced ? sluiced.process.pid() : child[v].pid(); }
};

// Starts the servers of `need` (and sluiced's Redis-protocol door with `resp`), each ready.
void start_servers(const Options& o, const bool (&need)[kServers], bool resp, Servers& s) {
  const std::string& dir = s.dir.path;
  auto start = [&](Server v, const std::vector<std::string>& argv, const std::string& name,
                   const std::function<std::string(uint16_t)>& probe, const std::string& as = "") {
    if (std::string e = s.child[v].start(argv, dir + "/" + name + ".log", as); !e.empty())
      throw std::runtime_error(name + ": " + e);
    bench::wait_ready(
        s.child[v], [&] { return probe(s.port[v]); }, 15'000);
  };
  for (int v = kRedis; v < kServers; ++v)
    if (need[v]) s.port[v] = bench::free_loopback_port();
  if (need[kNginx]) {
    std::filesystem::create_directories(dir + "/nginx");
    std::string err;
    const auto argv = bench::nginx_limit_req_argv(dir + "/nginx", s.port[kNginx], err);
    if (argv.empty()) throw std::runtime_error("nginx: " + err);
    start(kNginx, argv, "nginx", [](uint16_t p) { return bench::nginx_probe(p, 500); });
  }
  // The echo servers: this program again (sluice-bench load --echo-server), with sluiced's
  // thread count; ready once a request comes back.
  for (const auto& [v, transport] : {std::pair{kEchoUdp, "udp"}, std::pair{kEchoTcp, "tcp"}}) {
    if (!need[v]) continue;
    const std::string t = transport;
    start(v,
          {bench::self_exe_path(), "load", "--echo-server", t, std::to_string(s.port[v]),
           std::to_string(o.server_threads)},
          "echo-" + t, [t](uint16_t p) { return bench::echo_probe(t, p, 500); });
  }
  if (need[kSluiced]) {
    bench::SluicedChild& c = s.sluiced;
    c.exe = o.sluiced;
    c.written_by = "sluice-bench-load";
    c.limits = std::to_string(kLimit) + "/1m";
    c.config_extra = "udp_busy_poll_us: " + std::to_string(o.busy_poll_us) + "\n";
    c.threads = o.server_threads;
    c.grpc = curve_has(o, "grpc");
    c.resp = resp || curve_has(o, "redis");
    c.start(dir);
    s.port[kSluiced] = c.port;
  }
  if (need[kRedis]) {
    start(kRedis,
          {"redis-server", "--port", std::to_string(s.port[kRedis]), "--bind", "127.0.0.1",
           "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", dir},
          "redis", [](uint16_t p) { return bench::redis_probe(p, 500); });
    for (auto [sha, script] : {std::pair{&s.lua_sha, bench::kLuaSlidingLogScript},
                               std::pair{&s.gcra_sha, bench::kGcraScript}}) {
      std::string reply;
      const std::string e = bench::redis_command(s.port[kRedis], {"SCRIPT", "LOAD", script}, reply);
      if (!e.empty() || reply.size() != 41)
        throw std::runtime_error("redis SCRIPT LOAD: " + (e.empty() ? reply : e));
      *sha = reply.substr(1);
    }
  }
  // memcached refuses to run as root; as root the benchmark starts it as "nobody" itself rather
  // than with -u (see ChildProcess::start: the death signal must survive).
  if (need[kMemcached]) {
    start(
        kMemcached,
        {"memcached", "-l", "127.0.0.1", "-p", std::to_string(s.port[kMemcached]), "-U", "0", "-t",
         "2"},
        "memcached", [](uint16_t p) { return bench::memcached_probe(p, 500); }, "nobody");
  }
}

// ---- counters around a row ----------------------------------------------------------------------

// What a row's notes count around it, by the note's name: sluiced's counters (summed over label
// sets) and, for UDP rows, the kernel's UDP drops (/proc/net/snmp: receive-buffer overflows).
std::map<std::string, double> counters(uint16_t admin_port, bool udp) {
  std::map<std::string, double> c;
  std::string body;
  if (admin_port != 0 && bench::http_get(admin_port, "/metrics", body).empty()) {
    const auto samples = bench::parse_metrics(body);
    for (const auto& [note, metric] : {std::pair{"dropped", "sluice_dropped_datagrams_total"},
                                       {"rejected-req", "sluice_rejected_requests_total"},
                                       {"rejected-checks", "sluice_rejected_checks_total"},
                                       {"bad-frames", "sluice_bad_frames_total"},
                                       {"no-room", "sluice_no_room_total"}}) {
      if (const double v = bench::metric_sum(samples, metric); v >= 0)
        c[std::string("sluiced-") + note] = v;
    }
  }
  std::ifstream in("/proc/net/snmp");
  std::vector<std::string> lines;  // the names, then the values
  for (std::string line; udp && std::getline(in, line) && lines.size() < 2;) {
    if (line.starts_with("Udp: ")) lines.push_back(line);
  }
  if (lines.size() < 2) return c;
  std::istringstream names(lines[0]), values(lines[1]);
  for (std::string name, value; names >> name && values >> value;) {
    if (name == "RcvbufErrors") c["kernel-udp-rcvbuf-drops"] = std::strtod(value.c_str(), nullptr);
    if (name == "SndbufErrors") c["kernel-udp-sndbuf-drops"] = std::strtod(value.c_str(), nullptr);
  }
  return c;
}

// ---- rows -------------------------------------------------------------------------------------

// How the generator drives a kind of row: o.drive with its connections, what each keeps in flight.
struct Load {
  bench::DriveOptions drive;
  bench::ConnFactory factory;
  std::string in_flight;  // "16 conn x 32 frame of 1", ...
};

Load load_of(const Options& o, Kind kind, uint32_t batch, const Servers& s,
             const bench::Keyspace& keys) {
  Load l{o.drive, {}, {}};
  l.drive.conns = o.connections;
  l.drive.batch = batch;
  const std::string of = " of " + std::to_string(batch);
  // Connections made by make(opts), each keeping `window` of `what` in flight.
  auto use = [&](const char* conn, uint32_t window, const std::string& what, auto make, auto opts) {
    l.in_flight = std::to_string(l.drive.conns) + conn + std::to_string(window) + what;
    l.factory = [make, opts](bench::ThreadContext& ctx) { return make(opts, ctx); };
  };
  switch (kind) {
    case Kind::kEchoUdp:
    case Kind::kSluiceUdp:
    case Kind::kEchoTcp:
    case Kind::kSluiceTcp: {
      bench::SluiceConnOptions so;
      so.echo = kind == Kind::kEchoUdp || kind == Kind::kEchoTcp;
      const bool udp = kind == Kind::kEchoUdp || kind == Kind::kSluiceUdp;
      so.port = s.port[so.echo ? (udp ? kEchoUdp : kEchoTcp) : kSluiced];
      so.batch = batch;
      so.keys = &keys;
      if (udp) {
        so.window = batch == 1 ? o.udp_window : o.udp_batch_window;
        so.udp_room_per_check = o.udp_room;
        l.drive.conns = o.udp_sockets;
        use(" sock x ", so.window, " dgram" + of, bench::make_sluice_udp, so);
      } else {
        // Single checks: many frames in flight per connection. Batches: as many frames of
        // `batch` checks per connection as Redis pipelined by `batch` has groups (--batch-depth).
        so.window = batch == 1 ? o.depth : o.batch_depth;
        use(" conn x ", so.window, " frame" + of, bench::make_sluice_tcp, so);
      }
      break;
    }
    case Kind::kSluiceResp:
    case Kind::kRedisLuaGcra:
    case Kind::kRedisLua:
    case Kind::kRedisHash:
    case Kind::kRedisIncr: {
      const bool door = kind == Kind::kSluiceResp;
      if (door && s.sluiced.resp_port == 0)
        throw std::runtime_error("sluiced's Redis-protocol door is closed");
      bench::RedisConnOptions ro;
      ro.port = door ? s.sluiced.resp_port : s.port[kRedis];
      ro.batch = batch;
      // Unpipelined: one command (group) at a time; pipelined: --batch-depth groups of `batch`.
      ro.window = batch == 1 ? 1 : o.batch_depth;
      ro.scheme = door                          ? bench::RedisScheme::kClThrottle
                  : kind == Kind::kRedisLuaGcra ? bench::RedisScheme::kLuaGcra
                  : kind == Kind::kRedisLua     ? bench::RedisScheme::kLuaLog
                  : kind == Kind::kRedisHash    ? bench::RedisScheme::kHashMinutes
                                                : bench::RedisScheme::kIncr;
      ro.lua_sha = kind == Kind::kRedisLuaGcra ? s.gcra_sha : s.lua_sha;
      ro.limit = kLimit;
      ro.gcra_burst = kGcraBurst;
      ro.gcra_count = kGcraCount;
      ro.gcra_period_s = kGcraPeriodS;
      ro.keys = &keys;
      const std::string what = " group" + of + (kind == Kind::kRedisHash ? " (3 cmd each)" : "");
      use(" conn x ", ro.window, what, bench::make_redis, ro);
      break;
    }
    case Kind::kSluiceHttp:
    case Kind::kNginxLimitReq: {
      bench::HttpConnOptions ho;
      const bool nginx = kind == Kind::kNginxLimitReq;
      ho.port = nginx ? s.port[kNginx] : s.sluiced.admin_port;
      ho.scheme = nginx ? bench::HttpScheme::kNginxLimitReq : bench::HttpScheme::kSluiceCheck;
      ho.window = o.http_window;
      ho.keys = &keys;
      use(" conn x ", ho.window, " request", bench::make_http, ho);
      break;
    }
    case Kind::kSluiceGrpc: {
      if (s.sluiced.grpc_port == 0) throw std::runtime_error("sluiced's gRPC door is closed");
      bench::GrpcConnOptions go;
      go.port = s.sluiced.grpc_port;
      go.window = o.grpc_window;
      go.keys = &keys;
      l.drive.conns = o.grpc_connections;
      use(" h2 conn x ", go.window, " call", bench::make_grpc, go);
      break;
    }
    case Kind::kMemcached: {
      bench::MemcachedConnOptions mo;
      mo.port = s.port[kMemcached];
      mo.limit = kLimit;
      mo.keys = &keys;
      use(" conn x ", 1, " check (2 round trips)", bench::make_memcached, mo);
      break;
    }
  }
  return l;
}

// The steady state each baseline starts a row from (see the file comment).
void prepare(const RowDef& def, const Servers& s, const bench::Keyspace& keys) {
  std::string reply, e;
  if (def.server == kRedis) e = bench::redis_command(s.port[kRedis], {"FLUSHALL"}, reply);
  if (e.empty() && def.kind == Kind::kRedisHash)
    e = bench::redis_preload_minutes(s.port[kRedis], keys, bench::epoch_ms());
  if (def.kind == Kind::kMemcached) {
    e = bench::memcached_flush_all(s.port[kMemcached]);
    if (e.empty())
      e = bench::memcached_preload_previous(s.port[kMemcached], keys, bench::epoch_ms());
  }
  if (!e.empty()) throw std::runtime_error(def.target + " preload: " + e);
}

// Measures one row and adds it to `out`, with "notes" naming what went wrong or was dropped.
// from_schedule: open loop, each check timed from when it was due to leave (load "half").
const Row& run_row(const Options& o, const RowDef& def, Servers& s, const bench::Keyspace& keys,
                   double rate, bool from_schedule, bench::Rows& out) {
  prepare(def, s, keys);
  const Load l = load_of(o, def.kind, def.batch, s, keys);
  const uint16_t admin = def.server == kSluiced ? s.sluiced.admin_port : 0;
  const bool udp = def.transport == "udp";
  const auto c0 = counters(admin, udp);
  bench::DriveOptions d = l.drive;
  d.rate = rate;
  d.latency_from_schedule = from_schedule;
  bench::Cores cores;
  const bench::RowStats st = bench::drive(d, l.factory, s.pid(def.server), cores);
  std::vector<std::pair<std::string, double>> more;
  if (rate > 0 && st.send_lag.count() > 0)
    more.emplace_back("send-lag-p99-us", static_cast<double>(st.send_lag.quantile_ns(0.99)) / 1e3);
  for (const auto& [note, v] : counters(admin, udp))
    more.emplace_back(note, v - (c0.contains(note) ? c0.at(note) : 0));

  const double secs = st.seconds > 0 ? st.seconds : 1;
  const double bytes = static_cast<double>(st.bytes_sent + st.bytes_received);
  Row row = {{"row", def.name},
             {"target", def.target},
             {"transport", def.transport},
             {"batch", def.batch},
             {"load", from_schedule ? "half" : "max"},
             {"in_flight", l.in_flight}};
  row.update(bench::row_figures(st, cores));
  row["requests_per_sec"] = static_cast<double>(st.units) / secs;
  row["bytes_per_sec"] = bytes / secs;
  row["bytes_per_check"] = st.checks > 0 ? bytes / static_cast<double>(st.checks) : 0;
  if (rate > 0) row["offered_checks_per_sec"] = rate;
  row["notes"] = bench::row_notes(st, more);
  Row& added = out.add(std::move(row));
  if (rate > 0) {
    // The whole latency histogram, not in the text line: [bucket midpoint in us, checks] for
    // every non-empty bucket (log-linear buckets, within 0.8 % of the value).
    Row hist = Row::array();
    st.latency.for_each_bucket([&](uint64_t ns, uint64_t n) {
      hist.push_back({static_cast<double>(ns) / 1000.0, n});
    });
    added["histogram_us"] = std::move(hist);
  }
  return added;
}

// Lets every thread of sluiced run only on `server` and this thread (so the generator's threads,
// which it starts) only on `generator`; empty: anywhere.
std::string pin(pid_t sluiced, const std::vector<int>& server, const std::vector<int>& generator) {
  if (std::string e = bench::pin_process(sluiced, server); !e.empty()) return "sluiced: " + e;
  if (std::string e = bench::pin_this_thread(generator); !e.empty()) return "generator: " + e;
  return "";
}

// The latency curves (see the file comment), one row per point; a point that fails is named on
// stderr and left out (and a door whose max failed gets no open-loop points).
void run_curves(const Options& o, Servers& s, const bench::Keyspace& keys, bench::Rows& out) {
  const pid_t pid = s.sluiced.process.pid();
  const std::vector<int> any_server = bench::cpus_allowed(pid), any_gen = bench::cpus_allowed(0);
  std::vector<uint64_t> points = {100};  // the max, then the open-loop points
  points.insert(points.end(), o.curve_loads.begin(), o.curve_loads.end());
  for (const std::string& door : o.doors) {
    const Load l = load_of(o, kDoors.at(door), 1, s, keys);
    for (bool pinned : o.pinnings) {
      double max = 0;
      for (const uint64_t pct : points) {
        const bool is_max = pct == 100;
        const std::string name = "curve-" + door + (pinned ? "-pinned-" : "-unpinned-") +
                                 (is_max ? "max" : std::to_string(pct));
        if (bench::stop_requested() || (!is_max && max <= 0)) break;
        std::string err = pinned && o.server_cpu == o.generator_cpu
                              ? "--server-cpu and --generator-cpu are the same CPU"
                              : pin(pid, pinned ? std::vector{o.server_cpu} : any_server,
                                    pinned ? std::vector{o.generator_cpu} : any_gen);
        bench::DriveOptions d = l.drive;
        d.rate = is_max ? 0 : max * static_cast<double>(pct) / 100.0;
        d.latency_from_schedule = !is_max;
        bench::Cores cores;
        bench::RowStats st;
        try {
          if (err.empty()) st = bench::drive(d, l.factory, pid, cores);
        } catch (const std::exception& e) {
          err = e.what();
        }
        if (!err.empty()) {
          std::fprintf(stderr, "sluice-bench-load: %s failed: %s\n", name.c_str(), err.c_str());
          break;
        }
        Row row = {{"row", name},
                   {"target", door},
                   {"phase", is_max ? "max" : "curve"},
                   {"load_pct", pct},
                   {"pinned", pinned},
                   {"offered_per_sec", d.rate},
                   {"latency_from", is_max ? "send" : "schedule"},
                   {"in_flight", l.in_flight}};
        row.update(bench::row_figures(st, cores));
        row["send_lag_p99_us"] = static_cast<double>(st.send_lag.quantile_ns(0.99)) / 1000.0;
        if (is_max) max = row["checks_per_sec"].get<double>();
        out.add(std::move(row));
      }
    }
  }
  pin(pid, any_server, any_gen);  // best effort: sluiced may be gone
}

int run(const Options& o, bool json) {
  std::vector<RowDef> rows;
  for (const RowDef& r : all_rows(o)) {
    // --curve alone runs the curves only; rows named with --only run beside them.
    if (selected(o, r.name) && !(o.curve && o.only.empty())) rows.push_back(r);
  }
  if (rows.empty() && !o.half_rate && !o.curve) {
    std::fprintf(stderr, "sluice-bench-load: --only selects no row (see --list)\n");
    return 2;
  }
  bool need[kServers] = {}, resp = false;
  need[kSluiced] = o.half_rate || o.curve;
  for (const RowDef& r : rows) {
    need[r.server] = true;
    resp |= r.kind == Kind::kSluiceResp;
  }
  bench::print_run_header("sluice-bench-load", o.drive,
                          "sluiced --threads " + std::to_string(o.server_threads));
  bench::Rows out(json);
  Servers s;
  start_servers(o, need, resp, s);
  const bench::Keyspace keys(o.drive.keys);
  auto row = [&](const RowDef& def, double rate, bool from_schedule) -> double {
    try {
      return run_row(o, def, s, keys, rate, from_schedule, out)["checks_per_sec"].get<double>();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "sluice-bench-load: %s failed: %s\n", def.name.c_str(), e.what());
      return 0;
    }
  };
  for (const RowDef& def : rows) {
    if (bench::stop_requested()) break;
    row(def, o.drive.rate, false);
  }
  if (o.half_rate && !bench::stop_requested()) {
    double max = 0;
    for (const Row& r : out.all())
      if (r["row"] == "sluiced-udp-single") max = r["checks_per_sec"].get<double>();
    RowDef def = all_rows(o)[0];
    if (max <= 0) max = row(def, 0, false);
    def.name += "@half";
    if (max > 0) row(def, max / 2, true);
  }
  if (o.curve && !bench::stop_requested()) run_curves(o, s, keys, out);
  bench::stop_server(s.sluiced.process, "sluice-bench-load", "sluiced");
  return bench::finish_run(out, "sluice-bench-load");
}

}  // namespace

int bench_load_main(int argc, char** argv) {
  // The echo servers are this program run again (see start_servers).
  if (argc == 5 && std::string_view(argv[1]) == "--echo-server") {
    const unsigned long port = std::strtoul(argv[3], nullptr, 10);
    const unsigned long threads = std::strtoul(argv[4], nullptr, 10);
    if (port == 0 || port > 65535 || threads == 0 || threads > 64) {
      std::fprintf(stderr, "usage: sluice-bench-load --echo-server udp|tcp PORT THREADS\n");
      return 2;
    }
    return bench::run_echo_server(argv[2], static_cast<uint16_t>(port),
                                  static_cast<unsigned>(threads));
  }
  Options o;
  bench::Cli cli("sluice-bench-load");
  if (const std::optional<int> exit = parse(cli, argc, argv, o)) return *exit;
  if (o.list) {
    for (const RowDef& r : all_rows(o))
      std::printf("%s\n", r.name.c_str());
    return 0;
  }
  return bench::run_stoppable("sluice-bench-load", [&] { return run(o, cli.json); });
}
