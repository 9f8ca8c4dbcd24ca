// Sealing and opening peer datagrams (peer_codec.h).
//
// Hostile bytes are parsed only in PeerCodec::open(), with the recipe of lib/wire/protocol.cc:
// size checks, then (here) the tag, then a copy into a word-aligned buffer, a
// FlatArrayMessageReader with tight ReaderOptions, and every access to the message inside one
// try, because Cap'n Proto validates lazily and any getter may throw kj::Exception.
#include "cluster/peer_codec.h"

#include <arpa/inet.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <kj/io.h>
#include <netinet/in.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "cluster/override_codec.h"
#include "cluster/sync_pack.h"
#include "peer.capnp.h"
#include "window/sliding_window.h"

namespace sluice::cluster {

namespace {

namespace ps = schema::peer;

constexpr size_t kWordBytes = sizeof(capnp::word);
static_assert(kWordBytes == 8);
constexpr size_t kSegmentTableWords = 1;  // one segment: count and size, two u32
constexpr size_t kRootPointerWords = 1;
// The smallest datagram that can hold a message: a segment table and a root pointer.
constexpr size_t kMinDatagramBytes =
    (kSegmentTableWords + kRootPointerWords) * kWordBytes + kPeerTagBytes;

// Envelope -> payload -> gossip -> Member -> name is 5 deep, Envelope -> payload -> records ->
// record -> entries -> entry -> key 7: a deeper message is not one of ours.
constexpr int kNestingLimit = 8;
// Each object of a well-formed message is read once; four times the message size leaves room and
// still stops amplification (many pointers aimed at one object, lists of zero-sized structs).
constexpr uint64_t kTraversalFactor = 4;

constexpr std::string_view kKeyLabel = "sluice/peer/v1";

// The C++ enums are sent as the schema's ordinals.
static_assert(static_cast<uint16_t>(ps::Kind::MEMBERSHIP) ==
              static_cast<uint16_t>(PeerKind::kMembership));
static_assert(static_cast<uint16_t>(ps::Kind::SYNC) == static_cast<uint16_t>(PeerKind::kSync));
static_assert(static_cast<uint16_t>(ps::Kind::HANDOFF) ==
              static_cast<uint16_t>(PeerKind::kHandoff));
static_assert(static_cast<uint16_t>(ps::Kind::OVERRIDES) ==
              static_cast<uint16_t>(PeerKind::kOverrides));
static_assert(static_cast<uint16_t>(ps::OverrideSyncKind::FULL) ==
              static_cast<uint16_t>(OverrideSyncKind::kFull));
static_assert(static_cast<uint16_t>(ps::MembershipKind::JOIN_REPLY) ==
              static_cast<uint16_t>(MembershipKind::kJoinReply));
static_assert(static_cast<uint16_t>(ps::MemberState::LEFT) ==
              static_cast<uint16_t>(MemberState::kLeft));

// ---- message sizes (one segment: see lib/wire/protocol.cc) -----------------------------------

template <typename S>
constexpr size_t struct_words() {
  return size_t{S::_capnpPrivate::dataWordSize} + S::_capnpPrivate::pointerCount;
}
template <typename S>
constexpr size_t struct_list_words(size_t n) {
  return n == 0 ? 0 : 1 + n * struct_words<S>();
}
constexpr size_t text_words(std::string_view s) {
  return s.empty() ? 0 : (s.size() + 1 + kWordBytes - 1) / kWordBytes;
}
constexpr size_t envelope_words() {
  return kRootPointerWords + struct_words<ps::Envelope>();
}

// Built as MembershipNoDigest: no digest, and none of the fields after it.
bool lean_membership(const MembershipMessage& m) {
  return m.view_digest.empty() && !m.unknown_recipient;
}

size_t membership_words(const MembershipMessage& m) {
  // Without a digest the lean struct (schema/peer.capnp, MembershipNoDigest); a List(UInt64) is
  // one word per element, no tag.
  size_t words = envelope_words() +
                 (lean_membership(m) ? struct_words<ps::MembershipNoDigest>()
                                     : struct_words<ps::Membership>() + m.view_digest.size()) +
                 struct_list_words<ps::Member>(m.gossip.size());
  for (const Member& g : m.gossip)
    words += text_words(g.name) + text_words(g.host);
  return words;
}

// A batch goes packed (schema/peer.capnp, SyncBatch.packed) when its sender asks for it and every
// total has a packed form; else as SyncBatchList, the list of totals.
bool packed_batch(const SyncBatch& b) {
  return b.compact && !b.totals.empty() &&
         std::all_of(b.totals.begin(), b.totals.end(), [](const auto& t) { return packable(t); });
}

constexpr size_t data_words(size_t bytes) {
  return (bytes + kWordBytes - 1) / kWordBytes;
}

size_t sync_words(const SyncBatch& b, size_t packed) {
  if (packed > 0) return envelope_words() + struct_words<ps::SyncBatch>() + data_words(packed);
  return envelope_words() + struct_words<ps::SyncBatchList>() +
         struct_list_words<ps::RemoteTotal>(b.totals.size());
}

constexpr size_t datagram_bytes(size_t words) {
  return (kSegmentTableWords + words) * kWordBytes + kPeerTagBytes;
}

unsigned int count(size_t n) {
  // Callers have bounded n by the datagram size, far below 2^32.
  return static_cast<unsigned int>(n);
}

// ---- field rules, shared by seal (refuse to send) and open (drop) ----------------------------

bool printable(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < '\x7f'; });
}

