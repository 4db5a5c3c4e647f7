// safetensors reading and writing (the format is described in ir/safetensors.h). The reader
// trusts nothing: every length, offset and count is checked against the bytes present
// before it is used, integers are read as integers (never through double), and the layout
// must be what Python's library accepts (contiguous data, no holes, no trailing bytes).
#include "ir/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "ir/error.h"
#include "ir/file_read.h"
#include "ir/printable.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O copies little-endian data as is and needs a little-endian host");

namespace {

using json = nlohmann::json;

// Python's library refuses larger headers (MAX_HEADER_SIZE); so does Kiln, before reading one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

std::string_view st_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

// The safetensors dtypes Kiln does not read, so that a file of them is refused by name
// rather than as garbage.
constexpr std::string_view kOtherDTypes[] = {"F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                                             "F6_E3M2", "I8", "U8", "I16", "U16", "U32", "U64", "C64"};

// A name or value for a message, quoted (control bytes as \xNN, long ones cut).
std::string quote_name(std::string_view s) { return "'" + printable(s, 80) + "'"; }

std::string type_name(const json& v) { return v.type_name(); }

// One tensor's entry, checked on its own.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

class Reader {
 public:
  Reader(std::string_view bytes, std::string_view name) : bytes_(bytes), name_(name) {}

  SafetensorsFile read() {
    if (bytes_.size() < 8)
      fail("not a safetensors file: it is " + std::to_string(bytes_.size()) +
           " bytes, shorter than the 8-byte header length");
    uint64_t header_len = 0;
    for (int i = 0; i < 8; ++i)
      header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[static_cast<size_t>(i)])) << (8 * i);
    if (header_len > kMaxHeaderBytes)
      fail("the header length is " + std::to_string(header_len) + " bytes, more than the " +
           std::to_string(kMaxHeaderBytes) + " allowed (not a safetensors file?)");
    if (header_len > bytes_.size() - 8)
      fail("the file is truncated: the header is " + std::to_string(header_len) + " bytes but the file ends after " +
           std::to_string(bytes_.size() - 8));
    check_flat(bytes_.substr(8, header_len));
    json header = parse_json(bytes_.substr(8, header_len));
    data_ = bytes_.substr(8 + header_len);
    if (!header.is_object()) fail("the JSON header is " + type_name(header) + ", not an object");

    SafetensorsFile file;
    std::vector<Entry> entries;
    for (const auto& [key, value] : header.items()) {
      if (key == kMetadataKey) file.metadata = parse_metadata(value);
      else entries.push_back(parse_entry(key, value));
    }
    check_layout(entries);
    for (const Entry& e : entries) {
      Tensor t(e.dtype, e.shape);
      if (e.end > e.begin) std::memcpy(t.raw(), data_.data() + e.begin, e.end - e.begin);
      if (e.dtype == DType::boolean) {
        uint8_t* b = t.data<uint8_t>();
        for (int64_t i = 0; i < t.numel(); ++i) b[i] = b[i] != 0;  // Kiln's bools are 0 or 1
      }
      file.tensors.emplace(e.name, std::move(t));
    }
    return file;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw Error(std::string(name_) + ": " + what); }
  [[noreturn]] void fail(const std::string& tensor, const std::string& what) const {
    fail("tensor " + quote_name(tensor) + ": " + what);
  }

