// The client <-> node check protocol: Cap'n Proto messages (schema/check.capnp), one per UDP
// datagram or one per length-prefixed TCP frame. See docs/protocol.md.
//
// This header is what both sides use and depends on nothing else of Sluice (the client library
// links only this part). Hostile input is handled here: every decode validates sizes, Cap'n Proto
// traversal and nesting limits, and field bounds, and reports a Code instead of throwing.
//
// Thread safety: free functions are thread-safe; RequestDecoder and FrameReader are per-thread
// (or per-connection) objects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::wire {

inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kMaxDatagramBytes = 65'507;  // largest UDP payload over IPv4
inline constexpr size_t kMaxFrameBytes = 1u << 20;   // largest TCP frame (message bytes)
inline constexpr size_t kMaxChecks = 1'024;          // checks per request
inline constexpr size_t kMaxEntries = 64;            // entries per check (rules enforce less)
inline constexpr size_t kFrameHeaderBytes = 4;       // u32 little-endian message length

// Mirrors schema Code: request-level and per-check outcomes.
enum class Code : uint8_t {
  kOk = 0,
  kEmptyDomain,
  kUnknownDomain,
  kTooManyEntries,
  kEntryTooLong,
  kEmptyEntryKey,
  kDuplicateEntry,
  kHitsTooLarge,
  kNegativeHits,
  kNoRoom,
  kMalformed,
  kTooManyChecks,
  kUnsupportedVersion,
  kTooLarge,
  kLeaseUnknown,   // a release: no lease of that id was granted for these entries
  kLeaseExpired,   // a release: the lease's time to live is over
  kLeaseReleased,  // a release: the lease was released before (nothing changed)
};
std::string_view to_string(Code c);  // "ok", "unknown_domain", ...

enum class Mode : uint8_t { kEnforce, kDryRun, kShadow };
std::string_view to_string(Mode m);  // "enforce", "dry-run", "shadow"

// ---- requests --------------------------------------------------------------------------------

struct Entry {
  std::string_view key;
  std::string_view value;
};

// The windows a check's limit override may take: envoyproxy/ratelimit's units, second to year.
inline constexpr int64_t kLimitOverrideWindowsMs[] = {
    1'000, 60'000, 3'600'000, 86'400'000, 7 * 86'400'000LL, 30 * 86'400'000LL, 365 * 86'400'000LL};
inline constexpr uint64_t kMaxLimitOverride = uint64_t{1} << 40;  // as a rules-file limit

struct Check {
  std::string_view domain;
  std::span<const Entry> entries;
  int64_t hits = 1;
  // The check's own limit instead of any rule (docs/protocol.md): a window of
  // kLimitOverrideWindowsMs and at most kMaxLimitOverride requests, else check_code kMalformed.
  bool has_limit_override = false;
  uint64_t limit_override_requests = 0;
  int64_t limit_override_window_ms = 0;
  // Not a check but the release of lease `release` (schema Release; docs/protocol.md, "Leases"),
  // with the domain and entries of the check that acquired it.
  bool is_release = false;
  uint64_t release = 0;
  // A redis-cell limit instead of any rule (schema CellLimit; docs/protocol.md): T, L, the
  // quantity (signed; `hits` is ignored) and whether it is a reset. check_code answers kMalformed
  // unless T >= 1, L >= 1 and T x L and T x quantity fit in int64.
  bool has_cell_limit = false;
  bool cell_reset = false;
  int64_t cell_interval_ns = 0;
  int64_t cell_limit = 0;
  int64_t cell_quantity = 1;
};

// Leased quotas between nodes (schema SliceAsk, SliceReturn, SliceGrant).
struct SliceReturn {
  uint64_t counter = 0;
  uint64_t id = 0;
  uint32_t used = 0;
  // Per step_ms after the request that got it was sent (schema SliceReturn).
  std::span<const uint32_t> uses;
  uint32_t step_ms = 0;
};
inline constexpr size_t kMaxSliceUses = 256;  // entries of SliceReturn::uses
struct SliceAsk {
  uint16_t node = 0;                // the node the slices are for
  std::span<const uint32_t> wants;  // per check: hits wanted (0: none)
  std::span<const SliceReturn> returns;
};
struct SliceGrant {
  uint32_t check = 0;  // index of the check in the request
  uint32_t hits = 0;
  uint32_t ttl_ms = 0;
  uint64_t id = 0;
};

// Encodes a request into `out` (replacing its contents). When pad_to is larger than the message,
// padding is added so the message is at least pad_to bytes: over UDP a node never answers with
// more bytes than the request carried, so a client that wants every limit's details pads.
// `forwarded`: sent by a node to a key's owner; `redirected` (implies forwarded): sent on by an
// owner that has just joined to the owner before it (cluster owner mode, docs/architecture.md).
// `slices` (with forwarded only): slices asked for and given back.
void encode_request(uint64_t id, std::span<const Check> checks, size_t pad_to,
                    std::vector<uint8_t>& out, bool forwarded = false, bool redirected = false,
                    const SliceAsk* slices = nullptr);

// Whether one check may go to the engine: kOk, or kTooManyEntries (over kMaxEntries),
// kNegativeHits, kMalformed (a limit override of another unit or over kMaxLimitOverride, an invalid
// cell limit). The decoder applies it to every check it reads; a front that builds checks itself
// applies it before deciding them.
Code check_code(const Check& check);

// Decodes requests with no allocation once warm. Views returned by checks() point into the
// decoder's own buffer and stay valid until the next decode().
class RequestDecoder {
 public:
  RequestDecoder();
  ~RequestDecoder();
  RequestDecoder(const RequestDecoder&) = delete;
  RequestDecoder& operator=(const RequestDecoder&) = delete;

