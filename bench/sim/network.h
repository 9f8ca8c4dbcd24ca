// sim::Network, the one simulated network of the tests and the benches: a clock in simulated µs,
// one queue of events, one seeded generator, and the faults between numbered nodes (delay, loss,
// partitions, killed nodes). What runs on it are layers: membership_nodes.h (Membership nodes,
// under tests/support/membership_sim.h and cluster.h) and tests/support/sim_cluster.h
// (the sockets and timers of real ClusterNodes). A run is a function of the seed: no wall clock,
// no threads, no other randomness.
//
// Why a library under bench/: the benches' figures and the tests' assertions rest on this one
// model, so it lives beside the load generator and is built whenever the tests or the benches are
// (the sanitizer build has no benches, and its unit tests need it).
//
// Order: events (functions to call at a time) run by time, and at one time in the order they were
// scheduled; the clock jumps to each event's time before it runs.
//
// The fate of a message (route()), in this order of draws:
//   - lost at once, without a draw, if the two nodes are cut apart;
//   - lost with probability p, one draw (uniform() < p) made only when p > 0; p is the loss of
//     every message, or 1 - (1 - every) * (1 - from the sender) * (1 - into the receiver) when
//     either node has a loss of its own;
//   - else it arrives after a delay uniform over {min, min + step, ..., max} µs (one draw,
//     rng() % count), plus the sender's extra delay.
// At arrival (delivers()) it is dropped if the receiver is down or cut apart from the sender.
//
// Single-threaded: the layers, the events and the caller run on one thread.
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <random>
#include <utility>
#include <vector>

namespace sluice::sim {

struct Delays {  // a message's one-way delay: uniform over {min_us, min_us + step_us, ..., max_us}
  int64_t min_us = 200;
  int64_t max_us = 2'000;
  int64_t step_us = 1;
};

// Values in flight (messages), each in a slot reused once given back: an event's function then
// holds only a slot number, small enough for std::function to store without allocating, and a
// slot's buffers are reused by the next value assigned to it. References stay valid (a deque).
template <class T>
class Slots {
 public:
  uint32_t take() {
    if (free_.empty()) {
      slots_.emplace_back();
      return static_cast<uint32_t>(slots_.size() - 1);
    }
    const uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  T& operator[](uint32_t slot) { return slots_[slot]; }
  void give_back(uint32_t slot) { free_.push_back(slot); }

 private:
  std::deque<T> slots_;
  std::vector<uint32_t> free_;
};

class Network {
 public:
  Network(uint64_t seed, int64_t start_us, Delays delays = {});
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  int64_t now_us() const { return now_us_; }
  int64_t now_ms() const { return now_us_ / 1'000; }
  // Calls `fn` at `at_us` (now if that has passed), or `delay_us` from now: an event.
  void at(int64_t at_us, std::function<void()> fn);
  void after(int64_t delay_us, std::function<void()> fn) {
    at(now_us_ + std::max<int64_t>(0, delay_us), std::move(fn));
  }
  uint64_t events() const { return events_; }
  void set_max_events(uint64_t max) { max_events_ = max; }  // then run_until() stops: false
  bool out_of_events() const { return events_ >= max_events_; }

  // Runs the events due by `until_us`, or until stop() holds after one (then true); the clock
  // ends at `until_us` unless stopped. stop() is asked once more at the end.
  template <class Stop>
  bool run_until(int64_t until_us, Stop&& stop) {
    while (!queue_.empty() && queue_.top().at_us <= until_us) {
      if (out_of_events()) return false;
      step();
      if (stop()) return true;
    }
    now_us_ = std::max(now_us_, until_us);
    return stop();
  }
  void run_for(int64_t us) {
    run_until(now_us_ + us, [] { return false; });
  }

  // Every draw of a run comes from here.
  std::mt19937_64& rng() { return rng_; }
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }  // [0, 1)

  size_t add_node() {  // its index: up, in reach of every node, no loss or delay of its own
    nodes_.emplace_back();
    return nodes_.size() - 1;
  }
  size_t nodes() const { return nodes_.size(); }
  bool up(size_t i) const { return nodes_[i].up; }
  void set_up(size_t i, bool up) { nodes_[i].up = up; }
  void set_loss(double p) { loss_ = p; }  // of every message
  void set_loss_into(size_t i, double p) { nodes_[i].loss_into = p; }
  void set_loss_from(size_t i, double p) { nodes_[i].loss_from = p; }
  void set_extra_delay(size_t i, int64_t us) { nodes_[i].extra_delay_us = us; }  // a slow node
  // The nodes of `side` apart from the rest; isolate(): one node apart from all; until heal().
  void partition(const std::vector<size_t>& side) {
    heal();
    for (size_t i : side)
      nodes_[i].group = 1;
  }
  void isolate(size_t i) { nodes_[i].group = ++groups_; }
  void heal() {
    for (Node& n : nodes_)
      n.group = 0;
  }
  bool reachable(size_t a, size_t b) const { return nodes_[a].group == nodes_[b].group; }

  // A message `from` sends `to` now: when it arrives, or -1 if it is lost on the way.
  int64_t route(size_t from, size_t to);
  bool delivers(size_t from, size_t to) const { return up(to) && reachable(from, to); }

 private:
  struct Node {
    bool up = true;
    uint32_t group = 0;  // nodes reach each other within a group
    double loss_into = 0;
    double loss_from = 0;
    int64_t extra_delay_us = 0;
  };
  struct Due {  // ordered by time, then by when it was scheduled (first in, first out)
    int64_t at_us = 0;
    uint64_t order = 0;
    uint32_t slot = 0;  // its function in fns_
    auto operator<=>(const Due&) const = default;
  };

  void step();

  int64_t now_us_;
  std::mt19937_64 rng_;
  Delays delays_;
  double loss_ = 0;
  uint32_t groups_ = 1;
  std::vector<Node> nodes_;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> queue_;  // the earliest on top
  Slots<std::function<void()>> fns_;                                  // the events' functions
  uint64_t order_ = 0;
  uint64_t events_ = 0;
  uint64_t max_events_ = UINT64_MAX;
};

}  // namespace sluice::sim
