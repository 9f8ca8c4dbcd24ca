// Private to lib/node: cluster seeds found through DNS, so that the pods of a Kubernetes headless
// service find each other without a fixed list (docs/operations.md, "Seeds from DNS").
//
//   dns:NAME                        every A and AAAA address of NAME, with this node's peer port
//   dns+srv:_service._proto.NAME    every SRV record's target (its A and AAAA addresses) and port
//
// Resolution uses a real resolver: getaddrinfo for A/AAAA (hosts file and nsswitch included),
// libresolv's res_nquery for SRV. With a DNS server given (cluster.dns_server, or
// SLUICE_DNS_SERVER in sluiced's environment) every query goes to it with res_nquery, A/AAAA
// included, since getaddrinfo cannot be pointed at a server.
//
// DnsSeedWatcher resolves on a thread of its own (the queries block), at start and then every
// refresh interval; a name that does not resolve is retried sooner, with back-off (1 s doubling up
// to the refresh interval), and logged once per change of its error, never fatal. Whenever the
// addresses found include one not reported before, `on_found` gets every address found now; the
// caller contacts them like seeds (ClusterNode joins them on its control thread).
//
// Thread-safety: the resolve functions are reentrant (each query has its own res_state). A
// DnsSeedWatcher is started and stopped by one thread; `on_found` runs on the watcher's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/status.h"
#include "cluster/membership.h"

namespace sluice::node {

// A DNS server to send queries to: "IPv4:PORT" or "IPv4" (port 53).
struct DnsServerAddress {
  std::string ip;
  uint16_t port = 53;
  std::string error;  // "" when parsed
};
DnsServerAddress parse_dns_server(std::string_view text);

struct DnsSeed {
  enum class Kind { kAddress, kA, kSrv } kind = Kind::kAddress;
  std::string name;  // kA, kSrv: the DNS name; kAddress: the seed as written ("host:port")
};
DnsSeed classify_seed(std::string_view seed);
// Ok, or invalid_argument saying why a seed is malformed ("dns:" without a name, a name with
// spaces, ...).
Status check_seed(std::string_view seed);

struct DnsAnswer {
  std::vector<cluster::Endpoint> endpoints;  // IP literals
  std::string error;                         // "" when the name resolved to something
};
// Blocking: at most a few seconds for a server that does not answer (2 tries, 1 s apart).
// `peer_port` is the port of kA addresses. A kAddress seed is not resolved here.
DnsAnswer resolve_dns_seed(const DnsSeed& seed, uint16_t peer_port,
                           const std::optional<DnsServerAddress>& server);

class DnsSeedWatcher {
 public:
  struct Options {
    std::vector<DnsSeed> seeds;  // kA and kSrv ones (others are ignored)
    uint16_t peer_port = 0;
    int64_t refresh_ms = 30'000;
    int64_t min_backoff_ms = 1'000;
    std::optional<DnsServerAddress> server;
  };
  using Found = std::function<void(std::vector<cluster::Endpoint> all)>;

  DnsSeedWatcher(Options options, Found on_found);
  ~DnsSeedWatcher();  // stop()
  DnsSeedWatcher(const DnsSeedWatcher&) = delete;
  DnsSeedWatcher& operator=(const DnsSeedWatcher&) = delete;

  void start();
  // Wakes the thread and joins it (after the query in flight, a few seconds at most). Idempotent.
  void stop();

 private:
  void run();
  // One pass over every name; returns true when all resolved.
  bool pass();

  const Options opt_;
  const Found on_found_;
  std::vector<std::string> last_error_;        // per seed, for logging once per change
  std::vector<cluster::Endpoint> last_found_;  // sorted: what the names resolved to last
  std::mutex mu_;                              // guards stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sluice::node
