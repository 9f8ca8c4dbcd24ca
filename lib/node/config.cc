// The node config file (YAML) and the embedded default rules.
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <limits>
#include <sstream>

#include "node/node.h"
#include "node_embedded_rules.h"  // generated from deploy/rules.example.yaml

namespace sluice::node {
namespace {

std::string where(const std::string& path, const YAML::Node& n, const std::string& field) {
  return path + ":" + std::to_string(n.Mark().line + 1) + ": " + field + ": ";
}

std::string read_secret_file(const std::string& file, std::string& out) {
  std::ifstream in(file);
  if (!in) return "cannot read " + file;
  std::stringstream text;
  text << in.rdbuf();
  out = text.str();
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return "";
}

// The `cluster:` map. Errors are appended through `fail`.
template <class Fail>
void load_cluster(const YAML::Node& c, ClusterOptions& out, Fail&& fail) {
  if (!c.IsMap()) {
    fail(c, "cluster", "must be a map of settings");
    return;
  }
  out.enabled = true;
  for (const auto& kv : c) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    const std::string field = "cluster." + key;
    try {
      if (key == "node_id") {
        const auto id = v.as<int64_t>();
        if (id < 1 || id > 65535) {
          fail(v, field, "must be between 1 and 65535");
        } else {
          out.node_id = static_cast<uint16_t>(id);
        }
      } else if (key == "name") {
        out.name = v.as<std::string>();
      } else if (key == "listen") {
        out.listen = v.as<std::string>();
      } else if (key == "advertise") {
        out.advertise = v.as<std::string>();
      } else if (key == "seeds") {
        out.seeds = v.as<std::vector<std::string>>();
      } else if (key == "secret") {
        out.secret = v.as<std::string>();
      } else if (key == "secret_file") {
        if (std::string err = read_secret_file(v.as<std::string>(), out.secret); !err.empty()) {
          fail(v, field, err);
        }
      } else if (key == "replicas") {
        const auto r = v.as<int64_t>();
        if (r < 1 || r > 8) {
          fail(v, field, "must be between 1 and 8");
        } else {
          out.replicas = static_cast<size_t>(r);
        }
      } else if (key == "sync_interval_ms" || key == "anti_entropy_interval_ms" ||
                 key == "probe_interval_ms" || key == "forward_timeout_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 1 || ms > 600'000) {
          fail(v, field, "must be between 1 and 600000");
        } else if (key == "sync_interval_ms") {
          out.sync_interval_ms = ms;
        } else if (key == "anti_entropy_interval_ms") {
          out.anti_entropy_interval_ms = ms;
        } else if (key == "probe_interval_ms") {
          out.probe_interval_ms = ms;
        } else {
          out.forward_timeout_ms = ms;
        }
      } else {
        fail(kv.first, field,
             "unknown setting (expected one of: node_id, name, listen, advertise, seeds, secret, "
             "secret_file, replicas, sync_interval_ms, anti_entropy_interval_ms, "
             "probe_interval_ms, forward_timeout_ms)");
      }
    } catch (const YAML::Exception&) {
      fail(v, field, "has the wrong type");
    }
  }
  if (out.node_id == 0) fail(c, "cluster.node_id", "is required (1..65535, unique per node)");
  if (out.listen.empty()) fail(c, "cluster.listen", "is required (the peer UDP address)");
  if (out.secret.size() < 16) {
    fail(c, "cluster.secret", "is required: at least 16 bytes shared by every node (or secret_file)");
  }
}

}  // namespace

std::string_view embedded_rules() { return kEmbeddedRules; }

std::string load_node_config(const std::string& path, NodeOptions& out) {
  std::ifstream in(path);
  if (!in) return path + ": cannot read the config file";
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::ParserException& e) {
    return path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg;
  }
  if (root.IsNull()) return {};  // an empty file keeps every default
  if (!root.IsMap()) return path + ": the config must be a map of settings";
  std::string errors;
  auto fail = [&](const YAML::Node& n, const std::string& field, const std::string& why) {
    errors += where(path, n, field) + why + "\n";
  };
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    try {
      if (key == "udp") {
        out.udp_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "tcp") {
        out.tcp_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "admin") {
        out.admin_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "threads") {
        const int t = v.as<int>();
        if (t < 1 || t > 256) {
          fail(v, key, "must be between 1 and 256");
        } else {
          out.threads = static_cast<unsigned>(t);
        }
      } else if (key == "rules") {
        out.rules_file = v.as<std::string>();
      } else if (key == "data_dir") {
        out.data_dir = v.as<std::string>();
      } else if (key == "cluster") {
        load_cluster(v, out.cluster, fail);
      } else if (key == "init_data") {
        out.init_data = v.as<bool>();
      } else if (key == "snapshot_interval_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 10 || ms > 3'600'000) {
          fail(v, key, "must be between 10 and 3600000");
        } else {
          out.snapshot_interval_ms = ms;
        }
      } else if (key == "memory_cap_mb") {
        const auto mb = v.as<uint64_t>();
        if (mb < 1 || mb > (uint64_t{1} << 24)) {
          fail(v, key, "must be between 1 and 16777216 (MiB)");
        } else {
          out.memory_cap_bytes = mb << 20;
        }
      } else if (key == "hash_seed") {
        out.hash_seed = v.as<uint64_t>();
      } else if (key == "sweep_interval_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 10) {
          fail(v, key, "must be at least 10");
        } else {
          out.sweep_interval_ms = ms;
        }
      } else if (key == "log_level") {
        const auto lvl = v.as<std::string>();
        if (lvl != "trace" && lvl != "debug" && lvl != "info" && lvl != "warn" &&
            lvl != "error" && lvl != "off") {
          fail(v, key, "must be one of trace, debug, info, warn, error, off");
        } else {
          out.log_level = lvl;
        }
      } else {
        fail(kv.first, key,
             "unknown setting (expected one of: udp, tcp, admin, threads, rules, data_dir, "
             "init_data, snapshot_interval_ms, memory_cap_mb, hash_seed, sweep_interval_ms, "
             "log_level, cluster)");
      }
    } catch (const YAML::Exception&) {
      fail(v, key, "has the wrong type");
    }
  }
  if (!errors.empty()) errors.pop_back();
  return errors;
}

}  // namespace sluice::node
