// sluice-bench-load: checks per second and latency of sluiced over loopback UDP and TCP, against
// common rate limiter designs run for real on the same machine in the same run:
//   Redis + the Lua sliding log (a sorted set per key), Redis + Figma's hash of minute counters,
//   memcached + the memcached sliding window's two counters, and plain Redis INCR as the floor of
//   any Redis design.
//
// One run: starts sluiced, redis-server and memcached on free loopback ports (only those the
// selected rows need), waits until each answers (bounded), drives the rows one after another with
// the same generator settings, prints one table, the ratios and the issue's targets, and stops
// every server (also on error or SIGINT/SIGTERM; children die with the benchmark even on kill -9).
//
// Rows and what is in flight (defaults; the table prints it per row):
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
// UDP keeps fewer datagrams in flight than TCP keeps frames: each one is a separate buffer in the
// server's socket (default receive buffer), and more only queue there (measured: 64 and 256 in
// flight give the same checks/s, 4x the latency). Before each Redis row: FLUSHALL (the script
// stays loaded); before the hash row, each key gets the 60 earlier minutes' fields (the steady
// state of an hourly window, so HGETALL returns 61 fields); before the memcached row: flush_all,
// then each key's previous-minute bucket. The Lua sliding log is not preloaded (a steady state
// holds every request of the last minute per key: too much to write), so its sorted sets stay
// small during a row, which flatters that baseline.
//
// --curve: each door of the one sluiced (UDP, TCP, HTTP, gRPC, RESP) at its max and at 10-75 % of
// it, open loop, pinned and unpinned (load_curve.h); instead of the rows unless --only names some.
//
// Generator: load/driver.h (epoll, a window of requests in flight per connection, closed loop or
// fixed offered rate). Protocol clients: load/targets.h (the check protocol of lib/wire, RESP and
// memcached text, written here over plain sockets). Run with --help for the options.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
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
#include "load_curve.h"

namespace {

namespace bench = sluice::bench;

// Far above any key's traffic in a row, so every check is allowed and counted everywhere: the
// figures are the cost of the counting path.
constexpr uint64_t kLimit = 1'000'000'000;

struct Options {
  bool json = false;
  bool half_rate = false;
  bool list = false;
  std::vector<std::string> only;
  double seconds = 5;
  double warmup = 0.5;
  uint32_t keys = 10'000;
  bool zipf = false;
  double rate = 0;
  uint32_t connections = 16;
  uint32_t depth = 32;       // sluiced TCP single checks: frames in flight per connection
  uint32_t batch_depth = 1;  // batch rows (sluiced TCP, Redis pipelined): groups per connection
  uint32_t batch = 32;
  uint32_t udp_sockets = 8;
  uint32_t udp_window = 8;
  uint32_t udp_batch_window = 2;
  uint32_t udp_room = 288;   // libsluice's default udp_answer_room_per_check
  uint32_t http_window = 1;  // HTTP rows: requests in flight per connection (pipelined if > 1)
  uint32_t gen_threads = 1;
  // The generator takes one core; Redis serves on one thread. Giving sluiced the one core left
  // keeps three busy threads off two cores (measured: 2 threads on this 2-core machine cost
  // scheduler time slices, p99.9 ~4 ms).
  uint32_t server_threads = 1;
  uint32_t busy_poll_us = 0;  // sluiced's udp_busy_poll_us (docs/operations.md)
  std::string sluiced;
  // --curve: every door's latency curve (load_curve.h); the rows run too only with --only.
  bool curve = false;
  bench::CurveOptions curve_opt;
  uint32_t grpc_connections = 4;
  uint32_t grpc_window = 32;
};

enum class Server { kSluiced, kRedis, kMemcached, kEchoUdp, kEchoTcp, kNginx };

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
};

// The Redis-protocol rows' pipeline: commands written at once per connection (redis-benchmark -P).
constexpr uint32_t kRespPipeline = 16;
// Their limiter (CL.THROTTLE's max_burst, count_per_period, period): every check allowed, as in
// the other rows, with an emission interval of 60 us (redis-cell's remaining is computed in
// whole microseconds).
constexpr int64_t kGcraBurst = 1'000'000, kGcraCount = 1'000'000, kGcraPeriodS = 60;

struct RowDef {
  std::string name;       // for --only
  std::string target;     // table and JSON
  std::string transport;  // "udp" | "tcp"
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
      {"sluiced-udp-single", "sluiced", "udp", Kind::kSluiceUdp, 1, Server::kSluiced},
      {"sluiced-udp-batch" + bs, "sluiced", "udp", Kind::kSluiceUdp, b, Server::kSluiced},
      {"sluiced-tcp-single", "sluiced", "tcp", Kind::kSluiceTcp, 1, Server::kSluiced},
      {"sluiced-tcp-batch" + bs, "sluiced", "tcp", Kind::kSluiceTcp, b, Server::kSluiced},
      {"sluiced-http-single", "sluiced", "http", Kind::kSluiceHttp, 1, Server::kSluiced},
      {"nginx-limitreq-single", "nginx-limit-req", "http", Kind::kNginxLimitReq, 1, Server::kNginx},
      {"udp-echo-single", "udp-echo", "udp", Kind::kEchoUdp, 1, Server::kEchoUdp},
      {"udp-echo-batch" + bs, "udp-echo", "udp", Kind::kEchoUdp, b, Server::kEchoUdp},
      {"tcp-echo-single", "tcp-echo", "tcp", Kind::kEchoTcp, 1, Server::kEchoTcp},
      {"tcp-echo-batch" + bs, "tcp-echo", "tcp", Kind::kEchoTcp, b, Server::kEchoTcp},
      {"redis-lua-single", "redis-lua", "tcp", Kind::kRedisLua, 1, Server::kRedis},
      {"redis-lua-pipe" + bs, "redis-lua", "tcp", Kind::kRedisLua, b, Server::kRedis},
      {"redis-hash-single", "redis-hash", "tcp", Kind::kRedisHash, 1, Server::kRedis},
      {"redis-hash-pipe" + bs, "redis-hash", "tcp", Kind::kRedisHash, b, Server::kRedis},
      {"memcached-single", "memcached", "tcp", Kind::kMemcached, 1, Server::kMemcached},
      {"redis-incr-single", "redis-incr", "tcp", Kind::kRedisIncr, 1, Server::kRedis},
      {"redis-incr-pipe" + bs, "redis-incr", "tcp", Kind::kRedisIncr, b, Server::kRedis},
      {"sluiced-resp-single", "sluiced", "resp", Kind::kSluiceResp, 1, Server::kSluiced},
      {"sluiced-resp-pipe" + ps, "sluiced", "resp", Kind::kSluiceResp, p, Server::kSluiced},
      {"redis-lua-gcra-single", "redis-lua-gcra", "tcp", Kind::kRedisLuaGcra, 1, Server::kRedis},
  };
  // With --batch 16 the batch rows already hold redis-incr-pipe16.
  if (b != p)
    rows.push_back(
        {"redis-incr-pipe" + ps, "redis-incr", "tcp", Kind::kRedisIncr, p, Server::kRedis});
  return rows;
}

