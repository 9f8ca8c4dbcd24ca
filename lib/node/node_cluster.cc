// A node's part in the cluster (node_cluster.h): peer socket, membership, ring, delta sync.
#include <utility>  // before Asio: Boost 1.74 with g++ 12 needs std::exchange declared

#include "node/node_cluster.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "base/host_port.h"
#include "cluster/delta_sync.h"
#include "cluster/peer_codec.h"
#include "cluster/reach.h"
#include "node/dns_seeds.h"
#include "node/node_state.h"
#include "node/override_sync.h"
#include "node/peer_io.h"

namespace sluice::node {

namespace asio = boost::asio;
using asio::ip::udp;
using cluster::Member;
using cluster::MemberState;
using cluster::NodeId;

namespace {

constexpr size_t kDatagramBytes = 65'536;
constexpr int64_t kMaxTickDelayMs = 100;  // re-check membership at least this often

bool in_ring(const Member& m) {
  return m.state == MemberState::kAlive || m.state == MemberState::kSuspect;
}

// ---- PeerIo on UDP and Asio timers (peer_io.h) ----

class AsioTimer final : public PeerTimer {
 public:
  explicit AsioTimer(asio::io_context& io) : timer_(io) {}
  void arm(int64_t delay_us, std::function<void()> fn) override {
    // A wait that already expired cannot be cancelled (its handler is queued): the generation
    // keeps it from running after a later arm() or cancel().
    const uint64_t gen = ++*gen_;
    timer_.expires_after(std::chrono::microseconds(std::max<int64_t>(0, delay_us)));
    timer_.async_wait([g = gen_, gen, fn = std::move(fn)](boost::system::error_code ec) {
      if (!ec && *g == gen) fn();
    });
  }
  void cancel() override {
    ++*gen_;
    timer_.cancel();
  }

 private:
  asio::steady_timer timer_;
  std::shared_ptr<uint64_t> gen_ = std::make_shared<uint64_t>(0);
};

class UdpPeerIo final : public PeerIo {
 public:
  explicit UdpPeerIo(asio::io_context& io) : io_(io), socket_(io) {}

  uint16_t open(const std::string& host, uint16_t port) override {
    boost::system::error_code ec;
    const udp::endpoint ep(asio::ip::make_address(host, ec), port);
    if (ec) throw std::runtime_error("'" + host + "' is not an IP address");
    socket_.open(ep.protocol(), ec);
    if (!ec) socket_.set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
    if (!ec) socket_.bind(ep, ec);
    if (ec) throw std::runtime_error(ec.message());
    return socket_.local_endpoint().port();
  }

  void start_receiving(Receiver on) override {
    on_ = std::move(on);
    receive();
  }

  bool send(const cluster::Endpoint& to, std::span<const uint8_t> bytes) override {
    boost::system::error_code ec;
    const auto addr = asio::ip::make_address(to.host, ec);
    if (ec) return false;
    socket_.send_to(asio::buffer(bytes.data(), bytes.size()), udp::endpoint(addr, to.port), 0, ec);
    return !ec;
  }

  void close() override {
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
  }

  std::unique_ptr<PeerTimer> timer() override { return std::make_unique<AsioTimer>(io_); }

 private:
  void receive() {
    socket_.async_receive_from(asio::buffer(in_), sender_,
                               [this](boost::system::error_code ec, size_t n) {
                                 if (ec == asio::error::operation_aborted || closed_) return;
                                 if (!ec) {
                                   from_.host = sender_.address().to_string();
                                   from_.port = sender_.port();
                                   on_({in_.data(), n}, from_);
                                 }
                                 if (!closed_) receive();
                               });
  }

