// Cap'n Proto encode/decode of the check protocol, and TCP framing.
//
// Hostile bytes are parsed only in RequestDecoder::decode() and decode_answer(). Both follow the
// same recipe: size checks before anything else, a copy into a word-aligned buffer (Cap'n Proto
// 0.9 needs aligned input), a FlatArrayMessageReader with tight ReaderOptions, and every access
// to the message inside one try: Cap'n Proto validates lazily, so any getter may throw
// kj::Exception, which becomes kMalformed here and never leaves this file.
#include "wire/protocol.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "check.capnp.h"

namespace sluice::wire {

namespace {

constexpr size_t kWordBytes = sizeof(capnp::word);
static_assert(kWordBytes == 8);

// Our schema has no recursive types: the deepest path (CheckAnswer -> decisions -> Decision ->
// limits -> LimitStatus -> name) is well within 8, so a deeper message is not one of ours.
constexpr int kNestingLimit = 8;
// Each object of a well-formed message is read once, so its traversal is at most its own size;
// four times that leaves room and still stops amplification (many pointers aimed at one big
// object), whose cost would otherwise be unbounded by the message size.
constexpr uint64_t kTraversalFactor = 4;
constexpr uint64_t kMaxTraversalWords = kTraversalFactor * (kMaxFrameBytes / kWordBytes);

// UDP answers fit in one segment of this size, so the thread's scratch is reused for all of them.
constexpr size_t kAnswerScratchWords = (kMaxDatagramBytes + kWordBytes - 1) / kWordBytes;

// ---- message sizes ----------------------------------------------------------------------------
//
// Encoders size the builder's first segment to the whole message, so every message they write is
// one segment: no far pointers (smaller, which matters for the UDP budget) and nothing for the
// reader to allocate. The arithmetic follows the encoding spec; encode_answer() still measures the
// built message before trusting it against a budget.

template <typename S>
constexpr size_t struct_words() {
  return size_t{S::_capnpPrivate::dataWordSize} + S::_capnpPrivate::pointerCount;
}
// A struct list: one tag word, then the elements.
template <typename S>
constexpr size_t struct_list_words(size_t n) {
  return n == 0 ? 0 : 1 + n * struct_words<S>();
}
// Text: the bytes and a NUL, rounded up to words; an empty text is left as a null pointer.
constexpr size_t text_words(std::string_view s) {
  return s.empty() ? 0 : (s.size() + 1 + kWordBytes - 1) / kWordBytes;
}
constexpr size_t kSegmentTableWords = 1;  // one segment: count and size, two u32
constexpr size_t kRootPointerWords = 1;

// An answer to n checks with no limit details: what every decision costs at least.
constexpr size_t bare_answer_bytes(size_t n) {
  return (kSegmentTableWords + kRootPointerWords + struct_words<schema::CheckAnswer>() +
          struct_list_words<schema::Decision>(n)) *
         kWordBytes;
}
static_assert(bare_answer_bytes(0) == 48 && bare_answer_bytes(1) == 80);

// A list of n primitives of `bytes` each, rounded up to words.
constexpr size_t value_list_words(size_t n, size_t bytes) {
  return (n * bytes + kWordBytes - 1) / kWordBytes;
}

size_t request_words(std::span<const Check> checks, const SliceAsk* slices) {
  size_t words = kRootPointerWords + struct_words<schema::CheckRequest>() +
                 struct_list_words<schema::Check>(checks.size());
  if (slices != nullptr) {
    words += struct_words<schema::SliceAsk>() + value_list_words(slices->wants.size(), 4) +
             struct_list_words<schema::SliceReturn>(slices->returns.size());
    for (const SliceReturn& r : slices->returns)
      words += value_list_words(r.uses.size(), 4);
  }
  for (const Check& c : checks) {
    words += text_words(c.domain) + struct_list_words<schema::Entry>(c.entries.size());
    if (c.is_release) words += struct_words<schema::Release>();
    if (c.has_cell_limit) words += struct_words<schema::CellLimit>();
    for (const Entry& e : c.entries)
      words += text_words(e.key) + text_words(e.value);
  }
  return words;
}

capnp::ReaderOptions reader_options(size_t words) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = std::min<uint64_t>(kTraversalFactor * words, kMaxTraversalWords);
  options.nestingLimit = kNestingLimit;
  return options;
}

// Copies `bytes` (a multiple of 8, at most kMaxFrameBytes) into `store`, growing it only when it
// is too small, and returns the aligned words.
kj::ArrayPtr<const capnp::word> copy_aligned(std::span<const uint8_t> bytes,
                                             kj::Array<capnp::word>& store) {
  const size_t words = bytes.size() / kWordBytes;
  if (store.size() < words) store = kj::heapArray<capnp::word>(words);
  std::memcpy(store.begin(), bytes.data(), bytes.size());
  return store.slice(0, words).asConst();
}

// Size checks shared by both decoders.
std::optional<Code> check_size(std::span<const uint8_t> bytes) {
  if (bytes.size() > kMaxFrameBytes) return Code::kTooLarge;
  if (bytes.size() < kWordBytes || bytes.size() % kWordBytes != 0) return Code::kMalformed;
  return std::nullopt;
}

std::string_view view(capnp::Text::Reader text) {
  return {text.begin(), text.size()};
}

// A size for Cap'n Proto's 32-bit element counts. Anything past 2^29 elements is refused by Cap'n
// Proto itself (a kj::Exception: a caller bug, such as a 4 GiB entry); clamping instead of
// truncating makes sure a larger size is refused too, rather than wrapped into a small one.
unsigned int count(size_t n) {
  return static_cast<unsigned int>(std::min<size_t>(n, std::numeric_limits<unsigned int>::max()));
}

// Text::Reader(const char*, size_t) requires a NUL after the string, which a string_view does not
// promise: copy into space the builder allocated (it adds the NUL).
template <typename InitFn>
void set_text(std::string_view s, InitFn init) {
  if (s.empty()) return;  // a null pointer reads as ""
  auto text = init(count(s.size()));
  std::memcpy(text.begin(), s.data(), s.size());
}

// Writes the message in the standard flat format (segment table, then segments) into `out`.
size_t serialize(capnp::MessageBuilder& builder, std::vector<uint8_t>& out) {
  const size_t bytes = capnp::computeSerializedSizeInWords(builder) * kWordBytes;
  out.resize(bytes);
  kj::ArrayOutputStream stream(kj::arrayPtr(out.data(), out.size()));
  capnp::writeMessage(stream, builder);
  return bytes;
}

// ---- enum mappings: explicit, so the two enums may drift without silent misreadings ----------

schema::Code to_schema(Code c) {
  switch (c) {
    case Code::kOk:
      return schema::Code::OK;
    case Code::kEmptyDomain:
      return schema::Code::EMPTY_DOMAIN;
    case Code::kUnknownDomain:
      return schema::Code::UNKNOWN_DOMAIN;
    case Code::kTooManyEntries:
      return schema::Code::TOO_MANY_ENTRIES;
    case Code::kEntryTooLong:
      return schema::Code::ENTRY_TOO_LONG;
    case Code::kEmptyEntryKey:
      return schema::Code::EMPTY_ENTRY_KEY;
    case Code::kDuplicateEntry:
      return schema::Code::DUPLICATE_ENTRY;
    case Code::kHitsTooLarge:
      return schema::Code::HITS_TOO_LARGE;
    case Code::kNegativeHits:
      return schema::Code::NEGATIVE_HITS;
    case Code::kNoRoom:
      return schema::Code::NO_ROOM;
    case Code::kMalformed:
      return schema::Code::MALFORMED;
    case Code::kTooManyChecks:
      return schema::Code::TOO_MANY_CHECKS;
    case Code::kUnsupportedVersion:
      return schema::Code::UNSUPPORTED_VERSION;
    case Code::kTooLarge:
      return schema::Code::TOO_LARGE;
    case Code::kLeaseUnknown:
      return schema::Code::LEASE_UNKNOWN;
    case Code::kLeaseExpired:
      return schema::Code::LEASE_EXPIRED;
    case Code::kLeaseReleased:
      return schema::Code::LEASE_RELEASED;
  }
  return schema::Code::MALFORMED;  // not a Code value: a caller bug, never sent as "ok"
}

// A code this build does not know (sent by a newer node) reads as kMalformed: the caller learns
// that no usable decision was made, never that the check passed.
Code from_schema(schema::Code c) {
  switch (c) {
    case schema::Code::OK:
      return Code::kOk;
    case schema::Code::EMPTY_DOMAIN:
      return Code::kEmptyDomain;
    case schema::Code::UNKNOWN_DOMAIN:
      return Code::kUnknownDomain;
    case schema::Code::TOO_MANY_ENTRIES:
      return Code::kTooManyEntries;
    case schema::Code::ENTRY_TOO_LONG:
      return Code::kEntryTooLong;
    case schema::Code::EMPTY_ENTRY_KEY:
      return Code::kEmptyEntryKey;
    case schema::Code::DUPLICATE_ENTRY:
      return Code::kDuplicateEntry;
    case schema::Code::HITS_TOO_LARGE:
      return Code::kHitsTooLarge;
    case schema::Code::NEGATIVE_HITS:
      return Code::kNegativeHits;
    case schema::Code::NO_ROOM:
      return Code::kNoRoom;
    case schema::Code::MALFORMED:
      return Code::kMalformed;
    case schema::Code::TOO_MANY_CHECKS:
      return Code::kTooManyChecks;
    case schema::Code::UNSUPPORTED_VERSION:
      return Code::kUnsupportedVersion;
    case schema::Code::TOO_LARGE:
      return Code::kTooLarge;
    case schema::Code::LEASE_UNKNOWN:
      return Code::kLeaseUnknown;
    case schema::Code::LEASE_EXPIRED:
      return Code::kLeaseExpired;
    case schema::Code::LEASE_RELEASED:
      return Code::kLeaseReleased;
  }
  return Code::kMalformed;
}

schema::Mode to_schema(Mode m) {
  switch (m) {
    case Mode::kEnforce:
      return schema::Mode::ENFORCE;
    case Mode::kDryRun:
      return schema::Mode::DRY_RUN;
    case Mode::kShadow:
      return schema::Mode::SHADOW;
  }
  return schema::Mode::ENFORCE;
}

// An unknown mode (from a newer node) reads as enforce: the decision's `allowed` is what counts.
Mode from_schema(schema::Mode m) {
  switch (m) {
    case schema::Mode::ENFORCE:
      return Mode::kEnforce;
    case schema::Mode::DRY_RUN:
      return Mode::kDryRun;
    case schema::Mode::SHADOW:
      return Mode::kShadow;
  }
  return Mode::kEnforce;
}

// ---- answers --------------------------------------------------------------------------------

// How much of each limit an answer carries; each step is smaller than the one before.
enum class Detail { kFull, kNoNames, kNoLimits };

size_t answer_words(std::span<const DecisionView> decisions, Detail detail,
                    std::span<const SliceGrant> grants) {
  size_t words = kRootPointerWords + struct_words<schema::CheckAnswer>() +
                 struct_list_words<schema::Decision>(decisions.size()) +
                 struct_list_words<schema::SliceGrant>(grants.size());
  if (detail == Detail::kNoLimits) return words;
  for (const DecisionView& d : decisions) {
    words += struct_list_words<schema::LimitStatus>(d.limits.size());
    if (detail == Detail::kFull) {
      for (const LimitView& l : d.limits)
        words += text_words(l.name);
    }
  }
  return words;
}

void fill_answer(schema::CheckAnswer::Builder answer, uint64_t id, Code code,
                 std::span<const DecisionView> decisions, Detail detail,
                 std::span<const SliceGrant> grants) {
  answer.setVersion(kVersion);
  answer.setId(id);
  answer.setCode(to_schema(code));
  answer.setTruncated(detail == Detail::kNoLimits);
  if (!grants.empty()) {
    auto list = answer.initSlices(count(grants.size()));
    for (size_t i = 0; i < grants.size(); ++i) {
      auto g = list[static_cast<unsigned int>(i)];
      g.setCheck(grants[i].check);
      g.setHits(grants[i].hits);
      g.setTtlMs(grants[i].ttl_ms);
      g.setId(grants[i].id);
    }
  }
  if (decisions.empty()) return;
  auto list = answer.initDecisions(count(decisions.size()));
  for (size_t i = 0; i < decisions.size(); ++i) {
    const DecisionView& d = decisions[i];
    auto out = list[static_cast<unsigned int>(i)];
    out.setCode(to_schema(d.code));
    out.setAllowed(d.allowed);
    out.setWouldDeny(d.would_deny);
    out.setShadow(d.shadow);
    out.setAllowlisted(d.allowlisted);
    if (d.lease != 0) out.setLease(d.lease);
    if (detail == Detail::kNoLimits || d.limits.empty()) continue;
    auto limits = out.initLimits(count(d.limits.size()));
    for (size_t j = 0; j < d.limits.size(); ++j) {
      const LimitView& l = d.limits[j];
      auto ls = limits[static_cast<unsigned int>(j)];
      if (detail == Detail::kFull) {
        set_text(l.name, [&](unsigned int n) { return ls.initName(n); });
      }
      ls.setLimit(l.limit);
      ls.setWindowMs(l.window_ms);
      ls.setRemaining(l.remaining);
      ls.setResetMs(l.reset_ms);
      ls.setRetryAfterMs(l.retry_after_ms);
      ls.setMode(to_schema(l.mode));
      ls.setExceeded(l.exceeded);
      if (l.reset_ns_short != 0) ls.setResetNsShort(l.reset_ns_short);
    }
  }
}

// The thread's zeroed first segment for answer builders (MallocMessageBuilder zeroes what it
// used when it is destroyed, so the scratch is ready for the next answer).
kj::ArrayPtr<capnp::word> answer_scratch() {
  thread_local kj::Array<capnp::word> scratch = [] {
    auto words = kj::heapArray<capnp::word>(kAnswerScratchWords);
    std::memset(words.begin(), 0, words.size() * kWordBytes);
    return words;
  }();
  return scratch;
}

// The same for requests that fit in it (most: a few checks), so encoding one allocates nothing.
constexpr size_t kRequestScratchWords = 512;
kj::ArrayPtr<capnp::word> request_scratch() {
  thread_local kj::Array<capnp::word> scratch = [] {
    auto words = kj::heapArray<capnp::word>(kRequestScratchWords);
    std::memset(words.begin(), 0, words.size() * kWordBytes);
    return words;
  }();
  return scratch;
}

Code read_answer(kj::ArrayPtr<const capnp::word> words, Answer& out) {
  capnp::FlatArrayMessageReader reader(words, reader_options(words.size()));
  if (reader.getEnd() != words.end()) return Code::kMalformed;  // trailing bytes
  auto answer = reader.getRoot<schema::CheckAnswer>();
  out.id = answer.getId();
  out.code = from_schema(answer.getCode());
  out.truncated = answer.getTruncated();
  auto decisions = answer.getDecisions();
  // A node answers at most one decision per check.
  if (decisions.size() > kMaxChecks) return Code::kMalformed;
  auto grants = answer.getSlices();
  if (grants.size() > kMaxChecks) return Code::kMalformed;
  out.grants.clear();
  for (auto g : grants)
    out.grants.push_back({g.getCheck(), g.getHits(), g.getTtlMs(), g.getId()});
  // resize, not clear: decisions that stay keep their limits' capacity.
  out.decisions.resize(decisions.size());
  for (unsigned int i = 0; i < decisions.size(); ++i) {
    auto d = decisions[i];
    Decision& o = out.decisions[i];
    o.code = from_schema(d.getCode());
    o.allowed = d.getAllowed();
    o.would_deny = d.getWouldDeny();
    o.shadow = d.getShadow();
    o.allowlisted = d.getAllowlisted();
    o.lease = d.getLease();
    auto limits = d.getLimits();
    o.limits.resize(limits.size());
    for (unsigned int j = 0; j < limits.size(); ++j) {
      auto l = limits[j];
      LimitStatus& s = o.limits[j];
      s.name.assign(view(l.getName()));
      s.limit = l.getLimit();
      s.window_ms = l.getWindowMs();
      s.remaining = l.getRemaining();
      s.reset_ms = l.getResetMs();
      s.retry_after_ms = l.getRetryAfterMs();
      s.mode = from_schema(l.getMode());
      s.exceeded = l.getExceeded();
      s.reset_ns_short = l.getResetNsShort();
    }
  }
  return Code::kOk;
}

}  // namespace

