// sluice::node::Node's own lifetime: built, run, stopped and destroyed in this process, with no
// listener (no sockets) and no data directory, so it is a unit test that the AddressSanitizer
// build runs in CI (`-L unit`). What it protects: members of Node::Impl that live on an
// io_context must be destroyed before it. The rules watch's timer was declared before the
// control io_context, so it outlived it and its destructor read the freed timer service
// (heap-use-after-free at every clean stop of a node with a rules file; found by chaos_test
// against ASan sluiced).
#include "node/node.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

namespace {

using namespace sluice;

// Builds a node from `rules` (a file, so the rules watch runs), runs it until it is ready, stops
// it and destroys it; the caller's checks run under ASan in CI.
void run_and_destroy(bool with_rules_file, int64_t rules_watch_interval_ms) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("sluice-node-lifetime-" + std::to_string(::getpid()) + "-" +
                                   std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  std::ofstream(dir / "rules.yaml")
      << "domains:\n  - name: d\n    rules:\n      - name: r\n        key: [k]\n"
         "        limits:\n          - {limit: 10, window: 1s}\n";
  node::NodeOptions opt;
  opt.udp_listen = "";
  opt.tcp_listen = "";
  opt.admin_listen = "";
  opt.grpc_listen = "";
  opt.resp_listen = "";
  opt.threads = 1;
  opt.data_dir = "";
  if (with_rules_file) opt.rules_file = (dir / "rules.yaml").string();
  opt.rules_watch_interval_ms = rules_watch_interval_ms;
  {
    StatusOr<std::unique_ptr<node::Node>> opened = node::Node::open(opt);
    REQUIRE_MESSAGE(opened.ok(), opened.message());
    std::unique_ptr<node::Node> n = std::move(*opened);
    std::thread t([&] { n->run(/*handle_signals=*/false); });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!n->ready() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    CHECK(n->ready());
    n->stop();
    t.join();
    n.reset();  // the destructor is what ASan watches
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST_CASE(
    "a node whose rules file is watched is stopped and destroyed without touching freed "
    "memory") {
  run_and_destroy(true, 2000);
}

TEST_CASE("a node without a watched rules file is stopped and destroyed cleanly") {
  run_and_destroy(true, 0);
  run_and_destroy(false, 2000);
}

}  // namespace
