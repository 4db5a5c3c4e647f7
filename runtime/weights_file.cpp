// The weights file (runtime/aot.h): safetensors, written by kiln_weights_write and read by
// kiln_weights_visit, with a small strict reader and writer of the runtime's own (the
// runtime depends on no JSON library: a safetensors header is flat JSON, and exactly that
// grammar is parsed). The checksums are the ones Kiln's checkpoints carry (train/checkpoint.h:
// kiln.format, kiln.crc32.NAME per tensor, kiln.crc32.__metadata__ over the rest of the
// metadata), so a checkpoint is a weights file and a weights file a checkpoint's state.
//
// The reader trusts nothing in the file: the header length is checked against the file's
// size and a 100 MB cap before anything is read, every integer is parsed with overflow
// checks, every size and offset is checked against the data present with overflow-safe
// arithmetic, the tensors must tile the data exactly (as Python's library requires), and a
// file that carries Kiln's checksums must match them. A corrupted, truncated or hostile file
// fails with a message and never makes the reader touch memory outside what it read. The
// KILNWTS1 files of earlier versions are still read, with a deprecation line on stderr.
//
// No exception leaves these functions (C callers): allocations are in try blocks.
#include "runtime/weights_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/aot.h"
#include "runtime/aot_internal.h"
#include "runtime/file_output.h"

// Tensor data is written and read as the host's bytes; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "the weights file is little-endian: a port must swap");

using namespace kiln::rt::aot;

namespace {

// Python's library refuses larger headers (MAX_HEADER_SIZE); so does Kiln, before reading one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kAlign = 64;  // of the read buffer
constexpr std::string_view kMetadataKey = "__metadata__";
// The checkpoints' metadata keys (train/checkpoint.cpp writes and checks the same).
constexpr std::string_view kFormatKey = "kiln.format";
constexpr std::string_view kFormat = "kiln-state-1";
constexpr std::string_view kCrcPrefix = "kiln.crc32.";
constexpr std::string_view kMetadataCrcKey = "kiln.crc32.__metadata__";

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as zlib's crc32: table-driven.
constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// Continues a CRC: crc32_update(0, all bytes) is the CRC of all bytes, and so is feeding
// them in pieces.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

std::string hex8(uint32_t v) {
  char b[9];
  std::snprintf(b, sizeof b, "%08" PRIx32, v);
  return b;
}

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

__attribute__((format(printf, 3, 4))) int fail(char* err, size_t err_size, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vformat(err, err_size, fmt, args);
  va_end(args);
  return -1;
}

// A name for a message: quoted, control bytes as \xNN, cut after 80 bytes (one line, whatever
// the file holds).
std::string quoted(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 80) {
      out += "...";
      break;
    }
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F) {
      char b[5];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

// ---- dtypes ----

const char* st_dtype(int32_t dtype) {
  switch (dtype) {
    case KILN_DTYPE_F32: return "F32";
    case KILN_DTYPE_F64: return "F64";
    case KILN_DTYPE_I32: return "I32";
    case KILN_DTYPE_I64: return "I64";
    case KILN_DTYPE_BOOL: return "BOOL";
    default: return nullptr;
  }
}

int32_t dtype_of(std::string_view name) {
  for (int32_t d : {KILN_DTYPE_F32, KILN_DTYPE_F64, KILN_DTYPE_I32, KILN_DTYPE_I64, KILN_DTYPE_BOOL})
    if (name == st_dtype(d)) return d;
  return -1;
}

// The safetensors dtypes Kiln does not read, so that a file of them is refused by name.
constexpr std::string_view kOtherDTypes[] = {"F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                                             "F6_E3M2", "I8",  "U8",   "I16",     "U16",     "U32",     "U64", "C64"};

// ---- UTF-8 (JSON text is UTF-8: RFC 3629, no overlong forms, no surrogates) ----

// The length of the valid UTF-8 sequence at the start of [p, p + n), or 0.
size_t utf8_sequence(const unsigned char* p, size_t n) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (len == 0 || len > n) return 0;
  for (size_t i = 1; i < len; ++i)
    if ((p[i] & 0xC0) != 0x80) return 0;
  if (c == 0xE0 && p[1] < 0xA0) return 0;   // overlong
  if (c == 0xED && p[1] >= 0xA0) return 0;  // a surrogate
  if (c == 0xF0 && p[1] < 0x90) return 0;   // overlong
  if (c == 0xF4 && p[1] >= 0x90) return 0;  // past U+10FFFF
  return len;
}

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8_sequence(p + i, s.size() - i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void put_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ---- metadata and checksums ----

struct Meta {
  std::string key, value;
};

void sort_by_key(std::vector<Meta>& m) {
  std::sort(m.begin(), m.end(), [](const Meta& a, const Meta& b) { return a.key < b.key; });
}

// The checksum of the metadata (sorted by key) but its own entry, as checkpoints compute
// it: "key\0value\0" for each entry, in key order.
uint32_t metadata_crc(const std::vector<Meta>& sorted) {
  uint32_t crc = 0;
  for (const Meta& m : sorted) {
    if (m.key == kMetadataCrcKey) continue;
    crc = crc32_update(crc, m.key.c_str(), m.key.size() + 1);
    crc = crc32_update(crc, m.value.c_str(), m.value.size() + 1);
  }
  return crc;
}

const Meta* find_meta(const std::vector<Meta>& sorted, std::string_view key) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), key,
                             [](const Meta& m, std::string_view k) { return std::string_view(m.key) < k; });
  return it != sorted.end() && it->key == key ? &*it : nullptr;
}

