// sluice-bench-keyspray: distinct keys at full speed into one sluiced under a memory cap, while hot
// keys are checked throughout.
//
// One run:
//   1. starts sluiced with `memory_cap_mb: --cap-mb` (256), its data directory (snapshots on, as
//      in production; --memory-only: none) and one worker thread, waits until it answers, lets it
//      sit idle for 2 s and takes its RSS (reported as "idle at start");
//   2. warms the --hot (1000) hot keys for --warm-seconds (10): each is checked every
//      --hot-period-ms (500), over one TCP connection, frames of the keys due every 10 ms; in its
//      last 2 s the spray sockets also send, as the spray will, but only 64 "warm" keys, so the
//      node's UDP path (receive buffers, batches of 64) has run. The RSS at the end of this phase
//      is the fixed overhead: the node having served both transports, its few counters the only
//      tables;
//   3. sprays --keys (10M) distinct keys, each once, over --spray-sockets UDP sockets, 64 checks
//      per datagram, 4 datagrams in flight per socket (closed loop: as fast as sluiced answers),
//      while the hot keys go on being checked;
//   4. checks the hot keys for --tail-seconds (5) more, then reads /metrics.
// RSS (/proc/PID/status VmRSS) is sampled every second, sluice_evictions_total and
// sluice_store_memory_bytes every 5 s (the row's "series", a progress line each); the peak is the
// larger of the samples and the VmHWM.
//
// Hot keys' counters: every key, hot or sprayed, has the same limit, --limit per minute (1000),
// 6-second buckets (the default for a minute, written in the rules), weighted estimator
// (docs/architecture.md, "Counting"). A hot key takes 120 hits a minute at the default period, so
// it is never denied and never the smallest counter of an eviction sample. The benchmark keeps the
// exact log of the hits each hot key was answered "allowed" for, each with the interval [sent,
// answered] (epoch ms, the node reads the same clock) that holds the time the node counted it. For
// every answer it computes the weighted estimate the node must hold: bounds [lo, hi] over those
// intervals (the estimate only grows with a hit's time and only falls with the time of evaluation
// inside a bucket; an answer whose own interval straddles a bucket boundary is not judged). The
// node's count is limit - remaining, and remaining = floor(limit - estimate), so it lies in
// [estimate, estimate + 1). A hot key is **reset** when that count is below lo - 1 (the node
// forgot hits it had counted: an evicted or re-created counter), **over** when above hi + 2 (it
// counted hits that were never sent): the estimator is recomputed, not approximated.
//
// Goals, in the row's "goals" (exit status 1 when one fails):
//   rss        peak RSS <= cap + the fixed overhead of step 2 (+ --rss-slack-mb, 0 but in CI:
//              keyspray_short allows 2 MiB, because at 1M keys and 32 MiB the tables' last growth
//              step leaves a margin that allocator slack of table rehashes can eat)
//   evictions  sluice_evictions_total{kind="live"} > 0 in /metrics (the cap was reached and the
//              node said so)
//   hot keys   0 resets (and 0 over-counts), no hot check failed or unanswered, sluiced alive
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/json_rows.h"
#include "common/metrics.h"
#include "common/process.h"
#include "common/scenario.h"
#include "load/driver.h"
#include "load/targets.h"
#include "scenarios/solo_node.h"
#include "wire/protocol.h"

