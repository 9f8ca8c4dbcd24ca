// A real sluice::node::Node in the test's process: loopback ports chosen by the kernel, a rules
// file and a data directory of its own (removed afterwards), one worker thread, and a clock the
// test moves (`now`). For tests that speak to a node over its ports (admin HTTP, checks) without
// starting a process.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "node/node.h"

namespace sluice::testing {

struct InProcessNode {
  std::filesystem::path dir;
  std::atomic<int64_t> now;
  std::unique_ptr<node::Node> node;
  std::thread thread;

  // `name` prefixes the temporary directory; `rules` is the rules file's text; `tweak` may change
  // the options (admin token, listen addresses) before the node is built.
  InProcessNode(const std::string& name, const std::string& rules, int64_t t0,
                const std::function<void(node::NodeOptions&)>& tweak = {})
      : now(t0) {
    namespace fs = std::filesystem;
    dir = fs::temp_directory_path() /
          (name + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(dir);
    std::ofstream(dir / "rules.yaml") << rules;
    node::NodeOptions opt;
    opt.udp_listen = "127.0.0.1:0";
    opt.tcp_listen = "127.0.0.1:0";
    opt.admin_listen = "127.0.0.1:0";
    opt.grpc_listen = "127.0.0.1:0";
    opt.resp_listen = "127.0.0.1:0";
    opt.threads = 1;
    opt.rules_file = (dir / "rules.yaml").string();
    opt.data_dir = (dir / "data").string();
    opt.init_data = true;
    opt.clock = [this] { return now.load(); };
    if (tweak) tweak(opt);
    StatusOr<std::unique_ptr<node::Node>> opened = node::Node::open(opt);
    REQUIRE_MESSAGE(opened.ok(), opened.message());
    node = std::move(*opened);
    thread = std::thread([this] { node->run(/*handle_signals=*/false); });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!node->ready() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    REQUIRE(node->ready());
    REQUIRE(node->admin_port() != 0);
  }
  ~InProcessNode() {
    node->stop();
    if (thread.joinable()) thread.join();
    node.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  InProcessNode(const InProcessNode&) = delete;
  InProcessNode& operator=(const InProcessNode&) = delete;

  uint16_t port() const { return node->admin_port(); }
  void advance(int64_t ms) { now += ms; }
};

}  // namespace sluice::testing
