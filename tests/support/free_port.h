// Test support: a loopback port for a test's (or a bench's) own server, free for both UDP and TCP
// when probed, and never handed out twice by one process (a cluster takes many ports at once, and
// a test that restarts a server keeps its port).
//
// The port is drawn at random from the 15,000 ports below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), so no client socket on the host (a resolver's query,
// a TCP connect, another program's bind to port 0) can be handed it between the probe and the
// server's bind, or while a test restarts its server on it. Header-only; no test framework.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <mutex>
#include <random>
#include <set>

namespace sluice::testing {

inline bool loopback_port_free(int type, uint16_t port) {
  const int s = ::socket(AF_INET, type, 0);
  if (s < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

// 0 when 200 draws found none.
inline uint16_t free_loopback_port() {
  static std::mutex mu;
  static std::set<uint16_t> given;
  static std::mt19937 pick{std::random_device{}()};
  std::lock_guard g(mu);
  int ephemeral_low = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int low = 0;
    if (range >> low && low > 2048) ephemeral_low = low;
  }
  const int low = ephemeral_low > 16025 ? ephemeral_low - 15000 : 1025;
  std::uniform_int_distribution<int> port_in(low, ephemeral_low - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const auto port = static_cast<uint16_t>(port_in(pick));
    if (given.count(port) != 0) continue;
    if (loopback_port_free(SOCK_STREAM, port) && loopback_port_free(SOCK_DGRAM, port)) {
      given.insert(port);
      return port;
    }
  }
  return 0;
}

}  // namespace sluice::testing