bool selected(const Options& o, const std::string& name) {
  if (o.only.empty()) return true;
  for (const std::string& n : o.only) {
    if (name == n || (name.size() > n.size() && name.starts_with(n) && name[n.size()] == '-')) {
      return true;
    }
  }
  return false;
}

// A comma-separated list, empty parts dropped.
std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string n; std::getline(ss, n, ',');) {
    if (!n.empty()) out.push_back(n);
  }
  return out;
}

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse(int argc, char** argv, Options& o) {
  bench::Cli cli("sluice-bench-load");
  cli.app().footer(
      R"(--json: last line {"rows":[{"row":..,"target":..,"transport":..,"batch":..,
  "load":"max"|"half","checks_per_sec":..,"requests_per_sec":..,"bytes_per_sec":..,
  "bytes_per_check":..,"server_cpu_us_per_check":..,"p50_us":..,"p99_us":..,"p999_us":..,
  "max_us":..}]}; open-loop rows add "offered_checks_per_sec" and "histogram_us" ([us, checks]
  pairs). --curve rows: {"row":"curve-<door>-<pinned|unpinned>-<max|pct>","target":"<door>",
  "phase":"max"|"curve","load_pct":100|10|..,"pinned":..,"checks_per_sec":..,
  "offered_per_sec":..,"p50_us":..,"p99_us":..,"p999_us":..,"server_cpu_us_per_check":..,
  "errors":..,"lost":..,"unsent":..}; each point takes --warmup + --seconds.)");
  std::string dist = "uniform", doors, loads, pinning = "both";
  cli.app()
      .add_option("--only", o.only,
                  "NAME[,NAME]: rows to run: a row name (--list) or a prefix of one ending at '-' "
                  "(sluiced, sluiced-udp, redis, redis-lua, ...); default: every row")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cli.flag("--list", o.list, "print the row names and exit");
  cli.flag("--half-rate", o.half_rate,
           "also measure sluiced-udp-single at its max rate, then at half that rate (open loop) "
           "for the p99 target");
  cli.seconds(o.seconds, 0.1, 600, "measured seconds per row");
  cli.number("--warmup", o.warmup, 0, 60, "unmeasured seconds before each row");
  cli.keys(o.keys, 1, 10'000'000, "keyspace, the same for every target");
  cli.word("--dist", dist, {"uniform", "zipf"}, "key popularity (zipf: s = 0.99)");
  cli.number("--rate", o.rate, 0, 1e9,
             "offered checks/s, open loop, for every row; 0 = closed loop");
  cli.number("--connections", o.connections, 1, 1024, "TCP connections per row");
  cli.number("--depth", o.depth, 1, 4096,
             "sluiced TCP single checks: frames in flight per connection");
  cli.number("--batch", o.batch, 2, 1024,
             "checks per datagram / frame / pipelined group in batch rows");
  cli.number("--batch-depth", o.batch_depth, 1, 1024,
             "batch rows over TCP: frames / groups in flight per connection");
  cli.number("--udp-sockets", o.udp_sockets, 1, 1024, "UDP sockets");
  cli.number("--udp-window", o.udp_window, 1, 4096,
             "UDP single checks: datagrams in flight per socket");
  cli.number("--udp-batch-window", o.udp_batch_window, 1, 4096,
             "UDP batches: datagrams in flight per socket");
  cli.number("--udp-room", o.udp_room, 0, 2048,
             "UDP padding per check, as libsluice's udp_answer_room_per_check");
  cli.number("--http-window", o.http_window, 1, 1024,
             "HTTP rows: requests in flight per connection, pipelined when > 1");
  cli.number("--gen-threads", o.gen_threads, 1, 2,
             "generator threads (1: the machine has 2 cores for generator and server)");
  cli.server_threads(o.server_threads);
  cli.number("--busy-poll-us", o.busy_poll_us, 0, 10'000,
             "sluiced's udp_busy_poll_us: spin reading UDP this long after answering");
  cli.sluiced(o.sluiced);
  cli.flag("--curve", o.curve,
           "latency curves (load_curve.h): for each door its max (closed loop), then open loop "
           "at 10, 25, 50 and 75 % of it, pinned and unpinned; instead of the rows, unless "
           "--only names rows too");
  cli.text("--doors", doors,
           "D[,D]: doors of the curve: udp, tcp, http, grpc, redis (default: every door this "
           "build can drive)");
  cli.text("--curve-loads", loads,
           "P[,P]: open-loop points, percent of the door's max (10,25,50,75)");
  cli.word("--pinning", pinning, {"both", "pinned", "unpinned"}, "which sets of points");
  cli.number("--server-cpu", o.curve_opt.server_cpu, 0, CPU_SETSIZE - 1,
             "pinned: the CPU of every sluiced thread");
  cli.number("--generator-cpu", o.curve_opt.generator_cpu, 0, CPU_SETSIZE - 1,
             "pinned: the CPU of the generator's threads");
  cli.number("--grpc-connections", o.grpc_connections, 1, 1024, "gRPC door: HTTP/2 connections");
  cli.number("--grpc-window", o.grpc_window, 1, 4096, "gRPC door: calls in flight per connection");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return exit;
  o.json = cli.json;
  std::erase(o.only, std::string());
  o.zipf = dist == "zipf";
  if (pinning != "both") o.curve_opt.pinnings = {pinning == "pinned"};
  for (const std::string& n : split_commas(doors)) {
    const std::optional<bench::Door> d = bench::door_from_name(n);
    if (!d) return cli.fail("--doors: no door '" + n + "' (udp, tcp, http, grpc, redis)");
    o.curve_opt.doors.push_back(*d);
  }
  if (!loads.empty()) o.curve_opt.load_pct.clear();
  for (const std::string& n : split_commas(loads)) {
    const int pct = std::atoi(n.c_str());
    if (pct < 1 || pct > 99) return cli.fail("--curve-loads: percents from 1 to 99");
    o.curve_opt.load_pct.push_back(pct);
  }
  if (o.curve_opt.doors.empty()) {
    // Every door this build can drive.
    for (bench::Door d : {bench::Door::kUdp, bench::Door::kTcp, bench::Door::kHttp,
                          bench::Door::kGrpc, bench::Door::kRedis}) {
      std::string why;
      if (bench::door_available(d, why)) o.curve_opt.doors.push_back(d);
    }
  }
  for (bench::Door d : o.curve_opt.doors) {
    std::string why;
    if (o.curve && !bench::door_available(d, why)) return cli.fail("--doors: " + why);
  }
  // The curve drives each door as the rows of the same transport do.
  bench::CurveOptions& c = o.curve_opt;
  c.seconds = o.seconds;
  c.warmup = o.warmup;
  c.keys = o.keys;
  c.zipf = o.zipf;
  c.gen_threads = o.gen_threads;
  c.udp_sockets = o.udp_sockets;
  c.udp_window = o.udp_window;
  c.udp_room = o.udp_room;
  c.tcp_connections = o.connections;
  c.tcp_window = o.depth;
  c.http_connections = o.connections;
  c.http_window = o.http_window;
  c.grpc_connections = o.grpc_connections;
  c.grpc_window = o.grpc_window;
  c.resp_connections = o.connections;
  c.resp_burst = kGcraBurst;
  c.resp_count = kGcraCount;
  c.resp_period_s = kGcraPeriodS;
  return std::nullopt;
}

