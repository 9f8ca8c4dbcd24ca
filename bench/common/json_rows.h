// Shared by the benchmark programs: with --json, the last line of stdout is exactly one object
// {"rows":[...]}, one element per measured row.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>

namespace sluice::bench {

inline void print_json_rows(const nlohmann::json& rows) {
  std::printf("%s\n", nlohmann::json{{"rows", rows}}.dump().c_str());
}

}  // namespace sluice::bench
