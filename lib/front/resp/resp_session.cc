// The RESP session's machinery (resp_session.h): reply slots in request order, the command
// loop with redis-server's checks in its order (name, subcommand, arity, authentication, then
// queue or run), and MULTI's queue. What each command does is in resp_commands.cc.
#include <algorithm>
#include <charconv>

#include "front/resp/resp_session.h"
#include "front/resp/session_core.h"

namespace sluice::front::resp {
namespace detail {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return (x >= 'A' && x <= 'Z' ? x | 0x20 : x) == (y >= 'A' && y <= 'Z' ? y | 0x20 : y);
  });
}

// redis's commandCheckExistence: the name and the first arguments, each cut at 128 bytes.
void unknown_command_text(std::span<const std::string_view> args, std::string& out) {
  out.assign("ERR unknown command '");
  out.append(args[0].substr(0, 128));
  out.append("', with args beginning with: ");
  const size_t start = out.size();
  for (size_t i = 1; i < args.size() && out.size() - start < 128; ++i) {
    out.push_back('\'');
    out.append(args[i].substr(0, 128 - (out.size() - start - 1)));
    out.append("' ");
  }
}

void encode(RespWriter& w, const ThrottleAnswer& a) {
  w.array(5);
  w.integer(a.limited);
  w.integer(a.limit);
  w.integer(a.remaining);
  w.integer(a.retry_after_s);
  w.integer(a.reset_after_s);
}

void encode(RespWriter& w, const int64_t& n) {
  w.integer(n);
}

void encode(RespWriter& w, const bool& released) {
  w.integer(released ? 1 : 0);
}

void encode_check(RespWriter& w, const CheckAnswer& a, size_t fields) {
  const bool map = w.protocol() == Protocol::kResp3;
  if (map) {
    w.map(fields);
  } else {
    w.array(fields);
  }
  const auto field = [&](std::string_view name, int64_t v) {
    if (map) w.bulk(name);
    w.integer(v);
  };
  field("allowed", a.allowed ? 1 : 0);
  field("limit", a.limit);
  field("remaining", a.remaining);
  field("retry_after_s", a.retry_after_s);
  field("reset_s", a.reset_s);
  field("shadow", a.shadow ? 1 : 0);
  field("would_deny", a.would_deny ? 1 : 0);
}

void encode(RespWriter& w, const CheckAnswer& a) {
  encode_check(w, a, 7);
}

void encode(RespWriter& w, const LeaseAnswer& a) {
  encode_check(w, a.check, 8);
  if (w.protocol() == Protocol::kResp3) w.bulk("lease");
  if (a.lease == 0) return w.null();
  char hex[16];
  for (int i = 0; i < 16; ++i)
    hex[i] = "0123456789abcdef"[(a.lease >> (60 - 4 * i)) & 0xf];
  w.bulk({hex, sizeof(hex)});
}

}  // namespace

SessionCore::SessionCore(const Config& c, Backend& b, RespCounters& n, uint64_t id,
                         std::function<void()> wake)
    : config(c),
      backend(b),
      counters(n),
      client_id(id),
      authenticated(c.password.empty()),
      wake_(std::move(wake)) {}

size_t SessionCore::feed(std::string_view input) {
  in_feed_ = true;
  size_t total = 0;
  while (!closing_) {
    size_t consumed = 0;
    const auto status = parser_.next(input, consumed, authenticated);
    total += consumed;
    if (status == RespParser::Status::kNeedMore) break;
    if (status == RespParser::Status::kError) {
      counters.protocol_errors[static_cast<size_t>(parser_.error())].fetch_add(
          1, std::memory_order_relaxed);
      error_text(parser_.error(), parser_.error_byte(), error_scratch_);
      writer().error(error_scratch_);
      closing_ = true;
      break;
    }
    dispatch(parser_.args());
    input.remove_prefix(consumed);
  }
  backend.flush();
  in_feed_ = false;
  return total;
}

SessionCore::Slot& SessionCore::push_slot(bool filled) {
  if (count_ == slots_.size()) {
    std::vector<Slot> grown(std::max<size_t>(8, 2 * slots_.size()));
    for (size_t i = 0; i < count_; ++i)
      grown[i] = std::move(slots_[(head_ + i) % slots_.size()]);
    slots_ = std::move(grown);
    head_ = 0;
  }
  Slot& s = slots_[(head_ + count_++) % slots_.size()];
  s.seq = next_seq_++;
  s.filled = filled;
  s.protocol = protocol;
  s.bytes.clear();
  return s;
}

