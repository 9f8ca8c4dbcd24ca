#include "client/core.h"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace sluice::client_detail {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

// Room for the answer's own fields (header, id, code, list pointers) before per-check room.
constexpr size_t kAnswerBaseBytes = 64;
// Attempts in a row that a node leaves unanswered before it is skipped for its backoff.
constexpr uint32_t kSilentAttemptsBeforeDown = 2;
// One receive buffer per node: the largest datagram, or a good bite of a TCP stream.
constexpr size_t kRxBytes = 65'536;

bool is_icmp_error(const error_code& ec) {
  return ec == asio::error::connection_refused || ec == asio::error::host_unreachable ||
         ec == asio::error::network_unreachable || ec == asio::error::connection_reset;
}

}  // namespace

StatusOr<HostPort> parse_node_address(std::string_view text) {
  StatusOr<HostPort> hp = split_host_port(text);
  if (!hp.ok()) {  // the client's own words (docs/client.md)
    if (hp.message().starts_with("bad port")) {
      return Status::InvalidArgument("port must be 1..65535");
    }
    return Status::InvalidArgument(text.starts_with('[') ? "expected [ipv6-address]:port"
                                                         : "expected host:port");
  }
  if (!hp->bracketed && hp->host.find(':') != std::string::npos) {
    return Status::InvalidArgument("an IPv6 address needs brackets: [addr]:port");
  }
  if (hp->host.empty()) return Status::InvalidArgument("empty host");
  if (hp->port == 0) return Status::InvalidArgument("port must be 1..65535");
  return hp;
}

void OwnedCheck::assign(const wire::Check& c) {
  text.clear();
  lengths.clear();
  // A release has no cost (the node ignores hits): 0, so that no cost check can refuse it.
  hits = c.is_release ? 0 : c.hits;
  is_release = c.is_release;
  release = c.release;
  invalid = wire::Code::kOk;
  if (c.is_release && c.release == 0) {  // no lease has id 0: nothing to give back
    invalid = wire::Code::kLeaseUnknown;
    return;
  }
  if (c.domain.empty()) {
    invalid = wire::Code::kEmptyDomain;
    return;
  }
  if (c.entries.size() > wire::kMaxEntries) {
    invalid = wire::Code::kTooManyEntries;
    return;
  }
  if (hits < 0) {
    invalid = wire::Code::kNegativeHits;
    return;
  }
  size_t total = c.domain.size();
  for (const wire::Entry& e : c.entries)
    total += e.key.size() + e.value.size();
  if (total > wire::kMaxFrameBytes) {  // also keeps every length within uint32_t
    invalid = wire::Code::kTooLarge;
    return;
  }
  text.append(c.domain);
  lengths.push_back(static_cast<uint32_t>(c.domain.size()));
  for (const wire::Entry& e : c.entries) {
    text.append(e.key);
    text.append(e.value);
    lengths.push_back(static_cast<uint32_t>(e.key.size()));
    lengths.push_back(static_cast<uint32_t>(e.value.size()));
  }
}

// ---- caller side ------------------------------------------------------------------------------

Core::Core(ClientOptions options, std::vector<NodeAddress> nodes)
    : options_(std::move(options)),
      max_request_bytes_(options_.transport == Transport::kUdp ? wire::kMaxDatagramBytes
                                                               : wire::kMaxFrameBytes),
      sweep_timer_(io_),
      batch_timer_(io_) {
  // A random first id, so that answers meant for an earlier Client (same port after a restart)
  // do not match.
  std::random_device rd;
  next_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  nodes_.reserve(nodes.size());
  for (NodeAddress& a : nodes) {
    Node n;
    n.addr = std::move(a);
    n.backoff = options_.backoff_min;
    n.rx.resize(kRxBytes);
    nodes_.push_back(std::move(n));
  }
  by_node_.resize(nodes_.size());
  work_.emplace(io_.get_executor());
  thread_ = std::thread([this] { run(); });
}