bool curve_has(const Options& o, bench::Door d) {
  return o.curve && std::find(o.curve_opt.doors.begin(), o.curve_opt.doors.end(), d) !=
                        o.curve_opt.doors.end();
}

// ---- servers ----------------------------------------------------------------------------------

struct Servers {
  bench::TempDir dir;
  bench::ChildProcess sluiced, redis, memcached, echo_udp, echo_tcp, nginx;
  uint16_t sluice_port = 0, admin_port = 0, redis_port = 0, memcached_port = 0;
  uint16_t echo_udp_port = 0, echo_tcp_port = 0, nginx_port = 0;
  uint16_t grpc_port = 0;  // 0: sluiced's gRPC door is closed (only the curve opens it)
  uint16_t resp_port = 0;  // 0: sluiced's Redis-protocol door is closed
  std::string lua_sha;
  std::string gcra_sha;  // SCRIPT LOAD of kGcraScript
  std::string redis_version, memcached_version;
};

using bench::wait_ready;

// The echo servers: this program again (sluice-bench load --echo-server), with sluiced's
// thread count.
void start_echo(const Options& o, const std::string& transport, bench::ChildProcess& child,
                uint16_t& port, const std::string& dir) {
  port = bench::free_loopback_port();
  const std::string err = child.start({bench::self_exe_path(), "load", "--echo-server", transport,
                                       std::to_string(port), std::to_string(o.server_threads)},
                                      dir + "/echo-" + transport + ".log");
  if (!err.empty()) throw std::runtime_error(transport + " echo: " + err);
  // Ready once a request comes back (bounded by wait_ready's timeout).
  wait_ready(
      child, [&] { return bench::echo_probe(transport, port, 500); }, 15'000);
}

void start_servers(const Options& o, bool need_sluiced, bool need_resp, bool need_redis,
                   bool need_memcached, bool need_echo_udp, bool need_echo_tcp, bool need_nginx,
                   Servers& s) {
  constexpr int kReadyMs = 15'000;
  if (need_nginx) {
    const std::string dir = s.dir.path + "/nginx";
    std::filesystem::create_directories(dir);
    s.nginx_port = bench::free_loopback_port();
    std::string err;
    const std::vector<std::string> argv = bench::nginx_limit_req_argv(dir, s.nginx_port, err);
    if (argv.empty()) throw std::runtime_error("nginx: " + err);
    err = s.nginx.start(argv, dir + "/stdout.log");
    if (!err.empty()) throw std::runtime_error("nginx: " + err);
    wait_ready(
        s.nginx, [&] { return bench::nginx_probe(s.nginx_port, 500); }, kReadyMs);
  }
  if (need_echo_udp) start_echo(o, "udp", s.echo_udp, s.echo_udp_port, s.dir.path);
  if (need_echo_tcp) start_echo(o, "tcp", s.echo_tcp, s.echo_tcp_port, s.dir.path);
  if (need_sluiced) {
    const std::string exe = o.sluiced.empty() ? bench::sibling_sluiced() : o.sluiced;
    if (exe.empty() || ::access(exe.c_str(), X_OK) != 0) {
      throw std::runtime_error("no sluiced at '" + exe + "' (build target sluiced, or --sluiced)");
    }
    const std::string rules = s.dir.path + "/rules.yaml";
    std::ofstream(rules) << "# written by sluice-bench-load\n"
                            "domains:\n"
                            "  - name: bench\n"
                            "    rules:\n"
                            "      - name: per-k\n"
                            "        key: [k]\n"
                            "        limits: ["
                         << kLimit << "/1m]\n";
    s.sluice_port = bench::free_loopback_port();
    s.admin_port = bench::free_loopback_port();
    if (curve_has(o, bench::Door::kGrpc)) s.grpc_port = bench::free_loopback_port();
    const std::string grpc = s.grpc_port == 0 ? "" : "127.0.0.1:" + std::to_string(s.grpc_port);
    if (need_resp || curve_has(o, bench::Door::kRedis)) s.resp_port = bench::free_loopback_port();
    const std::string resp = s.resp_port == 0 ? "" : "127.0.0.1:" + std::to_string(s.resp_port);
    const std::string udp = "127.0.0.1:" + std::to_string(s.sluice_port);
    const std::string config = s.dir.path + "/sluiced.yaml";
    std::ofstream(config) << "# written by sluice-bench-load\ninit_data: true\nudp_busy_poll_us: "
                          << o.busy_poll_us << "\n";
    const std::string err = s.sluiced.start({exe,
                                             "--config",
                                             config,
                                             "--udp",
                                             udp,
                                             "--tcp",
                                             udp,
                                             "--admin",
                                             "127.0.0.1:" + std::to_string(s.admin_port),
                                             "--grpc",
                                             grpc,
                                             "--resp",
                                             resp,
                                             "--rules",
                                             rules,
                                             "--threads",
                                             std::to_string(o.server_threads),
                                             "--log-level",
                                             "warn",
                                             "--data-dir",
                                             s.dir.path + "/sluiced-data"},
                                            s.dir.path + "/sluiced.log");
    if (!err.empty()) throw std::runtime_error("sluiced: " + err);
  }
  if (need_redis) {
    s.redis_port = bench::free_loopback_port();
    const std::string err = s.redis.start(
        {"redis-server", "--port", std::to_string(s.redis_port), "--bind", "127.0.0.1", "--save",
         "", "--appendonly", "no", "--daemonize", "no", "--dir", s.dir.path},
        s.dir.path + "/redis.log");
    if (!err.empty()) throw std::runtime_error("redis-server: " + err);
  }
  if (need_memcached) {
    s.memcached_port = bench::free_loopback_port();
    // memcached refuses to run as root; as root the benchmark starts it as "nobody" itself
    // rather than with -u (see ChildProcess::start: the death signal must survive).
    const std::string err =
        s.memcached.start({"memcached", "-l", "127.0.0.1", "-p", std::to_string(s.memcached_port),
                           "-U", "0", "-t", "2"},
                          s.dir.path + "/memcached.log", "nobody");
    if (!err.empty()) throw std::runtime_error("memcached: " + err);
  }
  if (need_sluiced) {
    wait_ready(
        s.sluiced, [&] { return bench::sluice_probe(s.sluice_port, 500); }, kReadyMs);
    if (s.grpc_port != 0) {
      wait_ready(
          s.sluiced, [&] { return bench::grpc_probe(s.grpc_port, 500); }, kReadyMs);
    }
    if (s.resp_port != 0) {
      wait_ready(
          s.sluiced, [&] { return bench::redis_probe(s.resp_port, 500); }, kReadyMs);
    }
  }
  if (need_redis) {
    wait_ready(
        s.redis, [&] { return bench::redis_probe(s.redis_port, 500); }, kReadyMs);
    std::string reply;
    if (std::string e = bench::redis_command(
            s.redis_port, {"SCRIPT", "LOAD", bench::kLuaSlidingLogScript}, reply);
        !e.empty() || reply.size() != 41) {
      throw std::runtime_error("redis SCRIPT LOAD: " + (e.empty() ? reply : e));
    }
    s.lua_sha = reply.substr(1);
    if (std::string e =
            bench::redis_command(s.redis_port, {"SCRIPT", "LOAD", bench::kGcraScript}, reply);
        !e.empty() || reply.size() != 41) {
      throw std::runtime_error("redis SCRIPT LOAD (GCRA): " + (e.empty() ? reply : e));
    }
    s.gcra_sha = reply.substr(1);
    if (bench::redis_command(s.redis_port, {"INFO", "server"}, reply).empty()) {
      const size_t p = reply.find("redis_version:");
      if (p != std::string::npos) {
        s.redis_version = reply.substr(p + 14, reply.find_first_of("\r\n", p) - p - 14);
      }
    }
  }
  if (need_memcached) {
    wait_ready(
        s.memcached,
        [&] { return bench::memcached_probe(s.memcached_port, 500, &s.memcached_version); },
        kReadyMs);
  }
}

std::string fmt_num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// ---- sluiced and kernel counters around a row ---------------------------------------------------

using Counters = std::map<std::string, double>;

// The sluiced metrics this report cares about (sum over label sets where there are several).
Counters sluiced_metrics(uint16_t admin_port) {
  Counters c;
  std::string body;
  if (!bench::http_get(admin_port, "/metrics", body).empty()) return c;
  const auto samples = bench::parse_metrics(body);
  for (const char* keep :
       {"sluice_dropped_datagrams_total", "sluice_rejected_requests_total",
        "sluice_bad_frames_total", "sluice_rejected_checks_total", "sluice_no_room_total",
        "sluice_checks_total", "sluice_requests_total{transport=\"udp\"}",
        "sluice_requests_total{transport=\"tcp\"}", "sluice_evictions_total"}) {
    const std::string_view k = keep;
    const size_t brace = k.find('{');
    const double v = brace == std::string_view::npos
                         ? bench::metric_sum(samples, k)
                         : bench::metric_sum(samples, k.substr(0, brace),
                                             k.substr(brace + 1, k.size() - brace - 2));
    if (v >= 0) c[keep] = v;
  }
  return c;
}

// Kernel-wide UDP counters from /proc/net/snmp (receive-buffer overflows drop datagrams).
Counters udp_snmp() {
  Counters c;
  std::ifstream in("/proc/net/snmp");
  std::string names, values;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("Udp: ")) continue;
    if (names.empty()) {
      names = line;
    } else {
      values = line;
      break;
    }
  }
  std::istringstream n(names), v(values);
  std::string key, val;
  n >> key;
  v >> val;
  while (n >> key && v >> val)
    c[key] = std::strtod(val.c_str(), nullptr);
  return c;
}

