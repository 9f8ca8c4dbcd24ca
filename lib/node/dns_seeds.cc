// Cluster seeds from DNS (dns_seeds.h): A/AAAA and SRV lookups, and the watcher that repeats them.
#include "node/dns_seeds.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstring>
#include <tuple>

#include "base/host_port.h"

namespace sluice::node {
namespace {

constexpr std::string_view kDnsPrefix = "dns:";
constexpr std::string_view kSrvPrefix = "dns+srv:";
constexpr size_t kMaxAnswerBytes = 64 * 1024;  // a TCP-sized answer; UDP ones are smaller

// A resolver state of its own per query (res_nquery is reentrant with one), pointed at `server`
// when one is given. Queries give up after 2 tries 1 s apart: the watcher retries anyway.
class ResolverState {
 public:
  explicit ResolverState(const std::optional<DnsServerAddress>& server) {
    std::memset(&st_, 0, sizeof st_);
    if (res_ninit(&st_) != 0) {
      error_ = "res_ninit failed (no usable resolver configuration)";
      return;
    }
    inited_ = ok_ = true;
    st_.retrans = 1;
    st_.retry = 2;
    if (server) {
      // nsaddr_list holds IPv4 servers; glibc notices the change and rebuilds its copy.
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(server->port);
      if (::inet_pton(AF_INET, server->ip.c_str(), &a.sin_addr) != 1) {
        error_ = "dns server " + server->ip + " is not an IPv4 address";
        ok_ = false;
        return;
      }
      st_.nsaddr_list[0] = a;
      st_.nscount = 1;
    }
  }
  ~ResolverState() {
    if (inited_) res_nclose(&st_);
  }
  ResolverState(const ResolverState&) = delete;
  ResolverState& operator=(const ResolverState&) = delete;

  // The records of `type` in the answer section, each handed to `take` with the message (for
  // name decompression). "" or why not; a name without records of the type is "no data".
  template <class Take>
  std::string query(const std::string& name, int type, Take&& take) {
    if (!ok_) return error_;
    std::vector<unsigned char> answer(kMaxAnswerBytes);
    const int n = res_nquery(&st_, name.c_str(), ns_c_in, type, answer.data(),
                             static_cast<int>(answer.size()));
    if (n < 0) {
      switch (st_.res_h_errno) {
        case HOST_NOT_FOUND:
          return "no such name (NXDOMAIN)";
        case NO_DATA:
          return "no records of the type asked";
        case TRY_AGAIN:
          return "no answer from the DNS server (timeout or SERVFAIL)";
        default:
          return "the DNS query failed (h_errno " + std::to_string(st_.res_h_errno) + ")";
      }
    }
    ns_msg msg;
    if (ns_initparse(answer.data(), n, &msg) < 0) return "malformed DNS answer";
    const int count = ns_msg_count(msg, ns_s_an);
    for (int i = 0; i < count; ++i) {
      ns_rr rr;
      if (ns_parserr(&msg, ns_s_an, i, &rr) < 0) return "malformed DNS answer record";
      if (static_cast<int>(ns_rr_type(rr)) == type) take(msg, rr);
    }
    return "";
  }

 private:
  struct __res_state st_;
  bool inited_ = false;  // res_ninit succeeded: res_nclose owes it
  bool ok_ = false;
  std::string error_;
};

// A and AAAA records of `name` through `server`; "" when at least one address came back.
std::string query_addresses(const std::string& name, uint16_t port,
                            const std::optional<DnsServerAddress>& server,
                            std::vector<cluster::Endpoint>& out) {
  ResolverState rs(server);
  const size_t before = out.size();
  std::string first_error;
  for (const int type : {int{ns_t_a}, int{ns_t_aaaa}}) {
    const std::string err = rs.query(name, type, [&](const ns_msg&, const ns_rr& rr) {
      char text[INET6_ADDRSTRLEN] = {};
      const unsigned char* rd = ns_rr_rdata(rr);
      if (type == ns_t_a && ns_rr_rdlen(rr) == 4) {
        ::inet_ntop(AF_INET, rd, text, sizeof text);
      } else if (type == ns_t_aaaa && ns_rr_rdlen(rr) == 16) {
        ::inet_ntop(AF_INET6, rd, text, sizeof text);
      } else {
        return;
      }
      out.push_back({text, port});
    });
    if (!err.empty() && first_error.empty()) first_error = err;
  }
  if (out.size() > before) return "";
  return first_error.empty() ? "no A or AAAA records" : first_error;
}

// getaddrinfo: the system's view (hosts file, nsswitch, resolv.conf).
std::string system_addresses(const std::string& name, uint16_t port,
                             std::vector<cluster::Endpoint>& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &res); rc != 0) {
    return ::gai_strerror(rc);
  }
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, text,
                  sizeof text);
    } else if (a->ai_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                  sizeof text);
    } else {
      continue;
    }
    const cluster::Endpoint ep{text, port};
    if (std::find(out.begin(), out.end(), ep) == out.end()) out.push_back(ep);
  }
  ::freeaddrinfo(res);
  return "";
}

