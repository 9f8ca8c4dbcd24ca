// sluice-bench-soak: one sluiced under a steady load for a long time.
//
// One run: starts sluiced (one worker thread by default: the generator has the other core), then
//   0. preload: every key is checked once (UDP, 64 checks a datagram, one in flight), so the
//      tables hold the whole keyspace before anything is measured: RSS then follows the steady
//      state rather than a Zipf tail still being discovered (at 20k checks/s a third of the 100k
//      keys are first seen after 10 s);
//   1. probe: measures its maximum with the soak's own mix, closed loop, for --probe-seconds
//      (skipped with --rate);
//   2. soak: offers --load (80 %) of that maximum, open loop, for --seconds (600): half the rate
//      over UDP (generator thread 0: --udp-sockets sockets x 8 datagrams of 1 check), half over
//      TCP (thread 1: --connections connections x 32 frames of 1 check), --keys (100k) keys drawn
//      Zipf(0.99), every key limited to --limit per minute (so the hottest keys are denied and both
//      decisions are exercised).
// The row holds, every --interval (10 s), sluiced's RSS (/proc/PID/status VmRSS) and the
// interval's figures (a progress line each as it ends); every --window (60 s, "minute") p50/p99
// latency, errors, decisions and the window's highest RSS sample (not a goal: with snapshots on
// RSS cycles as RocksDB memtables fill and are flushed; a leak raises the highs). Errors are
// everything that is not a well-formed answer in time: error replies and malformed answers,
// UDP requests unanswered within 200 ms, sends refused by the kernel, connections that failed.
// Open-loop units still unsent when the run ends are reported apart as `unsent` (every window was
// full: the server fell behind, or the generator overslept its last tick); they are not answers
// that went wrong, so they are not errors, and a server that falls behind shows in p99 anyway.
//
// Goals, in the row's "goals" (exit status 1 when one fails):
//   rss      every RSS sample after --rss-after (60 s) within +-5 % of the sample at --rss-after
//   p99      p99 of the last window <= --p99-ratio (1.2) x p99 of the first window
//   errors   0 over the whole soak
//   rate     the answered checks/s over the soak >= 95 % of the offered rate: a soak that fell
//            behind its schedule (the machine's other work, or a maximum measured in a quiet
//            moment) ran closed loop in effect, and its p99 is that of a saturated server
// The CI test (CTest soak_short) runs 30 s at a fixed moderate --rate with --window 10
// --rss-after 10 and a generous --p99-ratio (10): a loaded CI machine must not fail it on
// latency. It runs --memory-only: with snapshots on, the RocksDB memtable of the counters (64 MiB
// write buffers) fills for minutes at a moderate rate, which 30 s cannot tell from a leak. The
// long run keeps snapshots on, and its goals are the defaults above.
//
// Latency is answer time minus send time (load/driver.h); how late units left against their
// schedule is the send lag, reported per window beside it.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/json_rows.h"
#include "common/process.h"
#include "common/scenario.h"
#include "load/driver.h"
#include "load/targets.h"
#include "scenarios/solo_node.h"
#include "wire/protocol.h"