// ---- writing ----

// Why the tensors cannot be written, or nullptr; `index` names the culprit.
const char* tensors_error(int32_t n, const KilnAotTensor* tensors, const void* const* data, int32_t& index) {
  std::vector<std::string_view> names;
  for (index = 0; index < n; ++index) {
    const KilnAotTensor& t = tensors[index];
    if (const char* why = tensor_error(t)) return why;
    if (t.bytes && !data[index]) return "its data is NULL";
    if (t.name == kMetadataKey) return "a safetensors file cannot hold a tensor of this name";
    if (!valid_utf8(t.name)) return "its name is not UTF-8 (a safetensors header is JSON)";
    names.emplace_back(t.name);
  }
  std::sort(names.begin(), names.end());
  auto dup = std::adjacent_find(names.begin(), names.end());
  if (dup == names.end()) return nullptr;
  index = static_cast<int32_t>(
      std::find_if(tensors, tensors + n, [&](const KilnAotTensor& t) { return *dup == t.name; }) - tensors);
  return "two tensors have this name";
}

void put_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += ch;
    }
  }
  out += '"';
}

// The element size of each dtype is a power of two at most 8: data laid out largest
// elements first, from an 8-aligned start, leaves every tensor naturally aligned.
std::vector<int32_t> data_order(int32_t n, const KilnAotTensor* tensors) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype);
  });
  return order;
}

