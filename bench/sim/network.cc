// The one simulated network (network.h): the queue of events and the fate of a message.
#include "sim/network.h"

#include <utility>

namespace sluice::sim {

Network::Network(uint64_t seed, int64_t start_us, Delays delays)
    : now_us_(start_us), rng_(seed), delays_(delays) {}

void Network::at(int64_t at_us, std::function<void()> fn) {
  const uint32_t slot = fns_.take();
  fns_[slot] = std::move(fn);
  queue_.push({std::max(at_us, now_us_), ++order_, slot});
}

void Network::step() {
  const Due due = queue_.top();
  queue_.pop();
  now_us_ = std::max(now_us_, due.at_us);
  ++events_;
  const std::function<void()> fn = std::move(fns_[due.slot]);
  fns_.give_back(due.slot);
  fn();
}

int64_t Network::route(size_t from, size_t to) {
  if (!reachable(from, to)) return -1;
  const Node& sender = nodes_[from];
  const Node& receiver = nodes_[to];
  double p = loss_;
  if (sender.loss_from > 0 || receiver.loss_into > 0)
    p = 1 - (1 - loss_) * (1 - sender.loss_from) * (1 - receiver.loss_into);
  if (p > 0 && uniform() < p) return -1;
  const auto count = static_cast<uint64_t>((delays_.max_us - delays_.min_us) / delays_.step_us + 1);
  return now_us_ + delays_.min_us + static_cast<int64_t>(rng_() % count) * delays_.step_us +
         sender.extra_delay_us;
}

}  // namespace sluice::sim
