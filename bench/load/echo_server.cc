#include "load/echo_server.h"

#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "load/targets.h"

namespace sluice::bench {
namespace {

constexpr size_t kBurst = 32;        // datagrams per recvmmsg / sendmmsg, as sluiced
constexpr size_t kSlot = 64 * 1024;  // the largest datagram
constexpr int kWaitMs = 100;         // epoll timeout: how soon a stop is noticed
std::atomic<bool> stop_flag{false};

void on_signal(int) {
  stop_flag.store(true);
}

// A socket bound to 127.0.0.1:port with SO_REUSEPORT (one per thread), non-blocking; -1 on error.
int bound_socket(int type, uint16_t port) {
  const int fd = ::socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  const sockaddr_in a = loopback(port);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
      (type == SOCK_STREAM && ::listen(fd, 1024) != 0)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Adds fd to the epoll set `ep`.
void watch(int ep, int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

void udp_loop(int fd) {
  std::vector<uint8_t> buf(kBurst * kSlot);
  std::array<iovec, kBurst> iov{};
  std::array<mmsghdr, kBurst> msgs{};
  std::array<sockaddr_storage, kBurst> peers{};
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  watch(ep, fd, EPOLLIN);
  while (!stop_flag.load(std::memory_order_relaxed)) {
    epoll_event ready{};
    if (::epoll_wait(ep, &ready, 1, kWaitMs) <= 0) continue;
    // Serve what is waiting, a burst at a time (bounded; then back to epoll like sluiced).
    for (int round = 0; round < 8; ++round) {
      for (size_t i = 0; i < kBurst; ++i) {
        iov[i] = {buf.data() + i * kSlot, kSlot};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_name = &peers[i];
        msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      const int got = ::recvmmsg(fd, msgs.data(), kBurst, MSG_DONTWAIT, nullptr);
      if (got <= 0) break;
      // The same bytes back to the same peers: the messages just received, each as long as it came.
      for (size_t i = 0; i < static_cast<size_t>(got); ++i)
        iov[i].iov_len = msgs[i].msg_len;
      for (int sent = 0; sent < got;) {
        const int k =
            ::sendmmsg(fd, msgs.data() + sent, static_cast<unsigned>(got - sent), MSG_DONTWAIT);
        if (k <= 0) break;  // socket buffer full: those are lost, as sluiced's would be
        sent += k;
      }
      if (static_cast<size_t>(got) < kBurst) break;
    }
  }
  ::close(ep);
}

// Writes what waits in `out` as far as the socket takes it; false when the connection failed.
bool drain(int fd, std::string& out) {
  while (!out.empty()) {
    const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

void tcp_loop(int listener) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  watch(ep, listener, EPOLLIN);
  std::unordered_map<int, std::string> unsent;  // by connection: read, not yet written back
  std::vector<char> buf(256 * 1024);
  std::array<epoll_event, 64> ready{};
  while (!stop_flag.load(std::memory_order_relaxed)) {
    const int n = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), kWaitMs);
    for (int i = 0; i < n; ++i) {
      const int fd = ready[static_cast<size_t>(i)].data.fd;
      if (fd == listener) {
        for (int k = 0; k < 64; ++k) {
          const int c = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          const int one = 1;
          ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          watch(ep, c, EPOLLIN | EPOLLOUT | EPOLLET);
          unsent[c];
        }
        continue;
      }
      auto it = unsent.find(fd);
      if (it == unsent.end()) continue;
      std::string& out = it->second;
      bool ok = drain(fd, out);
      // Edge-triggered: read until the socket is empty (bounded by a few buffers a wake-up).
      for (int k = 0; ok && k < 64; ++k) {
        const ssize_t r = ::recv(fd, buf.data(), buf.size(), 0);
        if (r > 0) {
          // The usual case: nothing waits, the bytes go straight back; what does not go waits.
          const ssize_t w =
              out.empty() ? ::send(fd, buf.data(), static_cast<size_t>(r), MSG_NOSIGNAL) : 0;
          if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ok = false;
          out.append(buf.data() + std::max<ssize_t>(w, 0), buf.data() + r);
          ok = ok && drain(fd, out);
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        ok = r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        break;
      }
      if (!ok) {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        unsent.erase(fd);
      }
    }
  }
  for (auto& [fd, out] : unsent)
    ::close(fd);
  ::close(ep);
}

}  // namespace

int run_echo_server(const std::string& transport, uint16_t port, unsigned threads) {
  if (transport != "udp" && transport != "tcp") {
    std::fprintf(stderr, "echo server: transport must be udp or tcp, not '%s'\n",
                 transport.c_str());
    return 1;
  }
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  const int type = transport == "udp" ? SOCK_DGRAM : SOCK_STREAM;
  std::vector<int> fds;
  for (unsigned t = 0; t < std::max(1u, threads); ++t) {
    const int fd = bound_socket(type, port);
    if (fd < 0) {
      std::fprintf(stderr, "echo server: cannot bind %s 127.0.0.1:%u: %s\n", transport.c_str(),
                   port, std::strerror(errno));
      for (const int f : fds)
        ::close(f);
      return 1;
    }
    fds.push_back(fd);
  }
  std::vector<std::thread> workers;
  for (const int fd : fds)
    workers.emplace_back([fd, type] { type == SOCK_DGRAM ? udp_loop(fd) : tcp_loop(fd); });
  for (auto& w : workers)
    w.join();
  for (const int fd : fds)
    ::close(fd);
  return 0;
}

}  // namespace sluice::bench
