// The admin HTTP port: Boost.Beast over the node's control io_context. See admin_http.h for the
// contract and docs/http.md for the endpoints as users see them.
#include "node/admin_http.h"

#include <utility>  // before Asio: Boost 1.74 with g++ 12 in C++20 needs std::exchange declared

#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <unistd.h>

#include "engine/engine.h"
#include "node/admin_auth.h"
#include "node/admin_ops.h"
#include "node/dashboard.h"
#include "node/node.h"
#include "node/node_cluster.h"
#include "rules/rules.h"
#include "window/sliding_window.h"
#include "wire/protocol.h"
#include "wire/ratelimit_headers.h"

namespace sluice::node {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using Json = nlohmann::json;
using wire::ceil_seconds;

// Writing an answer: a client that does not read it within this is gone (the request's own
// deadlines are NodeOptions::client_timeout_ms).
constexpr auto kWriteTimeout = std::chrono::seconds(30);
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

// "host:port" or "[v6]:port" -> endpoint; throws naming the address.
tcp::endpoint parse_listen(const std::string& listen) {
  const auto fail = [&](const std::string& why) -> tcp::endpoint {
    throw std::runtime_error("admin HTTP listen address \"" + listen + "\": " + why);
  };
  std::string host;
  std::string_view port_text;
  if (!listen.empty() && listen.front() == '[') {
    const size_t close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return fail("expected [IPv6]:PORT");
    }
    host = listen.substr(1, close - 1);
    port_text = std::string_view(listen).substr(close + 2);
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) return fail("expected HOST:PORT");
    host = listen.substr(0, colon);
    port_text = std::string_view(listen).substr(colon + 1);
  }
  unsigned port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port > 65535) {
    return fail("bad port");
  }
  boost::system::error_code aec;
  const asio::ip::address addr = asio::ip::make_address(host, aec);
  if (aec) return fail("not an IP address (" + aec.message() + ")");
  return {addr, static_cast<uint16_t>(port)};
}

// ---- small text helpers ----------------------------------------------------------------------

beast::string_view bsv(std::string_view s) {
  return {s.data(), s.size()};
}

// A Prometheus label value (text format 0.0.4): '\', '"' and newline escaped.
void append_label_value(std::string& out, std::string_view s) {
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
}

// ---- Prometheus text -------------------------------------------------------------------------