// The header (8-byte length, JSON padded with spaces to a multiple of 8) of a file of these
// tensors, whose data follows in data_order(). False with `why` set.
bool build_header(int32_t n, const KilnAotTensor* tensors, const void* const* data, std::string& header,
                  std::string& why) {
  int32_t bad = 0;
  if (const char* what = tensors_error(n, tensors, data, bad)) {
    why = "tensor " + std::to_string(bad) + " (" + quoted(tensors[bad].name ? tensors[bad].name : "") + "): " + what;
    return false;
  }
  std::vector<Meta> meta;
  meta.push_back({std::string(kFormatKey), std::string(kFormat)});
  for (int32_t i = 0; i < n; ++i)
    meta.push_back({std::string(kCrcPrefix) + tensors[i].name,
                    hex8(crc32_update(0, data[i], static_cast<size_t>(tensors[i].bytes)))});
  sort_by_key(meta);
  meta.push_back({std::string(kMetadataCrcKey), hex8(metadata_crc(meta))});
  sort_by_key(meta);

  std::vector<uint64_t> begin(static_cast<size_t>(n));
  uint64_t offset = 0;
  for (int32_t i : data_order(n, tensors)) {
    begin[static_cast<size_t>(i)] = offset;
    offset += static_cast<uint64_t>(tensors[i].bytes);  // each checked below 2^63 by tensor_error
  }
  std::string json = "{\"__metadata__\":{";
  for (size_t i = 0; i < meta.size(); ++i) {
    if (i) json += ',';
    put_json_string(json, meta[i].key);
    json += ':';
    put_json_string(json, meta[i].value);
  }
  json += '}';
  for (int32_t i = 0; i < n; ++i) {
    const KilnAotTensor& t = tensors[i];
    json += ',';
    put_json_string(json, t.name);
    json += ":{\"dtype\":\"";
    json += st_dtype(t.dtype);
    json += "\",\"shape\":[";
    for (int32_t d = 0; d < t.rank; ++d) json += (d ? "," : "") + std::to_string(t.shape[d]);
    uint64_t b = begin[static_cast<size_t>(i)];
    json += "],\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(b + static_cast<uint64_t>(t.bytes)) +
            "]}";
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');  // as Python's library: the data starts 8-aligned
  if (json.size() > kMaxHeaderBytes) {
    why = "its header would be " + std::to_string(json.size()) + " bytes, more than the " +
          std::to_string(kMaxHeaderBytes) + " a safetensors reader accepts";
    return false;
  }
  header.clear();
  header.reserve(8 + json.size());
  for (int i = 0; i < 8; ++i) header += static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  header += json;
  return true;
}

// ---- reading: the safetensors header ----

// One tensor of the header, its data at [begin, end) of the data section.
struct Entry {
  std::string name;  // NUL-terminated for the KilnAotTensor handed to visit
  int32_t dtype = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  int64_t bytes = 0;
};

// A recursive-descent parser of exactly the flat JSON of a safetensors header:
//   { "NAME": {"dtype": S, "shape": [N, ...], "data_offsets": [N, N]}, ...,
//     "__metadata__": {"KEY": "VALUE", ...} }
// with JSON's whitespace, strings (escapes, \u with surrogate pairs, UTF-8 checked) and
// non-negative integers (no sign, fraction, exponent or leading zero). Anything else is an
// error naming the byte of the header where it is.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string& why) : text_(text), why_(why) {}

  bool parse(std::vector<Entry>& entries, std::vector<Meta>& meta, bool& has_meta) {
    has_meta = false;
    ws();
    if (!expect('{', "the header to be a JSON object")) return false;
    ws();
    if (peek() == '}') {
      ++at_;
    } else {
      for (;;) {
        std::string key;
        ws();
        if (!string(key, "a tensor name")) return false;
        ws();
        if (!expect(':', "':' after a name")) return false;
        ws();
        if (key == kMetadataKey) {
          if (has_meta) return fail("__metadata__ appears twice");
          has_meta = true;
          if (!metadata(meta)) return false;
        } else {
          entries.emplace_back();
          entries.back().name = std::move(key);
          if (!entry(entries.back())) return false;
        }
        ws();
        if (peek() == ',') {
          ++at_;
          continue;
        }
        if (!expect('}', "',' or '}' after a tensor")) return false;
        break;
      }
    }
    ws();
    if (at_ != text_.size()) return fail("text after the header's JSON object");
    return true;
  }

 private:
  int peek() const { return at_ < text_.size() ? static_cast<unsigned char>(text_[at_]) : -1; }
  void ws() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
      ++at_;
  }
  bool fail(const std::string& what) {
    why_ = what + " (at byte " + std::to_string(at_) + " of the header)";
    return false;
  }
  bool expect(char c, const char* what) {
    if (peek() == static_cast<unsigned char>(c)) {
      ++at_;
      return true;
    }
    return fail(std::string("expected ") + what + (at_ < text_.size() ? "" : ", found the end of the header"));
  }

  int hex4() {
    if (text_.size() - at_ < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[at_ + static_cast<size_t>(i)];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    at_ += 4;
    return v;
  }

  bool string(std::string& out, const char* what) {
    if (peek() != '"') return fail(std::string("expected ") + what + " (a JSON string)");
    ++at_;
    out.clear();
    for (;;) {
      if (at_ >= text_.size()) return fail("a string runs past the end of the header");
      unsigned char c = static_cast<unsigned char>(text_[at_]);
      if (c == '"') {
        ++at_;
        break;
      }
      if (c < 0x20) return fail("a control byte in a string (JSON needs it escaped)");
      if (c != '\\') {
        size_t len = utf8_sequence(reinterpret_cast<const unsigned char*>(text_.data()) + at_, text_.size() - at_);
        if (len == 0) return fail("a string is not valid UTF-8");
        out.append(text_.substr(at_, len));
        at_ += len;
        continue;
      }
      ++at_;
      int e = peek();
      ++at_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          int hi = hex4();
          if (hi < 0) return fail("a \\u escape without four hex digits");
          uint32_t cp = static_cast<uint32_t>(hi);
          if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("a \\u escape of a lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(at_, 2) != "\\u") return fail("a \\u escape of a lone high surrogate");
            at_ += 2;
            int lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) return fail("a \\u escape of a high surrogate without its low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (static_cast<uint32_t>(lo) - 0xDC00);
          }
          if (cp == 0) return fail("a string holds a NUL character");
          put_utf8(out, cp);
          break;
        }
        default:
          --at_;
          return fail("an invalid escape in a string");
      }
    }
    return true;
  }

  // A JSON number that must be a non-negative integer below 2^64.
  bool count(uint64_t& v, const std::string& what) {
    if (peek() == '-') return fail(what + " is negative");
    if (peek() < '0' || peek() > '9') return fail("expected " + what + " (a non-negative integer)");
    size_t start = at_;
    v = 0;
    while (peek() >= '0' && peek() <= '9') {
      unsigned d = static_cast<unsigned>(peek() - '0');
      if (__builtin_mul_overflow(v, uint64_t{10}, &v) || __builtin_add_overflow(v, uint64_t{d}, &v))
        return fail(what + " is too large (more than 64 bits)");
      ++at_;
    }
    if (at_ - start > 1 && text_[start] == '0') return fail(what + " has a leading zero (not JSON)");
    if (peek() == '.' || peek() == 'e' || peek() == 'E') return fail(what + " is not an integer");
    return true;
  }

  bool entry(Entry& e) {
    const std::string name = quoted(e.name);
    if (!expect('{', ("tensor " + name + "'s entry to be an object").c_str())) return false;
    bool seen[3] = {false, false, false};  // dtype, shape, data_offsets
    ws();
    if (peek() == '}') return fail("tensor " + name + "'s entry is empty (it needs dtype, shape, data_offsets)");
    for (;;) {
      std::string field;
      ws();
      if (!string(field, "a field name")) return false;
      ws();
      if (!expect(':', "':' after a field name")) return false;
      ws();
      int k = field == "dtype" ? 0 : field == "shape" ? 1 : field == "data_offsets" ? 2 : -1;
      if (k < 0) return fail("tensor " + name + ": unexpected field " + quoted(field) + " (expected dtype, shape, data_offsets)");
      if (seen[k]) return fail("tensor " + name + ": field " + field + " appears twice");
      seen[k] = true;
      if (k == 0) {
        std::string dtype;
        if (!string(dtype, "the dtype")) return false;
        e.dtype = dtype_of(dtype);
        if (e.dtype < 0) {
          bool other = std::find(std::begin(kOtherDTypes), std::end(kOtherDTypes), dtype) != std::end(kOtherDTypes);
          return fail("tensor " + name + ": " + (other ? "dtype " + dtype + " is not supported" : "unknown dtype " + quoted(dtype)) +
                      "; Kiln reads F32, F64, I32, I64, BOOL");
        }
      } else {
        if (!expect('[', k == 1 ? "the shape (an array)" : "data_offsets (an array)")) return false;
        std::vector<uint64_t> items;
        ws();
        if (peek() == ']') {
          ++at_;
        } else {
          for (;;) {
            ws();
            uint64_t v = 0;
            if (!count(v, k == 1 ? "a dimension of tensor " + name : "a data offset of tensor " + name)) return false;
            if (items.size() == (k == 1 ? static_cast<size_t>(kMaxRank) : 2))
              return fail(k == 1 ? "tensor " + name + " has more than " + std::to_string(kMaxRank) + " dimensions"
                                 : "tensor " + name + "'s data_offsets has more than two entries");
            items.push_back(v);
            ws();
            if (peek() == ',') {
              ++at_;
              continue;
            }
            if (!expect(']', "',' or ']' in an array")) return false;
            break;
          }
        }
        if (k == 1) {
          for (uint64_t d : items) {
            if (d > static_cast<uint64_t>(INT64_MAX)) return fail("tensor " + name + ": a dimension is too large");
            e.shape.push_back(static_cast<int64_t>(d));
          }
        } else {
          if (items.size() != 2) return fail("tensor " + name + "'s data_offsets is not [begin, end]");
          e.begin = items[0];
          e.end = items[1];
        }
      }
      ws();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (!expect('}', "',' or '}' in a tensor's entry")) return false;
      break;
    }
    for (int k = 0; k < 3; ++k)
      if (!seen[k])
        return fail("tensor " + name + ": missing field '" + (k == 0 ? "dtype" : k == 1 ? "shape" : "data_offsets") + "'");
    return true;
  }

  bool metadata(std::vector<Meta>& meta) {
    if (!expect('{', "__metadata__ to be an object of strings")) return false;
    ws();
    if (peek() == '}') {
      ++at_;
      return true;
    }
    for (;;) {
      Meta m;
      ws();
      if (!string(m.key, "a metadata key")) return false;
      ws();
      if (!expect(':', "':' after a metadata key")) return false;
      ws();
      if (peek() != '"') return fail("__metadata__ " + quoted(m.key) + " is not a string");
      if (!string(m.value, "a metadata value")) return false;
      meta.push_back(std::move(m));
      ws();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      return expect('}', "',' or '}' in __metadata__");
    }
  }

  std::string_view text_;
  std::string& why_;
  size_t at_ = 0;
};

