// The node config file (YAML) and the embedded default rules.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <functional>
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

// Reads a whole file; io_error with why not (strerror's text, lowercased). A directory is
// refused: opening one for reading succeeds, and std::ifstream then reads it as an empty file.
StatusOr<std::string> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(reason(errno));
  std::string why;
  std::string text;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    why = reason(errno);
  } else if (S_ISDIR(st.st_mode)) {
    why = reason(EISDIR);
  } else {
    char chunk[16 * 1024];
    for (;;) {
      const ssize_t n = ::read(fd, chunk, sizeof(chunk));
      if (n > 0) {
        text.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        break;
      } else if (errno != EINTR) {
        why = reason(errno);
        break;
      }
    }
  }
  ::close(fd);
  if (!why.empty()) return Status::IoError(why);
  return text;
}

StatusOr<std::string> read_secret_file(const std::string& file) {
  StatusOr<std::string> read = read_file(file);
  if (!read.ok()) return Status::IoError("cannot read " + file + ": " + read.message());
  std::string text = std::move(*read);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  return text;
}

}  // namespace

StatusOr<std::string> read_admin_token_file(const std::string& path) {
  StatusOr<std::string> text = read_secret_file(path);
  if (text.ok() && text->empty()) {
    return Status::InvalidArgument(path + " is empty: write the admin token into it");
  }
  return text;
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

// Reports a setting's problem (the caller knows the key and its line).
using Bad = std::function<void(const std::string&)>;

// One setting of a map of settings: how its value is read into the options. A table of them is
// the map's reference: its names, in order, are what an unknown key is told to choose from.
template <class Options>
struct Setting {
  std::string_view name;
  void (*load)(const YAML::Node& v, Options& out, const Bad& bad);
  bool may_be_null = false;  // a listener left empty is off, as documented
};

// An integer setting within [lo, hi], or `why`.
template <class T, class Out>
void in_range(const YAML::Node& v, T lo, T hi, Out& out, const Bad& bad, const char* why) {
  const T n = v.as<T>();
  if (n < lo || n > hi) {
    bad(why);
  } else {
    out = static_cast<Out>(n);
  }
}

// A string setting that must not be "" (`hint`: what to write instead).
void text(const YAML::Node& v, std::string& out, const Bad& bad, std::string_view hint = "") {
  if (const std::optional<std::string> s = non_empty_text(v); !s) {
    bad(kEmpty + std::string(hint));
  } else {
    out = *s;
  }
}

// A file holding a secret: its path into `file` and its text into `secret`, read now so that a
// missing or empty file is a config error naming it.
void secret_file(const YAML::Node& v, std::string& file, std::string& secret, const Bad& bad,
                 std::string_view field) {
  if (const std::optional<std::string> f = non_empty_text(v); !f) {
    bad(kEmpty + empty_hint(std::string(field)));
  } else if (StatusOr<std::string> read = read_admin_token_file(*f); !read.ok()) {
    bad(read.message());
  } else {
    secret = std::move(*read);
    file = *f;
  }
}

std::string listen_text(const YAML::Node& v) {
  return v.IsNull() ? "" : v.as<std::string>();
}

using Top = Setting<NodeOptions>;
const Top kTopLevelSettings[] = {
    {"udp", [](const auto& v, auto& o, const Bad&) { o.udp_listen = listen_text(v); }, true},
    {"tcp", [](const auto& v, auto& o, const Bad&) { o.tcp_listen = listen_text(v); }, true},
    {"admin", [](const auto& v, auto& o, const Bad&) { o.admin_listen = listen_text(v); }, true},
    {"grpc", [](const auto& v, auto& o, const Bad&) { o.grpc_listen = listen_text(v); }, true},
    {"grpc_rate_limit_headers",
     [](const auto& v, auto& o, const Bad&) { o.grpc_rate_limit_headers = v.template as<bool>(); }},
    {"resp", [](const auto& v, auto& o, const Bad&) { o.resp_listen = listen_text(v); }, true},
    {"resp_password_file",
     [](const auto& v, auto& o, const Bad& bad) {
       secret_file(v, o.resp_password_file, o.resp_password, bad, "resp_password_file");
     }},
    {"resp_domain", [](const auto& v, auto& o, const Bad& bad) { text(v, o.resp_domain, bad); }},
    {"threads",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range(v, 1, 256, o.threads, bad, "must be between 1 and 256");
     }},
    // "" would silently serve the embedded example rules in production.
    {"rules", [](const auto& v, auto& o,
                 const Bad& bad) { text(v, o.rules_file, bad, empty_hint("rules")); }},
    {"envoy_rules", [](const auto& v, auto& o,
                       const Bad& bad) { text(v, o.envoy_rules, bad, empty_hint("envoy_rules")); }},
    {"envoy_count_denied",
     [](const auto& v, auto& o, const Bad&) { o.envoy_count_denied = v.template as<bool>(); }},
    {"rules_watch_interval_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       const auto ms = v.template as<int64_t>();
       if (ms != 0 && (ms < 100 || ms > 3'600'000)) {
         bad("must be 0 (off) or between 100 and 3600000");
       } else {
         o.rules_watch_interval_ms = ms;
       }
     }},
    {"admin_token_file",
     [](const auto& v, auto& o, const Bad& bad) {
       secret_file(v, o.admin_token_file, o.admin_token, bad, "admin_token_file");
     }},
    {"admin_token_reads",
     [](const auto& v, auto& o, const Bad&) { o.admin_token_reads = v.template as<bool>(); }},
    // "" = memory only, documented.
    {"data_dir",
     [](const auto& v, auto& o, const Bad&) { o.data_dir = v.template as<std::string>(); }},
    {"init_data", [](const auto& v, auto& o, const Bad&) { o.init_data = v.template as<bool>(); }},
    {"snapshot_interval_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 10, 3'600'000, o.snapshot_interval_ms, bad,
                         "must be between 10 and 3600000");
     }},
    {"memory_cap_mb",
     [](const auto& v, auto& o, const Bad& bad) {
       uint64_t mb = 0;
       in_range<uint64_t>(v, 1, uint64_t{1} << 24, mb, bad, "must be between 1 and 16777216 (MiB)");
       if (mb != 0) o.memory_cap_bytes = mb << 20;
     }},
    {"hash_seed",
     [](const auto& v, auto& o, const Bad&) { o.hash_seed = v.template as<uint64_t>(); }},
    {"sweep_interval_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 10, INT64_MAX, o.sweep_interval_ms, bad, "must be at least 10");
     }},
    {"max_connections",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 1, 1'000'000, o.max_connections, bad, "must be between 1 and 1000000");
     }},
    {"client_timeout_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 100, 3'600'000, o.client_timeout_ms, bad,
                         "must be between 100 and 3600000");
     }},
    {"udp_busy_poll_us",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 0, 10'000, o.udp_busy_poll_us, bad, "must be between 0 and 10000");
     }},
    {"log_level",
     [](const auto& v, auto& o, const Bad& bad) {
       const auto lvl = v.template as<std::string>();
       if (lvl != "trace" && lvl != "debug" && lvl != "info" && lvl != "warn" && lvl != "error" &&
           lvl != "off") {
         bad("must be one of trace, debug, info, warn, error, off");
       } else {
         o.log_level = lvl;
       }
     }},
    // Read by load_cluster (its errors name its own keys); here for the list of names.
    {"cluster", nullptr},
};