PeerError check_name(std::string_view name) {
  if (name.size() > kMaxPeerNameBytes) return PeerError::kStringTooLong;
  if (name.empty() || !printable(name)) return PeerError::kBadField;
  return PeerError::kOk;
}

// `host` must be followed by a NUL (inet_pton reads a C string): std::string and capnp::Text
// both promise one, and printable() has ruled out NULs inside.
PeerError check_host(std::string_view host) {
  if (host.size() > kMaxPeerNameBytes) return PeerError::kStringTooLong;
  if (host.empty() || !printable(host)) return PeerError::kBadField;
  in6_addr addr;  // large enough for both families
  if (inet_pton(AF_INET, host.data(), &addr) != 1 && inet_pton(AF_INET6, host.data(), &addr) != 1)
    return PeerError::kBadField;
  return PeerError::kOk;
}

constexpr uint16_t kMembershipKinds = 6;  // MembershipKind::kJoinReply + 1
constexpr uint16_t kMemberStates = 4;     // MemberState::kLeft + 1

PeerError check_member(const Member& g) {
  if (static_cast<uint16_t>(g.state) >= kMemberStates) return PeerError::kBadField;
  if (PeerError e = check_name(g.name); e != PeerError::kOk) return e;
  return check_host(g.host);
}

PeerError check_membership(const MembershipMessage& m, const PeerLimits& limits) {
  if (static_cast<uint16_t>(m.kind) >= kMembershipKinds) return PeerError::kBadField;
  if (m.gossip.size() > limits.max_gossip) return PeerError::kTooManyEntries;
  if (m.view_digest.size() > kMaxViewBuckets) return PeerError::kTooManyEntries;
  for (const Member& g : m.gossip) {
    if (PeerError e = check_member(g); e != PeerError::kOk) return e;
  }
  return PeerError::kOk;
}

PeerError check_spec(const window::WindowSpec& spec) {
  return window::validate(spec).ok() ? PeerError::kOk : PeerError::kBadWindow;
}

// A spec the list form's 32-bit fields hold: windows up to 49.7 days.
bool fits_list(const window::WindowSpec& spec) {
  return spec.window_ms <= UINT32_MAX && spec.bucket_ms <= UINT32_MAX;
}

PeerError check_sync(const SyncBatch& b, const PeerLimits& limits) {
  if (b.totals.size() > limits.max_totals) return PeerError::kTooManyEntries;
  for (const engine::RemoteTotal& t : b.totals) {
    if (PeerError e = check_spec(t.spec); e != PeerError::kOk) return e;
  }
  return PeerError::kOk;
}

