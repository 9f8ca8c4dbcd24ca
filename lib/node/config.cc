// The node config file (YAML) and the embedded default rules.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <optional>
#include <string_view>
#include <system_error>

#include "node/admin_auth.h"
#include "node/dns_seeds.h"
#include "node/node.h"
#include "node_embedded_rules.h"  // generated from deploy/rules.example.yaml
#include "rules/yaml_guard.h"

namespace sluice::node {
namespace {

// Errors name the line of the setting's key. Not the value's: yaml-cpp gives a value left empty
// (`data_dir:`) the position of the next token, which can be lines further down.
// A field name or a value as written, with bytes that are not printable ASCII as \xHH, so that
// one error stays one line and a log never carries control bytes from the file.
std::string printable(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out.push_back(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

std::string where(const std::string& path, const YAML::Node& key, const std::string& field) {
  return path + ":" + std::to_string(key.Mark().line + 1) + ": " + printable(field) + ": ";
}

const char kEmpty[] = "must not be empty";

// "is a directory", "no such file or directory": strerror's text, lowercased to follow a colon.
std::string reason(int err) {
  std::string why = std::generic_category().message(err);
  if (!why.empty()) why[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(why[0])));
  return why;
}

// Reads a whole file into `out`; "" or why not. A directory is refused: opening one for reading
// succeeds, and std::ifstream then reads it as an empty file.
std::string read_file(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return reason(errno);
  std::string why;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    why = reason(errno);
  } else if (S_ISDIR(st.st_mode)) {
    why = reason(EISDIR);
  } else {
    std::string text;
    char chunk[16 * 1024];
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n > 0) {
        text.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        out = std::move(text);
        break;
      } else if (errno != EINTR) {
        why = reason(errno);
        break;
      }
    }
  }
  ::close(fd);
  return why;
}

std::string read_secret_file(const std::string& file, std::string& out) {
  std::string text;
  if (std::string why = read_file(file, text); !why.empty())
    return "cannot read " + file + ": " + why;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  out = std::move(text);
  return "";
}

}  // namespace

std::string read_admin_token_file(const std::string& path, std::string& token) {
  std::string text;
  if (std::string err = read_secret_file(path, text); !err.empty()) return err;
  if (text.empty()) return path + " is empty: write the admin token into it";
  token = std::move(text);
  return "";
}