  asio::io_context& io_;
  udp::socket socket_;
  udp::endpoint sender_;
  cluster::Endpoint from_;
  std::array<uint8_t, kDatagramBytes> in_{};
  Receiver on_;
  bool closed_ = false;
};

}  // namespace

Status validate_cluster_options(ClusterOptions& opt) {
  if (opt.node_id == 0) return Status::InvalidArgument("cluster.node_id must be 1..65535");
  if (Status why = cluster::PeerCodec::check_secret(opt.secret); !why.ok()) {
    return Status::InvalidArgument("cluster.secret: " + why.message());
  }
  if (opt.listen.empty()) return Status::InvalidArgument("cluster.listen is required");
  StatusOr<HostPort> listen = split_host_port(opt.listen);
  if (!listen.ok()) {
    return Status::InvalidArgument("cluster.listen '" + opt.listen + "': " + listen.message());
  }
  boost::system::error_code ec;
  const asio::ip::address addr =
      asio::ip::make_address(listen->host.empty() ? "0.0.0.0" : listen->host, ec);
  if (ec) {
    return Status::InvalidArgument("cluster.listen '" + opt.listen + "': not an IP address");
  }
  const std::string advertise = opt.advertise.empty() ? addr.to_string() : opt.advertise;
  if (advertise == "0.0.0.0" || advertise == "::") {
    return Status::InvalidArgument(
        "cluster.advertise is required when cluster.listen is a wildcard address");
  }
  for (const std::string& seed : opt.seeds) {
    if (Status why = check_seed(seed); !why.ok()) {
      return Status::InvalidArgument("cluster.seeds: " + why.message());
    }
  }
  if (opt.name.empty()) opt.name = "node-" + std::to_string(opt.node_id);
  // Tests and one-off runs point DNS seeds at a server of their own without a config change.
  const char* env_dns = std::getenv("SLUICE_DNS_SERVER");
  const bool dns_from_env = opt.dns_server.empty() && env_dns != nullptr && *env_dns != '\0';
  if (dns_from_env) opt.dns_server = env_dns;
  if (!opt.dns_server.empty()) {
    if (std::string why = parse_dns_server(opt.dns_server).error; !why.empty()) {
      return Status::InvalidArgument((dns_from_env ? "SLUICE_DNS_SERVER " : "cluster.dns_server ") +
                                     why);
    }
  }
  return {};
}

std::unique_ptr<PeerIo> make_udp_peer_io(asio::io_context& control) {
  return std::make_unique<UdpPeerIo>(control);
}

struct ClusterNode::Impl : cluster::MembershipTransport {
  Impl(asio::io_context& io_, NodeState& st_, std::unique_ptr<PeerIo> net_)
      : io(io_),
        st(st_),
        opt(st_.opt.cluster),
        net(net_ ? std::move(net_) : make_udp_peer_io(io_)),
        tick_timer(net->timer()),
        sync_timer(net->timer()),
        reach_timer(net->timer()),
        slice_timer(net->timer()),
        reach({st_.opt.cluster.node_id, st_.opt.cluster.sync_interval_ms,
               st_.opt.cluster.forget_dead_after_ms}) {
    // Node::open checked the options first; a node built around that check is a bug.
    if (Status s = validate_cluster_options(opt); !s.ok()) throw std::logic_error(s.message());
    const HostPort listen = split_host_port(opt.listen).value();
    listen_addr = asio::ip::make_address(listen.host.empty() ? "0.0.0.0" : listen.host);
    listen_port = listen.port;
    advertise = opt.advertise.empty() ? listen_addr.to_string() : opt.advertise;
    // The node's clock (the system clock in sluiced): a run on a simulated clock is then a
    // function of its inputs, down to membership's random choices (seeded from it).
    boot_id = static_cast<uint64_t>(st.opt.clock());
    codec = std::make_unique<cluster::PeerCodec>(opt.secret, opt.node_id, boot_id);
    delta = std::make_unique<cluster::DeltaSync>(
        *st.engine, opt.node_id, cluster::sync_totals_within(cluster::kSyncDatagramBytes));
    // Totals go packed to the members whose datagrams say they read the packed form.
    delta->set_compact(
        [this](NodeId to) {
          const auto r = releases.find(to);
          return r != releases.end() && cluster::reads_packed_sync(r->second);
        },
        cluster::sync_packed_within(cluster::kSyncDatagramBytes));
    st.engine->set_gossip_lag(3 * opt.sync_interval_ms + 100);
    published_ring = std::make_shared<const cluster::HashRing>(opt.replicas);
  }

  // ---- MembershipTransport ----
  void send(const cluster::Endpoint& to, const cluster::MembershipMessage& m) override {
    const cluster::PeerError e = codec->seal(m, st.opt.clock(), out);
    if (e != cluster::PeerError::kOk) {
      spdlog::warn("cluster: membership message not sealed: {}", cluster::to_string(e));
      return;
    }
    send_raw(to, out);
  }

  void send_raw(const cluster::Endpoint& to, const std::vector<uint8_t>& bytes) {
    if (!net->send(to, bytes)) {
      ++send_errors;
    } else {
      ++datagrams_out;
      bytes_out += bytes.size();
    }
  }

  void send_batch(NodeId to, cluster::SyncBatch& b) {
    const auto m = members_by_id.find(to);
    if (m == members_by_id.end()) return;
    b.heard_ms = reach.echo_for(to);  // tells `to` its datagrams reach us
    const cluster::PeerError e = codec->seal(b, st.opt.clock(), out);
    if (e != cluster::PeerError::kOk) {
      spdlog::warn("cluster: sync batch for node {} not sealed: {}", to, cluster::to_string(e));
      return;
    }
    send_raw(cluster::peer_endpoint(m->second), out);
  }

  // ---- receiving ----
  void receive() {
    net->start_receiving([this](std::span<const uint8_t> datagram, const cluster::Endpoint& from) {
      if (!stopped) on_datagram(datagram, from);
    });
  }

  // A member whose clock is far from this node's puts its counts in other buckets than this
  // node's, where windows shorter than the offset do not see them (docs/operations.md, "Clocks"):
  // said once when its offset (send time minus arrival: less the one-way delay) leaves
  // +-kClockWarnMs, and once when it is back within.
  static constexpr int64_t kClockWarnMs = 250;
  void check_clock(NodeId from, int64_t offset_ms) {
    const bool off = offset_ms > kClockWarnMs || offset_ms < -kClockWarnMs;
    if (off == clock_warned.contains(from)) return;
    if (off) {
      clock_warned.insert(from);
      spdlog::warn(
          "cluster: member {}'s clock is {} ms {} this node's: its counts land in other "
          "buckets here (keep the nodes' clocks in sync, e.g. NTP)",
          from, offset_ms > 0 ? offset_ms : -offset_ms, offset_ms > 0 ? "ahead of" : "behind");
    } else {
      clock_warned.erase(from);
      spdlog::info("cluster: member {}'s clock is within {} ms of this node's again", from,
                   kClockWarnMs);
    }
  }