std::string_view to_string(Code c) {
  switch (c) {
    case Code::kOk:
      return "ok";
    case Code::kEmptyDomain:
      return "empty_domain";
    case Code::kUnknownDomain:
      return "unknown_domain";
    case Code::kTooManyEntries:
      return "too_many_entries";
    case Code::kEntryTooLong:
      return "entry_too_long";
    case Code::kEmptyEntryKey:
      return "empty_entry_key";
    case Code::kDuplicateEntry:
      return "duplicate_entry";
    case Code::kHitsTooLarge:
      return "hits_too_large";
    case Code::kNegativeHits:
      return "negative_hits";
    case Code::kNoRoom:
      return "no_room";
    case Code::kMalformed:
      return "malformed";
    case Code::kTooManyChecks:
      return "too_many_checks";
    case Code::kUnsupportedVersion:
      return "unsupported_version";
    case Code::kTooLarge:
      return "too_large";
    case Code::kLeaseUnknown:
      return "lease_unknown";
    case Code::kLeaseExpired:
      return "lease_expired";
    case Code::kLeaseReleased:
      return "lease_released";
  }
  return "unknown";
}

std::string_view to_string(Mode m) {
  switch (m) {
    case Mode::kEnforce:
      return "enforce";
    case Mode::kDryRun:
      return "dry-run";
    case Mode::kShadow:
      return "shadow";
  }
  return "unknown";
}

