#include "load/targets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>

#include "wire/protocol.h"

namespace sluice::bench {

namespace wire = sluice::wire;

Keyspace::Keyspace(uint32_t n) {
  names.reserve(n);
  for (uint32_t i = 0; i < n; ++i)
    names.push_back("u" + std::to_string(i));
}

int tcp_connect(uint16_t port, int timeout_ms, std::string& err) {
  const sockaddr_in a = [&] {
    sockaddr_in x{};
    x.sin_family = AF_INET;
    x.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    x.sin_port = htons(port);
    return x;
  }();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    err = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    if (errno != EINPROGRESS) {
      err = "connect 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
      ::close(fd);
      return -1;
    }
    pollfd p{fd, POLLOUT, 0};
    int soerr = 0;
    socklen_t len = sizeof soerr;
    if (::poll(&p, 1, timeout_ms) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0 || soerr != 0) {
      err = "connect 127.0.0.1:" + std::to_string(port) + ": " +
            (soerr ? std::strerror(soerr) : "timed out");
      ::close(fd);
      return -1;
    }
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

namespace {

// ---- sockets ----------------------------------------------------------------------------------

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  return a;
}

int udp_connect(uint16_t port, std::string& err) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    err = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  const sockaddr_in a = loopback(port);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    err = std::string("udp connect: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

template <typename Int>
bool parse_int(std::string_view s, Int& out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// ---- a byte-stream connection: buffered output, input buffer ------------------------------------

class StreamConn : public Conn {
 public:
  void flush() override {
    // Bounded: each pass writes something or stops.
    while (out_pos_ < out_.size()) {
      const ssize_t n = ::send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL);
      if (n > 0) {
        out_pos_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0 && errno == EINTR) continue;
      stats_->note_error(std::string("send: ") + std::strerror(errno));
      fail();
      return;
    }
    out_.clear();
    out_pos_ = 0;
  }
  bool wants_write() const override { return out_pos_ < out_.size(); }

 protected:
  StreamConn(int fd, RowStats* stats) : Conn(fd), stats_(stats) { in_.resize(256 * 1024); }

  // Reads what is available (at most a few buffers full). False when the peer closed or failed.
  bool read_available() {
    for (int i = 0; i < 8; ++i) {
      if (in_end_ == in_.size()) {
        if (in_begin_ > 0) {
          std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
          in_end_ -= in_begin_;
          in_begin_ = 0;
        } else {
          in_.resize(in_.size() * 2);
        }
      }
      const ssize_t n = ::recv(fd_, in_.data() + in_end_, in_.size() - in_end_, 0);
      if (n > 0) {
        in_end_ += static_cast<size_t>(n);
        if (in_end_ < in_.size()) return true;  // drained the socket
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      if (n < 0 && errno == EINTR) continue;
      stats_->note_error(n == 0 ? std::string("connection closed by the server")
                                : std::string("recv: ") + std::strerror(errno));
      fail();
      return false;
    }
    return true;
  }
  std::string_view pending_input() const { return {in_.data() + in_begin_, in_end_ - in_begin_}; }
  void consume(size_t n) {
    in_begin_ += n;
    if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  }

  RowStats* stats_;
  std::string out_;
  size_t out_pos_ = 0;
  std::vector<char> in_;
  size_t in_begin_ = 0, in_end_ = 0;
};

// ---- sluiced ----------------------------------------------------------------------------------

// Slots for requests in flight, matched by id: id = (sequence << 16) | slot, never 0.
class InFlight {
 public:
  explicit InFlight(uint32_t window) : slots_(window) {
    for (uint32_t i = window; i > 0; --i)
      free_.push_back(static_cast<uint16_t>(i - 1));
  }
  bool has_room() const { return !free_.empty(); }
  // start: steady clock; start_rt: CLOCK_REALTIME, to compare with kernel receive timestamps.
  uint64_t take(int64_t start, int64_t start_rt = 0) {
    const uint16_t s = free_.back();
    free_.pop_back();
    slots_[s] = Slot{++seq_, start, start_rt, true};
    return (slots_[s].seq << 16) | s;
  }
  void put_back(uint64_t id) { release(static_cast<uint16_t>(id & 0xffff)); }
  // The start time of the request with this id and frees its slot; false when unknown or stale.
  bool finish(uint64_t id, int64_t& start, int64_t* start_rt = nullptr) {
    const auto s = static_cast<size_t>(id & 0xffff);
    if (s >= slots_.size() || !slots_[s].busy || slots_[s].seq != (id >> 16)) return false;
    start = slots_[s].start;
    if (start_rt) *start_rt = slots_[s].start_rt;
    release(static_cast<uint16_t>(s));
    return true;
  }
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
  struct Slot {
    uint64_t seq = 0;
    int64_t start = 0;
    int64_t start_rt = 0;
    bool busy = false;
  };
  void release(uint16_t s) {
    slots_[s].busy = false;
    free_.push_back(s);
  }
  std::vector<Slot> slots_;
  std::vector<uint16_t> free_;
  uint64_t seq_ = 0;
};

// Builds a request of `batch` checks on the next keys (domain "bench", entry k=<key>).
class SluiceRequestBuilder {
 public:
  SluiceRequestBuilder(uint32_t batch, std::string_view entry_key, const Keyspace& keys,
                       KeyStream& stream)
      : entry_key_(entry_key), keys_(keys), stream_(stream), entries_(batch), checks_(batch) {}
  void build(uint64_t id, size_t pad_to, std::vector<uint8_t>& out) {
    for (size_t i = 0; i < checks_.size(); ++i) {
      entries_[i] = wire::Entry{entry_key_, keys_.names[stream_.next()]};
      checks_[i] = wire::Check{kSluiceDomain, std::span<const wire::Entry>(&entries_[i], 1), 1};
    }
    wire::encode_request(id, checks_, pad_to, out);
  }

 private:
  std::string_view entry_key_;
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
        inflight_(o.window),
        builder_(o.batch, o.entry_key, *o.keys, *ctx.keys),
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
    }
    const int one = 1;
    timestamps_ = ::setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) == 0;
  }
  bool has_room() const override { return inflight_.has_room(); }
  void send(int64_t start) override {
    timespec rt{};
    ::clock_gettime(CLOCK_REALTIME, &rt);
    const uint64_t id = inflight_.take(start, int64_t{rt.tv_sec} * 1'000'000'000 + rt.tv_nsec);
    builder_.build(id, pad_to_, pending_[npending_]);
    pending_ids_[npending_] = id;
    request_bytes_[id & 0xffff] = pending_[npending_].size();
    if (o_.echo) echo_order_.push_back(id);
    ++npending_;
  }
  void flush() override {
    size_t done = 0;
    // Bounded: each pass sends at least one datagram or stops.
    while (done < npending_) {
      const size_t n = npending_ - done;
      for (size_t i = 0; i < n; ++i) {
        std::vector<uint8_t>& m = pending_[done + i];
        send_iov_[i] = iovec{m.data(), m.size()};
        send_hdr_[i] = mmsghdr{};
        send_hdr_[i].msg_hdr.msg_iov = &send_iov_[i];
        send_hdr_[i].msg_hdr.msg_iovlen = 1;
      }
      const int sent = ::sendmmsg(fd_, send_hdr_.data(), static_cast<unsigned>(n), 0);
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
      for (size_t i = 0; i < kRecvBatch; ++i) {
        recv_hdr_[i] = mmsghdr{};
        recv_hdr_[i].msg_hdr.msg_iov = &recv_iov_[i];
        recv_hdr_[i].msg_hdr.msg_iovlen = 1;
        recv_hdr_[i].msg_hdr.msg_control = recv_ctl_[i].data();
        recv_hdr_[i].msg_hdr.msg_controllen = recv_ctl_[i].size();
      }
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
  void expire(int64_t now) override {
    rec_.stats->lost += inflight_.expire(now - o_.udp_timeout_ns);
  }

 private:
  void handle(const mmsghdr& h, int64_t now) {
    if (h.msg_hdr.msg_flags & MSG_TRUNC) {
      rec_.stats->note_error("udp answer larger than the receive buffer");
      return;
    }
    int64_t start = 0, start_rt = 0;
    uint64_t id = 0;
    if (o_.echo) {
      // The oldest request still in flight (requests given up on, whose echo was lost, go).
      bool found = false;
      while (!echo_order_.empty() && !found) {
        id = echo_order_.front();
        echo_order_.pop_front();
        found = inflight_.finish(id, start, &start_rt);
      }
      if (!found) {
        ++rec_.stats->late_answers;
        return;
      }
    } else {
      const auto* data = static_cast<const uint8_t*>(h.msg_hdr.msg_iov->iov_base);
      if (wire::decode_answer({data, h.msg_len}, answer_) != wire::Code::kOk) {
        rec_.stats->note_error("undecodable udp answer");
        return;
      }
      id = answer_.id;
      if (!inflight_.finish(id, start, &start_rt)) {
        ++rec_.stats->late_answers;
        return;
      }
      if (!judge_answer(answer_, o_.batch, *rec_.stats)) return;
    }
    rec_.complete(start, now, o_.batch, request_bytes_[id & 0xffff], h.msg_len);
    if (!timestamps_ || !rec_.in_window(now)) return;
    msghdr& mh = const_cast<msghdr&>(h.msg_hdr);
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
      timespec ts{};
      std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
      const int64_t rx = int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
      rec_.stats->arrival.record(static_cast<uint64_t>(std::max<int64_t>(rx - start_rt, 0)),
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
  std::vector<iovec> send_iov_;
  std::vector<mmsghdr> send_hdr_;
  std::vector<uint8_t> recv_buf_;
  std::array<iovec, kRecvBatch> recv_iov_{};
  std::array<mmsghdr, kRecvBatch> recv_hdr_{};
  std::array<std::array<char, CMSG_SPACE(sizeof(timespec))>, kRecvBatch> recv_ctl_{};
  bool timestamps_ = false;
  wire::Answer answer_;
  std::vector<size_t> request_bytes_ = std::vector<size_t>(o_.window);  // by in-flight slot
  std::deque<uint64_t> echo_order_;  // echo: ids in the order they were sent
};

class SluiceTcpConn final : public StreamConn {
 public:
  SluiceTcpConn(int fd, const SluiceConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx.recorder->stats),
        o_(o),
        rec_(*ctx.recorder),
        inflight_(o.window),
        builder_(o.batch, o.entry_key, *o.keys, *ctx.keys) {}
  bool has_room() const override { return inflight_.has_room(); }
  void send(int64_t start) override {
    const uint64_t id = inflight_.take(start);
    builder_.build(id, 0, msg_);
    frame_.clear();
    wire::append_frame(msg_, frame_);
    out_.append(reinterpret_cast<const char*>(frame_.data()), frame_.size());
    request_bytes_[id & 0xffff] = frame_.size();
    if (o_.echo) echo_order_.push_back(id);
  }
  void on_readable(int64_t now) override {
    const bool ok = read_available();
    if (o_.echo) {
      on_echo(now);
      if (!ok) fail();
      return;
    }
    const std::string_view in = pending_input();
    reader_.feed({reinterpret_cast<const uint8_t*>(in.data()), in.size()});
    consume(in.size());
    for (size_t i = 0; i < 1'000'000; ++i) {
      const auto frame = reader_.next();
      if (!frame) break;
      if (wire::decode_answer(*frame, answer_) != wire::Code::kOk) {
        stats_->note_error("undecodable tcp answer");
        continue;
      }
      int64_t start = 0;
      const uint64_t id = answer_.id;
      if (!inflight_.finish(id, start)) {
        stats_->note_error("tcp answer with an unknown id");
        continue;
      }
      if (judge_answer(answer_, o_.batch, *stats_)) {
        rec_.complete(start, now, o_.batch, request_bytes_[id & 0xffff],
                      frame->size() + kFrameHeader);
      }
    }
    if (reader_.failed()) {
      stats_->note_error("bad frame length from the server");
      fail();
    }
    if (!ok) fail();
  }

 private:
  static constexpr size_t kFrameHeader = wire::kFrameHeaderBytes;

  // Echo: the bytes come back as sent; each request is done when all of its frame has.
  void on_echo(int64_t now) {
    std::string_view in = pending_input();
    size_t used = 0;
    while (!echo_order_.empty()) {
      const uint64_t id = echo_order_.front();
      const size_t size = request_bytes_[id & 0xffff];
      if (in.size() - used < size) break;
      used += size;
      echo_order_.pop_front();
      int64_t start = 0;
      if (inflight_.finish(id, start)) rec_.complete(start, now, o_.batch, size, size);
    }
    consume(used);
  }

  SluiceConnOptions o_;
  Recorder& rec_;
  InFlight inflight_;
  SluiceRequestBuilder builder_;
  std::vector<uint8_t> msg_, frame_;
  wire::FrameReader reader_;
  wire::Answer answer_;
  std::vector<size_t> request_bytes_ = std::vector<size_t>(o_.window);  // by in-flight slot
  std::deque<uint64_t> echo_order_;  // echo: ids in the order they were sent
};

// ---- RESP -------------------------------------------------------------------------------------

struct RespReply {
  char type = 0;          // '+', '-', ':', '$', '*'
  int64_t integer = 0;    // ':'
  std::string_view text;  // '+', '-', '$' (empty and null = true for a null bulk)
  bool null = false;
  std::vector<std::string_view> elems;  // '*': elements (bulk, simple or integer text)
};

// One reply from the front of `in`: bytes consumed, 0 when incomplete, -1 when malformed or
// nested deeper than one array (no command used here answers that way).
long parse_resp(std::string_view in, RespReply& r) {
  r.elems.clear();
  r.null = false;
  r.text = {};
  size_t pos = 0;
  // Reads a CRLF-terminated line after pos; 1 ok, 0 incomplete, -1 malformed.
  auto line = [&](std::string_view& out) -> int {
    const size_t cr = in.find('\r', pos);
    if (cr == std::string_view::npos || cr + 1 >= in.size()) return 0;
    if (in[cr + 1] != '\n') return -1;
    out = in.substr(pos, cr - pos);
    pos = cr + 2;
    return 1;
  };
  // One scalar element at pos (type byte included) into `out`; same returns as line().
  auto scalar = [&](char& type, std::string_view& out, bool& is_null) -> int {
    if (pos >= in.size()) return 0;
    type = in[pos++];
    std::string_view l;
    if (const int s = line(l); s <= 0) return s;
    if (type == '+' || type == '-' || type == ':') {
      out = l;
      return 1;
    }
    if (type != '$') return -1;
    int64_t len = 0;
    if (!parse_int(l, len)) return -1;
    if (len < 0) {
      is_null = true;
      out = {};
      return 1;
    }
    const auto ulen = static_cast<size_t>(len);
    if (in.size() - pos < ulen + 2) return 0;
    out = in.substr(pos, ulen);
    pos += ulen + 2;
    return 1;
  };
  if (in.empty()) return 0;
  if (in[0] != '*') {
    const int s = scalar(r.type, r.text, r.null);
    if (s <= 0) return s;
    if (r.type == ':' && !parse_int(r.text, r.integer)) return -1;
    return static_cast<long>(pos);
  }
  r.type = '*';
  ++pos;
  std::string_view l;
  if (const int s = line(l); s <= 0) return s;
  int64_t count = 0;
  if (!parse_int(l, count)) return -1;
  if (count < 0) {
    r.null = true;
    return static_cast<long>(pos);
  }
  for (int64_t i = 0; i < count; ++i) {
    char t = 0;
    std::string_view e;
    bool en = false;
    if (pos < in.size() && in[pos] == '*') return -1;
    const int s = scalar(t, e, en);
    if (s <= 0) return s;
    r.elems.push_back(e);
  }
  return static_cast<long>(pos);
}

void append_bulk(std::string& out, std::string_view s) {
  out += '$';
  out += std::to_string(s.size());
  out += "\r\n";
  out.append(s);
  out += "\r\n";
}

void append_array_header(std::string& out, size_t n) {
  out += '*';
  out += std::to_string(n);
  out += "\r\n";
}

void append_command(std::string& out, std::initializer_list<std::string_view> args) {
  append_array_header(out, args.size());
  for (std::string_view a : args)
    append_bulk(out, a);
}

}  // namespace

const char* const kSeed003Script = R"lua(local key = KEYS[1] -- unique key per user
local limit = tonumber(ARGV[1]) -- allowed number of requests within the window
local windowSize = tonumber(ARGV[2]) -- window size in milliseconds, e.g 60000 (for 1 minute)
local currentTime = tonumber(ARGV[3]) -- current epoch milli

-- Remove expired elements from the sorted set
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. currentTime - windowSize)

-- Get the current count from the sorted set
local currentCount = redis.call('ZCARD', key)

if currentCount >= limit then
	return currentCount
end

local member = currentTime .. '-' .. redis.call('INCR', key .. ':counter')

redis.call('ZADD', key, currentTime, member)
redis.call('PEXPIRE', key .. ':counter', windowSize)

return currentCount+1
)lua";

namespace {

// Seed 002 (Figma), as written: an hourly limit counted in a hash of per-minute counters.
//   per check:  HINCRBY <key> <unix minute> 1    count this request in the current minute
//               EXPIRE  <key> 3600               "it also sets the hash to expire an hour later"
//               HGETALL <key>                    the client sums the fields in the window
// The three commands need nothing from each other's replies, so they are written together (one
// round trip), without MULTI and without Lua (the seed chose not to add Lua). The window is the
// seed's harsher variant: the last hour and one minute (61 fields) unless the current second is
// a whole minute, then the last 60. Denied when the sum (this request included) exceeds the
// limit. Cleanup: when a reply holds more than kStaleFieldsBeforeCleanup fields older than the
// window, an HDEL of those fields rides along with the connection's next request ("we regularly
// remove these counters when there are a considerable number of them"). The field is the unix
// minute (seconds / 60).
constexpr int64_t kHashWindowMinutes = 60;
constexpr size_t kStaleFieldsBeforeCleanup = 8;

class RedisConn final : public StreamConn {
 public:
  RedisConn(int fd, const RedisConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx.recorder->stats),
        o_(o),
        rec_(*ctx.recorder),
        stream_(*ctx.keys),
        units_(o.window) {
    for (Unit& u : units_)
      u.keys.resize(o.batch);
    limit_text_ = std::to_string(o.limit);
    per_check_ = o.scheme == RedisScheme::kHashMinutes ? 3 : 1;
  }
  bool has_room() const override { return count_ < units_.size(); }
  void send(int64_t start) override {
    Unit& u = units_[(head_ + count_) % units_.size()];
    ++count_;
    u.start = start;
    u.replies_total = o_.batch * per_check_;
    u.replies_seen = 0;
    const int64_t now_ms = epoch_ms();
    char now_text[24];
    const auto now_end = std::to_chars(now_text, now_text + sizeof now_text, now_ms).ptr;
    const std::string_view now_sv(now_text, static_cast<size_t>(now_end - now_text));
    for (uint32_t i = 0; i < o_.batch; ++i) {
      const uint32_t k = stream_.next();
      u.keys[i] = k;
      const std::string& name = o_.keys->names[k];
      switch (o_.scheme) {
        case RedisScheme::kIncr:
          append_command(out_, {"INCR", name});
          break;
        case RedisScheme::kLuaLog:
          key_.assign(name).append("-rate-limit-v1");  // seed 003's key
          append_command(out_, {"EVALSHA", o_.lua_sha, "1", key_, limit_text_, "60000", now_sv});
          break;
        case RedisScheme::kHashMinutes: {
          key_.assign("rl:").append(name);
          char minute[24];
          const auto mend = std::to_chars(minute, minute + sizeof minute, now_ms / 60'000).ptr;
          append_command(out_, {"HINCRBY", key_,
                                std::string_view(minute, static_cast<size_t>(mend - minute)), "1"});
          append_command(out_, {"EXPIRE", key_, "3600"});
          append_command(out_, {"HGETALL", key_});
          break;
        }
      }
    }
    if (!cleanup_.empty()) {
      out_ += cleanup_;
      cleanup_.clear();
      ++u.replies_total;  // the HDEL's reply comes after this unit's own
    }
  }
  void on_readable(int64_t now) override {
    const bool ok = read_available();
    // Bounded: each pass consumes one reply or stops.
    for (size_t guard = 0; guard < 1'000'000; ++guard) {
      const std::string_view in = pending_input();
      if (in.empty()) break;
      const long used = parse_resp(in, reply_);
      if (used == 0) break;
      if (used < 0) {
        stats_->note_error("malformed RESP reply");
        fail();
        return;
      }
      handle_reply(now);
      consume(static_cast<size_t>(used));
    }
    if (!ok) fail();
  }

 private:
  struct Unit {
    int64_t start = 0;
    uint32_t replies_total = 0;
    uint32_t replies_seen = 0;
    std::vector<uint32_t> keys;  // the key of each check, in order
  };

  void handle_reply(int64_t now) {
    if (count_ == 0) {
      stats_->note_error("RESP reply with nothing in flight");
      return;
    }
    Unit& u = units_[head_];
    const uint32_t idx = u.replies_seen++;
    if (reply_.type == '-') {
      stats_->note_error("redis: " + std::string(reply_.text));
    } else if (idx < o_.batch * per_check_) {
      judge(idx % per_check_, u.keys[idx / per_check_]);
    }
    if (u.replies_seen == u.replies_total) {
      rec_.complete(u.start, now, o_.batch);
      head_ = (head_ + 1) % units_.size();
      --count_;
    }
  }

  void judge(uint32_t cmd, uint32_t key) {
    switch (o_.scheme) {
      case RedisScheme::kIncr:
        if (reply_.type != ':') return stats_->note_error("INCR: unexpected reply");
        if (static_cast<uint64_t>(reply_.integer) > o_.limit) ++stats_->denied;
        return;
      case RedisScheme::kLuaLog:
        // Seed 003's caller: denied when requestsInWindow >= limit.
        if (reply_.type != ':') return stats_->note_error("EVALSHA: unexpected reply");
        if (static_cast<uint64_t>(reply_.integer) >= o_.limit) ++stats_->denied;
        return;
      case RedisScheme::kHashMinutes:
        if (cmd < 2) {
          if (reply_.type != ':') stats_->note_error("HINCRBY/EXPIRE: unexpected reply");
          return;
        }
        if (reply_.type != '*' || reply_.elems.size() % 2 != 0) {
          return stats_->note_error("HGETALL: unexpected reply");
        }
        judge_minutes(key);
        return;
    }
  }

  void judge_minutes(uint32_t key) {
    const int64_t now_s = epoch_ms() / 1000;
    const int64_t minute = now_s / 60;
    const int64_t oldest = minute - kHashWindowMinutes + (now_s % 60 == 0 ? 1 : 0);
    uint64_t sum = 0;
    size_t stale = 0;
    for (size_t i = 0; i + 1 < reply_.elems.size(); i += 2) {
      int64_t field = 0;
      uint64_t value = 0;
      if (!parse_int(reply_.elems[i], field) || !parse_int(reply_.elems[i + 1], value)) {
        return stats_->note_error("HGETALL: non-numeric field");
      }
      if (field >= oldest) {
        sum += value;
      } else {
        ++stale;
      }
    }
    if (sum > o_.limit) ++stats_->denied;
    if (stale > kStaleFieldsBeforeCleanup && cleanup_.empty()) {
      key_.assign("rl:").append(o_.keys->names[key]);
      append_array_header(cleanup_, 2 + stale);
      append_bulk(cleanup_, "HDEL");
      append_bulk(cleanup_, key_);
      for (size_t i = 0; i + 1 < reply_.elems.size(); i += 2) {
        int64_t field = 0;
        if (parse_int(reply_.elems[i], field) && field < oldest) {
          append_bulk(cleanup_, reply_.elems[i]);
        }
      }
    }
  }

  RedisConnOptions o_;
  Recorder& rec_;
  KeyStream& stream_;
  std::vector<Unit> units_;
  size_t head_ = 0, count_ = 0;
  uint32_t per_check_ = 1;
  std::string limit_text_;
  std::string key_;
  RespReply reply_;
  std::string cleanup_;  // an HDEL to send with the next request
};

// ---- memcached (seed 001) ----------------------------------------------------------------------

// Seed 001 (sliding window, fixed rate), as its library does it per check:
//   1. get <key>:<bucket> <key>:<bucket-1>            one multi-get of both buckets
//   2. estimate = previous * (share of the previous bucket still inside the window) + current;
//      denied when estimate + 1 > limit (nothing is written);
//   3. otherwise incr <key>:<bucket> 1; on NOT_FOUND add it with value 1 and a TTL of two
//      windows; if the add loses a race (NOT_STORED), incr again.
// Buckets are one minute (the window). Steps 1 and 3 depend on each other (the decision comes
// between them), so a check costs two round trips, three on a bucket's first hit.
class MemcachedConn final : public StreamConn {
 public:
  MemcachedConn(int fd, const MemcachedConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx.recorder->stats), o_(o), rec_(*ctx.recorder), stream_(*ctx.keys) {}
  bool has_room() const override { return state_ == State::kIdle; }
  void send(int64_t start) override {
    start_ = start;
    now_ms_ = epoch_ms();
    const int64_t bucket = now_ms_ / 60'000;
    const std::string& name = o_.keys->names[stream_.next()];
    cur_key_.assign(name).append(":").append(std::to_string(bucket));
    prev_key_.assign(name).append(":").append(std::to_string(bucket - 1));
    cur_ = prev_ = 0;
    out_.append("get ").append(cur_key_).append(" ").append(prev_key_).append("\r\n");
    state_ = State::kGet;
  }
  void on_readable(int64_t now) override {
    const bool ok = read_available();
    for (size_t guard = 0; guard < 1'000'000 && state_ != State::kIdle; ++guard) {
      const std::string_view in = pending_input();
      const size_t eol = in.find("\r\n");
      if (eol == std::string_view::npos) break;
      const std::string_view line = in.substr(0, eol);
      size_t used = eol + 2;
      if (state_ == State::kGet && line.starts_with("VALUE ")) {
        // VALUE <key> <flags> <bytes>\r\n<data>\r\n
        const size_t sp3 = line.rfind(' ');
        size_t bytes = 0;
        if (!parse_int(line.substr(sp3 + 1), bytes)) {
          stats_->note_error("memcached: bad VALUE line");
          fail();
          return;
        }
        if (in.size() < used + bytes + 2) break;  // data not complete yet
        const std::string_view key = line.substr(6, line.find(' ', 6) - 6);
        uint64_t v = 0;
        if (!parse_int(in.substr(used, bytes), v)) stats_->note_error("memcached: bad value");
        (key == cur_key_ ? cur_ : prev_) = v;
        used += bytes + 2;
      } else {
        handle_line(line, now);
      }
      consume(used);
    }
    flush();
    if (!ok) fail();
  }

 private:
  enum class State { kIdle, kGet, kIncr, kAdd, kIncrAgain };

  void handle_line(std::string_view line, int64_t now) {
    if (line == "ERROR" || line.starts_with("CLIENT_ERROR") || line.starts_with("SERVER_ERROR")) {
      stats_->note_error("memcached: " + std::string(line));
      finish(now);
      return;
    }
    uint64_t v = 0;
    switch (state_) {
      case State::kGet: {
        if (line != "END") return stats_->note_error("memcached: unexpected get reply");
        const double into = static_cast<double>(now_ms_ % 60'000) / 60'000.0;
        const double estimate =
            static_cast<double>(prev_) * (1.0 - into) + static_cast<double>(cur_);
        if (estimate + 1 > static_cast<double>(o_.limit)) {
          ++stats_->denied;
          finish(now);
          return;
        }
        out_.append("incr ").append(cur_key_).append(" 1\r\n");
        state_ = State::kIncr;
        return;
      }
      case State::kIncr:
      case State::kIncrAgain:
        if (parse_int(line, v)) return finish(now);
        if (line == "NOT_FOUND" && state_ == State::kIncr) {
          out_.append("add ")
              .append(cur_key_)
              .append(" 0 ")
              .append(std::to_string(kMemcachedBucketTtlS))
              .append(" 1\r\n1\r\n");
          state_ = State::kAdd;
          return;
        }
        stats_->note_error("memcached: unexpected incr reply " + std::string(line));
        return finish(now);
      case State::kAdd:
        if (line == "STORED") return finish(now);
        if (line == "NOT_STORED") {
          out_.append("incr ").append(cur_key_).append(" 1\r\n");
          state_ = State::kIncrAgain;
          return;
        }
        stats_->note_error("memcached: unexpected add reply " + std::string(line));
        return finish(now);
      case State::kIdle:
        stats_->note_error("memcached: reply with nothing in flight");
        return;
    }
  }
  void finish(int64_t now) {
    rec_.complete(start_, now, 1);
    state_ = State::kIdle;
  }

  MemcachedConnOptions o_;
  Recorder& rec_;
  KeyStream& stream_;
  State state_ = State::kIdle;
  int64_t start_ = 0;
  int64_t now_ms_ = 0;
  std::string cur_key_, prev_key_;
  uint64_t cur_ = 0, prev_ = 0;
};

// ---- blocking helpers for setup -----------------------------------------------------------------

class SyncClient {
 public:
  ~SyncClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  std::string connect(uint16_t port, int timeout_ms) {
    std::string err;
    fd_ = tcp_connect(port, timeout_ms, err);
    return err;
  }
  std::string send_all(std::string_view data, int timeout_ms) {
    size_t off = 0;
    const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return std::string("send: ") + std::strerror(errno);
      }
      if (now_ns() > deadline) return "send timed out";
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, 10);
    }
    return "";
  }
  // Reads until done(buf) is true, EOF (then `eof` is set) or the timeout.
  std::string read_until(const std::function<bool(std::string_view)>& done, int timeout_ms,
                         bool* eof = nullptr) {
    const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
    char tmp[65'536];
    while (!done(buf)) {
      const int64_t left_ms = (deadline - now_ns()) / 1'000'000;
      if (left_ms <= 0) return "timed out waiting for a reply";
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 100))) <= 0) continue;
      const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n > 0) {
        buf.append(tmp, static_cast<size_t>(n));
      } else if (n == 0) {
        if (eof) *eof = true;
        return done(buf) ? "" : "connection closed";
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return std::string("recv: ") + std::strerror(errno);
      }
    }
    return "";
  }
  int fd() const { return fd_; }
  std::string buf;

 private:
  int fd_ = -1;
};

