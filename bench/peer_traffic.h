// Helpers of sluice-bench-cluster's peer-traffic scenario (scenarios/cluster.cc, run_peer_traffic):
// what the nodes send each other over the peer port while clients check many keys.
//
//   KeySweepLoad: open-loop checks over many distinct keys through libsluice, handed over in
//     bursts every few milliseconds so each node's Client packs them into few requests; it wakes
//     once per burst and only counts outcomes (LoadDriver wakes and keeps a record per check, and
//     sends a whole round over its keys to one node). Check k names key k % keys and goes to node
//     (k + k / keys) % nodes: consecutive checks go round-robin over the nodes, and every sweep
//     over the keys shifts by one node, so each key is checked at every node in turn (as behind a
//     round-robin load balancer).
//   PeerCounters / read_peer_counters: one node's peer UDP counters (GET /v1/cluster), with when
//     they were read.
//   PeerRates / PeerWindow / measure_peer_window: every node's counters read at the start and the
//     end of an interval, per-node rates (each node over its own interval), and the load's checks
//     per second over the same interval.
//
// Thread safety: a KeySweepLoad's public functions are called from one thread; its pacing thread
// and the Clients' I/O threads touch only atomics.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster_process.h"

namespace sluice::bench {

using std::chrono::milliseconds;
using testing::SteadyClock;

struct SweepOptions {
  std::string domain = "g";
  std::string entry = "k";         // the descriptor entry carrying the key
  std::string key_prefix = "pt-";  // keys are prefix + 0 .. keys - 1
  size_t keys = 10'000;
  double rate_per_s = 10'000;   // offered, over all keys and nodes together
  milliseconds duration{7000};  // or until stop()
  milliseconds tick{5};         // the checks due are handed over every tick, all at once
  // Each node's Client waits this long for the rest of a burst to share a request.
  std::chrono::microseconds batch_window{500};
  std::chrono::microseconds timeout = std::chrono::milliseconds(300);
  uint32_t attempts = 3;
};

class KeySweepLoad {
 public:
  struct Counts {
    uint64_t sent = 0;     // handed to a Client
    uint64_t decided = 0;  // completed with a node's decision (allowed or denied)
    uint64_t denied = 0;   // of those, denied
    uint64_t failed = 0;   // completed without one (timeout, refused, or a node's error code)
    SteadyClock::time_point at{};
  };

  // `ports`: the check port on loopback of each node; each Client knows its node only (no
  // failover: a check the node does not answer fails).
  KeySweepLoad(SweepOptions options, std::vector<uint16_t> ports)
      : opt_(std::move(options)), ports_(std::move(ports)) {}

  ~KeySweepLoad() {
    stop_.store(true);
    if (pacer_.joinable()) pacer_.join();
    clients_.clear();  // completes pending checks (their callbacks count) first
  }

  KeySweepLoad(const KeySweepLoad&) = delete;
  KeySweepLoad& operator=(const KeySweepLoad&) = delete;

  // Creates the clients and starts sending. "" or the error.
  std::string start() {
    if (opt_.keys == 0 || ports_.empty() || opt_.rate_per_s <= 0) return "nothing to send";
    keys_.reserve(opt_.keys);
    for (size_t i = 0; i < opt_.keys; ++i)
      keys_.push_back(opt_.key_prefix + std::to_string(i));
    for (size_t i = 0; i < ports_.size(); ++i) {
      ClientOptions co;
      co.nodes = {"127.0.0.1:" + std::to_string(ports_[i])};
      co.fail_mode = FailMode::kClosed;
      co.timeout = opt_.timeout;
      co.attempts = opt_.attempts;
      co.batch_window = opt_.batch_window;
      std::string err;
      auto c = Client::create(co, &err);
      if (!c) return "client for node " + std::to_string(i) + ": " + err;
      clients_.push_back(std::move(c));
    }
    start_ = SteadyClock::now();
    pacer_ = std::thread([this] { pace(); });
    return "";
  }

  // Any time, from the starting thread.
  Counts counts() const {
    Counts c;
    c.at = SteadyClock::now();
    c.sent = sent_.load();
    c.decided = decided_.load();
    c.denied = denied_.load();
    c.failed = failed_.load();
    return c;
  }

  SteadyClock::time_point started() const { return start_; }

  // Sends nothing more (any time after start(); the duration is then only an upper bound).
  void stop() { stop_.store(true); }

  // Waits until the pacer is done (stop(), or the duration passed) and every check has completed
  // (bounded: the pacer stops one second after the duration at the latest, then the timeout plus
  // a second). False if some check never completed (a client bug).
  bool wait() {
    if (pacer_.joinable()) pacer_.join();
    const auto grace = std::chrono::duration_cast<milliseconds>(opt_.timeout) + milliseconds(1000);
    return testing::wait_until([&] { return decided_.load() + failed_.load() >= sent_.load(); },
                               grace, milliseconds(5));
  }

 private:
  void pace() {
    const double duration_s = std::chrono::duration<double>(opt_.duration).count();
    const auto total = static_cast<uint64_t>(std::llround(opt_.rate_per_s * duration_s));
    const size_t nodes = clients_.size();
    const uint64_t nkeys = opt_.keys;
    uint64_t k = 0;
    for (auto next = start_ + opt_.tick; k < total && !stop_.load(); next += opt_.tick) {
      std::this_thread::sleep_until(next);
      const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start_).count();
      if (elapsed > duration_s + 1.0) break;  // fell far behind: stop rather than run on
      const uint64_t due = std::min(total, static_cast<uint64_t>(elapsed * opt_.rate_per_s));
      for (; k < due; ++k) {
        const Entry e{opt_.entry, keys_[k % nkeys]};
        const Check c{opt_.domain, {&e, 1}, 1};
        sent_.fetch_add(1);
        clients_[(k + k / nkeys) % nodes]->async_check(c, [this](Result r) {
          if (r.decided() && r.code == wire::Code::kOk) {
            if (!r.allowed) denied_.fetch_add(1);
            decided_.fetch_add(1);
          } else {
            failed_.fetch_add(1);
          }
        });
      }
    }
  }