// The checks on what the header says, against the `data_size` bytes of data present: each
// tensor's size (no overflow) equals its data_offsets' span inside the data; the tensors
// tile the data exactly (no overlap, hole or trailing byte); names and metadata keys are
// unique. Sorts `meta` by key.
bool check_header(std::vector<Entry>& entries, std::vector<Meta>& meta, uint64_t data_size, std::string& why) {
  for (Entry& e : entries) {
    const std::string name = quoted(e.name);
    if (e.name.size() != std::strlen(e.name.c_str())) {  // a NUL only comes from \u0000, refused: kept as a guard
      why = "tensor " + name + ": its name holds a NUL character";
      return false;
    }
    int64_t bytes = dtype_size(e.dtype);
    bool empty = false;
    for (int64_t d : e.shape) {
      empty = empty || d == 0;
      if (d != 0 && __builtin_mul_overflow(bytes, d, &bytes)) {
        why = "tensor " + name + ": its shape is too large (its size overflows 64 bits)";
        return false;
      }
    }
    e.bytes = empty ? 0 : bytes;
    if (e.begin > e.end) {
      why = "tensor " + name + ": its data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
            "] end before they begin";
      return false;
    }
    if (e.end > data_size) {
      why = "tensor " + name + ": its data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
            "] reach beyond the data (" + std::to_string(data_size) + " bytes; the file is truncated?)";
      return false;
    }
    if (e.end - e.begin != static_cast<uint64_t>(e.bytes)) {
      KilnAotTensor t{e.name.c_str(), e.dtype, static_cast<int32_t>(e.shape.size()), e.shape.data(), e.bytes};
      char type[160];
      format_type(type, sizeof type, t);
      why = "tensor " + name + ": its data_offsets hold " + std::to_string(e.end - e.begin) + " bytes, but " + type +
            " is " + std::to_string(e.bytes);
      return false;
    }
  }
  std::vector<const Entry*> by_data;
  for (const Entry& e : entries) by_data.push_back(&e);
  std::sort(by_data.begin(), by_data.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_data) {
    if (e->begin < at) {
      why = "tensor " + quoted(e->name) + ": its data overlaps tensor " + quoted(prev->name) + "'s";
      return false;
    }
    if (e->begin > at) {
      why = "tensor " + quoted(e->name) + ": a hole of " + std::to_string(e->begin - at) +
            " bytes before its data (at offset " + std::to_string(at) + ")";
      return false;
    }
    at = e->end;
    prev = e;
  }
  if (at != data_size) {
    why = std::to_string(data_size - at) + " trailing bytes after the tensors' " + std::to_string(at) + " bytes of data";
    return false;
  }
  std::vector<std::string_view> names;
  for (const Entry& e : entries) names.emplace_back(e.name);
  std::sort(names.begin(), names.end());
  if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
    why = "two tensors are named " + quoted(*dup);
    return false;
  }
  sort_by_key(meta);
  for (size_t i = 1; i < meta.size(); ++i)
    if (meta[i].key == meta[i - 1].key) {
      why = "__metadata__ " + quoted(meta[i].key) + " appears twice";
      return false;
    }
  return true;
}

