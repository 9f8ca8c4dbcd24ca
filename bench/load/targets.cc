// sluiced's targets: the keyspace, tcp_connect, the UDP and TCP check connections, the sluiced
// child and the probes. Redis and memcached are in targets_kv.cc.
#include "load/targets.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <span>
#include <stdexcept>

#include "http_client.h"
#include "load/grpc_target.h"
#include "load/stream_conn.h"
#include "wire/protocol.h"

namespace sluice::bench {

namespace wire = sluice::wire;

Keyspace::Keyspace(uint32_t n) {
  names.reserve(n);
  for (uint32_t i = 0; i < n; ++i)
    names.push_back("u" + std::to_string(i));
}

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

namespace {

// A non-blocking socket of `type` connected to 127.0.0.1:port (TCP: within timeout_ms, and
// TCP_NODELAY); -1 with `err` set.
int connect_loopback(int type, uint16_t port, int timeout_ms, std::string& err) {
  const sockaddr_in a = loopback(port);
  const int fd = ::socket(AF_INET, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    err = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  int soerr = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) soerr = errno;
  if (soerr == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    socklen_t len = sizeof soerr;
    if (::poll(&p, 1, timeout_ms) != 1) {
      soerr = ETIMEDOUT;
    } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) {
      soerr = errno;
    }
  }
  if (soerr != 0) {
    err = std::string(type == SOCK_DGRAM ? "udp " : "") +
          "connect 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(soerr);
    ::close(fd);
    return -1;
  }
  const int one = 1;
  if (type == SOCK_STREAM) ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

int tcp_connect(uint16_t port, int timeout_ms, std::string& err) {
  return connect_loopback(SOCK_STREAM, port, timeout_ms, err);
}

namespace {

constexpr int64_t kUdpTimeoutNs = 200'000'000;

// Requests in flight, matched by id: id = (sequence << 16) | slot, never 0.
class InFlight {
 public:
  struct Slot {
    uint64_t seq = 0;
    int64_t start = 0;     // steady clock
    int64_t start_rt = 0;  // CLOCK_REALTIME, to compare with kernel receive timestamps
    size_t bytes = 0;      // the request's, as sent
    bool busy = false;
  };

  // keep_order: remember the order requests were sent in, for oldest() (echo).
  InFlight(uint32_t window, bool keep_order) : slots_(window), keep_order_(keep_order) {
    for (uint32_t i = window; i > 0; --i)
      free_.push_back(static_cast<uint16_t>(i - 1));
  }
  bool has_room() const { return !free_.empty(); }
  uint64_t take(int64_t start, int64_t start_rt, size_t bytes) {
    const uint16_t s = free_.back();
    free_.pop_back();
    slots_[s] = Slot{++seq_, start, start_rt, bytes, true};
    const uint64_t id = (seq_ << 16) | s;
    if (keep_order_) order_.push_back(id);
    return id;
  }
  void set_bytes(uint64_t id, size_t bytes) { slots_[id & 0xffff].bytes = bytes; }
  // Frees the request's slot and returns it (valid until the next take()); nullptr when the id is
  // unknown or stale.
  const Slot* finish(uint64_t id) {
    const auto s = static_cast<size_t>(id & 0xffff);
    if (s >= slots_.size() || !slots_[s].busy || slots_[s].seq != (id >> 16)) return nullptr;
    release(static_cast<uint16_t>(s));
    return &slots_[s];
  }
  void put_back(uint64_t id) { release(static_cast<uint16_t>(id & 0xffff)); }
  // The oldest request still in flight (those given up on are skipped); 0 when none.
  uint64_t oldest() {
    while (!order_.empty() && !busy(order_.front()))
      order_.pop_front();
    return order_.empty() ? 0 : order_.front();
  }
  const Slot& slot(uint64_t id) const { return slots_[id & 0xffff]; }
  // Frees the slots of requests started before `cutoff`; returns how many.
  uint32_t expire(int64_t cutoff) {
    uint32_t n = 0;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].busy && slots_[s].start < cutoff) {
        release(static_cast<uint16_t>(s));
        ++n;
      }
    }
    return n;
  }