  SweepOptions opt_;
  std::vector<uint16_t> ports_;
  std::vector<std::string> keys_;  // built by start(), read by the pacer
  std::atomic<uint64_t> sent_{0}, decided_{0}, denied_{0}, failed_{0};
  std::atomic<bool> stop_{false};
  SteadyClock::time_point start_{};
  std::vector<std::unique_ptr<Client>> clients_;  // after the counters: destroyed first
  std::thread pacer_;
};

// One node's peer UDP counters (payload bytes, dropped datagrams included), as /v1/cluster
// reports them, and when they were read (the middle of the request).
struct PeerCounters {
  uint64_t bytes_in = 0, bytes_out = 0, datagrams_in = 0, datagrams_out = 0;
  SteadyClock::time_point at{};
};

inline std::optional<PeerCounters> read_peer_counters(const testing::LocalCluster& c, size_t i) {
  const auto t0 = SteadyClock::now();
  const auto j = c.cluster_json(i);
  const auto t1 = SteadyClock::now();
  if (!j || !j->contains("bytes_out")) return std::nullopt;
  PeerCounters p;
  p.bytes_in = j->value("bytes_in", uint64_t{0});
  p.bytes_out = j->value("bytes_out", uint64_t{0});
  p.datagrams_in = j->value("datagrams_in", uint64_t{0});
  p.datagrams_out = j->value("datagrams_out", uint64_t{0});
  p.at = t0 + (t1 - t0) / 2;
  return p;
}

// Every node's counters; "" or which node did not answer.
inline std::string read_all_peer_counters(const testing::LocalCluster& c,
                                          std::vector<PeerCounters>& out) {
  out.clear();
  for (size_t i = 0; i < c.size(); ++i) {
    const auto p = read_peer_counters(c, i);
    if (!p) return c.node(i).name + ": no peer counters in GET /v1/cluster";
    out.push_back(*p);
  }
  return "";
}

// Per node per second between two readings of every node (each node over its own interval).
struct PeerRates {
  double bytes_out_mean = 0, bytes_out_max = 0;
  size_t busiest = 0;  // index of the node with bytes_out_max
  double bytes_in_mean = 0, datagrams_out_mean = 0, datagrams_in_mean = 0;
  double bytes_out_total = 0;  // summed over the nodes
};

inline PeerRates peer_rates(const std::vector<PeerCounters>& before,
                            const std::vector<PeerCounters>& after) {
  PeerRates r;
  const size_t n = std::min(before.size(), after.size());
  if (n == 0) return r;
  for (size_t i = 0; i < n; ++i) {
    const double s = std::chrono::duration<double>(after[i].at - before[i].at).count();
    if (s <= 0) continue;
    const auto per_s = [s](uint64_t a, uint64_t b) { return static_cast<double>(b - a) / s; };
    const double out = per_s(before[i].bytes_out, after[i].bytes_out);
    r.bytes_out_total += out;
    if (out > r.bytes_out_max) {
      r.bytes_out_max = out;
      r.busiest = i;
    }
    r.bytes_in_mean += per_s(before[i].bytes_in, after[i].bytes_in);
    r.datagrams_out_mean += per_s(before[i].datagrams_out, after[i].datagrams_out);
    r.datagrams_in_mean += per_s(before[i].datagrams_in, after[i].datagrams_in);
  }
  const auto nd = static_cast<double>(n);
  r.bytes_out_mean = r.bytes_out_total / nd;
  r.bytes_in_mean /= nd;
  r.datagrams_out_mean /= nd;
  r.datagrams_in_mean /= nd;
  return r;
}

// What one measured interval saw: every node's peer rates, and the load's checks per second.
struct PeerWindow {
  PeerRates rates;
  double sent_per_s = 0, decided_per_s = 0;  // 0 without a load
  uint64_t failed = 0;                       // checks that failed within the interval
};

// Reads every node's peer counters (and the load's counts, if `load` is not null) at `from` and
// again `seconds` later. "" or which node did not answer.
inline std::string measure_peer_window(const testing::LocalCluster& c, const KeySweepLoad* load,
                                       SteadyClock::time_point from, double seconds,
                                       PeerWindow& w) {
  std::this_thread::sleep_until(from);
  std::vector<PeerCounters> before, after;
  const KeySweepLoad::Counts c0 = load != nullptr ? load->counts() : KeySweepLoad::Counts{};
  if (std::string err = read_all_peer_counters(c, before); !err.empty()) return err;
  std::this_thread::sleep_until(from + std::chrono::duration_cast<SteadyClock::duration>(
                                           std::chrono::duration<double>(seconds)));
  const KeySweepLoad::Counts c1 = load != nullptr ? load->counts() : KeySweepLoad::Counts{};
  if (std::string err = read_all_peer_counters(c, after); !err.empty()) return err;
  w.rates = peer_rates(before, after);
  if (load != nullptr) {
    const double s = std::chrono::duration<double>(c1.at - c0.at).count();
    w.sent_per_s = static_cast<double>(c1.sent - c0.sent) / s;
    w.decided_per_s = static_cast<double>(c1.decided - c0.decided) / s;
    w.failed = c1.failed - c0.failed;
  }
  return "";
}

}  // namespace sluice::bench
