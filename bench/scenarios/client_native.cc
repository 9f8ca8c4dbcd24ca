// sluice-bench-client-native: checks/s of the C++ client (sluice::Client) or of the C API
// (libsluice.so) against a node, one calling thread, blocking calls.
//
//   sluice-bench-client-native --lang cpp|c --server 127.0.0.1:7350 --batch 1|N --seconds 2
//
// Without --server it starts a sluiced of its own (SluicedChild) and checks its domain. Prints
// one JSON object: {"lang":..,"batch":..,"checks":..,"seconds":..,"checks_per_s":..,
// "undecided":..}, and with --json the {"rows":[...]} line of it after. bench/client_bench.py runs
// it next to the Python and Go clients, reading the object.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

std::vector<std::string> users(int n) {
  std::vector<std::string> u;
  for (int i = 0; i < n; ++i)
    u.push_back("u" + std::to_string(i));
  return u;
}

int run_cpp(const Args& a, uint64_t& checks, uint64_t& undecided, double& took) {
  std::string error;
  auto client = sluice::Client::create(
      {.nodes = {a.server}, .timeout = std::chrono::milliseconds(200)}, &error);
  if (!client) {
    std::fprintf(stderr, "create: %s\n", error.c_str());
    return 2;
  }
  const auto names = users(1000);
  std::vector<std::vector<sluice::Entry>> entries(static_cast<size_t>(a.batch));
  std::vector<sluice::Check> batch(static_cast<size_t>(a.batch));
  std::vector<sluice::Result> results;
  const auto start = Clock::now();  // the loop only: creating the client is not timed
  const auto until = start + std::chrono::duration<double>(a.seconds);
  uint64_t n = 0;
  while (Clock::now() < until && checks < kMaxChecks) {
    for (size_t i = 0; i < batch.size(); ++i) {
      entries[i] = {{a.entry, names[n++ % names.size()]}};
      batch[i] = {a.domain, entries[i], 1};
    }
    client->check_batch(batch, results);
    for (const sluice::Result& r : results)
      undecided += r.decided() ? 0u : 1u;
    checks += batch.size();
  }
  took = std::chrono::duration<double>(Clock::now() - start).count();
  return 0;
}

int run_c(const Args& a, uint64_t& checks, uint64_t& undecided, double& took) {
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
    return 2;
  }
  const auto names = users(1000);
  const size_t b = static_cast<size_t>(a.batch);
  std::vector<sluice_entry> entries(b);
  std::vector<sluice_check> batch(b);
  std::vector<sluice_result> results(b);
  for (sluice_result& r : results)
    sluice_result_init(&r);
  const auto start = Clock::now();  // the loop only: creating the client is not timed
  const auto until = start + std::chrono::duration<double>(a.seconds);
  uint64_t n = 0;
  while (Clock::now() < until && checks < kMaxChecks) {
    for (size_t i = 0; i < b; ++i) {
      entries[i] = {a.entry.c_str(), names[n++ % names.size()].c_str()};
      batch[i] = {a.domain.c_str(), &entries[i], 1, 1};
    }
    if (b == 1) {
      sluice_check_one(c, batch.data(), results.data());
    } else {
      sluice_check_batch(c, batch.data(), b, results.data());
    }
    for (const sluice_result& r : results)
      undecided += r.outcome == SLUICE_DECIDED ? 0u : 1u;
    checks += b;
  }
  took = std::chrono::duration<double>(Clock::now() - start).count();
  sluice_client_destroy(&c);
  return 0;
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
  try {
    if (a.server.empty()) {
      own.written_by = "sluice-bench-client-native";
      own.limits = "1000000000/1m";
      own.data = false;
      own.start(dir.path);
      a.server = "127.0.0.1:" + std::to_string(own.port);
      a.domain = bench::kSluiceDomain;
      a.entry = bench::kSluiceEntryKey;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice-bench-client-native: %s\n", e.what());
    return 1;
  }
  uint64_t checks = 0, undecided = 0;
  double took = 0;
  const int rc =
      a.lang == "cpp" ? run_cpp(a, checks, undecided, took) : run_c(a, checks, undecided, took);
  if (rc != 0) return rc;
  const bench::Row row = {{"lang", a.lang},
                          {"batch", a.batch},
                          {"checks", checks},
                          {"seconds", took},
                          {"checks_per_s", std::llround(static_cast<double>(checks) / took)},
                          {"undecided", undecided}};
  std::printf("%s\n", row.dump().c_str());
  cli.finish(nlohmann::json::array({row}));
  return 0;
}