Core::~Core() {
  if (on_io_thread()) {
    std::fputs("sluice::Client destroyed from one of its own callbacks\n", stderr);
    std::abort();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  asio::post(io_, [this] { shutdown(); });
  work_.reset();
  thread_.join();
}

Result Core::fail_result(Outcome outcome, wire::Code code) const {
  Result r;
  r.outcome = outcome;
  r.code = code;
  r.allowed = outcome != Outcome::kInvalid && options_.fail_mode == FailMode::kOpen;
  return r;
}

ClientStats Core::stats() const {
  ClientStats s;
  s.checks = stats_.checks.load(std::memory_order_relaxed);
  s.requests = stats_.requests.load(std::memory_order_relaxed);
  s.retries = stats_.retries.load(std::memory_order_relaxed);
  s.answers = stats_.answers.load(std::memory_order_relaxed);
  s.dropped_answers = stats_.dropped_answers.load(std::memory_order_relaxed);
  s.unavailable = stats_.unavailable.load(std::memory_order_relaxed);
  s.link_failures = stats_.link_failures.load(std::memory_order_relaxed);
  s.callback_exceptions = stats_.callback_exceptions.load(std::memory_order_relaxed);
  return s;
}

void Core::enqueue_locked(Submission& into, Clock::time_point deadline, Completion&& done) {
  into.deadline = deadline;
  into.done = std::move(done);
}

void Core::after_enqueue_locked(bool& post_notify, bool& post_full) {
  stats_.checks.fetch_add(1, std::memory_order_relaxed);
  if (!notified_) {
    notified_ = true;
    post_notify = true;
  }
  // With a batch window, a full request need not wait for it.
  if (options_.batch_window.count() > 0 && queued_ % options_.max_checks_per_request == 0) {
    post_full = true;
  }
}

void Core::post_after_enqueue(bool post_notify, bool post_full) {
  if (post_notify) asio::post(io_, [this] { on_submitted(); });
  if (post_full) asio::post(io_, [this] { flush(); });
}

void Core::submit(const wire::Check& check, Clock::time_point deadline, Completion done) {
  bool notify = false;
  bool full = false;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closing_) {
      queued = true;
      if (queued_ == queue_.size()) queue_.emplace_back();
      Submission& s = queue_[queued_++];
      s.check.assign(check);
      enqueue_locked(s, deadline, std::move(done));
      after_enqueue_locked(notify, full);
    }
  }
  if (!queued) {  // the Client is being destroyed
    deliver(done, fail_result(Outcome::kUnavailable));
    return;
  }
  post_after_enqueue(notify, full);
}

void Core::submit(OwnedCheck&& check, Clock::time_point deadline, Completion done) {
  bool notify = false;
  bool full = false;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closing_) {
      queued = true;
      if (queued_ == queue_.size()) queue_.emplace_back();
      Submission& s = queue_[queued_++];
      std::swap(s.check, check);
      enqueue_locked(s, deadline, std::move(done));
      after_enqueue_locked(notify, full);
    }
  }
  if (!queued) {
    deliver(done, fail_result(Outcome::kUnavailable));
    return;
  }
  post_after_enqueue(notify, full);
}

void Core::submit_sync(std::span<const wire::Check> checks, Clock::time_point deadline,
                       const std::shared_ptr<SyncWaiter>& waiter) {
  bool notify = false;
  bool full = false;
  bool closing = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing = closing_;
    for (size_t i = 0; i < checks.size() && !closing; ++i) {
      if (queued_ == queue_.size()) queue_.emplace_back();
      Submission& s = queue_[queued_++];
      s.check.assign(checks[i]);
      enqueue_locked(s, deadline, Completion{{}, waiter, static_cast<uint32_t>(i)});
      after_enqueue_locked(notify, full);
    }
  }
  if (closing) {
    for (size_t i = 0; i < checks.size(); ++i) {
      Completion c{{}, waiter, static_cast<uint32_t>(i)};
      deliver(c, fail_result(Outcome::kUnavailable));
    }
    return;
  }
  post_after_enqueue(notify, full);
}

// Any thread: the I/O thread for queued checks, a caller for checks refused while closing.
void Core::deliver(Completion& done, Result&& r) {
  if (r.outcome == Outcome::kUnavailable) {
    stats_.unavailable.fetch_add(1, std::memory_order_relaxed);
  }
  if (done.waiter) {
    SyncWaiter& w = *done.waiter;
    std::lock_guard<std::mutex> lock(w.mu);
    if (done.index < w.done.size() && !w.done[done.index]) {
      w.results[done.index] = std::move(r);
      w.done[done.index] = 1;
      if (--w.outstanding == 0) w.cv.notify_all();
    }
  } else if (done.callback) {
    try {
      done.callback(std::move(r));
    } catch (...) {
      // Nothing sensible can be done with it here, and it must not take the I/O thread down.
      stats_.callback_exceptions.fetch_add(1, std::memory_order_relaxed);
    }
  }
  done.callback = nullptr;
  done.waiter.reset();
}