std::string addresses(const std::string& name, uint16_t port,
                      const std::optional<DnsServerAddress>& server,
                      std::vector<cluster::Endpoint>& out) {
  return server ? query_addresses(name, port, server, out) : system_addresses(name, port, out);
}

bool valid_dns_name(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (const char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '-' || c == '.' || c == '_')) return false;
  }
  return name.front() != '.' && name.find("..") == std::string_view::npos;
}

void sort_unique(std::vector<cluster::Endpoint>& v) {
  const auto key = [](const cluster::Endpoint& e) { return std::tie(e.host, e.port); };
  std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

DnsServerAddress parse_dns_server(std::string_view text) {
  DnsServerAddress out;
  std::string_view ip = text;
  if (const size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    ip = text.substr(0, colon);
    const std::string_view port = text.substr(colon + 1);
    unsigned p = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p == 0 ||
        p > 65535) {
      out.error = "\"" + std::string(text) + "\": bad port (expected IPv4:PORT)";
      return out;
    }
    out.port = static_cast<uint16_t>(p);
  }
  in_addr a{};
  out.ip = std::string(ip);
  if (::inet_pton(AF_INET, out.ip.c_str(), &a) != 1) {
    out.error = "\"" + std::string(text) + "\": expected an IPv4 address, optionally with :PORT";
  }
  return out;
}

DnsSeed classify_seed(std::string_view seed) {
  if (seed.substr(0, kSrvPrefix.size()) == kSrvPrefix) {
    return {DnsSeed::Kind::kSrv, std::string(seed.substr(kSrvPrefix.size()))};
  }
  if (seed.substr(0, kDnsPrefix.size()) == kDnsPrefix) {
    return {DnsSeed::Kind::kA, std::string(seed.substr(kDnsPrefix.size()))};
  }
  return {DnsSeed::Kind::kAddress, std::string(seed)};
}

Status check_seed(std::string_view seed) {
  const DnsSeed s = classify_seed(seed);
  if (s.kind == DnsSeed::Kind::kAddress) {
    StatusOr<HostPort> hp = split_host_port(seed);
    if (!hp.ok()) return Status::InvalidArgument("\"" + std::string(seed) + "\": " + hp.message());
    return {};
  }
  const std::string form =
      s.kind == DnsSeed::Kind::kSrv ? "dns+srv:_service._proto.NAME" : "dns:NAME";
  if (!valid_dns_name(s.name)) {
    return Status::InvalidArgument("\"" + std::string(seed) + "\" is not " + form +
                                   " (a DNS name after the prefix)");
  }
  if (s.kind == DnsSeed::Kind::kSrv && s.name.front() != '_') {
    return Status::InvalidArgument("\"" + std::string(seed) + "\" is not " + form +
                                   " (an SRV name starts with _service)");
  }
  return {};
}

