#include "load/grpc_target.h"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "load/stream_conn.h"

namespace sluice::bench {

namespace {

namespace rlspb = envoy::service::ratelimit::v3;

constexpr std::string_view kPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
// An answer larger than this is malformed (a one-descriptor answer is a few dozen bytes).
constexpr size_t kMaxAnswerBytes = 64 * 1024;

class GrpcConn final : public detail::StreamConn {
 public:
  GrpcConn(int fd, const GrpcConnOptions& o, ThreadContext& ctx)
      : StreamConn(fd, ctx, "grpc: "), o_(o), calls_(o.window) {
    for (Call& c : calls_)
      free_.push_back(&c);
    authority_ = "127.0.0.1:" + std::to_string(o.port);
    headers_ = {nv(":method", "POST"),
                nv(":scheme", "http"),
                nv(":path", kPath),
                nv(":authority", authority_),
                nv("content-type", "application/grpc"),
                nv("te", "trailers")};
    request_.set_domain(std::string(kSluiceDomain));
    entry_ = request_.add_descriptors()->add_entries();
    entry_->set_key(std::string(kSluiceEntryKey));
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
    c->body_pos = 0;
    c->status = 0;
    c->grpc_status = -1;
    c->answer.clear();
    // The request behind gRPC's 5-byte message prefix (uncompressed, big-endian length).
    entry_->set_value(o_.keys->names[keys_.next()]);
    c->body.assign(5, '\0');
    request_.AppendToString(&c->body);
    const auto n = static_cast<uint32_t>(c->body.size() - 5);
    for (int i = 0; i < 4; ++i)
      c->body[static_cast<size_t>(1 + i)] = static_cast<char>(n >> (24 - 8 * i));
    nghttp2_data_provider data{};
    data.source.ptr = c;
    data.read_callback = &GrpcConn::read_body;
    const int32_t id =
        nghttp2_submit_request(session_, nullptr, headers_.data(), headers_.size(), &data, c);
    if (id < 0) {
      stats_->note_error(std::string("grpc: submit: ") + nghttp2_strerror(id));
      free_.push_back(c);
      fail();
      return;
    }
    pump();
  }

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

  // nghttp2 takes all of the input; its callbacks finish the calls.
  size_t parse(std::string_view in, int64_t now) override {
    now_ = now;
    const ssize_t used =
        nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(in.data()), in.size());
    if (used < 0) {
      stats_->note_error(std::string("grpc: HTTP/2: ") + nghttp2_strerror(static_cast<int>(used)));
      fail();
      return 0;
    }
    pump();
    return static_cast<size_t>(used);
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
    const std::string v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":status") {
      c->status = std::atoi(v.c_str());
    } else if (n == "grpc-status") {
      c->grpc_status = std::atoi(v.c_str());
    } else if (n == "grpc-message") {
      c->answer = v;  // an error's message (an error has no DATA)
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
    if (c != nullptr) static_cast<GrpcConn*>(user)->finish(*c, error_code);
    return 0;
  }

  void finish(Call& c, uint32_t error_code) {
    free_.push_back(&c);
    std::string why;
    if (error_code != NGHTTP2_NO_ERROR) {
      why = "stream reset (HTTP/2 error " + std::to_string(error_code) + ")";
    } else if (c.status != 200) {
      why = "HTTP status " + std::to_string(c.status);
    } else if (c.grpc_status != 0) {
      why = "grpc-status " + std::to_string(c.grpc_status) + ": " + c.answer;
    } else if (c.answer.size() < 5 || c.answer[0] != 0) {
      why = "answer without an uncompressed gRPC message";
    } else if (!answer_.ParseFromArray(c.answer.data() + 5,
                                       static_cast<int>(c.answer.size() - 5))) {
      why = "answer is not a RateLimitResponse";
    } else if (answer_.statuses_size() != 1) {
      why = "answer with " + std::to_string(answer_.statuses_size()) + " statuses for 1 descriptor";
    } else if (answer_.overall_code() != rlspb::RateLimitResponse::OK &&
               answer_.overall_code() != rlspb::RateLimitResponse::OVER_LIMIT) {
      why = "overall_code " + std::to_string(answer_.overall_code());
    }
    if (!why.empty()) return stats_->note_error("grpc: " + why);
    if (answer_.overall_code() == rlspb::RateLimitResponse::OVER_LIMIT) ++stats_->denied;
    rec_.complete(c.start_ns, now_, 1, c.body.size(), c.answer.size());
  }

  GrpcConnOptions o_;
  std::string authority_;
  std::array<nghttp2_nv, 6> headers_{};  // of every call
  rlspb::RateLimitRequest request_;      // the same every call but for the entry's value
  envoy::extensions::common::ratelimit::v3::RateLimitDescriptor::Entry* entry_ = nullptr;
  rlspb::RateLimitResponse answer_;
  nghttp2_session* session_ = nullptr;
  std::vector<Call> calls_;  // one per stream in flight; never reallocated
  std::vector<Call*> free_;
  int64_t now_ = 0;
  bool goaway_ = false;
};

}  // namespace

std::unique_ptr<Conn> make_grpc(const GrpcConnOptions& o, ThreadContext& ctx) {
  return detail::connect_stream<GrpcConn>(o, ctx);
}

std::string grpc_probe(uint16_t port, int timeout_ms) {
  GrpcConnOptions o;
  o.port = port;
  return probe_conn(o, &make_grpc, timeout_ms);
}

}  // namespace sluice::bench