// ---- I/O thread -------------------------------------------------------------------------------

void Core::run() {
  for (;;) {
    try {
      io_.run();
      return;
    } catch (...) {
      // Only allocation failures can get here (callbacks are guarded); keep serving.
    }
  }
}

void Core::on_submitted() {
  if (closed_) return;
  if (options_.batch_window.count() <= 0) {
    flush();
    return;
  }
  if (batch_armed_) return;
  batch_armed_ = true;
  batch_timer_.expires_after(options_.batch_window);
  batch_timer_.async_wait([this](const error_code& ec) {
    batch_armed_ = false;
    if (ec == asio::error::operation_aborted || closed_) return;
    flush();
  });
}

void Core::flush() {
  if (closed_) return;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(queue_, taking_);
    n = queued_;
    queued_ = 0;
    notified_ = false;
  }
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    Submission& s = taking_[i];
    if (s.check.invalid != wire::Code::kOk) {
      deliver(s.done, fail_result(Outcome::kInvalid, s.check.invalid));
      continue;
    }
    if (s.deadline <= now) {  // spent its whole budget in the batch window
      deliver(s.done, fail_result(Outcome::kUnavailable));
      continue;
    }
    uint32_t index = 0;
    if (!free_slots_.empty()) {
      index = free_slots_.back();
      free_slots_.pop_back();
    } else {
      index = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    Slot& slot = slots_[index];
    slot.live = true;
    std::swap(slot.check, s.check);  // the slot's old buffers go back to the queue for reuse
    slot.done = std::move(s.done);
    s.done = Completion{};
    slot.deadline = s.deadline;
    slot.latest_request = 0;
    slot.attempts = 0;
    slot.last_node = nodes_.size() - 1;  // so that the first attempt goes to the first node up
    to_send_.push_back(SlotRef{index, slot.gen});
  }
  pump();
}

Core::Slot* Core::live_slot(SlotRef ref) {
  Slot& s = slots_[ref.index];
  return s.live && s.gen == ref.gen ? &s : nullptr;
}

void Core::complete(SlotRef ref, Result&& r) {
  Slot& s = slots_[ref.index];
  if (!s.live || s.gen != ref.gen) return;
  s.live = false;
  ++s.gen;
  free_slots_.push_back(ref.index);
  deliver(s.done, std::move(r));
}

size_t Core::pick_node(size_t after, Clock::time_point now) const {
  const size_t n = nodes_.size();
  for (size_t k = 1; k <= n; ++k) {
    const size_t i = (after + k) % n;
    if (nodes_[i].down_until <= now) return i;
  }
  return (after + 1) % n;  // every node is down: try the next one anyway
}

void Core::pump() {
  // Each pass gives every waiting check one more attempt or ends it, and attempts are capped, so
  // this ends even when every send fails at once.
  while (!to_send_.empty() && !closed_) {
    sending_.clear();
    std::swap(sending_, to_send_);
    const Clock::time_point now = Clock::now();
    for (std::vector<SlotRef>& group : by_node_)
      group.clear();
    for (const SlotRef ref : sending_) {
      Slot* s = live_slot(ref);
      if (s == nullptr) continue;
      if (s->deadline <= now || s->attempts >= options_.attempts) {
        complete(ref, fail_result(Outcome::kUnavailable));
        continue;
      }
      by_node_[pick_node(s->last_node, now)].push_back(ref);
    }
    for (size_t node = 0; node < nodes_.size(); ++node) {
      const std::vector<SlotRef>& group = by_node_[node];
      for (size_t at = 0; at < group.size(); at += options_.max_checks_per_request) {
        const size_t len = std::min<size_t>(options_.max_checks_per_request, group.size() - at);
        send_chunk(node, std::span<const SlotRef>(group).subspan(at, len));
      }
    }
  }
}

std::vector<Core::SlotRef> Core::take_refs_vector() {
  if (spare_refs_.empty()) return {};
  std::vector<SlotRef> v = std::move(spare_refs_.back());
  spare_refs_.pop_back();
  v.clear();
  return v;
}

uint64_t Core::next_request_id() {
  uint64_t id = next_id_++;
  if (id == 0) id = next_id_++;  // 0 is what a decoder reports for an unreadable id
  return id;
}