// The checksums, as checkpoints check them (train/checkpoint.cpp read_state): a file with
// kiln.format must carry the metadata's checksum and one per tensor, and all must match; a
// file without it (Python's safetensors, PyTorch) is checked for the checksums it has.
// The checksums are of the bytes in the file; bools are made 0 or 1 after (Kiln's bools).
bool check_checksums(const std::vector<Entry>& entries, const std::vector<Meta>& meta, uint8_t* data,
                     std::string& why) {
  const Meta* format = find_meta(meta, kFormatKey);
  if (!format) {
    if (find_meta(meta, kMetadataCrcKey)) {
      why = "the metadata has Kiln's checksum but no kiln.format (the file is corrupt)";
      return false;
    }
  } else {
    if (format->value != kFormat) {
      why = "kiln.format is " + quoted(format->value) + ", this Kiln reads '" + std::string(kFormat) +
            "' (written by another version of Kiln, or the file is corrupt)";
      return false;
    }
    const Meta* crc = find_meta(meta, kMetadataCrcKey);
    if (!crc || crc->value != hex8(metadata_crc(meta))) {
      why = "the metadata's checksum does not match (the file's header is corrupt)";
      return false;
    }
  }
  std::vector<const Entry*> by_name;
  for (const Entry& e : entries) by_name.push_back(&e);
  std::sort(by_name.begin(), by_name.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  for (const Meta& m : meta) {
    if (!std::string_view(m.key).starts_with(kCrcPrefix) || m.key == kMetadataCrcKey) continue;
    std::string_view name = std::string_view(m.key).substr(kCrcPrefix.size());
    auto it = std::lower_bound(by_name.begin(), by_name.end(), name,
                               [](const Entry* e, std::string_view n) { return std::string_view(e->name) < n; });
    if (it == by_name.end() || (*it)->name != name) {
      why = "a checksum for tensor " + quoted(name) + ", which is not in the file (the file is corrupt)";
      return false;
    }
    const Entry& e = **it;
    if (m.value != hex8(crc32_update(0, data + e.begin, static_cast<size_t>(e.end - e.begin)))) {
      why = "tensor " + quoted(name) + ": checksum mismatch (the file is corrupt)";
      return false;
    }
  }
  if (format)
    for (const Entry& e : entries)
      if (!find_meta(meta, std::string(kCrcPrefix) + e.name)) {
        why = "tensor " + quoted(e.name) + " has no checksum (the file is corrupt)";
        return false;
      }
  for (const Entry& e : entries)
    if (e.dtype == KILN_DTYPE_BOOL)
      for (uint64_t i = e.begin; i < e.end; ++i) data[i] = data[i] != 0;
  return true;
}

// ---- reading: the file ----

struct FileBytes {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FileBytes>;

// Reads exactly n bytes at `offset`; false with e = errno (0: the file ended first).
bool read_at(int fd, uint8_t* p, uint64_t n, uint64_t offset, int& e) {
  uint64_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, p + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      e = r < 0 ? errno : 0;
      return false;
    }
    got += static_cast<uint64_t>(r);
  }
  return true;
}

