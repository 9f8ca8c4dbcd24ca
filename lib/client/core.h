// Private to lib/client: the I/O engine behind sluice::Client.
//
// Threads: callers only touch the submission queue (under `mu_`) and post to the io_context. All
// other state (slots, requests, nodes, sockets, timers) is owned by the one I/O thread and touched
// only from it, so it needs no lock.
//
// Life of a check: submit() copies it into the queue -> flush() moves it into a Slot (its
// callback and overall deadline) -> pump() sends it to a node inside a Request (an id, one
// datagram or frame, an attempt deadline) -> the answer with that id completes it. An attempt that
// times out or whose node fails puts the slot back into the send list for the next node; a slot
// whose deadline passes completes with the fail mode. A slot may sit in several requests (a
// timed-out attempt stays matchable until the check ends): the first answer wins, later ones find
// the slot's generation changed and are ignored.
#pragma once

#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/host_port.h"
#include "client/client.h"
#include "wire/protocol.h"

namespace sluice::client_detail {

using Clock = std::chrono::steady_clock;

// A node's "host:port" or "[v6]:port" (base/host_port.h), host not empty, port 1..65535, an IPv6
// address in brackets; no resolution.
StatusOr<HostPort> parse_node_address(std::string_view text);

// A resolved node address, usable for both transports.
struct NodeAddress {
  std::string name;  // as configured, for messages
  boost::asio::ip::address address;
  uint16_t port = 0;
};

// The caller's check copied into buffers the Client owns (their capacity is recycled).
struct OwnedCheck {
  std::string text;               // domain, then key and value of each entry, back to back
  std::vector<uint32_t> lengths;  // domain length, then key and value lengths
  int64_t hits = 1;
  bool is_release = false;  // the release of lease `release` (wire::Check::is_release)
  uint64_t release = 0;
  wire::Code invalid = wire::Code::kOk;  // why the check will not be sent

  void assign(const wire::Check& c);
  std::string_view domain() const { return {text.data(), lengths.empty() ? 0 : lengths[0]}; }
  size_t num_entries() const { return lengths.empty() ? 0 : (lengths.size() - 1) / 2; }
};

// The caller of a blocking check waits on this. Completions hold a reference, so a caller that
// gave up (its wait is bounded) leaves it to them.
struct SyncWaiter {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result> results;  // guarded by mu
  std::vector<uint8_t> done;    // guarded by mu
  size_t outstanding = 0;       // guarded by mu
};

// Where a finished check goes: a callback, or a slot in a SyncWaiter.
struct Completion {
  Client::Callback callback;
  std::shared_ptr<SyncWaiter> waiter;
  uint32_t index = 0;
};

class Core {
 public:
  Core(ClientOptions options, std::vector<NodeAddress> nodes);
  ~Core();  // completes pending checks with the fail mode, then joins the I/O thread
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Any thread. Queues a check; `done` is called exactly once, on the I/O thread.
  void submit(const wire::Check& check, Clock::time_point deadline, Completion done);
  void submit(OwnedCheck&& check, Clock::time_point deadline, Completion done);
  // Queues several checks under one lock.
  void submit_sync(std::span<const wire::Check> checks, Clock::time_point deadline,
                   const std::shared_ptr<SyncWaiter>& waiter);

  bool on_io_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  Result fail_result(Outcome outcome, wire::Code code = wire::Code::kOk) const;
  const ClientOptions& options() const { return options_; }
  ClientStats stats() const;