// ---- requests --------------------------------------------------------------------------------

void encode_request(uint64_t id, std::span<const Check> checks, size_t pad_to,
                    std::vector<uint8_t>& out, bool forwarded, bool redirected,
                    const SliceAsk* slices) {
  const size_t words = request_words(checks, slices);
  const size_t bytes = (kSegmentTableWords + words) * kWordBytes;
  // Data grows the message by its size rounded up to words, so this padding makes the message
  // the smallest multiple of 8 that is >= pad_to.
  const size_t padding = pad_to > bytes ? pad_to - bytes : 0;
  const size_t total = words + (padding + kWordBytes - 1) / kWordBytes;
  std::optional<capnp::MallocMessageBuilder> scratch_builder;
  if (total <= kRequestScratchWords) {
    scratch_builder.emplace(request_scratch().slice(0, total));
  } else {
    scratch_builder.emplace(count(total));
  }
  capnp::MallocMessageBuilder& builder = *scratch_builder;
  auto request = builder.initRoot<schema::CheckRequest>();
  request.setVersion(kVersion);
  request.setId(id);
  if (forwarded || redirected) request.setForwarded(true);
  if (redirected) request.setRedirected(true);
  if (padding > 0) request.initPadding(count(padding));
  if (slices != nullptr) {
    auto ask = request.initSlices();
    ask.setNode(slices->node);
    if (!slices->wants.empty()) {
      auto wants = ask.initWants(count(slices->wants.size()));
      for (size_t i = 0; i < slices->wants.size(); ++i)
        wants.set(static_cast<unsigned int>(i), slices->wants[i]);
    }
    if (!slices->returns.empty()) {
      auto returns = ask.initReturns(count(slices->returns.size()));
      for (size_t i = 0; i < slices->returns.size(); ++i) {
        auto r = returns[static_cast<unsigned int>(i)];
        r.setCounter(slices->returns[i].counter);
        r.setId(slices->returns[i].id);
        r.setUsed(slices->returns[i].used);
        r.setStepMs(slices->returns[i].step_ms);
        const auto uses = slices->returns[i].uses;
        if (!uses.empty()) {
          auto list = r.initUses(count(uses.size()));
          for (size_t j = 0; j < uses.size(); ++j)
            list.set(static_cast<unsigned int>(j), uses[j]);
        }
      }
    }
  }
  if (checks.empty()) {
    serialize(builder, out);
    return;
  }
  auto list = request.initChecks(count(checks.size()));
  for (size_t i = 0; i < checks.size(); ++i) {
    const Check& c = checks[i];
    auto out_check = list[static_cast<unsigned int>(i)];
    set_text(c.domain, [&](unsigned int n) { return out_check.initDomain(n); });
    out_check.setHits(c.hits);
    if (c.is_release) out_check.initRelease().setLease(c.release);
    if (c.has_limit_override) {
      auto lo = out_check.initLimitOverride();
      lo.setRequests(c.limit_override_requests);
      lo.setWindowMs(c.limit_override_window_ms);
    }
    if (c.has_cell_limit) {
      auto cl = out_check.initCellLimit();
      cl.setIntervalNs(c.cell_interval_ns);
      cl.setLimit(c.cell_limit);
      cl.setQuantity(c.cell_quantity);
      if (c.cell_reset) cl.setReset(true);
    }
    if (c.entries.empty()) continue;
    auto entries = out_check.initEntries(count(c.entries.size()));
    for (size_t j = 0; j < c.entries.size(); ++j) {
      auto e = entries[static_cast<unsigned int>(j)];
      set_text(c.entries[j].key, [&](unsigned int n) { return e.initKey(n); });
      set_text(c.entries[j].value, [&](unsigned int n) { return e.initValue(n); });
    }
  }
  serialize(builder, out);
}

