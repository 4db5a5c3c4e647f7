// NumPy .npy reading and writing. The format: the magic "\x93NUMPY", a major and minor
// version byte, the header length (2 bytes little-endian in 1.0, 4 bytes in 2.0 and 3.0),
// then the header, a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces and ending in '\n', then the raw C-order data. The reader checks
// every length and count before using it, so no byte sequence crashes it.
#include "ir/npy.h"

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              "npy I/O copies little-endian data as is and needs a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

std::string_view descr_of(DType t) {
  switch (t) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::boolean: return "|b1";
  }
  return "?";
}

std::optional<DType> dtype_of_descr(std::string_view d) {
  for (DType t : kAllDTypes)
    if (descr_of(t) == d) return t;
  return std::nullopt;
}

// Visible form of a header fragment for error messages: printable ASCII, else \xNN.
std::string printable(std::string_view s, size_t max = 40) {
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

// A parser for the header's dict literal: string keys; values that are strings, True or
// False, or tuples of non-negative integers.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name) : s_(text), name_(name) {}

  struct Fields {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<Shape> shape;
  };

  Fields parse() {
    Fields f;
    skip_space();
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (f.descr) fail("key 'descr' appears twice");
        if (peek() == '[')
          fail("unsupported dtype: structured dtypes are not supported (supported: <f4 <f8 <i4 <i8 |b1)");
        f.descr = parse_string();
      } else if (key == "fortran_order") {
        if (f.fortran_order) fail("key 'fortran_order' appears twice");
        f.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (f.shape) fail("key 'shape' appears twice");
        f.shape = parse_shape();
      } else {
        fail("unexpected key '" + printable(key) + "' (expected descr, fortran_order, shape)");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail_here("expected ',' or '}'");
    }
    ++pos_;  // '}'
    skip_space();
    if (pos_ != s_.size()) fail_here("unexpected text after the header dict");
    if (!f.descr) fail("missing key 'descr'");
    if (!f.fortran_order) fail("missing key 'fortran_order'");
    if (!f.shape) fail("missing key 'shape'");
    return f;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(std::string(name_) + ": corrupt .npy header: " + what);
  }
  [[noreturn]] void fail_here(const std::string& what) const {
    if (pos_ >= s_.size()) fail(what + ", found the end of the header");
    fail(what + ", found '" + printable(s_.substr(pos_), 20) + "'");
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c || pos_ >= s_.size()) fail_here(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    char q = peek();
    if (pos_ >= s_.size() || (q != '\'' && q != '"')) fail_here("expected a quoted string");
    size_t end = s_.find(q, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    if (out.find('\\') != std::string::npos) fail("escapes in strings are not supported");
    pos_ = end + 1;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    fail_here("expected True or False");
  }
  int64_t parse_dim() {
    if (peek() == '-') fail("negative dimension in shape");
    if (peek() < '0' || peek() > '9') fail_here("expected a dimension");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      int digit = peek() - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("shape dimension overflows int64");
      v = v * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 long literal
    return v;
  }
  // "()", "(3,)", "(3, 4)" or "(3, 4,)"; "(3)" is not a tuple in Python.
  Shape parse_shape() {
    expect('(');
    Shape shape;
    bool comma = false;
    while (true) {
      skip_space();
      if (peek() == ')') break;
      shape.push_back(parse_dim());
      skip_space();
      comma = peek() == ',';
      if (comma) {
        ++pos_;
        continue;
      }
      if (peek() != ')') fail_here("expected ',' or ')' in shape");
    }
    if (shape.size() == 1 && !comma) fail("shape must be a tuple, like (3,)");
    ++pos_;  // ')'
    return shape;
  }

  std::string_view s_;
  std::string_view name_;
  size_t pos_ = 0;
};