void Core::send_chunk(size_t node, std::span<const SlotRef> refs) {
  // Views into the slots' own buffers; entries first, so that check spans into them stay valid.
  entry_views_.clear();
  check_views_.clear();
  for (const SlotRef ref : refs) {
    const OwnedCheck& c = slots_[ref.index].check;
    size_t pos = c.lengths[0];
    for (size_t e = 0; e < c.num_entries(); ++e) {
      const uint32_t klen = c.lengths[1 + 2 * e];
      const uint32_t vlen = c.lengths[2 + 2 * e];
      entry_views_.push_back(wire::Entry{std::string_view(c.text).substr(pos, klen),
                                         std::string_view(c.text).substr(pos + klen, vlen)});
      pos += size_t{klen} + vlen;
    }
  }
  size_t first_entry = 0;
  for (const SlotRef ref : refs) {
    const OwnedCheck& c = slots_[ref.index].check;
    wire::Check& view = check_views_.emplace_back(wire::Check{
        c.domain(),
        std::span<const wire::Entry>(entry_views_).subspan(first_entry, c.num_entries()), c.hits});
    view.is_release = c.is_release;
    view.release = c.release;
    first_entry += c.num_entries();
  }
  size_t pad_to = 0;
  if (options_.transport == Transport::kUdp && options_.udp_answer_room_per_check > 0) {
    pad_to = std::min(max_request_bytes_,
                      kAnswerBaseBytes + size_t{options_.udp_answer_room_per_check} * refs.size());
  }
  const uint64_t id = next_request_id();
  wire::encode_request(id, check_views_, pad_to, encoded_);
  if (encoded_.size() > max_request_bytes_) {
    if (refs.size() == 1) {
      complete(refs[0], fail_result(Outcome::kInvalid, wire::Code::kTooLarge));
      return;
    }
    const size_t half = refs.size() / 2;
    send_chunk(node, refs.first(half));
    send_chunk(node, refs.subspan(half));
    return;
  }

  const Clock::time_point now = Clock::now();
  auto [it, inserted] = requests_.try_emplace(id);
  Request& req = it->second;
  req.node = node;
  req.expired = false;
  req.slots = take_refs_vector();
  req.attempt_deadline = Clock::time_point::max();
  for (const SlotRef ref : refs) {
    Slot& s = slots_[ref.index];
    // This attempt gets an equal share of the time left to the attempts left.
    const Clock::duration share = (s.deadline - now) / (options_.attempts - s.attempts);
    req.attempt_deadline = std::min(req.attempt_deadline, now + share);
    if (s.attempts > 0) stats_.retries.fetch_add(1, std::memory_order_relaxed);
    ++s.attempts;
    s.latest_request = id;
    s.last_node = node;
    req.slots.push_back(ref);
  }
  stats_.requests.fetch_add(1, std::memory_order_relaxed);
  arm_sweep(req.attempt_deadline);
  transmit(node, id);
}

void Core::transmit(size_t node, uint64_t id) {
  Node& n = nodes_[node];
  if (options_.transport == Transport::kUdp) {
    if (!n.udp) {
      error_code ec;
      n.udp.emplace(io_);
      const asio::ip::udp::endpoint ep(n.addr.address, n.addr.port);
      n.udp->open(ep.protocol(), ec);
      if (!ec) n.udp->connect(ep, ec);
      if (!ec) n.udp->non_blocking(true, ec);
      if (ec) {
        n.udp.reset();
        fail_node(node);
        return;
      }
      udp_start_receive(node);
    }
    error_code ec;
    n.udp->send(asio::buffer(encoded_), 0, ec);
    // A full socket buffer loses the datagram the way the network would: the attempt times out.
    if (!ec || ec == asio::error::would_block || ec == asio::error::no_buffer_space) return;
    fail_node(node);  // an ICMP error from an earlier datagram, or no route
    return;
  }

  if (n.state == TcpState::kIdle && Clock::now() < n.down_until) {
    // In backoff: this attempt fails at once and the check moves on to its next attempt.
    auto it = requests_.find(id);
    if (it != requests_.end()) fail_request(it);
    return;
  }
  wire::append_frame(encoded_, n.out_pending);
  if (n.state == TcpState::kIdle) {
    tcp_connect(node);
  } else if (n.state == TcpState::kConnected) {
    tcp_start_write(node);
  }
}