struct RequestDecoder::Buffers {
  // The last message, word-aligned; every string_view handed out points into it.
  kj::Array<capnp::word> words;
  // Entries per check, so the checks' spans are set once entries_ stops growing.
  std::vector<uint32_t> entry_counts;
  std::vector<uint32_t> use_counts;  // the same for the slice returns' uses
};

Code check_code(const Check& check) {
  if (check.entries.size() > kMaxEntries) return Code::kTooManyEntries;
  if (check.hits < 0) return Code::kNegativeHits;
  if (check.has_limit_override) {
    const bool unit =
        std::find(std::begin(kLimitOverrideWindowsMs), std::end(kLimitOverrideWindowsMs),
                  check.limit_override_window_ms) != std::end(kLimitOverrideWindowsMs);
    if (!unit || check.limit_override_requests > kMaxLimitOverride) return Code::kMalformed;
  }
  if (check.has_cell_limit) {
    int64_t product = 0;
    if (check.cell_interval_ns < 1 || check.cell_limit < 1 ||
        __builtin_mul_overflow(check.cell_interval_ns, check.cell_limit, &product) ||
        __builtin_mul_overflow(check.cell_interval_ns, check.cell_quantity, &product)) {
      return Code::kMalformed;
    }
  }
  return Code::kOk;
}