// |a - b| without overflow for any int64 pair.
uint64_t distance(int64_t a, int64_t b) {
  const auto ua = static_cast<uint64_t>(a);
  const auto ub = static_cast<uint64_t>(b);
  return a >= b ? ua - ub : ub - ua;
}

std::string_view view(capnp::Text::Reader text) {
  return {text.begin(), text.size()};
}

// Resizes `v` to n keeping the strings' capacity: surplus members park in `spare` and come back
// before any new one is built, so a warm output never re-allocates its names and hosts.
void resize_keeping(std::vector<Member>& v, size_t n, std::vector<Member>& spare) {
  while (v.size() > n) {
    spare.push_back(std::move(v.back()));
    v.pop_back();
  }
  while (v.size() < n) {
    if (spare.empty()) {
      v.emplace_back();
    } else {
      v.push_back(std::move(spare.back()));
      spare.pop_back();
    }
  }
}

// Writes the builder's message in the flat format (segment table, then segments) into `out`.
size_t serialize(capnp::MessageBuilder& builder, std::vector<uint8_t>& out) {
  const size_t bytes = capnp::computeSerializedSizeInWords(builder) * kWordBytes;
  out.resize(bytes);
  kj::ArrayOutputStream stream(kj::arrayPtr(out.data(), out.size()));
  capnp::writeMessage(stream, builder);
  return bytes;
}

// Owns an EVP object; OpenSSL's free functions accept null.
template <typename T, void (*Free)(T*)>
struct OsslDeleter {
  void operator()(T* p) const { Free(p); }
};
using MacPtr = std::unique_ptr<EVP_MAC, OsslDeleter<EVP_MAC, EVP_MAC_free>>;
using MacCtxPtr = std::unique_ptr<EVP_MAC_CTX, OsslDeleter<EVP_MAC_CTX, EVP_MAC_CTX_free>>;

}  // namespace

// ---- names -----------------------------------------------------------------------------------

size_t sync_datagram_bytes(size_t totals) {
  return datagram_bytes(envelope_words() + struct_words<ps::SyncBatchList>() +
                        struct_list_words<ps::RemoteTotal>(totals));
}

size_t sync_packed_datagram_bytes(size_t packed) {
  return datagram_bytes(envelope_words() + struct_words<ps::SyncBatch>() + data_words(packed));
}

size_t sync_packed_within(size_t datagram_bytes) {
  const size_t empty = sync_packed_datagram_bytes(0);
  if (datagram_bytes <= empty) return 0;
  return (datagram_bytes - empty) / kWordBytes * kWordBytes;
}

size_t sync_totals_within(size_t datagram_bytes) {
  const size_t empty = sync_datagram_bytes(0);
  const size_t per_total = struct_words<ps::RemoteTotal>() * kWordBytes;
  const size_t list_tag = kWordBytes;  // a non-empty list's tag word
  if (datagram_bytes < empty + list_tag + per_total) return 1;
  return (datagram_bytes - empty - list_tag) / per_total;
}

std::string_view to_string(PeerKind k) {
  switch (k) {
    case PeerKind::kMembership:
      return "membership";
    case PeerKind::kSync:
      return "sync";
    case PeerKind::kForward:
      return "forward";
    case PeerKind::kForwardAnswer:
      return "forward_answer";
    case PeerKind::kHandoff:
      return "handoff";
    case PeerKind::kOverrides:
      return "overrides";
  }
  return "unknown";
}

std::string_view to_string(PeerError e) {
  switch (e) {
    case PeerError::kOk:
      return "ok";
    case PeerError::kMalformed:
      return "malformed";
    case PeerError::kTooLarge:
      return "too_large";
    case PeerError::kBadTag:
      return "bad_tag";
    case PeerError::kWrongVersion:
      return "wrong_version";
    case PeerError::kUnknownKind:
      return "unknown_kind";
    case PeerError::kFromSelf:
      return "from_self";
    case PeerError::kClockSkew:
      return "clock_skew";
    case PeerError::kStaleBoot:
      return "stale_boot";
    case PeerError::kReplayed:
      return "replayed";
    case PeerError::kTooOld:
      return "too_old";
    case PeerError::kTooManyEntries:
      return "too_many_entries";
    case PeerError::kStringTooLong:
      return "string_too_long";
    case PeerError::kBadField:
      return "bad_field";
    case PeerError::kBadWindow:
      return "bad_window";
    case PeerError::kReleaseOutsideWindow:
      return "release_outside_window";
  }
  return "unknown";
}

