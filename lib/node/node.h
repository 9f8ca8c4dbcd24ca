// A Sluice node: the engine behind its fronts (the check protocol over UDP and TCP in
// lib/front/check, the admin HTTP port, Envoy's gRPC service in lib/rls, the Redis protocol door
// in lib/front/resp), the cluster runtime, rules reloads, a background sweeper and snapshots.
// `sluiced` is a thin main around it. Every front decides through the node's one routed check
// path (owner routing and forwarding in a cluster, lib/node/routed_check.h).
//
// Threads: `threads` check-front workers, each running its own io_context (front/check/
// check_front.h says which sockets each owns). One control io_context (the caller's thread,
// inside run()) owns the TCP acceptor, the cluster runtime, timers and signals. The admin port's
// connections are served on the check front's workers, its operator rows on a thread of its own;
// so are the RESP door's (its acceptor on the admin thread); the gRPC front has threads of its
// own. The engine is shared by all threads (it shards internally).
//
// Clock: the node reads time only through NodeOptions::clock, so tests can drive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "rls/rls.h"
#include "rules/rules.h"
#include "store/store.h"

namespace sluice::node {

// Cluster membership and sync (docs/operations.md, "Cluster"). Disabled: one node on its own.
struct ClusterOptions {
  bool enabled = false;
  uint16_t node_id = 0;   // unique in the cluster, 1..65535
  std::string name;       // unique and stable across restarts; default "node-<id>"
  std::string listen;     // peer UDP address, e.g. "127.0.0.1:7352"
  std::string advertise;  // IP other nodes reach this node at; default: listen's address
  // "host:port" of peers (a DNS name resolves to every address, at start), "dns:NAME" (every
  // A/AAAA address of NAME, with this node's peer port) or "dns+srv:_service._proto.NAME" (every
  // SRV target and port); the dns forms are resolved again every seed_refresh_ms and newly found
  // addresses are joined (lib/node/dns_seeds.h).
  std::vector<std::string> seeds;
  int64_t seed_refresh_ms = 30'000;
  // "IP:PORT" of the DNS server for dns: and dns+srv: seeds; "" = the system's (resolv.conf).
  std::string dns_server;
  std::string secret;   // shared by every node, >= 16 bytes (or secret_file)
  size_t replicas = 2;  // owner included
  int64_t sync_interval_ms = 100;
  int64_t anti_entropy_interval_ms = 5'000;
  int64_t probe_interval_ms = 1'000;
  // Owner mode: how long a forwarded check waits for the owner before it goes to the key's
  // replica (and as long again for the replica before the rule's fallback decides it here).
  // Twice this stays under libsluice's default 20 ms timeout.
  int64_t forward_timeout_ms = 8;
  // A member dead this long is no longer expected back: the limits stop counting its share out
  // (docs/architecture.md, "Members out of reach"). A member that leaves (drain) is not expected.
  int64_t forget_dead_after_ms = 300'000;
};

// What a service manager is told about a running node (sluiced: systemd's READY=1, RELOADING=1,
// STOPPING=1). kReady: every listener is open and the data directory restored, so checks are
// answered from now on, and in a cluster the first join has had an outcome (what /readyz waits
// for). kReloading, then kReloaded or kReloadFailed: a SIGHUP reload. kStopping:
// stop() has begun (SIGTERM, SIGINT, drain); the node leaves and finishes what is in flight.
enum class NodeEvent { kReady, kReloading, kReloaded, kReloadFailed, kStopping };

struct NodeOptions {
  std::string udp_listen = "127.0.0.1:7350";    // "" disables UDP
  std::string tcp_listen = "127.0.0.1:7350";    // "" disables TCP
  std::string admin_listen = "127.0.0.1:7351";  // "" disables the admin HTTP port
  // Envoy's rate limit service over gRPC (lib/rls, docs/envoy.md); "" disables it. The port is
  // envoyproxy/ratelimit's, so Envoy's cluster only changes its address.
  std::string grpc_listen = "127.0.0.1:8081";
  bool grpc_rate_limit_headers = false;  // RateLimit headers in response_headers_to_add
  // The Redis protocol door (lib/front/resp, docs/configuration.md); "" disables it. A door on
  // an address that is not loopback needs a password: the node refuses to start without one.
  std::string resp_listen = "127.0.0.1:7352";
  // Clients AUTH with the file's content (load_node_config reads it, as the admin token's).
  std::string resp_password_file;
  std::string resp_password;
  // The domain of CL.THROTTLE's keys (lib/node/resp_backend.h); added, without rules, when the
  // rules file does not name it.
  std::string resp_domain = "redis";
  unsigned threads = 2;
  std::string rules_file;  // "" = the embedded example rules (deploy/rules.example.yaml)
  // envoyproxy/ratelimit config: a file or a directory of them (docs/envoy-config.md); "" none.
  // With envoy_rules and no rules_file, the embedded example rules are not loaded.
  std::string envoy_rules;
  // How often the rules files are looked at for a change of content (a ConfigMap's ..data swap
  // included); a change reloads them as SIGHUP does. 0: only SIGHUP reloads.
  int64_t rules_watch_interval_ms = 2'000;
  // The admin port's token (docs/operations.md, "Admin token"): operator writes need
  // `Authorization: Bearer <token>`. admin_token is the file's content (load_node_config reads
  // it; SIGHUP reads the file again). With admin_token_reads, reads need it too.
  std::string admin_token_file;
  std::string admin_token;
  bool admin_token_reads = false;
  bool envoy_count_denied = true;   // imported rules count denied hits, as upstream
  std::string data_dir = "./data";  // RocksDB snapshots and overrides; "" = memory only
  bool init_data = false;           // create data_dir when it is missing or empty (first start)
  int64_t snapshot_interval_ms = 1'000;
  std::string log_level = "info";  // applied by sluiced
  // Counters and, with data_dir, their snapshots: store_write_buffer_bytes() of it goes to
  // RocksDB's memtables, store_working_bytes() is set aside for the rest of the snapshot path, the
  // remainder to the counter tables.
  uint64_t memory_cap_bytes = 1ull << 30;
  uint64_t hash_seed = 0x5a1c3e0d5eedull;  // the same on every node of a cluster
  int64_t sweep_interval_ms = 1'000;
  size_t max_tcp_pending_bytes = 4u << 20;  // per connection: stop reading past this much output
  // Slow and idle clients (docs/operations.md): each TCP listener (admin HTTP, TCP checks) holds
  // at most max_connections; one more closes the oldest idle one (waiting for a request) first.
  // A client has client_timeout_ms to send an HTTP request's header, then as long for its body,
  // and as long to finish a TCP check frame it started; an idle HTTP keep-alive connection is
  // closed after it too. An idle TCP check connection (between frames) has no deadline.
  size_t max_connections = 1024;
  int64_t client_timeout_ms = 10'000;
  // A UDP worker that has answered keeps reading its socket without sleeping for this long (µs)
  // before it waits on epoll again: a check that arrives meanwhile is read at once, without the
  // wake-up (tens to hundreds of µs on a virtual machine). Costs up to this much CPU after each
  // burst; 0 (the default) never spins.
  int64_t udp_busy_poll_us = 0;
  std::function<int64_t()> clock;  // ms since the epoch; default: system clock
  // Called on the control thread (the one inside run()) at each NodeEvent, with a one-line status
  // for people (ports, a reload's outcome). Short; it must not block nor call into the node.
  std::function<void(NodeEvent, std::string_view status)> on_event;
  ClusterOptions cluster;
};

// Loads a node config file (YAML; see docs/operations.md for the fields). A failure names the
// file, the line and the field, one error a line: io_error when the file cannot be read, else
// invalid_argument. Fields not given keep their value in `out`.
Status load_node_config(const std::string& path, NodeOptions& out);

// The embedded default rules text (deploy/rules.example.yaml at build time).
std::string_view embedded_rules();

// The RESP door's counters (front/resp/resp_front.h), copied for /metrics.
struct RespStats {
  bool enabled = false;
  uint64_t accepted = 0;
  uint64_t open = 0;
  std::vector<std::pair<std::string_view, uint64_t>> closed;           // by reason
  std::vector<std::pair<std::string_view, uint64_t>> protocol_errors;  // by reason
  uint64_t commands = 0;
  uint64_t unknown_commands = 0;
  uint64_t auth_failures = 0;
};

// Counters the node keeps besides the engine's, for /metrics and `sluicectl status`.
struct NodeCounters {
  uint64_t udp_requests = 0;
  uint64_t tcp_requests = 0;
  uint64_t tcp_connections = 0;
  uint64_t tcp_open = 0;           // TCP check connections open now
  uint64_t tcp_closed_shed = 0;    // closed to make room over max_connections (longest waiting)
  uint64_t tcp_closed_frame = 0;   // closed: a frame not finished within client_timeout_ms
  uint64_t dropped_datagrams = 0;  // undecodable, no id to answer to
  uint64_t closed_connections_bad_frame = 0;
  uint64_t rejected_requests = 0;   // answered with a request-level error code
  uint64_t forwarded_requests = 0;  // owner mode: client requests split to their keys' owners
  uint64_t forwarded_parts = 0;     // parts sent to another node
  uint64_t forward_fallbacks = 0;   // parts decided here: the owner was silent or unreachable
  uint64_t forward_failovers = 0;   // parts sent on to the key's replica after the owner's timeout
  uint64_t slice_prefetches = 0;    // leased quotas: slices asked for before the one held ran out
  uint64_t untrusted_forwards = 0;  // requests that claimed `forwarded` without the cluster's tag
  uint64_t reloads = 0;
  uint64_t reload_failures = 0;
  rls::RlsCounters rls;  // the gRPC front (all 0 when it is disabled)
  RespStats resp;        // the RESP door (all 0 when it is disabled)
  // check latency (decode + decide + encode, per request) histogram: bucket i counts requests
  // that took < 2^i microseconds (the last bucket: everything slower).
  std::vector<uint64_t> latency_us_buckets;
};

// The outcome of an operator action (override set/del, plan assign).
struct OpResult {
  enum class Kind { kOk, kInvalid, kNotFound, kStorage } kind = Kind::kOk;
  std::string message;  // why, when not kOk
  bool ok() const { return kind == Kind::kOk; }
};

// What the node's persistence has done, for `sluicectl status` and /metrics.
struct PersistenceStatus {
  bool enabled = false;
  std::string dir;
  int64_t snapshot_interval_ms = 0;
  store::RestoreResult restored;  // at start
  store::Snapshotter::Status snapshots;
  store::Store::DiskUsage disk;      // the counters' and the overrides' databases (store.h)
  store::Store::MemoryUsage memory;  // what RocksDB holds in memory for them (store.h)
  size_t overrides = 0;
};

struct NodeState;
struct ClusterStatus;

class Node {
 public:
  // Checks every setting and listen address, loads the rules (the file, or the embedded
  // default), opens the data directory and builds the engine; binds nothing. A failure names the
  // problem: invalid_argument (a rule, a setting, an address, a token file's content), or the
  // store's Status (a data directory locked by another process: unavailable; see store.h).
  static StatusOr<std::unique_ptr<Node>> open(NodeOptions options);
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Binds every listener (throws std::runtime_error naming the address on failure), then serves
  // until stop(). SIGHUP reloads the rules; SIGTERM and SIGINT stop. Returns when every worker
  // has finished what it had in flight.
  void run(bool handle_signals = true);
  // Thread-safe; may be called from a signal handler context of Asio or another thread.
  void stop();
  // Re-reads the rules file and swaps the policy; counters of remaining rules are kept. A failure
  // (invalid_argument) carries the errors, one a line; the old rules stay in force.
  Status reload();