 private:
  bool busy(uint64_t id) const {
    const Slot& s = slots_[id & 0xffff];
    return s.busy && s.seq == (id >> 16);
  }
  void release(uint16_t s) {
    slots_[s].busy = false;
    free_.push_back(s);
  }
  std::vector<Slot> slots_;
  std::vector<uint16_t> free_;
  uint64_t seq_ = 0;
  bool keep_order_;
  std::deque<uint64_t> order_;  // keep_order: ids in the order they were sent
};

// Builds a request of `batch` checks on the next keys (domain "bench", entry k=<key>).
class SluiceRequestBuilder {
 public:
  SluiceRequestBuilder(uint32_t batch, const Keyspace& keys, KeyStream& stream)
      : keys_(keys), stream_(stream), entries_(batch), checks_(batch) {}
  void build(uint64_t id, size_t pad_to, std::vector<uint8_t>& out) {
    for (size_t i = 0; i < checks_.size(); ++i) {
      entries_[i] = wire::Entry{kSluiceEntryKey, keys_.names[stream_.next()]};
      checks_[i] = wire::Check{kSluiceDomain, std::span<const wire::Entry>(&entries_[i], 1), 1};
    }
    wire::encode_request(id, checks_, pad_to, out);
  }

 private:
  const Keyspace& keys_;
  KeyStream& stream_;
  std::vector<wire::Entry> entries_;
  std::vector<wire::Check> checks_;
};

// Counts a decoded answer's problems; returns false when it is not a usable answer.
bool judge_answer(const wire::Answer& a, uint32_t batch, RowStats& st) {
  if (a.code != wire::Code::kOk) {
    st.note_error("request error: " + std::string(wire::to_string(a.code)));
    return false;
  }
  if (a.decisions.size() != batch) {
    st.note_error("answer with " + std::to_string(a.decisions.size()) + " decisions for " +
                  std::to_string(batch) + " checks");
    return false;
  }
  for (const wire::Decision& d : a.decisions) {
    if (d.code != wire::Code::kOk) {
      st.note_error("check error: " + std::string(wire::to_string(d.code)));
    } else if (!d.allowed) {
      ++st.denied;
    }
  }
  return true;
}

// UDP: requests started by send() wait in `pending_` until flush() hands them to the kernel in
// one sendmmsg; answers are read with recvmmsg. This keeps the generator's own syscalls per check
// low (it shares the CPUs with the server); the server still gets one datagram per request.
// Answers also carry the kernel's receive timestamp (SO_TIMESTAMPNS): send -> arrival at this
// socket is recorded apart (RowStats::arrival), without the generator's own wake-up delay.
class SluiceUdpConn final : public Conn {
 public:
  static constexpr size_t kRecvBatch = 16;

