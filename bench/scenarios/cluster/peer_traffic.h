// sluice-bench cluster's peer-traffic scenario: what the nodes send each other over the peer port,
// per node per second (GET /v1/cluster bytes_out, bytes_in, datagrams_out: UDP payload bytes,
// dropped datagrams included), at 3, 5 and 10 nodes (--quick: 3) with the node defaults (sync
// 100 ms, so an empty batch to every member each 50 ms as a heartbeat; replicas 2; anti-entropy
// 5 s; probes 1 s). Per N: idle (no checks at all) for --seconds, 2 s after the cluster converged;
// then, each on a fresh cluster (no counters of an earlier run left for anti-entropy to resend),
// the gossip rule and the owner rule under load, with the rules of two_mode_rules (each check
// counts in the key's 1 s limit, never reached here, and in the hourly `total`:
// counters_per_check 2), and again with the 1 s limit alone (1). The load: 10,000 keys checked in
// sweeps at 10,000 checks/s, each key about once a second (offered_per_s is per key: times
// active_keys is the cluster's rate), measured for --seconds after a warm-up of N sweeps (every
// key checked at every node; 2 s at least). Every node's counters are read at the start and the
// end of the measured interval, each node's rates over its own interval. Owner-rule checks that
// land on a non-owner go to the owner's check port, which is not peer traffic:
// forwarded_parts_per_node_s gives those (sluice_forwarded_parts_total). failed_checks counts the
// warm-up too; failed_unavailable is those no node answered in time (client_retries: the clients'
// attempts after a check's first). received_pct = bytes in / bytes out over the nodes (what the
// kernel dropped on the way in); peer_bytes_per_check = every node's bytes out / decided checks.
// What went out, from GET /v1/cluster's sync object: sync_totals_out_per_node_s (counter totals
// of every kind of pass), sync_full_passes (begun in the interval, over all nodes: after a ring
// change or for members back in reach), peer_dropped_per_node_s (datagrams the codec dropped).
//
// KeySweepLoad: open-loop checks over many distinct keys through libsluice, handed over in bursts
// every 5 ms so each node's Client packs them into few requests; it wakes once per burst and only
// counts outcomes (LoadDriver wakes and keeps a record per check, and sends a whole round over its
// keys to one node). Check k names key k % keys and goes to node (k + k / keys) % nodes:
// consecutive checks go round-robin over the nodes, and every sweep over the keys shifts by one
// node, so each key is checked at every node in turn (as behind a round-robin load balancer). Its
// public functions are called from one thread; its pacing thread and the Clients' I/O threads
// touch only atomics.
#pragma once

#include "harness.h"

namespace sluice::bench::cluster {

class KeySweepLoad {
 public:
  struct Counts {
    uint64_t sent = 0;         // handed to a Client
    uint64_t decided = 0;      // completed with a node's decision (allowed or denied)
    uint64_t denied = 0;       // of those, denied
    uint64_t failed = 0;       // completed without one (timeout, refused, or a node's error code)
    uint64_t unavailable = 0;  // of those, no node answered within the timeout
    SteadyClock::time_point at{};
  };

  // Keys prefix + 0 .. keys - 1 of `domain` (entry k), `rate` checks/s over all keys and nodes
  // for `duration` or until stopped. Each node's Client (node_clients) knows its node only (a
  // check the node does not answer fails) and waits 500 us for the rest of a burst to share a
  // request.
  KeySweepLoad(std::string domain, const std::string& prefix, size_t keys, double rate,
               milliseconds duration)
      : domain_(std::move(domain)), rate_(rate), duration_(duration) {
    for (size_t i = 0; i < keys; ++i)
      keys_.push_back(prefix + std::to_string(i));
  }
  ~KeySweepLoad() {
    stop_and_wait();
    clients_.clear();  // completes pending checks (their callbacks count) first
  }