  void on_datagram(std::span<const uint8_t> datagram, const cluster::Endpoint& sender) {
    ++datagrams_in;
    bytes_in += datagram.size();
    const int64_t now = st.opt.clock();
    const cluster::PeerError e = codec->open(datagram, now, msg);
    if (e != cluster::PeerError::kOk) {
      ++dropped[std::string(cluster::to_string(e))];
      if (e == cluster::PeerError::kBadTag) {
        spdlog::debug("cluster: datagram from {} with a bad tag dropped (wrong secret?)",
                      sender.host);
      } else if (e == cluster::PeerError::kReleaseOutsideWindow &&
                 release_warned.emplace(msg.header.sender, wire_release(msg.header.release))
                     .second) {
        spdlog::error(
            "cluster: node {} ({}) runs sluiced {}, outside this node's compatibility window "
            "(sluiced {} talks to {}): its messages are dropped (release_outside_window); "
            "upgrade one minor release at a time (docs/operations.md, \"Rolling upgrade\")",
            msg.header.sender, sender.host, to_string(msg.header.release, false), kThisVersion,
            window_text(kThisRelease));
      }
      return;
    }
    const NodeId from = msg.header.sender;
    releases[from] = msg.header.release;
    note_boot(from, msg.header.boot_id, now);
    reach.heard(from, msg.header.sent_ms, now);
    check_clock(from, msg.header.sent_ms - now);
    if (const auto m = members_by_id.find(from);
        m != members_by_id.end() && m->second.state == MemberState::kDead) {
      // A member we believe dead is talking to us (a healed partition): tell it now, so it
      // refutes and the views merge within a round trip (at most one such ping per reach period).
      int64_t& at = reconnected_at[from];
      if (now - at >= reach.timeout_ms(members_by_id.size())) {
        at = now;
        membership->reconnect(from, now);
        after_membership_call();
      }
    }
    switch (msg.header.kind) {
      case cluster::PeerKind::kMembership:
        membership->on_message(sender, msg.membership, now);
        after_membership_call();
        break;
      case cluster::PeerKind::kSync: {
        reach.echoed(from, msg.sync.heard_ms);
        note_echo(from, msg.sync.heard_ms, now);
        if (msg.sync.totals.empty()) break;  // a heartbeat
        synced[from] = now;
        sync_totals_in += msg.sync.totals.size();
        st.engine->merge(msg.sync.totals, now);
        break;
      }
      case cluster::PeerKind::kOverrides:
        if (overrides) overrides->on_message(msg.overrides);
        break;
      default:
        ++dropped["unknown_kind"];
        break;
    }
  }

  // ---- fenced restarts (docs/architecture.md, "Fast restarts") ----
  // A member heard under a newer boot id than before is a new life of its node: killed and
  // restarted, maybe faster than anyone saw it out of reach. Its old life decided (owner mode) and
  // granted slices (lease mode) that its new life does not know. So: every holder of its keys
  // sends it back what it holds of them (a full pass to it alone, at once), a check of its keys
  // it redirects here is decided as a takeover for a while (View::restarted), and it is told that
  // it is a new life (a batch echoing the old life's last send time: fence_self on its side).
  static constexpr int kFenceSignals = 3;  // sent with the next heartbeats: one may be lost
  void note_boot(NodeId from, uint64_t boot, int64_t now) {
    const auto [it, first] = boots.try_emplace(from, boot);
    if (first || boot <= it->second) return;  // an older boot never gets here (kStaleBoot)
    it->second = boot;
    ++member_restarts;
    restarted[from] = now;
    restart_returned.insert(from);
    if (const int64_t old_echo = reach.echo_for(from); old_echo > 0) {
      fence_signals[from] = {old_echo, kFenceSignals};
      send_fence_signal(from);
    }
    spdlog::info(
        "cluster: member {} is back as a new life (boot {}): its counts go back to it, and checks "
        "of its keys it sends here are decided as a takeover for {} ms",
        from, boot, View::kRestartFenceMs);
    publish_fences();
  }

  // A batch that echoes `heard_ms`, a send time of the previous life of `to`, not the newest.
  void send_fence_signal(NodeId to) {
    const auto sig = fence_signals.find(to);
    const auto m = members_by_id.find(to);
    if (sig == fence_signals.end() || m == members_by_id.end()) return;
    fence_signal.totals.clear();
    fence_signal.handoff = false;
    fence_signal.heard_ms = sig->second.first;
    if (codec->seal(fence_signal, st.opt.clock(), out) == cluster::PeerError::kOk)
      send_raw(cluster::peer_endpoint(m->second), out);
    if (--sig->second.second <= 0) fence_signals.erase(sig);
  }

  // `from` echoed `heard_ms`, a send time of ours: of this life, or of an earlier one.
  void note_echo(NodeId from, int64_t heard_ms, int64_t now) {
    // An earlier life that stopped sending kRestartFenceMs or more before this one began (a
    // member dead for a while) admitted nothing a fence of that length would hold back.
    if (heard_ms > 0 && heard_ms < started_ms && started_ms - heard_ms < View::kRestartFenceMs)
      fence_self(from, now);
  }

  // A member heard an earlier life of this node id: what it admitted in the window before its end
  // is known nowhere, so this node decides its own keys as a takeover from its start (nothing
  // until one window after it) until kRestartFenceMs after its start.
  void fence_self(NodeId from, int64_t now) {
    if (self_fence_until_ms != INT64_MIN) return;  // once per life
    self_fence_until_ms = started_ms + View::kRestartFenceMs;
    spdlog::warn(
        "cluster: member {} heard an earlier life of this node: its keys allow nothing until one "
        "window after its start, for the next {} ms (what the earlier life admitted is unknown)",
        from, std::max<int64_t>(0, self_fence_until_ms - now));
    publish_fences();
  }

  // Drops the fences that have run their course; true when any did.
  bool prune_fences(int64_t now) {
    return std::erase_if(restarted, [now](const auto& e) {
             return now >= e.second + View::kRestartFenceMs;
           }) > 0;
  }

  void publish_fences() {
    auto r = std::make_shared<std::vector<std::pair<NodeId, int64_t>>>(restarted.begin(),
                                                                       restarted.end());
    std::lock_guard g(published_mu);
    published_restarted = std::move(r);
    published_self_fence_until_ms = self_fence_until_ms;
    published_self_fence_since_ms = self_fence_until_ms == INT64_MIN ? INT64_MIN : started_ms;
    view_version.fetch_add(1, std::memory_order_release);
  }

