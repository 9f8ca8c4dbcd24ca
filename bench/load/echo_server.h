// The ceilings of the load benchmark's network paths: a bare UDP echo (recvmmsg / sendmmsg) and a
// bare TCP echo, served the way sluiced serves its check port (one epoll loop per thread, UDP
// sockets sharing the port with SO_REUSEPORT, up to 32 datagrams per system call each way, TCP
// read and written back in place) but doing no work on the bytes. Driven with the same requests
// as sluiced, on the same number of threads, they give the most this machine's kernel and loopback
// carry for that traffic: what the check path is compared against (the cost of the bare network
// path).
//
// sluice-bench-load runs it as a child process of its own binary (--echo-server), so the echo
// and sluiced are measured alike (a process of their own, CPU read from /proc).
#pragma once

#include <cstdint>
#include <string>

namespace sluice::bench {

// Serves `transport` ("udp" or "tcp") on 127.0.0.1:port with `threads` threads until SIGTERM or
// SIGINT. Returns the process exit code (0, or 1 after printing why to stderr).
int run_echo_server(const std::string& transport, uint16_t port, unsigned threads);

}  // namespace sluice::bench
