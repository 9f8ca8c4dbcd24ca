#include "client/client.h"

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <stdexcept>

#include "client/core.h"

namespace sluice {

namespace asio = boost::asio;
using client_detail::Clock;
using client_detail::Completion;
using client_detail::Core;
using client_detail::NodeAddress;
using client_detail::OwnedCheck;
using client_detail::SyncWaiter;

namespace {

// How long a blocking call waits past its deadline for the I/O thread, which completes every
// check at its deadline itself; this only bounds the wait should that thread be held up (a slow
// callback). A check that runs into it ends as kUnavailable.
constexpr auto kBlockingSlack = std::chrono::milliseconds(5);

std::string validate(const ClientOptions& o) {
  if (o.nodes.empty()) return "no nodes";
  if (o.timeout.count() <= 0) return "timeout must be positive";
  if (o.attempts < 1) return "attempts must be at least 1";
  if (o.batch_window.count() < 0) return "batch_window must not be negative";
  if (o.batch_window >= o.timeout) return "batch_window must be shorter than timeout";
  if (o.max_checks_per_request < 1 || o.max_checks_per_request > wire::kMaxChecks) {
    return "max_checks_per_request must be 1.." + std::to_string(wire::kMaxChecks);
  }
  if (o.backoff_min.count() <= 0 || o.backoff_max < o.backoff_min) {
    return "backoff_min must be positive and at most backoff_max";
  }
  if (o.connect_timeout.count() <= 0) return "connect_timeout must be positive";
  return {};
}

std::string resolve(const std::string& text, asio::io_context& io, NodeAddress& out) {
  StatusOr<HostPort> hp = client_detail::parse_node_address(text);
  if (!hp.ok()) return "node '" + text + "': " + hp.message();
  const std::string& host = hp->host;
  const uint16_t port = hp->port;
  out.name = text;
  out.port = port;
  boost::system::error_code ec;
  out.address = asio::ip::make_address(host, ec);
  if (!ec) return {};
  // A name: resolved once, here. TODO(ops): follow DNS changes (re-resolve on link failure).
  asio::ip::tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return "node '" + text + "': cannot resolve '" + host + "'" + (ec ? ": " + ec.message() : "");
  }
  out.address = results.begin()->endpoint().address();
  return {};
}

// A blocking caller's waiter, reused by the thread while no completion still holds it (one
// that gave up on a stalled I/O thread leaves its waiter to the late completions).
std::shared_ptr<SyncWaiter> thread_waiter(size_t n) {
  thread_local std::shared_ptr<SyncWaiter> cached;
  if (!cached || cached.use_count() != 1) cached = std::make_shared<SyncWaiter>();
  std::lock_guard<std::mutex> lock(cached->mu);  // orders us after the last completion
  cached->results.resize(n);
  cached->done.assign(n, 0);
  cached->outstanding = n;
  return cached;
}

// Starts a co_check: submits the check with a completion that resumes the coroutine on its own
// executor, keeping that executor's context busy (outstanding work) until then.
struct CoCheckInitiation {
  Core* core;
  OwnedCheck* check;  // in the coroutine frame, alive while the coroutine is suspended

  template <typename Handler>
  void operator()(Handler handler) const {
    auto shared = std::make_shared<Handler>(std::move(handler));
    auto executor = asio::prefer(asio::get_associated_executor(*shared),
                                 asio::execution::outstanding_work.tracked);
    Completion done;
    done.callback = [shared, executor](Result r) {
      asio::post(executor, [shared, r = std::move(r)]() mutable { (*shared)(std::move(r)); });
    };
    core->submit(std::move(*check), Clock::now() + core->options().timeout, std::move(done));
  }
};

asio::awaitable<Result> co_check_owned(Core* core, OwnedCheck check) {
  // g++ 12: no capturing lambda inside the co_await expression; the initiation is a named object.
  CoCheckInitiation initiation{core, &check};
  Result r = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(Result)>(
      initiation, asio::use_awaitable);
  co_return r;
}

}  // namespace

