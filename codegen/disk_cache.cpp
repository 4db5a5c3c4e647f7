// Compiled code on disk (disk_cache.h).
#include "codegen/disk_cache.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>

namespace kiln {
namespace {

// Parses a decimal line "123\n" at `pos`; advances past the newline.
bool read_number(std::string_view s, size_t& pos, uint64_t& value) {
  size_t nl = s.find('\n', pos);
  if (nl == std::string_view::npos || nl == pos) return false;
  auto [end, ec] = std::from_chars(s.data() + pos, s.data() + nl, value);
  if (ec != std::errc() || end != s.data() + nl) return false;
  pos = nl + 1;
  return true;
}

}  // namespace

std::string cache_directory() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/kiln";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/kiln";
  return "";
}

std::optional<std::string> read_cache_entry(const std::string& path, std::string_view magic,
                                            std::string_view key_text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  std::string data = std::move(ss).str();
  std::string_view s = data;
  if (!s.starts_with(magic)) return std::nullopt;
  size_t pos = magic.size();
  uint64_t key_bytes = 0, payload_bytes = 0;
  if (!read_number(s, pos, key_bytes) || !read_number(s, pos, payload_bytes)) return std::nullopt;
  // Sizes are checked against what is there before any arithmetic that could overflow.
  uint64_t rest = s.size() - pos;
  if (key_bytes > rest || payload_bytes != rest - key_bytes) return std::nullopt;
  if (s.substr(pos, key_bytes) != key_text) return std::nullopt;
  return std::string(s.substr(pos + key_bytes));
}

bool write_cache_entry(const std::string& path, std::string_view magic, std::string_view key_text,
                       std::string_view payload) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path target(path);
  fs::create_directories(target.parent_path(), ec);
  if (ec) return false;
  // A unique temporary name in the same directory, so the rename is atomic.
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  uint64_t tag;
  {
    std::lock_guard<std::mutex> lock(mutex);
    tag = rng();
  }
  fs::path tmp = target;
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%016llx", static_cast<long>(getpid()), static_cast<unsigned long long>(tag));
  tmp += suffix;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << magic << key_text.size() << '\n' << payload.size() << '\n';
    out.write(key_text.data(), static_cast<std::streamsize>(key_text.size()));
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    out.close();
    if (!out) {
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace kiln
