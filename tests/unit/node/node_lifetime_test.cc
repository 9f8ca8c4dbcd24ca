// sluice::node::Node's own lifetime: built, run, stopped and destroyed in this process, with no
// listener (no sockets) and no data directory (but the memory cap case), so it is a unit test that
// the AddressSanitizer build runs in CI (`-L unit`). What it protects: members of Node::Impl that
// live on an io_context must be destroyed before it. The rules watch's timer was declared before
// the control io_context, so it outlived it and its destructor read the freed timer service
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

// A node with no listener and one worker thread.
node::NodeOptions no_listeners() {
  node::NodeOptions opt;
  opt.udp_listen = "";
  opt.tcp_listen = "";
  opt.admin_listen = "";
  opt.grpc_listen = "";
  opt.resp_listen = "";
  opt.threads = 1;
  return opt;
}

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
  node::NodeOptions opt = no_listeners();
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

// memory_cap_mb covers the snapshots with a data directory: RocksDB's write buffers (an eighth)
// and the rest of the snapshot path's working memory (an eighth, at most 2 MiB) come out of
// the counter tables' share. Before, the working memory came on top of the cap (a 1.5M-key spray
// under a 16 MiB cap peaked 9 MiB over it).
uint64_t table_cap_of(uint64_t memory_cap_bytes, bool data_dir) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("sluice-node-cap-" + std::to_string(::getpid()) + "-" +
                                   std::to_string(std::random_device{}()));
  node::NodeOptions opt = no_listeners();
  opt.data_dir = data_dir ? (dir / "data").string() : "";
  opt.init_data = true;
  opt.memory_cap_bytes = memory_cap_bytes;
  uint64_t cap = 0;
  {
    StatusOr<std::unique_ptr<node::Node>> opened = node::Node::open(opt);
    REQUIRE_MESSAGE(opened.ok(), opened.message());
    cap = (*opened)->engine().stats().memory_cap_bytes;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return cap;
}

TEST_CASE("with a data directory the counter tables get the cap less the snapshots' share") {
  constexpr uint64_t kMiB = 1ull << 20;
  CHECK(node::store_write_buffer_bytes(16 * kMiB) == 2 * kMiB);
  CHECK(node::store_working_bytes(8 * kMiB) == 1 * kMiB);
  CHECK(node::store_working_bytes(16 * kMiB) == 2 * kMiB);
  CHECK(node::store_working_bytes(1024 * kMiB) == 2 * kMiB);
  CHECK(table_cap_of(16 * kMiB, true) == 12 * kMiB);
  CHECK(table_cap_of(1024 * kMiB, true) == (1024 - 64 - 2) * kMiB);
  CHECK(table_cap_of(16 * kMiB, false) == 16 * kMiB);
}

}  // namespace