  // Cluster-wide overrides (override_sync.h): sealed and sent like every peer datagram.
  bool send_overrides(NodeId to, const cluster::OverrideSyncMessage& m) {
    const auto member = members_by_id.find(to);
    if (member == members_by_id.end()) return false;
    const cluster::PeerError e = codec->seal(m, st.opt.clock(), out);
    if (e != cluster::PeerError::kOk) {
      spdlog::warn("cluster: overrides for node {} not sealed: {}", to, cluster::to_string(e));
      return false;
    }
    send_raw(cluster::peer_endpoint(member->second), out);
    return true;
  }
  std::vector<NodeId> live_others() const {
    std::vector<NodeId> ids;
    for (const auto& [id, m] : members_by_id) {
      if (id != opt.node_id && in_ring(m)) ids.push_back(id);
    }
    return ids;
  }

  // ---- timers ----
  void arm_tick() {
    const int64_t now = st.opt.clock();
    const int64_t next = membership->next_deadline_ms();
    const int64_t delay = std::clamp<int64_t>(next - now, 0, kMaxTickDelayMs);
    tick_timer->arm(delay * 1'000, [this] {
      if (stopped) return;
      membership->tick(st.opt.clock());
      after_membership_call();
    });
  }

  void after_membership_call() {
    note_settled();
    if (ring_changed) rebuild_ring();
    update_capacity();
    arm_tick();
  }

  // Readiness (/healthz?ready): sticky once the first join has an outcome, so a later join round
  // (a new DNS address) does not flap it.
  void note_settled() {
    if (settled || !membership) return;
    const cluster::JoinState js = membership->join_state();
    if (js != cluster::JoinState::kJoined && js != cluster::JoinState::kNoSeedAnswered) return;
    settled = true;
    if (js == cluster::JoinState::kJoined) {
      spdlog::info("cluster: ready: joined, {} members known", membership->members().size());
    } else {
      spdlog::warn("cluster: ready alone: no seed answered (a first node, or its peers are down)");
    }
  }