uint32_t read_le(std::string_view bytes, size_t offset, size_t width) {
  uint32_t v = 0;
  for (size_t i = 0; i < width; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  return v;
}

std::string shape_tuple(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

}  // namespace

Tensor parse_npy(std::string_view bytes, std::string_view name) {
  auto fail = [&](const std::string& what) -> Error { return Error(std::string(name) + ": " + what); };
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic)
    throw fail("not a .npy file (bad magic: expected \\x93NUMPY, found '" +
               printable(bytes.substr(0, kMagic.size())) + "')");
  if (bytes.size() < 8) throw fail("corrupt .npy header: file ends inside the version");
  int major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw fail("unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
               " (supported: 1.0, 2.0, 3.0)");
  size_t len_width = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_width) throw fail("corrupt .npy header: file ends inside the header length");
  size_t header_len = read_le(bytes, 8, len_width);
  size_t data_start = 8 + len_width + header_len;
  if (bytes.size() < data_start)
    throw fail("corrupt .npy header: the header is " + std::to_string(header_len) +
               " bytes but the file ends after " + std::to_string(bytes.size() - 8 - len_width));
  std::string_view header = bytes.substr(8 + len_width, header_len);

  HeaderParser::Fields f = HeaderParser(header, name).parse();
  auto dtype = dtype_of_descr(*f.descr);
  if (!dtype)
    throw fail("unsupported dtype '" + printable(*f.descr) +
               "' (supported: <f4 <f8 <i4 <i8 |b1, little-endian)");
  if (*f.fortran_order)
    throw fail("Fortran-order arrays are not supported (save with np.ascontiguousarray)");

  // The byte count, checked for overflow over the non-zero dims so that Tensor's own
  // element count cannot overflow either.
  const Shape& shape = *f.shape;
  int64_t nbytes = static_cast<int64_t>(dtype_size(*dtype));
  bool empty = false;
  for (int64_t d : shape) {
    if (d == 0) empty = true;
    else if (__builtin_mul_overflow(nbytes, d, &nbytes)) throw fail("shape " + shape_str(shape) + " is too large");
  }
  if (empty) nbytes = 0;
  size_t found = bytes.size() - data_start;
  if (static_cast<uint64_t>(nbytes) > found)
    throw fail("data is truncated: shape " + shape_str(shape) + " of " + std::string(dtype_name(*dtype)) +
               " needs " + std::to_string(nbytes) + " bytes, found " + std::to_string(found));
  if (static_cast<uint64_t>(nbytes) < found)
    throw fail("corrupt .npy file: " + std::to_string(found - nbytes) + " trailing bytes after the " +
               std::to_string(nbytes) + " bytes of data");

  Tensor t(*dtype, shape);
  if (nbytes > 0) std::memcpy(t.raw(), bytes.data() + data_start, static_cast<size_t>(nbytes));
  if (*dtype == DType::boolean) {
    uint8_t* b = t.data<uint8_t>();
    for (int64_t i = 0; i < t.numel(); ++i) b[i] = b[i] != 0;  // Kiln's bools are 0 or 1
  }
  return t;
}

std::string serialize_npy(const Tensor& t) {
  std::string dict = "{'descr': '" + std::string(descr_of(t.dtype())) +
                     "', 'fortran_order': False, 'shape': " + shape_tuple(t.shape()) + ", }";
  // Pad with spaces so that the data starts at a multiple of 64, and end with '\n'.
  size_t prefix = 10;  // magic, version, 2-byte length
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  bool v2 = total - prefix > 0xffff;
  if (v2) {
    prefix = 12;
    total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  }
  size_t header_len = total - prefix;
  std::string out(kMagic);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xff);
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  out.append(reinterpret_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

Tensor read_npy(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file (" + std::strerror(errno) + ")");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw Error(path + ": read error");
  return parse_npy(buf.str(), path);
}

void write_npy(const std::string& path, const Tensor& t) {
  std::string bytes = serialize_npy(t);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path + ": cannot open file for writing (" + std::strerror(errno) + ")");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw Error(path + ": write error (" + std::strerror(errno) + ")");
}

}  // namespace kiln
