#include "load/grpc_target.h"

#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "load/stream_conn.h"

namespace sluice::bench {

namespace {

constexpr std::string_view kPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
// An answer larger than this is malformed (a one-descriptor answer is a few dozen bytes).
constexpr size_t kMaxAnswerBytes = 64 * 1024;

// ---- protobuf, by hand ------------------------------------------------------------------------

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_bytes(std::string& out, uint8_t tag, std::string_view s) {
  out.push_back(static_cast<char>(tag));
  put_varint(out, s.size());
  out.append(s);
}

// RateLimitRequest{domain: 1, descriptors: 2 [RateLimitDescriptor{entries: 1 [Entry{key: 1,
// value: 2}]}]}, behind gRPC's 5-byte message prefix (uncompressed, big-endian length).
void encode_call(std::string& out, std::string_view domain, std::string_view key,
                 std::string_view value) {
  std::string entry, descriptor, request;
  put_bytes(entry, 0x0a, key);
  put_bytes(entry, 0x12, value);
  put_bytes(descriptor, 0x0a, entry);
  put_bytes(request, 0x0a, domain);
  put_bytes(request, 0x12, descriptor);
  out.clear();
  out.push_back(0);
  const auto n = static_cast<uint32_t>(request.size());
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((n >> shift) & 0xff));
  out.append(request);
}

bool get_varint(std::string_view& in, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto b = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// The overall_code (field 1) and the number of statuses (field 2) of a RateLimitResponse; the
// other fields are skipped. False when it is not protobuf.
bool read_answer(std::string_view in, uint64_t& overall, size_t& statuses) {
  overall = 0;
  statuses = 0;
  // Bounded by the input: each pass consumes at least one byte.
  while (!in.empty()) {
    uint64_t tag = 0;
    if (!get_varint(in, tag)) return false;
    const uint64_t field = tag >> 3;
    switch (tag & 7) {
      case 0: {
        uint64_t v = 0;
        if (!get_varint(in, v)) return false;
        if (field == 1) overall = v;
        break;
      }
      case 2: {
        uint64_t len = 0;
        if (!get_varint(in, len) || len > in.size()) return false;
        in.remove_prefix(len);
        if (field == 2) ++statuses;
        break;
      }
      case 1:
        if (in.size() < 8) return false;
        in.remove_prefix(8);
        break;
      case 5:
        if (in.size() < 4) return false;
        in.remove_prefix(4);
        break;
      default:
        return false;
    }
  }
  return true;
}

// ---- the connection ---------------------------------------------------------------------------

class GrpcConn final : public detail::StreamConn {
 public:
  GrpcConn(int fd, const GrpcConnOptions& o, RowStats* stats, Recorder* rec, KeyStream* keys)
      : StreamConn(fd, stats, detail::StreamConnOptions{64 * 1024, SIZE_MAX, "grpc: "}),
        o_(o),
        rec_(rec),
        keys_(keys),
        calls_(o.window) {
    for (Call& c : calls_)
      free_.push_back(&c);
    authority_ = "127.0.0.1:" + std::to_string(o.port);
    nghttp2_session_callbacks* cb = nullptr;
    if (nghttp2_session_callbacks_new(&cb) != 0) throw std::runtime_error("nghttp2: no memory");
    nghttp2_session_callbacks_set_on_header_callback(cb, &GrpcConn::on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &GrpcConn::on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, &GrpcConn::on_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, &GrpcConn::on_frame);
    const int rv = nghttp2_session_client_new(&session_, cb, this);
    nghttp2_session_callbacks_del(cb);
    if (rv != 0) throw std::runtime_error("nghttp2_session_client_new failed");
    // A window the answers never fill, so the client's WINDOW_UPDATEs are rare.
    const nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                         {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 24}};
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, iv, 2);
    nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, 1 << 30);
    pump();
    flush();
  }
  ~GrpcConn() override { nghttp2_session_del(session_); }

  bool has_room() const override { return !free_.empty() && !failed_ && !goaway_; }

  void send(int64_t start_ns) override {
    Call* c = free_.back();
    free_.pop_back();
    c->start_ns = start_ns;
    c->status = 0;
    c->grpc_status = -1;
    c->answer.clear();
    c->body_pos = 0;
    encode_call(c->body, o_.domain, o_.entry_key, o_.keys->names[keys_->next()]);
    const nghttp2_nv hdrs[] = {
        nv(":method", "POST"),
        nv(":scheme", "http"),
        nv(":path", kPath),
        nv(":authority", authority_),
        nv("content-type", "application/grpc"),
        nv("te", "trailers"),
    };
    nghttp2_data_provider data{};
    data.source.ptr = c;
    data.read_callback = &GrpcConn::read_body;
    const int32_t id = nghttp2_submit_request(session_, nullptr, hdrs, std::size(hdrs), &data, c);
    if (id < 0) {
      stats_->note_error(std::string("grpc: submit: ") + nghttp2_strerror(id));
      free_.push_back(c);
      fail();
      return;
    }
    pump();
  }

  void on_readable(int64_t now) override {
    now_ = now;
    const ReadResult r = read_some();
    const std::string_view in = pending_input();
    if (!in.empty()) {
      const ssize_t used = nghttp2_session_mem_recv(
          session_, reinterpret_cast<const uint8_t*>(in.data()), in.size());
      if (used < 0) {
        stats_->note_error(std::string("grpc: HTTP/2: ") +
                           nghttp2_strerror(static_cast<int>(used)));
        fail();
        return;
      }
      consume(static_cast<size_t>(used));
    }
    if (r == ReadResult::kPeerClosed) {
      stats_->note_error("grpc: connection closed by the server");
      fail();
      return;
    }
    pump();
    flush();
  }

  // The blocking probe's view: the last call's outcome.
  const std::string& last_error() const { return last_error_; }
  uint64_t answered() const { return answered_; }

 private:
  struct Call {
    int64_t start_ns = 0;
    std::string body;  // the request, prefix included
    size_t body_pos = 0;
    int status = 0;        // :status
    int grpc_status = -1;  // from the trailers (or a trailers-only answer)
    std::string answer;    // DATA received
  };

  static nghttp2_nv nv(std::string_view name, std::string_view value) {
    return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
            reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
            NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE};
  }

  // Moves what nghttp2 has to send into the output buffer (flush() writes it).
  void pump() {
    // Bounded: each pass takes a chunk nghttp2 produced; it stops when it has none.
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        stats_->note_error(std::string("grpc: HTTP/2 send: ") +
                           nghttp2_strerror(static_cast<int>(n)));
        fail();
        return;
      }
      if (n == 0) return;
      out_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
  }

  static ssize_t read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                           nghttp2_data_source* source, void*) {
    auto* c = static_cast<Call*>(source->ptr);
    const size_t n = std::min(length, c->body.size() - c->body_pos);
    std::memcpy(buf, c->body.data() + c->body_pos, n);
    c->body_pos += n;
    if (c->body_pos == c->body.size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
    return static_cast<ssize_t>(n);
  }

  static int on_header(nghttp2_session* s, const nghttp2_frame* frame, const uint8_t* name,
                       size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void*) {
    auto* c = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, frame->hd.stream_id));
    if (c == nullptr) return 0;
    const std::string_view n(reinterpret_cast<const char*>(name), namelen);
    const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":status") {
      c->status = std::atoi(std::string(v).c_str());
    } else if (n == "grpc-status") {
      c->grpc_status = std::atoi(std::string(v).c_str());
    } else if (n == "grpc-message") {
      c->answer.assign(v);  // an error's message (an error has no DATA)
    }
    return 0;
  }

  static int on_data(nghttp2_session* s, uint8_t, int32_t stream_id, const uint8_t* data,
                     size_t len, void*) {
    auto* c = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, stream_id));
    if (c == nullptr) return 0;
    if (c->answer.size() + len > kMaxAnswerBytes) {
      return NGHTTP2_ERR_CALLBACK_FAILURE;  // ends the connection: noted as a protocol error
    }
    c->answer.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }

  static int on_frame(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    if (frame->hd.type == NGHTTP2_GOAWAY) {
      auto* self = static_cast<GrpcConn*>(user);
      self->goaway_ = true;
      self->stats_->note_error("grpc: GOAWAY from the server");
      self->fail();
    }
    return 0;
  }

  static int on_close(nghttp2_session* s, int32_t stream_id, uint32_t error_code, void* user) {
    auto* c = static_cast<Call*>(nghttp2_session_get_stream_user_data(s, stream_id));
    if (c == nullptr) return 0;
    static_cast<GrpcConn*>(user)->finish(*c, error_code);
    return 0;
  }

  void finish(Call& c, uint32_t error_code) {
    free_.push_back(&c);
    std::string why;
    uint64_t overall = 0;
    size_t statuses = 0;
    if (error_code != NGHTTP2_NO_ERROR) {
      why = "stream reset (HTTP/2 error " + std::to_string(error_code) + ")";
    } else if (c.status != 200) {
      why = "HTTP status " + std::to_string(c.status);
    } else if (c.grpc_status != 0) {
      why = "grpc-status " + std::to_string(c.grpc_status) + ": " + c.answer;
    } else if (c.answer.size() < 5 || c.answer[0] != 0) {
      why = "answer without an uncompressed gRPC message";
    } else if (!read_answer(std::string_view(c.answer).substr(5), overall, statuses)) {
      why = "answer is not a RateLimitResponse";
    } else if (statuses != 1) {
      why = "answer with " + std::to_string(statuses) + " statuses for 1 descriptor";
    } else if (overall != 1 && overall != 2) {
      why = "overall_code " + std::to_string(overall);
    }
    if (!why.empty()) {
      last_error_ = why;
      stats_->note_error("grpc: " + why);
      return;
    }
    ++answered_;
    last_error_.clear();
    if (overall == 2) ++stats_->denied;
    rec_->complete(c.start_ns, now_, 1, c.body.size(), c.answer.size());
  }

  GrpcConnOptions o_;
  Recorder* rec_;
  KeyStream* keys_;
  std::string authority_;
  nghttp2_session* session_ = nullptr;
  std::vector<Call> calls_;  // one per stream in flight; never reallocated
  std::vector<Call*> free_;
  int64_t now_ = 0;
  bool goaway_ = false;
  std::string last_error_ = "not answered";
  uint64_t answered_ = 0;
};

}  // namespace

std::unique_ptr<Conn> make_grpc(const GrpcConnOptions& o, ThreadContext& ctx) {
  if (o.port == 0) throw std::runtime_error("grpc target: no port");
  if (o.keys == nullptr || o.keys->names.empty()) throw std::runtime_error("grpc target: no keys");
  if (o.window == 0) throw std::runtime_error("grpc target: window 0");
  std::string err;
  const int fd = tcp_connect(o.port, 2000, err);
  if (fd < 0) throw std::runtime_error(err);
  return std::make_unique<GrpcConn>(fd, o, ctx.recorder->stats, ctx.recorder, ctx.keys);
}

std::string grpc_probe(uint16_t port, int timeout_ms, std::string_view domain,
                       std::string_view entry_key) {
  GrpcConnOptions o;
  o.port = port;
  o.domain = domain;
  o.entry_key = entry_key;
  return probe_conn(
      [&](const Keyspace& keys, ThreadContext& ctx) {
        o.keys = &keys;
        return make_grpc(o, ctx);
      },
      timeout_ms);
}

}  // namespace sluice::bench