namespace {

namespace bench = sluice::bench;
namespace wire = sluice::wire;

struct Options {
  bool json = false;
  uint64_t keys = 10'000'000;
  uint32_t hot = 1000;
  uint32_t cap_mb = 256;
  double hot_period_ms = 500;
  double warm_seconds = 10;
  double tail_seconds = 5;
  double max_seconds = 900;  // bound on the spray
  uint32_t spray_sockets = 4;
  double rss_slack_mb = 0;  // CI only (keyspray_short): allocator slack on top of the RSS bound
  bench::SoloNodeOptions node{1000};
};

// nullopt: run with o. Otherwise the exit status (common/scenario.h).
std::optional<int> parse(int argc, char** argv, Options& o) {
  bench::Cli cli("sluice-bench-keyspray");
  cli.keys(o.keys, 1, 1e9, "distinct keys to spray, each once");
  cli.number("--hot", o.hot, 1, 100'000, "hot keys checked throughout");
  cli.number("--cap-mb", o.cap_mb, 1, 1 << 20, "sluiced memory_cap_mb");
  cli.number("--hot-period-ms", o.hot_period_ms, 20, 60'000, "each hot key is checked every P ms");
  cli.number("--warm-seconds", o.warm_seconds, 0, 3600, "hot keys only, before the spray");
  cli.number("--tail-seconds", o.tail_seconds, 0, 3600, "hot keys only, after the spray");
  cli.number("--max-seconds", o.max_seconds, 1, 86'400, "the spray gives up after S seconds");
  cli.number("--spray-sockets", o.spray_sockets, 1, 64,
             "UDP sockets spraying, 4 datagrams of 64 checks in flight each");
  cli.number("--rss-slack-mb", o.rss_slack_mb, 0, 1024,
             "add M MiB to the RSS bound (the CI test's 2, see the file comment)");
  o.node.declare(cli);
  const std::optional<int> exit = cli.parse(argc, argv);
  o.json = cli.json;
  return exit;
}

constexpr int64_t kWindowMs = 60'000;  // the limit's window
constexpr int64_t kBucketMs = 6'000;  // and its bucket (the default for a minute), set in the rules
constexpr int64_t kBuckets = kWindowMs / kBucketMs;
constexpr uint32_t kSprayBatch = 64;
constexpr uint32_t kSprayWindow = 4;
constexpr int64_t kSprayTimeoutNs = 500'000'000;
constexpr int64_t kHotTickMs = 10;
constexpr int64_t kHotTimeoutNs = 5'000'000'000;  // a hot answer later than this is a failure

// ---- hot keys: the exact log and the estimate the node must hold ---------------------------

struct Hit {
  int64_t from_ms;  // sent (floor): the node counted it at or after this
  int64_t to_ms;    // answered (ceil): ... and at or before this
};

struct HotKey {
  std::string name;
  std::deque<Hit> hits;  // hits answered "allowed", oldest first; older than bucket c-n pruned
  bool in_flight = false;
  int64_t next_due_ms = 0;
};

int64_t window_bucket(int64_t t) {
  return t / kBucketMs;  // epoch ms are positive
}

// The weighted estimate at `now` (one-minute window of n = kBuckets buckets) of a hit at time `t`:
// the hits of the n buckets up to bucket(now) count 1, bucket(now) - n's count (B - elapsed) / B.
double weight(int64_t t, int64_t now) {
  const int64_t c = window_bucket(now);
  const int64_t b = window_bucket(t);
  if (b > c - kBuckets) return 1;
  if (b == c - kBuckets) return static_cast<double>(kBucketMs - (now - c * kBucketMs)) / kBucketMs;
  return 0;
}

struct HotTotals {
  uint64_t checks = 0;      // hot answers judged or not
  uint64_t judged = 0;      // answers compared with the log
  uint64_t straddling = 0;  // not judged: their own interval straddles a bucket boundary
  uint64_t resets = 0;      // node count below the log's lower bound - 1
  uint64_t over = 0;        // node count above the log's upper bound + 2
  uint64_t denied = 0;      // hot checks denied (the limit is meant to allow them all)
  uint64_t failed = 0;      // error answers, malformed or late (over kHotTimeoutNs) answers
  uint64_t skipped = 0;     // a key's check was due while its previous one was in flight
  double max_deficit = 0;   // largest lo - node count seen
  std::string first_reset;  // the first reset, for the report
};

// sluiced's /metrics, or no samples when it cannot be read.
std::vector<bench::MetricSample> scrape(uint16_t admin) {
  std::string body;
  if (const std::string err = bench::http_get(admin, "/metrics", body); !err.empty()) {
    std::fprintf(stderr, "/metrics: %s\n", err.c_str());
    return {};
  }
  return bench::parse_metrics(body);
}

double evictions(const std::vector<bench::MetricSample>& m, const char* kind) {
  return bench::metric_sum(m, "sluice_evictions_total", std::string("kind=\"") + kind + "\"");
}

// ---- the run ------------------------------------------------------------------------------------

// What the loop does besides reading answers and sampling: the hot keys are checked in every
// phase but the last, which only waits (bounded) for their last answers.
enum class Phase {
  kHot,      // hot keys only
  kWarmUdp,  // the spray sockets send the 64 warm keys
  kSpray,    // the spray sockets send the spray's keys, until all are sent and answered
  kDrain,
};

class KeySpray {
 public:
  KeySpray(const Options& o, uint16_t port, uint16_t admin, pid_t pid)
      : o_(o), admin_(admin), pid_(pid), hot_(o.hot) {
    const auto period = static_cast<int64_t>(o.hot_period_ms);
    const int64_t start = bench::epoch_ms() + 20;
    for (uint32_t i = 0; i < o.hot; ++i) {
      hot_[i].name = "h" + std::to_string(i);
      hot_[i].next_due_ms = start + period * i / o.hot;  // spread evenly over one period
    }
    std::string err;
    hot_fd_ = bench::tcp_connect(port, 2'000, err);
    if (hot_fd_ < 0) throw std::runtime_error("hot connection: " + err);
    for (uint32_t i = 0; i < o.spray_sockets; ++i)
      spray_.push_back(SpraySocket{bench::udp_to_node(port, true), {}});
  }
  ~KeySpray() {
    ::close(hot_fd_);
    for (SpraySocket& s : spray_)
      ::close(s.fd);
  }

  // Runs the phases; every loop is bounded in time (and by the iteration guard).
  void run() {
    t0_ns_ = bench::now_ns();
    sample(true);
    const int64_t warm_end = t0_ns_ + static_cast<int64_t>(o_.warm_seconds * 1e9);
    drive_until(warm_end - 2'000'000'000, Phase::kHot);
    drive_until(warm_end, Phase::kWarmUdp);
    drive_until(bench::now_ns() + 600'000'000, Phase::kHot);  // the warm datagrams' answers
    counts.warm_checks = counts.spray_answered;               // errors and losses stay counted
    counts.spray_answered = 0;
    sample(true);
    counts.overhead_kb = bench::proc_status_kb(pid_);
    counts.overhead_anon_kb = bench::proc_status_kb(pid_, "RssAnon");
    counts.overhead_file_kb = bench::proc_status_kb(pid_, "RssFile");
    const int64_t spray_start_ns = bench::now_ns();
    drive_until(spray_start_ns + static_cast<int64_t>(o_.max_seconds * 1e9), Phase::kSpray);
    const int64_t spray_end_ns = bench::now_ns();
    counts.spray_seconds = static_cast<double>(spray_end_ns - spray_start_ns) / 1e9;
    drive_until(spray_end_ns + static_cast<int64_t>(o_.tail_seconds * 1e9), Phase::kHot);
    // Let the last hot answers arrive (bounded): their checks were counted by the node.
    drive_until(bench::now_ns() + 2'000'000'000, Phase::kDrain);
    counts.hot.failed += hot_requests_.size();  // never answered
    sample(true);
  }

  // What the run counted, read after run().
  struct Counts {
    uint64_t sprayed = 0, spray_answered = 0, spray_lost = 0, spray_errors = 0, spray_no_room = 0;
    uint64_t warm_checks = 0;
    uint64_t overhead_kb = 0, overhead_anon_kb = 0, overhead_file_kb = 0;  // end of warm-up
    uint64_t peak_kb = 0;                                                  // the largest RSS sample
    double spray_seconds = 0;
    double store_memory_max = -1;  // the largest sluice_store_memory_bytes scraped (-1: none)
    HotTotals hot;
    bench::Row series = bench::Row::array();
  } counts;

  bool spray_done() const { return counts.sprayed >= o_.keys; }

 private:
  struct SprayInFlight {
    uint64_t id;
    int64_t sent_ns;
  };
  struct SpraySocket {
    int fd;
    std::vector<SprayInFlight> inflight;
  };
  struct HotRequest {
    int64_t sent_ns;
    int64_t from_ms;
    std::vector<uint32_t> keys;
  };

  void drive_until(int64_t end_ns, Phase phase) {
    phase_ = phase;
    std::vector<pollfd> fds;
    int64_t next_tick_ms = 0;
    const uint64_t guard =
        static_cast<uint64_t>(std::max<int64_t>(end_ns - bench::now_ns(), 0) / 100) + 1000;
    for (uint64_t iter = 0; iter < guard && !bench::stop_requested(); ++iter) {
      if (bench::now_ns() >= end_ns) break;
      const bool spray_idle = std::all_of(spray_.begin(), spray_.end(),
                                          [](const SpraySocket& s) { return s.inflight.empty(); });
      if (phase == Phase::kSpray && spray_done() && spray_idle) break;
      if (phase == Phase::kDrain && hot_requests_.empty()) break;
      const int64_t now_ms = bench::epoch_ms();
      if (phase != Phase::kDrain && now_ms >= next_tick_ms) {
        send_hot_due(now_ms);
        next_tick_ms = now_ms + kHotTickMs;
      }
      fds.assign(1,
                 pollfd{hot_fd_, static_cast<short>(POLLIN | (hot_out_.empty() ? 0 : POLLOUT)), 0});
      for (SpraySocket& s : spray_) {
        if (phase == Phase::kWarmUdp || phase == Phase::kSpray) refill(s);
        fds.push_back(pollfd{s.fd, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 1) > 0) {
        if (fds[0].revents & POLLOUT) flush_hot();
        if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) read_hot();
        for (size_t i = 0; i < spray_.size(); ++i) {
          if (fds[i + 1].revents & (POLLIN | POLLERR)) read_spray(spray_[i]);
        }
      }
      expire(bench::now_ns());
      if (bench::now_ns() >= next_sample_ns_) sample(false);
    }
  }

  // ---- hot keys ----

  void send_hot_due(int64_t now_ms) {
    const auto period = static_cast<int64_t>(o_.hot_period_ms);
    std::vector<uint32_t> due;
    for (uint32_t i = 0; i < hot_.size(); ++i) {
      HotKey& k = hot_[i];
      if (k.next_due_ms > now_ms) continue;
      k.next_due_ms += period * ((now_ms - k.next_due_ms) / period + 1);
      if (k.in_flight) {
        ++counts.hot.skipped;
        continue;
      }
      k.in_flight = true;
      due.push_back(i);
    }
    if (due.empty()) return;
    const uint64_t id = ++next_id_;
    bench::encode_checks(
        id, due.size(), [&](size_t j) { return std::string_view(hot_[due[j]].name); }, msg_);
    wire::append_frame(msg_, hot_out_);
    hot_requests_.emplace(id, HotRequest{bench::now_ns(), bench::epoch_ms(), std::move(due)});
    flush_hot();
  }

  void flush_hot() {
    while (!hot_out_.empty()) {
      const ssize_t n = ::send(hot_fd_, hot_out_.data(), hot_out_.size(), MSG_NOSIGNAL);
      if (n > 0) {
        hot_out_.erase(hot_out_.begin(), hot_out_.begin() + n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      throw std::runtime_error(std::string("hot connection: send: ") + std::strerror(errno));
    }
  }

  void read_hot() {
    for (int pass = 0; pass < 64; ++pass) {
      const ssize_t n = ::recv(hot_fd_, recv_buf_.data(), recv_buf_.size(), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      if (n <= 0) {
        throw std::runtime_error("hot connection closed by sluiced" +
                                 (n < 0 ? std::string(": ") + std::strerror(errno) : ""));
      }
      reader_.feed({recv_buf_.data(), static_cast<size_t>(n)});
      const int64_t to_ms = std::chrono::ceil<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
      while (auto frame = reader_.next()) {
        const auto it = wire::decode_answer(*frame, answer_) == wire::Code::kOk
                            ? hot_requests_.find(answer_.id)
                            : hot_requests_.end();
        if (it == hot_requests_.end()) {
          ++counts.hot.failed;
          continue;
        }
        const HotRequest req = std::move(it->second);
        hot_requests_.erase(it);
        const bool usable =
            answer_.code == wire::Code::kOk && answer_.decisions.size() == req.keys.size();
        for (size_t j = 0; j < req.keys.size(); ++j) {
          HotKey& k = hot_[req.keys[j]];
          k.in_flight = false;
          ++counts.hot.checks;
          if (!usable || answer_.decisions[j].code != wire::Code::kOk ||
              answer_.decisions[j].limits.empty()) {
            ++counts.hot.failed;
            continue;
          }
          judge(k, answer_.decisions[j], req.from_ms, to_ms);
        }
      }
      if (reader_.failed()) throw std::runtime_error("hot connection: bad frame from sluiced");
    }
  }

  // Compares the node's count for one hot key with the log (see the file comment).
  void judge(HotKey& k, const wire::Decision& d, int64_t from_ms, int64_t to_ms) {
    if (d.allowed)
      k.hits.push_back(Hit{from_ms, to_ms});
    else
      ++counts.hot.denied;  // not counted (count_denied: false)
    // Hits that ended before bucket(now) - n weigh nothing at any later evaluation.
    const int64_t keep_from = (window_bucket(from_ms) - kBuckets) * kBucketMs;
    while (!k.hits.empty() && k.hits.front().to_ms < keep_from)
      k.hits.pop_front();
    if (window_bucket(from_ms) != window_bucket(to_ms)) {
      ++counts.hot.straddling;
      return;
    }
    double lo = 0, hi = 0;
    for (const Hit& h : k.hits) {
      lo += weight(h.from_ms, to_ms);
      hi += weight(h.to_ms, from_ms);
    }
    const uint64_t remaining = d.limits.front().remaining;
    const double node = static_cast<double>(o_.node.limit) -
                        static_cast<double>(std::min(remaining, o_.node.limit));
    ++counts.hot.judged;
    if (node > hi + 2) ++counts.hot.over;
    if (node >= lo - 1) return;
    ++counts.hot.resets;
    counts.hot.max_deficit = std::max(counts.hot.max_deficit, lo - node);
    if (counts.hot.first_reset.empty()) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "%s at %.1f s: node count %.0f (remaining %" PRIu64 "), log says %.2f..%.2f",
                    k.name.c_str(), static_cast<double>(bench::now_ns() - t0_ns_) / 1e9, node,
                    remaining, lo, hi);
      counts.hot.first_reset = buf;
    }
  }

  // ---- spray ----

  void refill(SpraySocket& s) {
    const bool warm = phase_ == Phase::kWarmUdp;
    while (s.inflight.size() < kSprayWindow && (warm || counts.sprayed < o_.keys)) {
      const uint64_t n =
          warm ? kSprayBatch : std::min<uint64_t>(kSprayBatch, o_.keys - counts.sprayed);
      names_.resize(n);
      for (uint64_t j = 0; j < n; ++j)
        names_[j] = warm ? "w" + std::to_string(j) : "s" + std::to_string(counts.sprayed + j);
      const uint64_t id = ++next_id_;
      bench::encode_checks(
          id, n, [&](size_t j) { return std::string_view(names_[j]); }, msg_);
      if (::send(s.fd, msg_.data(), msg_.size(), 0) < 0) {
        if (errno == EAGAIN || errno == ENOBUFS || errno == EINTR) return;  // retry next pass
        throw std::runtime_error(std::string("spray: send: ") + std::strerror(errno));
      }
      if (!warm) counts.sprayed += n;
      s.inflight.push_back(SprayInFlight{id, bench::now_ns()});
    }
  }

  void read_spray(SpraySocket& s) {
    for (int pass = 0; pass < 64; ++pass) {
      const ssize_t n = ::recv(s.fd, recv_buf_.data(), recv_buf_.size(), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n < 0) throw std::runtime_error(std::string("spray: recv: ") + std::strerror(errno));
      if (wire::decode_answer({recv_buf_.data(), static_cast<size_t>(n)}, answer_) !=
          wire::Code::kOk) {
        ++counts.spray_errors;
        continue;
      }
      const auto it = std::find_if(s.inflight.begin(), s.inflight.end(),
                                   [&](const SprayInFlight& f) { return f.id == answer_.id; });
      if (it == s.inflight.end()) continue;  // late: already counted as lost
      s.inflight.erase(it);
      if (answer_.code != wire::Code::kOk) {
        ++counts.spray_errors;
        continue;
      }
      for (const wire::Decision& d : answer_.decisions) {
        ++counts.spray_answered;
        counts.spray_no_room += d.code == wire::Code::kNoRoom ? 1 : 0;
        counts.spray_errors += d.code != wire::Code::kOk && d.code != wire::Code::kNoRoom ? 1 : 0;
      }
    }
  }

  void expire(int64_t now) {
    for (SpraySocket& s : spray_) {
      const auto old =
          std::remove_if(s.inflight.begin(), s.inflight.end(),
                         [&](const SprayInFlight& f) { return now - f.sent_ns > kSprayTimeoutNs; });
      counts.spray_lost += static_cast<uint64_t>(s.inflight.end() - old);
      s.inflight.erase(old, s.inflight.end());
    }
    for (const auto& [id, r] : hot_requests_) {
      if (now - r.sent_ns > kHotTimeoutNs)
        throw std::runtime_error("a hot check went unanswered for 5 s over TCP (sluiced stuck?)");
    }
  }

  // One RSS sample of the series (and a progress line); the evictions every 5th, or when forced.
  void sample(bool force_metrics) {
    const int64_t now = bench::now_ns();
    next_sample_ns_ = now + 1'000'000'000;
    const uint64_t rss_kb = bench::proc_status_kb(pid_);
    counts.peak_kb = std::max(counts.peak_kb, rss_kb);
    bench::Row j = {{"t_s", static_cast<double>(now - t0_ns_) / 1e9},
                    {"rss_kb", rss_kb},
                    {"sprayed", counts.sprayed},
                    {"hot_judged", counts.hot.judged},
                    {"hot_resets", counts.hot.resets}};
    if (force_metrics || counts.series.size() % 5 == 0) {
      if (const auto m = scrape(admin_); !m.empty()) {
        j["evictions_live"] = evictions(m, "live");
        j["evictions_expired"] = evictions(m, "expired");
        const double store = bench::metric_sum(m, "sluice_store_memory_bytes");
        j["store_memory_bytes"] = store;
        counts.store_memory_max = std::max(counts.store_memory_max, store);
      }
    }
    bench::print_row_text(j);
    std::fflush(stdout);
    counts.series.push_back(std::move(j));
  }

  const Options& o_;
  uint16_t admin_;
  pid_t pid_;
  std::vector<HotKey> hot_;
  int hot_fd_ = -1;
  std::vector<SpraySocket> spray_;
  std::vector<uint8_t> hot_out_;
  wire::FrameReader reader_;
  std::unordered_map<uint64_t, HotRequest> hot_requests_;
  std::vector<uint8_t> recv_buf_ = std::vector<uint8_t>(wire::kMaxDatagramBytes);
  std::vector<uint8_t> msg_;
  std::vector<std::string> names_;
  wire::Answer answer_;
  uint64_t next_id_ = 0;
  Phase phase_ = Phase::kHot;
  int64_t t0_ns_ = 0, next_sample_ns_ = 0;
};

int run(const Options& o) {
  bench::Rows rows(o.json);
  bench::SoloNode node(o.node, "sluice-bench-keyspray",
                       "        granularity: " + std::to_string(kBucketMs) + "ms\n",
                       "memory_cap_mb: " + std::to_string(o.cap_mb) + "\n");
  bench::SluicedChild& sluiced = node.child;
  const pid_t pid = node.pid();
  // sluice_probe made one counter (its own key), before the idle RSS is taken.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const uint64_t idle_kb = bench::proc_status_kb(pid);

  KeySpray spray(o, sluiced.port, sluiced.admin_port, pid);
  std::string fatal;
  try {
    spray.run();
  } catch (const std::exception& e) {
    fatal = e.what();
    std::fprintf(stderr, "sluice-bench-keyspray: run stopped: %s\n", fatal.c_str());
  }
  const bool alive = sluiced.process.running();
  const uint64_t hwm_kb = bench::proc_status_kb(pid, "VmHWM");
  const std::vector<bench::MetricSample> m = scrape(sluiced.admin_port);
  const double ev_live = evictions(m, "live");
  if (bench::stop_requested()) return 1;

  const KeySpray::Counts& c = spray.counts;
  const uint64_t peak_kb = std::max(hwm_kb, c.peak_kb);
  const auto slack_kb = static_cast<uint64_t>(o.rss_slack_mb * 1024);
  const uint64_t bound_kb = uint64_t{o.cap_mb} * 1024 + c.overhead_kb + slack_kb;
  const HotTotals& h = c.hot;
  const bool rss_ok = peak_kb <= bound_kb;
  const bool ev_ok = ev_live > 0;
  const bool hot_ok = fatal.empty() && alive && spray.spray_done() && h.resets == 0 &&
                      h.over == 0 && h.failed == 0 && h.judged > 0;
  rows.add({{"target", "sluiced"},
            {"keys", o.keys},
            {"sprayed", c.sprayed},
            {"hot", o.hot},
            {"cap_mb", o.cap_mb},
            {"limit_per_minute", o.node.limit},
            {"spray_seconds", c.spray_seconds},
            {"spray_answered", c.spray_answered},
            {"spray_lost", c.spray_lost},
            {"spray_no_room", c.spray_no_room},
            {"spray_errors", c.spray_errors},
            {"warm_checks", c.warm_checks},
            {"idle_rss_kb", idle_kb},
            {"overhead_rss_kb", c.overhead_kb},
            {"overhead_anon_kb", c.overhead_anon_kb},
            {"overhead_file_kb", c.overhead_file_kb},
            {"end_anon_kb", bench::proc_status_kb(pid, "RssAnon")},
            {"end_file_kb", bench::proc_status_kb(pid, "RssFile")},
            {"memory_only", o.node.memory_only},
            {"peak_rss_kb", peak_kb},
            {"rss_max_mb", static_cast<double>(peak_kb) / 1024},  // the same peak, in MiB
            {"vmhwm_kb", hwm_kb},
            {"evictions_live", ev_live},
            {"evictions_expired", evictions(m, "expired")},
            {"no_room", bench::metric_sum(m, "sluice_no_room_total")},
            {"table_bytes", bench::metric_sum(m, "sluice_table_bytes")},
            {"table_cap_bytes", bench::metric_sum(m, "sluice_memory_cap_bytes")},
            // At the end: the huge pages tables share (all of them count against the cap), the
            // free units in them, and what other nodes reported (0 for a node on its own).
            {"shared_pages_bytes", bench::metric_sum(m, "sluice_table_shared_pages_bytes")},
            {"shared_free_bytes", bench::metric_sum(m, "sluice_table_shared_free_bytes")},
            {"remote_state_bytes", bench::metric_sum(m, "sluice_remote_state_bytes")},
            // What RocksDB holds (memtables, table readers, block cache; -1 with --memory-only), at
            // the end and the most a scrape saw (every 5 s, so not necessarily its peak).
            {"store_memory_bytes", bench::metric_sum(m, "sluice_store_memory_bytes")},
            {"store_memtable_bytes",
             bench::metric_sum(m, "sluice_store_memory_bytes", "kind=\"memtables\"")},
            {"store_memory_max_bytes", c.store_memory_max},
            {"hot_checks", h.checks},
            {"hot_judged", h.judged},
            {"hot_straddling", h.straddling},
            {"hot_denied", h.denied},
            {"hot_failed", h.failed},
            {"hot_skipped", h.skipped},
            {"hot_resets", h.resets},
            {"hot_over", h.over},
            {"hot_max_deficit", h.max_deficit},
            {"hot_first_reset", h.first_reset},
            {"run_stopped", fatal},
            {"sluiced_exit", alive ? "" : sluiced.process.exit_status()},
            {"series", c.series},
            {"goals",
             {{"rss", {{"pass", rss_ok}, {"bound_kb", bound_kb}, {"slack_kb", slack_kb}}},
              {"evictions", {{"pass", ev_ok}}},
              {"hot_keys", {{"pass", hot_ok}}},
              {"sluiced_alive", alive}}}});
  rows.finish();
  return rss_ok && ev_ok && hot_ok ? 0 : 1;
}

}  // namespace

int bench_keyspray_main(int argc, char** argv) {
  Options o;
  if (const std::optional<int> exit = parse(argc, argv, o)) return *exit;
  return bench::run_stoppable("sluice-bench-keyspray", [&] { return run(o); });
}