  // ---- reach (cluster/reach.h) ----
  // Every member gets at least an empty batch each heartbeat period, so reach is seen both ways.
  void arm_reach() {
    reach_timer->arm(reach.tick_ms() * 1'000, [this] {
      if (stopped) return;
      const int64_t now = st.opt.clock();
      if (now - last_heartbeat_ms >= reach.heartbeat_ms(members_by_id.size())) {
        last_heartbeat_ms = now;
        for (const auto& [id, m] : members_by_id) {
          if (id == opt.node_id || !reach.counted(m, left, now)) continue;
          heartbeat.totals.clear();
          heartbeat.handoff = false;
          send_batch(id, heartbeat);
          if (fence_signals.contains(id)) send_fence_signal(id);
        }
      }
      if (prune_fences(now)) publish_fences();
      update_capacity();
      arm_reach();
    });
  }

  // Re-evaluates reach (cluster::Reach::update) and acts on what changed: while fewer members are
  // reachable than expected, this side allows limit x reachable / expected of every limit, and a
  // key whose owner and replicas are all out of reach is decided here by its rule's fallback, so
  // the sides of a split together stay within the limit; sync follows reach; a member that comes
  // back in reach gets a full sync pass (what each side counted meanwhile).
  void update_capacity() {
    const int64_t now = st.opt.clock();
    const cluster::Reach::Change c = reach.update(members_by_id, left, now);
    for (const auto& [id, since] : c.went_out) {
      spdlog::warn("cluster: member {} out of reach (nothing both ways for {} ms)", id,
                   reach.timeout_ms(members_by_id.size()));
      // Ask membership to probe it now rather than at its turn, up to a round of N - 1 probe
      // intervals away: a dead member is then declared dead within a few seconds whatever the
      // round's order (a 5-node cluster took up to 4.9 s in simulation, 6.0 s once in CI).
      if (membership) membership->probe_now(id, now);
    }
    if (!c.went_out.empty()) arm_tick();  // the probes' timeouts (no state changed yet)
    for (const auto& [id, since] : c.came_back) {
      reach_handoff_pending = true;  // back in reach: both sides' counts since the cut go over
      reach_returned.insert(id);
      spdlog::info("cluster: member {} in reach again after {} ms", id, now - since);
    }
    if (c.out_changed) {
      rebuild_sync_ring();
      std::lock_guard g(published_mu);
      published_out_of_reach =
          std::make_shared<const std::vector<std::pair<NodeId, int64_t>>>(reach.out_of_reach());
      view_version.fetch_add(1, std::memory_order_release);
    }
    if (!c.capacity_changed) return;
    const auto [reachable, expected] = reach.capacity();
    if (reachable == 1 && expected > 1) {
      spdlog::warn(
          "cluster: cut off: none of the {} other members in reach; every limit allows "
          "1/{} of itself here",
          expected - 1, expected);
    } else if (reachable < expected) {
      spdlog::warn(
          "cluster: {} of {} members in reach: every limit allows {}/{} of itself here until the "
          "others answer again (or have been dead for {} ms)",
          reachable, expected, reachable, expected, opt.forget_dead_after_ms);
    } else {
      spdlog::info("cluster: all {} members in reach: limits whole", expected);
    }
    st.engine->set_capacity(reachable, expected);
    std::lock_guard g(published_mu);
    published_expected = expected;
    view_version.fetch_add(1, std::memory_order_release);
  }

  void arm_sync() {
    sync_timer->arm(opt.sync_interval_ms * 1'000, [this] {
      if (stopped) return;
      sync_pass();
      arm_sync();
    });
  }

  // Every sync interval the changed pass runs to its end. A bulk pass (anti-entropy resend, or a
  // full pass after a ring change or members back in reach) runs beside it in slices of at most
  // kSyncSliceNs, each followed by a pause of what it sent at kBulkTotalsPerSec (DeltaSync's
  // header says why): a full pass over a million counters takes a few seconds so, and the changed
  // passes go on every sync interval meanwhile.
  static constexpr int64_t kSyncSliceNs = 4'000'000;
  static constexpr uint64_t kBulkTotalsPerSec = 500'000;

  void sync_pass() {
    const int64_t now = st.opt.clock();
    const cluster::HashRing* in_reach = reach.out_of_reach().empty() ? nullptr : &sync_ring;
    if (!delta->in_progress(true)) {
      // A full pass after a ring change at once; after members come back in reach at most once
      // per anti-entropy interval, and to them alone (the others were in reach all along, and
      // have what this node sent).
      const bool reach_due =
          reach_handoff_pending && now - last_reach_handoff_ms >= opt.anti_entropy_interval_ms;
      if (handoff_pending || reach_due || !restart_returned.empty()) {
        // Members back as a new life get theirs at once (note_boot), whatever else is due.
        std::vector<NodeId> only(restart_returned.begin(), restart_returned.end());
        restart_returned.clear();
        if (reach_due) only.insert(only.end(), reach_returned.begin(), reach_returned.end());
        if (handoff_pending) only.clear();  // everyone
        handoff_pending = false;
        if (reach_due) {
          reach_handoff_pending = false;
          reach_returned.clear();
          last_reach_handoff_ms = now;
        }
        ++handoffs;
        bulk_kind = 2;
        bulk_cpu_us = 0;
        delta->begin(ring, cluster::DeltaSync::Mode::kEverything, true, in_reach, std::move(only));
        bulk_slice();
      } else if (now - last_resend_ms >= opt.anti_entropy_interval_ms) {
        last_resend_ms = now;
        bulk_kind = 1;
        bulk_cpu_us = 0;
        delta->begin(ring, cluster::DeltaSync::Mode::kResend, false, in_reach);
        bulk_slice();
      }
    }
    const int64_t cpu0 = thread_cpu_us();
    delta->begin(ring, cluster::DeltaSync::Mode::kChanged, false, in_reach, {}, now);
    delta->resume(
        false, [this](NodeId to, cluster::SyncBatch& b) { send_batch(to, b); },
        std::numeric_limits<int64_t>::max());
    note_pass_cpu(0, static_cast<uint64_t>(std::max<int64_t>(0, thread_cpu_us() - cpu0)));
  }

  // Runs the bulk pass under way for up to `budget_ns`, then pauses (slice_timer), or to its end.
  void bulk_slice(int64_t budget_ns = kSyncSliceNs) {
    if (!delta->in_progress(true)) return;  // finished by finish_bulk_pass() meanwhile
    const int64_t cpu0 = thread_cpu_us();
    const uint64_t totals0 = delta->stats().totals;
    const bool done = delta->resume(
        true, [this](NodeId to, cluster::SyncBatch& b) { send_batch(to, b); }, budget_ns);
    bulk_cpu_us += static_cast<uint64_t>(std::max<int64_t>(0, thread_cpu_us() - cpu0));
    if (done) {
      note_pass_cpu(bulk_kind, bulk_cpu_us);
      return;
    }
    ++sync_slices_deferred;
    const uint64_t sent = delta->stats().totals - totals0;
    slice_timer->arm(static_cast<int64_t>(sent * 1'000'000 / kBulkTotalsPerSec), [this] {
      if (!stopped) bulk_slice();
    });
  }
  void finish_bulk_pass() {
    slice_timer->cancel();
    bulk_slice(std::numeric_limits<int64_t>::max());
  }

  void note_pass_cpu(size_t kind, uint64_t cpu) {
    sync_cpu_us[kind] += cpu;
    ++sync_kind_passes[kind];
    if (kind == 0) {
      sync_cpu_us_max_changed = std::max(sync_cpu_us_max_changed, cpu);
      size_t b = 0;
      while (b + 1 < sync_cpu_us_buckets.size() && cpu >= (uint64_t{1} << b))
        ++b;
      ++sync_cpu_us_buckets[b];
    }
  }
  static int64_t thread_cpu_us() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000 + ts.tv_nsec / 1'000;
  }

  // Sync follows reach: a counter's totals also go to the first of its holders in rendezvous
  // order among the members in reach (the ring without those out of reach), so the nodes on each
  // side of a cut keep exchanging the counts of every key, also of keys whose owner and replicas
  // are all on the other side (gossip decides from them; docs/architecture.md, "Reach"). They
  // still go to the ring's holders too: a member wrongly believed out of reach for a moment (a
  // slow node) never misses counts because of it.
  void rebuild_sync_ring() {
    sync_ring = ring;
    for (const auto& [id, since] : reach.out_of_reach())
      sync_ring.remove(id);
  }

  // ---- ring ----
  void on_member_change(const Member& m) {
    const auto it = members_by_id.find(m.id);
    const bool was_in = it != members_by_id.end() && in_ring(it->second);
    if (it == members_by_id.end() || it->second.state != m.state) {
      if (m.id != opt.node_id) {
        spdlog::info("cluster: member {} ({}, {}:{}) is {} (incarnation {})", m.name, m.id, m.host,
                     m.peer_port, cluster::to_string(m.state), m.incarnation);
      }
    }
    const bool was_live = it != members_by_id.end() && (it->second.state == MemberState::kAlive ||
                                                        it->second.state == MemberState::kSuspect);
    reach.state_changed(m.id, m.state, st.opt.clock());
    if (m.state == MemberState::kAlive && !was_live) reach.met(m.id, st.opt.clock());
    members_by_id[m.id] = m;
    if (was_in != in_ring(m)) ring_changed = true;
    publish_members();
    if (m.state == MemberState::kDead || m.state == MemberState::kLeft) {
      // A later life of this node starts a new boot; the codec accepts it without our window.
      codec->replay_guard().forget(m.id);
      boots.erase(m.id);
    }
  }

  void publish_members() {
    auto v = std::make_shared<std::vector<Member>>();
    for (const auto& [id, m] : members_by_id)
      v->push_back(m);
    std::lock_guard g(published_mu);
    published_members = std::move(v);
    view_version.fetch_add(1, std::memory_order_release);
  }

  void rebuild_ring() {
    ring_changed = false;
    cluster::HashRing next(opt.replicas);
    for (const auto& [id, m] : members_by_id) {
      if (in_ring(m) && !(left && id == opt.node_id)) next.add(id, m.name);
    }
    // Joining (see View): the first time this node meets the others, unless it has served alone
    // for a while (then it holds counts of its own), and again for each member learned while
    // still joining, its keys stay with their previous owners for three sync intervals: long
    // enough for their counts to reach it.
    const int64_t now = st.opt.clock();
    const int64_t hold = 3 * opt.sync_interval_ms;
    std::shared_ptr<const cluster::HashRing> without_self;
    if (next.size() > 1 && next.contains(opt.node_id)) {
      if (!met_others) {
        met_others = true;
        if (now - started_ms <= kJoinWithinMs) fresh_until_ms = now + hold;
      } else if (now < fresh_until_ms) {
        fresh_until_ms = now + hold;  // members learned one by one while joining
      }
      if (now < fresh_until_ms) {
        auto w = std::make_shared<cluster::HashRing>(next);
        w->remove(opt.node_id);
        without_self = std::move(w);
      }
    }
    ring = next;
    rebuild_sync_ring();
    handoff_pending = true;  // counters move: a full pass to the new owners and replicas
    {
      std::lock_guard g(published_mu);
      published_ring = std::make_shared<const cluster::HashRing>(ring);
      published_without_self = std::move(without_self);
      published_fresh_until_ms = fresh_until_ms;
      view_version.fetch_add(1, std::memory_order_release);
    }
    spdlog::info("cluster: ring now has {} members", ring.size());
  }

  asio::io_context& io;
  NodeState& st;
  ClusterOptions opt;
  asio::ip::address listen_addr;
  uint16_t listen_port = 0;
  std::string advertise;
  uint64_t boot_id = 0;
  std::unique_ptr<PeerIo> net;  // the peer socket and the timers (peer_io.h)
  std::unique_ptr<PeerTimer> tick_timer;
  std::unique_ptr<PeerTimer> sync_timer;
  std::unique_ptr<PeerTimer> reach_timer;
  std::unique_ptr<PeerTimer> slice_timer;  // the pause between two slices of a bulk pass
  std::vector<uint8_t> out;
  cluster::PeerMessage msg;
  std::unique_ptr<cluster::PeerCodec> codec;
  std::unique_ptr<cluster::Membership> membership;
  std::unique_ptr<cluster::DeltaSync> delta;
  std::unique_ptr<OverrideSync> overrides;  // created by start()
  std::map<NodeId, Member> members_by_id;   // as membership reported them (control thread)
  cluster::HashRing ring{2};
  cluster::HashRing sync_ring{2};  // the ring without the members out of reach (rebuild_sync_ring)
  bool ring_changed = false;
  bool handoff_pending = false;        // ring changed: a full pass next
  bool reach_handoff_pending = false;  // members back in reach: a full pass when due (sync_pass)
  std::set<NodeId> reach_returned;     // ... to these members
  size_t bulk_kind = 1;                // the bulk pass under way (sync_cpu_us's index)
  uint64_t bulk_cpu_us = 0;            // its CPU so far
  uint64_t sync_slices_deferred = 0;   // slices bulk passes left for later
  int64_t last_reach_handoff_ms = INT64_MIN / 2;
  // Joining (View::joining): a node that served alone for longer than this before it met the
  // others is not joining them: it holds counts of its own.
  static constexpr int64_t kJoinWithinMs = 2'000;
  int64_t started_ms = 0;
  bool met_others = false;
  int64_t fresh_until_ms = 0;  // control thread
  bool left = false;
  bool stopped = false;
  // False once this is destroyed: work posted to `io` (found DNS seeds) checks it first, since
  // the io_context may run it after this ClusterNode is gone.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  ~Impl() override { *alive = false; }
  bool settled = false;  // see note_settled()
  int64_t last_resend_ms = 0;
  // Statistics (control thread writes; the admin thread reads under published_mu via status()).
  std::map<std::string, uint64_t> dropped;
  std::map<NodeId, int64_t> synced;          // our clock, last non-empty sync batch
  std::map<NodeId, int64_t> reconnected_at;  // last ping of a member believed dead, heard again
  // (sender, release) pairs outside the compatibility window already logged: once each.
  std::set<std::pair<NodeId, uint16_t>> release_warned;
  std::set<NodeId> clock_warned;                 // members whose clock check_clock() said is off
  std::unordered_map<NodeId, Release> releases;  // each member's, from its last datagram
  cluster::Reach reach;
  int64_t last_heartbeat_ms = 0;
  cluster::SyncBatch heartbeat;
  // Fenced restarts (note_boot and after; control thread).
  std::map<NodeId, uint64_t> boots;     // the newest boot id heard from each member
  std::map<NodeId, int64_t> restarted;  // member -> when its new life was first heard
  std::set<NodeId> restart_returned;    // ... and due a full pass (sync_pass)
  std::map<NodeId, std::pair<int64_t, int>> fence_signals;  // (old life's send time, left)
  cluster::SyncBatch fence_signal;
  int64_t self_fence_until_ms = INT64_MIN;  // fence_self
  uint64_t member_restarts = 0;
  uint64_t datagrams_in = 0, datagrams_out = 0, send_errors = 0, sync_totals_in = 0;
  uint64_t bytes_in = 0, bytes_out = 0;  // peer UDP payloads, dropped ones included
  uint64_t handoffs = 0;
  std::array<uint64_t, 3> sync_cpu_us{}, sync_kind_passes{};  // ClusterStatus has the meaning
  uint64_t sync_cpu_us_max_changed = 0;
  std::array<uint64_t, ClusterStatus::kSyncCpuBuckets> sync_cpu_us_buckets{};

  // Seeds: the "host:port" ones resolved at start, and what the dns: and dns+srv: ones resolve to
  // (the watcher's thread finds them; they are joined here, on the control thread).
  std::vector<cluster::Endpoint> static_seeds;
  std::unique_ptr<DnsSeedWatcher> dns_seeds;

  mutable std::mutex published_mu;  // guards published_ring and published_members
  std::shared_ptr<const cluster::HashRing> published_ring;
  std::shared_ptr<const std::vector<Member>> published_members =
      std::make_shared<const std::vector<Member>>();
  std::atomic<uint64_t> view_version{1};
  std::shared_ptr<const cluster::HashRing> published_without_self;  // guarded by published_mu
  int64_t published_fresh_until_ms = 0;                             // guarded by published_mu
  uint32_t published_expected = 1;                                  // guarded by published_mu
  // guarded by published_mu
  std::shared_ptr<const std::vector<std::pair<NodeId, int64_t>>> published_out_of_reach =
      std::make_shared<const std::vector<std::pair<NodeId, int64_t>>>();
  // guarded by published_mu (publish_fences)
  std::shared_ptr<const std::vector<std::pair<NodeId, int64_t>>> published_restarted;
  int64_t published_self_fence_since_ms = INT64_MIN;
  int64_t published_self_fence_until_ms = INT64_MIN;
};

