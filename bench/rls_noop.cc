// sluice-bench-rls-noop: the gRPC front of sluiced (lib/rls: the same HTTP/2 transport, protobuf
// parsing, request planning and response building) with a backend that answers every check
// "allowed" without deciding it: no engine, no counter, no rule, no limit in the answer.
// sluice-bench-rls measures it beside sluiced with the same generator, so sluiced's gRPC figures
// read as a fraction of what the front itself allows on the machine.
//
//   sluice-bench-rls-noop --grpc 127.0.0.1:PORT [--threads N]
//
// Runs until SIGTERM, SIGINT or SIGHUP (or its parent dies: PR_SET_PDEATHSIG).
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/scenario.h"
#include "rls/rls.h"
#include "wire/protocol.h"

int main(int argc, char** argv) {
  std::string listen;
  unsigned threads = 2;
  sluice::bench::Cli cli("sluice-bench-rls-noop");
  cli.app().remove_option(cli.app().get_option("--json"));  // a server: it prints no rows
  cli.text("--grpc", listen, "HOST:PORT to serve gRPC on")->required();
  cli.number("--threads", threads, 1, 64, "gRPC threads");
  if (const std::optional<int> exit = cli.parse(argc, argv)) return *exit;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  sluice::bench::install_stop_signals();

  // One allowed decision per check, no limit details, handed over as sluiced's node hands its
  // decisions (Backend::decide_here): the front's whole path but the engine.
  sluice::rls::Backend backend;
  backend.decide_here = [](std::span<const sluice::wire::Check> checks,
                           std::span<const sluice::wire::DecisionView>& decisions) {
    thread_local std::vector<sluice::wire::DecisionView> allowed;
    allowed.assign(checks.size(), sluice::wire::DecisionView{});
    for (auto& d : allowed)
      d.allowed = true;
    decisions = allowed;
    return true;
  };
  backend.check = [](std::vector<uint8_t>, std::function<void(std::span<const uint8_t>)> done) {
    done({});  // never used: check_here answers everything
  };
  backend.policy = [] { return std::shared_ptr<const sluice::rules::Policy>(); };
  sluice::rls::RlsOptions options;
  options.listen = listen;
  options.threads = threads;
  sluice::rls::RlsServer server(options, backend);
  try {
    server.start();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sluice-bench-rls-noop: %s\n", e.what());
    return 1;
  }
  server.set_serving(true);
  std::fprintf(stderr, "sluice-bench-rls-noop: serving on port %u\n", server.port());
  // Bounded by the signal: checked every 50 ms.
  while (!sluice::bench::stop_requested())
    ::usleep(50'000);
  server.shutdown(0);
  return 0;
}
