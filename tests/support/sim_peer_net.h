// A simulated network and clock for ClusterNodes in one test process (lib/node/peer_io.h): every
// node's PeerIo comes from one SimPeerNet, which holds one queue of events, (time in µs,
// insertion order) first: the delivery of a datagram (one-way delay uniform in
// [min_delay_us, max_delay_us]) or a timer's expiry. Time moves only in advance(), which runs the
// events due in order, setting the clock to each one's time first; between two events it calls
// `between` (the test polls its io_context there, for what OverrideSync's thread posts back).
//
// Faults: `cut(a, b)` drops what `a` sends to `b` (both ways with `cut_both`); `loss` drops each
// datagram with that probability; `tap` sees every datagram sent (a copy can be fed back with
// inject(), a replay). A datagram to an address nobody has open is dropped on arrival. Every
// random choice comes from one generator seeded by the test.
//
// Single-threaded: the test, the nodes' callbacks and the timers all run on the test's thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "node/peer_io.h"

namespace sluice::testing {

class SimPeerNet {
 public:
  using Endpoint = cluster::Endpoint;

  SimPeerNet(int64_t start_ms, uint64_t seed) : now_us_(start_ms * 1'000), rng_(seed) {}
  SimPeerNet(const SimPeerNet&) = delete;
  SimPeerNet& operator=(const SimPeerNet&) = delete;

  int64_t now_ms() const { return now_us_ / 1'000; }
  int64_t now_us() const { return now_us_; }

  // A PeerIo on this network (for ClusterNode's constructor). It lives as long as the node does;
  // the network must outlive it.
  std::unique_ptr<node::PeerIo> io() { return std::make_unique<Io>(*this); }

  // Runs every event due within `ms` from now, in order, then sets the clock to now + ms.
  void advance(int64_t ms) {
    const int64_t until = now_us_ + ms * 1'000;
    while (!events_.empty() && events_.top().at_us <= until) {
      Event e = events_.top();
      events_.pop();
      now_us_ = std::max(now_us_, e.at_us);
      e.fn();
      if (between) between();
    }
    now_us_ = until;
  }

  // Hands `bytes` to whoever has `to` open, as if `from` had sent them, after `delay_us`.
  void inject(const Endpoint& from, const Endpoint& to, std::vector<uint8_t> bytes,
              int64_t delay_us = 0) {
    schedule(delay_us, [this, from, to, b = std::move(bytes)] {
      const auto it = open_.find(key(to));
      if (it == open_.end() || !it->second->receiver) return;
      ++delivered;
      it->second->receiver(b, from);
    });
  }

  // Drops what the node at `from` (an IP) sends to the node at `to`.
  void cut(const std::string& from, const std::string& to) { cuts_.insert({from, to}); }
  void cut_both(const std::string& a, const std::string& b) {
    cut(a, b);
    cut(b, a);
  }
  // Cuts `host` off from everyone, both ways (heal() lifts it).
  void isolate(const std::string& host) { isolated_.insert(host); }
  void heal() {
    cuts_.clear();
    isolated_.clear();
  }

  double loss = 0;
  int64_t min_delay_us = 100, max_delay_us = 1'000;
  std::function<void(const Endpoint& from, const Endpoint& to, std::span<const uint8_t>)> tap;
  std::function<void()> between;
  uint64_t sent = 0, delivered = 0, dropped = 0;

 private:
  struct Event {
    int64_t at_us;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& o) const {
      return at_us != o.at_us ? at_us > o.at_us : seq > o.seq;
    }
  };

  class Timer final : public node::PeerTimer {
   public:
    explicit Timer(SimPeerNet& net) : net_(net) {}
    ~Timer() override { cancel(); }  // a wait still queued must not call into its dead owner
    void arm(int64_t delay_us, std::function<void()> fn) override {
      const uint64_t gen = ++*gen_;
      net_.schedule(std::max<int64_t>(0, delay_us), [g = gen_, gen, fn = std::move(fn)] {
        if (*g == gen) fn();
      });
    }
    void cancel() override { ++*gen_; }

   private:
    SimPeerNet& net_;
    std::shared_ptr<uint64_t> gen_ = std::make_shared<uint64_t>(0);
  };

  struct Io final : node::PeerIo {
    explicit Io(SimPeerNet& n) : net(n) {}
    ~Io() override { close(); }
    uint16_t open(const std::string& host, uint16_t port) override {
      if (port == 0) port = net.next_port_++;
      self = {host, port};
      if (!net.open_.emplace(net.key(self), this).second) {
        throw std::runtime_error("address already in use");
      }
      opened = true;
      return port;
    }
    void start_receiving(Receiver on) override { receiver = std::move(on); }
    bool send(const Endpoint& to, std::span<const uint8_t> bytes) override {
      if (!opened) return false;
      ++net.sent;
      if (net.tap) net.tap(self, to, bytes);
      if (net.blocked(self.host, to.host) ||
          (net.loss > 0 && std::uniform_real_distribution<double>(0, 1)(net.rng_) < net.loss)) {
        ++net.dropped;
        return true;  // lost on the way: the sender cannot tell
      }
      const int64_t delay =
          std::uniform_int_distribution<int64_t>(net.min_delay_us, net.max_delay_us)(net.rng_);
      net.inject(self, to, {bytes.begin(), bytes.end()}, delay);
      return true;
    }
    void close() override {
      if (!opened) return;
      opened = false;
      receiver = nullptr;
      net.open_.erase(net.key(self));
    }
    std::unique_ptr<node::PeerTimer> timer() override { return std::make_unique<Timer>(net); }

    SimPeerNet& net;
    Endpoint self;
    bool opened = false;
    Receiver receiver;
  };

  void schedule(int64_t delay_us, std::function<void()> fn) {
    events_.push({now_us_ + delay_us, seq_++, std::move(fn)});
  }
  bool blocked(const std::string& from, const std::string& to) const {
    return isolated_.count(from) || isolated_.count(to) || cuts_.count({from, to});
  }
  static std::string key(const Endpoint& e) { return e.host + ":" + std::to_string(e.port); }

  int64_t now_us_;
  uint64_t seq_ = 0;
  uint16_t next_port_ = 40'000;
  std::mt19937_64 rng_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::map<std::string, Io*> open_;
  std::set<std::pair<std::string, std::string>> cuts_;
  std::set<std::string> isolated_;
};

}  // namespace sluice::testing