RequestDecoder::RequestDecoder() : buf_(std::make_unique<Buffers>()) {}
RequestDecoder::~RequestDecoder() = default;

namespace {

// One check of a request into `check`, its entries appended to `entries` (`n_entries` of them);
// its code: kTooManyEntries (entries not read: the engine never sees them), else check_code's.
template <typename CheckReader>
Code read_check(const CheckReader& c, Check& check, std::vector<Entry>& entries,
                uint32_t& n_entries) {
  check.domain = view(c.getDomain());
  check.hits = c.getHits();
  auto list = c.getEntries();
  if (list.size() > kMaxEntries) return Code::kTooManyEntries;
  if (c.hasRelease()) {
    check.is_release = true;
    check.release = c.getRelease().getLease();
  }
  if (c.hasLimitOverride()) {
    const auto lo = c.getLimitOverride();
    check.has_limit_override = true;
    check.limit_override_window_ms = lo.getWindowMs();
    check.limit_override_requests = lo.getRequests();
  }
  if (c.hasCellLimit()) {
    const auto cl = c.getCellLimit();
    check.has_cell_limit = true;
    check.cell_interval_ns = cl.getIntervalNs();
    check.cell_limit = cl.getLimit();
    check.cell_quantity = cl.getQuantity();
    check.cell_reset = cl.getReset();
  }
  for (auto e : list)
    entries.push_back({view(e.getKey()), view(e.getValue())});
  n_entries = list.size();
  // A negative cost keeps its entries (shown in logs); the entries' span is set later (set_spans).
  check.entries = std::span<const Entry>(entries.data() + entries.size() - n_entries, n_entries);
  return wire::check_code(check);
}

// A forwarded request's slice ask: the wants (one per check, or none) and the returns, whose uses
// are appended to `uses` (`use_counts` per return; their spans are set later).
template <typename AskReader>
Code read_slice_ask(const AskReader& ask, std::vector<uint32_t>& wants,
                    std::vector<SliceReturn>& returns, std::vector<uint32_t>& uses,
                    std::vector<uint32_t>& use_counts) {
  auto want_list = ask.getWants();
  auto return_list = ask.getReturns();
  if (want_list.size() > kMaxChecks || return_list.size() > kMaxChecks) return Code::kMalformed;
  for (uint32_t w : want_list)
    wants.push_back(w);
  for (auto r : return_list) {
    auto u = r.getUses();
    if (u.size() > kMaxSliceUses) return Code::kMalformed;
    for (uint32_t x : u)
      uses.push_back(x);
    returns.push_back({r.getCounter(), r.getId(), r.getUsed(), {}, r.getStepMs()});
    use_counts.push_back(u.size());
  }
  return Code::kOk;
}

}  // namespace

