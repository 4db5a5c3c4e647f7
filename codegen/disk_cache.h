// Compiled code kept on disk between processes, shared by the backends' caches (the CUDA
// backend's CUBINs, the CPU backend's objects).
//
// An entry is a file named by the caller (typically from kiln::hash_hex of its key text)
// that holds a magic line naming its kind, the key text itself and the payload; a read
// compares the magic and the whole key text before trusting the payload (a hash match
// alone is never trusted). Writes are atomic (a temporary file in the same directory
// renamed into place), so a reader sees a whole entry or none. A missing, truncated,
// corrupt or mismatched entry is a miss, never an error; a cache that cannot be written is
// skipped.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kiln {

// $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; empty when neither variable is set.
std::string cache_directory();

// The payload stored at `path` under `magic` (one line, "\n"-terminated) for exactly
// `key_text`; nullopt for anything else.
std::optional<std::string> read_cache_entry(const std::string& path, std::string_view magic,
                                            std::string_view key_text);
// Writes the entry atomically, creating the directory; false (and nothing at `path`
// changed) if it could not.
bool write_cache_entry(const std::string& path, std::string_view magic, std::string_view key_text,
                       std::string_view payload);

}  // namespace kiln