// ---- ReplayGuard -----------------------------------------------------------------------------

PeerError ReplayGuard::check(NodeId sender, uint64_t boot_id, uint64_t seq) const {
  auto it = windows_.find(sender);
  if (it == windows_.end()) return PeerError::kOk;
  const Window& w = it->second;
  if (boot_id < w.boot_id) return PeerError::kStaleBoot;
  if (boot_id > w.boot_id || seq > w.top) return PeerError::kOk;
  if (w.top - seq >= kWindow) return PeerError::kTooOld;
  const uint64_t bit = seq % kWindow;
  return (w.seen[bit / 64] >> (bit % 64)) & 1 ? PeerError::kReplayed : PeerError::kOk;
}

void ReplayGuard::record(NodeId sender, uint64_t boot_id, uint64_t seq) {
  auto [it, fresh] = windows_.try_emplace(sender);
  Window& w = it->second;
  // Outside the precondition (an older boot, or a seq behind the window) marking a slot would
  // mark another seq: record nothing.
  if (!fresh &&
      (boot_id < w.boot_id || (boot_id == w.boot_id && seq <= w.top && w.top - seq >= kWindow)))
    return;
  if (fresh || boot_id > w.boot_id) {
    w.boot_id = boot_id;
    w.top = seq;
    w.seen.fill(0);
  } else if (seq > w.top) {
    // Slide: the slots of (top, seq] held sequence numbers now out of the window.
    if (seq - w.top >= kWindow) {
      w.seen.fill(0);
    } else {
      for (uint64_t s = w.top + 1; s != seq; ++s) {
        const uint64_t bit = s % kWindow;
        w.seen[bit / 64] &= ~(uint64_t{1} << (bit % 64));
      }
    }
    w.top = seq;
  }
  const uint64_t bit = seq % kWindow;
  w.seen[bit / 64] |= uint64_t{1} << (bit % 64);
}

PeerError ReplayGuard::admit(NodeId sender, uint64_t boot_id, uint64_t seq) {
  const PeerError e = check(sender, boot_id, seq);
  if (e == PeerError::kOk) record(sender, boot_id, seq);
  return e;
}

void ReplayGuard::forget(NodeId sender) {
  windows_.erase(sender);
}

// ---- PeerCodec -------------------------------------------------------------------------------

struct PeerCodec::Impl {
  PeerLimits limits;
  NodeId self = 0;
  uint64_t boot_id = 0;
  uint64_t last_seq = 0;
  Release release = kThisRelease;  // sealed into every envelope; the window is around it
  MacPtr mac;
  MacCtxPtr ctx;  // keyed with the derived key; re-initialised (same key) for every tag
  // The builder's first segment, zeroed (MallocMessageBuilder zeroes what it used when it is
  // destroyed): every envelope that fits a datagram is built in it.
  kj::Array<capnp::word> build_words;
  // The last received message, word-aligned for the reader.
  kj::Array<capnp::word> read_words;
  ReplayGuard guard;
  std::vector<Member> spare_members;

  // tag = HMAC(key, message). False only if OpenSSL fails, which no input causes.
  bool tag(std::span<const uint8_t> message, uint8_t (&out)[kPeerTagBytes]) {
    size_t n = 0;
    return EVP_MAC_init(ctx.get(), nullptr, 0, nullptr) == 1 &&
           EVP_MAC_update(ctx.get(), message.data(), message.size()) == 1 &&
           EVP_MAC_final(ctx.get(), out, &n, kPeerTagBytes) == 1 && n == kPeerTagBytes;
  }

