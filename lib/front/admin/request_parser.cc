// The admin front's HTTP/1.1 request parser (request_parser.h). RFC 9112: a request line, header
// fields, then a body framed by Content-Length or chunked transfer coding (a request with
// neither has none). Obsolete line folding is refused, as a request smuggling risk.
#include "front/admin/request_parser.h"

#include <algorithm>
#include <array>
#include <charconv>

namespace sluice::front::admin {
namespace {

constexpr size_t kMaxChunkLine = 4096;  // a chunk-size line or a trailer line

// RFC 9110 tchar: the characters of a method and a field name.
constexpr std::array<bool, 256> kTchar = [] {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c)
    t[static_cast<size_t>(c)] = true;
  for (int c = 'a'; c <= 'z'; ++c)
    t[static_cast<size_t>(c)] = t[static_cast<size_t>(c - 'a' + 'A')] = true;
  for (const char c : std::string_view("!#$%&'*+-.^_`|~"))
    t[static_cast<unsigned char>(c)] = true;
  return t;
}();

bool is_tchar(unsigned char c) {
  return kTchar[c];
}

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c | 0x20) : c;
}

// Whether a comma-separated list (Connection, Transfer-Encoding) holds `token`, any case.
bool has_token(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view t = list.substr(0, comma);
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t'))
      t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t'))
      t.remove_suffix(1);
    if (iequals(t, token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

// The last coding of a Transfer-Encoding list.
std::string_view last_coding(std::string_view list) {
  const size_t comma = list.rfind(',');
  std::string_view t = comma == std::string_view::npos ? list : list.substr(comma + 1);
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t'))
    t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t'))
    t.remove_suffix(1);
  return t;
}

ParseStatus bad(std::string_view& error, std::string_view why) {
  error = why;
  return ParseStatus::kBad;
}

// "METHOD SP target SP HTTP/x.y" without its line end.
ParseStatus parse_request_line(std::string_view line, Head& out, std::string_view& error) {
  size_t i = 0;
  while (i < line.size() && is_tchar(static_cast<unsigned char>(line[i])))
    ++i;
  if (i == 0 || i >= line.size() || line[i] != ' ') return bad(error, "bad method");
  out.method = line.substr(0, i);
  const size_t t0 = ++i;
  while (i < line.size() && static_cast<unsigned char>(line[i]) > 0x20 && line[i] != 0x7f)
    ++i;
  if (i == t0 || i >= line.size() || line[i] != ' ') return bad(error, "bad target");
  out.target = line.substr(t0, i - t0);
  const std::string_view v = line.substr(i + 1);
  if (v.size() != 8 || v.substr(0, 5) != "HTTP/" || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
      v[7] < '0' || v[7] > '9') {
    return bad(error, "bad version");
  }
  out.version = static_cast<unsigned>((v[5] - '0') * 10 + (v[7] - '0'));
  return ParseStatus::kDone;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

ParseStatus parse_head(std::string_view data, Head& out, std::string_view& error) {
  // A request line that is whole and wrong is refused at once, not when the head is complete.
  const size_t first_end = data.find("\r\n");
  if (first_end == std::string_view::npos) {
    return data.size() >= kMaxHeaderBytes ? ParseStatus::kHeadTooLarge : ParseStatus::kIncomplete;
  }
  out.headers.clear();
  if (ParseStatus s = parse_request_line(data.substr(0, first_end), out, error);
      s != ParseStatus::kDone) {
    return s;
  }
  const size_t end = data.find("\r\n\r\n", first_end);
  const size_t head_bytes = end == std::string_view::npos ? data.size() : end + 4;
  if (head_bytes > kMaxHeaderBytes) return ParseStatus::kHeadTooLarge;
  if (end == std::string_view::npos) return ParseStatus::kIncomplete;
  out.bytes = head_bytes;
  out.keep_alive = out.version >= 11;
  out.chunked = false;
  out.content_length = 0;
  out.expect_continue = false;
  bool has_length = false, has_te = false;
  std::string_view fields = data.substr(first_end + 2, head_bytes - first_end - 4);
  while (!fields.empty()) {
    const size_t eol = fields.find("\r\n");
    const std::string_view line = fields.substr(0, eol);
    fields = eol == std::string_view::npos ? std::string_view() : fields.substr(eol + 2);
    size_t i = 0;
    while (i < line.size() && is_tchar(static_cast<unsigned char>(line[i])))
      ++i;
    if (i == 0 || i >= line.size() || line[i] != ':') return bad(error, "bad field");
    std::string_view value = line.substr(i + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t'))
      value.remove_suffix(1);
    for (const char c : value) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f) return bad(error, "bad value");
    }
    const Header h{line.substr(0, i), value};
    out.headers.push_back(h);
    const size_t len = h.name.size();
    if (len != 14 && len != 17 && len != 10 && len != 6) continue;  // none of the four below
    if (iequals(h.name, "content-length")) {
      uint64_t n = 0;
      const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || ec != std::errc() || p != value.data() + value.size() ||
          (has_length && n != out.content_length)) {
        return bad(error, "bad Content-Length");
      }
      has_length = true;
      out.content_length = n;
    } else if (iequals(h.name, "transfer-encoding")) {
      if (has_te) return bad(error, "bad Transfer-Encoding");
      has_te = true;
      if (!iequals(last_coding(value), "chunked")) return bad(error, "bad Transfer-Encoding");
      out.chunked = true;
    } else if (iequals(h.name, "connection")) {
      if (has_token(value, "close")) out.keep_alive = false;
      if (out.version < 11 && has_token(value, "keep-alive")) out.keep_alive = true;
    } else if (iequals(h.name, "expect")) {
      out.expect_continue = iequals(value, "100-continue");
    }
  }
  if (has_length && has_te) return bad(error, "bad Content-Length");
  if (out.content_length > kMaxBodyBytes) return ParseStatus::kBodyTooLarge;
  return ParseStatus::kDone;
}

ParseStatus ChunkedDecoder::feed(std::string_view data, std::string& body, size_t& consumed,
                                 std::string_view& error) {
  consumed = 0;
  while (state_ != State::kDone) {
    const std::string_view rest = data.substr(consumed);
    if (state_ == State::kData) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left_, rest.size()));
      if (n == 0) return ParseStatus::kIncomplete;
      body.append(rest.data(), n);
      consumed += n;
      left_ -= n;
      if (left_ == 0) state_ = State::kDataEnd;
      continue;
    }
    const size_t eol = rest.find("\r\n");
    if (eol == std::string_view::npos) {
      if (rest.size() > kMaxChunkLine) return bad(error, "bad chunk");
      return ParseStatus::kIncomplete;
    }
    const std::string_view line = rest.substr(0, eol);
    consumed += eol + 2;
    switch (state_) {
      case State::kSize: {
        const std::string_view size = line.substr(0, line.find_first_of(" \t;"));
        uint64_t n = 0;
        const auto [p, ec] = std::from_chars(size.data(), size.data() + size.size(), n, 16);
        if (size.empty() || ec != std::errc() || p != size.data() + size.size()) {
          return bad(error, "bad chunk");
        }
        if (n > kMaxBodyBytes || body.size() + n > kMaxBodyBytes) {
          return ParseStatus::kBodyTooLarge;
        }
        left_ = n;
        state_ = n == 0 ? State::kTrailer : State::kData;
        break;
      }
      case State::kDataEnd:
        if (!line.empty()) return bad(error, "bad chunk");
        state_ = State::kSize;
        break;
      case State::kTrailer:  // trailer fields are read and dropped; an empty line ends them
        if (line.empty()) state_ = State::kDone;
        break;
      default:
        break;
    }
  }
  return ParseStatus::kDone;
}

}  // namespace sluice::front::admin