  // kOk, or why the bytes are not a request this node can serve (kMalformed, kTooLarge,
  // kTooManyChecks, kUnsupportedVersion). Per-check problems (a negative cost, too many entries)
  // do not fail the request: see check_code().
  Code decode(std::span<const uint8_t> bytes);

  uint64_t id() const { return id_; }  // 0 when the id itself could not be read
  // Sent by another node to this key's owner (cluster owner mode): decide, never forward again.
  bool forwarded() const { return forwarded_; }
  // Sent on by a key's owner that has just joined to the owner before it: decide it here.
  bool redirected() const { return redirected_; }
  std::span<const Check> checks() const { return checks_; }
  // Leased quotas (forwarded requests only; the caller checks the cluster's tag): the node asking,
  // hits wanted per check (empty, or one per check), slices given back.
  uint16_t slice_node() const { return slice_node_; }
  std::span<const uint32_t> slice_wants() const { return slice_wants_; }
  std::span<const SliceReturn> slice_returns() const { return slice_returns_; }
  // kOk, or kNegativeHits / kTooManyEntries / kMalformed (a bad limit override) for a check the
  // engine must not see.
  Code check_code(size_t i) const { return codes_[i]; }

 private:
  struct Buffers;
  // Forgets the last request's views (what a failed decode leaves too).
  void clear();
  // The request's checks, after its header was read (decode); `request_bytes` is its size.
  template <typename Reader>
  Code read_checks(const Reader& request, size_t request_bytes);
  // Points the checks' entries and the slice returns' uses into their final vectors.
  void set_spans();
  std::unique_ptr<Buffers> buf_;
  uint64_t id_ = 0;
  bool forwarded_ = false;
  bool redirected_ = false;
  std::vector<Check> checks_;
  std::vector<Entry> entries_;
  std::vector<Code> codes_;
  uint16_t slice_node_ = 0;
  std::vector<uint32_t> slice_wants_;
  std::vector<SliceReturn> slice_returns_;
  std::vector<uint32_t> slice_uses_;  // every return's uses, in order
};

// ---- answers ---------------------------------------------------------------------------------

struct LimitView {
  std::string_view name;
  uint64_t limit = 0;
  int64_t window_ms = 0;
  uint64_t remaining = 0;
  int64_t reset_ms = 0;
  int64_t retry_after_ms = 0;  // -1 = never
  Mode mode = Mode::kEnforce;
  bool exceeded = false;
  // Cell limits: how far short of reset_ms x 10^6 the exact reset (the key's arrival time - now)
  // is, in ns, 0..999,999; 0 for other limits.
  int32_t reset_ns_short = 0;
};

struct DecisionView {
  Code code = Code::kOk;
  bool allowed = false;
  bool would_deny = false;
  bool shadow = false;
  bool allowlisted = false;
  std::span<const LimitView> limits;
  uint64_t lease = 0;  // granted by the check's concurrency limits; 0 = none
};

// Encodes an answer into `out` and returns its size. With max_bytes > 0 (UDP: the request's
// size), an answer that would be larger is re-encoded without limit names, then without any limit
// details (truncated = true); the decisions themselves always fit (a decision is smaller than the
// check it answers).
// `grants`: slices granted with the answer (between nodes; always kept, never truncated).
size_t encode_answer(uint64_t id, Code code, std::span<const DecisionView> decisions,
                     size_t max_bytes, std::vector<uint8_t>& out,
                     std::span<const SliceGrant> grants = {});

// A decoded answer, owning its strings (client side).
struct LimitStatus {
  std::string name;
  uint64_t limit = 0;
  int64_t window_ms = 0;
  uint64_t remaining = 0;
  int64_t reset_ms = 0;
  int64_t retry_after_ms = 0;  // -1 = never
  Mode mode = Mode::kEnforce;
  bool exceeded = false;
  // Cell limits: how far short of reset_ms x 10^6 the exact reset (the key's arrival time - now)
  // is, in ns, 0..999,999; 0 for other limits.
  int32_t reset_ns_short = 0;
};

struct Decision {
  Code code = Code::kOk;
  bool allowed = false;
  bool would_deny = false;
  bool shadow = false;
  bool allowlisted = false;
  std::vector<LimitStatus> limits;
  uint64_t lease = 0;  // granted by the check's concurrency limits; 0 = none
};

// An owning copy of a decision (or a limit) a front holds as views, into `to`: its strings and
// vectors are reused, so a copy made again and again allocates nothing once they are large enough.
void assign(LimitStatus& to, const LimitView& from);
void assign(Decision& to, const DecisionView& from);

struct Answer {
  uint64_t id = 0;
  Code code = Code::kOk;
  bool truncated = false;
  std::vector<Decision> decisions;
  std::vector<SliceGrant> grants;  // slices granted (between nodes)
};

// kOk, or kMalformed / kTooLarge when the bytes are not an answer.
Code decode_answer(std::span<const uint8_t> bytes, Answer& out);

// ---- TCP framing: [u32 little-endian length][message] -----------------------------------------

void append_frame(std::span<const uint8_t> message, std::vector<uint8_t>& out);

// Reassembles frames from a byte stream. A length over max_frame fails the reader for good (the
// connection must be closed: the stream cannot be resynchronised).
class FrameReader {
 public:
  explicit FrameReader(size_t max_frame = kMaxFrameBytes) : max_frame_(max_frame) {}
  void feed(std::span<const uint8_t> bytes);
  // The next complete frame's message bytes, valid until the next feed() or next(); nullopt when
  // none is complete yet or the reader failed.
  std::optional<std::span<const uint8_t>> next();
  bool failed() const { return failed_; }
  size_t buffered() const { return data_.size() - pos_; }

 private:
  size_t max_frame_;
  std::vector<uint8_t> data_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace sluice::wire