double delta(const Counters& before, const Counters& after, const std::string& k) {
  const auto a = after.find(k);
  const auto b = before.find(k);
  return (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
}

// ---- rows -------------------------------------------------------------------------------------

struct RowResult {
  RowDef def;
  std::string inflight;  // "16 conn x 32 frames" ...
  double offered_rate = 0;
  bench::RowStats stats;
  std::string notes;
  std::string error;         // the row could not run
  double gen_cores = 0;      // CPU used by the generator over the row, in cores
  double server_cores = 0;   // CPU used by the server under test over the row, in cores
  double other_cores = 0;    // CPU used by everything else on the machine (other work, kernel)
  std::string load = "max";  // "max" (closed loop) or "half" (open loop at half the max)
  double checks_per_sec() const {
    return stats.seconds > 0 ? static_cast<double>(stats.checks) / stats.seconds : 0;
  }
  // Requests (datagrams, frames, command groups) answered per second.
  double units_per_sec() const {
    return stats.seconds > 0 ? static_cast<double>(stats.units) / stats.seconds : 0;
  }
  // Payload bytes per second, both ways (requests and answers).
  double bytes_per_sec() const {
    return stats.seconds > 0
               ? static_cast<double>(stats.bytes_sent + stats.bytes_received) / stats.seconds
               : 0;
  }
  double bytes_per_check() const {
    return stats.checks > 0 ? static_cast<double>(stats.bytes_sent + stats.bytes_received) /
                                  static_cast<double>(stats.checks)
                            : 0;
  }
  // The server's CPU per check, in microseconds (its cores over the row / checks per second).
  double server_cpu_us_per_check() const {
    const double cps = checks_per_sec();
    return cps > 0 ? server_cores / cps * 1e6 : 0;
  }
  double us(double q) const { return static_cast<double>(stats.latency.quantile_ns(q)) / 1000.0; }
  // UDP: send -> the answer's arrival at the generator's socket (kernel timestamp).
  double arrival_us(double q) const {
    return static_cast<double>(stats.arrival.quantile_ns(q)) / 1000.0;
  }
};

RowResult run_row(const Options& o, const RowDef& def, Servers& s, const bench::Keyspace& keys,
                  double rate, bool from_schedule = false) {
  RowResult r;
  r.def = def;
  r.offered_rate = rate;
  bench::DriveOptions d;
  d.latency_from_schedule = from_schedule;
  d.threads = o.gen_threads;
  d.batch = def.batch;
  d.rate = rate;
  d.warmup_s = o.warmup;
  d.seconds = o.seconds;
  d.keys = o.keys;
  d.zipf = o.zipf;
  bench::ConnFactory factory;
  std::string bs = std::to_string(def.batch);

  switch (def.kind) {
    case Kind::kEchoUdp:
    case Kind::kSluiceUdp: {
      bench::SluiceConnOptions so;
      so.echo = def.kind == Kind::kEchoUdp;
      so.port = so.echo ? s.echo_udp_port : s.sluice_port;
      so.batch = def.batch;
      so.window = def.batch == 1 ? o.udp_window : o.udp_batch_window;
      so.udp_room_per_check = o.udp_room;
      so.keys = &keys;
      d.conns = o.udp_sockets;
      r.inflight =
          std::to_string(d.conns) + " sock x " + std::to_string(so.window) + " dgram of " + bs;
      factory = [so](bench::ThreadContext& ctx) { return bench::make_sluice_udp(so, ctx); };
      break;
    }
    case Kind::kEchoTcp:
    case Kind::kSluiceTcp: {
      bench::SluiceConnOptions so;
      so.echo = def.kind == Kind::kEchoTcp;
      so.port = so.echo ? s.echo_tcp_port : s.sluice_port;
      so.batch = def.batch;
      // Single checks: many frames in flight per connection. Batches: as many frames of `batch`
      // checks per connection as Redis pipelined by `batch` has groups (--batch-depth).
      so.window = def.batch == 1 ? o.depth : o.batch_depth;
      so.keys = &keys;
      d.conns = o.connections;
      r.inflight =
          std::to_string(d.conns) + " conn x " + std::to_string(so.window) + " frame of " + bs;
      factory = [so](bench::ThreadContext& ctx) { return bench::make_sluice_tcp(so, ctx); };
      break;
    }
    case Kind::kSluiceResp:
    case Kind::kRedisLuaGcra:
    case Kind::kRedisLua:
    case Kind::kRedisHash:
    case Kind::kRedisIncr: {
      const bool door = def.kind == Kind::kSluiceResp;
      std::string reply;
      if (door) {
        if (s.resp_port == 0) throw std::runtime_error("sluiced's Redis-protocol door is closed");
      } else if (std::string e = bench::redis_command(s.redis_port, {"FLUSHALL"}, reply);
                 !e.empty()) {
        throw std::runtime_error("redis FLUSHALL: " + e);
      }
      if (def.kind == Kind::kRedisHash) {
        if (std::string e = bench::redis_preload_minutes(s.redis_port, keys, bench::epoch_ms());
            !e.empty()) {
          throw std::runtime_error("redis preload: " + e);
        }
      }
      bench::RedisConnOptions ro;
      ro.port = door ? s.resp_port : s.redis_port;
      ro.batch = def.batch;
      // Unpipelined: one command (group) at a time; pipelined: --batch-depth groups of `batch`.
      ro.window = def.batch == 1 ? 1 : o.batch_depth;
      ro.scheme = door                              ? bench::RedisScheme::kClThrottle
                  : def.kind == Kind::kRedisLuaGcra ? bench::RedisScheme::kLuaGcra
                  : def.kind == Kind::kRedisLua     ? bench::RedisScheme::kLuaLog
                  : def.kind == Kind::kRedisHash    ? bench::RedisScheme::kHashMinutes
                                                    : bench::RedisScheme::kIncr;
      ro.lua_sha = def.kind == Kind::kRedisLuaGcra ? s.gcra_sha : s.lua_sha;
      ro.limit = kLimit;
      ro.gcra_burst = kGcraBurst;
      ro.gcra_count = kGcraCount;
      ro.gcra_period_s = kGcraPeriodS;
      ro.keys = &keys;
      d.conns = o.connections;
      r.inflight = std::to_string(d.conns) + " conn x " + std::to_string(ro.window) + " group of " +
                   bs + " check" + (def.batch == 1 ? "" : "s");
      if (def.kind == Kind::kRedisHash) r.inflight += " (3 cmd each)";
      factory = [ro](bench::ThreadContext& ctx) { return bench::make_redis(ro, ctx); };
      break;
    }
    case Kind::kSluiceHttp:
    case Kind::kNginxLimitReq: {
      bench::HttpConnOptions ho;
      const bool nginx = def.kind == Kind::kNginxLimitReq;
      ho.port = nginx ? s.nginx_port : s.admin_port;
      ho.scheme = nginx ? bench::HttpScheme::kNginxLimitReq : bench::HttpScheme::kSluiceCheck;
      ho.window = o.http_window;
      ho.keys = &keys;
      d.conns = o.connections;
      r.inflight = std::to_string(d.conns) + " conn x " + std::to_string(ho.window) + " request";
      factory = [ho](bench::ThreadContext& ctx) { return bench::make_http(ho, ctx); };
      break;
    }
    case Kind::kMemcached: {
      if (std::string e = bench::memcached_flush_all(s.memcached_port); !e.empty()) {
        throw std::runtime_error("memcached flush_all: " + e);
      }
      if (std::string e =
              bench::memcached_preload_previous(s.memcached_port, keys, bench::epoch_ms());
          !e.empty()) {
        throw std::runtime_error("memcached preload: " + e);
      }
      bench::MemcachedConnOptions mo;
      mo.port = s.memcached_port;
      mo.limit = kLimit;
      mo.keys = &keys;
      d.conns = o.connections;
      r.inflight = std::to_string(d.conns) + " conn x 1 check (2 round trips)";
      factory = [mo](bench::ThreadContext& ctx) { return bench::make_memcached(mo, ctx); };
      break;
    }
  }

  const bool sluiced = def.server == Server::kSluiced;
  const Counters m0 = sluiced ? sluiced_metrics(s.admin_port) : Counters{};
  const pid_t server_pid = def.server == Server::kSluiced   ? s.sluiced.pid()
                           : def.server == Server::kRedis   ? s.redis.pid()
                           : def.server == Server::kEchoUdp ? s.echo_udp.pid()
                           : def.server == Server::kEchoTcp ? s.echo_tcp.pid()
                           : def.server == Server::kNginx   ? s.nginx.pid()
                                                            : s.memcached.pid();
  const Counters k0 = udp_snmp();
  const double g0 = bench::self_cpu_seconds(), c0 = bench::process_cpu_seconds(server_pid),
               m0b = bench::machine_busy_seconds();
  const int64_t w0 = bench::now_ns();
  r.stats = bench::drive(d, factory);
  const double wall = static_cast<double>(bench::now_ns() - w0) * 1e-9;
  r.gen_cores = (bench::self_cpu_seconds() - g0) / wall;
  r.server_cores = (bench::process_cpu_seconds(server_pid) - c0) / wall;
  r.other_cores =
      std::max(0.0, (bench::machine_busy_seconds() - m0b) / wall - r.gen_cores - r.server_cores);
  const Counters k1 = udp_snmp();
  const Counters m1 = sluiced ? sluiced_metrics(s.admin_port) : Counters{};

  std::string notes;
  auto add = [&](const std::string& what, double v) {
    if (v <= 0) return;
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.0f", notes.empty() ? "" : ", ", what.c_str(), v);
    notes += buf;
  };
  const bench::RowStats& st = r.stats;
  add("errors", static_cast<double>(st.errors));
  add("denied", static_cast<double>(st.denied));
  add("lost", static_cast<double>(st.lost));
  add("late", static_cast<double>(st.late_answers));
  add("send-EAGAIN", static_cast<double>(st.send_failures));
  add("conn-failures", static_cast<double>(st.conn_failures));
  add("unsent", static_cast<double>(st.unsent));
  if (st.arrival.count() > 0) {
    notes += std::string(notes.empty() ? "" : ", ") + "at-socket p50/p99/p99.9 us " +
             fmt_num(r.arrival_us(0.5), 1) + "/" + fmt_num(r.arrival_us(0.99), 1) + "/" +
             fmt_num(r.arrival_us(0.999), 1);
  }
  if (rate > 0 && st.send_lag.count() > 0) {
    add("send-lag-p99-us", static_cast<double>(st.send_lag.quantile_ns(0.99)) / 1000.0);
  }
  if (def.transport == "udp") {
    add("kernel-udp-rcvbuf-drops", delta(k0, k1, "RcvbufErrors"));
    add("kernel-udp-sndbuf-drops", delta(k0, k1, "SndbufErrors"));
  }
  if (sluiced) {
    add("sluiced-dropped", delta(m0, m1, "sluice_dropped_datagrams_total"));
    add("sluiced-rejected-req", delta(m0, m1, "sluice_rejected_requests_total"));
    add("sluiced-rejected-checks", delta(m0, m1, "sluice_rejected_checks_total"));
    add("sluiced-bad-frames", delta(m0, m1, "sluice_bad_frames_total"));
    add("sluiced-no-room", delta(m0, m1, "sluice_no_room_total"));
  }
  if (!st.first_error.empty())
    notes += (notes.empty() ? "" : "; ") + ("first error: " + st.first_error);
  r.notes = notes;
  return r;
}

// ---- output -----------------------------------------------------------------------------------

using bench::cpu_model;

const RowResult* find_row(const std::vector<RowResult>& rows, const std::string& name) {
  for (const RowResult& r : rows) {
    if (r.def.name == name && r.error.empty()) return &r;
  }
  return nullptr;
}

// The rows' table, Sluice against its baselines, and the issue's targets judged on this run.
void print_rows_report(const Options& o, const std::vector<RowResult>& results,
                       const std::vector<const RowResult*>& table,
                       const std::optional<RowResult>& half) {
  const std::string udp_single = "sluiced-udp-single";
  std::printf(
      "| row | target | transport | batch | in flight | checks/s | requests/s | MB/s | "
      "B/check | srv us/check | p50 us | p99 us | p99.9 us | cpu gen/srv/other | notes |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const RowResult* r : table) {
    if (!r->error.empty()) {
      std::printf("| %s | %s | %s | %u | | failed | | | | | | | | | %s |\n", r->def.name.c_str(),
                  r->def.target.c_str(), r->def.transport.c_str(), r->def.batch, r->error.c_str());
      continue;
    }
    std::string inflight = r->inflight;
    if (r->offered_rate > 0) inflight += ", offered " + fmt_num(r->offered_rate, 0) + "/s";
    const std::string cpu = fmt_num(r->gen_cores, 2) + "/" + fmt_num(r->server_cores, 2) + "/" +
                            fmt_num(r->other_cores, 2);
    std::printf(
        "| %s | %s | %s | %u | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
        r->def.name.c_str(), r->def.target.c_str(), r->def.transport.c_str(), r->def.batch,
        inflight.c_str(), fmt_num(r->checks_per_sec(), 0).c_str(),
        fmt_num(r->units_per_sec(), 0).c_str(), fmt_num(r->bytes_per_sec() / 1e6, 1).c_str(),
        fmt_num(r->bytes_per_check(), 0).c_str(), fmt_num(r->server_cpu_us_per_check(), 2).c_str(),
        fmt_num(r->us(0.5), 1).c_str(), fmt_num(r->us(0.99), 1).c_str(),
        fmt_num(r->us(0.999), 1).c_str(), cpu.c_str(), r->notes.empty() ? "" : r->notes.c_str());
  }

  // Ratios: each Sluice row against the baselines of the same shape.
  const std::string b = std::to_string(o.batch);
  const std::string p = std::to_string(kRespPipeline);
  const std::vector<std::pair<std::string, std::vector<std::string>>> pairs = {
      {"sluiced-udp-single",
       {"redis-lua-single", "redis-hash-single", "memcached-single", "redis-incr-single"}},
      {"sluiced-tcp-single",
       {"redis-lua-single", "redis-hash-single", "memcached-single", "redis-incr-single"}},
      {"sluiced-udp-batch" + b,
       {"redis-lua-pipe" + b, "redis-hash-pipe" + b, "redis-incr-pipe" + b}},
      {"sluiced-tcp-batch" + b,
       {"redis-lua-pipe" + b, "redis-hash-pipe" + b, "redis-incr-pipe" + b}},
      {"sluiced-http-single", {"nginx-limitreq-single"}},
      {"sluiced-resp-single", {"redis-lua-gcra-single", "redis-incr-single"}},
      {"sluiced-resp-pipe" + p, {"redis-incr-pipe" + p}},
  };
  std::printf("\n## Sluice vs baselines (checks/s)\n\n");
  bool any = false;
  for (const auto& [mine, theirs] : pairs) {
    const RowResult* a = find_row(results, mine);
    if (a == nullptr) continue;
    for (const std::string& other : theirs) {
      const RowResult* c = find_row(results, other);
      if (c == nullptr || c->checks_per_sec() <= 0) continue;
      std::printf("%s vs %s: %.2fx\n", mine.c_str(), other.c_str(),
                  a->checks_per_sec() / c->checks_per_sec());
      any = true;
    }
  }
  if (!any) std::printf("(no pair of rows ran)\n");

  // The issue's targets, judged on this run only.
  std::printf("\n## Targets (this run)\n\n");
  auto judge_ratio = [&](const std::string& mine, const std::string& other, double want) {
    const RowResult* a = find_row(results, mine);
    const RowResult* c = find_row(results, other);
    if (a == nullptr || c == nullptr || c->checks_per_sec() <= 0) {
      std::printf("- %s >= %.1fx %s: not measured\n", mine.c_str(), want, other.c_str());
      return;
    }
    const double ratio = a->checks_per_sec() / c->checks_per_sec();
    std::printf("- %s >= %.1fx %s: %.2fx, %s\n", mine.c_str(), want, other.c_str(), ratio,
                ratio >= want ? "MET" : "NOT MET");
  };
  judge_ratio(udp_single, "redis-lua-single", 3.0);
  judge_ratio(udp_single, "redis-incr-single", 1.5);
  // The network paths against their bare echo (the same requests, threads and cores).
  auto judge_ceiling = [&](const std::string& mine, const std::string& echo, bool by_bytes) {
    const RowResult* a = find_row(results, mine);
    const RowResult* c = find_row(results, echo);
    const char* what = by_bytes ? "bytes/s" : "requests/s";
    if (a == nullptr || c == nullptr) {
      std::printf("- %s >= 0.8x %s's %s: not measured\n", mine.c_str(), echo.c_str(), what);
      return;
    }
    const double mv = by_bytes ? a->bytes_per_sec() : a->units_per_sec();
    const double ev = by_bytes ? c->bytes_per_sec() : c->units_per_sec();
    const double ratio = ev > 0 ? mv / ev : 0;
    std::printf("- %s >= 0.8x %s's %s: %.0f / %.0f = %.2fx, %s\n", mine.c_str(), echo.c_str(), what,
                mv, ev, ratio, ratio >= 0.8 ? "MET" : "NOT MET");
  };
  judge_ceiling(udp_single, "udp-echo-single", false);
  judge_ceiling("sluiced-udp-batch" + b, "udp-echo-batch" + b, true);
  judge_ceiling("sluiced-tcp-single", "tcp-echo-single", false);
  judge_ceiling("sluiced-tcp-batch" + b, "tcp-echo-batch" + b, true);
  judge_ratio("sluiced-tcp-batch" + b, "redis-incr-pipe" + b, 1.5);
  judge_ratio("sluiced-resp-single", "redis-lua-gcra-single", 2.0);
  judge_ratio("sluiced-resp-pipe" + p, "redis-incr-pipe" + p, 1.0);
  if (half) {
    const double p99 = half->us(0.99), p999 = half->us(0.999);
    std::printf(
        "- single UDP checks at half the max rate (%.0f checks/s offered, %.0f answered/s, "
        "open loop, timed from each check's due time): p99 %.1f us <= 100: %s; p99.9 %.1f us "
        "<= 300: %s (answers' arrival at the generator's socket: p99 %.1f us)\n",
        half->offered_rate, half->checks_per_sec(), p99, p99 <= 100 ? "MET" : "NOT MET", p999,
        p999 <= 300 ? "MET" : "NOT MET", half->arrival_us(0.99));
  } else {
    std::printf("- p99 at half the max rate: not measured (run with --half-rate)\n");
  }
  for (const std::string& row : {"sluiced-udp-batch" + b, "sluiced-tcp-batch" + b}) {
    const RowResult* a = find_row(results, row);
    if (a == nullptr) {
      std::printf("- %s >= 1M checks/s: not measured\n", row.c_str());
    } else {
      std::printf("- %s >= 1M checks/s: %.0f, %s\n", row.c_str(), a->checks_per_sec(),
                  a->checks_per_sec() >= 1e6 ? "MET" : "NOT MET");
    }
  }
}

}  // namespace