ClusterNode::ClusterNode(asio::io_context& control, NodeState& state,
                         std::unique_ptr<PeerIo> peer_io)
    : impl_(std::make_unique<Impl>(control, state, std::move(peer_io))) {}

ClusterNode::~ClusterNode() = default;

void ClusterNode::start(uint16_t check_port, uint16_t admin_port) {
  Impl& c = *impl_;
  c.started_ms = c.st.opt.clock();
  try {
    c.listen_port = c.net->open(c.listen_addr.to_string(), c.listen_port);
  } catch (const std::exception& e) {
    throw std::runtime_error("cluster.listen " + c.opt.listen + ": " + e.what());
  }

  Member self;
  self.id = c.opt.node_id;
  self.name = c.opt.name;
  self.host = c.advertise;
  self.peer_port = c.listen_port;
  self.check_port = check_port;
  self.admin_port = admin_port;
  cluster::MembershipOptions mo;
  mo.probe_interval_ms = c.opt.probe_interval_ms;
  mo.probe_timeout_ms = std::max<int64_t>(1, c.opt.probe_interval_ms / 2);
  mo.nack_timeout_ms = std::max<int64_t>(1, c.opt.probe_interval_ms * 2 / 5);
  c.membership = std::make_unique<cluster::Membership>(self, mo, c, c.boot_id ^ c.opt.node_id);
  c.membership->on_change([&c](const Member& m) { c.on_member_change(m); });
  c.members_by_id[self.id] = c.membership->self();
  c.rebuild_ring();
  c.handoff_pending = false;

  std::vector<DnsSeed> dns_names;
  asio::ip::udp::resolver resolver(c.io);
  for (const std::string& s : c.opt.seeds) {
    DnsSeed seed = classify_seed(s);
    if (seed.kind != DnsSeed::Kind::kAddress) {
      dns_names.push_back(std::move(seed));
      continue;
    }
    const HostPort hp = split_host_port(s).value();  // checked by the config (check_seed)
    boost::system::error_code rec;
    const auto results = resolver.resolve(hp.host, std::to_string(hp.port), rec);
    if (rec) {
      spdlog::warn("cluster: seed {} does not resolve: {}", s, rec.message());
      continue;
    }
    for (const auto& r : results) {
      c.static_seeds.push_back({r.endpoint().address().to_string(), r.endpoint().port()});
    }
  }
  const std::vector<cluster::Endpoint>& seeds = c.static_seeds;
  c.overrides = std::make_unique<OverrideSync>(
      c.io, c.st, c.codec->limits(),
      [&c](NodeId to, const cluster::OverrideSyncMessage& m) { return c.send_overrides(to, m); },
      [&c] { return c.live_others(); }, c.dropped, c.boot_id ^ (uint64_t{c.opt.node_id} << 48),
      c.net->timer());
  c.overrides->start();
  c.receive();
  const int64_t now = c.st.opt.clock();
  c.last_resend_ms = now;
  if (!seeds.empty()) c.membership->join(seeds, now);
  if (seeds.empty() && dns_names.empty()) c.settled = true;  // no seeds: a cluster of one
  c.after_membership_call();
  c.arm_sync();
  c.arm_reach();
  spdlog::info("cluster: node {} ({}) on {}:{}, {} seed addresses, {} replicas, sync every {} ms",
               c.opt.name, c.opt.node_id, c.advertise, c.listen_port, seeds.size(), c.opt.replicas,
               c.opt.sync_interval_ms);
  if (!dns_names.empty()) {
    DnsSeedWatcher::Options wo;
    wo.seeds = std::move(dns_names);
    wo.peer_port = c.listen_port;
    wo.refresh_ms = c.opt.seed_refresh_ms;
    if (!c.opt.dns_server.empty()) wo.server = parse_dns_server(c.opt.dns_server);
    spdlog::info("cluster: {} DNS seed names, resolved every {} ms{}{}", wo.seeds.size(),
                 wo.refresh_ms, c.opt.dns_server.empty() ? "" : " through ", c.opt.dns_server);
    // Found addresses are contacted like seeds: a join round to every seed, old and new (a member
    // answers a kJoin from a node it knows with its member list; nothing else changes).
    c.dns_seeds =
        std::make_unique<DnsSeedWatcher>(std::move(wo), [&c](std::vector<cluster::Endpoint> found) {
          asio::post(c.io, [&c, alive = c.alive, found = std::move(found)] {
            if (!*alive || c.stopped || c.left || !c.membership) return;
            std::vector<cluster::Endpoint> all = c.static_seeds;
            all.insert(all.end(), found.begin(), found.end());
            c.membership->join(all, c.st.opt.clock());
            c.after_membership_call();
          });
        });
    c.dns_seeds->start();
  }
}

