// sluice-bench cluster's restart-fast scenario: the owner of a key killed -9 and started again
// 200 ms later, within one reach timeout, so that no member ever sees it out of reach or dead
// (docs/architecture.md, "Fast restarts"). Owner mode and lease mode side by side.
//
// 5 nodes; domains `o` and `l` (consistency owner and lease), one rule each keyed by `k`, 100 per
// 1 s window, weighted, 10 ms buckets (as fine_rules); one key of each, both owned by the same
// node, offered 300/s each, clients failing over to the next node while theirs is down: skew
// `even`, round-robin over every node (the others forward to the owner, and pass it over for a
// second once three parts in a row timed out), or `owner-node`, every check to the owner first
// (it decides them itself as soon as it is back). From 2 s into the traffic the owner is killed
// -9 and restarted 200 ms later, three times, 3 s apart. Per case and mode a row over the run:
//   admitted_over_limit  most admitted in any true 1 s window / the limit (goals: owner <= 1.05,
//                        lease <= 1.00)
//   failed_checks        checks that got no answer (every attempt timed out)
//   restarts             kills and restarts done; alive_again_s: the last restart until every
//                        node lists the victim alive
// A run against an older sluiced (--sluiced) measures the same scenario without the fencing.
#pragma once

#include "harness.h"

namespace sluice::bench::cluster {

inline std::string run_restart_fast_case(const Settings& st, const std::string& name,
                                         const std::string& skew, Rows& rows) {
  const size_t n = 5;
  const uint64_t limit = 100;
  const double rate = 300;  // per key
  const int restarts = 3;
  const milliseconds gap(200), first(2000), apart(3000);
  const std::string rule = "{limit: " + std::to_string(limit) + ", window: 1s, granularity: 10ms}";
  LocalCluster c(
      spec_of(st, n, one_rule_domains({{"o", "owner"}, {"l", "lease"}}, rule, "weighted")));
  if (std::string err = c.start(milliseconds(30000)); !err.empty()) return err;
  std::this_thread::sleep_for(milliseconds(1000));
  const auto ol = c.owners(0, "l", "rf-l");
  if (ol.empty()) return "no owner for l/rf-l";
  const uint16_t id = ol[0];
  const auto victim = static_cast<size_t>(id - 1);
  std::vector<OwnedKey> ok;
  if (std::string err = owned_keys(
          c, "o", "rf-o-", 1, [id](size_t) { return id; }, ok);
      !err.empty())
    return err;
  LoadOptions lo;
  lo.keys = {ok[0].key, "rf-l"};
  lo.key_domains = {"o", "l"};
  lo.rate_per_s = rate * 2;
  lo.duration = first + apart * restarts;
  int done = 0;
  std::optional<double> alive_again;
  std::string note = "owner of both keys killed -9 and restarted 200 ms later";
  const auto event = [&](LoadDriver&) -> std::string {
    const auto t0 = SteadyClock::now();
    for (int k = 0; k < restarts; ++k) {
      std::this_thread::sleep_until(t0 + first + apart * k);
      c.kill9(victim);
      std::this_thread::sleep_for(gap);
      if (std::string err = c.start_node(victim); !err.empty()) return "restart: " + err;
      ++done;
      const auto back = SteadyClock::now();
      if (wait_until([&] { return c.all_see(indices(n), id, "alive"); }, milliseconds(2500),
                     milliseconds(20)))
        alive_again = secs_since(back);
      else
        note += "; not alive everywhere 2.5 s after a restart";
    }
    return "";
  };
  LoadRun r;
  const std::vector<size_t> targets = skew == "even" ? indices(n) : std::vector<size_t>{victim};
  if (std::string err = drive(c, lo, targets, r, event); !err.empty()) return err;
  for (const char* mode : {"owner", "lease"}) {
    Row row = table_row(name, mode, n, rate, limit, 100, skew);
    load_figures(row, r, limit, std::string(1, mode[0]));
    row["restarts"] = done;
    set(row, "alive_again_s", alive_again);
    set(row, "fallbacks", r.fallbacks);
    row["note"] = note + (std::string(mode) == "owner" ? "; goal <= 1.05" : "; goal <= 1.00");
    add(rows, std::move(row));
  }
  return "";
}

inline std::string run_restart_fast(const Settings& st, const std::string& name, Rows& rows) {
  for (const char* skew : {"even", "owner-node"}) {
    if (std::string err = run_restart_fast_case(st, name, skew, rows); !err.empty())
      return std::string(skew) + ": " + err;
  }
  return "";
}

}  // namespace sluice::bench::cluster
