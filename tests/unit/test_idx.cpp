// IDX loading: generated files (plain and gzip) of every element type, the Fashion-MNIST
// loader on a generated directory, every kind of bad input, truncation at every byte, and
// the real test split when the Debian package is installed.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <zlib.h>

#include <bit>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "frontend/idx.h"
#include "temp_dir.h"

using namespace kiln;
using kiln::testing::TempDir;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

void put_be(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

std::string idx_header(uint8_t type, const std::vector<uint32_t>& dims) {
  std::string h = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) put_be(h, d, 4);
  return h;
}

// u8 IDX bytes: header then `values`.
std::string idx_u8(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& values) {
  std::string s = idx_header(0x08, dims);
  s.append(values.begin(), values.end());
  return s;
}

void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == int(bytes.size()));
  gzclose(f);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string error_of(const std::string& path) {
  try {
    read_idx(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A small Fashion-MNIST-shaped set: n images of 28x28 with pixel i*7+p (mod 256).
void write_fashion_dir(const TempDir& dir, const std::string& prefix, uint32_t n,
                       const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> pixels(n * 784);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  write_gz(dir / (prefix + "-images-idx3-ubyte.gz"), idx_u8({n, 28, 28}, pixels));
  write_plain(dir / (prefix + "-labels-idx1-ubyte"), idx_u8({n}, labels));  // unpacked name
}

}  // namespace

TEST_CASE("IDX files of every element type, plain and gzip", "[idx]") {
  TempDir dir;
  std::string u8 = idx_u8({3, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255});
  write_plain(dir / "u8.idx", u8);
  write_gz(dir / "u8.idx.gz", u8);
  write_gz(dir / "gzip-without-suffix", u8);  // detected by content, not name
  for (const char* name : {"u8.idx", "u8.idx.gz", "gzip-without-suffix"}) {
    Tensor t = read_idx(dir / name);
    CHECK(t.type() == TensorType{DType::i32, {3, 2, 2}});
    CHECK(t.get_int(3) == 3);
    CHECK(t.get_int(11) == 255);
  }

  std::string i8 = idx_header(0x09, {2});
  i8 += "\xff\x05";
  std::string i16 = idx_header(0x0B, {2});
  put_be(i16, 0xfffe, 2);
  put_be(i16, 0x0102, 2);
  std::string i32 = idx_header(0x0C, {1});
  put_be(i32, 0xfffffff0u, 4);
  std::string f32 = idx_header(0x0D, {1, 1});
  put_be(f32, std::bit_cast<uint32_t>(1.5f), 4);
  std::string f64 = idx_header(0x0E, {1});
  put_be(f64, std::bit_cast<uint64_t>(-2.25), 8);

  CHECK(parse_idx(i8, "i8") == Tensor::from<int>(DType::i32, {2}, {-1, 5}));
  CHECK(parse_idx(i16, "i16") == Tensor::from<int>(DType::i32, {2}, {-2, 258}));
  CHECK(parse_idx(i32, "i32") == Tensor::from<int>(DType::i32, {1}, {-16}));
  CHECK(parse_idx(f32, "f32") == Tensor::from<double>(DType::f32, {1, 1}, {1.5}));
  CHECK(parse_idx(f64, "f64") == Tensor::from<double>(DType::f64, {1}, {-2.25}));
  CHECK(parse_idx_header(f64, "f64").data_offset == 8);
}

TEST_CASE("Fashion-MNIST loader on a generated directory", "[idx]") {
  TempDir dir;
  write_fashion_dir(dir, "t10k", 3, {9, 0, 4});
  Dataset flat = load_fashion_mnist("test", dir.path.string());
  CHECK(flat.size() == 3);
  CHECK(flat.images.type() == TensorType{DType::f32, {3, 784}});
  CHECK(flat.labels == Tensor::from<int>(DType::i32, {3}, {9, 0, 4}));
  CHECK(flat.images.get(1) == static_cast<float>(7) / 255.0f);
  CHECK(flat.images.get(785) == static_cast<float>(static_cast<uint8_t>(785 * 7)) / 255.0f);

  Dataset nchw = load_fashion_mnist("test", dir.path.string(), ImageLayout::nchw);
  CHECK(nchw.images.shape() == Shape{3, 1, 28, 28});
  CHECK(nchw.images.reshaped({3, 784}) == flat.images);

  CHECK(fashion_mnist_classes()[0] == "T-shirt/top");
  CHECK(fashion_mnist_classes()[9] == "Ankle boot");

  // The environment variable moves the default directory.
  const char* old = std::getenv("KILN_FASHION_MNIST_DIR");
  std::string saved = old ? old : "";
  setenv("KILN_FASHION_MNIST_DIR", dir.path.c_str(), 1);
  CHECK(fashion_mnist_dir() == dir.path.string());
  CHECK(load_fashion_mnist("test").size() == 3);
  if (old) setenv("KILN_FASHION_MNIST_DIR", saved.c_str(), 1);
  else unsetenv("KILN_FASHION_MNIST_DIR");
}

TEST_CASE("bad IDX and dataset files give one clear error", "[idx]") {
  TempDir dir;
  std::string d = dir.path.string();

  // Missing files name the package that provides them.
  CHECK_THROWS_WITH(load_fashion_mnist("train", d),
                    ContainsSubstring("train-images-idx3-ubyte.gz: no such file") &&
                        ContainsSubstring("apt-get install dataset-fashion-mnist"));
  CHECK_THROWS_WITH(load_fashion_mnist("valid", d), ContainsSubstring("unknown split 'valid'"));
  CHECK_THAT(error_of(dir / "nope.idx"),
             ContainsSubstring("nope.idx: cannot open: No such file"));
  CHECK_THAT(error_of(d), ContainsSubstring("is a directory"));

  write_plain(dir / "magic.idx", "\x1f\x8b\x08\x00 not really");
  CHECK_THAT(error_of(dir / "magic.idx"), ContainsSubstring("magic.idx: "));
  write_plain(dir / "text.idx", "hello world");
  CHECK_THAT(error_of(dir / "text.idx"),
             ContainsSubstring("text.idx: not an IDX file (it starts with 68 65 6c 6c"));
  std::string bad_type = idx_header(0x07, {1}) + "x";
  CHECK_THROWS_WITH(parse_idx(bad_type, "t"), ContainsSubstring("t: unknown IDX element type 07"));

  std::string truncated = idx_u8({2, 3}, {1, 2, 3, 4});
  CHECK_THROWS_WITH(parse_idx(truncated, "short.idx"),
                    ContainsSubstring("short.idx: truncated IDX data: [2,3] u8 needs 6 bytes "
                                      "after the header, found 4"));
  CHECK_THROWS_WITH(parse_idx(idx_u8({2}, {1, 2, 3}), "long.idx"),
                    ContainsSubstring("1 unexpected bytes"));
  CHECK_THROWS_WITH(parse_idx(idx_header(0x08, {0xffffffffu, 0xffffffffu, 0xffffffffu}), "huge"),
                    ContainsSubstring("impossibly large"));
  CHECK_THROWS_WITH(parse_idx(idx_header(0x08, {0, 0xffffffffu, 0xffffffffu}), "huge0"),
                    ContainsSubstring("impossibly large"));

  // Dataset-level checks: wrong dims, count mismatch, label range, image size.
  auto fashion_error = [&](uint32_t n_images, std::vector<uint32_t> image_dims,
                           std::vector<uint32_t> label_dims, std::vector<uint8_t> labels) {
    std::vector<uint8_t> pixels(n_images * 28 * 28, 0);
    uint32_t count = 1;
    for (uint32_t x : image_dims) count *= x;
    pixels.resize(count);
    write_gz(dir / "train-images-idx3-ubyte.gz", idx_u8(image_dims, pixels));
    write_gz(dir / "train-labels-idx1-ubyte.gz", idx_u8(label_dims, labels));
    try {
      load_fashion_mnist("train", d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(fashion_error(2, {2, 28, 28}, {2}, {1, 2}).empty());
  CHECK_THAT(fashion_error(2, {2, 784}, {2}, {1, 2}),
             ContainsSubstring("train-images-idx3-ubyte.gz: expected u8 images [N,H,W], found [2,784] u8"));
  CHECK_THAT(fashion_error(2, {2, 28, 28}, {2, 1}, {1, 2}),
             ContainsSubstring("train-labels-idx1-ubyte.gz: expected u8 labels [N]"));
  CHECK_THAT(fashion_error(2, {2, 28, 28}, {3}, {1, 2, 3}),
             ContainsSubstring("has 3 labels but") && ContainsSubstring("has 2 images"));
  CHECK_THAT(fashion_error(2, {2, 28, 28}, {2}, {1, 10}),
             ContainsSubstring("label 10 at index 1 is outside 0..9"));
  CHECK_THAT(fashion_error(2, {2, 27, 28}, {2}, {1, 2}), ContainsSubstring("28x28"));
}

TEST_CASE("IDX files cut at every byte, plain and gzip, fail cleanly", "[idx]") {
  TempDir dir;
  std::vector<uint8_t> values(60);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 13);
  std::string full = idx_u8({3, 4, 5}, values);
  write_gz(dir / "full.gz", full);
  std::string gz = slurp(dir / "full.gz");
  REQUIRE(gz.size() > 20);

  for (size_t cut = 0; cut < full.size(); ++cut) {
    INFO("plain, cut at " << cut);
    write_plain(dir / "cut.idx", full.substr(0, cut));
    std::string msg = error_of(dir / "cut.idx");
    CHECK_THAT(msg, ContainsSubstring("cut.idx: "));
    if (cut >= 16) CHECK_THAT(msg, ContainsSubstring("needs 60 bytes after the header, found " +
                                                     std::to_string(cut - 16)));
  }
  for (size_t cut = 0; cut < gz.size(); ++cut) {
    INFO("gzip, cut at " << cut);
    write_plain(dir / "cut.gz", gz.substr(0, cut));
    CHECK_THAT(error_of(dir / "cut.gz"), ContainsSubstring("cut.gz: "));
  }
  // Flipped bytes: an error or (where the flip hits an unchecked gzip header field) the
  // original data, never a crash or a different exception.
  for (size_t i = 0; i < gz.size(); ++i) {
    std::string bad = gz;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    write_plain(dir / "flip.gz", bad);
    INFO("gzip, byte " << i << " flipped");
    std::string msg = error_of(dir / "flip.gz");
    if (msg.empty())
      CHECK(read_idx(dir / "flip.gz") == parse_idx(full, "full"));
    else
      CHECK_THAT(msg, ContainsSubstring("flip.gz: "));
  }
}

TEST_CASE("slice_rows copies a range of rows", "[idx]") {
  Tensor t = Tensor::from<int>(DType::i32, {4, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(slice_rows(t, 1, 2) == Tensor::from<int>(DType::i32, {2, 2}, {2, 3, 4, 5}));
  CHECK(slice_rows(t, 4, 0).shape() == Shape{0, 2});
  CHECK_THROWS_WITH(slice_rows(t, 3, 2), ContainsSubstring("rows [3, 5) are out of range for i32[4,2]"));
  CHECK_THROWS_AS(slice_rows(t, -1, 1), Error);
  CHECK_THROWS_AS(slice_rows(Tensor::scalar(DType::f32, 1), 0, 1), Error);
}

TEST_CASE("the real Fashion-MNIST test split, when installed", "[idx][data]") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir)) SKIP("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
  Dataset test = load_fashion_mnist("test", dir);
  REQUIRE(test.size() == 10000);
  CHECK(test.images.type() == TensorType{DType::f32, {10000, 784}});
  const float* px = test.images.data<float>();
  float lo = 1, hi = 0;
  for (int64_t i = 0; i < test.images.numel(); ++i) {
    lo = std::min(lo, px[i]);
    hi = std::max(hi, px[i]);
  }
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
  std::vector<int> per_class(10, 0);
  for (int64_t i = 0; i < test.size(); ++i) {
    int32_t l = test.labels.data<int32_t>()[i];
    REQUIRE(l >= 0);
    REQUIRE(l <= 9);
    ++per_class[l];
  }
  CHECK(per_class == std::vector<int>(10, 1000));  // the test split is balanced
}
