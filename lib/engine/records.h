// Counters as records, for persistence (lib/store) and handoff between nodes: their key and
// value layout, the sink an export writes to and where an export pass stands. Part of
// engine.h's interface, in a header of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace sluice::engine {

// ---- persistence and handoff: counters as records ----------------------------------------------
// A record is one counter's full state: key = 16 bytes (counter id little-endian, then window_ms
// and bucket_ms as big-endian u32), value = versioned little-endian bytes (head bucket, own and
// others per ring position, and what each other node reported). Importing a record is idempotent.
inline constexpr size_t kRecordKeyBytes = 16;

// A concurrency limit's counter counts the hits of the leases it granted, per bucket; its twin,
// `counter ^ kLeaseReleaseBit` (same spec), the hits of those leases released since
// (window/concurrency.h). For inspection: the engine keeps both.
inline constexpr uint64_t kLeaseReleaseBit = 1ull << 30;

class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void put(std::span<const uint8_t> key, std::span<const uint8_t> value) = 0;
  virtual void erase(std::span<const uint8_t> key) = 0;  // the counter is gone (expired, evicted)
};

// Where an export pass stands; reuse one across calls (its buffers then stop allocating).
struct ExportCursor {
  bool all = false;  // export every counter, not only the changed ones (a full snapshot)
  uint32_t shard = 0;
  uint32_t table = 0;
  size_t slot = 0;
  std::vector<uint8_t> buf;  // encoded records of the current step
  std::vector<uint32_t> ends;
  std::vector<uint8_t> erased;  // keys of counters dropped since the last export
  void restart(bool export_all) {
    *this = ExportCursor{};
    all = export_all;
  }
};

enum class ImportResult : uint8_t { kImported, kExpired, kMalformed, kNoRoom };

}  // namespace sluice::engine
