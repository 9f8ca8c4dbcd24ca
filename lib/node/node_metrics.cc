// The parts' metrics (node_metrics.h).
#include "node/node_metrics.h"

#include <algorithm>
#include <map>
#include <string>

#include "base/release.h"
#include "engine/engine.h"
#include "node/admin_auth.h"
#include "node/node.h"
#include "node/node_cluster.h"
#include "rls/rls.h"

namespace sluice::node {

void append_engine_metrics(MetricsText& m, const engine::EngineStats& es,
                           uint64_t slice_prefetches) {
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
        "Leased quotas: slices asked for before the one held ran out.", slice_prefetches);
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
}

void append_check_metrics(MetricsText& m, const NodeCounters& nc, uint64_t http_checks) {
  m.family("sluice_requests_total", "counter",
           "Check requests received, by transport (http: /v1/check, /v1/auth, /v1/release).");
  m.sample("sluice_requests_total", {"transport", "udp"}, nc.udp_requests);
  m.sample("sluice_requests_total", {"transport", "tcp"}, nc.tcp_requests);
  m.sample("sluice_requests_total", {"transport", "http"}, http_checks);
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
}

void append_rls_metrics(MetricsText& m, const rls::RlsCounters& r) {
  m.family("sluice_rls_requests_total", "counter",
           "gRPC ShouldRateLimit calls by outcome (docs/envoy.md): ok and over_limit answered; "
           "invalid_argument and resource_exhausted refused before any counter was touched; "
           "unavailable while stopping; internal for an answer that could not be used.");
  m.sample("sluice_rls_requests_total", {"result", "ok"}, r.ok);
  m.sample("sluice_rls_requests_total", {"result", "over_limit"}, r.over_limit);
  m.sample("sluice_rls_requests_total", {"result", "invalid_argument"}, r.invalid_argument);
  m.sample("sluice_rls_requests_total", {"result", "resource_exhausted"}, r.resource_exhausted);
  m.sample("sluice_rls_requests_total", {"result", "unavailable"}, r.unavailable);
  m.sample("sluice_rls_requests_total", {"result", "internal"}, r.internal);
  m.one("sluice_rls_descriptors_total", "counter",
        "Descriptors in answered gRPC ShouldRateLimit calls.", r.descriptors);
  m.one("sluice_rls_connections_total", "counter", "gRPC (HTTP/2) connections accepted.",
        r.connections);
  m.one("sluice_rls_connections_open", "gauge", "gRPC connections open now.", r.connections_open);
  m.family("sluice_rls_connections_closed_total", "counter",
           "gRPC connections the node closed before the client did: shed (no call in flight, for "
           "a new connection over max_connections), over_cap (a new connection over "
           "max_connections when every open one had calls in flight), handshake (no HTTP/2 "
           "preface and SETTINGS within client_timeout_ms), protocol (an HTTP/2 protocol error).");
  m.sample("sluice_rls_connections_closed_total", {"reason", "shed"}, r.connections_shed);
  m.sample("sluice_rls_connections_closed_total", {"reason", "over_cap"}, r.connections_refused);
  m.sample("sluice_rls_connections_closed_total", {"reason", "handshake"},
           r.connections_closed_handshake);
  m.sample("sluice_rls_connections_closed_total", {"reason", "protocol"}, r.protocol_errors);
}

void append_resp_metrics(MetricsText& m, const RespStats& r) {
  if (!r.enabled) return;
  m.one("sluice_resp_connections_total", "counter", "RESP (Redis protocol) connections accepted.",
        r.accepted);
  m.one("sluice_resp_connections_open", "gauge", "RESP connections open now.", r.open);
  m.family("sluice_resp_connections_closed_total", "counter",
           "RESP connections closed, by reason: client (the client closed it, or the socket "
           "failed), finished (QUIT, or a protocol error answered first), shed (the one idle "
           "longest, for a new connection over max_connections), frame (a command not finished "
           "within client_timeout_ms), write (replies not taken), stop (the node stopped).");
  for (const auto& [reason, n] : r.closed)
    m.sample("sluice_resp_connections_closed_total", {"reason", reason}, n);
  m.one("sluice_resp_commands_total", "counter", "RESP commands run (MULTI's queued ones once).",
        r.commands);
  m.one("sluice_resp_unknown_commands_total", "counter",
        "RESP commands answered Redis's unknown command error.", r.unknown_commands);
  m.family("sluice_resp_protocol_errors_total", "counter",
           "RESP requests refused as malformed or over a limit, by reason; the connection is "
           "closed after the error reply, no counter touched.");
  for (const auto& [reason, n] : r.protocol_errors)
    m.sample("sluice_resp_protocol_errors_total", {"reason", reason}, n);
  m.one("sluice_resp_auth_failures_total", "counter",
        "RESP AUTH (and HELLO AUTH) attempts with a wrong password.", r.auth_failures);
}