void RequestDecoder::clear() {
  checks_.clear();
  entries_.clear();
  codes_.clear();
  slice_node_ = 0;
  slice_wants_.clear();
  slice_returns_.clear();
  slice_uses_.clear();
}

template <typename Reader>
Code RequestDecoder::read_checks(const Reader& request, size_t request_bytes) {
  auto checks = request.getChecks();
  if (checks.size() > kMaxChecks) return Code::kTooManyChecks;
  // A request must pay for its answer. Checks packed tighter than their decisions (Cap'n Proto
  // allows zero-sized structs in a list and charges them only to the traversal limit) would turn
  // a node into a UDP reflection amplifier. Every honest encoding, canonical ones included,
  // spends more than the 24 bytes of a decision per check.
  if (bare_answer_bytes(checks.size()) > request_bytes) return Code::kMalformed;
  for (auto c : checks) {
    codes_.push_back(
        read_check(c, checks_.emplace_back(), entries_, buf_->entry_counts.emplace_back(0)));
  }
  return Code::kOk;
}

void RequestDecoder::set_spans() {
  size_t at = 0;
  for (size_t i = 0; i < slice_returns_.size(); ++i) {
    slice_returns_[i].uses =
        std::span<const uint32_t>(slice_uses_).subspan(at, buf_->use_counts[i]);
    at += buf_->use_counts[i];
  }
  size_t first = 0;
  for (size_t i = 0; i < checks_.size(); ++i) {
    const uint32_t n = buf_->entry_counts[i];
    checks_[i].entries = std::span<const Entry>(entries_).subspan(first, n);
    first += n;
  }
}