  SluiceUdpConn(int fd, const SluiceConnOptions& o, ThreadContext& ctx)
      : Conn(fd),
        o_(o),
        rec_(*ctx.recorder),
        inflight_(o.window, o.echo),
        builder_(o.batch, *o.keys, *ctx.keys),
        pending_(o.window),
        pending_ids_(o.window),
        send_iov_(o.window),
        send_hdr_(o.window) {
    if (o.udp_room_per_check > 0) {
      pad_to_ =
          std::min<size_t>(wire::kMaxDatagramBytes, 64 + size_t{o.udp_room_per_check} * o.batch);
    }
    // An answer is never larger than its request; leave room for an unpadded request too.
    const size_t answer_max =
        std::min<size_t>(wire::kMaxDatagramBytes, std::max<size_t>(pad_to_, 256 * o.batch) + 512);
    recv_buf_.resize(kRecvBatch * answer_max);
    for (size_t i = 0; i < kRecvBatch; ++i) {
      recv_iov_[i] = iovec{recv_buf_.data() + i * answer_max, answer_max};
      recv_hdr_[i].msg_hdr.msg_iov = &recv_iov_[i];
      recv_hdr_[i].msg_hdr.msg_iovlen = 1;
      recv_hdr_[i].msg_hdr.msg_control = recv_ctl_[i].data();
    }
    for (size_t i = 0; i < o.window; ++i) {
      send_hdr_[i].msg_hdr.msg_iov = &send_iov_[i];
      send_hdr_[i].msg_hdr.msg_iovlen = 1;
    }
    const int one = 1;
    timestamps_ = ::setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) == 0;
  }
  bool has_room() const override { return inflight_.has_room(); }
  void send(int64_t start) override {
    timespec rt{};
    ::clock_gettime(CLOCK_REALTIME, &rt);
    const uint64_t id = inflight_.take(start, int64_t{rt.tv_sec} * 1'000'000'000 + rt.tv_nsec, 0);
    std::vector<uint8_t>& m = pending_[npending_];
    builder_.build(id, pad_to_, m);
    inflight_.set_bytes(id, m.size());
    send_iov_[npending_] = iovec{m.data(), m.size()};
    pending_ids_[npending_++] = id;
  }
  void flush() override {
    size_t done = 0;
    // Bounded: each pass sends at least one datagram or stops.
    while (done < npending_) {
      const auto n = static_cast<unsigned>(npending_ - done);
      const int sent = ::sendmmsg(fd_, send_hdr_.data() + done, n, 0);
      if (sent > 0) {
        done += static_cast<size_t>(sent);
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      // The rest was not sent: free its slots.
      for (size_t i = done; i < npending_; ++i)
        inflight_.put_back(pending_ids_[i]);
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
        rec_.stats->send_failures += npending_ - done;
      } else {
        rec_.stats->note_error(std::string("udp send: ") + std::strerror(errno));
      }
      break;
    }
    npending_ = 0;
  }
  void on_readable(int64_t now) override {
    for (int pass = 0; pass < 64; ++pass) {
      for (size_t i = 0; i < kRecvBatch; ++i)
        recv_hdr_[i].msg_hdr.msg_controllen = recv_ctl_[i].size();
      const int n = ::recvmmsg(fd_, recv_hdr_.data(), kRecvBatch, MSG_DONTWAIT, nullptr);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        // ECONNREFUSED: an ICMP port-unreachable for an earlier datagram (server gone).
        rec_.stats->note_error(std::string("udp recv: ") + std::strerror(errno));
        return;
      }
      for (int i = 0; i < n; ++i)
        handle(recv_hdr_[static_cast<size_t>(i)], now);
      if (static_cast<size_t>(n) < kRecvBatch) return;
    }
  }
  void expire(int64_t now) override { rec_.stats->lost += inflight_.expire(now - kUdpTimeoutNs); }

 private:
  void handle(mmsghdr& h, int64_t now) {
    if (h.msg_hdr.msg_flags & MSG_TRUNC) {
      return rec_.stats->note_error("udp answer larger than the receive buffer");
    }
    // Echo: the answer is the oldest request still in flight.
    uint64_t id = o_.echo ? inflight_.oldest() : 0;
    const auto* data = static_cast<const uint8_t*>(h.msg_hdr.msg_iov->iov_base);
    if (!o_.echo) {
      if (wire::decode_answer({data, h.msg_len}, answer_) != wire::Code::kOk) {
        return rec_.stats->note_error("undecodable udp answer");
      }
      id = answer_.id;
    }
    const InFlight::Slot* s = inflight_.finish(id);
    if (s == nullptr) {
      ++rec_.stats->late_answers;
      return;
    }
    if (!o_.echo && !judge_answer(answer_, o_.batch, *rec_.stats)) return;
    rec_.complete(s->start, now, o_.batch, s->bytes, h.msg_len);
    if (!timestamps_ || !rec_.in_window(now)) return;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h.msg_hdr); c != nullptr; c = CMSG_NXTHDR(&h.msg_hdr, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
      timespec ts{};
      std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
      const int64_t rx = int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
      rec_.stats->arrival.record(static_cast<uint64_t>(std::max<int64_t>(rx - s->start_rt, 0)),
                                 o_.batch);
    }
  }

  SluiceConnOptions o_;
  Recorder& rec_;
  InFlight inflight_;
  SluiceRequestBuilder builder_;
  size_t pad_to_ = 0;
  std::vector<std::vector<uint8_t>> pending_;  // encoded, not yet sent
  std::vector<uint64_t> pending_ids_;
  size_t npending_ = 0;
  std::vector<iovec> send_iov_;    // pending_'s
  std::vector<mmsghdr> send_hdr_;  // one per send_iov_
  std::vector<uint8_t> recv_buf_;
  std::array<iovec, kRecvBatch> recv_iov_{};
  std::array<mmsghdr, kRecvBatch> recv_hdr_{};
  std::array<std::array<char, CMSG_SPACE(sizeof(timespec))>, kRecvBatch> recv_ctl_{};
  bool timestamps_ = false;
  wire::Answer answer_;
};

