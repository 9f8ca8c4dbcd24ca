// sluice-bench: every benchmark of Sluice behind one driver.
//
//   sluice-bench <scenario> [--json] [--quick] [scenario flags]
//   sluice-bench --list
//   sluice-bench-<scenario> [flags]        (a link to this program: the name picks the scenario)
//
// Each scenario lives in a file of its own under scenarios/, entered through its main with the
// command line of the program it once was; --help after the scenario prints its flags. With
// --json the last line of stdout is exactly one object {"rows":[...]} (common/json_rows.h).
// --quick asks for a short run: a scenario that has no --quick of its own gets the flags listed
// in its `quick` entry below instead.
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

int bench_accuracy_main(int argc, char** argv);
int bench_chaos_main(int argc, char** argv);
int bench_client_native_main(int argc, char** argv);
int bench_cluster_main(int argc, char** argv);
int bench_cluster_sim_main(int argc, char** argv);
int bench_crash_main(int argc, char** argv);
int bench_detect_main(int argc, char** argv);
int bench_edges_main(int argc, char** argv);
int bench_engine_main(int argc, char** argv);
int bench_gaps_main(int argc, char** argv);
int bench_keyspray_main(int argc, char** argv);
int bench_load_main(int argc, char** argv);
int bench_ring_main(int argc, char** argv);
int bench_rls_main(int argc, char** argv);
int bench_soak_main(int argc, char** argv);
int bench_store_main(int argc, char** argv);
int bench_sync_main(int argc, char** argv);

namespace {

struct Scenario {
  const char* name;  // sluice-bench <name>, and the link sluice-bench-<name>
  int (*run)(int argc, char** argv);
  const char* quick;    // flags standing for --quick; nullptr: the scenario reads --quick itself
  const char* summary;  // one line for --list
};

const Scenario kScenarios[] = {
    {"accuracy", bench_accuracy_main, "--trace steady-1x,on-off --window 1s --windows 30",
     "estimate against an exact sliding log, per trace, window, mode and granularity"},
    {"edges", bench_edges_main, "--window 1s --windows 30",
     "closed-loop bursts timed against bucket edges: the most admitted in one true window"},
    {"gaps", bench_gaps_main, "--seconds 1",
     "how often the machine takes the CPU from a running thread (a floor under tail latency)"},
    {"engine", bench_engine_main, "--keys 10000 --seconds 1 --threads 1",
     "checks/s and latency of the engine in one process, per key count, distribution, threads"},
    {"load", bench_load_main, "--only sluiced-udp --seconds 1 --warmup 0",
     "sluiced's doors under load from the epoll generator, beside Redis, memcached, nginx"},
    {"soak", bench_soak_main,
     "--seconds 10 --rate 5000 --interval 5 --window 5 --rss-after 5 --p99-ratio 10 --memory-only",
     "a long steady load on one sluiced: RSS, p99 per window, errors"},
    {"keyspray", bench_keyspray_main,
     "--keys 100000 --cap-mb 32 --hot 100 --memory-only --rss-slack-mb 2",
     "distinct keys sprayed under a memory cap: RSS, evictions, hot keys' counts"},
    {"rls", bench_rls_main, "--seconds 1 --warmup 0",
     "Envoy RLS over gRPC against UDP checks on one sluiced, and the no-op gRPC ceiling"},
    {"store", bench_store_main, "--snapshot-keys 10000 --restore-keys 10000 --latency-checks 10000",
     "snapshot and restore of the RocksDB store, and check latency during a snapshot"},
    {"ring", bench_ring_main, "--nodes 3,10 --keys 100000 --repeat 1",
     "the consistent-hash ring: balance, keys moved on join and leave, lookup cost"},
    {"cluster", bench_cluster_main, nullptr,
     "cluster scenarios with real sluiced processes on loopback (--scenario NAME)"},
    {"cluster-sim", bench_cluster_sim_main, nullptr,
     "membership and override spreading at 10 to 1000 nodes on a simulated network"},
    {"detect", bench_detect_main, "--runs 20",
     "time to declare a silent member dead, many runs of real ClusterNodes, simulated network"},
    {"chaos", bench_chaos_main, "--seconds 20 --quiet",
     "kill -9, drain and SIGTERM of cluster nodes under load: admissions against the limit"},
    {"crash", bench_crash_main, "--iterations 5",
     "kill -9 during snapshots and override writes: the store reopens consistent"},
    {"sync", bench_sync_main, "--keys 10000 --active 1000 --passes 3",
     "what one cluster sync pass costs a node, in one process"},
    {"client-native", bench_client_native_main, nullptr,
     "checks/s of the C++ client and the C API against a running node (client_bench.py)"},
};

constexpr std::string_view kPrefix = "sluice-bench-";

const Scenario* find(std::string_view name) {
  for (const Scenario& s : kScenarios)
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  const std::string self = std::filesystem::path(args[0]).filename();
  const Scenario* s = self.starts_with(kPrefix) ? find(self.substr(kPrefix.size())) : nullptr;
  if (s == nullptr && argc > 1 && (s = find(args[1])) != nullptr) {
    args.erase(args.begin());  // the scenario sees the command line of its own program
    args[0] = std::string(kPrefix) + s->name;
  }
  if (s == nullptr) {
    const std::string first = argc > 1 ? args[1] : "";
    const bool asked = first == "--help" || first == "-h" || first == "--list";
    std::FILE* out = asked ? stdout : stderr;
    if (!asked && !first.empty())
      std::fprintf(stderr, "sluice-bench: unknown scenario '%s'\n", first.c_str());
    if (first != "--list") {
      std::fprintf(out,
                   "usage: sluice-bench <scenario> [--json] [--quick] [scenario flags]\n"
                   "       sluice-bench --list\n"
                   "       sluice-bench <scenario> --help   (the scenario's flags)\n"
                   "scenarios:\n");
    }
    for (const Scenario& each : kScenarios)
      std::fprintf(out, "  %-14s %s\n", each.name, each.summary);
    return asked ? 0 : 2;
  }
  std::vector<std::string> expanded;  // --quick stands for s->quick, when it has one
  for (std::string& a : args) {
    std::istringstream quick(a == "--quick" && s->quick != nullptr ? s->quick : "");
    if (quick.str().empty()) expanded.push_back(std::move(a));
    for (std::string w; quick >> w;)
      expanded.push_back(std::move(w));
  }
  std::vector<char*> cargv;
  for (std::string& a : expanded)
    cargv.push_back(a.data());
  cargv.push_back(nullptr);
  return s->run(static_cast<int>(expanded.size()), cargv.data());
}