Code RequestDecoder::decode(std::span<const uint8_t> bytes) {
  id_ = 0;
  forwarded_ = false;
  redirected_ = false;
  clear();
  buf_->entry_counts.clear();
  buf_->use_counts.clear();
  if (auto bad = check_size(bytes)) return *bad;
  auto words = copy_aligned(bytes, buf_->words);

  Code result = Code::kOk;
  try {
    // The reader lives only here: the views point into buf_->words, not into it.
    capnp::FlatArrayMessageReader reader(words, reader_options(words.size()));
    if (reader.getEnd() != words.end()) {
      result = Code::kMalformed;  // bytes after the message: not one message
    } else {
      auto request = reader.getRoot<schema::CheckRequest>();
      id_ = request.getId();  // first, so that every error answer can carry it
      forwarded_ = request.getForwarded();
      redirected_ = forwarded_ && request.getRedirected();
      if (forwarded_ && request.hasSlices()) {
        slice_node_ = request.getSlices().getNode();
        result = read_slice_ask(request.getSlices(), slice_wants_, slice_returns_, slice_uses_,
                                buf_->use_counts);
      }
      if (result == Code::kOk) {
        result = request.getVersion() != kVersion ? Code::kUnsupportedVersion
                                                  : read_checks(request, bytes.size());
      }
    }
  } catch (const kj::Exception&) {
    result = Code::kMalformed;
  }
  if (result != Code::kOk) {
    clear();
    return result;
  }
  // A want per check, or none at all.
  if (!slice_wants_.empty() && slice_wants_.size() != checks_.size()) slice_wants_.clear();
  set_spans();  // entries_ and slice_uses_ are final: the spans can point into them now
  return Code::kOk;
}

// ---- answers ---------------------------------------------------------------------------------

