// For membership tests that drive one node by hand: a transport that records what the node sends,
// and a shorthand for the messages a test feeds it.
#pragma once

#include <utility>
#include <vector>

#include "cluster/membership.h"

namespace sluice::testing {

struct Sent {
  cluster::Endpoint to;
  cluster::MembershipMessage message;
};

class RecordingTransport : public cluster::MembershipTransport {
 public:
  void send(const cluster::Endpoint& to, const cluster::MembershipMessage& m) override {
    sent.push_back({to, m});
  }
  std::vector<Sent> take() { return std::exchange(sent, {}); }
  std::vector<Sent> sent;
};

inline cluster::MembershipMessage msg(cluster::MembershipKind kind, cluster::NodeId from,
                                      uint32_t seq, cluster::NodeId target,
                                      std::vector<cluster::Member> gossip = {}) {
  cluster::MembershipMessage m;
  m.kind = kind;
  m.from = from;
  m.seq = seq;
  m.target = target;
  m.gossip = std::move(gossip);
  return m;
}

}  // namespace sluice::testing
