// The latency curve of each door of one sluiced (sluice-bench-load --curve): how latency grows
// with load at every way a check can come in, on the same process, generator and machine.
//
// For each door (UDP single checks, TCP single checks, HTTP POST /v1/check, gRPC ShouldRateLimit,
// CL.THROTTLE at the Redis-protocol door), and for each pinning:
//   max      closed loop: the door's most checks/s with its requests in flight (CurveOptions)
//   curve    open loop at each of CurveOptions::load_pct percent of that max (10, 25, 50, 75),
//            every check timed from its scheduled send time (DriveOptions::latency_from_schedule:
//            a check held back by a full window is charged the wait, no coordinated omission)
// Pinned: every thread of sluiced may run only on server_cpu and the generator's threads only on
// generator_cpu (sched_setaffinity, as `taskset`), so neither preempts the other. Unpinned: both
// may run wherever they could when run_curves() was called (every CPU, unless the benchmark was
// started under taskset), so the scheduler places them; the two sets of points side by side show
// the machine's own jitter. Other work on the machine is not held off either way: the CPU columns
// say what each side used.
//
// The max of each pinning is measured in that pinning, right before its open-loop points, so a
// curve is always relative to the max the same conditions reach. Each point runs warmup + seconds;
// a point that fails (a door that is not open, every connection failed) carries its error and the
// run goes on with the next.
//
// Thread safety: run_curves() is called from the main thread (it pins the calling thread, which
// the generator's threads inherit) and gives that thread and sluiced back the CPUs they had when
// it returns.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "load/driver.h"
#include "load/targets.h"

namespace sluice::bench {

enum class Door { kUdp, kTcp, kHttp, kGrpc, kRedis };

// "udp", "tcp", "http", "grpc", "redis": the names of --doors and of the rows' "target".
std::string_view door_name(Door d);
std::optional<Door> door_from_name(std::string_view name);
// Whether this build can drive the door; `why` says why not.
bool door_available(Door d, std::string& why);

// Where the doors of the sluiced under test listen (127.0.0.1), and its process.
struct DoorEndpoints {
  pid_t sluiced = -1;
  uint16_t check_port = 0;  // the check protocol, UDP and TCP on the same port
  uint16_t admin_port = 0;  // HTTP: POST /v1/check
  uint16_t grpc_port = 0;   // gRPC: 0 when sluiced was started without it
  uint16_t redis_port = 0;  // the Redis-protocol door: 0 when sluiced was started without it
};

struct CurveOptions {
  std::vector<Door> doors;
  std::vector<int> load_pct = {10, 25, 50, 75};  // open-loop points, percent of the max
  std::vector<bool> pinnings = {true, false};    // pinned first, then unpinned
  int server_cpu = 0;
  int generator_cpu = 1;
  double seconds = 5;  // measured per point
  double warmup = 0.5;
  uint32_t keys = 10'000;
  bool zipf = false;
  unsigned gen_threads = 1;
  // In flight at each door, in its max and its open-loop points alike (an open-loop point can
  // never have more in flight than this: what is due beyond it waits, and is charged the wait).
  uint32_t udp_sockets = 8, udp_window = 8;         // datagrams of one check per socket
  uint32_t udp_room = 288;                          // padding per check, as libsluice
  uint32_t tcp_connections = 16, tcp_window = 32;   // frames of one check, pipelined
  uint32_t http_connections = 16, http_window = 1;  // keep-alive, pipelined when > 1
  uint32_t grpc_connections = 4, grpc_window = 32;  // HTTP/2 connections x calls in flight
  uint32_t resp_connections = 16, resp_window = 1;  // CL.THROTTLE, pipelined when > 1
  // CL.THROTTLE's limiter for every key: max_burst, count_per_period, period in seconds.
  int64_t resp_burst = 1'000'000, resp_count = 1'000'000, resp_period_s = 60;
};

struct CurvePoint {
  Door door = Door::kUdp;
  bool pinned = false;
  int load_pct = 100;          // 100: the max (closed loop)
  double offered_per_sec = 0;  // open loop: checks/s due; 0 in closed loop
  std::string in_flight;       // "8 sock x 8 dgram", ...
  RowStats stats;
  double generator_cores = 0;  // CPU used over the point, in cores
  double server_cores = 0;     // sluiced's, all its threads
  double other_cores = 0;      // everything else on the machine, kernel included
  std::string error;           // the point could not run

  bool is_max() const { return load_pct == 100 && offered_per_sec == 0; }
  double checks_per_sec() const;
  double us(double q) const;  // latency quantile, microseconds
  double server_cpu_us_per_check() const;
};

// Runs the curves of every door in o.doors; on_point is called after each point (progress).
std::vector<CurvePoint> run_curves(const CurveOptions& o, const DoorEndpoints& at,
                                   const Keyspace& keys,
                                   const std::function<void(const CurvePoint&)>& on_point);

// One line of progress for stderr: "udp pinned 50% ... 80000 checks/s, p99 300 us".
std::string describe_point(const CurvePoint& p);

// The points as a markdown table.
void print_curve_table(const std::vector<CurvePoint>& points, std::FILE* out);

// The points as --json rows: {"row", "target" (the door), "phase" ("max" | "curve"), "load_pct",
// "pinned", "checks_per_sec", "offered_per_sec", "p50_us", "p99_us", "p999_us", "max_us",
// "server_cpu_us_per_check", "server_cores", "generator_cores", "errors", "lost", "unsent",
// "conn_failures", "in_flight", "seconds"}. Points that failed are left out.
void append_curve_json(const std::vector<CurvePoint>& points, nlohmann::json& rows);

}  // namespace sluice::bench
