// A cluster that finds itself through DNS: three sluiced processes whose only
// seed is `dns+srv:_sluice._udp.sluice.test`, answered by a real DNS server (dnsmasq on a free
// loopback port, tests/support/dns_server.h) as a Kubernetes headless service would: one SRV
// record per pod. All nodes run on 127.0.0.1, so the records tell them apart by port. A fourth
// node, started with no seeds at all, is added to DNS later: the others find it by re-resolving.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cluster_process.h"
#include "dns_server.h"

namespace {

using namespace sluice::testing;
using std::chrono::milliseconds;

constexpr const char* kService = "_sluice._udp.sluice.test";

// The records of a headless service whose pods are these nodes' peer ports on 127.0.0.1.
std::vector<std::string> records_of(const LocalCluster& c, size_t nodes) {
  std::vector<std::string> r = {"--host-record=pods.sluice.test,127.0.0.1"};
  for (size_t i = 0; i < nodes; ++i) {
    r.push_back(std::string("--srv-host=") + kService + ",pods.sluice.test," +
                std::to_string(c.node(i).peer_port));
  }
  return r;
}

}  // namespace

TEST_CASE("nodes whose only seed is a DNS SRV name form a cluster, and find a node added later") {
  DnsServer dns(std::vector<std::string>{});  // records once the nodes' ports are known
  ClusterSpec spec;
  spec.sluiced_bin = SLUICED_BIN;
  spec.nodes = 3;
  spec.rules_yaml = two_mode_rules(100);
  spec.seeds = [](size_t index) {
    // The fourth node knows nobody: only the others' re-resolution can find it.
    return index < 3 ? std::vector<std::string>{std::string("dns+srv:") + kService}
                     : std::vector<std::string>{};
  };
  spec.extra_cluster_config = {"seed_refresh_ms: 500", "dns_server: " + dns.address()};
  LocalCluster c(spec);
  for (size_t i = 0; i < 3; ++i)
    REQUIRE(c.configure_node() == i);
  dns.restart(records_of(c, 3));
  for (size_t i = 0; i < 3; ++i)
    REQUIRE(c.start_node(i) == "");
  CHECK_MESSAGE(c.wait_all_alive(milliseconds(20000)),
                "3 nodes did not list each other alive within 20 s: " << c.describe());

  const size_t fourth = c.configure_node();
  REQUIRE(fourth == 3);
  REQUIRE(c.start_node(fourth) == "");
  // Not in DNS yet: nobody finds it (it knows nobody either).
  std::this_thread::sleep_for(milliseconds(1500));  // three refresh intervals
  CHECK(c.member_state(0, c.node(fourth).id) == "");
  CHECK(c.member_state(fourth, c.node(0).id) == "");

  dns.restart(records_of(c, 4));
  CHECK_MESSAGE(c.wait_all_alive(milliseconds(20000)),
                "the node added to DNS was not found within 20 s: " << c.describe());
}

// Readiness (/readyz, the Kubernetes readiness probe; /healthz?ready is the same): a node is live
// as soon as its admin port answers, but ready only once its first join has an outcome. While its
// DNS seed has no records it says so; once the records name a peer that does not answer it is
// joining; when every join round went unanswered it is ready alone (a first pod); a node that joins
// a live member is ready as soon as the member answers. Readiness stays once reached: later join
// rounds (new DNS addresses) do not take it back.
TEST_CASE("readiness waits for the DNS seed to resolve and the first join to end") {
  DnsServer dns(std::vector<std::string>{"--host-record=pods.sluice.test,127.0.0.1"});
  ClusterSpec spec;
  spec.sluiced_bin = SLUICED_BIN;
  spec.nodes = 2;
  spec.rules_yaml = two_mode_rules(100);
  spec.seeds = [](size_t) { return std::vector<std::string>{std::string("dns+srv:") + kService}; };
  spec.extra_cluster_config = {"seed_refresh_ms: 500", "dns_server: " + dns.address()};
  LocalCluster c(spec);
  REQUIRE(c.configure_node() == 0);
  REQUIRE(c.configure_node() == 1);
  REQUIRE(c.start_node(0) == "");

  CHECK(c.get(0, "/healthz").status == 200);  // live
  HttpReply r = c.get(0, "/readyz");
  CHECK(r.status == 503);
  CHECK_MESSAGE(r.body.find("no DNS seed has resolved yet") != std::string::npos, r.body);
  auto status = c.cluster_json(0);
  REQUIRE(status);
  CHECK((*status)["ready"] == false);
  CHECK(c.get(0, "/metrics").body.find("sluice_cluster_ready 0") != std::string::npos);

  // The records now name both nodes; node 1 is not running, so node 0's join goes unanswered.
  dns.restart(records_of(c, 2));
  CHECK(wait_until([&] { return c.get(0, "/readyz").body.find("joining") != std::string::npos; },
                   milliseconds(5000), milliseconds(20)));
  // Every round unanswered (5 rounds, 1 s apart): ready alone.
  const auto t0 = SteadyClock::now();
  CHECK(wait_until([&] { return c.get(0, "/readyz").status == 200; }, milliseconds(15000),
                   milliseconds(50)));
  CHECK(SteadyClock::now() - t0 >= milliseconds(2000));
  CHECK(c.get(0, "/readyz").body == "ready\n");
  CHECK(c.get(0, "/healthz?ready").body == "ready\n");  // the older form of the probe
  CHECK(c.get(0, "/metrics").body.find("sluice_cluster_ready 1") != std::string::npos);

  // Node 1 resolves the same records, and node 0 answers its join: ready within a few rounds.
  REQUIRE(c.start_node(1) == "");
  CHECK(wait_until([&] { return c.get(1, "/readyz").status == 200; }, milliseconds(5000),
                   milliseconds(20)));
  status = c.cluster_json(1);
  REQUIRE(status);
  CHECK((*status)["join_state"] == "joined");
  CHECK((*status)["ready"] == true);
  // Node 0 found node 1 (its own new join round) and stayed ready throughout.
  CHECK(c.wait_all_alive(milliseconds(20000)));
  CHECK(c.get(0, "/readyz").status == 200);
  CHECK(c.get(0, "/healthz?ready=1&x=%zz").status == 400);
}
