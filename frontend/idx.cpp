#include "frontend/idx.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

namespace kiln {

namespace {

constexpr uint64_t kMaxFileBytes = uint64_t{2} << 30;  // a guard against gzip bombs

[[noreturn]] void fail(std::string_view name, const std::string& what) {
  throw Error(std::string(name) + ": " + what);
}

size_t element_size(IdxType t) {
  switch (t) {
    case IdxType::u8: case IdxType::i8: return 1;
    case IdxType::i16: return 2;
    case IdxType::i32: case IdxType::f32: return 4;
    case IdxType::f64: return 8;
  }
  return 0;
}

const char* type_name(IdxType t) {
  switch (t) {
    case IdxType::u8: return "u8";
    case IdxType::i8: return "i8";
    case IdxType::i16: return "i16";
    case IdxType::i32: return "i32";
    case IdxType::f32: return "f32";
    case IdxType::f64: return "f64";
  }
  return "?";
}

bool valid_type(uint8_t code) {
  return code == 0x08 || code == 0x09 || code == 0x0B || code == 0x0C || code == 0x0D ||
         code == 0x0E;
}

uint64_t read_be(const unsigned char* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

std::string hex_bytes(std::string_view b, size_t n) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < std::min(n, b.size()); ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(b[i]));
    s += (i ? " " : "") + std::string(buf);
  }
  return s;
}

}  // namespace

namespace {

// The checks of the first 4 bytes (zero bytes, element type), the dims and their product:
// how many element bytes follow a well-formed header. `bytes` holds at least the header.
uint64_t idx_data_bytes(std::string_view bytes, std::string_view name, IdxHeader& h) {
  auto u = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  if (bytes.size() < 4)
    fail(name, "too short for an IDX header (" + std::to_string(bytes.size()) + " bytes, need 4)");
  if (u(0) != 0 || u(1) != 0)
    fail(name, "not an IDX file (it starts with " + hex_bytes(bytes, 4) + ", not 00 00)");
  if (!valid_type(u(2)))
    fail(name, "unknown IDX element type " + hex_bytes(bytes.substr(2), 1) +
                   " (known: 08 u8, 09 i8, 0b i16, 0c i32, 0d f32, 0e f64)");
  h.type = static_cast<IdxType>(u(2));
  size_t ndims = u(3);
  h.data_offset = 4 + 4 * ndims;
  if (bytes.size() < h.data_offset)
    fail(name, "IDX header is truncated: " + std::to_string(ndims) + " dimensions need " +
                   std::to_string(h.data_offset) + " bytes, the file has " +
                   std::to_string(bytes.size()));
  // `magnitude` ignores zero dims, so [0, 2^32-1, 2^32-1] is rejected too: callers may
  // multiply any of the dims together.
  uint64_t count = 1, magnitude = 1;
  bool overflow = false;
  for (size_t i = 0; i < ndims; ++i) {
    uint64_t d = read_be(reinterpret_cast<const unsigned char*>(bytes.data()) + 4 + 4 * i, 4);
    h.dims.push_back(static_cast<int64_t>(d));
    if (d > 1 && magnitude > (uint64_t{1} << 48) / d) overflow = true;
    if (!overflow) magnitude *= std::max<uint64_t>(d, 1);
    count *= d;
  }
  if (overflow) fail(name, "IDX dimensions " + shape_str(h.dims) + " " + type_name(h.type) + " are impossibly large");
  return count * element_size(h.type);
}

}  // namespace