class MetricsText {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;  // help texts are ours: no backslash or newline to escape
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  // labels: alternating names and values
  void sample(std::string_view name, std::initializer_list<std::string_view> labels,
              uint64_t value) {
    out_ += name;
    if (labels.size() > 0) {
      out_ += '{';
      bool first = true;
      for (auto it = labels.begin(); it != labels.end() && it + 1 != labels.end(); it += 2) {
        if (!first) out_ += ',';
        first = false;
        out_ += *it;
        out_ += "=\"";
        append_label_value(out_, *(it + 1));
        out_ += '"';
      }
      out_ += '}';
    }
    out_ += ' ';
    out_ += std::to_string(value);
    out_ += '\n';
  }
  void one(std::string_view name, std::string_view type, std::string_view help, uint64_t value) {
    family(name, type, help);
    sample(name, {}, value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

// ---- shared state ----------------------------------------------------------------------------

namespace {
class Connection;
}  // namespace

// Owned jointly by the AdminHttp and every connection and pending accept; touched only on the
// io_context's thread, so nothing here needs a lock.
struct AdminHttp::State : std::enable_shared_from_this<AdminHttp::State> {
  State(asio::io_context& io_, Node& node_, AdminAuth& auth_)
      : io(io_), node(node_), auth(auth_), acceptor(io_), retry(io_), dashboard(io_, node_) {}

  asio::io_context& io;
  Node& node;
  AdminAuth& auth;
  tcp::acceptor acceptor;
  asio::steady_timer retry;  // backs off after an accept error (e.g. out of descriptors)
  bool stopped = false;
  bool accepting = false;  // an async_accept is pending
  std::unordered_set<Connection*> connections;
  uint64_t http_checks = 0;    // /v1/check, /v1/auth and /v1/release requests decided
  uint64_t next_check_id = 0;  // ids of the check requests they become
  uint64_t accept_errors = 0;
  uint64_t internal_errors = 0;  // requests answered 500 (an exception out of a handler)
  // Connections the node closed before the client was done, by reason (issue 13, slow clients):
  // shed (the oldest idle one, for a new connection over max_connections), idle (a keep-alive
  // connection that sent nothing within client_timeout_ms), header / body (one that started a
  // request and did not finish its header, or then its body, within client_timeout_ms each).
  uint64_t closed_shed = 0, closed_idle = 0, closed_header = 0, closed_body = 0;
  size_t max_connections() const { return node.options().max_connections; }
  std::chrono::milliseconds client_timeout() const {
    return std::chrono::milliseconds(node.options().client_timeout_ms);
  }
  Dashboard dashboard;  // /ui, /ui/..., /v1/ui/... (dashboard.h)

  void accept();
  // Accepting goes on below the cap, and at it while a connection waits for a request (it makes
  // room: shed_oldest_idle); it pauses while every connection is busy.
  void maybe_resume_accept() {
    if (!stopped && !accepting && (connections.size() < max_connections() || any_waiting())) {
      accept();
    }
  }
  bool any_waiting() const;
  // Makes room for one more connection: closes the one that has waited longest for a request,
  // header or body (a slow client, or an idle keep-alive one). False when every connection is
  // busy deciding or writing: then accepting pauses until one closes.
  bool shed_oldest_idle();
};

namespace {

// ---- the check shared by /v1/check, /v1/auth and /v1/release --------------------------------

// Outcome of one check, ready for either endpoint's answer.
struct CheckOutcome {
  wire::Code code = wire::Code::kOk;
  bool error = false;  // a request-level error: nothing was counted
  bool allowed = false;
  bool would_deny = false;
  bool shadow = false;
  bool allowlisted = false;
  bool enforce_denied = false;  // denied by an enforcing rule (429 / 403)
  Json body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// The JSON body and the RateLimit headers of one decided check (docs/http.md, "Headers"). The
// check was decided like any other (Node::check_async: a worker, owner routing in a cluster), so
// it arrives as the check protocol's answer.
CheckOutcome outcome_of(const wire::Decision& d) {
  CheckOutcome o;
  if (d.code != wire::Code::kOk && d.code != wire::Code::kNoRoom) {
    o.error = true;
    o.code = d.code;
    o.body = Json{{"allowed", false}, {"code", wire::to_string(o.code)}};
    return o;
  }
  o.code = d.code;
  o.allowed = d.allowed;
  o.would_deny = d.would_deny;
  o.shadow = d.shadow;
  o.allowlisted = d.allowlisted;

  Json limits = Json::array();
  for (const wire::LimitStatus& lr : d.limits) {
    const bool never = lr.retry_after_ms < 0;
    if (lr.exceeded && lr.mode == wire::Mode::kEnforce) o.enforce_denied = true;
    limits.push_back(Json{
        {"name", lr.name},
        {"limit", lr.limit},
        {"window_s", ceil_seconds(lr.window_ms)},
        {"remaining", lr.remaining},
        {"reset_s", ceil_seconds(lr.reset_ms)},
        {"retry_after_s", never ? Json(nullptr) : Json(ceil_seconds(lr.retry_after_ms))},
        {"mode", wire::to_string(lr.mode)},
        {"exceeded", lr.exceeded},
    });
  }
  o.enforce_denied = o.enforce_denied && !o.allowed;

  o.body = Json{{"allowed", o.allowed},
                {"would_deny", o.would_deny},
                {"shadow", o.shadow},
                {"allowlisted", o.allowlisted},
                {"code", wire::to_string(o.code)},
                {"limits", std::move(limits)}};
  // A concurrency limit admitted the check: the caller gives the lease back with /v1/release.
  if (d.lease != 0) o.body["lease"] = format_lease(d.lease);
  o.headers = wire::ratelimit_headers(d.limits, o.enforce_denied).headers;
  return o;
}

// ---- metrics and status ----------------------------------------------------------------------

std::string render_metrics(AdminHttp::State& st) {
  const engine::EngineStats es = st.node.engine().stats();
  const NodeCounters nc = st.node.counters();
  MetricsText m;

  m.family("sluice_rule_decisions_total", "counter",
           "Decisions per rule (\"<domain>/<rule>\") by outcome.");
  for (const engine::RuleStats& r : es.rules) {
    const size_t slash = r.name.find('/');
    const std::string_view name(r.name);
    const std::string_view domain = name.substr(0, slash);
    const std::string_view rule =
        slash == std::string::npos ? std::string_view() : name.substr(slash + 1);
    m.sample("sluice_rule_decisions_total", {"domain", domain, "rule", rule, "decision", "allowed"},
             r.allowed);
    m.sample("sluice_rule_decisions_total", {"domain", domain, "rule", rule, "decision", "denied"},
             r.denied);
    m.sample("sluice_rule_decisions_total",
             {"domain", domain, "rule", rule, "decision", "shadow_denied"}, r.shadow_denied);
    m.sample("sluice_rule_decisions_total",
             {"domain", domain, "rule", rule, "decision", "would_deny"}, r.would_deny);
  }
  m.one("sluice_checks_total", "counter", "Checks decided by the engine (every transport).",
        es.checks);
  m.family("sluice_rejected_checks_total", "counter",
           "Checks answered with a request error, by reason; nothing was counted.");
  for (const auto& [reason, n] : es.rejected) {
    if (reason == "none") continue;
    m.sample("sluice_rejected_checks_total", {"reason", reason}, n);
  }
  m.one("sluice_allowlisted_total", "counter", "Checks allowed by an allowlist entry, uncounted.",
        es.allowlisted);
  m.one("sluice_live_counters", "gauge", "Counters held in memory.", es.live_counters);
  m.one("sluice_table_bytes", "gauge", "Capacity of all counter tables in bytes.", es.table_bytes);
  const engine::SharedTablePages shared = engine::shared_table_pages();
  m.one("sluice_table_shared_pages_bytes", "gauge",
        "Huge pages that counter tables of 64 KiB to 2 MiB share, in bytes.", shared.resident);
  m.one("sluice_table_shared_free_bytes", "gauge",
        "Free space beside live tables in those pages, in bytes (reused as tables grow).",
        shared.resident - std::min(shared.resident, shared.in_use));
  m.one("sluice_remote_state_bytes", "gauge",
        "What other nodes reported of this node's counters, in bytes (counts against the cap).",
        es.remote_bytes);
  m.one("sluice_memory_cap_bytes", "gauge", "Memory cap of the counter tables in bytes.",
        es.memory_cap_bytes);
  m.family("sluice_evictions_total", "counter",
           "Counters dropped: expired (nothing lost) or live (under the memory cap).");
  m.sample("sluice_evictions_total", {"kind", "expired"}, es.evicted_expired);
  m.sample("sluice_evictions_total", {"kind", "live"}, es.evicted_live);
  m.one("sluice_no_room_total", "counter",
        "Checks allowed uncounted because the memory cap left no room.", es.no_room);
  m.one("sluice_leases_held", "gauge",
        "Leases of concurrency limits held now (granted, neither released nor expired).",
        es.leases_held);
  m.one("sluice_leases_granted_total", "counter",
        "Leases granted to checks that concurrency limits admitted.", es.leases_granted);
  m.one("sluice_leases_released_total", "counter", "Leases released by their holders.",
        es.leases_released);
  m.family("sluice_lease_release_refused_total", "counter",
           "Releases that changed nothing, by reason: lease_unknown (no such lease for these "
           "entries), lease_expired (its time to live was over), lease_released (released "
           "before).");
  m.sample("sluice_lease_release_refused_total", {"reason", "lease_unknown"}, es.lease_unknown);
  m.sample("sluice_lease_release_refused_total", {"reason", "lease_expired"}, es.lease_expired);
  m.sample("sluice_lease_release_refused_total", {"reason", "lease_released"},
           es.lease_released_before);
  m.one("sluice_lease_table_bytes", "gauge",
        "Memory of the lease tables in bytes (counts against the memory cap).", es.lease_bytes);
  m.one("sluice_lease_local_total", "counter",
        "Leased quotas: checks of keys another node owns decided here from a slice it granted (no "
        "round trip).",
        es.slice_checks_local);
  m.one("sluice_lease_forwarded_total", "counter",
        "Leased quotas: checks of keys another node owns that no slice here covered, sent to the "
        "owner (a round trip).",
        es.slice_checks_to_owner);
  m.one("sluice_lease_prefetches_total", "counter",
        "Leased quotas: slices asked for before the one held ran out.", nc.slice_prefetches);
  m.one("sluice_lease_slices_granted_total", "counter",
        "Leased quotas: slices this node granted as owner.", es.slices_granted);
  m.one("sluice_lease_slice_hits_granted_total", "counter",
        "Leased quotas: hits in the slices this node granted as owner.", es.slice_hits_granted);
  m.one("sluice_lease_slices_returned_total", "counter",
        "Leased quotas: slices given back to this node (what was used counted, the rest freed).",
        es.slices_returned);
  m.one("sluice_lease_slices_expired_total", "counter",
        "Leased quotas: slices not given back before they expired (counted in full).",
        es.slices_expired);
  m.one("sluice_lease_slice_table_bytes", "gauge",
        "Memory of the slice tables in bytes (counts against the memory cap).", es.slice_bytes);

  m.family("sluice_requests_total", "counter",
           "Check requests received, by transport (http: /v1/check, /v1/auth, /v1/release).");
  m.sample("sluice_requests_total", {"transport", "udp"}, nc.udp_requests);
  m.sample("sluice_requests_total", {"transport", "tcp"}, nc.tcp_requests);
  m.sample("sluice_requests_total", {"transport", "http"}, st.http_checks);
  m.one("sluice_dropped_datagrams_total", "counter",
        "UDP datagrams dropped unanswered (undecodable, no id to answer to).",
        nc.dropped_datagrams);
  m.one("sluice_bad_frames_total", "counter", "TCP connections closed on a malformed frame.",
        nc.closed_connections_bad_frame);
  m.one("sluice_rejected_requests_total", "counter",
        "UDP/TCP requests answered with a request-level error code.", nc.rejected_requests);
  m.one("sluice_forwarded_requests_total", "counter",
        "Owner mode: client requests split to their keys' owners.", nc.forwarded_requests);
  m.one("sluice_forwarded_parts_total", "counter", "Owner mode: parts sent to another node.",
        nc.forwarded_parts);
  m.one("sluice_forward_fallbacks_total", "counter",
        "Owner mode: parts decided here by the rule's fallback because neither the owner nor a "
        "replica answered in time.",
        nc.forward_fallbacks);
  m.one("sluice_forward_failovers_total", "counter",
        "Owner mode: parts sent on to the key's replica because the owner did not answer in time.",
        nc.forward_failovers);
  m.one("sluice_untrusted_forwards_total", "counter",
        "Requests that claimed to be forwarded by a node without the cluster's tag (routed as "
        "client requests).",
        nc.untrusted_forwards);
  m.family("sluice_reloads_total", "counter", "Rules reloads by result.");
  m.sample("sluice_reloads_total", {"result", "ok"}, nc.reloads);
  m.sample("sluice_reloads_total", {"result", "failed"}, nc.reload_failures);
  m.family("sluice_rls_requests_total", "counter",
           "gRPC ShouldRateLimit calls by outcome (docs/envoy.md): ok and over_limit answered; "
           "invalid_argument and resource_exhausted refused before any counter was touched; "
           "unavailable while stopping; internal for an answer that could not be used.");
  m.sample("sluice_rls_requests_total", {"result", "ok"}, nc.rls.ok);
  m.sample("sluice_rls_requests_total", {"result", "over_limit"}, nc.rls.over_limit);
  m.sample("sluice_rls_requests_total", {"result", "invalid_argument"}, nc.rls.invalid_argument);
  m.sample("sluice_rls_requests_total", {"result", "resource_exhausted"},
           nc.rls.resource_exhausted);
  m.sample("sluice_rls_requests_total", {"result", "unavailable"}, nc.rls.unavailable);
  m.sample("sluice_rls_requests_total", {"result", "internal"}, nc.rls.internal);
  m.one("sluice_rls_descriptors_total", "counter",
        "Descriptors in answered gRPC ShouldRateLimit calls.", nc.rls.descriptors);
  m.one("sluice_tcp_connections_total", "counter", "TCP connections accepted.", nc.tcp_connections);
  m.one("sluice_tcp_connections_open", "gauge", "TCP check connections open now.", nc.tcp_open);
  m.family("sluice_tcp_connections_closed_total", "counter",
           "TCP check connections the node closed before the client did: shed (the one waiting "
           "longest, for a new connection over max_connections), frame (a frame not finished "
           "within client_timeout_ms).");
  m.sample("sluice_tcp_connections_closed_total", {"reason", "shed"}, nc.tcp_closed_shed);
  m.sample("sluice_tcp_connections_closed_total", {"reason", "frame"}, nc.tcp_closed_frame);
  m.one("sluice_http_accept_errors_total", "counter",
        "Errors accepting admin HTTP connections (e.g. out of file descriptors).",
        st.accept_errors);
  m.family("sluice_http_connections_closed_total", "counter",
           "Admin HTTP connections the node closed before the client was done: shed (the oldest "
           "waiting one, for a new connection over max_connections), idle (a keep-alive "
           "connection silent for client_timeout_ms), header and body (a request not finished "
           "within client_timeout_ms).");
  m.sample("sluice_http_connections_closed_total", {"reason", "shed"}, st.closed_shed);
  m.sample("sluice_http_connections_closed_total", {"reason", "idle"}, st.closed_idle);
  m.sample("sluice_http_connections_closed_total", {"reason", "header"}, st.closed_header);
  m.sample("sluice_http_connections_closed_total", {"reason", "body"}, st.closed_body);
  m.one("sluice_http_connections_open", "gauge", "Admin HTTP connections open now.",
        st.connections.size());
  m.one("sluice_http_internal_errors_total", "counter",
        "Admin HTTP requests answered 500: a handler failed (the log says which and why).",
        st.internal_errors);
  m.family("sluice_admin_auth_failures_total", "counter",
           "Admin requests refused for want of the admin token, by reason (docs/operations.md, "
           "\"Admin token\").");
  for (const auto& [reason, n] : st.auth.failures())
    m.sample("sluice_admin_auth_failures_total", {"reason", reason}, n);

  // Not a Prometheus histogram: the node keeps no sum of latencies, and a histogram without
  // _sum would be invalid. The cumulative buckets still feed histogram_quantile().
  m.family("sluice_check_latency_us_bucket", "counter",
           "UDP/TCP requests that took less than le microseconds to decode, decide and encode "
           "(cumulative).");
  uint64_t cumulative = 0;
  const auto& b = nc.latency_us_buckets;
  for (size_t i = 0; i < b.size(); ++i) {
    cumulative += b[i];
    const std::string le = i + 1 == b.size() ? "+Inf" : std::to_string(uint64_t{1} << i);
    m.sample("sluice_check_latency_us_bucket", {"le", le}, cumulative);
  }
  m.one("sluice_check_latency_us_count", "counter", "UDP/TCP requests timed.", cumulative);

  const PersistenceStatus p = st.node.persistence();
  if (p.enabled) {
    m.family("sluice_snapshots_total", "counter", "Snapshot passes to the data directory.");
    m.sample("sluice_snapshots_total", {"result", "ok"}, p.snapshots.passes - p.snapshots.failures);
    m.sample("sluice_snapshots_total", {"result", "failed"}, p.snapshots.failures);
    m.one("sluice_snapshot_last_written", "gauge", "Counters written by the last snapshot pass.",
          p.snapshots.last.written);
    m.one("sluice_snapshot_last_bytes", "gauge", "Bytes written by the last snapshot pass.",
          p.snapshots.last.bytes);
    m.one("sluice_snapshot_last_unixtime_ms", "gauge",
          "When the last snapshot pass finished (ms since the epoch; 0 = none yet).",
          static_cast<uint64_t>(p.snapshots.last_ms));
    m.one("sluice_data_disk_bytes", "gauge", "Bytes of the data directory's RocksDB files.",
          p.disk.total());
    m.family("sluice_data_db_disk_bytes", "gauge",
             "Bytes of each RocksDB database of the data directory (counters: the directory, "
             "overrides: its overrides/ database).");
    m.sample("sluice_data_db_disk_bytes", {"db", "counters"}, p.disk.counters);
    m.sample("sluice_data_db_disk_bytes", {"db", "overrides"}, p.disk.overrides);
    m.one("sluice_restored_counters", "gauge",
          "Counters restored from the data directory at start.", p.restored.restored);
  }
  m.one("sluice_overrides", "gauge", "Runtime overrides in force.", p.overrides);

  const ClusterStatus c = st.node.cluster_status();
  if (c.enabled) {
    m.one("sluice_cluster_ready", "gauge",
          "1 once this node's first join had an outcome (what /healthz?ready waits for).",
          c.not_ready.empty() ? 1 : 0);
    m.family("sluice_cluster_members", "gauge",
             "Members this node knows, by state (self included).");
    for (const auto state : {cluster::MemberState::kAlive, cluster::MemberState::kSuspect,
                             cluster::MemberState::kDead, cluster::MemberState::kLeft}) {
      uint64_t n = 0;
      for (const MemberStatus& ms : c.members)
        n += ms.member.state == state ? 1 : 0;
      m.sample("sluice_cluster_members", {"state", cluster::to_string(state)}, n);
    }
    m.one("sluice_cluster_members_reachable", "gauge",
          "Members in reach of this node, itself included (alive).", c.reachable);
    m.one("sluice_cluster_members_expected", "gauge",
          "Members this node expects: in reach, suspect, or dead for less than "
          "forget_dead_after_ms. Below it, every limit allows reachable / expected here.",
          c.expected);
    m.family(
        "sluice_cluster_sync_lag_ms", "gauge",
        "Per member: ms since its last sync batch arrived (members never heard from: absent).");
    for (const MemberStatus& ms : c.members) {
      if (ms.last_sync_ms >= 0) {
        m.sample("sluice_cluster_sync_lag_ms", {"member", ms.member.name},
                 static_cast<uint64_t>(ms.last_sync_ms));
      }
    }
    m.family(
        "sluice_peer_dropped_total", "counter",
        "Peer datagrams dropped, by reason (bad_tag: wrong secret or tampered; replayed; ...).");
    for (const auto& [reason, n] : c.dropped)
      m.sample("sluice_peer_dropped_total", {"reason", reason}, n);
    m.family("sluice_peer_datagrams_total", "counter", "Peer datagrams, by direction.");
    m.sample("sluice_peer_datagrams_total", {"direction", "in"}, c.datagrams_in);
    m.sample("sluice_peer_datagrams_total", {"direction", "out"}, c.datagrams_out);
    m.family("sluice_peer_bytes_total", "counter",
             "Peer UDP payload bytes (IP and UDP headers not counted), by direction.");
    m.sample("sluice_peer_bytes_total", {"direction", "in"}, c.bytes_in);
    m.sample("sluice_peer_bytes_total", {"direction", "out"}, c.bytes_out);
    m.one("sluice_sync_totals_sent_total", "counter", "Per-node bucket totals sent by sync passes.",
          c.sync_totals_out);
    m.one("sluice_sync_totals_received_total", "counter", "Per-node bucket totals received.",
          c.sync_totals_in);
    m.one("sluice_handoffs_total", "counter", "Full sync passes after membership changes.",
          c.handoffs);
    const char* kinds[] = {"changed", "resend", "handoff"};
    m.family(
        "sluice_sync_passes_total", "counter",
        "Sync passes, by kind: changed (every sync interval), resend (anti-entropy), handoff.");
    for (size_t k = 0; k < 3; ++k)
      m.sample("sluice_sync_passes_total", {"pass", kinds[k]}, c.sync_kind_passes[k]);
    m.family("sluice_sync_cpu_us_total", "counter",
             "CPU microseconds the control thread spent in sync passes, by kind.");
    for (size_t k = 0; k < 3; ++k)
      m.sample("sluice_sync_cpu_us_total", {"pass", kinds[k]}, c.sync_cpu_us[k]);
    m.one("sluice_sync_slices_deferred_total", "counter",
          "Times a long sync pass yielded the control thread (after 4 ms) and went on later.",
          c.sync_slices_deferred);
    // Cumulative buckets of the changed passes' CPU time (histogram_quantile works on them).
    m.family("sluice_sync_pass_cpu_us_bucket", "counter",
             "Changed-counter sync passes that took less than le CPU microseconds (cumulative).");
    uint64_t passes = 0;
    for (size_t i = 0; i < c.sync_cpu_us_buckets.size(); ++i) {
      passes += c.sync_cpu_us_buckets[i];
      const std::string le =
          i + 1 == c.sync_cpu_us_buckets.size() ? "+Inf" : std::to_string(uint64_t{1} << i);
      m.sample("sluice_sync_pass_cpu_us_bucket", {"le", le}, passes);
    }
    m.family("sluice_override_updates_total", "counter",
             "Cluster-wide override records, by event: sent (pushes and full tables, per member), "
             "received, applied (newer than this node's: persisted and in force), known (already "
             "held), expired (past their horizon), dropped (refused: see "
             "sluice_peer_dropped_total{reason=~\"override_.*\"}).");
    m.sample("sluice_override_updates_total", {"event", "sent"}, c.overrides.records_sent);
    m.sample("sluice_override_updates_total", {"event", "received"}, c.overrides.records_received);
    m.sample("sluice_override_updates_total", {"event", "applied"}, c.overrides.applied);
    m.sample("sluice_override_updates_total", {"event", "known"}, c.overrides.known);
    m.sample("sluice_override_updates_total", {"event", "expired"}, c.overrides.expired);
    m.sample("sluice_override_updates_total", {"event", "dropped"}, c.overrides.dropped);
    m.one("sluice_override_records", "gauge",
          "Override records this node holds, tombstones included (equal on every node once the "
          "cluster agrees).",
          c.overrides.records);
    m.one("sluice_membership_deaths_declared_total", "counter",
          "Members this node declared dead when their suspicion timed out.",
          c.membership.deaths_declared);
    m.one("sluice_membership_suspicions_total", "counter",
          "Suspicions this node raised (missed probes).", c.membership.suspicions_raised);
    m.one("sluice_membership_refutations_total", "counter",
          "Times this node refuted a suspicion about itself (a sign it was slow).",
          c.membership.refutations);
    m.one("sluice_membership_suspect_pings_total", "counter",
          "Pings this node sent to members it suspects, so that they hear of it and refute.",
          c.membership.suspect_pings);
    m.family("sluice_membership_lists_answered_total", "counter",
             "Membership lists this node answered (joins and anti-entropy pulls), by result: "
             "in_sync (the puller's view digest matched: no member sent) or sent.");
    m.sample("sluice_membership_lists_answered_total", {"result", "in_sync"},
             c.membership.pulls_in_sync);
    m.sample("sluice_membership_lists_answered_total", {"result", "sent"},
             c.membership.joins_answered -
                 std::min(c.membership.joins_answered, c.membership.pulls_in_sync));
    m.one("sluice_membership_pull_entries_sent_total", "counter",
          "Member records this node sent in answer to digest pulls.",
          c.membership.pull_entries_sent);
    m.one("sluice_membership_local_health", "gauge",
          "Lifeguard local health score: probes stretch by (score + 1) when this node is slow.",
          c.membership.local_health);
  }
  return m.take();
}

// Resident memory of this process (Linux /proc), 0 when unknown.
uint64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

Json persistence_json(const PersistenceStatus& p, int64_t now) {
  const auto& last = p.snapshots.last;
  return Json{
      {"enabled", p.enabled},
      {"dir", p.dir},
      {"snapshot_interval_ms", p.snapshot_interval_ms},
      {"snapshots", p.snapshots.passes},
      {"snapshot_failures", p.snapshots.failures},
      {"last_snapshot",
       {{"age_ms", p.snapshots.last_ms == 0 ? Json(nullptr) : Json(now - p.snapshots.last_ms)},
        {"ok", last.ok},
        {"written", last.written},
        {"deleted", last.erased},
        {"bytes", last.bytes},
        {"duration_ms", static_cast<double>(last.duration_us) / 1000.0}}},
      {"disk_bytes", p.disk.total()},
      {"disk", {{"counters_bytes", p.disk.counters}, {"overrides_bytes", p.disk.overrides}}},
      {"overrides", p.overrides},
      {"restored",
       {{"counters", p.restored.restored},
        {"expired", p.restored.expired},
        {"malformed", p.restored.malformed},
        {"no_room", p.restored.no_room},
        {"duration_ms", static_cast<double>(p.restored.duration_us) / 1000.0}}}};
}

std::string render_status(AdminHttp::State& st) {
  const engine::EngineStats es = st.node.engine().stats();
  const NodeCounters nc = st.node.counters();
  const int64_t now = st.node.now_ms();
  const int64_t started = st.node.started_ms();
  Json rules = Json::array();
  for (const engine::RuleStats& r : es.rules) {
    rules.push_back(Json{{"name", r.name},
                         {"allowed", r.allowed},
                         {"denied", r.denied},
                         {"shadow_denied", r.shadow_denied},
                         {"would_deny", r.would_deny}});
  }
  Json j = {
      {"node",
       {{"uptime_s", now > started ? (now - started) / 1000 : 0},
        {"started_ms", started},
        {"threads", st.node.options().threads},
        {"udp_port", st.node.udp_port()},
        {"tcp_port", st.node.tcp_port()},
        {"admin_port", st.node.admin_port()}}},
      {"engine",
       {{"live_counters", es.live_counters},
        {"table_bytes", es.table_bytes},
        {"remote_bytes", es.remote_bytes},
        {"memory_cap_bytes", es.memory_cap_bytes},
        {"evicted_expired", es.evicted_expired},
        {"evicted_live", es.evicted_live},
        {"allowlisted", es.allowlisted},
        {"no_room", es.no_room},
        {"checks", es.checks},
        {"leases_held", es.leases_held},
        {"leases_granted", es.leases_granted},
        {"leases_released", es.leases_released},
        {"lease_bytes", es.lease_bytes},
        {"slice_checks_local", es.slice_checks_local},
        {"slice_checks_to_owner", es.slice_checks_to_owner},
        {"slices_granted", es.slices_granted},
        {"slices_returned", es.slices_returned},
        {"slices_expired", es.slices_expired},
        {"slice_bytes", es.slice_bytes}}},
      {"requests",
       {{"udp", nc.udp_requests},
        {"tcp", nc.tcp_requests},
        {"http", st.http_checks},
        {"tcp_connections", nc.tcp_connections},
        {"dropped_datagrams", nc.dropped_datagrams},
        {"bad_frames", nc.closed_connections_bad_frame},
        {"rejected", nc.rejected_requests},
        {"forwarded", nc.forwarded_requests},
        {"forwarded_parts", nc.forwarded_parts},
        {"forward_fallbacks", nc.forward_fallbacks},
        {"forward_failovers", nc.forward_failovers},
        {"reloads", nc.reloads},
        {"reload_failures", nc.reload_failures}}},
      {"rules", std::move(rules)},
      {"process", {{"rss_bytes", resident_bytes()}}},
      {"persistence", persistence_json(st.node.persistence(), now)},
      {"cluster", cluster_json(st.node.cluster_status())},
  };
  return j.dump() + "\n";
}

}  // namespace

namespace {

// ---- one connection --------------------------------------------------------------------------

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<AdminHttp::State> st, tcp::socket socket)
      : st_(std::move(st)), stream_(std::move(socket)) {
    st_->connections.insert(this);
  }
  ~Connection() {
    st_->connections.erase(this);
    st_->maybe_resume_accept();
  }

  void start() { read_header(); }

  // stop(): an idle connection (waiting for a request) is closed now; one writing finishes first.
  void close_if_idle() {
    if (reading_) close();
  }
  // Waiting for (part of) a request since `waiting_since()`; see State::shed_oldest_idle.
  bool waiting() const { return reading_; }
  // Closed to make room: no longer waiting (it leaves the set when its read handler has run).
  void shed() {
    reading_ = false;
    close();
  }
  std::chrono::steady_clock::time_point waiting_since() const { return read_started_; }
  void close() {
    boost::system::error_code ec;
    stream_.socket().close(ec);
  }

 private:
  void read_header() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(kMaxHeaderBytes));
    parser_->body_limit(kMaxBodyBytes);
    reading_ = true;
    in_body_ = false;
    read_started_ = std::chrono::steady_clock::now();
    stream_.expires_after(st_->client_timeout());
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    const auto& req = parser_->get();
    // curl and others wait for "100 Continue" before sending a larger body.
    if (!parser_->is_done() && beast::iequals(req[http::field::expect], "100-continue")) {
      continue_ = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                     req.version());
      http::async_write(stream_, *continue_,
                        [self = shared_from_this()](beast::error_code wec, size_t) {
                          if (wec) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    in_body_ = true;
    stream_.expires_after(st_->client_timeout());
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read_error(beast::error_code ec) {
    reading_ = false;
    if (ec == beast::error::timeout) {
      // Nothing of a request yet: an idle keep-alive connection; else a slow client.
      if (in_body_) {
        ++st_->closed_body;
      } else if (parser_->got_some() || buffer_.size() > 0) {
        ++st_->closed_header;
      } else {
        ++st_->closed_idle;
      }
      return close();
    }
    if (ec == http::error::body_limit) {
      return reply_error(http::status::payload_too_large,
                         "body larger than " + std::to_string(kMaxBodyBytes) + " bytes");
    }
    if (ec == http::error::header_limit) {
      return reply_error(
          http::status::request_header_fields_too_large,
          "request header larger than " + std::to_string(kMaxHeaderBytes) + " bytes");
    }
    // A parse error gets an answer; a closed, reset or timed-out connection is just closed.
    if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return reply_error(http::status::bad_request, "malformed HTTP request: " + ec.message());
    }
    close();
  }

  void on_read(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    reading_ = false;
    const auto& req = parser_->get();
    res_ = {};
    res_.version(11);
    res_.keep_alive(req.keep_alive() && !st_->stopped);
    // A handler that throws answers 500 and is counted; it never takes the node down (one
    // request used to: a JSON number past double's range, found by tests/fuzz/http_fuzz).
    try {
      route(req);
    } catch (const std::exception& e) {
      ++st_->internal_errors;
      spdlog::error("admin HTTP: {} {} failed: {}",
                    std::string_view(req.method_string().data(), req.method_string().size()),
                    std::string_view(req.target().data(), req.target().size()), e.what());
      if (check_pending_) return;  // the check's answer is on its way
      res_ = {};
      res_.version(11);
      res_.keep_alive(false);
      json(http::status::internal_server_error, Json{{"error", "internal error"}});
    }
    if (!check_pending_) write();  // else finish_check() writes
  }

  // /v1/check, /v1/auth and /v1/release: the check goes the way every check port's does
  // (Node::check_async: a worker, and in a cluster the owner of its keys, which is also the node
  // that holds their leases); the answer is written when it comes back, on this connection's
  // thread.
  enum class Front { kCheck, kAuth, kRelease };
  void start_check(const CheckInput& in, Front front) {
    std::vector<wire::Entry> entries;
    entries.reserve(in.entries.size());
    for (const auto& [k, v] : in.entries)
      entries.push_back({k, v});
    wire::Check check{in.domain, entries, static_cast<int64_t>(in.hits)};
    check.is_release = in.release != 0;
    check.release = in.release;
    std::vector<uint8_t> request;
    wire::encode_request(++st_->next_check_id, std::span<const wire::Check>(&check, 1), 0, request);
    check_pending_ = true;
    st_->node.check_async(std::move(request), [self = shared_from_this(), front,
                                               &io = st_->io](std::span<const uint8_t> answer) {
      asio::post(io, [self, front, bytes = std::vector<uint8_t>(answer.begin(), answer.end())] {
        self->finish_check(bytes, front);
      });
    });
  }

  void finish_check(const std::vector<uint8_t>& bytes, Front front) {
    check_pending_ = false;
    wire::Answer a;
    if (bytes.empty() || wire::decode_answer(bytes, a) != wire::Code::kOk ||
        a.decisions.size() != 1) {
      json(http::status::service_unavailable, Json{{"error", "no decision: the node is stopping"}});
      return write();
    }
    ++st_->http_checks;
    if (front == Front::kRelease) return finish_release(a.decisions[0]);
    const CheckOutcome o = outcome_of(a.decisions[0]);
    for (const auto& [name, value] : o.headers)
      res_.set(name, value);
    if (front == Front::kCheck) {
      const http::status status = o.error            ? http::status::bad_request
                                  : o.enforce_denied ? http::status::too_many_requests
                                                     : http::status::ok;
      json(status, o.body);
    } else if (o.error) {
      json(http::status::bad_request, o.body);
    } else if (o.enforce_denied) {
      json(http::status::forbidden, o.body);
    } else {
      // auth_request lets the request through on any 2xx. A shadow denial passes too (the
      // caller must fail silently); the header lets nginx hand the verdict to the upstream.
      if (o.shadow) res_.set("Sluice-Shadow", "1");
      // So does a lease (nginx cannot release it; an upstream that can, may).
      if (a.decisions[0].lease != 0) res_.set("Sluice-Lease", format_lease(a.decisions[0].lease));
      res_.result(http::status::no_content);
    }
    write();
  }

  // /v1/release: 200 when it freed the lease's slots; 409 when it changed nothing (the lease was
  // released before, has expired, or is not known for these entries); 503 when the memory cap
  // left no room to count the release (nothing changed); 400 for a request error (unknown
  // domain, ...), as /v1/check.
  void finish_release(const wire::Decision& d) {
    switch (d.code) {
      case wire::Code::kOk:
        json(http::status::ok, Json{{"released", true}});
        break;
      case wire::Code::kLeaseUnknown:
      case wire::Code::kLeaseExpired:
      case wire::Code::kLeaseReleased:
        json(http::status::conflict, Json{{"released", false}, {"code", wire::to_string(d.code)}});
        break;
      case wire::Code::kNoRoom:  // the memory cap: the lease stays held; try again, or it expires
        json(http::status::service_unavailable,
             Json{{"released", false}, {"code", wire::to_string(d.code)}});
        break;
      default:
        json(http::status::bad_request,
             Json{{"released", false}, {"code", wire::to_string(d.code)}});
        break;
    }
    write();
  }

  void reply_error(http::status status, const std::string& message) {
    res_ = {};
    res_.version(11);
    res_.keep_alive(false);
    json(status, Json{{"error", message}});
    write();
  }

  void write() {
    res_.prepare_payload();
    stream_.expires_after(kWriteTimeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_write(ec);
    });
  }

  void on_write(beast::error_code ec) {
    if (ec || !res_.keep_alive() || st_->stopped) {
      boost::system::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      return close();
    }
    read_header();
  }

  void text(http::status status, std::string_view content_type, std::string body) {
    res_.result(status);
    res_.set(http::field::content_type, bsv(content_type));
    res_.body() = std::move(body);
  }
  void json(http::status status, const Json& j) {
    text(status, "application/json", j.dump() + "\n");
  }
  void method_not_allowed(std::string_view allow) {
    res_.set(http::field::allow, bsv(allow));
    json(http::status::method_not_allowed, Json{{"error", "method not allowed"}});
  }

  void route(const http::request<http::string_body>& req) {
    const std::string_view target(req.target().data(), req.target().size());
    const size_t q = target.find('?');
    const std::string_view path = target.substr(0, q);
    const std::string_view query =
        q == std::string_view::npos ? std::string_view() : target.substr(q + 1);
    const bool get = req.method() == http::verb::get;

    // Operator writes (and reads, with admin_token_reads) need the admin token: admin_auth.h.
    {
      const std::string_view verb(req.method_string().data(), req.method_string().size());
      const auto h = req.find(http::field::authorization);
      const AdminAuth::Verdict v =
          st_->auth.check(verb, path,
                          h == req.end() ? std::nullopt
                                         : std::optional<std::string_view>(std::string_view(
                                               h->value().data(), h->value().size())),
                          req.count(http::field::authorization));
      if (!v.allowed) {
        if (v.challenge) res_.set(http::field::www_authenticate, "Bearer");
        return json(static_cast<http::status>(v.status), Json{{"error", v.message}});
      }
    }

    if (path == "/healthz") {
      if (!get) return method_not_allowed("GET");
      // Liveness: the admin port answers once the data directory is restored. Readiness
      // (?ready): also joined to the cluster, and not stopping.
      std::vector<std::pair<std::string, std::string>> params;
      if (!parse_query(query, params)) {
        return text(http::status::bad_request, "text/plain; charset=utf-8",
                    "malformed percent-escape in the query string\n");
      }
      const bool readiness = std::any_of(params.begin(), params.end(),
                                         [](const auto& kv) { return kv.first == "ready"; });
      if (!readiness) return text(http::status::ok, "text/plain; charset=utf-8", "ok\n");
      if (std::string why = st_->node.not_ready(); !why.empty()) {
        return text(http::status::service_unavailable, "text/plain; charset=utf-8",
                    "not ready: " + why + "\n");
      }
      return text(http::status::ok, "text/plain; charset=utf-8", "ready\n");
    }
    if (path == "/metrics") {
      if (!get) return method_not_allowed("GET");
      return text(http::status::ok, "text/plain; version=0.0.4; charset=utf-8",
                  render_metrics(*st_));
    }
    if (path == "/v1/status") {
      if (!get) return method_not_allowed("GET");
      return text(http::status::ok, "application/json", render_status(*st_));
    }
    if (path == "/v1/check") {
      if (req.method() != http::verb::post) return method_not_allowed("POST");
      CheckInput in;
      if (std::string err = parse_check_body(req.body(), in); !err.empty()) {
        return json(http::status::bad_request, Json{{"error", err}});
      }
      return start_check(in, Front::kCheck);
    }
    if (path == "/v1/release") {
      if (req.method() != http::verb::post) return method_not_allowed("POST");
      CheckInput in;
      if (std::string err = parse_release_body(req.body(), in); !err.empty()) {
        return json(http::status::bad_request, Json{{"error", err}});
      }
      return start_check(in, Front::kRelease);
    }
    if (path == "/v1/auth") {
      if (!get) return method_not_allowed("GET");
      CheckInput in;
      std::vector<std::pair<std::string_view, std::string_view>> headers;
      for (const auto& f : req) {
        headers.emplace_back(std::string_view(f.name_string().data(), f.name_string().size()),
                             std::string_view(f.value().data(), f.value().size()));
      }
      if (std::string err = parse_auth_input(query, headers, in); !err.empty()) {
        return json(http::status::bad_request, Json{{"error", err}});
      }
      return start_check(in, Front::kAuth);
    }
    const std::string_view method(req.method_string().data(), req.method_string().size());
    if (auto r = st_->dashboard.handle(method, path, query)) {
      for (const auto& [name, value] : r->headers)
        res_.set(name, value);
      return text(static_cast<http::status>(r->status), r->content_type, std::move(r->body));
    }
    if (auto r = handle_ops(st_->node, method, path, query, req.body())) {
      if (!r->allow.empty()) res_.set(http::field::allow, r->allow);
      return json(static_cast<http::status>(r->status), r->body);
    }
    json(http::status::not_found, Json{{"error", "not found"}});
  }

  std::shared_ptr<AdminHttp::State> st_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<http::response<http::empty_body>> continue_;
  http::response<http::string_body> res_;
  bool reading_ = false;
  bool in_body_ = false;  // the header is in; reading the body
  std::chrono::steady_clock::time_point read_started_;
  bool check_pending_ = false;  // a check's answer is on its way (start_check)
};

}  // namespace

void AdminHttp::State::accept() {
  accepting = true;
  acceptor.async_accept(
      io, [st = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
        st->accepting = false;
        if (st->stopped) return;
        if (ec) {
          if (ec == asio::error::operation_aborted) return;
          // Out of descriptors and the like: retry soon rather than spin.
          ++st->accept_errors;
          st->retry.expires_after(kAcceptRetry);
          st->retry.async_wait([st](boost::system::error_code wec) {
            if (!wec) st->maybe_resume_accept();
          });
          return;
        }
        // At the cap, the connection that has waited longest for a request makes room. With
        // none waiting (all busy) this one is served all the same, and accepting pauses below
        // until a connection closes: at most one over the cap.
        if (st->connections.size() >= st->max_connections()) st->shed_oldest_idle();
        std::make_shared<Connection>(st, std::move(socket))->start();
        st->maybe_resume_accept();  // pauses at max_connections; a closing connection resumes it
      });
}

bool AdminHttp::State::shed_oldest_idle() {
  Connection* oldest = nullptr;
  for (Connection* c : connections) {
    if (c->waiting() && (oldest == nullptr || c->waiting_since() < oldest->waiting_since())) {
      oldest = c;
    }
  }
  if (oldest == nullptr) return false;
  ++closed_shed;
  oldest->shed();  // its read completes with an error and the connection goes
  return true;
}

bool AdminHttp::State::any_waiting() const {
  for (const Connection* c : connections) {
    if (c->waiting()) return true;
  }
  return false;
}

AdminHttp::AdminHttp(asio::io_context& io, const std::string& listen, Node& node, AdminAuth& auth)
    : state_(std::make_shared<State>(io, node, auth)) {
  const tcp::endpoint ep = parse_listen(listen);
  auth.set_loopback_listener(ep.address().is_loopback());
  boost::system::error_code ec;
  tcp::acceptor& a = state_->acceptor;
  const auto fail = [&](const char* what) {
    throw std::runtime_error("admin HTTP listen address \"" + listen + "\": " + what + ": " +
                             ec.message());
  };
  if (a.open(ep.protocol(), ec)) fail("open");
  if (a.set_option(asio::socket_base::reuse_address(true), ec)) fail("SO_REUSEADDR");
  if (ep.address().is_v6() && a.set_option(asio::ip::v6_only(true), ec)) fail("IPV6_V6ONLY");
  if (a.bind(ep, ec)) fail("bind");
  if (a.listen(asio::socket_base::max_listen_connections, ec)) fail("listen");
  port_ = a.local_endpoint(ec).port();
  if (ec) fail("local address");
  state_->accept();
  state_->dashboard.start();
}

AdminHttp::~AdminHttp() {
  stop();
  // Copy first: closing makes pending handlers complete later, not now, but stay safe.
  std::vector<Connection*> open(state_->connections.begin(), state_->connections.end());
  for (Connection* c : open)
    c->close();
}

uint16_t AdminHttp::port() const {
  return port_;
}

void AdminHttp::stop() {
  State& st = *state_;
  if (st.stopped) return;
  st.stopped = true;
  boost::system::error_code ec;
  st.acceptor.close(ec);
  st.retry.cancel();
  st.dashboard.stop();
  std::vector<Connection*> open(st.connections.begin(), st.connections.end());
  for (Connection* c : open)
    c->close_if_idle();
}

}  // namespace sluice::node