namespace {

namespace bench = sluice::bench;

struct Options {
  bool json = false;
  double seconds = 600;
  double rate = 0;  // 0: measure the maximum first
  double load = 0.8;
  double probe_seconds = 10;
  double interval = 10;
  double window = 60;
  double rss_after = 60;
  double rss_band = 0.05;
  double p99_ratio = 1.2;
  uint32_t keys = 100'000;
  uint32_t udp_sockets = 8;
  uint32_t connections = 8;
  bench::SoloNodeOptions node{10'000};
};

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse(int argc, char** argv, Options& o) {
  bench::Cli cli("sluice-bench-soak");
  cli.seconds(o.seconds, 1, 86'400, "soak length");
  cli.number("--rate", o.rate, 0, 1e8,
             "offered checks/s (half UDP, half TCP); 0 = --load x the maximum measured first "
             "with a closed-loop probe");
  cli.number("--load", o.load, 0.01, 1, "share of the measured maximum to offer");
  cli.number("--probe-seconds", o.probe_seconds, 1, 600, "length of the closed-loop probe");
  cli.number("--interval", o.interval, 1, 3600, "RSS sample and progress line every S seconds");
  cli.number("--window", o.window, 1, 86'400,
             "latency / error / decision figures and the p99 goal per S seconds");
  cli.number("--rss-after", o.rss_after, 1, 86'400,
             "RSS goal: samples after S seconds stay within the band of the one at S");
  cli.number("--rss-band", o.rss_band, 0, 1, "that band, +-F");
  cli.number("--p99-ratio", o.p99_ratio, 1, 1000,
             "p99 goal: last window's p99 <= X x the first window's");
  cli.keys(o.keys, 1, 10'000'000, "keyspace, Zipf(0.99)");
  cli.number("--udp-sockets", o.udp_sockets, 1, 256,
             "UDP sockets, 8 datagrams of 1 check in flight each at most");
  cli.number("--connections", o.connections, 1, 256,
             "TCP connections, 32 frames of 1 check in flight each at most");
  o.node.declare(cli);
  if (const std::optional<int> exit = cli.parse(argc, argv)) return exit;
  o.json = cli.json;
  // The goals compare whole windows of whole intervals.
  const auto whole = [&](double s) {
    return std::abs(s / o.interval - std::round(s / o.interval)) <= 1e-9;
  };
  if (!whole(o.window)) return cli.fail("--window must be a multiple of --interval");
  if (!whole(o.rss_after)) return cli.fail("--rss-after must be a multiple of --interval");
  if (o.seconds < o.rss_after + o.interval)
    return cli.fail("--seconds must exceed --rss-after by an interval");
  if (o.seconds < 2 * o.window) return cli.fail("--seconds must hold at least two windows");
  return std::nullopt;
}

// Checks every key once over UDP, one datagram of up to 64 checks at a time (bounded: a datagram
// unanswered within 1 s is sent again, at most 5 times). Throws when sluiced does not answer.
void preload(uint16_t port, const bench::Keyspace& keys) {
  const int fd = bench::udp_to_node(port, false);
  timeval tv{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::vector<uint8_t> msg, buf(sluice::wire::kMaxDatagramBytes);
  sluice::wire::Answer answer;
  uint64_t id = 0;
  for (size_t from = 0; from < keys.names.size() && !bench::stop_requested(); from += 64) {
    bench::encode_checks(
        ++id, std::min<size_t>(64, keys.names.size() - from),
        [&](size_t j) { return std::string_view(keys.names[from + j]); }, msg);
    bool answered = false;
    for (int attempt = 0; attempt < 5 && !answered; ++attempt) {
      if (::send(fd, msg.data(), msg.size(), 0) < 0) continue;
      for (int r = 0; r < 8 && !answered; ++r) {  // skip answers to earlier attempts
        const ssize_t got = ::recv(fd, buf.data(), buf.size(), 0);
        if (got < 0) break;  // timed out: send again
        answered = sluice::wire::decode_answer({buf.data(), static_cast<size_t>(got)}, answer) ==
                       sluice::wire::Code::kOk &&
                   answer.id == id;
      }
    }
    if (!answered) {
      ::close(fd);
      throw std::runtime_error("preload: sluiced did not answer a datagram 5 times");
    }
  }
  ::close(fd);
}

uint64_t error_count(const bench::RowStats& s) {
  return s.errors + s.lost + s.send_failures + s.conn_failures;
}

double us(const bench::LatencyHistogram& h, double q) {
  return static_cast<double>(h.quantile_ns(q)) / 1000.0;
}

bench::Row stats_json(const bench::RowStats& s, double seconds) {
  return {{"checks", s.checks},
          {"checks_per_sec", seconds > 0 ? static_cast<double>(s.checks) / seconds : 0},
          {"allowed", s.checks - std::min(s.checks, s.denied)},
          {"denied", s.denied},
          {"p50_us", us(s.latency, 0.5)},
          {"p99_us", us(s.latency, 0.99)},
          {"p999_us", us(s.latency, 0.999)},
          {"max_us", static_cast<double>(s.latency.max_ns()) / 1000.0},
          {"send_lag_p99_us", us(s.send_lag, 0.99)},
          {"errors", error_count(s)},
          {"malformed_or_error_replies", s.errors},
          {"timeouts", s.lost},
          {"send_failures", s.send_failures},
          {"conn_failures", s.conn_failures},
          {"unsent", s.unsent},
          {"late_answers", s.late_answers},
          {"first_error", s.first_error}};
}

// One interval of the soak as the driver reports it: generator thread 0 spoke UDP, thread 1 TCP.
struct Interval {
  double end_s = 0;  // seconds since the soak started
  double seconds = 0;
  uint64_t rss_kb = 0;
  bench::RowStats udp, tcp, both;
};

int run(const Options& o) {
  bench::Rows rows(o.json);
  bench::SoloNode node(o.node, "sluice-bench-soak");
  bench::SluicedChild& sluiced = node.child;
  const pid_t pid = node.pid();
  const uint64_t rss_start_kb = bench::proc_status_kb(pid);
  const bench::Keyspace keys(o.keys);
  preload(sluiced.port, keys);
  const uint64_t rss_preloaded_kb = bench::proc_status_kb(pid);

  // The mix: thread 0 gets the UDP sockets (datagrams of 1 check, 8 in flight each), thread 1 the
  // TCP connections (frames of 1 check, 32 in flight each); drive() spreads conns evenly, so both
  // get max(udp_sockets, connections).
  bench::SluiceConnOptions udp, tcp;
  udp.port = tcp.port = sluiced.port;
  udp.keys = tcp.keys = &keys;
  udp.window = 8;
  tcp.window = 32;
  udp.udp_room_per_check = 288;  // libsluice's default udp_answer_room_per_check
  const bench::ConnFactory factory = [&](bench::ThreadContext& ctx) {
    return ctx.thread_index == 0 ? bench::make_sluice_udp(udp, ctx)
                                 : bench::make_sluice_tcp(tcp, ctx);
  };
  bench::DriveOptions d;
  d.threads = 2;
  d.conns = 2 * std::max(o.udp_sockets, o.connections);
  d.keys = o.keys;
  d.zipf = true;

  // 1. The maximum, closed loop, with the same mix.
  double max_rate = 0;
  double rate = o.rate;
  if (rate <= 0) {
    d.warmup_s = 1;
    d.seconds = o.probe_seconds;
    d.seed = 7;
    const bench::RowStats probe = bench::drive(d, factory);
    max_rate = static_cast<double>(probe.checks) / probe.seconds;
    rate = std::floor(max_rate * o.load);
  }
  if (bench::stop_requested()) return 1;

  // 2. The soak, open loop, reported by interval (a progress line each). The driver calls
  // on_interval once per interval, in order, under its own lock.
  std::vector<Interval> iv;
  d.rate = rate;
  d.warmup_s = 0;  // every answer counts; the first window is the warm-up the RSS goal skips
  d.seconds = o.seconds;
  d.seed = 11;
  d.interval_s = o.interval;
  d.on_interval = [&](unsigned index, const std::vector<bench::RowStats>& by_thread) {
    Interval& i = iv.emplace_back();
    i.end_s = std::min(o.seconds, (index + 1) * o.interval);
    i.seconds = i.end_s - index * o.interval;
    i.rss_kb = bench::proc_status_kb(pid);
    i.udp = i.both = by_thread[0];
    if (by_thread.size() > 1) i.tcp = by_thread[1];
    i.both.merge(i.tcp);
    bench::print_row_text({{"t_s", i.end_s},
                           {"rss_kb", i.rss_kb},
                           {"checks_per_sec", static_cast<double>(i.both.checks) / i.seconds},
                           {"p99_us", us(i.both.latency, 0.99)},
                           {"errors", error_count(i.both)}});
    std::fflush(stdout);
  };
  const bench::RowStats total = bench::drive(d, factory);
  const uint64_t rss_end_kb = bench::proc_status_kb(pid);
  const uint64_t hwm_kb = bench::proc_status_kb(pid, "VmHWM");
  const bool alive = sluiced.process.running();
  if (bench::stop_requested()) return 1;

  bench::Row ivs = bench::Row::array(), wins = bench::Row::array();
  for (const Interval& i : iv) {
    bench::Row j = stats_json(i.both, i.seconds);
    j["end_s"] = i.end_s;
    j["rss_kb"] = i.rss_kb;
    j["udp"] = stats_json(i.udp, i.seconds);
    j["tcp"] = stats_json(i.tcp, i.seconds);
    ivs.push_back(std::move(j));
  }
  // Whole windows only, each with its highest RSS sample.
  const auto per_window = static_cast<size_t>(std::lround(o.window / o.interval));
  double p99_first = 0, p99_last = 0;
  for (size_t w = 0; (w + 1) * per_window <= iv.size(); ++w) {
    bench::RowStats s;
    uint64_t high = 0;
    for (size_t k = w * per_window; k < (w + 1) * per_window; ++k) {
      s.merge(iv[k].both);
      high = std::max(high, iv[k].rss_kb);
    }
    bench::Row j = stats_json(s, o.window);
    j["end_s"] = iv[(w + 1) * per_window - 1].end_s;
    j["rss_high_kb"] = high;
    wins.push_back(std::move(j));
    p99_last = us(s.latency, 0.99);
    if (w == 0) p99_first = p99_last;
  }

  // Goals.
  const auto ref_index = static_cast<size_t>(std::lround(o.rss_after / o.interval)) - 1;
  double rss_ref = 0, rss_lo = 0, rss_hi = 0;
  bool rss_ok = ref_index + 1 < iv.size();
  if (rss_ok) {
    rss_ref = rss_lo = rss_hi = static_cast<double>(iv[ref_index].rss_kb);
    for (size_t k = ref_index; k < iv.size(); ++k) {
      rss_lo = std::min(rss_lo, static_cast<double>(iv[k].rss_kb));
      rss_hi = std::max(rss_hi, static_cast<double>(iv[k].rss_kb));
    }
    rss_ok = rss_hi <= rss_ref * (1 + o.rss_band) && rss_lo >= rss_ref * (1 - o.rss_band);
  }
  const bool p99_ok = wins.size() >= 2 && p99_last <= o.p99_ratio * p99_first;
  const bool errors_ok = error_count(total) == 0;
  const double achieved = static_cast<double>(total.checks) / o.seconds;
  const bool rate_ok = achieved >= 0.95 * rate;

  rows.add({{"target", "sluiced"},
            {"transport", "udp+tcp"},
            {"seconds", o.seconds},
            {"keys", o.keys},
            {"limit_per_minute", o.node.limit},
            {"server_threads", o.node.server_threads},
            {"memory_only", o.node.memory_only},
            {"max_checks_per_sec", max_rate},
            {"offered_checks_per_sec", rate},
            {"interval_s", o.interval},
            {"window_s", o.window},
            {"rss_start_kb", rss_start_kb},
            {"rss_preloaded_kb", rss_preloaded_kb},
            {"rss_end_kb", rss_end_kb},
            {"rss_peak_kb", hwm_kb},
            {"sluiced_exit", alive ? "" : sluiced.process.exit_status()},
            {"intervals", ivs},
            {"windows", wins},
            {"total", stats_json(total, o.seconds)},
            {"goals",
             {{"rss",
               {{"pass", rss_ok},
                {"after_s", o.rss_after},
                {"band", o.rss_band},
                {"ref_kb", rss_ref},
                {"min_kb", rss_lo},
                {"max_kb", rss_hi}}},
              {"p99",
               {{"pass", p99_ok},
                {"ratio_max", o.p99_ratio},
                {"first_us", p99_first},
                {"last_us", p99_last}}},
              {"errors", {{"pass", errors_ok}, {"count", error_count(total)}}},
              {"rate", {{"pass", rate_ok}, {"achieved", achieved}, {"offered", rate}}},
              {"sluiced_alive", alive}}}});
  rows.finish();
  return alive && rss_ok && p99_ok && errors_ok && rate_ok ? 0 : 1;
}

}  // namespace

int bench_soak_main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> exit = parse(argc, argv, o)) return *exit;
  return bench::run_stoppable("sluice-bench-soak", [&] { return run(o); });
}
