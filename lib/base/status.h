// Status and StatusOr<T>: the one shape of an expected failure across Sluice's parts (a LevelDB
// Status with a code, and Dragonfly's OpResult<T> for a value or the reason there is none). Not
// named Result<T>: sluice::Result is the client's decision (lib/client/client.h).
//
// The rule: a failure the program expects (a bad rule, a malformed request field, a data
// directory that cannot be opened, an unknown key) is returned as a non-ok Status or a StatusOr<T>
// that holds one; the caller decides what it means. Exceptions are for bugs (a broken invariant)
// and for the program's edges only: the mains of sluiced and sluicectl, which turn a Status into a
// message and an exit code, and callbacks of third-party code that reports errors by throwing
// (Cap'n Proto's readers, RocksDB's comparators). Business logic never catches to decide.
//
// A Status is small: ok is a code and an empty string (no allocation). The message is the text an
// operator or a test reads, kept byte for byte where a failure used to be a string. A wire code
// (wire::Code, a counted drop reason) stays its own type where it goes on the wire; a Status may
// carry its text.
//
// Header-only, no dependencies beyond the standard library: every part may use it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace sluice {

enum class StatusCode : uint8_t {
  ok = 0,
  invalid_argument,  // the caller's input is wrong: a rule, a field, a setting
  not_found,         // the thing asked for does not exist
  already_exists,    // the thing to create exists
  io_error,          // the file system or the OS refused
  corruption,        // stored or received bytes do not decode
  unavailable,       // a resource is missing right now (a peer, a lock held by another process)
};

// The code's name in snake_case ("invalid_argument"), for logs and tests.
constexpr std::string_view to_string(StatusCode c) {
  switch (c) {
    case StatusCode::ok:
      return "ok";
    case StatusCode::invalid_argument:
      return "invalid_argument";
    case StatusCode::not_found:
      return "not_found";
    case StatusCode::already_exists:
      return "already_exists";
    case StatusCode::io_error:
      return "io_error";
    case StatusCode::corruption:
      return "corruption";
    case StatusCode::unavailable:
      return "unavailable";
  }
  return "unknown";
}

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::invalid_argument, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::not_found, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::already_exists, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::io_error, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::corruption, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::unavailable, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  // The failure's text as operators and tests read it; empty when ok.
  const std::string& message() const { return message_; }

  // "invalid_argument: <message>", or "ok": for logs where the code matters.
  std::string to_string() const {
    if (ok()) return "ok";
    std::string s(sluice::to_string(code_));
    s += ": ";
    s += message_;
    return s;
  }

  friend bool operator==(const Status&, const Status&) = default;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

// A T, or the non-ok Status that says why there is none. Constructed from a T (ok) or from a
// Status, which must not be ok (a bug, std::logic_error: it would be a StatusOr with neither).
// value() of a failed StatusOr is a bug too (std::bad_variant_access).
template <typename T>
class [[nodiscard]] StatusOr {
  static_assert(!std::is_same_v<std::remove_cvref_t<T>, Status>, "use Status for no value");

 public:
  StatusOr(const T& v) : v_(v) {}          // NOLINT(google-explicit-constructor)
  StatusOr(T&& v) : v_(std::move(v)) {}    // NOLINT(google-explicit-constructor)
  StatusOr(Status s) : v_(std::move(s)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) throw std::logic_error("StatusOr built from an ok Status");
  }
  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::remove_cvref_t<U>, T> &&
           !std::is_same_v<std::remove_cvref_t<U>, Status> &&
           !std::is_same_v<std::remove_cvref_t<U>, StatusOr>) StatusOr(U&& u)
      : v_(std::in_place_type<T>, std::forward<U>(u)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  // The failure; an ok Status when the StatusOr holds a value.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  StatusCode code() const { return ok() ? StatusCode::ok : std::get<Status>(v_).code(); }
  // The failure's text; empty when ok.
  const std::string& message() const {
    static const std::string empty;
    return ok() ? empty : std::get<Status>(v_).message();
  }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace sluice