namespace {

// A string setting's text, or nothing when it is "" (the caller reports it). Throws
// YAML::Exception when the value is not a scalar. Null values are reported before this is called:
// yaml-cpp would read them as the string "null".
std::optional<std::string> non_empty_text(const YAML::Node& v) {
  std::string s = v.as<std::string>();
  if (s.empty()) return std::nullopt;
  return s;
}

constexpr std::string_view kTopLevelSettings[] = {"udp",
                                                  "tcp",
                                                  "admin",
                                                  "grpc",
                                                  "grpc_rate_limit_headers",
                                                  "resp",
                                                  "resp_password_file",
                                                  "resp_domain",
                                                  "threads",
                                                  "rules",
                                                  "envoy_rules",
                                                  "envoy_count_denied",
                                                  "rules_watch_interval_ms",
                                                  "admin_token_file",
                                                  "admin_token_reads",
                                                  "data_dir",
                                                  "init_data",
                                                  "snapshot_interval_ms",
                                                  "memory_cap_mb",
                                                  "hash_seed",
                                                  "sweep_interval_ms",
                                                  "max_connections",
                                                  "client_timeout_ms",
                                                  "udp_busy_poll_us",
                                                  "log_level",
                                                  "cluster"};
constexpr std::string_view kClusterSettings[] = {"node_id",
                                                 "name",
                                                 "listen",
                                                 "advertise",
                                                 "seeds",
                                                 "seed_refresh_ms",
                                                 "dns_server",
                                                 "secret",
                                                 "secret_file",
                                                 "replicas",
                                                 "sync_interval_ms",
                                                 "anti_entropy_interval_ms",
                                                 "probe_interval_ms",
                                                 "forward_timeout_ms",
                                                 "forget_dead_after_ms"};

template <size_t N>
bool one_of(const std::string& key, const std::string_view (&names)[N]) {
  for (std::string_view n : names)
    if (key == n) return true;
  return false;
}

template <size_t N>
std::string unknown_setting(const std::string_view (&names)[N]) {
  std::string why = "unknown setting (expected one of: ";
  for (size_t i = 0; i < N; ++i) {
    if (i) why += ", ";
    why += names[i];
  }
  return why + ")";
}

// What an empty value should have been written as, when there is another way to say it.
std::string empty_hint(const std::string& field) {
  if (field == "rules") return " (leave rules out for the embedded example rules)";
  if (field == "envoy_rules") return " (leave envoy_rules out for none)";
  if (field == "data_dir") return " (write \"\" to keep everything in memory)";
  if (field == "cluster") return " (leave cluster out for a node on its own)";
  if (field == "cluster.seeds") return " (write [] for no seeds)";
  if (field == "admin_token_file") return " (leave admin_token_file out for no token)";
  if (field == "resp_password_file") return " (leave resp_password_file out for no password)";
  return "";
}

// The `cluster:` map; `section` is its key, the line that section-level errors name. Errors are
// appended through `fail`.
template <class Fail>
void load_cluster(const YAML::Node& section, const YAML::Node& c, ClusterOptions& out,
                  Fail&& fail) {
  if (!c.IsMap()) {
    fail(section, "cluster", "must be a map of settings");
    return;
  }
  out.enabled = true;
  for (const auto& kv : c) {
    const YAML::Node& k = kv.first;
    const std::string key = k.Scalar();
    const YAML::Node& v = kv.second;
    const std::string field = "cluster." + key;
    auto bad = [&](const std::string& why) { fail(k, field, why); };
    if (!one_of(key, kClusterSettings)) {
      bad(unknown_setting(kClusterSettings));
      continue;
    }
    if (v.IsNull()) {
      bad(kEmpty + empty_hint(field));
      continue;
    }
    try {
      if (key == "node_id") {
        const auto id = v.as<int64_t>();
        if (id < 1 || id > 65535) {
          bad("must be between 1 and 65535");
        } else {
          out.node_id = static_cast<uint16_t>(id);
        }
      } else if (key == "dns_server") {
        const std::optional<std::string> s = non_empty_text(v);
        if (!s) {
          bad(kEmpty + std::string(" (leave dns_server out for the system's resolver)"));
        } else if (std::string why = parse_dns_server(*s).error; !why.empty()) {
          bad(why);
        } else {
          out.dns_server = *s;
        }
      } else if (key == "seed_refresh_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 100 || ms > 3'600'000) {
          bad("must be between 100 and 3600000");
        } else {
          out.seed_refresh_ms = ms;
        }
      } else if (key == "name" || key == "listen" || key == "advertise" || key == "secret") {
        const std::optional<std::string> s = non_empty_text(v);
        if (!s) {
          bad(kEmpty);
        } else if (key == "name") {
          out.name = *s;
        } else if (key == "listen") {
          out.listen = *s;
        } else if (key == "advertise") {
          out.advertise = *s;
        } else {
          out.secret = *s;
        }
      } else if (key == "seeds") {
        auto seeds = v.as<std::vector<std::string>>();
        bool empty_seed = false;
        std::string bad_seed;
        for (const auto& seed : v)
          if (seed.IsNull() || seed.as<std::string>().empty()) empty_seed = true;
        for (const std::string& seed : seeds) {
          if (std::string why = check_seed(seed); !why.empty() && bad_seed.empty()) bad_seed = why;
        }
        if (empty_seed) {
          bad("must not contain an empty address");
        } else if (!bad_seed.empty()) {
          bad(bad_seed);
        } else {
          out.seeds = std::move(seeds);
        }
      } else if (key == "secret_file") {
        if (const std::optional<std::string> file = non_empty_text(v); !file) {
          bad(kEmpty);
        } else if (std::string err = read_secret_file(*file, out.secret); !err.empty()) {
          bad(err);
        }
      } else if (key == "replicas") {
        const auto r = v.as<int64_t>();
        if (r < 1 || r > 8) {
          bad("must be between 1 and 8");
        } else {
          out.replicas = static_cast<size_t>(r);
        }
      } else if (key == "forget_dead_after_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 0 || ms > 86'400'000) {
          bad("must be between 0 and 86400000 (a day)");
        } else {
          out.forget_dead_after_ms = ms;
        }
      } else {  // the intervals
        const auto ms = v.as<int64_t>();
        if (ms < 1 || ms > 600'000) {
          bad("must be between 1 and 600000");
        } else if (key == "sync_interval_ms") {
          out.sync_interval_ms = ms;
        } else if (key == "anti_entropy_interval_ms") {
          out.anti_entropy_interval_ms = ms;
        } else if (key == "probe_interval_ms") {
          out.probe_interval_ms = ms;
        } else {
          out.forward_timeout_ms = ms;
        }
      }
    } catch (const YAML::Exception&) {
      bad("has the wrong type");
    }
  }
  if (out.node_id == 0) fail(section, "cluster.node_id", "is required (1..65535, unique per node)");
  if (out.listen.empty()) fail(section, "cluster.listen", "is required (the peer UDP address)");
  if (out.secret.size() < 16) {
    fail(section, "cluster.secret",
         "is required: at least 16 bytes shared by every node (or secret_file)");
  }
}

}  // namespace