using Peer = Setting<ClusterOptions>;
const Peer kClusterSettings[] = {
    {"node_id",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 1, 65535, o.node_id, bad, "must be between 1 and 65535");
     }},
    {"name", [](const auto& v, auto& o, const Bad& bad) { text(v, o.name, bad); }},
    {"listen", [](const auto& v, auto& o, const Bad& bad) { text(v, o.listen, bad); }},
    {"advertise", [](const auto& v, auto& o, const Bad& bad) { text(v, o.advertise, bad); }},
    {"seeds",
     [](const auto& v, auto& o, const Bad& bad) {
       auto seeds = v.template as<std::vector<std::string>>();
       bool empty_seed = false;
       std::string bad_seed;
       for (const auto& seed : v)
         if (seed.IsNull() || seed.template as<std::string>().empty()) empty_seed = true;
       for (const std::string& seed : seeds) {
         if (Status why = check_seed(seed); !why.ok() && bad_seed.empty()) bad_seed = why.message();
       }
       if (empty_seed) {
         bad("must not contain an empty address");
       } else if (!bad_seed.empty()) {
         bad(bad_seed);
       } else {
         o.seeds = std::move(seeds);
       }
     }},
    {"seed_refresh_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 100, 3'600'000, o.seed_refresh_ms, bad,
                         "must be between 100 and 3600000");
     }},
    {"dns_server",
     [](const auto& v, auto& o, const Bad& bad) {
       std::string s;
       text(v, s, bad, " (leave dns_server out for the system's resolver)");
       if (s.empty()) return;
       if (std::string why = parse_dns_server(s).error; !why.empty()) {
         bad(why);
       } else {
         o.dns_server = s;
       }
     }},
    {"secret", [](const auto& v, auto& o, const Bad& bad) { text(v, o.secret, bad); }},
    {"secret_file",
     [](const auto& v, auto& o, const Bad& bad) {
       std::string file;
       text(v, file, bad);
       if (file.empty()) return;
       if (StatusOr<std::string> read = read_secret_file(file); !read.ok()) {
         bad(read.message());
       } else {
         o.secret = std::move(*read);
       }
     }},
    {"replicas",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 1, 8, o.replicas, bad, "must be between 1 and 8");
     }},
    {"sync_interval_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 1, 600'000, o.sync_interval_ms, bad, "must be between 1 and 600000");
     }},
    {"anti_entropy_interval_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 1, 600'000, o.anti_entropy_interval_ms, bad,
                         "must be between 1 and 600000");
     }},
    {"probe_interval_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 1, 600'000, o.probe_interval_ms, bad, "must be between 1 and 600000");
     }},
    {"forward_timeout_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 1, 600'000, o.forward_timeout_ms, bad, "must be between 1 and 600000");
     }},
    {"forget_dead_after_ms",
     [](const auto& v, auto& o, const Bad& bad) {
       in_range<int64_t>(v, 0, 86'400'000, o.forget_dead_after_ms, bad,
                         "must be between 0 and 86400000 (a day)");
     }},
};