  // Appends the tag over out[0, size) to `out`.
  void append_tag(std::vector<uint8_t>& out) {
    uint8_t t[kPeerTagBytes];
    if (!tag(out, t)) throw std::runtime_error("peer codec: HMAC-SHA256 failed");
    out.insert(out.end(), t, t + kPeerTagBytes);
  }

  capnp::ReaderOptions reader_options(size_t words) const {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kTraversalFactor * words;
    options.nestingLimit = kNestingLimit;
    return options;
  }

  template <typename FillFn>
  PeerError seal(PeerKind kind, size_t words, int64_t now_ms, std::vector<uint8_t>& out,
                 FillFn fill) {
    out.clear();
    if (datagram_bytes(words) > limits.max_datagram_bytes) return PeerError::kTooLarge;
    out.reserve(datagram_bytes(words));  // the tag is appended without growing `out` again
    {
      capnp::MallocMessageBuilder builder(build_words.slice(0, words));
      auto env = builder.initRoot<ps::Envelope>();
      env.setVersion(kPeerVersion);
      env.setSender(self);
      env.setBootId(boot_id);
      env.setSeq(last_seq + 1);
      env.setSentMs(now_ms);
      env.setKind(static_cast<ps::Kind>(kind));
      env.setRelease(wire_release(release));
      fill(env.initPayload());
      serialize(builder, out);
    }
    if (out.size() + kPeerTagBytes > limits.max_datagram_bytes) {
      out.clear();  // the size arithmetic above was wrong: a bug, but never a too-large datagram
      return PeerError::kTooLarge;
    }
    append_tag(out);
    ++last_seq;
    return PeerError::kOk;
  }

  PeerError read_membership(ps::Membership::Reader in, NodeId from, MembershipMessage& out) {
    const auto kind = static_cast<uint16_t>(in.getKind());
    if (kind >= kMembershipKinds) return PeerError::kBadField;
    out.kind = static_cast<MembershipKind>(kind);
    out.from = from;
    out.seq = in.getSeq();
    out.target = in.getTarget();
    auto gossip = in.getGossip();
    if (gossip.size() > limits.max_gossip) return PeerError::kTooManyEntries;
    resize_keeping(out.gossip, gossip.size(), spare_members);
    for (unsigned int i = 0; i < gossip.size(); ++i) {
      auto g = gossip[i];
      Member& m = out.gossip[i];
      const auto state = static_cast<uint16_t>(g.getState());
      if (state >= kMemberStates) return PeerError::kBadField;
      const std::string_view name = view(g.getName());
      const std::string_view host = view(g.getHost());
      if (PeerError e = check_name(name); e != PeerError::kOk) return e;
      if (PeerError e = check_host(host); e != PeerError::kOk) return e;
      m.id = g.getId();
      m.name.assign(name);
      m.host.assign(host);
      m.peer_port = g.getPeerPort();
      m.check_port = g.getCheckPort();
      m.admin_port = g.getAdminPort();
      m.incarnation = g.getIncarnation();
      m.state = static_cast<MemberState>(state);
    }
    out.unknown_recipient = in.getUnknownRecipient();
    auto digest = in.getViewDigest();
    if (digest.size() > kMaxViewBuckets) return PeerError::kTooManyEntries;
    out.view_digest.resize(digest.size());
    for (unsigned int i = 0; i < digest.size(); ++i)
      out.view_digest[i] = digest[i];
    return PeerError::kOk;
  }

  PeerError read_sync(ps::SyncBatch::Reader in, NodeId from, SyncBatch& out) {
    out.from = from;
    out.handoff = in.getHandoff();
    out.heard_ms = in.getHeardMs();
    auto totals = in.getTotals();
    if (totals.size() > limits.max_totals) return PeerError::kTooManyEntries;
    out.totals.resize(totals.size());
    for (unsigned int i = 0; i < totals.size(); ++i) {
      auto t = totals[i];
      engine::RemoteTotal& r = out.totals[i];
      r.counter = t.getCounter();
      r.spec = window::WindowSpec{t.getWindowMs(), t.getBucketMs()};
      if (PeerError e = check_spec(r.spec); e != PeerError::kOk) return e;
      r.node = t.getNode();
      r.bucket = t.getBucket();
      r.total = t.getTotal();
    }
    out.compact = in.hasPacked();
    if (!out.compact) return PeerError::kOk;
    if (!out.totals.empty()) return PeerError::kBadField;  // a batch's totals go one way
    auto packed = in.getPacked();
    return unpack_totals({packed.begin(), packed.size()}, limits.max_totals, out.totals);
  }