void Core::tcp_connect(size_t node) {
  Node& n = nodes_[node];
  if (!n.tcp) n.tcp.emplace(io_);
  n.state = TcpState::kConnecting;
  const uint64_t gen = ++n.conn_gen;
  n.connect_deadline = Clock::now() + options_.connect_timeout;
  n.reader = wire::FrameReader(wire::kMaxFrameBytes);
  arm_sweep(n.connect_deadline);
  n.tcp->async_connect(asio::ip::tcp::endpoint(n.addr.address, n.addr.port),
                       [this, node, gen](const error_code& ec) {
                         Node& c = nodes_[node];
                         if (closed_ || gen != c.conn_gen) return;
                         if (ec) {
                           fail_node(node);
                           pump();
                           return;
                         }
                         c.state = TcpState::kConnected;
                         error_code ignored;
                         c.tcp->set_option(asio::ip::tcp::no_delay(true), ignored);
                         tcp_start_read(node);
                         tcp_start_write(node);
                       });
}

void Core::tcp_start_write(size_t node) {
  Node& n = nodes_[node];
  if (n.writing || n.out_pending.empty() || n.state != TcpState::kConnected) return;
  // Everything queued while the previous write was in flight goes out in one write.
  std::swap(n.out_pending, n.out_writing);
  n.out_pending.clear();
  n.writing = true;
  const uint64_t gen = n.conn_gen;
  asio::async_write(*n.tcp, asio::buffer(n.out_writing),
                    [this, node, gen](const error_code& ec, size_t /*bytes*/) {
                      Node& c = nodes_[node];
                      if (closed_ || gen != c.conn_gen) return;
                      c.writing = false;
                      if (ec) {
                        fail_node(node);
                        pump();
                        return;
                      }
                      tcp_start_write(node);
                    });
}

void Core::tcp_start_read(size_t node) {
  Node& n = nodes_[node];
  const uint64_t gen = n.conn_gen;
  n.tcp->async_read_some(asio::buffer(n.rx), [this, node, gen](const error_code& ec, size_t len) {
    Node& c = nodes_[node];
    if (closed_ || gen != c.conn_gen) return;
    if (ec) {  // end of stream included: its requests move on
      fail_node(node);
      pump();
      return;
    }
    c.reader.feed(std::span<const uint8_t>(c.rx.data(), len));
    while (auto frame = c.reader.next())
      on_answer(node, *frame);
    if (c.reader.failed()) {  // a length over the limit: the stream cannot be resynchronised
      stats_.dropped_answers.fetch_add(1, std::memory_order_relaxed);
      fail_node(node);
      pump();
      return;
    }
    tcp_start_read(node);
  });
}

void Core::udp_start_receive(size_t node) {
  Node& n = nodes_[node];
  n.udp->async_receive(asio::buffer(n.rx), [this, node](const error_code& ec, size_t len) {
    Node& c = nodes_[node];
    if (closed_ || ec == asio::error::operation_aborted || !c.udp) return;
    if (ec) {
      if (!is_icmp_error(ec)) c.udp.reset();  // unexpected: reopen on the next send
      fail_node(node);
      pump();
      if (c.udp && is_icmp_error(ec)) udp_start_receive(node);
      return;
    }
    on_answer(node, std::span<const uint8_t>(c.rx.data(), len));
    udp_start_receive(node);
  });
}