void ClusterNode::leave() {
  Impl& c = *impl_;
  if (c.left || !c.membership) return;
  c.left = true;
  const int64_t now = c.st.opt.clock();
  c.membership->leave(now);
  // Hand every counter to its owners without this node, now (in one go: the node is leaving).
  c.rebuild_ring();
  c.finish_bulk_pass();
  c.sync_pass();  // the full pass (the ring changed) and a changed pass
  c.finish_bulk_pass();
  spdlog::info("cluster: left; counters handed to the remaining {} members", c.ring.size());
}

void ClusterNode::stop() {
  Impl& c = *impl_;
  if (c.stopped) return;
  c.stopped = true;
  if (c.dns_seeds) c.dns_seeds->stop();  // waits for a query in flight (a few seconds at most)
  if (c.overrides) c.overrides->stop();
  c.tick_timer->cancel();
  c.sync_timer->cancel();
  c.slice_timer->cancel();
  c.reach_timer->cancel();
  c.net->close();
}

uint16_t ClusterNode::peer_port() const {
  return impl_->listen_port;
}

uint64_t ClusterNode::view_version() const {
  return impl_->view_version.load(std::memory_order_acquire);
}

cluster::NodeId ClusterNode::self() const {
  return impl_->opt.node_id;
}

int64_t ClusterNode::forward_timeout_ms() const {
  return impl_->opt.forward_timeout_ms;
}