template <class Options, size_t N>
const Setting<Options>* find_setting(const std::string& key, const Setting<Options> (&table)[N]) {
  for (const Setting<Options>& s : table)
    if (key == s.name) return &s;
  return nullptr;
}

template <class Options, size_t N>
std::string unknown_setting(const Setting<Options> (&table)[N]) {
  std::string why = "unknown setting (expected one of: ";
  for (size_t i = 0; i < N; ++i) {
    if (i) why += ", ";
    why += table[i].name;
  }
  return why + ")";
}

// Reads the settings of the map `m` by `table`; `prefix` names the map in errors ("" or
// "cluster."). `special(key node, key, value)` reads a setting whose table entry has no load
// (returns whether it did). Errors are appended through `fail`.
template <class Options, size_t N, class Fail, class Special>
void load_settings(const YAML::Node& m, const Setting<Options> (&table)[N], Options& out,
                   const std::string& prefix, Fail& fail, Special&& special) {
  for (const auto& kv : m) {
    const YAML::Node& k = kv.first;
    const std::string key = k.Scalar();
    const YAML::Node& v = kv.second;
    const std::string field = prefix + key;
    const Bad bad = [&](const std::string& why) { fail(k, field, why); };
    const Setting<Options>* s = find_setting(key, table);
    if (s == nullptr) {
      bad(unknown_setting(table));
      continue;
    }
    if (v.IsNull() && !s->may_be_null) {
      bad(kEmpty + empty_hint(field));
      continue;
    }
    try {
      if (s->load != nullptr) {
        s->load(v, out, bad);
      } else {
        special(k, key, v);
      }
    } catch (const YAML::Exception&) {
      bad("has the wrong type");
    }
  }
}

