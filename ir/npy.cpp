// NumPy .npy reading and writing. The format: the magic "\x93NUMPY", a major and minor
// version byte, the header length (2 bytes little-endian in 1.0, 4 bytes in 2.0 and 3.0),
// then the header, a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// padded with spaces and ending in '\n', then the raw C-order data. The reader checks
// every length and count before using it, so no byte sequence crashes it.
#include "ir/npy.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "ir/printable.h"

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

namespace {

// Checks the magic and the version at the start of a file (its first 12 bytes, or all of
// it if shorter) and returns where the header starts: after the header length's 2 or 4 bytes.
size_t check_start(std::string_view start, std::string_view name) {
  auto fail = [&](const std::string& what) -> Error { return Error(std::string(name) + ": " + what); };
  if (start.size() < kMagic.size() || start.substr(0, kMagic.size()) != kMagic)
    throw fail("not a .npy file (bad magic: expected \\x93NUMPY, found '" +
               printable(start.substr(0, kMagic.size())) + "')");
  if (start.size() < 8) throw fail("corrupt .npy header: file ends inside the version");
  int major = static_cast<unsigned char>(start[6]), minor = static_cast<unsigned char>(start[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw fail("unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
               " (supported: 1.0, 2.0, 3.0)");
  size_t len_width = major == 1 ? 2 : 4;
  if (start.size() < 8 + len_width) throw fail("corrupt .npy header: file ends inside the header length");
  return 8 + len_width;
}

[[noreturn]] void header_truncated(size_t header_len, size_t found, std::string_view name) {
  throw Error(std::string(name) + ": corrupt .npy header: the header is " + std::to_string(header_len) +
              " bytes but the file ends after " + std::to_string(found));
}

// What the header says the data is.
struct Layout {
  DType dtype;
  Shape shape;
  int64_t nbytes;
};

Layout parse_layout(std::string_view header, std::string_view name) {
  auto fail = [&](const std::string& what) -> Error { return Error(std::string(name) + ": " + what); };
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
  return {*dtype, shape, empty ? 0 : nbytes};
}

// Checks that the data after the header (`found` bytes) is exactly what the layout needs.
void check_data_size(const Layout& l, uint64_t found, std::string_view name) {
  auto fail = [&](const std::string& what) -> Error { return Error(std::string(name) + ": " + what); };
  if (static_cast<uint64_t>(l.nbytes) > found)
    throw fail("data is truncated: shape " + shape_str(l.shape) + " of " + std::string(dtype_name(l.dtype)) +
               " needs " + std::to_string(l.nbytes) + " bytes, found " + std::to_string(found));
  if (static_cast<uint64_t>(l.nbytes) < found)
    throw fail("corrupt .npy file: " + std::to_string(found - static_cast<uint64_t>(l.nbytes)) +
               " trailing bytes after the " + std::to_string(l.nbytes) + " bytes of data");
}

void normalize_bools(Tensor& t) {
  if (t.dtype() != DType::boolean) return;
  uint8_t* b = t.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) b[i] = b[i] != 0;  // Kiln's bools are 0 or 1
}

}  // namespace

Tensor parse_npy(std::string_view bytes, std::string_view name) {
  size_t header_start = check_start(bytes.substr(0, 12), name);
  size_t header_len = read_le(bytes, 8, header_start - 8);
  size_t data_start = header_start + header_len;
  if (bytes.size() < data_start) header_truncated(header_len, bytes.size() - header_start, name);
  Layout l = parse_layout(bytes.substr(header_start, header_len), name);
  check_data_size(l, bytes.size() - data_start, name);
  Tensor t(l.dtype, l.shape);
  if (l.nbytes > 0) std::memcpy(t.raw(), bytes.data() + data_start, static_cast<size_t>(l.nbytes));
  normalize_bools(t);
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

// The header is read and checked first, then exactly the data it declares (after checking
// a regular file's size), so that no file makes the reader hold more than its data.
Tensor read_npy(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a directory, not a .npy file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) throw Error(path + ": cannot open file (" + std::strerror(errno) + ")");
  auto read = [&](void* to, size_t n) {
    size_t got = std::fread(to, 1, n, f.get());
    if (got < n && std::ferror(f.get())) throw Error(path + ": read error (" + std::strerror(errno) + ")");
    return got;
  };
  std::string start(12, '\0');
  start.resize(read(start.data(), start.size()));
  size_t header_start = check_start(start, path);
  size_t header_len = read_le(start, 8, header_start - 8);
  std::string header = start.substr(header_start);
  while (header.size() < header_len) {  // in chunks: the length may be a lie of 4 GiB
    size_t have = header.size(), chunk = std::min<size_t>(header_len - have, 1 << 16);
    header.resize(have + chunk);
    size_t got = read(header.data() + have, chunk);
    header.resize(have + got);
    if (got < chunk) header_truncated(header_len, header.size(), path);
  }
  std::string_view rest = std::string_view(header).substr(header_len);  // data read with the start
  Layout l = parse_layout(std::string_view(header).substr(0, header_len), path);
  std::filesystem::path p(path);
  if (std::filesystem::is_regular_file(p, ec)) {
    uintmax_t size = std::filesystem::file_size(p, ec);
    if (!ec && size >= header_start + header_len) check_data_size(l, size - header_start - header_len, path);
  }
  Tensor t(l.dtype, l.shape);
  size_t want = static_cast<size_t>(l.nbytes);
  size_t have = std::min(rest.size(), want);
  if (have) std::memcpy(t.raw(), rest.data(), have);
  size_t got = want > have ? have + read(t.raw() + have, want - have) : have;
  // Data beyond the declared size: count what follows, up to a bound.
  char extra[4096];
  size_t trailing = rest.size() - have + read(extra, sizeof extra);
  check_data_size(l, got + trailing, path);
  normalize_bools(t);
  return t;
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
