// Shared by the libFuzzer targets: a property that must hold, and seed writing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <string_view>

// A failed property: abort so libFuzzer records the input as a crash.
#define FUZZ_REQUIRE(cond)                                                             \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (false)

namespace sluice::fuzz {

// With SLUICE_FUZZ_WRITE_SEEDS=DIR set, a target writes its seeds into DIR and exits
// (tests/fuzz/run.sh does this before fuzzing each target).
inline const char* seed_dir() {
  return std::getenv("SLUICE_FUZZ_WRITE_SEEDS");
}

inline void write_seed(const std::string& dir, const std::string& name, std::string_view bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace sluice::fuzz

// The two libFuzzer entry points of a target: FUZZ(bytes) for each input, and WRITE_SEEDS(dir)
// when SLUICE_FUZZ_WRITE_SEEDS is set (then the binary exits).
#define SLUICE_FUZZ_TARGET(FUZZ, WRITE_SEEDS)                               \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    FUZZ(std::span<const uint8_t>(data, size));                             \
    return 0;                                                               \
  }                                                                         \
  extern "C" int LLVMFuzzerInitialize(int*, char***) {                      \
    if (const char* dir = sluice::fuzz::seed_dir()) {                       \
      WRITE_SEEDS(dir);                                                     \
      std::exit(0);                                                         \
    }                                                                       \
    return 0;                                                               \
  }
