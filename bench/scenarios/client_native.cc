// sluice-bench-client-native: checks/s of the C++ client (sluice::Client) or of the C API
// (libsluice.so) against a node, one calling thread, blocking calls.
//
//   sluice-bench-client-native --lang cpp|c --server 127.0.0.1:7350 --batch 1|N --seconds 2
//
// Without --server it starts a sluiced of its own (SluicedChild) and checks its domain. Prints
// one JSON object: {"lang":..,"batch":..,"checks":..,"seconds":..,"checks_per_s":..,
// "undecided":..}, and with --json the {"rows":[...]} line of it after. bench/client_bench.py runs
// it next to the Python and Go clients, reading the object.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/process.h"
#include "common/scenario.h"
#include "load/targets.h"
#include "sluice/sluice.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMaxChecks = 20'000'000;  // a bound on the count, whatever the speed

struct Args {
  std::string lang = "cpp";
  std::string server;  // "": a sluiced of our own
  std::string domain = "b", entry = "user";
  int batch = 1;
  double seconds = 2;
};

// Repeats call(n) (one call of a.batch checks on keys n, n+1, ... of the names; it returns how
// many came back undecided) for a.seconds, and the row of it. Only this loop is timed, not
// creating the client.
template <class Call>
sluice::bench::Row timed_calls(const Args& a, Call call) {
  uint64_t checks = 0, undecided = 0;
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration<double>(a.seconds);
  while (Clock::now() < until && checks < kMaxChecks) {
    undecided += static_cast<uint64_t>(call(checks));
    checks += static_cast<uint64_t>(a.batch);
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  return {{"lang", a.lang},
          {"batch", a.batch},
          {"checks", checks},
          {"seconds", took},
          {"checks_per_s", std::llround(static_cast<double>(checks) / took)},
          {"undecided", undecided}};
}

std::optional<sluice::bench::Row> run_cpp(const Args& a, const std::vector<std::string>& names) {
  std::string error;
  auto client = sluice::Client::create(
      {.nodes = {a.server}, .timeout = std::chrono::milliseconds(200)}, &error);
  if (!client) {
    std::fprintf(stderr, "create: %s\n", error.c_str());
    return std::nullopt;
  }
  std::vector<std::vector<sluice::Entry>> entries(static_cast<size_t>(a.batch));
  std::vector<sluice::Check> batch(static_cast<size_t>(a.batch));
  std::vector<sluice::Result> results;
  return timed_calls(a, [&](uint64_t n) {
    for (size_t i = 0; i < batch.size(); ++i) {
      entries[i] = {{a.entry, names[n++ % names.size()]}};
      batch[i] = {a.domain, entries[i], 1};
    }
    client->check_batch(batch, results);
    return std::count_if(results.begin(), results.end(), [](auto& r) { return !r.decided(); });
  });
}

std::optional<sluice::bench::Row> run_c(const Args& a, const std::vector<std::string>& names) {
  sluice_options o;
  sluice_options_init(&o);
  const char* nodes[] = {a.server.c_str()};
  o.nodes = nodes;
  o.num_nodes = 1;
  o.timeout_us = 200'000;
  sluice_client* c = nullptr;
  char why[256];
  if (sluice_client_create(&o, &c, why, sizeof why) != SLUICE_OK) {
    std::fprintf(stderr, "create: %s\n", why);
    return std::nullopt;
  }
  const size_t b = static_cast<size_t>(a.batch);
  std::vector<sluice_entry> entries(b);
  std::vector<sluice_check> batch(b);
  std::vector<sluice_result> results(b);
  for (sluice_result& r : results)
    sluice_result_init(&r);
  const sluice::bench::Row row = timed_calls(a, [&](uint64_t n) {
    for (size_t i = 0; i < b; ++i) {
      entries[i] = {a.entry.c_str(), names[n++ % names.size()].c_str()};
      batch[i] = {a.domain.c_str(), &entries[i], 1, 1};
    }
    if (b == 1) {
      sluice_check_one(c, batch.data(), results.data());
    } else {
      sluice_check_batch(c, batch.data(), b, results.data());
    }
    return std::count_if(results.begin(), results.end(),
                         [](auto& r) { return r.outcome != SLUICE_DECIDED; });
  });
  sluice_client_destroy(&c);
  return row;
}

}  // namespace

int bench_client_native_main(int argc, char** argv) {
  namespace bench = sluice::bench;
  Args a;
  bool quick = false;
  bench::Cli cli("sluice-bench-client-native");
  cli.word("--lang", a.lang, {"cpp", "c"}, "the C++ client or the C API");
  cli.text("--server", a.server, "HOST:PORT of the node (default: a sluiced of its own)");
  cli.number("--batch", a.batch, 1, 1024, "checks per call");
  cli.seconds(a.seconds, 0.001, 60, "seconds of calls");
  cli.quick(quick, "0.2 s of calls");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  if (quick) a.seconds = 0.2;
  bench::TempDir dir;
  bench::SluicedChild own;
  if (a.server.empty()) {
    own.written_by = "sluice-bench-client-native";
    own.limits = "1000000000/1m";
    own.data = false;
    try {
      own.start(dir.path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "sluice-bench-client-native: %s\n", e.what());
      return 1;
    }
    a.server = "127.0.0.1:" + std::to_string(own.port);
    a.domain = bench::kSluiceDomain;
    a.entry = bench::kSluiceEntryKey;
  }
  const bench::Keyspace keys(1000);
  const auto row = a.lang == "cpp" ? run_cpp(a, keys.names) : run_c(a, keys.names);
  if (!row) return 2;
  std::printf("%s\n", row->dump().c_str());
  cli.finish(nlohmann::json::array({*row}));
  return 0;
}