size_t encode_answer(uint64_t id, Code code, std::span<const DecisionView> decisions,
                     size_t max_bytes, std::vector<uint8_t>& out,
                     std::span<const SliceGrant> grants) {
  for (Detail detail : {Detail::kFull, Detail::kNoNames, Detail::kNoLimits}) {
    const size_t words = answer_words(decisions, detail, grants);
    const bool last = detail == Detail::kNoLimits;
    // Skip a level that cannot fit without building it.
    if (max_bytes > 0 && !last && (kSegmentTableWords + words) * kWordBytes > max_bytes) continue;
    std::optional<capnp::MallocMessageBuilder> builder;
    if (words <= kAnswerScratchWords) {
      builder.emplace(answer_scratch());
    } else {
      builder.emplace(count(words));  // large TCP answers: one segment still
    }
    fill_answer(builder->initRoot<schema::CheckAnswer>(), id, code, decisions, detail, grants);
    const size_t size = capnp::computeSerializedSizeInWords(*builder) * kWordBytes;
    if (max_bytes == 0 || size <= max_bytes || last) return serialize(*builder, out);
  }
  return 0;  // unreachable: the last detail level always returns
}

Code decode_answer(std::span<const uint8_t> bytes, Answer& out) {
  out.id = 0;
  out.code = Code::kOk;
  out.truncated = false;
  if (auto bad = check_size(bytes)) {
    out.decisions.clear();
    out.grants.clear();
    return *bad;
  }
  thread_local kj::Array<capnp::word> store;
  Code result;
  try {
    result = read_answer(copy_aligned(bytes, store), out);
  } catch (const kj::Exception&) {
    result = Code::kMalformed;
  }
  if (result != Code::kOk) {
    // Keep the id if it was read: the caller may still match the failure to its request.
    out.code = Code::kOk;
    out.truncated = false;
    out.decisions.clear();
    out.grants.clear();
  }
  return result;
}

// ---- TCP framing ------------------------------------------------------------------------------

void append_frame(std::span<const uint8_t> message, std::vector<uint8_t>& out) {
  const auto n = static_cast<uint32_t>(message.size());  // callers send at most kMaxFrameBytes
  const uint8_t header[kFrameHeaderBytes] = {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8),
                                             static_cast<uint8_t>(n >> 16),
                                             static_cast<uint8_t>(n >> 24)};
  out.insert(out.end(), header, header + kFrameHeaderBytes);
  out.insert(out.end(), message.begin(), message.end());
}

void FrameReader::feed(std::span<const uint8_t> bytes) {
  if (failed_) return;  // the connection is going away: do not buffer for it
  if (pos_ == data_.size()) {
    data_.clear();
    pos_ = 0;
  } else if (pos_ > data_.size() / 2) {
    // Moving the unread tail costs less than what was consumed, so compaction is amortised O(1).
    data_.erase(data_.begin(), data_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  data_.insert(data_.end(), bytes.begin(), bytes.end());
}

std::optional<std::span<const uint8_t>> FrameReader::next() {
  if (failed_ || buffered() < kFrameHeaderBytes) return std::nullopt;
  const uint8_t* h = data_.data() + pos_;
  const size_t n = size_t{h[0]} | size_t{h[1]} << 8 | size_t{h[2]} << 16 | size_t{h[3]} << 24;
  if (n == 0 || n > max_frame_) {
    // No message is empty, and past a bad length the stream cannot be resynchronised.
    failed_ = true;
    return std::nullopt;
  }
  if (buffered() < kFrameHeaderBytes + n) return std::nullopt;
  std::span<const uint8_t> message(h + kFrameHeaderBytes, n);
  pos_ += kFrameHeaderBytes + n;
  return message;
}

void assign(LimitStatus& to, const LimitView& from) {
  to.name.assign(from.name);
  to.limit = from.limit;
  to.window_ms = from.window_ms;
  to.remaining = from.remaining;
  to.reset_ms = from.reset_ms;
  to.retry_after_ms = from.retry_after_ms;
  to.mode = from.mode;
  to.exceeded = from.exceeded;
  to.reset_ns_short = from.reset_ns_short;
}

void assign(Decision& to, const DecisionView& from) {
  to.code = from.code;
  to.allowed = from.allowed;
  to.would_deny = from.would_deny;
  to.shadow = from.shadow;
  to.allowlisted = from.allowlisted;
  to.lease = from.lease;
  to.limits.resize(from.limits.size());
  for (size_t i = 0; i < from.limits.size(); ++i)
    assign(to.limits[i], from.limits[i]);
}

}  // namespace sluice::wire
