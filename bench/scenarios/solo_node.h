// The one sluiced of the single-node scenarios (soak, keyspray): its options, named alike in both,
// the node started in a fresh directory, one rule limiting every key per minute, and the UDP
// socket and request encoding both use to check keys of their own choosing.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/scenario.h"
#include "load/targets.h"
#include "wire/protocol.h"

namespace sluice::bench {

struct SoloNodeOptions {
  explicit SoloNodeOptions(uint64_t per_minute) : limit(per_minute) {}

  uint64_t limit;  // every key's limit per minute
  uint32_t server_threads = 1;
  bool memory_only = false;  // no data directory: no snapshots, no RocksDB memtable
  std::string sluiced;

  void declare(Cli& cli) {
    cli.number("--limit", limit, 1, 1e12, "every key's limit per minute");
    cli.server_threads(server_threads);
    cli.flag("--memory-only", memory_only,
             "sluiced without a data directory (no snapshots to RocksDB)");
    cli.sluiced(sluiced);
  }
};

// Started by the constructor (throws when it does not answer), stopped and removed with it.
struct SoloNode {
  TempDir dir;
  SluicedChild child;

  // rule_extra and config_extra as SluicedChild's.
  SoloNode(const SoloNodeOptions& o, const std::string& program, std::string rule_extra = "",
           std::string config_extra = "") {
    child.exe = o.sluiced;
    child.written_by = program;
    child.limits = std::to_string(o.limit) + "/1m";
    child.rule_extra = std::move(rule_extra);
    child.config_extra = std::move(config_extra);
    child.threads = o.server_threads;
    child.data = !o.memory_only;
    child.start(dir.path);
  }
  pid_t pid() const { return child.process.pid(); }
};

// A UDP socket connected to 127.0.0.1:port; throws when it cannot be made.
inline int udp_to_node(uint16_t port, bool nonblocking) {
  const int fd =
      ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  const sockaddr_in a = loopback(port);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    const std::string e = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("udp 127.0.0.1:" + std::to_string(port) + ": " + e);
  }
  return fd;
}

// Encodes into `msg` request `id` of one check of 1 hit per key name_of(0) .. name_of(n - 1), each
// keyed kSluiceEntryKey=<name> in kSluiceDomain.
template <class NameOf>
void encode_checks(uint64_t id, size_t n, NameOf name_of, std::vector<uint8_t>& msg) {
  thread_local std::vector<wire::Entry> entries;
  thread_local std::vector<wire::Check> checks;
  entries.resize(n);
  checks.resize(n);
  for (size_t j = 0; j < n; ++j) {
    entries[j] = wire::Entry{kSluiceEntryKey, name_of(j)};
    checks[j] = wire::Check{kSluiceDomain, std::span<const wire::Entry>(&entries[j], 1), 1};
  }
  wire::encode_request(id, checks, 0, msg);
}

}  // namespace sluice::bench