void append_tcp_metrics(MetricsText& m, const NodeCounters& nc) {
  m.one("sluice_tcp_connections_total", "counter", "TCP connections accepted.", nc.tcp_connections);
  m.one("sluice_tcp_connections_open", "gauge", "TCP check connections open now.", nc.tcp_open);
  m.family("sluice_tcp_connections_closed_total", "counter",
           "TCP check connections the node closed before the client did: shed (the one waiting "
           "longest, for a new connection over max_connections), frame (a frame not finished "
           "within client_timeout_ms).");
  m.sample("sluice_tcp_connections_closed_total", {"reason", "shed"}, nc.tcp_closed_shed);
  m.sample("sluice_tcp_connections_closed_total", {"reason", "frame"}, nc.tcp_closed_frame);
}

void append_auth_metrics(MetricsText& m, const AdminAuth& auth) {
  m.family("sluice_admin_auth_failures_total", "counter",
           "Admin requests refused for want of the admin token, by reason (docs/operations.md, "
           "\"Admin token\").");
  for (const auto& [reason, n] : auth.failures())
    m.sample("sluice_admin_auth_failures_total", {"reason", reason}, n);
}

void append_latency_metrics(MetricsText& m, const NodeCounters& nc) {
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
}

void append_persistence_metrics(MetricsText& m, const PersistenceStatus& p) {
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
    m.family("sluice_store_memory_bytes", "gauge",
             "Bytes RocksDB holds in memory for the data directory, by RocksDB's own accounting: "
             "memtables (the snapshots' write buffers), table_readers (index and filter blocks of "
             "open table files), block_cache.");
    m.sample("sluice_store_memory_bytes", {"kind", "memtables"}, p.memory.memtables);
    m.sample("sluice_store_memory_bytes", {"kind", "table_readers"}, p.memory.table_readers);
    m.sample("sluice_store_memory_bytes", {"kind", "block_cache"}, p.memory.block_cache);
    m.one("sluice_restored_counters", "gauge",
          "Counters restored from the data directory at start.", p.restored.restored);
  }
  m.one("sluice_overrides", "gauge", "Runtime overrides in force.", p.overrides);
}

namespace {

// Per member: the gauges of its sync lag and of how far its clock is from this node's.
void append_member_metrics(MetricsText& m, const ClusterStatus& c) {
  m.family("sluice_cluster_sync_lag_ms", "gauge",
           "Per member: ms since its last sync batch arrived (members never heard from: absent).");
  for (const MemberStatus& ms : c.members) {
    if (ms.last_sync_ms >= 0) {
      m.sample("sluice_cluster_sync_lag_ms", {"member", ms.member.name},
               static_cast<uint64_t>(ms.last_sync_ms));
    }
  }
  m.family("sluice_cluster_clock_offset_ms", "gauge",
           "Per member: how far its clock is ahead of this node's (negative: behind), by its last "
           "datagram's send time, less the one-way delay.");
  for (const MemberStatus& ms : c.members) {
    if (ms.clock_offset_ms && ms.member.id != c.self) {
      m.sample_signed("sluice_cluster_clock_offset_ms", {"member", ms.member.name},
                      *ms.clock_offset_ms);
    }
  }
}

}  // namespace

void append_cluster_metrics(MetricsText& m, const ClusterStatus& c) {
  if (!c.enabled) return;
  m.one("sluice_cluster_ready", "gauge",
        "1 once this node's first join had an outcome (what /healthz?ready waits for).",
        c.not_ready.empty() ? 1 : 0);
  m.family("sluice_cluster_members", "gauge", "Members this node knows, by state (self included).");
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
  append_member_metrics(m, c);
  m.family("sluice_peer_dropped_total", "counter",
           "Peer datagrams dropped, by reason (bad_tag: wrong secret or tampered; replayed; ...).");
  // The reasons an authentication alert watches are there from the start, at 0, so that a rate
  // over them is defined before the first drop (deploy/prometheus/sluice-rules.yml).
  std::map<std::string, uint64_t> dropped = {
      {"bad_tag", 0}, {"replayed", 0}, {"stale_boot", 0}, {"release_outside_window", 0}};
  for (const auto& [reason, n] : c.dropped)
    dropped[reason] += n;
  for (const auto& [reason, n] : dropped)
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
  m.one("sluice_cluster_member_restarts_total", "counter",
        "Members heard back as a new life of their node (a newer boot id): each got its counts "
        "back at once and its keys were fenced.",
        c.member_restarts);
  m.one("sluice_cluster_self_fenced", "gauge",
        "1 while this node, a new life of its node id, decides its own keys as a takeover.",
        c.self_fenced ? uint64_t{1} : uint64_t{0});
  const char* kinds[] = {"changed", "resend", "handoff"};
  m.family("sluice_sync_passes_total", "counter",
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
        "Member records this node sent in answer to digest pulls.", c.membership.pull_entries_sent);
  m.one("sluice_membership_local_health", "gauge",
        "Lifeguard local health score: probes stretch by (score + 1) when this node is slow.",
        c.membership.local_health);
}

void append_build_metrics(MetricsText& m) {
  m.family("sluice_build_info", "gauge",
           "Always 1; `version` is the release this sluiced is (CHANGELOG.md).");
  m.sample("sluice_build_info", {"version", kThisVersion}, 1);
}

}  // namespace sluice::node