  // The header's nesting, before nlohmann-json builds it: a safetensors header is flat (an
  // object of objects, whose only containers are the arrays of numbers shape and
  // data_offsets), and a deeper one would cost tens of bytes of memory per byte of header (a
  // 99 MB header of brackets took 5 GB). Brackets inside strings do not count; anything else
  // wrong is left to the parser's messages.
  void check_flat(std::string_view text) const {
    char open[3] = {};  // the containers enclosing the current position, outermost first
    size_t depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (in_string) {
        if (escaped) escaped = false;
        else if (c == '\\') escaped = true;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        const char* wrong = depth == 3                      ? "more than three levels of nesting"
                            : depth == 2 && open[1] == '['  ? "a container inside an array"
                            : depth == 2 && c == '{'        ? "an object inside an entry"
                                                            : nullptr;
        if (wrong)
          fail("the JSON header is not a flat safetensors header: " + std::string(wrong) + " at byte " +
               std::to_string(i) + " (a header is an object of tensor entries, objects whose shape and "
               "data_offsets are arrays of numbers)");
        open[depth++] = c;
      } else if ((c == '}' || c == ']') && depth > 0) {
        --depth;
      }
    }
  }

  // nlohmann-json's parser, with duplicate keys refused (it would keep the last silently)
  // at every level.
  json parse_json(std::string_view text) const {
    std::vector<std::set<std::string>> keys;  // of the objects being parsed, innermost last
    auto check = [&](int, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::object_start) keys.emplace_back();
      else if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
      else if (event == json::parse_event_t::key && !keys.empty() &&
               !keys.back().insert(parsed.get<std::string>()).second)
        fail("the JSON header is not valid: key " + quote_name(parsed.get<std::string>()) + " appears twice");
      return true;
    };
    try {
      return json::parse(text.begin(), text.end(), check);
    } catch (const json::exception& e) {
      fail("the JSON header is not valid: " + std::string(e.what()));
    }
  }

  std::map<std::string, std::string> parse_metadata(const json& value) const {
    if (!value.is_object()) fail("__metadata__ is " + type_name(value) + ", not an object of strings");
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : value.items()) {
      if (!v.is_string()) fail("__metadata__ " + quote_name(k) + " is " + type_name(v) + ", not a string");
      out.emplace(k, v.get<std::string>());
    }
    return out;
  }

  // A JSON integer >= 0 (never through double: a float such as 3.0 is refused).
  uint64_t count(const std::string& tensor, const json& v, const std::string& what) const {
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer()) {  // "-0" is read as a signed 0
      if (v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
      fail(tensor, what + " is negative (" + v.dump() + ")");
    }
    fail(tensor, what + " is " + (v.is_number() ? v.dump() : type_name(v)) + ", not a non-negative integer");
  }

  Entry parse_entry(const std::string& tensor, const json& v) const {
    if (!v.is_object()) fail(tensor, "the entry is " + type_name(v) + ", not an object");
    for (const auto& [k, unused] : v.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        fail(tensor, "unexpected field " + quote_name(k) + " (expected dtype, shape, data_offsets)");
    for (const char* k : {"dtype", "shape", "data_offsets"})
      if (!v.contains(k)) fail(tensor, std::string("missing field '") + k + "'");

    Entry e{tensor, DType::f32, {}, 0, 0};
    const json& dt = v["dtype"];
    if (!dt.is_string()) fail(tensor, "dtype is " + type_name(dt) + ", not a string");
    std::string dname = dt.get<std::string>();
    auto known = std::find_if(std::begin(kAllDTypes), std::end(kAllDTypes),
                              [&](DType t) { return st_name(t) == dname; });
    if (known == std::end(kAllDTypes)) {
      bool other = std::find(std::begin(kOtherDTypes), std::end(kOtherDTypes), dname) != std::end(kOtherDTypes);
      fail(tensor, (other ? "dtype " + dname + " is not supported" : "unknown dtype " + quote_name(dname)) +
                       "; Kiln reads F32, F64, I32, I64, BOOL");
    }
    e.dtype = *known;

    const json& shape = v["shape"];
    if (!shape.is_array()) fail(tensor, "shape is " + type_name(shape) + ", not an array");
    // The byte count over the non-zero dims must fit int64, so that no product of dims
    // (Tensor's element count) overflows, whatever the order of a zero among them.
    int64_t nbytes = static_cast<int64_t>(dtype_size(e.dtype));
    bool empty = false;
    for (const json& d : shape) {
      uint64_t dim = count(tensor, d, "a shape dimension");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && __builtin_mul_overflow(nbytes, static_cast<int64_t>(dim), &nbytes)))
        fail(tensor, "shape " + shape.dump() + " is too large");
      e.shape.push_back(static_cast<int64_t>(dim));
      empty = empty || dim == 0;
    }
    if (empty) nbytes = 0;

    const json& offsets = v["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      fail(tensor, "data_offsets is " + offsets.dump() + ", not an array [begin, end]");
    e.begin = count(tensor, offsets[0], "data_offsets' begin");
    e.end = count(tensor, offsets[1], "data_offsets' end");
    if (e.begin > e.end) fail(tensor, "data_offsets " + offsets.dump() + " end before they begin");
    if (e.end > data_.size())
      fail(tensor, "data_offsets " + offsets.dump() + " reach beyond the data (" + std::to_string(data_.size()) +
                       " bytes; the file is truncated?)");
    if (e.end - e.begin != static_cast<uint64_t>(nbytes))
      fail(tensor, "data_offsets " + offsets.dump() + " hold " + std::to_string(e.end - e.begin) + " bytes, but " +
                       std::string(st_name(e.dtype)) + shape_str(e.shape) + " is " + std::to_string(nbytes));
    return e;
  }

  // The tensors' bytes must tile the data exactly, as Python's library requires.
  void check_layout(std::vector<Entry>& entries) const {
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
    uint64_t at = 0;
    const Entry* prev = nullptr;
    for (const Entry& e : entries) {
      if (e.begin < at) fail(e.name, "its data overlaps tensor " + quote_name(prev->name) + "'s");
      if (e.begin > at)
        fail(e.name, "a hole of " + std::to_string(e.begin - at) + " bytes before its data (at offset " +
                         std::to_string(at) + ")");
      at = e.end;
      prev = &e;
    }
    if (at != data_.size())
      fail(std::to_string(data_.size() - at) + " trailing bytes after the tensors' " + std::to_string(at) +
           " bytes of data");
  }

  std::string_view bytes_;
  std::string_view name_;
  std::string_view data_;
};

}  // namespace

std::string serialize_safetensors(const TensorMap& tensors, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey) throw Error("cannot write a safetensors file with a tensor named '__metadata__'");
    uint64_t nbytes = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
    header[name] = {{"dtype", st_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // a name or value that is not UTF-8
    throw Error("cannot write a safetensors file: " + std::string(e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // as Python's library: the data starts 8-aligned
  std::string out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out += text;
  for (const auto& [name, t] : tensors) {
    if (t.is_splat()) {
      Tensor full = t.materialized();
      out.append(reinterpret_cast<const char*>(full.raw()), full.nbytes());
    } else {
      out.append(reinterpret_cast<const char*>(t.raw()), t.nbytes());
    }
  }
  return out;
}

SafetensorsFile parse_safetensors(std::string_view bytes, std::string_view name) {
  return Reader(bytes, name).read();
}

SafetensorsFile read_safetensors(const std::string& path) {
  return parse_safetensors(read_regular_file(path, "safetensors"), path);
}

}  // namespace kiln