  // Everything after the tag check; may throw kj::Exception.
  PeerError read(kj::ArrayPtr<const capnp::word> words, int64_t now_ms, PeerMessage& out) {
    capnp::FlatArrayMessageReader reader(words, reader_options(words.size()));
    if (reader.getEnd() != words.end()) return PeerError::kMalformed;  // not one message
    auto env = reader.getRoot<ps::Envelope>();
    if (env.getVersion() != kPeerVersion) return PeerError::kWrongVersion;
    PeerHeader& h = out.header;
    h.sender = env.getSender();
    h.boot_id = env.getBootId();
    h.seq = env.getSeq();
    h.sent_ms = env.getSentMs();
    h.release = release_from_wire(env.getRelease());
    if (h.sender == self) return PeerError::kFromSelf;
    if (!within_window(release, h.release)) return PeerError::kReleaseOutsideWindow;
    if (distance(h.sent_ms, now_ms) > static_cast<uint64_t>(limits.max_clock_skew_ms))
      return PeerError::kClockSkew;
    const auto kind = static_cast<uint16_t>(env.getKind());
    if (kind != static_cast<uint16_t>(PeerKind::kMembership) &&
        kind != static_cast<uint16_t>(PeerKind::kSync) &&
        kind != static_cast<uint16_t>(PeerKind::kOverrides))
      return PeerError::kUnknownKind;
    h.kind = static_cast<PeerKind>(kind);
    if (PeerError e = guard.check(h.sender, h.boot_id, h.seq); e != PeerError::kOk) return e;
    auto payload = env.getPayload();
    if (payload.isNull()) return PeerError::kBadField;
    const PeerError e =
        h.kind == PeerKind::kMembership
            ? read_membership(payload.getAs<ps::Membership>(), h.sender, out.membership)
        : h.kind == PeerKind::kSync ? read_sync(payload.getAs<ps::SyncBatch>(), h.sender, out.sync)
                                    : detail::read_override_sync(payload.getAs<ps::OverrideSync>(),
                                                                 h.sender, limits, out.overrides);
    if (e == PeerError::kOk) guard.record(h.sender, h.boot_id, h.seq);
    return e;
  }
};

Status PeerCodec::check_secret(std::string_view secret) {
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("cluster secret must be at least " +
                                   std::to_string(kMinSecretBytes) + " bytes, got " +
                                   std::to_string(secret.size()));
  }
  return {};
}

PeerCodec::PeerCodec(std::string_view secret, NodeId self, uint64_t boot_id, PeerLimits limits)
    : impl_(std::make_unique<Impl>()) {
  if (Status why = check_secret(secret); !why.ok()) throw std::invalid_argument(why.message());
  // The largest datagram kept in one segment stays far below Cap'n Proto's 2^29-word segments.
  if (limits.max_datagram_bytes < kMinDatagramBytes || limits.max_datagram_bytes > (1u << 24))
    throw std::invalid_argument("peer codec: max_datagram_bytes must be between " +
                                std::to_string(kMinDatagramBytes) + " and 16 MiB");
  if (limits.max_clock_skew_ms < 0)
    throw std::invalid_argument("peer codec: max_clock_skew_ms must not be negative");
  Impl& s = *impl_;
  s.limits = limits;
  s.self = self;
  s.boot_id = boot_id;

  s.mac.reset(EVP_MAC_fetch(nullptr, OSSL_MAC_NAME_HMAC, nullptr));
  s.ctx.reset(s.mac ? EVP_MAC_CTX_new(s.mac.get()) : nullptr);
  if (!s.ctx) throw std::runtime_error("peer codec: OpenSSL has no HMAC");
  char digest[] = OSSL_DIGEST_NAME_SHA2_256;
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_end(),
  };
  // key = HMAC-SHA256(secret, label): the secret itself keys nothing else.
  uint8_t key[kPeerTagBytes];
  size_t n = 0;
  const auto* label = reinterpret_cast<const uint8_t*>(kKeyLabel.data());
  const bool ok = EVP_MAC_init(s.ctx.get(), reinterpret_cast<const uint8_t*>(secret.data()),
                               secret.size(), params) == 1 &&
                  EVP_MAC_update(s.ctx.get(), label, kKeyLabel.size()) == 1 &&
                  EVP_MAC_final(s.ctx.get(), key, &n, sizeof key) == 1 && n == sizeof key &&
                  EVP_MAC_init(s.ctx.get(), key, sizeof key, params) == 1;
  OPENSSL_cleanse(key, sizeof key);
  if (!ok) throw std::runtime_error("peer codec: cannot set up HMAC-SHA256");

  const size_t max_words = limits.max_datagram_bytes / kWordBytes;
  s.build_words = kj::heapArray<capnp::word>(max_words);
  std::memset(s.build_words.begin(), 0, max_words * kWordBytes);
  s.read_words = kj::heapArray<capnp::word>(max_words);
}

