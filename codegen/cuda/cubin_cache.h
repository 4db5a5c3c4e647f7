// The CUBIN cache: compiled NVRTC programs kept in process and on disk, so a cached start
// skips NVRTC entirely.
//
// The key text is everything that decides the CUBIN: the whole CUDA source, the GPU
// architecture and the NVRTC version. An entry is named by the BLAKE3 hash of the key text
// (kiln::hash_hex)
// and stores the key text itself, which a hit compares before trusting the entry (a hash
// match alone is never trusted). Entries live in $XDG_CACHE_HOME/kiln (default
// ~/.cache/kiln) and are written atomically (a temporary file renamed into place), so a
// reader sees a whole entry or none. A missing, truncated, corrupt or mismatched entry is a
// miss, never an error; a cache that cannot be written is skipped.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace kiln::cuda {

// $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; empty when neither variable is set.
std::string cache_directory();

std::string cubin_key_text(std::string_view source, std::string_view arch, std::string_view nvrtc_version);

// dir/cuda-<hash of key_text>.cubin
std::string cubin_entry_path(std::string_view dir, std::string_view key_text);

// The CUBIN stored at `path` for exactly `key_text`; nullopt for anything else.
std::optional<std::string> read_cubin_entry(const std::string& path, std::string_view key_text);
// Writes the entry atomically, creating the directory; false (and nothing at `path`
// changed) if it could not.
bool write_cubin_entry(const std::string& path, std::string_view key_text, std::string_view cubin);

// The process-wide cache: memory first, then the disk directory given (empty: memory only).
// Thread-safe.
std::shared_ptr<const std::string> find_cubin(std::string_view key_text, const std::string& dir);
// What find_cubin answered so far, process-wide.
struct CubinCacheStats {
  int64_t memory_hits = 0, disk_hits = 0, misses = 0;
};
CubinCacheStats cubin_cache_stats();

// Forgets the in-memory entries (the disk stays): a later find reads the disk.
void clear_cubin_memory_cache();
void store_cubin(std::string_view key_text, std::shared_ptr<const std::string> cubin, const std::string& dir);

}  // namespace kiln::cuda