std::string read_idx_file(const std::string& path) {
  std::error_code ec;  // the error_code overloads never throw
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, not a file");
  // gzopen reads plain files transparently, so one path serves both.
  errno = 0;
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), gzclose);
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno ? errno : ENOENT));
  std::string out;
  // Appends up to `n` more bytes; a gzip error is reported at once, a short file is left
  // for the header checks to describe.
  auto read = [&](uint64_t n) {
    while (n > 0) {
      unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(n, 1 << 20));
      size_t have = out.size();
      out.resize(have + chunk);
      int got = gzread(f.get(), out.data() + have, chunk);
      out.resize(have + static_cast<size_t>(std::max(got, 0)));
      if (got < static_cast<int>(chunk)) break;
      n -= chunk;
    }
    int err = Z_OK;
    std::string msg = gzerror(f.get(), &err);
    if (msg.starts_with(path + ": ")) msg.erase(0, path.size() + 2);  // zlib names the file too
    if (err == Z_BUF_ERROR)
      fail(path, "gzip data is truncated (ends after " + std::to_string(out.size()) + " uncompressed bytes)");
    if (err != Z_OK) fail(path, "corrupt gzip data (zlib: " + msg + ")");
  };
  IdxHeader h;
  read(4);
  if (out.size() == 4) read(4 * static_cast<unsigned char>(out[3]));  // the dims
  uint64_t want = idx_data_bytes(out, path, h);
  // The data and a little more, so that trailing bytes are reported; a file that really
  // holds more than kMaxFileBytes is refused (one that only claims to is truncated).
  read(std::min(want + 4096, kMaxFileBytes + 1 - out.size()));
  if (out.size() > kMaxFileBytes) fail(path, "is larger than 2 GiB uncompressed; refusing to read it");
  return out;
}

IdxHeader parse_idx_header(std::string_view bytes, std::string_view name) {
  IdxHeader h;
  uint64_t want = idx_data_bytes(bytes, name, h);
  std::string desc = shape_str(h.dims) + " " + type_name(h.type);
  uint64_t have = bytes.size() - h.data_offset;
  if (have < want)
    fail(name, "truncated IDX data: " + desc + " needs " + std::to_string(want) +
                   " bytes after the header, found " + std::to_string(have));
  if (have > want)
    fail(name, std::to_string(have - want) + " unexpected bytes after the " + desc +
                   " IDX data (expected " + std::to_string(want) + ")");
  return h;
}

Tensor parse_idx(std::string_view bytes, std::string_view name) {
  IdxHeader h = parse_idx_header(bytes, name);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + h.data_offset;
  size_t es = element_size(h.type);
  auto fill = [&]<typename T>(DType dtype, auto convert) {
    Tensor t(dtype, h.dims);
    T* out = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = convert(read_be(p + i * es, es));
    return t;
  };
  switch (h.type) {
    case IdxType::u8: return fill.operator()<int32_t>(DType::i32, [](uint64_t v) { return int32_t(v); });
    case IdxType::i8: return fill.operator()<int32_t>(DType::i32, [](uint64_t v) { return int32_t(int8_t(v)); });
    case IdxType::i16: return fill.operator()<int32_t>(DType::i32, [](uint64_t v) { return int32_t(int16_t(v)); });
    case IdxType::i32: return fill.operator()<int32_t>(DType::i32, [](uint64_t v) { return int32_t(uint32_t(v)); });
    case IdxType::f32:
      return fill.operator()<float>(DType::f32, [](uint64_t v) { return std::bit_cast<float>(uint32_t(v)); });
    case IdxType::f64:
      return fill.operator()<double>(DType::f64, [](uint64_t v) { return std::bit_cast<double>(v); });
  }
  fail(name, "unknown IDX element type");
}

Tensor read_idx(const std::string& path) { return parse_idx(read_idx_file(path), path); }

