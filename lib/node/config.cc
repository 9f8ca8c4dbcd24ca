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
             "log_level)");
      }
    } catch (const YAML::Exception&) {
      fail(v, key, "has the wrong type");
    }
  }
  if (!errors.empty()) errors.pop_back();
  return errors;
}

}  // namespace sluice::node
