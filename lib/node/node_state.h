// Private to lib/node: the state a node's wiring (node.cc, Asio) and its operator actions
// (node_ops.cc, no Asio) share. Node::Impl extends it with the sockets, threads and timers.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cluster/override_table.h"
#include "engine/engine.h"
#include "node/node.h"
#include "rules/rules.h"
#include "store/store.h"

namespace sluice::node {

struct NodeState {
  // Keeps the options (the system clock when none is given); load() does the rest.
  explicit NodeState(NodeOptions o);
  // Loads the rules, opens the data directory (overrides, then counters), builds the engine:
  // invalid_argument with the rules' errors, or the store's Status. Once, before anything else.
  Status load();
  ~NodeState();

  // Compiles `rules` with the overrides in force and swaps the engine's policy. rules_mu held.
  void apply_locked();
  // Re-reads the rules file; invalid_argument with the errors when it fails (the old rules stay).
  Status reload();
  // Operator actions (Node's public API forwards here).
  OpResult set_override(rules::Override o);
  OpResult delete_override(const std::string& domain,
                           std::span<const std::pair<std::string, std::string>> entries);
  // Drops expired overrides from the policy, and records past their horizon (tombstones after
  // cluster::kDefaultTombstoneTtlMs) from memory and disk.
  size_t prune_overrides();

  // Overrides from other nodes (lib/node/override_sync.h): each record is checked like a local
  // write (cluster::check_record), the ones newer than this node's are persisted in one batch and
  // then applied, and the policy is recompiled once.
  struct OverrideMerge {
    std::vector<cluster::OverrideRecord> applied;
    size_t known = 0;                         // this node holds it or something newer
    size_t expired = 0;                       // past its horizon
    std::map<std::string, uint64_t> dropped;  // refused, by reason ("too_long", "storage", ...)
  };
  OverrideMerge merge_overrides(std::span<const cluster::OverrideRecord> records, uint16_t from);
  cluster::OverrideDigest override_digest();
  std::vector<cluster::OverrideRecord> override_records_now();
  // The version node id of this node's writes: its cluster node id (0 without a cluster).
  uint16_t override_writer() const { return opt.cluster.enabled ? opt.cluster.node_id : 0; }
  // Stamps, checks, persists and applies a local set or delete (rules_mu held).
  OpResult write_record_locked(cluster::OverrideRecord rec);
  // Why the override cannot take effect under the current rules, or "". rules_mu held.
  std::string check_applies_locked(const rules::Override& o) const;

  // Starts periodic snapshots (no-op without a data directory).
  void start_snapshots();
  // The final snapshot, once every check has been answered.
  void stop_snapshots();

  NodeOptions opt;
  int64_t started_ms = 0;
  std::unique_ptr<store::Store> store;  // null without a data directory
  std::unique_ptr<store::Snapshotter> snapshotter;
  bool snapshots_stopped = false;  // the final pass ran (run()'s thread, then the destructor)
  store::RestoreResult restored;

  mutable std::mutex rules_mu;              // guards rules and overrides (control paths only)
  rules::RuleSet rules;                     // as last parsed from the rules file
  rules::Overrides overrides;               // in force: the live sets of override_records
  cluster::OverrideTable override_records;  // every version and tombstone (the source of truth)
  // Called with every record a local write (set, delete) made, under rules_mu, so the cluster
  // can push it (it must not block). Set once before the admin thread starts; may stay empty.
  std::function<void(const cluster::OverrideRecord&)> on_local_override;

  std::unique_ptr<engine::Engine> engine;
  std::atomic<uint64_t> reloads{0}, reload_failures{0};
};

}  // namespace sluice::node