  // Ports actually bound (useful with port 0); valid once run() has bound them (ready() true).
  bool ready() const { return ready_.load(); }
  uint16_t udp_port() const;
  uint16_t tcp_port() const;
  uint16_t admin_port() const;
  uint16_t grpc_port() const;  // 0 when the gRPC front is disabled
  uint16_t resp_port() const;  // 0 when the RESP door is disabled

  engine::Engine& engine();
  NodeCounters counters() const;
  // Decides an encoded check request (wire::encode_request) the way the check ports do: on a
  // worker, through the cluster's owner routing (forwarded to the keys' owners in owner mode).
  // `done` runs on that worker's thread with the encoded answer, or with nothing when the node
  // is stopping or the request has no id; it must be short and must not block. Any thread.
  void check_async(std::vector<uint8_t> request,
                   std::function<void(std::span<const uint8_t>)> done);
  // Decides an encoded check request on the calling thread, into `out`, when this node decides
  // every check itself: a node on its own (no owner routing to do). Returns false, touching
  // nothing, for a cluster node or one that is stopping: use check_async. Any thread; each thread
  // keeps its own scratch, so a front's threads decide without handing work to a worker.
  bool check_here(std::span<const uint8_t> request, std::vector<uint8_t>& out);
  // check_here for checks a front holds as structs: no encoding either way. The decisions (one
  // per check) stay valid until this thread's next decide_here.
  bool decide_here(std::span<const wire::Check> checks,
                   std::span<const wire::DecisionView>& decisions);

