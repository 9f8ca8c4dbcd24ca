// Prometheus text (metrics_text.h).
#include "front/admin/metrics_text.h"

#include <charconv>

namespace sluice::front::admin {
namespace {

// A label value (text format 0.0.4): '\', '"' and newline escaped.
void append_label_value(std::string& out, std::string_view s) {
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
}

}  // namespace

void MetricsText::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void MetricsText::sample(std::string_view name, std::initializer_list<std::string_view> labels,
                         uint64_t value) {
  sample_text(name, labels, value);
}

void MetricsText::sample_signed(std::string_view name,
                                std::initializer_list<std::string_view> labels, int64_t value) {
  sample_text(name, labels, value);
}

template <typename T>
void MetricsText::sample_text(std::string_view name, std::initializer_list<std::string_view> labels,
                              T value) {
  out_ += name;
  if (labels.size() > 0) {
    out_ += '{';
    bool first = true;
    for (auto it = labels.begin(); it != labels.end() && it + 1 != labels.end(); it += 2) {
      if (!first) out_ += ',';
      first = false;
      out_ += *it;
      out_ += "=\"";
      append_label_value(out_, *(it + 1));
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  out_.append(buf, static_cast<size_t>(r.ptr - buf));
  out_ += '\n';
}

}  // namespace sluice::front::admin