Dataset load_mnist_files(const std::string& images_path, const std::string& labels_path,
                         ImageLayout layout, int num_classes) {
  std::string image_bytes = read_idx_file(images_path);
  IdxHeader ih = parse_idx_header(image_bytes, images_path);
  if (ih.type != IdxType::u8 || ih.dims.size() != 3)
    fail(images_path, "expected u8 images [N,H,W], found " + shape_str(ih.dims) + " " +
                          type_name(ih.type));
  std::string label_bytes = read_idx_file(labels_path);
  IdxHeader lh = parse_idx_header(label_bytes, labels_path);
  if (lh.type != IdxType::u8 || lh.dims.size() != 1)
    fail(labels_path, "expected u8 labels [N], found " + shape_str(lh.dims) + " " +
                          type_name(lh.type));
  int64_t n = ih.dims[0], h = ih.dims[1], w = ih.dims[2];
  if (lh.dims[0] != n)
    fail(labels_path, "has " + std::to_string(lh.dims[0]) + " labels but " + images_path +
                          " has " + std::to_string(n) + " images");

  Dataset ds;
  ds.labels = Tensor(DType::i32, {n});
  const auto* lp = reinterpret_cast<const unsigned char*>(label_bytes.data()) + lh.data_offset;
  for (int64_t i = 0; i < n; ++i) {
    if (lp[i] >= num_classes)
      fail(labels_path, "label " + std::to_string(lp[i]) + " at index " + std::to_string(i) +
                            " is outside 0.." + std::to_string(num_classes - 1));
    ds.labels.data<int32_t>()[i] = lp[i];
  }
  Shape shape = layout == ImageLayout::flat ? Shape{n, h * w} : Shape{n, 1, h, w};
  ds.images = Tensor(DType::f32, shape);
  const auto* ip = reinterpret_cast<const unsigned char*>(image_bytes.data()) + ih.data_offset;
  float* out = ds.images.data<float>();
  for (int64_t i = 0; i < ds.images.numel(); ++i) out[i] = static_cast<float>(ip[i]) / 255.0f;
  return ds;
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("KILN_FASHION_MNIST_DIR");
  return env && *env ? env : "/usr/share/datasets/fashion-mnist";
}

Dataset load_fashion_mnist(std::string_view split, const std::string& dir, ImageLayout layout) {
  std::string prefix;
  if (split == "train") prefix = "train";
  else if (split == "test") prefix = "t10k";
  else throw Error("load_fashion_mnist: unknown split '" + std::string(split) + "' (use train or test)");
  // Prefer NAME.gz, accept an unpacked NAME.
  auto locate = [&](const std::string& base) {
    std::filesystem::path p = std::filesystem::path(dir) / base;
    for (const std::string& candidate : {p.string() + ".gz", p.string()})
      if (std::error_code ec; std::filesystem::is_regular_file(candidate, ec)) return candidate;
    fail(p.string() + ".gz", "no such file; Fashion-MNIST comes with the Debian package "
                             "dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or "
                             "set KILN_FASHION_MNIST_DIR to a directory holding it");
  };
  std::string images = locate(prefix + "-images-idx3-ubyte");
  std::string labels = locate(prefix + "-labels-idx1-ubyte");
  Dataset ds = load_mnist_files(images, labels, layout, 10);
  int64_t side = layout == ImageLayout::flat ? ds.images.shape()[1] : ds.images.shape()[2] * ds.images.shape()[3];
  if (side != 28 * 28) fail(images, "Fashion-MNIST images are 28x28; these are not");
  return ds;
}

const std::array<std::string_view, 10>& fashion_mnist_classes() {
  static const std::array<std::string_view, 10> names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

Tensor slice_rows(const Tensor& t, int64_t begin, int64_t count) {
  if (t.rank() == 0) throw Error("slice_rows: cannot slice the rows of a scalar");
  int64_t rows = t.shape()[0];
  if (begin < 0 || count < 0 || begin > rows || count > rows - begin)
    throw Error("slice_rows: rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                ") are out of range for " + t.type().str());
  Shape s = t.shape();
  s[0] = count;
  Tensor out(t.dtype(), s);
  size_t row_bytes = rows ? t.nbytes() / static_cast<size_t>(rows) : 0;
  if (count > 0)
    std::memcpy(out.raw(), t.raw() + static_cast<size_t>(begin) * row_bytes,
                static_cast<size_t>(count) * row_bytes);
  return out;
}

}  // namespace kiln