PeerCodec::~PeerCodec() = default;

PeerError PeerCodec::seal(const MembershipMessage& m, int64_t now_ms, std::vector<uint8_t>& out) {
  if (PeerError e = check_membership(m, impl_->limits); e != PeerError::kOk) {
    out.clear();
    return e;
  }
  // Membership and MembershipNoDigest share the layout of their first four fields.
  const auto fill = [&m](auto b) {
    b.setKind(static_cast<ps::MembershipKind>(m.kind));
    b.setSeq(m.seq);
    b.setTarget(m.target);
    if (m.gossip.empty()) return;
    auto list = b.initGossip(count(m.gossip.size()));
    for (size_t i = 0; i < m.gossip.size(); ++i) {
      const Member& g = m.gossip[i];
      auto o = list[count(i)];
      o.setId(g.id);
      // Text::Reader(std::string) is NUL-terminated: set copies it as-is.
      o.setName(capnp::Text::Reader(g.name.data(), g.name.size()));
      o.setHost(capnp::Text::Reader(g.host.data(), g.host.size()));
      o.setPeerPort(g.peer_port);
      o.setCheckPort(g.check_port);
      o.setAdminPort(g.admin_port);
      o.setIncarnation(g.incarnation);
      o.setState(static_cast<ps::MemberState>(g.state));
    }
  };
  return impl_->seal(PeerKind::kMembership, membership_words(m), now_ms, out,
                     [&](capnp::AnyPointer::Builder payload) {
                       if (lean_membership(m)) {
                         fill(payload.initAs<ps::MembershipNoDigest>());
                         return;
                       }
                       auto b = payload.initAs<ps::Membership>();
                       fill(b);
                       b.setUnknownRecipient(m.unknown_recipient);
                       if (m.view_digest.empty()) return;
                       auto digest = b.initViewDigest(count(m.view_digest.size()));
                       for (size_t i = 0; i < m.view_digest.size(); ++i)
                         digest.set(count(i), m.view_digest[i]);
                     });
}

