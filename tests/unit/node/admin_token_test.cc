// The admin token's pieces without a network: the constant-time comparison, the Authorization
// header parser, the token file reader and AdminAuth's decisions (which request needs the token,
// which answer a refusal gets, what is counted). admin_auth_test.cc speaks HTTP to a node.
#include "node/admin_auth.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

namespace {

using sluice::node::AdminAuth;
using sluice::node::bearer_token;
using sluice::node::read_admin_token_file;
using sluice::node::tokens_equal;

std::map<std::string, uint64_t> failures(const AdminAuth& a) {
  std::map<std::string, uint64_t> out;
  for (const auto& [reason, n] : a.failures())
    out[std::string(reason)] = n;
  return out;
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("sluice-admin-token-" + std::to_string(::getpid()) +
                                                "-" + std::to_string(std::random_device{}()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("tokens_equal is true for equal tokens and false for unequal or different-length ones") {
  CHECK(tokens_equal("s3cret-token", "s3cret-token"));
  CHECK(tokens_equal("", ""));
  CHECK_FALSE(tokens_equal("s3cret-token", "s3cret-tokeN"));
  CHECK_FALSE(tokens_equal("s3cret-token", "s3cret-toke"));    // a prefix
  CHECK_FALSE(tokens_equal("s3cret-token", "s3cret-token "));  // longer by one byte
  CHECK_FALSE(tokens_equal("s3cret-token", ""));
  CHECK_FALSE(tokens_equal("", "x"));
  // Bytes a string compare could stop at.
  const std::string with_nul("ab\0cd", 5);
  CHECK(tokens_equal(with_nul, std::string("ab\0cd", 5)));
  CHECK_FALSE(tokens_equal(with_nul, std::string("ab\0ce", 5)));
  CHECK_FALSE(tokens_equal(with_nul, "ab"));
}

TEST_CASE("bearer_token takes the token after the Bearer scheme and refuses anything else") {
  CHECK(bearer_token("Bearer abc") == std::optional<std::string_view>("abc"));
  CHECK(bearer_token("bearer abc") == std::optional<std::string_view>("abc"));  // scheme: any case
  CHECK(bearer_token("BEARER   abc ") == std::optional<std::string_view>("abc"));
  CHECK_FALSE(bearer_token("Bearer").has_value());
  CHECK_FALSE(bearer_token("Bearer ").has_value());
  CHECK_FALSE(bearer_token("Bearerabc").has_value());
  CHECK_FALSE(bearer_token("Basic YWxhZGRpbjpvcGVuc2VzYW1l").has_value());
  CHECK_FALSE(bearer_token("").has_value());
  CHECK_FALSE(bearer_token("\x01\x02garbage").has_value());
}

TEST_CASE(
    "an admin token file is read whole with trailing newlines stripped, empty or unreadable "
    "is an error naming the file") {
  TempDir d;
  const auto file = d.path / "token";
  std::ofstream(file) << "tok-123\n";
  auto token = read_admin_token_file(file.string());
  REQUIRE(token.ok());
  CHECK(*token == "tok-123");

  std::ofstream(d.path / "crlf") << "tok-456\r\n\n";
  token = read_admin_token_file((d.path / "crlf").string());
  REQUIRE(token.ok());
  CHECK(*token == "tok-456");

  std::ofstream(d.path / "empty") << "\n";
  std::string err = read_admin_token_file((d.path / "empty").string()).message();
  CHECK(err.find((d.path / "empty").string()) != std::string::npos);
  CHECK(err.find("empty") != std::string::npos);

  err = read_admin_token_file((d.path / "missing").string()).message();
  CHECK(err.find((d.path / "missing").string()) != std::string::npos);
  CHECK(err.find("no such file") != std::string::npos);

  err = read_admin_token_file(d.path.string()).message();
  CHECK(err.find("is a directory") != std::string::npos);
}

TEST_CASE("writes need the token, reads, checks and read-only POSTs do not") {
  CHECK(AdminAuth::is_write("POST", "/v1/overrides"));
  CHECK(AdminAuth::is_write("POST", "/v1/overrides/delete"));
  CHECK(AdminAuth::is_write("POST", "/v1/overrides/get"));
  CHECK(AdminAuth::is_write("POST", "/v1/plans"));
  CHECK(AdminAuth::is_write("POST", "/v1/drain"));
  CHECK(AdminAuth::is_write("POST", "/v1/snapshot"));
  CHECK(AdminAuth::is_write("DELETE", "/v1/overrides"));
  CHECK(AdminAuth::is_write("PUT", "/v1/some-endpoint-added-later"));  // closed by default
  CHECK_FALSE(AdminAuth::is_write("GET", "/v1/overrides"));
  CHECK_FALSE(AdminAuth::is_write("GET", "/metrics"));
  CHECK_FALSE(AdminAuth::is_write("POST", "/v1/check"));
  CHECK_FALSE(AdminAuth::is_write("GET", "/v1/auth"));
  CHECK_FALSE(AdminAuth::is_write("POST", "/v1/release"));  // the checks' other half
  CHECK_FALSE(AdminAuth::is_write("POST", "/v1/inspect"));
  CHECK_FALSE(AdminAuth::is_write("POST", "/v1/ring"));
  // With admin_token_reads too, a service's checks and releases need no token.
  const AdminAuth locked("tok", /*lock_reads=*/true);
  CHECK_FALSE(locked.needs_token("POST", "/v1/check"));
  CHECK_FALSE(locked.needs_token("POST", "/v1/release"));
  CHECK(locked.needs_token("POST", "/v1/inspect"));
}

TEST_CASE(
    "with a token: missing and malformed are 401 with a challenge, wrong is 403, and each is "
    "counted") {
  AdminAuth auth("tok-123", false);
  auth.set_loopback_listener(true);
  auto v = auth.check("POST", "/v1/drain", std::nullopt);
  CHECK_FALSE(v.allowed);
  CHECK(v.status == 401);
  CHECK(v.challenge);
  v = auth.check("POST", "/v1/drain", std::string_view("Basic dG9rLTEyMw=="));
  CHECK(v.status == 401);
  CHECK(v.challenge);
  v = auth.check("POST", "/v1/drain", std::string_view("Bearer tok-123"), 2);  // two headers
  CHECK(v.status == 401);
  v = auth.check("POST", "/v1/drain", std::string_view("Bearer tok-124"));
  CHECK(v.status == 403);
  CHECK_FALSE(v.challenge);
  v = auth.check("POST", "/v1/drain", std::string_view("Bearer tok-123"));
  CHECK(v.allowed);
  CHECK(auth.check("GET", "/metrics", std::nullopt).allowed);
  CHECK(failures(auth) ==
        std::map<std::string, uint64_t>{
            {"missing", 1}, {"malformed", 2}, {"wrong", 1}, {"no_token_configured", 0}});

  // SIGHUP's new token replaces the old one.
  auth.set_token("tok-new");
  CHECK(auth.check("POST", "/v1/drain", std::string_view("Bearer tok-123")).status == 403);
  CHECK(auth.check("POST", "/v1/drain", std::string_view("Bearer tok-new")).allowed);
}

TEST_CASE("admin_token_reads locks reads too, but not /healthz and the checks") {
  AdminAuth auth("tok-123", true);
  CHECK(auth.check("GET", "/metrics", std::nullopt).status == 401);
  CHECK(auth.check("GET", "/v1/status", std::nullopt).status == 401);
  CHECK(auth.check("POST", "/v1/inspect", std::nullopt).status == 401);
  CHECK(auth.check("GET", "/v1/status", std::string_view("Bearer tok-123")).allowed);
  CHECK(auth.check("GET", "/healthz", std::nullopt).allowed);
  CHECK(auth.check("POST", "/v1/check", std::nullopt).allowed);
  CHECK(auth.check("GET", "/v1/auth", std::nullopt).allowed);
}

TEST_CASE("without a token: writes pass on a loopback listener and are refused on any other") {
  AdminAuth auth("", false);
  auth.set_loopback_listener(true);
  CHECK(auth.check("POST", "/v1/drain", std::nullopt).allowed);
  auth.set_loopback_listener(false);
  const auto v = auth.check("POST", "/v1/overrides", std::nullopt);
  CHECK(v.status == 403);
  CHECK_FALSE(v.challenge);
  CHECK(v.message.find("admin_token_file") != std::string::npos);
  CHECK(auth.check("GET", "/v1/overrides", std::nullopt).allowed);
  CHECK(failures(auth)["no_token_configured"] == 1);
}