// Counts complete RESP replies at the front of `in` (stops at the first incomplete one); sets
// `bad` on a malformed or error reply.
size_t count_resp_replies(std::string_view in, bool& bad) {
  RespReply r;
  size_t n = 0;
  bad = false;
  while (!in.empty()) {
    const long used = parse_resp(in, r);
    if (used < 0 || (used > 0 && r.type == '-')) {
      bad = true;
      break;
    }
    if (used == 0) break;
    in.remove_prefix(static_cast<size_t>(used));
    ++n;
  }
  return n;
}

}  // namespace

// ---- factories ---------------------------------------------------------------------------------

std::unique_ptr<Conn> make_sluice_udp(const SluiceConnOptions& o, ThreadContext& ctx) {
  std::string err;
  const int fd = udp_connect(o.port, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<SluiceUdpConn>(fd, o, ctx);
}

std::unique_ptr<Conn> make_sluice_tcp(const SluiceConnOptions& o, ThreadContext& ctx) {
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<SluiceTcpConn>(fd, o, ctx);
}

std::unique_ptr<Conn> make_redis(const RedisConnOptions& o, ThreadContext& ctx) {
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<RedisConn>(fd, o, ctx);
}

std::unique_ptr<Conn> make_memcached(const MemcachedConnOptions& o, ThreadContext& ctx) {
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<MemcachedConn>(fd, o, ctx);
}

// ---- probes and setup ---------------------------------------------------------------------------

std::string echo_probe(const std::string& transport, uint16_t port, int timeout_ms) {
  const std::string ping = "sluice-bench echo probe";
  std::string err;
  const int fd = transport == "udp" ? udp_connect(port, err) : tcp_connect(port, timeout_ms, err);
  if (fd < 0) return err;
  std::string got;
  const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
  bool sent = false;
  // Bounded: UDP resends every 100 ms (a datagram may go before the server binds); TCP sends once.
  while (now_ns() < deadline && got.size() < ping.size()) {
    if (!sent || transport == "udp") {
      if (::send(fd, ping.data(), ping.size(), MSG_NOSIGNAL) < 0 && transport == "tcp") {
        err = std::string("send: ") + std::strerror(errno);
        break;
      }
      sent = true;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0 && transport == "tcp") {
      err = "connection closed";
      break;
    }
    if (n > 0) got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (got.substr(0, ping.size()) == ping) return "";
  return err.empty() ? "no echo" : err;
}

std::string sluice_probe(uint16_t port, int timeout_ms) {
  const wire::Entry entry{kSluiceEntryKey, "probe"};
  const wire::Check check{kSluiceDomain, std::span<const wire::Entry>(&entry, 1), 0};
  std::vector<uint8_t> msg, frame;
  wire::encode_request(1, std::span<const wire::Check>(&check, 1), 512, msg);
  wire::Answer answer;

  SyncClient tcp;
  if (std::string e = tcp.connect(port, timeout_ms); !e.empty()) return "tcp: " + e;
  wire::append_frame(msg, frame);
  if (std::string e =
          tcp.send_all({reinterpret_cast<const char*>(frame.data()), frame.size()}, timeout_ms);
      !e.empty()) {
    return "tcp: " + e;
  }
  wire::FrameReader reader;
  std::optional<std::span<const uint8_t>> got;
  const std::string e = tcp.read_until(
      [&](std::string_view b) {
        if (b.empty()) return false;
        reader.feed({reinterpret_cast<const uint8_t*>(b.data()), b.size()});
        tcp.buf.clear();
        got = reader.next();
        return got.has_value();
      },
      timeout_ms);
  if (!e.empty()) return "tcp: " + e;
  if (wire::decode_answer(*got, answer) != wire::Code::kOk || answer.code != wire::Code::kOk ||
      answer.decisions.size() != 1 || answer.decisions[0].code != wire::Code::kOk) {
    return "tcp: unexpected answer to a probe check (is domain \"bench\" in the rules?)";
  }

  std::string err;
  const int u = udp_connect(port, err);
  if (u < 0) return err;
  std::vector<uint8_t> buf(65'536);
  const int64_t deadline = now_ns() + int64_t{timeout_ms} * 1'000'000;
  std::string result = "udp: no answer";
  // Bounded: one datagram per 100 ms until the deadline.
  while (now_ns() < deadline) {
    if (::send(u, msg.data(), msg.size(), 0) < 0) {
      result = std::string("udp send: ") + std::strerror(errno);
    }
    pollfd p{u, POLLIN, 0};
    if (::poll(&p, 1, 100) == 1) {
      const ssize_t n = ::recv(u, buf.data(), buf.size(), 0);
      if (n > 0 &&
          wire::decode_answer({buf.data(), static_cast<size_t>(n)}, answer) == wire::Code::kOk &&
          answer.code == wire::Code::kOk) {
        result.clear();
        break;
      }
    }
  }
  ::close(u);
  return result;
}

std::string http_get(uint16_t port, const std::string& path, std::string& body) {
  SyncClient c;
  if (std::string e = c.connect(port, 1000); !e.empty()) return e;
  const std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (std::string e = c.send_all(req, 1000); !e.empty()) return e;
  bool eof = false;
  const std::string e = c.read_until([&](std::string_view) { return eof; }, 3000, &eof);
  if (!eof) return e.empty() ? "no end of response" : e;
  const size_t hdr_end = c.buf.find("\r\n\r\n");
  if (!c.buf.starts_with("HTTP/1.") || hdr_end == std::string::npos) return "not an HTTP answer";
  body = c.buf.substr(hdr_end + 4);
  return "";
}

std::string redis_probe(uint16_t port, int timeout_ms) {
  SyncClient c;
  if (std::string e = c.connect(port, timeout_ms); !e.empty()) return e;
  if (std::string e = c.send_all("PING\r\n", timeout_ms); !e.empty()) return e;
  if (std::string e =
          c.read_until([](std::string_view b) { return b.find("\r\n") != b.npos; }, timeout_ms);
      !e.empty()) {
    return e;
  }
  return c.buf.starts_with("+PONG") ? "" : "unexpected PING reply: " + c.buf;
}

std::string redis_command(uint16_t port, const std::vector<std::string>& args, std::string& reply) {
  SyncClient c;
  if (std::string e = c.connect(port, 2000); !e.empty()) return e;
  std::string cmd;
  append_array_header(cmd, args.size());
  for (const std::string& a : args)
    append_bulk(cmd, a);
  if (std::string e = c.send_all(cmd, 2000); !e.empty()) return e;
  RespReply r;
  if (std::string e =
          c.read_until([&](std::string_view b) { return parse_resp(b, r) != 0; }, 10'000);
      !e.empty()) {
    return e;
  }
  if (parse_resp(c.buf, r) <= 0) return "malformed reply";
  switch (r.type) {
    case ':':
      reply = ":" + std::to_string(r.integer);
      break;
    case '$':
      reply = "$" + std::string(r.text);
      break;
    case '*':
      reply = "*" + std::to_string(r.elems.size());
      break;
    default:
      reply = std::string(1, r.type) + std::string(r.text);
  }
  return r.type == '-' ? "redis: " + std::string(r.text) : "";
}

std::string redis_preload_minutes(uint16_t port, const Keyspace& keys, int64_t now_ms) {
  SyncClient c;
  if (std::string e = c.connect(port, 2000); !e.empty()) return e;
  const int64_t minute = now_ms / 60'000;
  std::vector<std::string> fields;
  for (int64_t m = minute - kHashWindowMinutes; m < minute; ++m)
    fields.push_back(std::to_string(m));
  constexpr size_t kChunk = 500;
  // Bounded: keys / kChunk round trips.
  for (size_t first = 0; first < keys.names.size(); first += kChunk) {
    const size_t last = std::min(keys.names.size(), first + kChunk);
    std::string cmds;
    for (size_t i = first; i < last; ++i) {
      const std::string key = "rl:" + keys.names[i];
      append_array_header(cmds, 2 + 2 * fields.size());
      append_bulk(cmds, "HSET");
      append_bulk(cmds, key);
      for (const std::string& f : fields) {
        append_bulk(cmds, f);
        append_bulk(cmds, "1");
      }
      append_command(cmds, {"EXPIRE", key, "3600"});
    }
    if (std::string e = c.send_all(cmds, 10'000); !e.empty()) return e;
    const size_t want = 2 * (last - first);
    bool bad = false;
    if (std::string e = c.read_until(
            [&](std::string_view b) { return count_resp_replies(b, bad) >= want || bad; }, 10'000);
        !e.empty()) {
      return e;
    }
    if (bad) return "malformed or error reply while preloading: " + c.buf.substr(0, 200);
    c.buf.clear();
  }
  return "";
}

std::string memcached_probe(uint16_t port, int timeout_ms, std::string* version) {
  SyncClient c;
  if (std::string e = c.connect(port, timeout_ms); !e.empty()) return e;
  if (std::string e = c.send_all("version\r\n", timeout_ms); !e.empty()) return e;
  if (std::string e =
          c.read_until([](std::string_view b) { return b.find("\r\n") != b.npos; }, timeout_ms);
      !e.empty()) {
    return e;
  }
  if (!c.buf.starts_with("VERSION ")) return "unexpected version reply: " + c.buf;
  if (version) *version = c.buf.substr(8, c.buf.find("\r\n") - 8);
  return "";
}

std::string memcached_flush_all(uint16_t port) {
  SyncClient c;
  if (std::string e = c.connect(port, 2000); !e.empty()) return e;
  if (std::string e = c.send_all("flush_all\r\n", 2000); !e.empty()) return e;
  if (std::string e =
          c.read_until([](std::string_view b) { return b.find("\r\n") != b.npos; }, 5000);
      !e.empty()) {
    return e;
  }
  return c.buf.starts_with("OK") ? "" : "unexpected flush_all reply: " + c.buf;
}

std::string memcached_preload_previous(uint16_t port, const Keyspace& keys, int64_t now_ms) {
  SyncClient c;
  if (std::string e = c.connect(port, 2000); !e.empty()) return e;
  const std::string prev = std::to_string(now_ms / 60'000 - 1);
  std::string cmds;
  for (const std::string& name : keys.names) {
    cmds.append("set ")
        .append(name)
        .append(":")
        .append(prev)
        .append(" 0 ")
        .append(std::to_string(kMemcachedBucketTtlS))
        .append(" 1 noreply\r\n1\r\n");
  }
  cmds.append("version\r\n");  // the answer to this says every set before it was handled
  if (std::string e = c.send_all(cmds, 10'000); !e.empty()) return e;
  if (std::string e = c.read_until(
          [](std::string_view b) { return b.find("VERSION") != b.npos && b.ends_with("\r\n"); },
          10'000);
      !e.empty()) {
    return e;
  }
  return c.buf.starts_with("VERSION") ? "" : "unexpected reply while preloading: " + c.buf;
}

}  // namespace sluice::bench
