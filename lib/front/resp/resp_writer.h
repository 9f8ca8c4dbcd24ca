// Replies of the RESP door, appended to a connection's output buffer in RESP2 or RESP3: the
// version a connection speaks is 2 until it says `HELLO 3`. Where the two differ (null, map,
// set, verbatim text) RESP2 gets what redis-server sends a RESP2 client: `$-1` or `*-1` for
// null, a flat array of keys and values for a map, an array for a set, a bulk string for
// verbatim text.
//
// The writer only appends; it never allocates beyond the buffer's growth, so a connection that
// reuses its buffer writes replies without allocating once warm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::front::resp {

enum class Protocol : uint8_t { kResp2 = 2, kResp3 = 3 };

class RespWriter {
 public:
  RespWriter(std::string& out, Protocol protocol) : out_(&out), protocol_(protocol) {}

  Protocol protocol() const { return protocol_; }
  std::string& buffer() { return *out_; }

  // `+text`. "\r" and "\n" in it become spaces, as redis-server does for its errors.
  void simple(std::string_view text);
  // `-text`: `text` starts with the error code ("ERR ...", "NOAUTH ...", "Cell error: ...").
  void error(std::string_view text);
  void integer(int64_t v);
  void bulk(std::string_view data);
  // RESP3 `=` with a three-letter format ("txt"); RESP2 a bulk string of `data` alone.
  void verbatim(std::string_view format, std::string_view data);
  void null();        // a missing value: RESP3 `_`, RESP2 `$-1`
  void null_array();  // a missing array: RESP3 `_`, RESP2 `*-1`
  void array(size_t n);
  void map(size_t pairs);  // RESP3 `%`, RESP2 an array of 2 * pairs
  void set(size_t n);      // RESP3 `~`, RESP2 an array

 private:
  void header(char type, uint64_t n);
  void line_text(std::string_view text);

  std::string* out_;
  Protocol protocol_;
};

}  // namespace sluice::front::resp
