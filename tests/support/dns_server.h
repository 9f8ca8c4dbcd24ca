// Test support: a real DNS server (dnsmasq, deploy/setup.sh installs it) on a free loopback port,
// serving the records a test gives it and nothing else (no upstream, no hosts file, names under
// .test answered NXDOMAIN when unknown). Records change by restarting it on the same port with
// new ones (dnsmasq re-reads only files on SIGHUP, not --host-record / --srv-host).
//
// Contract: every wait is bounded (start: until it answers a query, at most 5 s); the destructor
// SIGKILLs and reaps it. Not thread-safe: one test thread drives it.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"

namespace sluice::testing {

class DnsServer {
 public:
  // `records`: dnsmasq options, e.g. "--host-record=a.sluice.test,127.0.0.1" or
  // "--srv-host=_sluice._udp.sluice.test,a.sluice.test,7001".
  explicit DnsServer(std::vector<std::string> records) {
    port_ = free_loopback_port();
    REQUIRE_MESSAGE(port_ != 0, "no free loopback port below the ephemeral range");
    log_ = std::filesystem::temp_directory_path() /
           ("sluice-dnsmasq-" + std::to_string(::getpid()) + "-" + std::to_string(port_) + ".log");
    start(std::move(records));
  }
  ~DnsServer() {
    stop();
    std::error_code ec;
    std::filesystem::remove(log_, ec);
  }
  DnsServer(const DnsServer&) = delete;
  DnsServer& operator=(const DnsServer&) = delete;

  static bool available() { return ::access(kBinary, X_OK) == 0; }

  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // Serves `records` from now on (same port).
  void restart(std::vector<std::string> records) {
    stop();
    start(std::move(records));
  }

 private:
  static constexpr const char* kBinary = "/usr/sbin/dnsmasq";

  void start(std::vector<std::string> records) {
    REQUIRE_MESSAGE(available(), "dnsmasq is not installed (deploy/setup.sh installs it)");
    std::vector<std::string> args = {kBinary,
                                     "--no-daemon",
                                     "--port=" + std::to_string(port_),
                                     "--listen-address=127.0.0.1",
                                     "--bind-interfaces",
                                     "--no-resolv",
                                     "--no-hosts",
                                     "--conf-file=/dev/null",
                                     "--pid-file=",
                                     "--local=/test/",
                                     "--no-negcache",
                                     "--log-facility=" + log_.string()};
    if (::geteuid() == 0) args.push_back("--user=root");  // no "nobody" switch needed
    for (std::string& r : records)
      args.push_back(std::move(r));
    std::vector<char*> argv;
    for (std::string& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a test binary killed -9
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // Up when it answers a query for a name it does not know (NXDOMAIN) at all.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      if (answers()) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("dnsmasq exited at start: " << read_log());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL("dnsmasq did not answer within 5 s: " << read_log());
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // One A query for "probe.test", answered within 200 ms.
  bool answers() const {
    const unsigned char query[] = {0x12, 0x34, 0x01, 0x00, 0, 1,   0,   0,   0,   0, 0, 0, 5, 'p',
                                   'r',  'o',  'b',  'e',  4, 't', 'e', 's', 't', 0, 0, 1, 0, 1};
    const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port_);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::sendto(s, query, sizeof query, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
    pollfd p{s, POLLIN, 0};
    bool ok = false;
    if (::poll(&p, 1, 200) == 1) {
      unsigned char buf[512];
      ok = ::recv(s, buf, sizeof buf, 0) >= 12 && buf[0] == 0x12 && buf[1] == 0x34;
    }
    ::close(s);
    return ok;
  }

  std::string read_log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  uint16_t port_ = 0;
  pid_t pid_ = -1;
  std::filesystem::path log_;
};

}  // namespace sluice::testing
