// sluice-bench-rls: Envoy's rate limit service over gRPC (envoy.service.ratelimit.v3.
// RateLimitService/ShouldRateLimit) against single UDP checks, on one sluiced, in one run
// (docs/benchmarks.md, "Envoy RLS over gRPC").
//
// One run: starts sluiced (UDP, TCP, admin and gRPC on free loopback ports, rules with one domain
// `bench` and a rule keyed by `key` whose limit no run reaches, in memory only), waits until both
// fronts answer (bounded), then measures its rows one after another and stops sluiced (also on
// error or SIGINT/SIGTERM; the child dies with the benchmark even on kill -9):
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
// the open-loop rate (the same load for both binaries). `srv us/check` is sluiced's CPU time per
// answered check, steadier than checks/s when other work shares the cores.
// Every request carries one check: a descriptor with the one entry key=<k>, k uniform over --keys
// names ("u<i>"), the same keys over both transports. Latency in open loop is measured from the
// scheduled send time (a request that waited for a free slot is charged the wait), so a server
// that falls behind cannot hide it (no coordinated omission).
//
// The RLS generator is bench/load's gRPC target (load/grpc_target.h: HTTP/2 through libnghttp2 on
// the driver's epoll loop, one thread), so it costs a few microseconds per call and leaves the
// cores to the server. It shares the machine's cores with sluiced: `cpu gen/srv/other` is what
// each used, in cores, over the row.
//
// Errors are counted, never dropped: any non-OK gRPC status, a response other than OK, a wrong
// number of statuses, a connection lost; for UDP, error answers and requests unanswered within
// 200 ms.
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
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
#include "load/grpc_target.h"
#include "load/targets.h"