int bench_load_main(int argc, char** argv) {
  // The echo servers are this program run again (see start_echo).
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
  if (const std::optional<int> exit = parse(argc, argv, o)) return *exit;
  bench::install_stop_signals();
  std::vector<RowDef> rows;
  for (const RowDef& r : all_rows(o)) {
    // --curve alone runs the curves only; rows named with --only run beside them.
    if (selected(o, r.name) && !(o.curve && o.only.empty())) rows.push_back(r);
  }
  if (o.list) {
    for (const RowDef& r : all_rows(o))
      std::printf("%s\n", r.name.c_str());
    return 0;
  }
  const std::string udp_single = "sluiced-udp-single";
  if (rows.empty() && !o.half_rate && !o.curve) {
    std::fprintf(stderr, "sluice-bench-load: --only selects no row (see --list)\n");
    return 2;
  }

  bool need_sluiced = o.half_rate || o.curve, need_redis = false, need_memcached = false;
  bool need_echo_udp = false, need_echo_tcp = false, need_nginx = false, need_resp = false;
  for (const RowDef& r : rows) {
    need_sluiced |= r.server == Server::kSluiced;
    need_resp |= r.kind == Kind::kSluiceResp;
    need_redis |= r.server == Server::kRedis;
    need_memcached |= r.server == Server::kMemcached;
    need_echo_udp |= r.server == Server::kEchoUdp;
    need_echo_tcp |= r.server == Server::kEchoTcp;
    need_nginx |= r.server == Server::kNginx;
  }

  std::vector<RowResult> results;
  std::optional<RowResult> half;
  std::vector<bench::CurvePoint> curve;
  std::string sluiced_report;
  bool interrupted = false;
  try {
    Servers s;
    start_servers(o, need_sluiced, need_resp, need_redis, need_memcached, need_echo_udp,
                  need_echo_tcp, need_nginx, s);
    const bench::Keyspace keys(o.keys);

    std::fprintf(stderr, "sluice-bench-load: servers up (%s%s%s), %zu row(s) of %.1f s\n",
                 need_sluiced ? "sluiced " : "", need_redis ? "redis " : "",
                 need_memcached ? "memcached" : "", rows.size() + (o.half_rate ? 1 : 0),
                 o.seconds + o.warmup);
    for (const RowDef& def : rows) {
      if (bench::stop_requested()) break;
      std::fprintf(stderr, "  %-22s ...", def.name.c_str());
      std::fflush(stderr);
      RowResult r;
      try {
        r = run_row(o, def, s, keys, o.rate);
      } catch (const std::exception& e) {
        r.def = def;
        r.error = e.what();
      }
      if (bench::stop_requested()) {
        std::fprintf(stderr, " interrupted\n");
      } else if (r.error.empty()) {
        std::fprintf(stderr, " %.0f checks/s, p99 %.0f us\n", r.checks_per_sec(), r.us(0.99));
      } else {
        std::fprintf(stderr, " failed: %s\n", r.error.c_str());
      }
      results.push_back(std::move(r));
    }
    if (o.half_rate && !bench::stop_requested()) {
      const RowResult* max = find_row(results, udp_single);
      RowResult measured;
      if (max == nullptr) {
        std::fprintf(stderr, "  %-22s ...", "sluiced-udp-single (max)");
        measured = run_row(o, all_rows(o)[0], s, keys, 0);
        std::fprintf(stderr, " %.0f checks/s\n", measured.checks_per_sec());
        results.push_back(measured);
        max = &results.back();
      }
      const double rate = max->checks_per_sec() / 2;
      std::fprintf(stderr, "  %-22s ... at %.0f checks/s", "sluiced-udp-single@half", rate);
      RowDef def = all_rows(o)[0];
      def.name = "sluiced-udp-single@half";
      // Open loop, each check timed from when it was due to leave: a check held back by a full
      // window is charged the wait (no coordinated omission).
      half = run_row(o, def, s, keys, rate, /*from_schedule=*/true);
      half->load = "half";
      std::fprintf(stderr, " p99 %.0f us\n", half->us(0.99));
    }
    if (o.curve && !bench::stop_requested()) {
      bench::DoorEndpoints at;
      at.sluiced = s.sluiced.pid();
      at.check_port = s.sluice_port;
      at.admin_port = s.admin_port;
      at.grpc_port = s.grpc_port;
      at.redis_port = s.resp_port;
      std::fprintf(stderr, "  curves: %zu door(s) x %zu pinning(s) x %zu points of %.1f s\n",
                   o.curve_opt.doors.size(), o.curve_opt.pinnings.size(),
                   o.curve_opt.load_pct.size() + 1, o.seconds + o.warmup);
      curve = bench::run_curves(o.curve_opt, at, keys, [](const bench::CurvePoint& p) {
        std::fprintf(stderr, "  %s\n", bench::describe_point(p).c_str());
      });
    }
    interrupted = bench::stop_requested();
    if (s.sluiced.pid() > 0 && !s.sluiced.running()) {
      sluiced_report = "sluiced exited during the run (" + s.sluiced.exit_status() + "); log:\n" +
                       bench::file_tail(s.sluiced.log_path());
    }
    // Servers stop here (destructors), before printing.
    std::string log = s.sluiced.pid() > 0 ? s.sluiced.log_path() : "";
    s.sluiced.stop();
    if (!log.empty()) {
      const std::string tail = bench::file_tail(log, 1500);
      if (!tail.empty()) sluiced_report += "sluiced log (warn and above):\n" + tail;
    }
    s.redis.stop();
    s.memcached.stop();
    s.echo_udp.stop();
    s.echo_tcp.stop();
    s.nginx.stop();
    std::fprintf(stderr, "sluice-bench-load: servers stopped (redis %s, memcached %s)\n",
                 s.redis_version.empty() ? "-" : s.redis_version.c_str(),
                 s.memcached_version.empty() ? "-" : s.memcached_version.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice-bench-load: %s\n", e.what());
    return 1;
  }
  if (interrupted) {
    std::fprintf(stderr, "sluice-bench-load: interrupted; servers stopped\n");
    return 130;
  }

  // ---- the report ----
  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&t));
  const unsigned cpus = std::thread::hardware_concurrency();
  std::printf("# sluice-bench-load, %s\n\n", date);
  std::printf(
      "machine: %u CPUs (%s). Generator (%u thread%s) and the server under test share them:\n"
      "every figure includes the generator's own CPU use. One target at a time.\n",
      cpus, cpu_model().c_str(), o.gen_threads, o.gen_threads == 1 ? "" : "s");
  std::printf(
      "servers: sluiced --threads %u, udp_busy_poll_us %u; redis-server (single-threaded); "
      "memcached -t 2.\n"
      "load: %u keys %s, %s, %.1f s per row after %.1f s warm-up; every check allowed "
      "(limit %" PRIu64
      "/min).\n"
      "sluiced UDP requests padded as libsluice does (64 + %u bytes per check).\n\n",
      o.server_threads, o.busy_poll_us, o.keys, o.zipf ? "zipf(0.99)" : "uniform",
      o.rate > 0 ? ("open loop at " + fmt_num(o.rate, 0) + " checks/s").c_str()
                 : "closed loop (as fast as answers come back)",
      o.seconds, o.warmup, kLimit, o.udp_room);

  std::vector<const RowResult*> table;
  for (const RowResult& r : results)
    table.push_back(&r);
  if (half) table.push_back(&*half);
  if (!table.empty()) print_rows_report(o, results, table, half);
  if (!curve.empty()) {
    std::printf(
        "\n## Latency curves\n\n"
        "Each door of the one sluiced: its max (closed loop), then open loop at a share of that\n"
        "max, latency from each check's scheduled send time. Pinned: sluiced on CPU %d, the\n"
        "generator on CPU %d; unpinned: both anywhere. errors counts error answers and failed\n"
        "connections, lost unanswered UDP checks, unsent checks due but never sent.\n\n",
        o.curve_opt.server_cpu, o.curve_opt.generator_cpu);
    bench::print_curve_table(curve, stdout);
  }
  if (!sluiced_report.empty())
    std::printf("\n## sluiced\n\n```\n%s\n```\n", sluiced_report.c_str());

  if (o.json) {
    nlohmann::json json_rows = nlohmann::json::array();
    for (const RowResult* r : table) {
      if (!r->error.empty()) continue;
      nlohmann::json row = {{"row", r->def.name},
                            {"target", r->def.target},
                            {"transport", r->def.transport},
                            {"batch", r->def.batch},
                            {"load", r->load},
                            {"checks_per_sec", r->checks_per_sec()},
                            {"requests_per_sec", r->units_per_sec()},
                            {"bytes_per_sec", r->bytes_per_sec()},
                            {"bytes_per_check", r->bytes_per_check()},
                            {"server_cpu_us_per_check", r->server_cpu_us_per_check()},
                            {"server_cores", r->server_cores},
                            {"generator_cores", r->gen_cores},
                            {"p50_us", r->us(0.5)},
                            {"p99_us", r->us(0.99)},
                            {"p999_us", r->us(0.999)},
                            {"max_us", static_cast<double>(r->stats.latency.max_ns()) / 1000.0},
                            {"errors", r->stats.errors},
                            {"lost", r->stats.lost}};
      if (r->offered_rate > 0) {
        // The whole latency histogram: [bucket midpoint in us, checks] for every non-empty bucket
        // (log-linear buckets, within 0.8 % of the value).
        nlohmann::json hist = nlohmann::json::array();
        r->stats.latency.for_each_bucket([&](uint64_t ns, uint64_t n) {
          hist.push_back({static_cast<double>(ns) / 1000.0, n});
        });
        row["offered_checks_per_sec"] = r->offered_rate;
        row["histogram_us"] = std::move(hist);
      }
      json_rows.push_back(std::move(row));
    }
    bench::append_curve_json(curve, json_rows);
    bench::print_json_rows(json_rows);
  }
  return 0;
}