std::string_view to_string(Outcome o) {
  switch (o) {
    case Outcome::kDecided:
      return "decided";
    case Outcome::kRefused:
      return "refused";
    case Outcome::kInvalid:
      return "invalid";
    case Outcome::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

std::string_view to_string(const ReleaseResult& r) {
  if (r.outcome != Outcome::kDecided) return to_string(r.outcome);
  return r.code == wire::Code::kOk ? "released" : wire::to_string(r.code);
}

std::unique_ptr<Client> Client::create(ClientOptions options, std::string* error) {
  std::string err = validate(options);
  std::vector<NodeAddress> nodes;
  if (err.empty()) {
    asio::io_context io;
    for (const std::string& text : options.nodes) {
      NodeAddress a;
      err = resolve(text, io, a);
      if (!err.empty()) break;
      nodes.push_back(std::move(a));
    }
  }
  if (!err.empty()) {
    if (error != nullptr) *error = std::move(err);
    return nullptr;
  }
  return std::unique_ptr<Client>(
      new Client(std::make_unique<Core>(std::move(options), std::move(nodes))));
}

Client::Client(std::unique_ptr<Core> core) : core_(std::move(core)) {}

Client::~Client() = default;

Result Client::check(const Check& check) {
  thread_local std::vector<Result> results;
  check_batch(std::span<const Check>(&check, 1), results);
  return std::move(results[0]);
}

Result Client::check(std::string_view domain, std::span<const Entry> entries, int64_t hits) {
  return check(Check{domain, entries, hits});
}

Result Client::check(std::string_view domain, std::initializer_list<Entry> entries, int64_t hits) {
  return check(Check{domain, std::span<const Entry>(entries.begin(), entries.size()), hits});
}

void Client::check_batch(std::span<const Check> checks, std::vector<Result>& results) {
  if (core_->on_io_thread()) {
    throw std::logic_error(
        "sluice::Client: a blocking check from a callback would wait for its own thread; use "
        "async_check");
  }
  results.resize(checks.size());
  if (checks.empty()) return;
  const Clock::time_point deadline = Clock::now() + core_->options().timeout;
  std::shared_ptr<SyncWaiter> waiter = thread_waiter(checks.size());
  core_->submit_sync(checks, deadline, waiter);

  std::unique_lock<std::mutex> lock(waiter->mu);
  waiter->cv.wait_until(lock, deadline + kBlockingSlack,
                        [&waiter] { return waiter->outstanding == 0; });
  for (size_t i = 0; i < checks.size(); ++i) {
    if (waiter->done[i]) {
      results[i] = std::move(waiter->results[i]);
    } else {  // the I/O thread is held up; late completions find done[i] set and drop theirs
      results[i] = core_->fail_result(Outcome::kUnavailable);
      waiter->done[i] = 1;
    }
  }
}

void Client::async_check(const Check& check, Callback done) {
  Completion completion;
  completion.callback = std::move(done);
  core_->submit(check, Clock::now() + core_->options().timeout, std::move(completion));
}

asio::awaitable<Result> Client::co_check(const Check& check) {
  OwnedCheck owned;  // copied now: the caller's views need not outlive this call
  owned.assign(check);
  return co_check_owned(core_.get(), std::move(owned));
}

Client::Acquired Client::acquire(std::string_view domain, std::span<const Entry> entries,
                                 int64_t hits) {
  Acquired a;
  a.result = check(Check{domain, entries, hits});
  // Only a node's decision grants a lease (a fail-open result holds none).
  if (a.result.decided() && a.result.lease != 0) a.lease = Lease(*this, domain, entries, a.result);
  return a;
}

Client::Acquired Client::acquire(std::string_view domain, std::initializer_list<Entry> entries,
                                 int64_t hits) {
  return acquire(domain, std::span<const Entry>(entries.begin(), entries.size()), hits);
}

namespace {

Check release_check(std::string_view domain, std::span<const Entry> entries, uint64_t lease) {
  Check c{domain, entries, 0};
  c.is_release = true;
  c.release = lease;
  return c;
}

}  // namespace

ReleaseResult Client::release(std::string_view domain, std::span<const Entry> entries,
                              uint64_t lease) {
  const Result r = check(release_check(domain, entries, lease));
  return ReleaseResult{r.outcome, r.code};
}

ReleaseResult Client::release(std::string_view domain, std::initializer_list<Entry> entries,
                              uint64_t lease) {
  return release(domain, std::span<const Entry>(entries.begin(), entries.size()), lease);
}

void Client::async_release(std::string_view domain, std::span<const Entry> entries, uint64_t lease,
                           ReleaseCallback done) {
  Completion completion;  // no callback: fire-and-forget (Core::deliver drops the result)
  if (done) {
    completion.callback = [done = std::move(done)](Result r) {
      done(ReleaseResult{r.outcome, r.code});
    };
  }
  core_->submit(release_check(domain, entries, lease), Clock::now() + core_->options().timeout,
                std::move(completion));
}

ClientStats Client::stats() const {
  return core_->stats();
}

const ClientOptions& Client::options() const {
  return core_->options();
}

}  // namespace sluice