  // Creates the clients and starts sending. "" or the error.
  std::string start(const std::vector<std::string>& addresses) {
    std::string err = node_clients(addresses, false, std::chrono::microseconds(500), clients_);
    if (err.empty()) pacer_ = std::thread([this] { pace(); });
    return err;
  }

  // The last failure that was not a timeout: "outcome/code", or "" when there was none.
  std::string last_failure() const {
    const uint32_t f = last_failure_.load();
    if (f == 0) return "";
    return std::string(to_string(static_cast<Outcome>(f >> 16))) + "/" + std::to_string(f & 0xffff);
  }
  // Retries summed over the clients (attempts after a check's first).
  uint64_t retries() const {
    uint64_t n = 0;
    for (const auto& c : clients_)
      n += c->stats().retries;
    return n;
  }

  Counts counts() const {
    return {sent_.load(),   decided_.load(),     denied_.load(),
            failed_.load(), unavailable_.load(), SteadyClock::now()};
  }

  // Sends nothing more, then waits until every check has completed (bounded: the timeout plus a
  // second). False if some check never completed (a client bug).
  bool stop_and_wait() {
    stop_.store(true);
    if (pacer_.joinable()) pacer_.join();
    return wait_until([&] { return decided_.load() + failed_.load() >= sent_.load(); },
                      milliseconds(1300), milliseconds(5));
  }

 private:
  // Every 5 ms, hands over the checks due since the last time, all at once.
  void pace() {
    const auto start = SteadyClock::now();
    const double duration_s = std::chrono::duration<double>(duration_).count();
    const auto total = static_cast<uint64_t>(std::llround(rate_ * duration_s));
    const uint64_t nkeys = keys_.size();
    uint64_t k = 0;
    for (auto next = start + milliseconds(5); k < total && !stop_.load(); next += milliseconds(5)) {
      std::this_thread::sleep_until(next);
      const double elapsed = secs_since(start);
      if (elapsed > duration_s + 1.0) break;  // fell far behind: stop rather than run on
      for (const uint64_t due = std::min(total, static_cast<uint64_t>(elapsed * rate_)); k < due;
           ++k) {
        const Entry e{"k", keys_[k % nkeys]};
        sent_.fetch_add(1);
        clients_[(k + k / nkeys) % clients_.size()]->async_check(
            {domain_, {&e, 1}, 1}, [this](Result r) {
              const bool decided = r.decided() && r.code == wire::Code::kOk;
              (decided ? decided_ : failed_).fetch_add(1);
              if (decided && !r.allowed) denied_.fetch_add(1);
              if (r.outcome == Outcome::kUnavailable) unavailable_.fetch_add(1);
              if (!decided && r.outcome != Outcome::kUnavailable) {
                last_failure_.store(static_cast<uint32_t>(r.outcome) << 16 |
                                    static_cast<uint32_t>(r.code));
              }
            });
      }
    }
  }

