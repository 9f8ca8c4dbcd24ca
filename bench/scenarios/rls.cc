// sluice-bench-rls: Envoy's rate limit service over gRPC (envoy.service.ratelimit.v3.
// RateLimitService/ShouldRateLimit) against single UDP checks, on one sluiced, in one run
// (docs/benchmarks.md, "Envoy RLS over gRPC").
//
// One run starts sluiced (rules with one domain `bench`, a rule keyed by `k` whose limit no run
// reaches, in memory only), measures its rows one after another and stops it (common/process.h):
//   rls max    closed loop: --channels HTTP/2 connections x --inflight unary calls outstanding
//              on each; a call is restarted as soon as it ends
//   rls half   open loop at half of `rls max`'s checks/s: a fixed schedule of send times
//   rls low    open loop at --low-rate (10,000/s): the server's CPU at a moderate load
//   udp max    closed loop through bench/load's UDP driver (the one of sluice-bench-load)
//   udp half   open loop at half of `udp max`
// Before sluiced, the same rls rows against sluice-bench-rls-noop (rows "rls-noop"): the same
// gRPC front answering every check allowed without deciding, the ceiling of the transport.
// With --compare PATH, the rls rows are first measured against another sluiced binary (its own
// fresh process, rows "rls@before"), so a server change is judged within one run; --rate R fixes
// the open-loop rate (the same load for both binaries). server_us_per_check is the server's CPU
// time per answered check, steadier than checks/s when other work shares the cores.
// Every request carries one check: a descriptor with the one entry k=<key>, key uniform over --keys
// names ("u<i>"), the same keys over both transports. Latency in open loop is measured from the
// scheduled send time (a request that waited for a free slot is charged the wait), so a server
// that falls behind cannot hide it (no coordinated omission).
//
// The RLS generator is bench/load's gRPC target (load/grpc_target.h, on the driver's epoll loop,
// one thread): a few microseconds per call. The *_cores fields say what each side used.
//
// Errors are counted, never dropped: any non-OK gRPC status, a response other than OK, a wrong
// number of statuses, a connection lost; for UDP, error answers and requests unanswered within
// 200 ms.
#include <sys/prctl.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/json_rows.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/scenario.h"
#include "load/driver.h"
#include "load/grpc_target.h"
#include "load/targets.h"

