// A directory of its own under the system's temporary directory for one test, removed with
// everything in it when the test ends. `prefix` names the test in the directory's name. Throws
// std::runtime_error when it cannot be made (a test case that throws fails). No doctest here:
// benchmarks use it too (bench/scenarios/detect.cc, through sim_cluster.h).
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace sluice::testing {

struct TempDir {
  explicit TempDir(const std::string& prefix = "sluice") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + tmpl + ": " + std::generic_category().message(errno));
    }
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
