// A directory of its own under the system's temporary directory for one test, removed with
// everything in it when the test ends. `prefix` names the test in the directory's name.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace sluice::testing {

struct TempDir {
  explicit TempDir(const std::string& prefix = "sluice") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string sub(const char* name) const { return (std::filesystem::path(path) / name).string(); }
  std::string path;
};

}  // namespace sluice::testing