namespace {

namespace bench = sluice::bench;
using bench::Row;

constexpr uint64_t kLimit = 1'000'000'000;  // per key and minute: every check is allowed

struct Options {
  bench::DriveOptions drive;  // one generator thread; see bench_rls_main for the defaults
  std::string only;           // "", "rls" or "udp"
  uint32_t channels = 4;
  uint32_t inflight = 32;  // calls outstanding per channel
  uint32_t server_threads = 2;
  uint32_t udp_sockets = 8;
  uint32_t udp_window = 8;  // as sluice-bench-load's sluiced-udp-single
  std::string sluiced = SLUICED_BIN;
  std::string compare;       // another sluiced: its RLS rows first, labelled "before"
  double rate = 0;           // open-loop rows at this rate instead of half the max
  double low_rate = 10'000;  // the "low" row's rate (0: no such row)
  bool no_noop = false;      // skip the rls-noop rows
};

std::string load_average() {
  double l[3] = {};
  if (::getloadavg(l, 3) != 3) return "?";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", l[0], l[1], l[2]);
  return buf;
}

// sluiced's sluice_rls_requests_total of every result but "ok" (0 without an admin port).
double rls_refused(uint16_t admin_port) {
  double n = 0;
  std::string body;
  if (admin_port == 0 || !bench::http_get(admin_port, "/metrics", body).empty()) return n;
  for (const bench::MetricSample& m : bench::parse_metrics(body)) {
    if (m.name == "sluice_rls_requests_total" && bench::label_value(m, "result") != "ok")
      n += m.value;
  }
  return n;
}

// The server under test: sluice-bench-rls-noop (gRPC only, answering without deciding) or
// sluiced.
struct Server {
  bench::TempDir dir;
  bool is_noop = false;
  bench::ChildProcess noop;
  uint16_t noop_port = 0;
  bench::SluicedChild sluiced;
  bench::ChildProcess& process() { return is_noop ? noop : sluiced.process; }
  uint16_t grpc_port() const { return is_noop ? noop_port : sluiced.grpc_port; }
};

void start_server(const Options& o, const std::string& variant, Server& s) {
  s.is_noop = variant == "noop";
  if (s.is_noop) {
    s.noop_port = bench::free_loopback_port();
    const std::string err =
        s.noop.start({SLUICE_RLS_NOOP_BIN, "--grpc", "127.0.0.1:" + std::to_string(s.noop_port),
                      "--threads", std::to_string(o.server_threads)},
                     s.dir.path + "/noop.log");
    if (!err.empty()) throw std::runtime_error("sluice-bench-rls-noop: " + err);
    bench::wait_ready(
        s.noop, [&] { return bench::grpc_probe(s.noop_port, 500); }, 15'000);
    return;
  }
  s.sluiced.exe = variant.empty() ? o.sluiced : o.compare;
  s.sluiced.written_by = "sluice-bench-rls";
  s.sluiced.limits = std::to_string(kLimit) + "/1m";
  s.sluiced.threads = o.server_threads;
  s.sluiced.data = false;
  s.sluiced.grpc = true;
  s.sluiced.start(s.dir.path);
}

// One row: rls (the gRPC door) or udp, closed loop (rate 0) or open loop at `rate`.
Row run_row(const Options& o, Server& s, bool rls, const bench::Keyspace& names, double rate) {
  bench::DriveOptions d = o.drive;
  d.conns = rls ? o.channels : o.udp_sockets;
  d.rate = rate;
  bench::ConnFactory factory;
  std::string in_flight = std::to_string(d.conns);
  if (rls) {
    bench::GrpcConnOptions go;
    go.port = s.grpc_port();
    go.window = o.inflight;
    go.keys = &names;
    factory = [go](bench::ThreadContext& ctx) { return bench::make_grpc(go, ctx); };
    in_flight += " conn x " + std::to_string(o.inflight) + " calls";
  } else {
    bench::SluiceConnOptions so;
    so.port = s.sluiced.port;
    so.window = o.udp_window;
    so.udp_room_per_check = 288;  // libsluice's default udp_answer_room_per_check
    so.keys = &names;
    factory = [so](bench::ThreadContext& ctx) { return bench::make_sluice_udp(so, ctx); };
    in_flight += " sock x " + std::to_string(o.udp_window) + " dgram";
  }
  const std::string load_avg = load_average();
  const double refused0 = rls_refused(s.sluiced.admin_port);
  bench::Cores cores;
  const bench::RowStats st = bench::drive(d, factory, s.process().pid(), cores);
  const double refused = rls_refused(s.sluiced.admin_port) - refused0;
  Row row = {{"target", rls ? "rls" : "udp"},
             {"phase", rate > 0 ? "half" : "max"},
             {"in_flight", in_flight},
             {"offered_per_sec", rate > 0 ? Row(rate) : Row()}};
  row.update(bench::row_figures(st, cores));
  // Everything that failed (see the file comment).
  row["errors"] = st.errors + st.conn_failures + (rls ? 0 : st.lost);
  row["gen_cores"] = cores.generator;
  row["server_us_per_check"] = row["server_cpu_us_per_check"];
  row["load_avg"] = load_avg;
  row["notes"] = bench::row_notes(st, {{"server non-ok", refused}});
  return row;
}

int run(const Options& o, bool json) {
  // Open-loop pacing sleeps ~50 us at a time; the default 50 us timer slack would double that.
  // Threads started from here (the UDP driver's, gRPC's) inherit the value.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  bench::print_run_header("sluice-bench-rls", o.drive,
                          "--threads " + std::to_string(o.server_threads));
  bench::Rows out(json);
  const bench::Keyspace names(o.drive.keys);
  // The no-op front first (rows rls-noop), then one sluiced per binary: the --compare one (RLS
  // rows only), then the one under test.
  for (const std::string& variant : {std::string("noop"), std::string("before"), std::string()}) {
    if (variant == "before" && (o.compare.empty() || o.only == "udp")) continue;
    if (variant == "noop" && (o.no_noop || o.only == "udp")) continue;
    const bool noop = variant == "noop";
    Server s;
    start_server(o, variant, s);
    for (const bool rls : {true, false}) {
      if (!o.only.empty() && o.only != (rls ? "rls" : "udp")) continue;
      if (!rls && !variant.empty()) continue;
      auto one = [&](double rate, const char* phase) -> double {
        if (bench::stop_requested()) return 0;
        Row row = run_row(o, s, rls, names, rate);
        if (noop) row["target"] = "rls-noop";
        row["phase"] = phase;
        row["sluiced"] = variant.empty() || noop ? "under test" : variant;
        return out.add(std::move(row))["checks_per_sec"].get<double>();
      };
      const double max = one(0, "max");
      if (max <= 0) continue;
      one(o.rate > 0 ? o.rate : max / 2, "half");
      // A fixed, moderate load: what an Envoy fleet sending that many checks costs the server.
      if (rls && o.low_rate > 0) one(o.low_rate, "low");
    }
    bench::stop_server(s.process(), "sluice-bench-rls", noop ? "sluice-bench-rls-noop" : "sluiced");
    if (bench::stop_requested()) break;
  }
  return bench::finish_run(out, "sluice-bench-rls");
}

}  // namespace

int bench_rls_main(int argc, char** argv) {
  Options o;
  o.drive.warmup_s = 2;
  o.drive.seconds = 10;
  o.drive.latency_from_schedule = true;
  bench::Cli cli("sluice-bench-rls");
  cli.word("--only", o.only, {"rls", "udp"}, "measure one transport only (default both)");
  cli.seconds(o.drive.seconds, 0.1, 600, "measured seconds per row");
  cli.number("--warmup", o.drive.warmup_s, 0, 60, "unmeasured seconds before each row");
  cli.keys(o.drive.keys, 1, 10'000'000, "keys, uniform");
  cli.number("--channels", o.channels, 1, 256, "gRPC channels, one HTTP/2 connection each");
  cli.number("--inflight", o.inflight, 1, 4096, "calls outstanding per channel");
  cli.server_threads(o.server_threads);
  cli.number("--udp-sockets", o.udp_sockets, 1, 1024, "UDP sockets");
  cli.number("--udp-window", o.udp_window, 1, 4096, "UDP datagrams in flight per socket");
  cli.sluiced(o.sluiced);
  cli.number("--rate", o.rate, 1, 1e8,
             "the open-loop row at R checks/s instead of half the measured max (the same load "
             "for both sluiced binaries with --compare)");
  cli.text("--compare", o.compare,
           "first measure the rls rows against this sluiced too (rows \"rls@before\"), on its "
           "own fresh process, so a server change is judged within one run");
  cli.number("--low-rate", o.low_rate, 0, 1e8, "the rls \"low\" rows at R checks/s (0: none)");
  cli.flag("--no-noop", o.no_noop,
           "skip the rls-noop rows (the gRPC front answering without deciding, "
           "sluice-bench-rls-noop: the ceiling the rls rows are read against)");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  return bench::run_stoppable("sluice-bench-rls", [&] { return run(o, cli.json); });
}