DnsAnswer resolve_dns_seed(const DnsSeed& seed, uint16_t peer_port,
                           const std::optional<DnsServerAddress>& server) {
  DnsAnswer out;
  if (seed.kind == DnsSeed::Kind::kA) {
    out.error = addresses(seed.name, peer_port, server, out.endpoints);
  } else if (seed.kind == DnsSeed::Kind::kSrv) {
    std::vector<std::pair<std::string, uint16_t>> targets;
    {
      ResolverState rs(server);
      out.error = rs.query(seed.name, ns_t_srv, [&](const ns_msg& msg, const ns_rr& rr) {
        // RFC 2782: priority, weight, port (16 bits each), then the target name.
        if (ns_rr_rdlen(rr) < 7) return;
        const unsigned char* rd = ns_rr_rdata(rr);
        const uint16_t port = static_cast<uint16_t>(ns_get16(rd + 4));
        char target[NS_MAXDNAME] = {};
        if (dn_expand(ns_msg_base(msg), ns_msg_end(msg), rd + 6, target,
                      static_cast<int>(sizeof target)) < 0) {
          return;
        }
        if (std::strcmp(target, ".") == 0 || target[0] == '\0' || port == 0) return;  // "none"
        targets.emplace_back(target, port);
      });
    }
    if (out.error.empty() && targets.empty()) out.error = "no SRV records";
    std::string target_error;
    for (const auto& [target, port] : targets) {
      if (std::string err = addresses(target, port, server, out.endpoints); !err.empty()) {
        target_error = "SRV target " + target + ": " + err;
      }
    }
    if (out.error.empty() && out.endpoints.empty()) out.error = target_error;
  }
  sort_unique(out.endpoints);
  return out;
}

DnsSeedWatcher::DnsSeedWatcher(Options options, Found on_found)
    : opt_(std::move(options)), on_found_(std::move(on_found)), last_error_(opt_.seeds.size()) {}

DnsSeedWatcher::~DnsSeedWatcher() {
  stop();
}

void DnsSeedWatcher::start() {
  if (thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void DnsSeedWatcher::stop() {
  {
    std::lock_guard g(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool DnsSeedWatcher::pass() {
  std::vector<cluster::Endpoint> found;
  bool all_ok = true;
  for (size_t i = 0; i < opt_.seeds.size(); ++i) {
    const DnsSeed& s = opt_.seeds[i];
    if (s.kind == DnsSeed::Kind::kAddress) continue;
    const std::string shown = (s.kind == DnsSeed::Kind::kSrv ? "dns+srv:" : "dns:") + s.name;
    const DnsAnswer a = resolve_dns_seed(s, opt_.peer_port, opt_.server);
    if (!a.error.empty()) {
      all_ok = false;
      if (a.error != last_error_[i]) {
        spdlog::warn("cluster: seed {} does not resolve: {} (retrying with back-off)", shown,
                     a.error);
      }
      last_error_[i] = a.error;
      continue;
    }
    if (!last_error_[i].empty()) spdlog::info("cluster: seed {} resolves again", shown);
    last_error_[i].clear();
    found.insert(found.end(), a.endpoints.begin(), a.endpoints.end());
  }
  sort_unique(found);
  bool new_address = false;
  for (const cluster::Endpoint& e : found) {
    if (!std::binary_search(last_found_.begin(), last_found_.end(), e,
                            [](const auto& a, const auto& b) {
                              return std::tie(a.host, a.port) < std::tie(b.host, b.port);
                            })) {
      new_address = true;
      spdlog::info("cluster: DNS seeds found {}:{}", e.host, e.port);
    }
  }
  // Keep what failed to resolve this time in mind: a name that fails for a while and comes back
  // with the same addresses is not news. A name that resolves to fewer addresses replaces them.
  if (all_ok) {
    last_found_ = found;
  } else {
    for (const cluster::Endpoint& e : found)
      last_found_.push_back(e);
    sort_unique(last_found_);
  }
  if (new_address) on_found_(found);
  return all_ok;
}

void DnsSeedWatcher::run() {
  int64_t backoff_ms = opt_.min_backoff_ms;
  for (;;) {
    const bool ok = pass();
    int64_t wait_ms = opt_.refresh_ms;
    if (ok) {
      backoff_ms = opt_.min_backoff_ms;
    } else {
      wait_ms = std::min(backoff_ms, opt_.refresh_ms);
      backoff_ms = std::min(backoff_ms * 2, opt_.refresh_ms);
    }
    std::unique_lock lock(mu_);
    if (wake_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return stopping_; })) {
      return;
    }
  }
}

}  // namespace sluice::node