namespace {

namespace bench = sluice::bench;

constexpr uint64_t kLimit = 1'000'000'000;  // per key and minute: every check is allowed
constexpr std::string_view kEntryKey = "key";

struct Options {
  bool json = false;
  std::string only;  // "", "rls" or "udp"
  double seconds = 10;
  double warmup = 2;
  uint32_t keys = 10'000;
  uint32_t channels = 4;
  uint32_t inflight = 32;  // calls outstanding per channel
  uint32_t server_threads = 2;
  uint32_t udp_sockets = 8;
  uint32_t udp_window = 8;  // as sluice-bench-load's sluiced-udp-single
  uint32_t udp_room = 288;  // libsluice's default udp_answer_room_per_check
  std::string sluiced = SLUICED_BIN;
  std::string compare;       // another sluiced: its RLS rows first, labelled "before"
  double rate = 0;           // open-loop rows at this rate instead of half the max
  double low_rate = 10'000;  // the "low" row's rate (0: no such row)
  bool no_noop = false;      // skip the rls-noop rows
};

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse(int argc, char** argv, Options& o) {
  bench::Cli cli("sluice-bench-rls");
  cli.word("--only", o.only, {"rls", "udp"}, "measure one transport only (default both)");
  cli.seconds(o.seconds, 0.1, 600, "measured seconds per row");
  cli.number("--warmup", o.warmup, 0, 60, "unmeasured seconds before each row");
  cli.keys(o.keys, 1, 10'000'000, "keys, uniform");
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
  const std::optional<int> exit = cli.parse(argc, argv);
  o.json = cli.json;
  return exit;
}

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// ---- CPU and load accounting ------------------------------------------------------------------

std::string load_average() {
  double l[3] = {};
  if (::getloadavg(l, 3) != 3) return "?";
  return fmt(l[0], 2) + " " + fmt(l[1], 2) + " " + fmt(l[2], 2);
}

using bench::cpu_model;

// ---- results ----------------------------------------------------------------------------------

struct Row {
  std::string target, phase;  // "rls" | "udp", "max" | "half"
  std::string variant;        // "" or "before" (--compare)
  std::string inflight;
  double offered = 0;  // open loop: checks/s scheduled
  bench::RowStats stats;
  uint64_t errors = 0;  // everything that failed (see the file comment)
  std::string notes;
  std::string load_avg;  // at the row's start
  double gen_cores = 0, server_cores = 0, other_cores = 0;
  double checks_per_sec() const {
    return stats.seconds > 0 ? static_cast<double>(stats.checks) / stats.seconds : 0;
  }
  double us(double q) const { return static_cast<double>(stats.latency.quantile_ns(q)) / 1e3; }
  // sluiced's CPU per answered check: steadier than checks/s when other work shares the cores.
  double server_us_per_check() const {
    return stats.checks > 0 ? server_cores * stats.seconds * 1e6 / static_cast<double>(stats.checks)
                            : 0;
  }
};

// Measures the CPU of the generator (this process), sluiced and the rest around `run`.
template <typename F>
void measure_cpu(Row& r, pid_t server, F&& run) {
  r.load_avg = load_average();
  const double g0 = bench::self_cpu_seconds(), s0 = bench::process_cpu_seconds(server),
               m0 = bench::machine_busy_seconds();
  const int64_t w0 = bench::now_ns();
  run();
  const double wall = static_cast<double>(bench::now_ns() - w0) * 1e-9;
  r.gen_cores = (bench::self_cpu_seconds() - g0) / wall;
  r.server_cores = (bench::process_cpu_seconds(server) - s0) / wall;
  r.other_cores =
      std::max(0.0, (bench::machine_busy_seconds() - m0) / wall - r.gen_cores - r.server_cores);
}

// ---- sluiced ----------------------------------------------------------------------------------

struct Server {
  bench::TempDir dir;
  bench::ChildProcess sluiced;
  uint16_t port = 0, admin_port = 0, grpc_port = 0;
};

// The no-op front (sluice-bench-rls-noop): gRPC only, answering without deciding.
void start_noop(const Options& o, Server& s) {
  s.grpc_port = bench::free_loopback_port();
  const std::string err =
      s.sluiced.start({SLUICE_RLS_NOOP_BIN, "--grpc", "127.0.0.1:" + std::to_string(s.grpc_port),
                       "--threads", std::to_string(o.server_threads)},
                      s.dir.path + "/noop.log");
  if (!err.empty()) throw std::runtime_error("sluice-bench-rls-noop: " + err);
  const int64_t deadline = bench::now_ns() + 15'000'000'000;
  std::string last = "not started";
  while (bench::now_ns() < deadline && !bench::stop_requested()) {
    if (!s.sluiced.running()) {
      throw std::runtime_error("sluice-bench-rls-noop exited (" + s.sluiced.exit_status() + ")");
    }
    last = bench::grpc_probe(s.grpc_port, 500, bench::kSluiceDomain, kEntryKey);
    if (last.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("sluice-bench-rls-noop did not answer within 15 s (" + last + ")");
}

void start_server(const Options& o, const std::string& exe, Server& s) {
  if (::access(exe.c_str(), X_OK) != 0) {
    throw std::runtime_error("no sluiced at '" + exe + "' (--sluiced, --compare)");
  }
  const std::string rules = s.dir.path + "/rules.yaml";
  std::ofstream(rules) << "# written by sluice-bench-rls\n"
                          "domains:\n"
                          "  - name: bench\n"
                          "    rules:\n"
                          "      - name: per-key\n"
                          "        key: [key]\n"
                          "        limits: ["
                       << kLimit << "/1m]\n";
  s.port = bench::free_loopback_port();
  s.admin_port = bench::free_loopback_port();
  s.grpc_port = bench::free_loopback_port();
  const std::string udp = "127.0.0.1:" + std::to_string(s.port);
  const std::string grpc_addr = "127.0.0.1:" + std::to_string(s.grpc_port);
  const std::string err = s.sluiced.start(
      {exe, "--udp", udp, "--tcp", udp, "--admin", "127.0.0.1:" + std::to_string(s.admin_port),
       "--grpc", grpc_addr, "--resp", "", "--rules", rules, "--threads",
       std::to_string(o.server_threads), "--log-level", "warn", "--data-dir", ""},
      s.dir.path + "/sluiced.log");
  if (!err.empty()) throw std::runtime_error("sluiced: " + err);

  // Both fronts must answer; bounded, and failing early when sluiced exits.
  const int64_t deadline = bench::now_ns() + 15'000'000'000;
  std::string last = "not started";
  while (bench::now_ns() < deadline && !bench::stop_requested()) {
    if (!s.sluiced.running()) {
      throw std::runtime_error("sluiced exited (" + s.sluiced.exit_status() + "); log:\n" +
                               bench::file_tail(s.sluiced.log_path()));
    }
    last = bench::sluice_probe(s.port, 500);
    if (last.empty()) last = bench::grpc_probe(s.grpc_port, 500, bench::kSluiceDomain, kEntryKey);
    if (last.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!last.empty()) {
    throw std::runtime_error("sluiced did not answer within 15 s (" + last + "); log:\n" +
                             bench::file_tail(s.sluiced.log_path()));
  }
}

// The sluice_rls_requests_total counters of sluiced, by result.
std::map<std::string, double> rls_server_counters(uint16_t admin_port) {
  std::map<std::string, double> c;
  std::string body;
  if (admin_port == 0 || !bench::http_get(admin_port, "/metrics", body).empty()) return c;
  for (const bench::MetricSample& m : bench::parse_metrics(body))
    if (m.name == "sluice_rls_requests_total") c[bench::label_value(m, "result")] = m.value;
  return c;
}

// ---- rows -------------------------------------------------------------------------------------

// One generator thread over `conns` connections, --keys uniform, latency from the schedule.
bench::DriveOptions drive_options(const Options& o, unsigned conns, double rate) {
  bench::DriveOptions d;
  d.threads = 1;
  d.conns = conns;
  d.rate = rate;
  d.warmup_s = o.warmup;
  d.seconds = o.seconds;
  d.keys = o.keys;
  d.latency_from_schedule = true;
  return d;
}

Row run_rls(const Options& o, Server& s, const bench::Keyspace& names, double rate) {
  Row r;
  r.target = s.admin_port == 0 ? "rls-noop" : "rls";
  r.phase = rate > 0 ? "half" : "max";
  r.offered = rate;
  r.inflight = std::to_string(o.channels) + " conn x " + std::to_string(o.inflight) + " calls";
  bench::GrpcConnOptions go;
  go.port = s.grpc_port;
  go.window = o.inflight;
  go.keys = &names;
  go.entry_key = kEntryKey;
  const bench::DriveOptions d = drive_options(o, o.channels, rate);
  const auto c0 = rls_server_counters(s.admin_port);
  measure_cpu(r, s.sluiced.pid(), [&] {
    r.stats =
        bench::drive(d, [go](bench::ThreadContext& ctx) { return bench::make_grpc(go, ctx); });
  });
  const auto c1 = rls_server_counters(s.admin_port);
  double refused = 0;
  for (const auto& [result, v] : c1) {
    const auto b = c0.find(result);
    if (result != "ok") refused += v - (b == c0.end() ? 0 : b->second);
  }
  const bench::RowStats& st = r.stats;
  r.errors = st.errors + st.conn_failures;
  if (st.denied > 0) r.notes += "denied " + std::to_string(st.denied) + ", ";
  if (refused > 0) r.notes += "server non-ok " + fmt(refused, 0) + ", ";
  return r;
}

Row run_udp(const Options& o, Server& s, const bench::Keyspace& names, double rate) {
  Row r;
  r.target = "udp";
  r.phase = rate > 0 ? "half" : "max";
  r.offered = rate;
  bench::SluiceConnOptions so;
  so.port = s.port;
  so.batch = 1;
  so.window = o.udp_window;
  so.udp_room_per_check = o.udp_room;
  so.keys = &names;
  so.entry_key = kEntryKey;
  const bench::DriveOptions d = drive_options(o, o.udp_sockets, rate);
  r.inflight = std::to_string(d.conns) + " sock x " + std::to_string(so.window) + " dgram";
  measure_cpu(r, s.sluiced.pid(), [&] {
    r.stats = bench::drive(
        d, [so](bench::ThreadContext& ctx) { return bench::make_sluice_udp(so, ctx); });
  });
  const bench::RowStats& st = r.stats;
  r.errors = st.errors + st.lost + st.conn_failures;
  if (st.lost > 0) r.notes += "lost " + std::to_string(st.lost) + ", ";
  if (st.denied > 0) r.notes += "denied " + std::to_string(st.denied) + ", ";
  if (st.send_failures > 0) r.notes += "send-EAGAIN " + std::to_string(st.send_failures) + ", ";
  if (st.late_answers > 0) r.notes += "late " + std::to_string(st.late_answers) + ", ";
  if (st.arrival.count() > 0) {
    r.notes += "at-socket p99 " + fmt(static_cast<double>(st.arrival.quantile_ns(0.99)) / 1e3, 1) +
               " us, ";
  }
  return r;
}

}  // namespace

int bench_rls_main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> exit = parse(argc, argv, o)) return *exit;
  bench::install_stop_signals();
  // Open-loop pacing sleeps ~50 us at a time; the default 50 us timer slack would double that.
  // Threads started from here (the UDP driver's, gRPC's) inherit the value.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);

  std::vector<Row> rows;
  std::string sluiced_report;
  bool interrupted = false;
  try {
    const bench::Keyspace names(o.keys);
    // One sluiced per binary: the --compare one (RLS rows only), then the one under test.
    // The no-op front first (rows rls-noop), then one sluiced per binary: the --compare one (RLS
    // rows only), then the one under test.
    for (const std::string& variant : {std::string("noop"), std::string("before"), std::string()}) {
      if (variant == "before" && (o.compare.empty() || o.only == "udp")) continue;
      if (variant == "noop" && (o.no_noop || o.only == "udp")) continue;
      const bool noop = variant == "noop";
      Server s;
      if (noop) {
        start_noop(o, s);
      } else {
        start_server(o, variant.empty() ? o.sluiced : o.compare, s);
      }
      std::fprintf(stderr, "sluice-bench-rls: %s up (--threads %u), load average %s\n",
                   noop              ? "sluice-bench-rls-noop"
                   : variant.empty() ? "sluiced"
                                     : "sluiced (before)",
                   o.server_threads, load_average().c_str());
      auto one = [&](const std::string& label, auto&& run) -> Row* {
        if (bench::stop_requested()) return nullptr;
        std::fprintf(stderr, "  %-16s ...", label.c_str());
        std::fflush(stderr);
        rows.push_back(run());
        Row& r = rows.back();
        if (!noop) r.variant = variant;
        std::fprintf(stderr, " %.0f checks/s, p99 %.0f us, errors %llu\n", r.checks_per_sec(),
                     r.us(0.99), static_cast<unsigned long long>(r.errors));
        return &r;
      };
      for (const char* target : {"rls", "udp"}) {
        if (!o.only.empty() && o.only != target) continue;
        const bool rls = std::string(target) == "rls";
        if (!rls && !variant.empty()) continue;
        auto run = [&](double rate) {
          return rls ? run_rls(o, s, names, rate) : run_udp(o, s, names, rate);
        };
        const std::string label =
            noop ? "rls-noop" : target + (variant.empty() ? "" : "@" + variant);
        const Row* max = one(label + " max", [&] { return run(0); });
        if (max == nullptr || max->checks_per_sec() <= 0) continue;
        const double half = o.rate > 0 ? o.rate : max->checks_per_sec() / 2;
        one(label + " half", [&] { return run(half); });
        // A fixed, moderate load: what an Envoy fleet sending that many checks costs the server.
        if (rls && o.low_rate > 0) {
          Row* low = one(label + " low", [&] { return run(o.low_rate); });
          if (low != nullptr) low->phase = "low";
        }
      }
      interrupted = bench::stop_requested();
      if (!s.sluiced.running()) {
        sluiced_report += std::string(noop ? "sluice-bench-rls-noop" : "sluiced") +
                          " exited during the run (" + s.sluiced.exit_status() + ")\n";
      }
      const std::string log = s.sluiced.log_path();
      s.sluiced.stop();
      sluiced_report += bench::file_tail(log, 1500);
      if (interrupted) break;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice-bench-rls: %s\n", e.what());
    return 1;
  }
  if (interrupted) {
    std::fprintf(stderr, "sluice-bench-rls: interrupted; sluiced stopped\n");
    return 130;
  }

  char date[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&t));
  std::printf("# sluice-bench-rls, %s\n\n", date);
  std::printf(
      "machine: %u CPUs (%s), shared by the generator and sluiced --threads %u.\n"
      "load: %u keys uniform, one check per request, %.1f s per row after %.1f s warm-up; every\n"
      "check allowed (limit %llu/min). Open-loop latency from the scheduled send time.\n\n",
      std::thread::hardware_concurrency(), cpu_model().c_str(), o.server_threads, o.keys, o.seconds,
      o.warmup, static_cast<unsigned long long>(kLimit));
  std::printf(
      "| target | phase | in flight | offered/s | checks/s | p50 us | p99 us | p99.9 us | errors "
      "| cpu gen/srv/other | srv us/check | load avg | notes |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::string notes = r.notes;
    if (r.stats.unsent > 0) notes += "unsent " + std::to_string(r.stats.unsent) + ", ";
    if (!r.stats.first_error.empty()) notes += "first error: " + r.stats.first_error + ", ";
    if (notes.size() >= 2) notes.resize(notes.size() - 2);
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %llu | %s/%s/%s | %s | %s | %s |\n",
                (r.target + (r.variant.empty() ? "" : "@" + r.variant)).c_str(), r.phase.c_str(),
                r.inflight.c_str(), r.offered > 0 ? fmt(r.offered, 0).c_str() : "-",
                fmt(r.checks_per_sec(), 0).c_str(), fmt(r.us(0.5), 1).c_str(),
                fmt(r.us(0.99), 1).c_str(), fmt(r.us(0.999), 1).c_str(),
                static_cast<unsigned long long>(r.errors), fmt(r.gen_cores, 2).c_str(),
                fmt(r.server_cores, 2).c_str(), fmt(r.other_cores, 2).c_str(),
                fmt(r.server_us_per_check(), 1).c_str(), r.load_avg.c_str(), notes.c_str());
  }
  std::printf("\n## Goals (this run)\n\n");
  auto find = [&](const std::string& target, const std::string& phase) -> const Row* {
    for (const Row& r : rows) {
      if (r.target == target && r.phase == phase && r.variant.empty()) return &r;
    }
    return nullptr;
  };
  auto verdict = [](bool met) { return met ? "MET" : "NOT MET"; };
  if (const Row* m = find("rls", "max")) {
    std::printf("- rls max >= 150k checks/s: %.0f, %s\n", m->checks_per_sec(),
                verdict(m->checks_per_sec() >= 150'000));
    std::printf("- rls server CPU <= 5 us per check at the max: %.2f, %s\n",
                m->server_us_per_check(), verdict(m->server_us_per_check() <= 5));
    if (const Row* n = find("rls-noop", "max")) {
      const double ratio = m->checks_per_sec() / std::max(1.0, n->checks_per_sec());
      std::printf("- rls max >= 0.8x rls-noop max: %.2fx (%.0f / %.0f), %s\n", ratio,
                  m->checks_per_sec(), n->checks_per_sec(), verdict(ratio >= 0.8));
    }
  }
  if (const Row* h = find("rls", "half")) {
    const bool met =
        h->us(0.99) <= 1000 && h->us(0.999) <= 3000 && h->errors == 0 && h->stats.unsent == 0;
    std::printf("- rls p99 <= 1 ms and p99.9 <= 3 ms at half load (%.0f/s): %.1f / %.1f us, %s\n",
                h->offered, h->us(0.99), h->us(0.999), verdict(met));
  }
  if (const Row* l = find("rls", "low")) {
    std::printf("- rls server CPU <= 15 us per check at %.0f/s: %.2f, %s\n", l->offered,
                l->server_us_per_check(), verdict(l->server_us_per_check() <= 15));
  }
  if (!sluiced_report.empty())
    std::printf("\n## sluiced log\n\n```\n%s\n```\n", sluiced_report.c_str());

  if (o.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Row& r : rows) {
      out.push_back(
          {{"target", r.target},
           {"phase", r.phase},
           {"sluiced", r.variant.empty() ? "under test" : r.variant},
           {"checks_per_sec", r.checks_per_sec()},
           {"p50_us", r.us(0.5)},
           {"p99_us", r.us(0.99)},
           {"p999_us", r.us(0.999)},
           {"errors", r.errors},
           {"unsent", r.stats.unsent},
           {"offered_per_sec", r.offered > 0 ? nlohmann::json(r.offered) : nlohmann::json()},
           {"gen_cores", r.gen_cores},
           {"server_cores", r.server_cores},
           {"server_us_per_check", r.server_us_per_check()},
           {"load_avg", r.load_avg}});
    }
    bench::print_json_rows(out);
  }
  return 0;
}
