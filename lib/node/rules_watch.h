// Private to lib/node: notices that the rules files' content changed, so the node reloads them
// without a SIGHUP (docs/operations.md, "Reloading rules").
//
// Polling, not inotify: a Kubernetes ConfigMap volume updates by swapping a `..data` symlink to a
// new timestamped directory, so the file's own inode never changes and a watch on it never fires.
// Each look opens the paths as configured (symlinks resolved then) and hashes what they hold: a
// directory of envoy rules by the names and contents of its .yaml/.yml files, as
// rules::load_envoy_rules reads them. Rules files are small; reading them every couple of seconds
// costs nothing worth measuring.
//
// Thread-safety: none; one thread (the node's control thread) owns a RulesWatch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice::node {

class RulesWatch {
 public:
  // `paths`: the rules file and/or the envoy rules file or directory ("" entries are skipped).
  // Records the content as it is now.
  explicit RulesWatch(std::vector<std::string> paths);

  // True when the content differs from what the previous call (or the constructor) saw. A file
  // that cannot be read counts as content of its own ("missing"), so its return is a change too.
  bool changed();

  // The fingerprint of the content now (exposed for tests).
  uint64_t fingerprint() const;

 private:
  std::vector<std::string> paths_;
  uint64_t last_ = 0;
};

}  // namespace sluice::node