PeerError PeerCodec::seal(const SyncBatch& b, int64_t now_ms, std::vector<uint8_t>& out) {
  if (PeerError e = check_sync(b, impl_->limits); e != PeerError::kOk) {
    out.clear();
    return e;
  }
  const size_t packed = packed_batch(b) ? packed_bytes(b.totals) : 0;
  if (packed == 0 && !std::all_of(b.totals.begin(), b.totals.end(),
                                  [](const auto& t) { return fits_list(t.spec); })) {
    out.clear();
    return PeerError::kBadWindow;  // sent as a list, its window would arrive cut to 32 bits
  }
  return impl_->seal(PeerKind::kSync, sync_words(b, packed), now_ms, out,
                     [&](capnp::AnyPointer::Builder payload) {
                       if (packed > 0) {
                         auto o = payload.initAs<ps::SyncBatch>();
                         o.setHandoff(b.handoff);
                         o.setHeardMs(b.heard_ms);
                         uint8_t* base = o.initPacked(count(packed)).begin();
                         TotalsPacker packer;
                         for (const engine::RemoteTotal& t : b.totals)
                           packer.add(t, base);
                         return;
                       }
                       // SyncBatchList: SyncBatch's layout without `packed`.
                       auto o = payload.initAs<ps::SyncBatchList>();
                       o.setHandoff(b.handoff);
                       o.setHeardMs(b.heard_ms);
                       if (b.totals.empty()) return;
                       auto list = o.initTotals(count(b.totals.size()));
                       for (size_t i = 0; i < b.totals.size(); ++i) {
                         const engine::RemoteTotal& t = b.totals[i];
                         auto r = list[count(i)];
                         r.setCounter(t.counter);
                         r.setBucket(t.bucket);
                         // Both fit 32 bits (fits_list).
                         r.setWindowMs(static_cast<uint32_t>(t.spec.window_ms));
                         r.setBucketMs(static_cast<uint32_t>(t.spec.bucket_ms));
                         r.setNode(t.node);
                         r.setTotal(t.total);
                       }
                     });
}

PeerError PeerCodec::seal(const OverrideSyncMessage& m, int64_t now_ms, std::vector<uint8_t>& out) {
  if (PeerError e = detail::check_override_sync(m, impl_->limits); e != PeerError::kOk) {
    out.clear();
    return e;
  }
  return impl_->seal(PeerKind::kOverrides, envelope_words() + detail::override_sync_words(m),
                     now_ms, out, [&](capnp::AnyPointer::Builder payload) {
                       detail::write_override_sync(payload.initAs<ps::OverrideSync>(), m);
                     });
}

PeerError PeerCodec::open(std::span<const uint8_t> datagram, int64_t now_ms, PeerMessage& out) {
  Impl& s = *impl_;
  if (datagram.size() > s.limits.max_datagram_bytes) return PeerError::kTooLarge;
  if (datagram.size() < kMinDatagramBytes) return PeerError::kMalformed;
  const size_t message_bytes = datagram.size() - kPeerTagBytes;
  const auto message = datagram.first(message_bytes);
  uint8_t want[kPeerTagBytes];
  if (!s.tag(message, want) ||
      CRYPTO_memcmp(want, datagram.data() + message_bytes, kPeerTagBytes) != 0)
    return PeerError::kBadTag;
  // From here on the bytes come from a holder of the secret.
  if (message_bytes % kWordBytes != 0) return PeerError::kMalformed;
  const size_t words = message_bytes / kWordBytes;
  std::memcpy(s.read_words.begin(), message.data(), message_bytes);
  try {
    return s.read(s.read_words.slice(0, words).asConst(), now_ms, out);
  } catch (const kj::Exception&) {
    return PeerError::kMalformed;
  }
}

NodeId PeerCodec::self() const {
  return impl_->self;
}
uint64_t PeerCodec::boot_id() const {
  return impl_->boot_id;
}
uint64_t PeerCodec::last_seq() const {
  return impl_->last_seq;
}
const PeerLimits& PeerCodec::limits() const {
  return impl_->limits;
}
ReplayGuard& PeerCodec::replay_guard() {
  return impl_->guard;
}

void PeerCodec::sign(std::vector<uint8_t>& bytes) {
  impl_->append_tag(bytes);
}

bool PeerCodec::verify(std::span<const uint8_t> datagram) {
  if (datagram.size() < kPeerTagBytes) return false;
  const size_t n = datagram.size() - kPeerTagBytes;
  uint8_t want[kPeerTagBytes];
  return impl_->tag(datagram.first(n), want) &&
         CRYPTO_memcmp(want, datagram.data() + n, kPeerTagBytes) == 0;
}

void PeerCodec::TEST_sign(std::span<const uint8_t> message, std::vector<uint8_t>& out) {
  out.assign(message.begin(), message.end());
  impl_->append_tag(out);
}

void PeerCodec::TEST_set_release(Release r) {
  impl_->release = r;
}

}  // namespace sluice::cluster
