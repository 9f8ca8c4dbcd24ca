// One bucket total that another node reported: the unit of the counter sync between nodes. Its
// own header, free of the engine, so that the cluster's messages (cluster/messages.h) and its
// pure membership state machine name it without linking the engine.
#pragma once

#include <cstdint>

#include "window/sliding_window.h"

namespace sluice::engine {

// A total another node reported for one bucket of one counter.
struct RemoteTotal {
  uint64_t counter = 0;
  window::WindowSpec spec;
  uint16_t node = 0;
  int64_t bucket = 0;  // bucket number (time / bucket_ms)
  uint32_t total = 0;  // that node's own total in the bucket
};

}  // namespace sluice::engine
