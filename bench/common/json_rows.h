// The output every scenario shares: each measured row is one JSON object, printed as a text line
// when it is measured and, with --json, gathered into the last line of stdout, exactly one object
// {"rows":[...]}. The text line is the row itself, name=value in the row's order (ordered_json
// keeps the order the scenario wrote), so what a reader sees and what tooling reads never differ:
//
//   row=restore keys=1000000 seconds=0.8123 restored=1000000 ...
//
// Numbers print with four significant digits below 10,000 and as whole numbers above; objects
// and arrays inside a row print as compact JSON.
#pragma once

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace sluice::bench {

using Row = nlohmann::ordered_json;

// The --json line; Json is nlohmann::json or Row.
template <class Json>
void print_json_rows(const Json& rows) {
  std::printf("%s\n", Json{{"rows", rows}}.dump().c_str());
}

// Prints a row as one text line: name=value for each field, in order.
inline void print_row_text(const Row& row) {
  std::string line;
  for (auto it = row.begin(); it != row.end(); ++it) {
    const Row& v = it.value();
    char num[64];
    if (v.is_number_float()) {
      const double d = v.get<double>();
      std::snprintf(num, sizeof num, std::isfinite(d) && std::fabs(d) >= 10'000 ? "%.0f" : "%.4g",
                    d);
    }
    line += (line.empty() ? "" : " ") + it.key() + '=';
    line += v.is_string() ? v.get<std::string>() : v.is_number_float() ? num : v.dump();
  }
  std::printf("%s\n", line.c_str());
}

// The rows of one run: add() prints each as text when it is measured; finish() prints the --json
// line when asked for.
class Rows {
 public:
  explicit Rows(bool json) : json_(json) {}

  Row& add(Row row) {
    print_row_text(row);
    std::fflush(stdout);
    rows_.push_back(std::move(row));
    return rows_.back();
  }
  const Row& all() const { return rows_; }
  bool empty() const { return rows_.empty(); }

  void finish() const {
    if (json_) print_json_rows(rows_);
  }

 private:
  bool json_;
  Row rows_ = Row::array();
};

}  // namespace sluice::bench
