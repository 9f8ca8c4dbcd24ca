// Shared by tests: an engine::RecordSink that keeps every record an export pass puts (what a
// store would write), and the pass itself.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace sluice::testing {

struct RecordCollector : engine::RecordSink {
  std::vector<std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> puts;  // key, value
  void put(std::span<const uint8_t> k, std::span<const uint8_t> v) override {
    puts.emplace_back(std::vector<uint8_t>(k.begin(), k.end()),
                      std::vector<uint8_t>(v.begin(), v.end()));
  }
  void erase(std::span<const uint8_t>) override {}
  // One whole export pass of `e`: every counter, or (all = false) those changed since the last.
  void export_all(engine::Engine& e, bool all = true) {
    engine::ExportCursor cursor;
    cursor.restart(all);
    while (!e.export_step(cursor, 1'000, *this)) {
    }
  }
};

}  // namespace sluice::testing