// A 64-byte aligned buffer of n bytes (so that data Kiln wrote is naturally aligned).
Buffer aligned_buffer(uint64_t n) {
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(kAlign, align_up(n ? n : 1))));
}

// ---- reading: the KILNWTS1 files of earlier versions (deprecated) ----
//   "KILNWTS1", u32 count, u32 reserved (0), per tensor: u32 name length, the name, i32 dtype,
//   i32 rank, i64 shape[rank], u64 bytes, u64 offset (64-aligned), the data, u32 CRC-32 of
//   every byte before it.

constexpr char kLegacyMagic[8] = {'K', 'I', 'L', 'N', 'W', 'T', 'S', '1'};
constexpr uint64_t kLegacyHeaderBytes = 16;  // magic, count, reserved
constexpr uint64_t kLegacyCrcBytes = 4;
constexpr uint64_t kLegacyEntryFixedBytes = 4 + 4 + 4 + 8 + 8;  // name length, dtype, rank, bytes, offset

// Reads little-endian fields from [p, end), failing (not reading) past the end.
struct LegacyReader {
  const uint8_t* p;
  const uint8_t* end;
  bool take(uint64_t n, const uint8_t*& at) {
    if (n > static_cast<uint64_t>(end - p)) return false;
    at = p;
    p += n;
    return true;
  }
  bool u32(uint32_t& v) {
    const uint8_t* b;
    if (!take(4, b)) return false;
    v = static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 | static_cast<uint32_t>(b[2]) << 16 |
        static_cast<uint32_t>(b[3]) << 24;
    return true;
  }
  bool u64(uint64_t& v) {
    uint32_t lo, hi;
    if (!u32(lo) || !u32(hi)) return false;
    v = lo | static_cast<uint64_t>(hi) << 32;
    return true;
  }
};

// Parses and checks the table of a KILNWTS1 file of `size` bytes whose CRC matched into
// `entries` (begin = the data's offset in the file); false with `why`.
bool parse_legacy_table(const uint8_t* file, uint64_t size, std::vector<Entry>& entries, std::string& why) {
  const uint64_t data_end = size - kLegacyCrcBytes;
  LegacyReader r{file + sizeof kLegacyMagic, file + data_end};
  uint32_t count = 0, reserved = 0;
  r.u32(count);
  r.u32(reserved);
  if (reserved != 0) {
    why = "unknown format variant (reserved field " + std::to_string(reserved) + ", expected 0)";
    return false;
  }
  // Every entry takes at least kLegacyEntryFixedBytes: a larger count is corruption.
  if (count > (data_end - kLegacyHeaderBytes) / kLegacyEntryFixedBytes) {
    why = "its table claims " + std::to_string(count) + " tensors, more than its " + std::to_string(size) +
          " bytes can hold";
    return false;
  }
  entries.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    Entry& e = entries[i];
    uint32_t len, dtype, rank;
    const uint8_t* name;
    if (!r.u32(len) || !r.take(len, name) || !r.u32(dtype) || !r.u32(rank)) {
      why = "tensor " + std::to_string(i) + "'s table entry runs past the end of the file";
      return false;
    }
    e.name.assign(reinterpret_cast<const char*>(name), len);
    if (e.name.find('\0') != std::string::npos) {
      why = "tensor " + std::to_string(i) + "'s name contains a NUL byte";
      return false;
    }
    if (!valid_utf8(e.name)) {  // it could not be saved again: the migration is load, then save
      why = "tensor " + std::to_string(i) + "'s name is not UTF-8 (a safetensors file could not hold it)";
      return false;
    }
    e.dtype = static_cast<int32_t>(dtype);
    if (dtype_size(e.dtype) == 0 || rank > static_cast<uint32_t>(kMaxRank)) {
      why = "tensor " + quoted(e.name) + " has an unknown dtype or a rank above " + std::to_string(kMaxRank);
      return false;
    }
    e.shape.resize(rank);
    uint64_t bytes = 0, offset = 0;
    for (int64_t& d : e.shape) {
      uint64_t v;
      if (!r.u64(v)) {
        why = "tensor " + quoted(e.name) + "'s table entry runs past the end of the file";
        return false;
      }
      d = static_cast<int64_t>(v);
    }
    if (!r.u64(bytes) || !r.u64(offset)) {
      why = "tensor " + quoted(e.name) + "'s table entry runs past the end of the file";
      return false;
    }
    KilnAotTensor t{e.name.c_str(), e.dtype, static_cast<int32_t>(rank), e.shape.data(), static_cast<int64_t>(bytes)};
    if (const char* what = bytes > INT64_MAX ? "size overflows 64 bits" : tensor_error(t)) {
      why = "tensor " + quoted(e.name) + ": " + what;
      return false;
    }
    e.bytes = static_cast<int64_t>(bytes);
    e.begin = offset;
  }
  // The data: in table order, each 64-byte aligned, after the table and the previous
  // tensor, inside the file. Subtractions only: no sum can overflow.
  uint64_t used = static_cast<uint64_t>(r.p - file);
  for (Entry& e : entries) {
    uint64_t bytes = static_cast<uint64_t>(e.bytes);
    if (e.begin % kAlign || e.begin < used || e.begin > data_end || bytes > data_end - e.begin) {
      why = "tensor " + quoted(e.name) + "'s data (" + std::to_string(bytes) + " bytes at offset " +
            std::to_string(e.begin) + ") is misplaced";
      return false;
    }
    e.end = e.begin + bytes;
    used = e.end;
  }
  std::vector<std::string_view> names;
  for (const Entry& e : entries) names.emplace_back(e.name);
  std::sort(names.begin(), names.end());
  if (auto dup = std::adjacent_find(names.begin(), names.end()); dup != names.end()) {
    why = "it holds two tensors named " + quoted(*dup);
    return false;
  }
  return true;
}

