// Polling the rules files for a change of content (rules_watch.h).
#include "node/rules_watch.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

namespace sluice::node {
namespace {

// FNV-1a, 64 bits: not a defence against anyone, only a change detector.
void mix(uint64_t& h, std::string_view bytes) {
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  // A separator no content can fake by running into the next field's bytes.
  h ^= bytes.size();
  h *= 0x100000001b3ull;
}

void mix_file(uint64_t& h, const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    mix(h, "<unreadable>");
    return;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  mix(h, in.bad() ? std::string_view("<unreadable>") : std::string_view(text));
}

}  // namespace

RulesWatch::RulesWatch(std::vector<std::string> paths) {
  for (std::string& p : paths)
    if (!p.empty()) paths_.push_back(std::move(p));
  last_ = fingerprint();
}

uint64_t RulesWatch::fingerprint() const {
  namespace fs = std::filesystem;
  uint64_t h = 0xcbf29ce484222325ull;
  for (const std::string& p : paths_) {
    mix(h, p);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : fs::directory_iterator(p, ec)) {
        const std::string ext = e.path().extension().string();
        std::error_code fec;
        if ((ext == ".yaml" || ext == ".yml") && e.is_regular_file(fec)) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        mix(h, f.filename().string());
        mix_file(h, f);
      }
    } else {
      mix_file(h, p);
    }
  }
  return h;
}

bool RulesWatch::changed() {
  const uint64_t now = fingerprint();
  if (now == last_) return false;
  last_ = now;
  return true;
}

}  // namespace sluice::node