  std::string domain_;
  double rate_;
  milliseconds duration_;
  std::vector<std::string> keys_;
  std::atomic<uint64_t> sent_{0}, decided_{0}, denied_{0}, failed_{0}, unavailable_{0};
  std::atomic<uint32_t> last_failure_{0};  // outcome << 16 | code of the last other failure
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<Client>> clients_;  // after the counters: destroyed first
  std::thread pacer_;
};

// Every node's peer counters and the load's counts at `from` and `seconds` later: the row's
// per-node rates (each node over its own interval) and the load's checks per second. "" or which
// node did not answer.
inline std::string measure_peer_window(const LocalCluster& c, const KeySweepLoad* load,
                                       SteadyClock::time_point from, double seconds, Row& row) {
  const char* names[] = {"bytes_out",  "bytes_in", "datagrams_out", "datagrams_in",
                         "totals_out", "handoffs", "dropped"};
  constexpr size_t kFields = 7;
  const size_t n = c.size();
  std::vector<std::array<double, kFields + 1>> at[2];  // per node: its counters, then when read
  KeySweepLoad::Counts counts[2];
  for (size_t r = 0; r < 2; ++r) {
    std::this_thread::sleep_until(from + ms_of(static_cast<double>(r) * seconds));
    if (load != nullptr) counts[r] = load->counts();
    for (size_t i = 0; i < n; ++i) {
      const auto t0 = SteadyClock::now();
      const auto j = c.cluster_json(i);
      if (!j || !j->contains("bytes_out")) return c.node(i).name + ": no peer counters";
      at[r].emplace_back();
      for (size_t f = 0; f < 4; ++f)
        at[r][i][f] = j->value(names[f], 0.0);
      const Json sync = j->value("sync", Json::object());
      at[r][i][4] = sync.value("totals_out", 0.0);
      at[r][i][5] = sync.value("handoffs", 0.0);
      double dropped = 0;  // datagrams this node dropped, every reason
      for (const auto& [reason, v] : j->value("dropped", Json::object()).items())
        dropped += v.is_number() ? v.get<double>() : 0.0;
      at[r][i][6] = dropped;
      at[r][i][kFields] = secs_since(from) - secs_since(t0) / 2;  // the request's middle
    }
  }
  double mean[kFields] = {}, max_out = 0, handoffs = 0;
  size_t busiest = 0;
  for (size_t i = 0; i < n; ++i) {
    const double s = at[1][i][kFields] - at[0][i][kFields];
    handoffs += at[1][i][5] - at[0][i][5];
    for (size_t f = 0; f < kFields; ++f) {
      const double v = s > 0 ? (at[1][i][f] - at[0][i][f]) / s : 0;
      mean[f] += v / static_cast<double>(n);
      if (f == 0 && v > max_out) max_out = v, busiest = i;
    }
  }
  row["peer_bytes_out_per_node_s"] = mean[0];
  row["peer_bytes_out_max_node_s"] = max_out;
  row["peer_bytes_in_per_node_s"] = mean[1];
  row["peer_datagrams_out_per_node_s"] = mean[2];
  row["peer_datagrams_in_per_node_s"] = mean[3];
  row["busiest_node"] = busiest + 1;
  row["peer_bytes_per_datagram"] = mean[2] > 0 ? mean[0] / mean[2] : 0.0;
  row["received_pct"] = mean[0] > 0 ? 100.0 * mean[1] / mean[0] : 100.0;
  // Counter totals sent per node per second (all sync passes), full passes begun (after a ring
  // change, or for members back in reach) summed over the nodes, and datagrams the nodes' codecs
  // dropped per node per second (what the kernel dropped is in received_pct).
  row["sync_totals_out_per_node_s"] = mean[4];
  row["sync_full_passes"] = handoffs;
  row["peer_dropped_per_node_s"] = mean[6];
  if (load == nullptr) return "";
  const double s = std::chrono::duration<double>(counts[1].at - counts[0].at).count();
  const double checks_per_s = static_cast<double>(counts[1].decided - counts[0].decided) / s;
  row["checks_per_s"] = checks_per_s;
  row["sent_per_s"] = static_cast<double>(counts[1].sent - counts[0].sent) / s;
  row["failed_in_interval"] = counts[1].failed - counts[0].failed;
  row["peer_bytes_per_check"] =
      checks_per_s > 0 ? mean[0] * static_cast<double>(n) / checks_per_s : 0.0;
  return "";
}

// One N, one rule set: `mode`'s rule under load on a fresh cluster (idle first when asked).
inline std::string peer_traffic_run(const Settings& st, size_t n, const std::string& mode,
                                    bool with_total, bool idle_first, Rows& rows) {
  const uint64_t limit = 1000;  // per key per second: never reached, every check is counted
  const size_t keys = 10'000;
  const double rate = 10'000;
  // After N sweeps every node has checked every key, so its owner and replica push its merged
  // state to every node (what a round-robin load balancer leads to): the warm-up lasts that long,
  // 2 s at least, so the rows show that steady state rather than its ramp.
  const milliseconds warmup =
      std::max(milliseconds(2000), ms_of(static_cast<double>(n * keys) / rate));
  LocalCluster c(spec_of(st, n, two_mode_rules(limit, "strict", "100ms", with_total)));
  if (std::string err = c.start(milliseconds(30000)); !err.empty()) return err;
  if (idle_first) {  // the floor, before any key exists
    Row row = table_row("peer-traffic", "idle", n, 0, limit);
    const auto from = SteadyClock::now() + milliseconds(2000);
    if (std::string err = measure_peer_window(c, nullptr, from, st.seconds, row); !err.empty())
      return err;
    row["checks_per_s"] = 0.0, row["active_keys"] = 0, row["note"] = "no checks";
    add(rows, std::move(row));
  }
  // Until stopped after the measured interval, which may end late (the admin ports of busy nodes
  // answer slowly); at most a minute more than planned.
  KeySweepLoad load(mode.substr(0, 1), "pt-" + mode + "-", keys, rate,
                    warmup + ms_of(st.seconds) + milliseconds(60000));
  const std::vector<std::string> metrics = {"sluice_forward_fallbacks_total",
                                            "sluice_forwarded_parts_total"};
  const Totals before = metric_totals(c, metrics);
  const auto started = SteadyClock::now();
  if (std::string err = load.start(c.check_addresses()); !err.empty()) return err;
  std::this_thread::sleep_until(started + warmup);
  const Totals fw0 = metric_totals(c, metrics);
  const auto t0 = SteadyClock::now();
  Row row =
      table_row("peer-traffic", mode, n, rate / static_cast<double>(keys), limit, 100, "even");
  std::string err = measure_peer_window(c, &load, t0, st.seconds, row);
  const Totals fw1 = metric_totals(c, metrics);
  const double forwarded_s = secs_since(t0);
  if (!load.stop_and_wait() && err.empty()) err = "some checks never completed";
  if (!err.empty()) return err;
  const KeySweepLoad::Counts done = load.counts();
  row["failed_checks"] = done.failed;
  row["failed_unavailable"] = done.unavailable;  // of those, no answer within the timeout
  row["client_retries"] = load.retries();
  if (const std::string f = load.last_failure(); !f.empty()) row["last_failure"] = f;
  row["denied"] = done.denied;
  row["active_keys"] = keys;
  row["counters_per_check"] = with_total ? 2 : 1;
  row["note"] = with_total ? "1 s limit + hourly total" : "1 s limit alone";
  if (mode == "owner") {
    set(row, "fallbacks", delta(before, metric_totals(c, metrics)));
    if (const auto d = delta(fw0, fw1, 1))  // to owners' check ports, not peer bytes
      row["forwarded_parts_per_node_s"] = *d / forwarded_s / static_cast<double>(n);
  }
  add(rows, std::move(row));
  return "";
}

// SLUICE_BENCH_NODES=n runs the rows of n nodes only.
inline std::string run_peer_traffic(const Settings& st, const std::string&, Rows& rows) {
  std::vector<size_t> sizes = st.quick ? std::vector<size_t>{3} : std::vector<size_t>{3, 5, 10};
  if (const char* only = std::getenv("SLUICE_BENCH_NODES"); only != nullptr) {
    sizes = {static_cast<size_t>(std::strtoul(only, nullptr, 10))};
  }
  for (const size_t n : sizes) {
    for (const bool with_total : {true, false}) {
      for (const std::string mode : {"gossip", "owner"}) {
        const bool idle_first = with_total && mode == "gossip";
        if (std::string err = peer_traffic_run(st, n, mode, with_total, idle_first, rows);
            !err.empty()) {
          return std::to_string(n) + " nodes, " + mode + ": " + err;
        }
      }
    }
  }
  return "";
}

}  // namespace sluice::bench::cluster
