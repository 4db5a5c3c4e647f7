#include "codegen/cuda/cubin_cache.h"

#include "codegen/backend.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

namespace kiln::cuda {
namespace {

constexpr std::string_view kMagic = "kiln-cubin 1\n";

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

std::string cubin_key_text(std::string_view source, std::string_view arch, std::string_view nvrtc_version) {
  return fmt::format("kiln cuda cubin\narch {}\nnvrtc {}\nsource\n{}", arch, nvrtc_version, source);
}

std::string cubin_entry_path(std::string_view dir, std::string_view key_text) {
  return fmt::format("{}/cuda-{}.cubin", dir, hash_hex(key_text));
}

std::optional<std::string> read_cubin_entry(const std::string& path, std::string_view key_text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  std::string data = std::move(ss).str();
  std::string_view s = data;
  if (!s.starts_with(kMagic)) return std::nullopt;
  size_t pos = kMagic.size();
  uint64_t key_bytes = 0, cubin_bytes = 0;
  if (!read_number(s, pos, key_bytes) || !read_number(s, pos, cubin_bytes)) return std::nullopt;
  // Sizes are checked against what is there before any arithmetic that could overflow.
  uint64_t rest = s.size() - pos;
  if (key_bytes > rest || cubin_bytes != rest - key_bytes) return std::nullopt;
  if (s.substr(pos, key_bytes) != key_text) return std::nullopt;
  return std::string(s.substr(pos + key_bytes));
}

bool write_cubin_entry(const std::string& path, std::string_view key_text, std::string_view cubin) {
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
  tmp += fmt::format(".tmp.{}.{:016x}", static_cast<long>(getpid()), tag);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out << kMagic << key_text.size() << '\n' << cubin.size() << '\n';
    out.write(key_text.data(), static_cast<std::streamsize>(key_text.size()));
    out.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
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

namespace {
struct MemoryCache {
  std::mutex mutex;
  CubinCacheStats stats;
  std::map<std::string, std::shared_ptr<const std::string>, std::less<>> entries;  // by key text
};
MemoryCache& memory_cache() {
  static MemoryCache c;
  return c;
}
}  // namespace

std::shared_ptr<const std::string> find_cubin(std::string_view key_text, const std::string& dir) {
  MemoryCache& c = memory_cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.entries.find(key_text);
    if (it != c.entries.end()) {
      ++c.stats.memory_hits;
      return it->second;
    }
  }
  auto cubin = dir.empty() ? std::nullopt : read_cubin_entry(cubin_entry_path(dir, key_text), key_text);
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!cubin) {
    ++c.stats.misses;
    return nullptr;
  }
  ++c.stats.disk_hits;
  auto shared = std::make_shared<const std::string>(std::move(*cubin));
  c.entries.insert_or_assign(std::string(key_text), shared);
  return shared;
}

CubinCacheStats cubin_cache_stats() {
  MemoryCache& c = memory_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void clear_cubin_memory_cache() {
  MemoryCache& c = memory_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.entries.clear();
}

void store_cubin(std::string_view key_text, std::shared_ptr<const std::string> cubin, const std::string& dir) {
  if (!dir.empty()) write_cubin_entry(cubin_entry_path(dir, key_text), key_text, *cubin);
  MemoryCache& c = memory_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.entries.insert_or_assign(std::string(key_text), std::move(cubin));
}

}  // namespace kiln::cuda