RespWriter SessionCore::writer() {
  if (count_ == 0) return {output, protocol};
  Slot& back = slots_[(head_ + count_ - 1) % slots_.size()];
  if (back.filled) return {back.bytes, protocol};
  return {push_slot(true).bytes, protocol};
}

void SessionCore::flush() {
  while (count_ > 0 && slots_[head_].filled) {
    output.append(slots_[head_].bytes);
    slots_[head_].bytes.clear();
    head_ = (head_ + 1) % slots_.size();
    --count_;
  }
}

template <class T>
Answer<T> SessionCore::await() {
  const Slot& s = push_slot(false);
  ++awaited_;
  return Answer<T>(weak_from_this(), s.seq);
}

template <class T>
void SessionCore::fill(uint64_t seq, const T* value, std::string_view error) {
  size_t i = 0;
  while (i < count_ && slots_[(head_ + i) % slots_.size()].seq != seq)
    ++i;
  if (i == count_) return;
  Slot& s = slots_[(head_ + i) % slots_.size()];
  if (s.filled) return;
  // The oldest slot writes straight into the output; a later one waits in its own bytes.
  RespWriter w(i == 0 ? output : s.bytes, s.protocol);
  if (value != nullptr) {
    encode(w, *value);
  } else {
    w.error(error);
  }
  s.filled = true;
  --awaited_;
  if (i == 0) {
    head_ = (head_ + 1) % slots_.size();
    --count_;
  }
  flush();
  if (!in_feed_ && !output.empty() && wake_) wake_();
}

void SessionCore::multi_error(std::string_view text) {
  writer().error(text);
  if (in_multi) multi_failed_ = true;
}

void SessionCore::dispatch(std::span<const std::string_view> args) {
  counters.commands.fetch_add(1, std::memory_order_relaxed);
  if (iequals(args[0], "post") || iequals(args[0], "host:")) {
    counters.protocol_errors[static_cast<size_t>(ProtocolError::kCrossProtocol)].fetch_add(
        1, std::memory_order_relaxed);
    closing_ = true;
    return;
  }
  const CommandSpec* spec = find_command(args[0]);
  if (spec == nullptr) {
    counters.unknown_commands.fetch_add(1, std::memory_order_relaxed);
    unknown_command_text(args, error_scratch_);
    return multi_error(error_scratch_);
  }
  if (!spec->subcommands.empty() && args.size() >= 2) {
    const CommandSpec* sub = find_subcommand(*spec, args[1]);
    if (sub == nullptr) {
      error_scratch_.assign("ERR unknown subcommand '");
      error_scratch_.append(args[1].substr(0, 128));
      error_scratch_.append("'. Try ");
      for (const char c : spec->name)
        error_scratch_.push_back(c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c);
      error_scratch_.append(" HELP.");
      return multi_error(error_scratch_);
    }
    spec = sub;
  }
  const auto argc = static_cast<int>(args.size());
  std::string_view arity_error;
  if (spec->own_arity != nullptr) {
    arity_error = spec->own_arity(args);
  } else if ((spec->arity > 0 && spec->arity != argc) || argc < -spec->arity) {
    error_scratch_.assign("ERR wrong number of arguments for '");
    error_scratch_.append(spec->name);
    error_scratch_.append("' command");
    arity_error = error_scratch_;
  }
  if (arity_error.empty() && !authenticated && (spec->flags & kNoAuth) == 0)
    arity_error = "NOAUTH Authentication required.";
  const bool is_exec = spec->name == "exec";
  if (!arity_error.empty()) {
    if (is_exec) {  // redis's execCommandAbort: any refused EXEC, in MULTI or not
      std::string text = "EXECABORT Transaction discarded because of: ";
      // Redis's arity text has no code of its own (it gets ERR when sent alone).
      text.append(arity_error.substr(arity_error.rfind("ERR ", 0) == 0 ? 4 : 0));
      discard_multi();
      return writer().error(text);
    }
    return multi_error(arity_error);
  }
  if (in_multi && !is_exec && spec->name != "discard" && spec->name != "multi" &&
      spec->name != "quit")
    return queue(args);
  spec->run(*this, args);
}