ClusterNode::View ClusterNode::view() const {
  std::lock_guard g(impl_->published_mu);
  return {impl_->published_ring,
          impl_->published_members,
          impl_->published_without_self,
          impl_->published_fresh_until_ms,
          impl_->published_expected,
          impl_->published_out_of_reach,
          impl_->published_restarted,
          impl_->published_self_fence_since_ms,
          impl_->published_self_fence_until_ms};
}

std::optional<cluster::NodeId> ClusterNode::View::previous_owner(uint64_t routing_key,
                                                                 int64_t now_ms) const {
  if (!joining(now_ms)) return std::nullopt;
  return ring_without_self->owner(routing_key);
}

ClusterStatus ClusterNode::status() const {
  const Impl& c = *impl_;
  ClusterStatus s;
  s.enabled = true;
  s.self = c.opt.node_id;
  s.name = c.opt.name;
  s.replicas = c.opt.replicas;
  s.reachable = c.reach.capacity().first;
  s.expected = c.reach.capacity().second;
  if (!c.membership) return s;
  s.join_state = std::string(cluster::to_string(c.membership->join_state()));
  s.membership = c.membership->stats();
  if (c.left) {
    s.not_ready = "left the cluster";
  } else if (!c.settled) {
    s.not_ready = c.membership->join_state() == cluster::JoinState::kNotStarted
                      ? "no DNS seed has resolved yet"
                      : "joining: no seed has answered yet";
  }
  const int64_t now = c.st.opt.clock();
  std::shared_ptr<const cluster::HashRing> ring;
  {
    std::lock_guard g(c.published_mu);
    ring = c.published_ring;
  }
  const auto shares = ring->shares();
  for (const Member& m : c.membership->members()) {
    MemberStatus ms;
    ms.member = m;
    for (const auto& [id, share] : shares) {
      if (id == m.id) ms.share = share;
    }
    if (const int64_t* h = c.reach.last_heard(m.id)) ms.last_heard_ms = now - *h;
    if (const int64_t* o = c.reach.clock_offset(m.id)) ms.clock_offset_ms = *o;
    if (auto y = c.synced.find(m.id); y != c.synced.end()) ms.last_sync_ms = now - y->second;
    s.members.push_back(std::move(ms));
  }
  for (const auto& [reason, n] : c.dropped)
    s.dropped.emplace_back(reason, n);
  s.datagrams_in = c.datagrams_in;
  s.datagrams_out = c.datagrams_out;
  s.bytes_in = c.bytes_in;
  s.bytes_out = c.bytes_out;
  s.send_errors = c.send_errors;
  s.sync_cpu_us = c.sync_cpu_us;
  s.sync_kind_passes = c.sync_kind_passes;
  s.sync_cpu_us_max_changed = c.sync_cpu_us_max_changed;
  s.sync_slices_deferred = c.sync_slices_deferred;
  s.sync_cpu_us_buckets = c.sync_cpu_us_buckets;
  s.sync_passes = c.delta->stats().passes;
  s.sync_totals_out = c.delta->stats().totals;
  s.sync_batches_out = c.delta->stats().batches;
  s.sync_list_skipped = c.delta->stats().list_skipped;
  s.sync_totals_in = c.sync_totals_in;
  s.handoffs = c.handoffs;
  s.member_restarts = c.member_restarts;
  s.self_fenced = c.self_fence_until_ms != INT64_MIN && now < c.self_fence_until_ms;
  if (c.overrides) s.overrides = c.overrides->stats();
  return s;
}

}  // namespace sluice::node
