// DNS seeds (lib/node/dns_seeds.h) against a real DNS server: dnsmasq on a free loopback port
// (tests/support/dns_server.h) serving A, AAAA and SRV records of a "headless service". The
// resolver code is the one sluiced runs (res_nquery pointed at the server); the 3-node cluster
// formed through SRV records is tests/cluster/dns_cluster_test.cc.
#include "node/dns_seeds.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dns_server.h"

namespace {

using sluice::cluster::Endpoint;
using sluice::node::classify_seed;
using sluice::node::DnsSeedWatcher;
using sluice::node::DnsServerAddress;
using sluice::node::parse_dns_server;
using sluice::node::resolve_dns_seed;
using sluice::testing::DnsServer;

DnsServerAddress server_of(const DnsServer& dns) {
  const DnsServerAddress a = parse_dns_server(dns.address());
  REQUIRE(a.error == "");
  return a;
}

}  // namespace

TEST_CASE("dns:NAME resolves every A and AAAA address of a headless service, with the peer port") {
  DnsServer dns(
      {"--host-record=peers.sluice.test,127.0.0.11", "--host-record=peers.sluice.test,127.0.0.12",
       "--host-record=peers.sluice.test,::1", "--host-record=v6only.sluice.test,fd00::7"});
  const auto a = resolve_dns_seed(classify_seed("dns:peers.sluice.test"), 7352, server_of(dns));
  CHECK(a.error == "");
  CHECK(a.endpoints ==
        std::vector<Endpoint>{{"127.0.0.11", 7352}, {"127.0.0.12", 7352}, {"::1", 7352}});
  const auto b = resolve_dns_seed(classify_seed("dns:v6only.sluice.test"), 9, server_of(dns));
  CHECK(b.error == "");
  CHECK(b.endpoints == std::vector<Endpoint>{{"fd00::7", 9}});
}

TEST_CASE("dns+srv: resolves each SRV record's target and port") {
  DnsServer dns({"--host-record=pod-a.sluice.test,127.0.0.1",
                 "--host-record=pod-b.sluice.test,127.0.0.2",
                 "--srv-host=_sluice._udp.sluice.test,pod-a.sluice.test,7001",
                 "--srv-host=_sluice._udp.sluice.test,pod-a.sluice.test,7002",
                 "--srv-host=_sluice._udp.sluice.test,pod-b.sluice.test,7003"});
  const auto a =
      resolve_dns_seed(classify_seed("dns+srv:_sluice._udp.sluice.test"), 1, server_of(dns));
  CHECK(a.error == "");
  CHECK(a.endpoints ==
        std::vector<Endpoint>{{"127.0.0.1", 7001}, {"127.0.0.1", 7002}, {"127.0.0.2", 7003}});
}

TEST_CASE("a name that does not resolve is an error value naming why, not an exception") {
  DnsServer dns({"--host-record=known.sluice.test,127.0.0.1"});
  const auto a = resolve_dns_seed(classify_seed("dns:unknown.sluice.test"), 1, server_of(dns));
  CHECK(a.endpoints.empty());
  CHECK(a.error.find("NXDOMAIN") != std::string::npos);
  const auto b =
      resolve_dns_seed(classify_seed("dns+srv:_none._udp.sluice.test"), 1, server_of(dns));
  CHECK(b.endpoints.empty());
  CHECK(b.error != "");
  // A server that does not answer: an error after the bounded retries (2 tries, 1 s apart).
  DnsServerAddress silent = parse_dns_server("127.0.0.1:9");  // discard: nothing answers
  const auto t0 = std::chrono::steady_clock::now();
  const auto c = resolve_dns_seed(classify_seed("dns:known.sluice.test"), 1, silent);
  CHECK(c.endpoints.empty());
  CHECK(c.error != "");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("the watcher reports the addresses found, and again when DNS adds one") {
  DnsServer dns({"--host-record=pod-a.sluice.test,127.0.0.1",
                 "--srv-host=_sluice._udp.sluice.test,pod-a.sluice.test,7001"});
  std::mutex mu;
  std::vector<std::vector<Endpoint>> reports;  // guarded by mu
  DnsSeedWatcher::Options o;
  o.seeds = {classify_seed("dns+srv:_sluice._udp.sluice.test"),
             classify_seed("dns:missing.sluice.test")};  // fails: retried with back-off
  o.peer_port = 7000;
  o.refresh_ms = 200;
  o.min_backoff_ms = 50;
  o.server = server_of(dns);
  DnsSeedWatcher w(o, [&](std::vector<Endpoint> all) {
    std::lock_guard g(mu);
    reports.push_back(std::move(all));
  });
  w.start();
  const auto wait_reports = [&](size_t n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard g(mu);
        if (reports.size() >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  REQUIRE(wait_reports(1));
  {
    std::lock_guard g(mu);
    CHECK(reports[0] == std::vector<Endpoint>{{"127.0.0.1", 7001}});
  }
  dns.restart({"--host-record=pod-a.sluice.test,127.0.0.1",
               "--srv-host=_sluice._udp.sluice.test,pod-a.sluice.test,7001",
               "--srv-host=_sluice._udp.sluice.test,pod-a.sluice.test,7004"});
  REQUIRE(wait_reports(2));
  w.stop();
  std::lock_guard g(mu);
  CHECK(reports[1] == std::vector<Endpoint>{{"127.0.0.1", 7001}, {"127.0.0.1", 7004}});
  CHECK(reports.size() == 2);  // the same answer again is not news
}
