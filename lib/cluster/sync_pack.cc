#include "cluster/sync_pack.h"

#include "cluster/peer_codec.h"
#include "window/sliding_window.h"

namespace sluice::cluster {

namespace {

constexpr uint8_t kNewCounter = 1;
constexpr uint8_t kNewSpec = 2;

constexpr size_t uv_bytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}
constexpr uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
constexpr int64_t unzigzag(uint64_t u) {
  return static_cast<int64_t>(u >> 1) ^ -static_cast<int64_t>(u & 1);
}
constexpr size_t sv_bytes(int64_t v) {
  return uv_bytes(zigzag(v));
}

// Differences of values within +-kMaxStartMs never overflow: computed on uint64 and read back.
constexpr int64_t minus(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}

uint8_t* put_uv(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

int64_t start_of(const engine::RemoteTotal& t) {
  return t.bucket * t.spec.bucket_ms;
}

// Reads hostile bytes: every step checks what is left.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : p_(in.data()), end_(in.data() + in.size()) {}
  bool done() const { return p_ == end_; }
  bool byte(uint8_t& v) {
    if (p_ == end_) return false;
    v = *p_++;
    return true;
  }
  bool u64le(uint64_t& v) {
    if (end_ - p_ < 8) return false;
    v = 0;
    for (int i = 7; i >= 0; --i)
      v = (v << 8) | p_[i];
    p_ += 8;
    return true;
  }
  bool uv(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return false;
      const uint8_t b = *p_++;
      if (shift == 63 && b > 1) return false;  // past 64 bits
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool sv(int64_t& v) {
    uint64_t u = 0;
    if (!uv(u)) return false;
    v = unzigzag(u);
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

bool within(int64_t v) {
  return v >= -kMaxStartMs && v <= kMaxStartMs;
}

}  // namespace

bool packable(const engine::RemoteTotal& t) {
  const int64_t bms = t.spec.bucket_ms;
  if (bms <= 0 || t.spec.window_ms <= 0) return false;
  return t.bucket >= -kMaxStartMs / bms && t.bucket <= kMaxStartMs / bms;
}

bool TotalsPacker::same_group(const engine::RemoteTotal& t) const {
  return any_ && group_count_ < kMaxGroup && t.counter == counter_ &&
         t.spec.window_ms == window_ms_ && t.spec.bucket_ms == bucket_ms_;
}

size_t TotalsPacker::group_bytes(const engine::RemoteTotal& t) const {
  size_t n = 1;  // flags
  if (!any_ || t.counter != counter_) n += 8;
  if (!any_ || t.spec.window_ms != window_ms_ || t.spec.bucket_ms != bucket_ms_) {
    n += uv_bytes(static_cast<uint64_t>(t.spec.window_ms)) +
         uv_bytes(static_cast<uint64_t>(t.spec.bucket_ms));
  }
  return n + sv_bytes(minus(start_of(t), any_ ? start_ms_ : 0)) + 1;  // start, count
}

size_t TotalsPacker::cost(const engine::RemoteTotal& t) const {
  const size_t entry = uv_bytes(t.node) + uv_bytes(t.total);
  if (same_group(t)) return entry + sv_bytes(minus(t.bucket, bucket_));
  return group_bytes(t) + entry;
}

size_t TotalsPacker::add(const engine::RemoteTotal& t, uint8_t* base) {
  const size_t before = bytes_;
  uint8_t* p = base != nullptr ? base + bytes_ : nullptr;
  if (same_group(t)) {
    const int64_t step = minus(t.bucket, bucket_);
    if (p != nullptr) {
      p = put_uv(p, t.node);
      p = put_uv(p, zigzag(step));
      put_uv(p, t.total);
      ++base[count_at_];
    }
    bytes_ += uv_bytes(t.node) + sv_bytes(step) + uv_bytes(t.total);
    ++group_count_;
  } else {
    const size_t header = group_bytes(t);
    if (p != nullptr) {
      const bool new_counter = !any_ || t.counter != counter_;
      const bool new_spec =
          !any_ || t.spec.window_ms != window_ms_ || t.spec.bucket_ms != bucket_ms_;
      *p++ = static_cast<uint8_t>((new_counter ? kNewCounter : 0) | (new_spec ? kNewSpec : 0));
      if (new_counter) {
        for (int i = 0; i < 8; ++i)
          *p++ = static_cast<uint8_t>(t.counter >> (8 * i));
      }
      if (new_spec) {
        p = put_uv(p, static_cast<uint64_t>(t.spec.window_ms));
        p = put_uv(p, static_cast<uint64_t>(t.spec.bucket_ms));
      }
      p = put_uv(p, zigzag(minus(start_of(t), any_ ? start_ms_ : 0)));
      *p++ = 1;  // count
      p = put_uv(p, t.node);
      put_uv(p, t.total);
    }
    count_at_ = bytes_ + header - 1;
    bytes_ += header + uv_bytes(t.node) + uv_bytes(t.total);
    any_ = true;
    counter_ = t.counter;
    window_ms_ = t.spec.window_ms;
    bucket_ms_ = t.spec.bucket_ms;
    start_ms_ = start_of(t);
    group_count_ = 1;
  }
  bucket_ = t.bucket;
  ++totals_;
  return bytes_ - before;
}

size_t packed_bytes(std::span<const engine::RemoteTotal> totals) {
  TotalsPacker p;
  for (const engine::RemoteTotal& t : totals)
    p.add(t, nullptr);
  return p.bytes();
}

void pack_totals(std::span<const engine::RemoteTotal> totals, std::vector<uint8_t>& out) {
  out.assign(packed_bytes(totals), 0);
  TotalsPacker p;
  for (const engine::RemoteTotal& t : totals)
    p.add(t, out.data());
}

PeerError unpack_totals(std::span<const uint8_t> in, size_t max_totals,
                        std::vector<engine::RemoteTotal>& out) {
  Reader r(in);
  bool any = false;
  engine::RemoteTotal cur;  // counter and spec of the current group
  int64_t start_ms = 0;
  if (r.done()) return PeerError::kMalformed;  // present means at least one group
  while (!r.done()) {
    uint8_t flags = 0;
    if (!r.byte(flags)) return PeerError::kMalformed;
    if ((flags & ~(kNewCounter | kNewSpec)) != 0) return PeerError::kBadField;
    if (!any && flags != (kNewCounter | kNewSpec)) return PeerError::kBadField;
    if ((flags & kNewCounter) != 0 && !r.u64le(cur.counter)) return PeerError::kMalformed;
    if ((flags & kNewSpec) != 0) {
      uint64_t w = 0, b = 0;
      if (!r.uv(w) || !r.uv(b)) return PeerError::kMalformed;
      if (w > INT64_MAX || b > INT64_MAX) return PeerError::kBadWindow;
      cur.spec = window::WindowSpec{static_cast<int64_t>(w), static_cast<int64_t>(b)};
      if (!window::validate(cur.spec).ok()) return PeerError::kBadWindow;
    }
    int64_t delta = 0;
    uint8_t count = 0;
    if (!r.sv(delta) || !r.byte(count)) return PeerError::kMalformed;
    if (count == 0) return PeerError::kMalformed;
    int64_t start = 0;
    if (__builtin_add_overflow(start_ms, delta, &start) || !within(start))
      return PeerError::kBadField;
    const int64_t bms = cur.spec.bucket_ms;
    if (start % bms != 0) return PeerError::kBadField;
    start_ms = start;
    any = true;
    int64_t bucket = start / bms;
    const int64_t lo = -kMaxStartMs / bms, hi = kMaxStartMs / bms;
    for (uint8_t i = 0; i < count; ++i) {
      uint64_t node = 0, total = 0;
      if (!r.uv(node)) return PeerError::kMalformed;
      if (i > 0) {
        int64_t step = 0;
        if (!r.sv(step)) return PeerError::kMalformed;
        if (step < lo - bucket || step > hi - bucket) return PeerError::kBadField;
        bucket += step;
      }
      if (!r.uv(total)) return PeerError::kMalformed;
      if (node > UINT16_MAX || total > UINT32_MAX) return PeerError::kBadField;
      if (out.size() >= max_totals) return PeerError::kTooManyEntries;
      cur.node = static_cast<uint16_t>(node);
      cur.bucket = bucket;
      cur.total = static_cast<uint32_t>(total);
      out.push_back(cur);
    }
  }
  return PeerError::kOk;
}

}  // namespace sluice::cluster