// Reads the KILNWTS1 file open at `fd` into `file`, checks its CRC and table; -1 with a message.
int read_legacy(const char* path, int fd, uint64_t size, Buffer& file, std::vector<Entry>& entries, char* err,
                size_t err_size) {
  static std::atomic<bool> warned{false};  // one line per process, not one per file read
  if (!warned.exchange(true))
    std::fprintf(stderr,
                 "kiln: warning: '%s' is a KILNWTS1 weights file, which this release still reads but the next will "
                 "not: save it again (NAME_save_weights, kiln::save_weights) to have it as safetensors\n",
                 path);
  if (size < kLegacyHeaderBytes + kLegacyCrcBytes)
    return fail(err, err_size, "weights file '%s' is truncated: %llu bytes, less than any KILNWTS1 file (%llu)", path,
                static_cast<unsigned long long>(size),
                static_cast<unsigned long long>(kLegacyHeaderBytes + kLegacyCrcBytes));
  file = aligned_buffer(size);
  if (!file) throw std::bad_alloc();
  int e = 0;
  if (!read_at(fd, file.get(), size, 0, e))
    return fail(err, err_size, "cannot read weights file '%s': %s", path,
                e ? std::strerror(e) : "it became shorter while being read");
  const uint8_t* c = file.get() + size - kLegacyCrcBytes;
  uint32_t stored = static_cast<uint32_t>(c[0]) | static_cast<uint32_t>(c[1]) << 8 |
                    static_cast<uint32_t>(c[2]) << 16 | static_cast<uint32_t>(c[3]) << 24;
  uint32_t computed = crc32_update(0, file.get(), size - kLegacyCrcBytes);
  if (stored != computed)
    return fail(err, err_size,
                "weights file '%s' is corrupted or truncated: its checksum is 0x%08x, its contents' 0x%08x", path,
                stored, computed);
  std::string why;
  if (!parse_legacy_table(file.get(), size, entries, why))
    return fail(err, err_size, "weights file '%s' is invalid: %s", path, why.c_str());
  return 0;
}