void SessionCore::queue(std::span<const std::string_view> args) {
  size_t bytes = 0;
  for (const std::string_view a : args)
    bytes += a.size();
  if (queued_argc_.size() >= kMaxQueuedCommands || queued_bytes_.size() + bytes > kMaxQueuedBytes)
    return multi_error("ERR too many commands in the transaction");
  for (const std::string_view a : args) {
    queued_bytes_.append(a);
    queued_sizes_.push_back(static_cast<uint32_t>(a.size()));
  }
  queued_argc_.push_back(static_cast<uint32_t>(args.size()));
  writer().simple("QUEUED");
}

void SessionCore::discard_multi() {
  in_multi = false;
  multi_failed_ = false;
  queued_bytes_.clear();
  queued_sizes_.clear();
  queued_argc_.clear();
}

void SessionCore::exec() {
  if (!in_multi) return writer().error("ERR EXEC without MULTI");
  if (multi_failed_) {
    discard_multi();
    return writer().error("EXECABORT Transaction discarded because of previous errors.");
  }
  in_multi = false;
  writer().array(queued_argc_.size());
  // The queue is moved out: a queued command runs as if sent now, and may not queue again.
  std::string bytes = std::move(queued_bytes_);
  size_t offset = 0, arg = 0;
  for (const uint32_t argc : queued_argc_) {
    exec_args_.clear();
    for (uint32_t i = 0; i < argc; ++i, ++arg) {
      exec_args_.emplace_back(bytes.data() + offset, queued_sizes_[arg]);
      offset += queued_sizes_[arg];
    }
    const CommandSpec* spec = find_command(exec_args_[0]);
    if (!spec->subcommands.empty() && exec_args_.size() >= 2)
      spec = find_subcommand(*spec, exec_args_[1]);
    spec->run(*this, exec_args_);
  }
  queued_bytes_ = std::move(bytes);  // its capacity, for the next MULTI
  discard_multi();
}

// Answer<T>: the slot handle given to the backend.
template <class T>
void answer_ok(std::weak_ptr<SessionCore>& core, uint64_t slot, const T& value) {
  if (auto c = core.lock()) c->fill(slot, &value, {});
  core.reset();
}

template <class T>
void answer_fail(std::weak_ptr<SessionCore>& core, uint64_t slot, std::string_view text) {
  if (auto c = core.lock()) c->fill<T>(slot, nullptr, text);
  core.reset();
}

template Answer<ThrottleAnswer> SessionCore::await<ThrottleAnswer>();
template Answer<int64_t> SessionCore::await<int64_t>();
template Answer<CheckAnswer> SessionCore::await<CheckAnswer>();
template Answer<LeaseAnswer> SessionCore::await<LeaseAnswer>();
template Answer<bool> SessionCore::await<bool>();

}  // namespace detail

template <class T>
Answer<T>::~Answer() {
  if (!core_.expired()) fail("ERR no answer from the rate limiter");
}

template <class T>
void Answer<T>::ok(const T& value) {
  detail::answer_ok(core_, slot_, value);
}

template <class T>
void Answer<T>::fail(std::string_view text) {
  detail::answer_fail<T>(core_, slot_, text);
}

template class Answer<ThrottleAnswer>;
template class Answer<int64_t>;
template class Answer<CheckAnswer>;
template class Answer<LeaseAnswer>;
template class Answer<bool>;

RespSession::RespSession(const Config& config, Backend& backend, RespCounters& counters,
                         uint64_t client_id, std::function<void()> wake)
    : core_(std::make_shared<detail::SessionCore>(config, backend, counters, client_id,
                                                  std::move(wake))) {}

RespSession::~RespSession() = default;

size_t RespSession::feed(std::string_view input) {
  return core_->feed(input);
}

std::string& RespSession::output() {
  return core_->output;
}

bool RespSession::closing() const {
  return core_->closing_;
}

bool RespSession::finished() const {
  return core_->closing_ && core_->awaited_ == 0;
}

size_t RespSession::awaited() const {
  return core_->awaited_;
}

bool RespSession::wants_input() const {
  return !core_->closing_ && core_->awaited_ < kMaxAwaitedReplies &&
         core_->output.size() < kMaxOutputBytes;
}

Protocol RespSession::protocol() const {
  return core_->protocol;
}

}  // namespace sluice::front::resp
