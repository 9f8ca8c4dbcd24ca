// Private to lib/node: what a node's cluster part (ClusterNode, OverrideSync) needs from outside
// besides the engine: a datagram socket to the other members and one-shot timers. The daemon
// runs them on UDP and Asio's steady timers (make_udp_peer_io); tests pass a simulated network
// with a clock they step (tests/support/sim_cluster.h), so that several ClusterNodes run in one
// thread, deterministically, and time passes only when the test says.
//
// Everything here is called on, and calls back on, the node's control thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "cluster/membership.h"  // cluster::Endpoint

namespace boost::asio {
class io_context;
}

namespace sluice::node {

class PeerTimer {
 public:
  virtual ~PeerTimer() = default;
  // Calls `fn` once, `delay_us` from now (0: as soon as the control thread is free), unless
  // cancel() or another arm() comes first: each arm() replaces the wait before it, which is then
  // never called.
  virtual void arm(int64_t delay_us, std::function<void()> fn) = 0;
  virtual void cancel() = 0;
};

class PeerIo {
 public:
  using Receiver =
      std::function<void(std::span<const uint8_t> datagram, const cluster::Endpoint& from)>;
  virtual ~PeerIo() = default;
  // Binds to `host` (an IP address) and `port` (0: one the system picks). Returns the port bound.
  // Throws std::runtime_error with the reason.
  virtual uint16_t open(const std::string& host, uint16_t port) = 0;
  // Hands every datagram that arrives to `on` until close().
  virtual void start_receiving(Receiver on) = 0;
  // Sends one datagram. False when it could not be handed to the network (a bad address, a full
  // buffer): the caller counts it.
  virtual bool send(const cluster::Endpoint& to, std::span<const uint8_t> bytes) = 0;
  // Stops receiving and closes the socket. Idempotent.
  virtual void close() = 0;
  virtual std::unique_ptr<PeerTimer> timer() = 0;
};

// UDP on `control`'s thread, with a 4 MiB receive buffer; timers are Asio steady timers.
std::unique_ptr<PeerIo> make_udp_peer_io(boost::asio::io_context& control);

}  // namespace sluice::node