 private:
  struct Submission {
    OwnedCheck check;
    Completion done;
    Clock::time_point deadline;
  };
  struct SlotRef {
    uint32_t index = 0;
    uint32_t gen = 0;
  };
  struct Slot {
    uint32_t gen = 0;
    bool live = false;
    OwnedCheck check;
    Completion done;
    Clock::time_point deadline;
    uint64_t latest_request = 0;  // the request carrying its latest attempt
    uint32_t attempts = 0;        // sent so far
    size_t last_node = 0;         // node of the latest attempt
  };
  struct Request {
    size_t node = 0;
    Clock::time_point attempt_deadline;
    bool expired = false;  // its attempt timed out; still matchable until its checks end
    std::vector<SlotRef> slots;
  };
  enum class TcpState : uint8_t { kIdle, kConnecting, kConnected };
  struct Node {
    NodeAddress addr;
    // Health.
    Clock::time_point down_until{};
    Clock::duration backoff{};
    uint32_t silent_attempts = 0;
    // UDP: a connected socket, so only this node's datagrams (and its ICMP errors) arrive.
    std::optional<boost::asio::ip::udp::socket> udp;
    // TCP.
    std::optional<boost::asio::ip::tcp::socket> tcp;
    TcpState state = TcpState::kIdle;
    uint64_t conn_gen = 0;  // handlers of an older connection see a different value and quit
    Clock::time_point connect_deadline{};
    std::vector<uint8_t> out_pending;  // frames waiting for the write in flight
    std::vector<uint8_t> out_writing;  // the write in flight
    bool writing = false;
    wire::FrameReader reader;
    std::vector<uint8_t> rx;  // receive buffer
  };

  using RequestMap = std::unordered_map<uint64_t, Request>;

  // Caller side, under mu_.
  void enqueue_locked(Submission& into, Clock::time_point deadline, Completion&& done);
  void after_enqueue_locked(bool& post_notify, bool& post_full);
  void post_after_enqueue(bool post_notify, bool post_full);
  // Any thread: hands a result to its caller, exactly once per Completion.
  void deliver(Completion& done, Result&& r);

  // I/O thread only, from here on.
  void run();
  void on_submitted();
  void flush();
  void pump();
  void send_chunk(size_t node, std::span<const SlotRef> refs);
  void transmit(size_t node, uint64_t id);  // encoded_ to the node; failures are handled inside
  void tcp_connect(size_t node);
  void tcp_start_write(size_t node);
  void tcp_start_read(size_t node);
  void udp_start_receive(size_t node);
  void on_answer(size_t node, std::span<const uint8_t> bytes);
  void fail_node(size_t node);
  RequestMap::iterator fail_request(RequestMap::iterator it);
  void node_answered(Node& n);
  void node_down(Node& n, Clock::time_point now);
  size_t pick_node(size_t after, Clock::time_point now) const;
  void sweep();
  void arm_sweep(Clock::time_point at);
  void complete(SlotRef ref, Result&& r);
  Slot* live_slot(SlotRef ref);
  uint64_t next_request_id();
  std::vector<SlotRef> take_refs_vector();
  void shutdown();

  const ClientOptions options_;
  const size_t max_request_bytes_;
  boost::asio::io_context io_;

  // Guarded by mu_: the submission queue, shared by callers and the I/O thread. Entries beyond
  // queued_ keep their buffers for reuse.
  mutable std::mutex mu_;
  std::vector<Submission> queue_;
  size_t queued_ = 0;
  bool notified_ = false;  // the I/O thread has been told the queue is not empty
  bool closing_ = false;   // the destructor has begun: new checks fail at once

  // I/O thread only.
  std::vector<Submission> taking_;  // the queue swapped out by flush()
  std::deque<Slot> slots_;          // deque: Slot& stays valid while slots are added
  std::vector<uint32_t> free_slots_;
  RequestMap requests_;
  std::vector<std::vector<SlotRef>> spare_refs_;
  std::vector<SlotRef> to_send_;               // slots waiting for their next attempt
  std::vector<SlotRef> sending_;               // to_send_ taken by pump()
  std::vector<std::vector<SlotRef>> by_node_;  // pump()'s grouping, reused
  std::vector<Node> nodes_;
  std::vector<wire::Check> check_views_;  // encode scratch
  std::vector<wire::Entry> entry_views_;  // encode scratch
  std::vector<uint8_t> encoded_;          // encode scratch
  wire::Answer answer_;                   // decode scratch
  boost::asio::steady_timer sweep_timer_;
  Clock::time_point sweep_at_ = Clock::time_point::max();
  boost::asio::steady_timer batch_timer_;
  bool batch_armed_ = false;
  bool closed_ = false;
  uint64_t next_id_;

  struct AtomicStats {
    std::atomic<uint64_t> checks{0}, requests{0}, retries{0}, answers{0}, dropped_answers{0},
        unavailable{0}, link_failures{0}, callback_exceptions{0};
  };
  AtomicStats stats_;

  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;  // last: started when everything above exists
};

}  // namespace sluice::client_detail
