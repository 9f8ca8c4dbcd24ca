// RESP2 and RESP3 replies (resp_writer.h).
#include "front/resp/resp_writer.h"

#include <charconv>

namespace sluice::front::resp {

void RespWriter::header(char type, uint64_t n) {
  char buf[24];
  buf[0] = type;
  const auto r = std::to_chars(buf + 1, buf + sizeof(buf) - 2, n);
  r.ptr[0] = '\r';
  r.ptr[1] = '\n';
  out_->append(buf, static_cast<size_t>(r.ptr + 2 - buf));
}

void RespWriter::line_text(std::string_view text) {
  const size_t at = out_->size();
  out_->append(text);
  for (size_t i = at; i < out_->size(); ++i) {
    char& c = (*out_)[i];
    if (c == '\r' || c == '\n') c = ' ';
  }
  out_->append("\r\n");
}

void RespWriter::simple(std::string_view text) {
  out_->push_back('+');
  line_text(text);
}

void RespWriter::error(std::string_view text) {
  out_->push_back('-');
  line_text(text);
}

void RespWriter::integer(int64_t v) {
  char buf[24];
  buf[0] = ':';
  const auto r = std::to_chars(buf + 1, buf + sizeof(buf) - 2, v);
  r.ptr[0] = '\r';
  r.ptr[1] = '\n';
  out_->append(buf, static_cast<size_t>(r.ptr + 2 - buf));
}

void RespWriter::bulk(std::string_view data) {
  header('$', data.size());
  out_->append(data);
  out_->append("\r\n");
}

void RespWriter::verbatim(std::string_view format, std::string_view data) {
  if (protocol_ == Protocol::kResp2) return bulk(data);
  header('=', format.size() + 1 + data.size());
  out_->append(format);
  out_->push_back(':');
  out_->append(data);
  out_->append("\r\n");
}

void RespWriter::null() {
  out_->append(protocol_ == Protocol::kResp3 ? "_\r\n" : "$-1\r\n");
}

void RespWriter::null_array() {
  out_->append(protocol_ == Protocol::kResp3 ? "_\r\n" : "*-1\r\n");
}

void RespWriter::array(size_t n) {
  header('*', n);
}

void RespWriter::map(size_t pairs) {
  if (protocol_ == Protocol::kResp3) return header('%', pairs);
  header('*', 2 * pairs);
}

void RespWriter::set(size_t n) {
  header(protocol_ == Protocol::kResp3 ? '~' : '*', n);
}

}  // namespace sluice::front::resp