  // Runtime overrides (docs/rules.md, "Overrides"). set and delete write to the data directory
  // first (WAL synced), then apply without a restart; the node's rules must have the override's
  // domain and a rule keyed by exactly its entries (a plan must exist in the domain, and that rule
  // must take plans). Thread-safe; they block on the disk, so never call them from a check thread.
  OpResult set_override(rules::Override o);
  OpResult delete_override(const std::string& domain,
                           std::span<const std::pair<std::string, std::string>> entries);
  std::optional<rules::Override> get_override(
      const std::string& domain,
      std::span<const std::pair<std::string, std::string>> entries) const;
  std::vector<rules::Override> list_overrides() const;
  // The cluster version of an override's record (when it was written, and by which node), or of
  // its tombstone; nullopt when this node holds neither. Thread-safe.
  std::optional<cluster::OverrideVersion> override_version(
      const std::string& domain,
      std::span<const std::pair<std::string, std::string>> entries) const;
  // Drops overrides whose TTL ran out (they already stopped applying), and forgets records past
  // their horizon (docs/architecture.md, "Overrides across the cluster") from memory and disk.
  size_t prune_overrides();

  // The cluster as this node sees it (enabled = false for a single node). Any thread; waits for
  // the control thread (at most ~2 s).
  struct ClusterStatus cluster_status() const;
  // Why the node should not take traffic yet (empty: ready): starting, stopping, or in a cluster
  // not yet joined (ClusterStatus::not_ready). Any thread; waits like cluster_status().
  std::string not_ready() const;
  // Owners of a counter (owner first); empty for a single node. Any thread.
  std::vector<std::pair<uint16_t, std::string>> owners_of(uint64_t counter) const;
  // Leaves the cluster gracefully (hands the counters to the next owners), then stops the node.
  // False when the node is not in a cluster.
  bool drain();

  // Runs a snapshot pass now; nullopt when the node has no data directory.
  std::optional<store::SnapshotResult> snapshot_now(bool full);
  PersistenceStatus persistence() const;
  int64_t now_ms() const;
  int64_t started_ms() const;
  const NodeOptions& options() const;

  struct Impl;

 private:
  explicit Node(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  NodeState* state_ = nullptr;  // the part of *impl_ that node_ops.cc sees
  std::atomic<bool> ready_{false};
};

// The share of memory_cap_bytes a node with a data directory gives RocksDB's write buffers: an
// eighth, at least store::kMinWriteBufferBytes, at most store::kDefaultWriteBufferBytes (64 MiB).
uint64_t store_write_buffer_bytes(uint64_t memory_cap_bytes);
// The share it sets aside for what RocksDB and the snapshot pass use beside the write buffers
// while they write (store.h, "Memory"): an eighth, at most store::kWorkingBytes.
uint64_t store_working_bytes(uint64_t memory_cap_bytes);

}  // namespace sluice::node