// The `cluster:` map; `section` is its key, the line that section-level errors name. Errors are
// appended through `fail`.
template <class Fail>
void load_cluster(const YAML::Node& section, const YAML::Node& c, ClusterOptions& out, Fail& fail) {
  if (!c.IsMap()) {
    fail(section, "cluster", "must be a map of settings");
    return;
  }
  out.enabled = true;
  load_settings(c, kClusterSettings, out, "cluster.", fail,
                [](const YAML::Node&, const std::string&, const YAML::Node&) {});
  if (out.node_id == 0) fail(section, "cluster.node_id", "is required (1..65535, unique per node)");
  if (out.listen.empty()) fail(section, "cluster.listen", "is required (the peer UDP address)");
  if (out.secret.size() < 16) {
    fail(section, "cluster.secret",
         "is required: at least 16 bytes shared by every node (or secret_file)");
  }
}

// The file's settings as one YAML map, or why not ("" and a null `root`: an empty file).
// The config file as a YAML map (or null when empty): io_error when it cannot be read,
// invalid_argument when it is not one YAML map; each message starts with "<path>:".
Status parse_config(const std::string& path, YAML::Node& root) {
  StatusOr<std::string> read = read_file(path);
  if (!read.ok()) {
    return Status::IoError(path + ": cannot read the config file: " + read.message());
  }
  const std::string& text = *read;
  const auto bad = [&](int line, const std::string& why) {
    return Status::InvalidArgument(path + (line > 0 ? ":" + std::to_string(line) : "") + ": " +
                                   why);
  };
  if (const int nul = rules::yaml_nul_line(text); nul != 0) {
    return bad(nul, std::string(rules::kYamlNul));
  }
  try {
    if (const rules::YamlDocuments d = rules::count_yaml_documents(text); d.count > 1) {
      return bad(d.second_line, "the config holds more than one YAML document; keep one");
    }
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    return bad(e.mark.line + 1, e.msg);
  }
  if (!root.IsNull() && !root.IsMap()) return bad(0, "the config must be a map of settings");
  return {};
}

}  // namespace

std::string_view embedded_rules() {
  return kEmbeddedRules;
}

Status load_node_config(const std::string& path, NodeOptions& out) {
  YAML::Node root;
  if (Status s = parse_config(path, root); !s.ok()) return s;
  if (root.IsNull()) return {};  // an empty file keeps every default
  std::string errors;
  auto fail = [&](const YAML::Node& key, const std::string& field, const std::string& why) {
    // `why` may quote a value from the file (a path that cannot be read): printable too.
    errors += where(path, key, field) + printable(why) + "\n";
  };
  load_settings(root, kTopLevelSettings, out, "", fail,
                [&](const YAML::Node& k, const std::string&, const YAML::Node& v) {
                  load_cluster(k, v, out.cluster, fail);  // the one entry without a load
                });
  if (out.admin_token_reads && out.admin_token_file.empty() && errors.empty()) {
    for (const auto& kv : root) {
      if (kv.first.Scalar() == "admin_token_reads")
        fail(kv.first, "admin_token_reads", "needs admin_token_file (the token to ask for)");
    }
  }
  if (errors.empty()) return {};
  errors.pop_back();
  return Status::InvalidArgument(std::move(errors));
}

}  // namespace sluice::node
