#include "codegen/cuda/cubin_cache.h"

#include "codegen/backend.h"
#include "codegen/disk_cache.h"

#include <fmt/format.h>

#include <map>
#include <mutex>

namespace kiln::cuda {
namespace {

constexpr std::string_view kMagic = "kiln-cubin 1\n";

}  // namespace

std::string cache_directory() { return kiln::cache_directory(); }

std::string cubin_key_text(std::string_view source, std::string_view arch, std::string_view nvrtc_version) {
  return fmt::format("kiln cuda cubin\narch {}\nnvrtc {}\nsource\n{}", arch, nvrtc_version, source);
}

std::string cubin_entry_path(std::string_view dir, std::string_view key_text) {
  return fmt::format("{}/cuda-{}.cubin", dir, hash_hex(key_text));
}

std::optional<std::string> read_cubin_entry(const std::string& path, std::string_view key_text) {
  return read_cache_entry(path, kMagic, key_text);
}

bool write_cubin_entry(const std::string& path, std::string_view key_text, std::string_view cubin) {
  return write_cache_entry(path, kMagic, key_text, cubin);
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