// TCP: each request one frame ([u32 little-endian length][message], lib/wire).
class SluiceTcpConn final : public detail::StreamConn {
 public:
  SluiceTcpConn(int fd, const SluiceConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx),
        o_(o),
        inflight_(o.window, o.echo),
        builder_(o.batch, *o.keys, *ctx.keys) {}
  bool has_room() const override { return inflight_.has_room(); }
  void send(int64_t start) override {
    const uint64_t id = inflight_.take(start, 0, 0);
    builder_.build(id, 0, msg_);
    frame_.clear();
    wire::append_frame(msg_, frame_);
    out_.append(reinterpret_cast<const char*>(frame_.data()), frame_.size());
    inflight_.set_bytes(id, frame_.size());
  }

 private:
  size_t parse(std::string_view in, int64_t now) override {
    if (o_.echo) {
      // The bytes come back as sent: the oldest request is done when all of its frame has.
      const uint64_t id = inflight_.oldest();
      if (id == 0 || in.size() < inflight_.slot(id).bytes) return 0;
      const size_t size = inflight_.slot(id).bytes;
      const InFlight::Slot* s = inflight_.finish(id);
      rec_.complete(s->start, now, o_.batch, size, size);
      return size;
    }
    const auto* p = reinterpret_cast<const uint8_t*>(in.data());
    if (in.size() < wire::kFrameHeaderBytes) return 0;
    const size_t n = size_t{p[0]} | size_t{p[1]} << 8 | size_t{p[2]} << 16 | size_t{p[3]} << 24;
    if (n == 0 || n > wire::kMaxFrameBytes) {
      stats_->note_error("bad frame length from the server");
      fail();
      return 0;
    }
    const size_t size = wire::kFrameHeaderBytes + n;
    if (in.size() < size) return 0;
    if (wire::decode_answer({p + wire::kFrameHeaderBytes, n}, answer_) != wire::Code::kOk) {
      stats_->note_error("undecodable tcp answer");
    } else if (const InFlight::Slot* s = inflight_.finish(answer_.id); s == nullptr) {
      stats_->note_error("tcp answer with an unknown id");
    } else if (judge_answer(answer_, o_.batch, *stats_)) {
      rec_.complete(s->start, now, o_.batch, s->bytes, size);
    }
    return size;
  }

  SluiceConnOptions o_;
  InFlight inflight_;
  SluiceRequestBuilder builder_;
  std::vector<uint8_t> msg_, frame_;
  wire::Answer answer_;
};

}  // namespace

