// Opening a store in a test: the store, or the test stops with the store's own message; or why a
// directory does not open ("" when it does).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "store/store.h"

namespace sluice::testing {

inline std::unique_ptr<store::Store> open_store(
    const std::string& dir, bool create,
    uint64_t write_buffer_bytes = store::kDefaultWriteBufferBytes) {
  auto s = store::Store::open(dir, create, write_buffer_bytes);
  REQUIRE_MESSAGE(s.ok(), s.message());
  return std::move(s).value();
}

inline std::string open_failure(const std::string& dir, bool create) {
  return store::Store::open(dir, create).message();
}

}  // namespace sluice::testing
