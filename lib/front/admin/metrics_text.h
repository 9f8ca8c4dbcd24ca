// Prometheus text format 0.0.4, built by appending: each part that has metrics appends its own
// families (the node's counters, the engine's, the cluster's, this front's) to one MetricsText,
// which /metrics sends. Nothing here allocates beyond the text itself.
//
// Names, labels and HELP texts are the callers' (dashboards and tests scrape them: changing one
// is a breaking change, docs/operations.md lists them). Label values are escaped here ('\', '"'
// and newline); names and help texts must need no escaping.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace sluice::front::admin {

class MetricsText {
 public:
  // "# HELP name help" and "# TYPE name type".
  void family(std::string_view name, std::string_view type, std::string_view help);
  // "name{l1="v1",...} value"; `labels` alternates names and values.
  void sample(std::string_view name, std::initializer_list<std::string_view> labels,
              uint64_t value);
  // The same for a value that may be negative (a gauge such as a clock offset).
  void sample_signed(std::string_view name, std::initializer_list<std::string_view> labels,
                     int64_t value);
  // A family of one unlabelled sample.
  void one(std::string_view name, std::string_view type, std::string_view help, uint64_t value) {
    family(name, type, help);
    sample(name, {}, value);
  }
  std::string take() { return std::move(out_); }

 private:
  template <typename T>
  void sample_text(std::string_view name, std::initializer_list<std::string_view> labels, T value);
  std::string out_;
};

}  // namespace sluice::front::admin