std::unique_ptr<Conn> make_sluice_udp(const SluiceConnOptions& o, ThreadContext& ctx) {
  std::string err;
  const int fd = connect_loopback(SOCK_DGRAM, o.port, 0, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<SluiceUdpConn>(fd, o, ctx);
}

std::unique_ptr<Conn> make_sluice_tcp(const SluiceConnOptions& o, ThreadContext& ctx) {
  return detail::connect_stream<SluiceTcpConn>(o, ctx);
}

// ---- probes and setup ---------------------------------------------------------------------------

void SluicedChild::start(const std::string& dir) {
  if (exe.empty()) exe = sibling_sluiced();
  if (exe.empty() || ::access(exe.c_str(), X_OK) != 0) {
    throw std::runtime_error("no sluiced at '" + exe + "' (build target sluiced, or --sluiced)");
  }
  port = free_loopback_port();
  admin_port = free_loopback_port();
  if (grpc) grpc_port = free_loopback_port();
  if (resp) resp_port = free_loopback_port();
  auto addr_of = [](uint16_t p) { return p == 0 ? "\"\"" : "127.0.0.1:" + std::to_string(p); };
  const std::string addr = addr_of(port);
  const std::string rules = dir + "/rules.yaml", config = dir + "/sluiced.yaml";
  std::ofstream(rules) << "# written by " << written_by << "\ndomains:\n  - name: " << kSluiceDomain
                       << "\n    rules:\n      - name: per-k\n        key: [" << kSluiceEntryKey
                       << "]\n        limits: [" << limits << "]\n"
                       << rule_extra;
  std::ofstream(config) << "# written by " << written_by << "\nudp: " << addr << "\ntcp: " << addr
                        << "\nadmin: 127.0.0.1:" << admin_port << "\ngrpc: " << addr_of(grpc_port)
                        << "\nresp: " << addr_of(resp_port) << "\nthreads: " << threads
                        << "\nrules: " << rules
                        << (data ? "\ndata_dir: " + dir + "/sluiced-data\ninit_data: true\n"
                                 : "\ndata_dir: \"\"\n")
                        << "log_level: warn\n"
                        << config_extra;
  if (std::string e = process.start({exe, "--config", config}, dir + "/sluiced.log"); !e.empty())
    throw std::runtime_error("sluiced: " + e);
  wait_ready(
      process,
      [this] {
        std::string e = sluice_probe(port, 500);
        if (e.empty() && grpc_port != 0) e = grpc_probe(grpc_port, 500);
        if (e.empty() && resp_port != 0) e = redis_probe(resp_port, 500);
        return e;
      },
      15'000);
}

std::string probe_conn(
    const std::function<std::unique_ptr<Conn>(const Keyspace&, ThreadContext&)>& make,
    int timeout_ms) {
  Keyspace probe(1);
  probe.names[0] = "probe";
  RowStats stats;
  Recorder rec{&stats, 0, INT64_MAX};
  KeyStream keys(1, false, 0, 1);
  ThreadContext ctx{0, &keys, &rec};
  try {
    const std::unique_ptr<Conn> conn = make(probe, ctx);
    conn->send(now_ns());
    conn->flush();
    const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
    // Bounded by the deadline (polls of at most 100 ms).
    while (now_ns() < deadline && stats.checks == 0 && stats.errors == 0 && !conn->failed()) {
      pollfd p{conn->fd(), static_cast<short>(POLLIN | (conn->wants_write() ? POLLOUT : 0)), 0};
      ::poll(&p, 1, 100);
      if (p.revents & POLLOUT) conn->flush();
      if (p.revents & (POLLIN | POLLERR | POLLHUP)) conn->on_readable(now_ns());
    }
    if (stats.checks > 0) return "";
    return stats.first_error.empty() ? "timed out waiting for the answer" : stats.first_error;
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string sluice_probe(uint16_t port, int timeout_ms) {
  SluiceConnOptions o;
  o.port = port;
  if (std::string e = probe_conn(o, &make_sluice_tcp, timeout_ms); !e.empty()) return "tcp: " + e;
  if (std::string e = probe_conn(o, &make_sluice_udp, timeout_ms); !e.empty()) return "udp: " + e;
  return "";
}

std::string echo_probe(const std::string& transport, uint16_t port, int timeout_ms) {
  SluiceConnOptions o;
  o.port = port;
  o.echo = true;
  return probe_conn(o, transport == "udp" ? &make_sluice_udp : &make_sluice_tcp, timeout_ms);
}

std::string http_get(uint16_t port, const std::string& path, std::string& body) {
  const testing::HttpReply r =
      testing::http_request(port, "GET", path, "", std::chrono::milliseconds(3000));
  if (r.status == 0) return "no HTTP answer from 127.0.0.1:" + std::to_string(port) + path;
  body = r.body;
  return "";
}

}  // namespace sluice::bench
