// Private to lib/front/admin: a bounded HTTP/1.1 request parser over a connection's buffer. The
// head is parsed once it is whole (or refused once it passes kMaxHeaderBytes); its fields are
// views into the buffer, kept in a vector the connection reuses, so a request allocates nothing
// once warm. A chunked body is decoded into a separate buffer as it arrives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "front/admin/admin_front.h"

namespace sluice::front::admin {

struct Head {
  std::string_view method;
  std::string_view target;
  unsigned version = 11;  // 10 or 11 (HTTP/x.y: 10 * x + y)
  std::vector<Header> headers;
  bool keep_alive = true;
  bool chunked = false;
  uint64_t content_length = 0;
  bool expect_continue = false;
  size_t bytes = 0;  // of the head, up to and including the empty line
};

enum class ParseStatus {
  kIncomplete,  // more bytes needed
  kDone,
  kBad,           // 400: `error` says why
  kHeadTooLarge,  // 431
  kBodyTooLarge,  // 413
};

// Parses the head at the start of `data`. `error` is a static text.
ParseStatus parse_head(std::string_view data, Head& out, std::string_view& error);

// Decodes a chunked body as its bytes arrive.
class ChunkedDecoder {
 public:
  void reset() {
    state_ = State::kSize;
    left_ = 0;
  }
  // Consumes what it can of `data` (the bytes after those consumed before), appending chunk data
  // to `body`; `consumed` says how many bytes it took. kDone after the last chunk's trailer.
  ParseStatus feed(std::string_view data, std::string& body, size_t& consumed,
                   std::string_view& error);

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone };
  State state_ = State::kSize;
  uint64_t left_ = 0;
};

bool iequals(std::string_view a, std::string_view b);

}  // namespace sluice::front::admin
