// Prometheus text as sluiced's GET /metrics serves it, read by the scenarios that watch a node's
// counters around a row: every sample as name, labels and value, and the sum of one metric.
// Comment lines (#) are skipped; a line that does not parse is skipped too.
#pragma once

#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::bench {

struct MetricSample {
  std::string name;    // sluice_requests_total
  std::string labels;  // transport="udp" (without the braces), "" when it has none
  double value = 0;
};

inline std::vector<MetricSample> parse_metrics(const std::string& body) {
  std::vector<MetricSample> out;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    const size_t sp = line.rfind(' ');
    if (line.empty() || line[0] == '#' || sp == std::string::npos) continue;
    const size_t brace = line.find('{'), close = line.rfind('}', sp);
    const bool labelled = brace < sp;
    if (labelled && close == std::string::npos) continue;
    out.push_back({line.substr(0, labelled ? brace : sp),
                   labelled ? line.substr(brace + 1, close - brace - 1) : "",
                   std::strtod(line.c_str() + sp + 1, nullptr)});
  }
  return out;
}

// The value of `label` (e.g. "result") in a sample's labels, "" when it has none.
inline std::string label_value(const MetricSample& s, std::string_view label) {
  const std::string key = std::string(label) + "=\"";
  size_t p = s.labels.find(key);
  if (p != 0 && p != std::string::npos && s.labels[p - 1] != ',') p = std::string::npos;
  if (p == std::string::npos) return "";
  p += key.size();
  const size_t q = s.labels.find('"', p);
  return q == std::string::npos ? "" : s.labels.substr(p, q - p);
}

// The sum of metric `name`'s samples over every label set whose labels contain `label` (e.g.
// kind="live"; "" for all), or -1 when it has none.
inline double metric_sum(const std::vector<MetricSample>& samples, std::string_view name,
                         std::string_view label = "") {
  double sum = -1;
  for (const MetricSample& s : samples) {
    if (s.name != name || (!label.empty() && s.labels.find(label) == std::string::npos)) continue;
    sum = (sum < 0 ? 0 : sum) + s.value;
  }
  return sum;
}

}  // namespace sluice::bench
