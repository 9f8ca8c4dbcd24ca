// Reading sluiced's /metrics (Prometheus text exposition) in tests: the value of one sample.
// Fetch the text with http_client.h.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace sluice::testing {

// The value of the sample `sample`, written as it is exposed with its labels if any
// (`sluice_reloads_total{result="ok"}`, `sluice_forwarded_parts_total`); nullopt when no line of
// `text` starts with it followed by a space.
inline std::optional<double> metric_value(std::string_view text, std::string_view sample) {
  for (size_t at = 0; (at = text.find(sample, at)) != std::string_view::npos; at += sample.size()) {
    const size_t end = at + sample.size();
    if ((at == 0 || text[at - 1] == '\n') && end < text.size() && text[end] == ' ') {
      return std::strtod(std::string(text.substr(end + 1, 40)).c_str(), nullptr);
    }
  }
  return std::nullopt;
}

}  // namespace sluice::testing
