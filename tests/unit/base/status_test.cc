// Unit tests of lib/base: a Status is ok or carries a code and its message byte for byte; a
// StatusOr<T> holds a value or a non-ok Status, never both and never neither.
#include "base/status.h"

#include <doctest/doctest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using sluice::Status;
using sluice::StatusCode;
using sluice::StatusOr;

TEST_CASE("a default Status is ok with an empty message") {
  Status s;
  CHECK(s.ok());
  CHECK(s.code() == StatusCode::ok);
  CHECK(s.message().empty());
  CHECK(s.to_string() == "ok");
  CHECK(s == Status::Ok());
}

TEST_CASE("a failed Status keeps its code and its message byte for byte") {
  const std::string text = "rule \"a\": window_ms must be >= 1000 (got 5)\n\ttab";
  Status s = Status::InvalidArgument(text);
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == text);
  CHECK(s.to_string() == "invalid_argument: " + text);
  CHECK(Status::NotFound("x").code() == StatusCode::not_found);
  CHECK(Status::AlreadyExists("x").code() == StatusCode::already_exists);
  CHECK(Status::IoError("x").code() == StatusCode::io_error);
  CHECK(Status::Corruption("x").code() == StatusCode::corruption);
  CHECK(Status::Unavailable("x").code() == StatusCode::unavailable);
  CHECK(Status::NotFound("x") != Status::IoError("x"));
  CHECK(Status::NotFound("x") != Status::NotFound("y"));
}

TEST_CASE("every StatusCode has a name") {
  CHECK(sluice::to_string(StatusCode::ok) == "ok");
  CHECK(sluice::to_string(StatusCode::invalid_argument) == "invalid_argument");
  CHECK(sluice::to_string(StatusCode::not_found) == "not_found");
  CHECK(sluice::to_string(StatusCode::already_exists) == "already_exists");
  CHECK(sluice::to_string(StatusCode::io_error) == "io_error");
  CHECK(sluice::to_string(StatusCode::corruption) == "corruption");
  CHECK(sluice::to_string(StatusCode::unavailable) == "unavailable");
}

StatusOr<int> parse_digit(char c) {
  if (c < '0' || c > '9') return Status::InvalidArgument(std::string("not a digit: ") + c);
  return c - '0';
}

TEST_CASE("a StatusOr holds a value, and its status is ok") {
  StatusOr<int> r = parse_digit('7');
  REQUIRE(r.ok());
  CHECK(static_cast<bool>(r));
  CHECK(r.value() == 7);
  CHECK(*r == 7);
  CHECK(r.status().ok());
  CHECK(r.code() == StatusCode::ok);
  CHECK(r.message().empty());
}

TEST_CASE("a failed StatusOr holds its Status and no value") {
  StatusOr<int> r = parse_digit('x');
  CHECK_FALSE(r.ok());
  CHECK(r.code() == StatusCode::invalid_argument);
  CHECK(r.message() == "not a digit: x");
  CHECK(r.status() == Status::InvalidArgument("not a digit: x"));
  CHECK_THROWS_AS(r.value(), std::bad_variant_access);
}

TEST_CASE("a StatusOr built from an ok Status is a bug") {
  CHECK_THROWS_AS(StatusOr<int>{Status{}}, std::logic_error);
}

TEST_CASE("a StatusOr moves a move-only value in and out") {
  StatusOr<std::unique_ptr<int>> r = std::make_unique<int>(5);
  REQUIRE(r.ok());
  CHECK(**r == 5);
  std::unique_ptr<int> p = std::move(r).value();
  CHECK(*p == 5);
}

TEST_CASE("a StatusOr converts a value of another type into its own") {
  StatusOr<std::string> s = "text";
  REQUIRE(s.ok());
  CHECK(*s == "text");
  CHECK(s->size() == 4);
  StatusOr<std::vector<int>> v = std::vector<int>{1, 2};
  CHECK(v->size() == 2);
}
