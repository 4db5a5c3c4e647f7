// The visible form of bytes from a file for an error message: printable ASCII as is, any
// other byte as \xNN, cut after `max` bytes with "...". Used by the file readers (npy,
// safetensors) so that no input puts control bytes into a message.
#pragma once

#include <string>
#include <string_view>

namespace kiln {

inline std::string printable(std::string_view s, size_t max = 40) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

}  // namespace kiln