void Core::on_answer(size_t node, std::span<const uint8_t> bytes) {
  if (wire::decode_answer(bytes, answer_) != wire::Code::kOk) {
    stats_.dropped_answers.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto it = requests_.find(answer_.id);
  if (it == requests_.end() || it->second.node != node) {  // stale, forged or never ours
    stats_.dropped_answers.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Request& req = it->second;
  if (answer_.code == wire::Code::kOk && answer_.decisions.size() != req.slots.size()) {
    stats_.dropped_answers.fetch_add(1, std::memory_order_relaxed);  // not an answer to this
    return;
  }
  stats_.answers.fetch_add(1, std::memory_order_relaxed);
  node_answered(nodes_[node]);
  for (size_t i = 0; i < req.slots.size(); ++i) {
    if (live_slot(req.slots[i]) == nullptr) continue;  // answered already, or timed out
    if (answer_.code != wire::Code::kOk) {
      complete(req.slots[i], fail_result(Outcome::kRefused, answer_.code));
      continue;
    }
    wire::Decision& d = answer_.decisions[i];
    Result r;
    r.outcome = Outcome::kDecided;
    r.code = d.code;
    r.allowed = d.allowed;
    r.would_deny = d.would_deny;
    r.shadow = d.shadow;
    r.allowlisted = d.allowlisted;
    r.truncated = answer_.truncated;
    r.limits = std::move(d.limits);
    r.lease = d.lease;
    complete(req.slots[i], std::move(r));
  }
  spare_refs_.push_back(std::move(req.slots));
  requests_.erase(it);
}

void Core::node_answered(Node& n) {
  n.down_until = Clock::time_point{};
  n.backoff = options_.backoff_min;
  n.silent_attempts = 0;
}

void Core::node_down(Node& n, Clock::time_point now) {
  n.down_until = now + n.backoff;
  n.backoff = std::min<Clock::duration>(n.backoff * 2, options_.backoff_max);
  n.silent_attempts = 0;
}

Core::RequestMap::iterator Core::fail_request(RequestMap::iterator it) {
  const uint64_t id = it->first;
  Request& req = it->second;
  for (const SlotRef ref : req.slots) {
    Slot* s = live_slot(ref);
    if (s == nullptr || s->latest_request != id) continue;  // done, or already moved on
    if (s->attempts < options_.attempts) {
      to_send_.push_back(ref);
    } else {
      complete(ref, fail_result(Outcome::kUnavailable));
    }
  }
  spare_refs_.push_back(std::move(req.slots));
  return requests_.erase(it);
}

void Core::fail_node(size_t node) {
  Node& n = nodes_[node];
  stats_.link_failures.fetch_add(1, std::memory_order_relaxed);
  node_down(n, Clock::now());
  if (n.tcp) {
    error_code ignored;
    n.tcp->close(ignored);  // pending operations end with operation_aborted
    n.state = TcpState::kIdle;
    ++n.conn_gen;
    n.writing = false;
    n.out_pending.clear();
  }
  for (auto it = requests_.begin(); it != requests_.end();) {
    it = it->second.node == node ? fail_request(it) : std::next(it);
  }
}

void Core::arm_sweep(Clock::time_point at) {
  if (closed_ || at >= sweep_at_) return;
  sweep_at_ = at;
  sweep_timer_.expires_at(at);
  sweep_timer_.async_wait([this](const error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    sweep();
  });
}

void Core::sweep() {
  sweep_at_ = Clock::time_point::max();
  if (closed_) return;
  const Clock::time_point now = Clock::now();
  Clock::time_point next = Clock::time_point::max();

  for (size_t i = 0; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    if (n.state != TcpState::kConnecting) continue;
    if (n.connect_deadline <= now) {
      fail_node(i);
    } else {
      next = std::min(next, n.connect_deadline);
    }
  }

  for (auto it = requests_.begin(); it != requests_.end();) {
    Request& req = it->second;
    if (!req.expired && req.attempt_deadline <= now) {
      req.expired = true;  // stays matchable: a late answer still beats the next attempt's
      Node& n = nodes_[req.node];
      if (++n.silent_attempts >= kSilentAttemptsBeforeDown) node_down(n, now);
      for (const SlotRef ref : req.slots) {
        Slot* s = live_slot(ref);
        if (s != nullptr && s->latest_request == it->first && s->attempts < options_.attempts) {
          to_send_.push_back(ref);
        }
      }
    }
    const bool any_live = std::any_of(req.slots.begin(), req.slots.end(),
                                      [this](SlotRef ref) { return live_slot(ref) != nullptr; });
    if (!any_live) {
      spare_refs_.push_back(std::move(req.slots));
      it = requests_.erase(it);
      continue;
    }
    if (!req.expired) next = std::min(next, req.attempt_deadline);
    ++it;
  }

  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.live) continue;
    if (s.deadline <= now) {
      complete(SlotRef{i, s.gen}, fail_result(Outcome::kUnavailable));
    } else {
      next = std::min(next, s.deadline);
    }
  }

  pump();
  arm_sweep(next);
}

void Core::shutdown() {
  closed_ = true;
  error_code ignored;
  sweep_timer_.cancel(ignored);
  batch_timer_.cancel(ignored);
  for (Node& n : nodes_) {
    if (n.udp) n.udp->close(ignored);
    if (n.tcp) n.tcp->close(ignored);
  }
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);  // closing_ is set: nothing more gets queued
    std::swap(queue_, taking_);
    n = queued_;
    queued_ = 0;
  }
  for (size_t i = 0; i < n; ++i)
    deliver(taking_[i].done, fail_result(Outcome::kUnavailable));
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].live) complete(SlotRef{i, slots_[i].gen}, fail_result(Outcome::kUnavailable));
  }
  requests_.clear();
}

}  // namespace sluice::client_detail
