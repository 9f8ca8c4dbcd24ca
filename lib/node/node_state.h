// Private to lib/node: the state a node's network front (node.cc, Asio) and its operator actions
// (node_ops.cc, no Asio) share. Node::Impl extends it with the sockets, threads and timers.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "engine/engine.h"
#include "node/node.h"
#include "rules/rules.h"
#include "store/store.h"

namespace sluice::node {

struct NodeState {
  // Loads the rules, opens the data directory (overrides, then counters), builds the engine.
  // Throws std::runtime_error naming the problem (sluiced prints it and exits 2).
  explicit NodeState(NodeOptions o);
  ~NodeState();

  // Compiles `rules` with the overrides in force and swaps the engine's policy. rules_mu held.
  void apply_locked();
  // Re-reads the rules file; "" or the errors (the old rules stay).
  std::string reload();
  // Operator actions (Node's public API forwards here).
  OpResult set_override(rules::Override o);
  OpResult delete_override(const std::string& domain,
                           std::span<const std::pair<std::string, std::string>> entries);
  size_t prune_overrides();
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

  mutable std::mutex rules_mu;  // guards rules and overrides (control paths only)
  rules::RuleSet rules;         // as last parsed from the rules file
  rules::Overrides overrides;

  std::unique_ptr<engine::Engine> engine;
  std::atomic<uint64_t> reloads{0}, reload_failures{0};
};

}  // namespace sluice::node