std::string_view embedded_rules() {
  return kEmbeddedRules;
}

std::string load_node_config(const std::string& path, NodeOptions& out) {
  std::string text;
  if (std::string why = read_file(path, text); !why.empty()) {
    return path + ": cannot read the config file: " + why;
  }
  if (const int nul = rules::yaml_nul_line(text); nul != 0) {
    return path + ":" + std::to_string(nul) + ": " + std::string(rules::kYamlNul);
  }
  YAML::Node root;
  try {
    if (const rules::YamlDocuments d = rules::count_yaml_documents(text); d.count > 1) {
      return path + ":" + std::to_string(d.second_line) +
             ": the config holds more than one YAML document; keep one";
    }
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg;
  }
  if (root.IsNull()) return {};  // an empty file keeps every default
  if (!root.IsMap()) return path + ": the config must be a map of settings";
  std::string errors;
  auto fail = [&](const YAML::Node& key, const std::string& field, const std::string& why) {
    // `why` may quote a value from the file (a path that cannot be read): printable too.
    errors += where(path, key, field) + printable(why) + "\n";
  };
  std::optional<YAML::Node> token_reads_key;  // admin_token_reads: true needs a token file
  for (const auto& kv : root) {
    const YAML::Node& k = kv.first;
    const std::string key = k.Scalar();
    const YAML::Node& v = kv.second;
    auto bad = [&](const std::string& why) { fail(k, key, why); };
    if (!one_of(key, kTopLevelSettings)) {
      bad(unknown_setting(kTopLevelSettings));
      continue;
    }
    // A listener left empty is off, as documented; every other setting needs a value.
    const bool listener =
        key == "udp" || key == "tcp" || key == "admin" || key == "grpc" || key == "resp";
    if (v.IsNull() && !listener) {
      bad(kEmpty + empty_hint(key));
      continue;
    }
    try {
      if (key == "udp") {
        out.udp_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "tcp") {
        out.tcp_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "admin") {
        out.admin_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "grpc") {
        out.grpc_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "resp") {
        out.resp_listen = v.IsNull() ? "" : v.as<std::string>();
      } else if (key == "resp_password_file") {
        if (const std::optional<std::string> file = non_empty_text(v); !file) {
          bad(kEmpty + empty_hint(key));
        } else if (std::string err = read_admin_token_file(*file, out.resp_password);
                   !err.empty()) {
          bad(err);
        } else {
          out.resp_password_file = *file;
        }
      } else if (key == "resp_domain") {
        if (const std::optional<std::string> d = non_empty_text(v); !d) {
          bad(kEmpty + empty_hint(key));
        } else {
          out.resp_domain = *d;
        }
      } else if (key == "grpc_rate_limit_headers") {
        out.grpc_rate_limit_headers = v.as<bool>();
      } else if (key == "threads") {
        const int t = v.as<int>();
        if (t < 1 || t > 256) {
          bad("must be between 1 and 256");
        } else {
          out.threads = static_cast<unsigned>(t);
        }
      } else if (key == "rules") {
        // "" would silently serve the embedded example rules in production.
        if (const std::optional<std::string> file = non_empty_text(v); !file) {
          bad(kEmpty + empty_hint(key));
        } else {
          out.rules_file = *file;
        }
      } else if (key == "envoy_rules") {
        if (const std::optional<std::string> envoy = non_empty_text(v); !envoy) {
          bad(kEmpty + empty_hint(key));
        } else {
          out.envoy_rules = *envoy;
        }
      } else if (key == "envoy_count_denied") {
        out.envoy_count_denied = v.as<bool>();
      } else if (key == "rules_watch_interval_ms") {
        const auto ms = v.as<int64_t>();
        if (ms != 0 && (ms < 100 || ms > 3'600'000)) {
          bad("must be 0 (off) or between 100 and 3600000");
        } else {
          out.rules_watch_interval_ms = ms;
        }
      } else if (key == "admin_token_file") {
        if (const std::optional<std::string> file = non_empty_text(v); !file) {
          bad(kEmpty + empty_hint(key));
        } else if (std::string err = read_admin_token_file(*file, out.admin_token); !err.empty()) {
          bad(err);
        } else {
          out.admin_token_file = *file;
        }
      } else if (key == "admin_token_reads") {
        out.admin_token_reads = v.as<bool>();
        if (out.admin_token_reads) token_reads_key = k;
      } else if (key == "data_dir") {
        out.data_dir = v.as<std::string>();  // "" = memory only, documented
      } else if (key == "cluster") {
        load_cluster(k, v, out.cluster, fail);
      } else if (key == "init_data") {
        out.init_data = v.as<bool>();
      } else if (key == "max_connections") {
        const auto n = v.as<int64_t>();
        if (n < 1 || n > 1'000'000) {
          bad("must be between 1 and 1000000");
        } else {
          out.max_connections = static_cast<size_t>(n);
        }
      } else if (key == "udp_busy_poll_us") {
        const auto us = v.as<int64_t>();
        if (us < 0 || us > 10'000) {
          bad("must be between 0 and 10000");
        } else {
          out.udp_busy_poll_us = us;
        }
      } else if (key == "client_timeout_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 100 || ms > 3'600'000) {
          bad("must be between 100 and 3600000");
        } else {
          out.client_timeout_ms = ms;
        }
      } else if (key == "snapshot_interval_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 10 || ms > 3'600'000) {
          bad("must be between 10 and 3600000");
        } else {
          out.snapshot_interval_ms = ms;
        }
      } else if (key == "memory_cap_mb") {
        const auto mb = v.as<uint64_t>();
        if (mb < 1 || mb > (uint64_t{1} << 24)) {
          bad("must be between 1 and 16777216 (MiB)");
        } else {
          out.memory_cap_bytes = mb << 20;
        }
      } else if (key == "hash_seed") {
        out.hash_seed = v.as<uint64_t>();
      } else if (key == "sweep_interval_ms") {
        const auto ms = v.as<int64_t>();
        if (ms < 10) {
          bad("must be at least 10");
        } else {
          out.sweep_interval_ms = ms;
        }
      } else if (key == "log_level") {
        const auto lvl = v.as<std::string>();
        if (lvl != "trace" && lvl != "debug" && lvl != "info" && lvl != "warn" && lvl != "error" &&
            lvl != "off") {
          bad("must be one of trace, debug, info, warn, error, off");
        } else {
          out.log_level = lvl;
        }
      }
    } catch (const YAML::Exception&) {
      bad("has the wrong type");
    }
  }
  if (token_reads_key && out.admin_token_file.empty() && errors.empty()) {
    fail(*token_reads_key, "admin_token_reads", "needs admin_token_file (the token to ask for)");
  }
  if (!errors.empty()) errors.pop_back();
  return errors;
}

}  // namespace sluice::node
