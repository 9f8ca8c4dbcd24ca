// sluice::Lease (client.h): a granted lease that releases itself.
#include "client/client.h"

#include <utility>

namespace sluice {

Lease::Lease(Client& client, std::string_view domain, std::span<const Entry> entries,
             const Result& decision)
    : client_(&client), id_(decision.lease) {
  if (id_ == 0) return;
  size_t total = domain.size();
  for (const Entry& e : entries)
    total += e.key.size() + e.value.size();
  text_.reserve(total);
  lengths_.reserve(1 + 2 * entries.size());
  text_.append(domain);
  lengths_.push_back(static_cast<uint32_t>(domain.size()));
  for (const Entry& e : entries) {
    text_.append(e.key);
    text_.append(e.value);
    lengths_.push_back(static_cast<uint32_t>(e.key.size()));
    lengths_.push_back(static_cast<uint32_t>(e.value.size()));
  }
}

Lease::~Lease() {
  release_async();
}

Lease::Lease(Lease&& other) noexcept
    : client_(other.client_),
      id_(std::exchange(other.id_, 0)),
      text_(std::move(other.text_)),
      lengths_(std::move(other.lengths_)) {}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release_async();
    client_ = other.client_;
    id_ = std::exchange(other.id_, 0);
    text_ = std::move(other.text_);
    lengths_ = std::move(other.lengths_);
  }
  return *this;
}

std::string_view Lease::domain() const {
  return std::string_view(text_).substr(0, lengths_.empty() ? 0 : lengths_[0]);
}

std::vector<Entry> Lease::entries() const {
  std::vector<Entry> out;
  if (lengths_.empty()) return out;
  out.reserve(lengths_.size() / 2);
  const std::string_view all(text_);
  size_t pos = lengths_[0];
  for (size_t i = 1; i + 1 < lengths_.size(); i += 2) {
    out.push_back(
        Entry{all.substr(pos, lengths_[i]), all.substr(pos + lengths_[i], lengths_[i + 1])});
    pos += size_t{lengths_[i]} + lengths_[i + 1];
  }
  return out;
}

ReleaseResult Lease::release() {
  if (id_ == 0) return ReleaseResult{Outcome::kInvalid, wire::Code::kLeaseUnknown};
  // Throws (std::logic_error) from a Client callback: then the lease is still held.
  const ReleaseResult r = client_->release(domain(), entries(), id_);
  id_ = 0;
  return r;
}

uint64_t Lease::detach() {
  return std::exchange(id_, 0);
}

void Lease::release_async() noexcept {
  if (id_ == 0) return;
  const uint64_t id = std::exchange(id_, 0);
  try {
    // Copied into the Client's queue before this returns: text_ may go right after.
    client_->async_release(domain(), entries(), id, nullptr);
  } catch (...) {
    // Out of memory: the lease expires after its lease_ttl, as if this process had died.
  }
}

}  // namespace sluice