// Reads and checks the weights file `path`: its tensors in `entries`, their data at
// data + begin. -1 with a message.
int read_weights(const char* path, Buffer& file, uint8_t*& data, std::vector<Entry>& entries, char* err,
                 size_t err_size) {
  // O_NONBLOCK: opening a FIFO would wait for a writer (it is refused below); a regular
  // file's reads ignore the flag.
  int fd = ::open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return fail(err, err_size, "cannot read weights file '%s': %s", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  // A device or a FIFO could be endless or block forever: only regular files are read.
  if (fstat(fd, &st) != 0)
    return fail(err, err_size, "cannot read weights file '%s': %s", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(err, err_size, "cannot read weights file '%s': not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t head[8];
  int e = 0;
  if (size < 8 || !read_at(fd, head, 8, 0, e)) {
    if (e) return fail(err, err_size, "cannot read weights file '%s': %s", path, std::strerror(e));
    return fail(err, err_size,
                "'%s' is not a weights file: it is %llu bytes, shorter than a safetensors file's 8-byte header length",
                path, static_cast<unsigned long long>(size));
  }
  if (std::memcmp(head, kLegacyMagic, sizeof head) == 0) {
    if (read_legacy(path, fd, size, file, entries, err, err_size) != 0) return -1;
    data = file.get();
    return 0;
  }
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(head[i]) << (8 * i);
  if (header_len > kMaxHeaderBytes)
    return fail(err, err_size,
                "'%s' is not a weights file (safetensors): its header length is %llu bytes, more than the %llu "
                "allowed",
                path, static_cast<unsigned long long>(header_len), static_cast<unsigned long long>(kMaxHeaderBytes));
  if (header_len > size - 8)
    return fail(err, err_size, "weights file '%s' is truncated: its header is %llu bytes but the file ends after %llu",
                path, static_cast<unsigned long long>(header_len), static_cast<unsigned long long>(size - 8));
  // The data goes at a 64-byte aligned place after the header (padded to 8 bytes by writers).
  const uint64_t data_at = align_up(header_len);
  const uint64_t data_size = size - 8 - header_len;
  file = aligned_buffer(data_at + data_size);
  if (!file) throw std::bad_alloc();
  if (!read_at(fd, file.get(), header_len, 8, e) || !read_at(fd, file.get() + data_at, data_size, 8 + header_len, e))
    return fail(err, err_size, "cannot read weights file '%s': %s", path,
                e ? std::strerror(e) : "it became shorter while being read");
  std::vector<Meta> meta;
  bool has_meta = false;
  std::string why;
  std::string_view text(reinterpret_cast<const char*>(file.get()), header_len);
  if (!HeaderParser(text, why).parse(entries, meta, has_meta) || !check_header(entries, meta, data_size, why))
    return fail(err, err_size, "weights file '%s' is invalid: %s", path, why.c_str());
  data = file.get() + data_at;
  if (!check_checksums(entries, meta, data, why))
    return fail(err, err_size, "weights file '%s' is corrupted: %s", path, why.c_str());
  return 0;
}

}  // namespace

namespace kiln::rt {

bool serialize_weights(int32_t n, const KilnAotTensor* tensors, const void* const* data, std::string& out,
                       std::string& why) {
  try {
    if (n < 0 || (n > 0 && (!tensors || !data))) {
      why = "no tensors given (count " + std::to_string(n) + ")";
      return false;
    }
    if (!build_header(n, tensors, data, out, why)) return false;
    for (int32_t i : data_order(n, tensors))
      if (tensors[i].bytes) out.append(static_cast<const char*>(data[i]), static_cast<size_t>(tensors[i].bytes));
    return true;
  } catch (const std::bad_alloc&) {
    why = "out of memory";
    return false;
  }
}

}  // namespace kiln::rt

extern "C" {

int kiln_weights_write(const char* path, int32_t n, const KilnAotTensor* tensors, const void* const* data, char* err,
                       size_t err_size) {
  if (!path) return fail(err, err_size, "kiln_weights_write: the path is NULL");
  if (n < 0 || (n > 0 && (!tensors || !data)))
    return fail(err, err_size, "cannot write weights file '%s': no tensors given (count %d)", path, n);
  try {
    std::string header, why;
    if (!build_header(n, tensors, data, header, why))
      return fail(err, err_size, "cannot write weights file '%s': %s", path, why.c_str());
    // A regular file is replaced whole through a temporary (a failure leaves the old one);
    // a device is written in place. No fsync: durability across a power loss is not what a
    // weights file needs to pay for.
    kiln::rt::OutputFile out;
    bool ok = out.open(path, why) && out.write(header, why);
    for (int32_t i : data_order(n, tensors))
      if (ok && tensors[i].bytes)
        ok = out.write(std::string_view(static_cast<const char*>(data[i]), static_cast<size_t>(tensors[i].bytes)), why);
    if (ok && out.commit(/*durable=*/false, why)) return 0;
    return fail(err, err_size, "%s", why.empty() ? "cannot write weights file: out of memory" : why.c_str());
  } catch (const std::bad_alloc&) {  // the header, the names
    return fail(err, err_size, "cannot write weights file '%s': out of memory", path);
  }
}

int kiln_weights_visit(const char* path, KilnWeightsVisit visit, void* ctx, char* err, size_t err_size) {
  if (!path) return fail(err, err_size, "kiln_weights_visit: the path is NULL");
  if (!visit) return fail(err, err_size, "kiln_weights_visit: the visitor is NULL");
  try {
    Buffer file;
    uint8_t* data = nullptr;
    std::vector<Entry> entries;
    if (read_weights(path, file, data, entries, err, err_size) != 0) return -1;
    for (const Entry& e : entries) {
      KilnAotTensor t{e.name.c_str(), e.dtype, static_cast<int32_t>(e.shape.size()),
                      e.shape.empty() ? nullptr : e.shape.data(), e.bytes};
      if (int rc = visit(ctx, &t, data + e.begin)) return rc;
    }
    return 0;
  } catch (const std::bad_alloc&) {
    return fail(err, err_size, "cannot read weights file '%s': out of memory", path);
  } catch (...) {  // a visitor must not throw (it is a C callback); if one does, C callers still see none
    return fail(err, err_size, "internal error: reading weights file '%s': the visitor threw", path);
  }
}

}  // extern "C"
