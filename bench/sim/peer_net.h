// sim::PeerNet: the datagram sockets and one-shot timers a ClusterNode is given
// (lib/node/peer_io.h), on a sim::Network (network.h), so that several real ClusterNodes run in
// one thread and time passes only in advance(). tests/support/sim_cluster.h builds its nodes on
// it. Header-only: it needs lib/node's headers, which the rest of sluice_sim does not.
//
// Each host (IP) that opens a socket is a node of the network, so isolate() and the network's
// faults apply per host. A datagram goes through Network::route and is handed to whoever has its
// address open when it arrives, else dropped; a timer is an event of the network. `tap` sees
// every datagram sent; inject() hands bytes over as if sent (a replay). `between` runs after every
// event (the test polls its io_context there, for what OverrideSync's thread posts back).
//
// Single-threaded: the test, the nodes' callbacks and the timers all run on the test's thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "node/peer_io.h"
#include "sim/network.h"

namespace sluice::sim {

class PeerNet {
 public:
  using Endpoint = cluster::Endpoint;

  // One-way delays of 0.1 to 1 ms.
  PeerNet(int64_t start_ms, uint64_t seed) : network(seed, start_ms * 1'000, {100, 1'000, 1}) {}

  int64_t now_ms() const { return network.now_ms(); }
  // A PeerIo on this network (for ClusterNode's constructor). It lives as long as the node does;
  // the network must outlive it.
  std::unique_ptr<node::PeerIo> io() { return std::make_unique<Io>(*this); }

  // Runs every event due within `ms` from now, in order, then sets the clock to now + ms.
  void advance(int64_t ms) {
    network.run_until(network.now_us() + ms * 1'000, [this] {
      if (between) between();
      return false;
    });
  }

  // Hands `bytes` to whoever has `to` open, as if `from` had sent them, after `delay_us`.
  void inject(const Endpoint& from, const Endpoint& to, std::vector<uint8_t> bytes,
              int64_t delay_us = 0) {
    network.after(delay_us, [this, from, to, b = std::move(bytes)] { deliver(from, to, b); });
  }

  // Cuts `host` off from everyone, both ways, until heal().
  void isolate(const std::string& host) { network.isolate(node_of(host)); }
  void heal() { network.heal(); }

  std::function<void(const Endpoint& from, const Endpoint& to, std::span<const uint8_t>)> tap;
  std::function<void()> between;
  Network network;  // the faults: loss and the like, per host (node_of)

 private:
  class Timer final : public node::PeerTimer {
   public:
    explicit Timer(Network& net) : net_(net) {}
    ~Timer() override { cancel(); }  // a wait still queued must not call into its dead owner
    void arm(int64_t delay_us, std::function<void()> fn) override {
      const uint64_t gen = ++*gen_;
      net_.after(delay_us, [g = gen_, gen, fn = std::move(fn)] {
        if (*g == gen) fn();
      });
    }
    void cancel() override { ++*gen_; }

   private:
    Network& net_;
    std::shared_ptr<uint64_t> gen_ = std::make_shared<uint64_t>(0);
  };

  struct Io final : node::PeerIo {
    explicit Io(PeerNet& n) : peers(n) {}
    ~Io() override { close(); }
    uint16_t open(const std::string& host, uint16_t port) override {
      if (port == 0) port = peers.next_port_++;
      self = {host, port};
      if (!peers.open_.emplace(key(self), this).second)
        throw std::runtime_error("address already in use");
      opened = true;
      return port;
    }
    void start_receiving(Receiver on) override { receiver = std::move(on); }
    bool send(const Endpoint& to, std::span<const uint8_t> bytes) override {
      if (!opened) return false;
      if (peers.tap) peers.tap(self, to, bytes);
      const int64_t at = peers.network.route(peers.node_of(self.host), peers.node_of(to.host));
      // Lost on the way or not: the sender cannot tell.
      const int64_t now = peers.network.now_us();
      if (at >= 0) peers.inject(self, to, {bytes.begin(), bytes.end()}, at - now);
      return true;
    }
    void close() override {
      if (!opened) return;
      opened = false;
      receiver = nullptr;
      peers.open_.erase(key(self));
    }
    std::unique_ptr<node::PeerTimer> timer() override {
      return std::make_unique<Timer>(peers.network);
    }

    PeerNet& peers;
    Endpoint self;
    bool opened = false;
    Receiver receiver;
  };

  static std::string key(const Endpoint& e) { return e.host + ":" + std::to_string(e.port); }
  size_t node_of(const std::string& host) {
    const auto [it, fresh] = hosts_.emplace(host, network.nodes());
    if (fresh) network.add_node();
    return it->second;
  }
  void deliver(const Endpoint& from, const Endpoint& to, const std::vector<uint8_t>& bytes) {
    if (!network.delivers(node_of(from.host), node_of(to.host))) return;
    const auto it = open_.find(key(to));
    if (it != open_.end() && it->second->receiver) it->second->receiver(bytes, from);
  }

  uint16_t next_port_ = 40'000;
  std::map<std::string, Io*> open_;
  std::map<std::string, size_t> hosts_;  // the network's node of each host
};

}  // namespace sluice::sim
