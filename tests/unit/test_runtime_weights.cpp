// The weights file of runtime/aot.h (kiln_weights_write / kiln_weights_visit, and
// kiln::save_weights / load_weights over them): its exact layout, its CRC against zlib's,
// atomic writes, and a reader that fails cleanly on every corrupted or truncated file
// (run under ASan in CI, where an out-of-bounds read would be reported).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "codegen/aot.h"
#include "runtime/aot.h"
#include "temp_dir.h"

using namespace kiln;
using kiln::testing::TempDir;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;
using Catch::Matchers::StartsWith;

namespace {


std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

uint32_t zlib_crc(const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), p, static_cast<uInt>(n)));
}

// `bytes` with its last 4 bytes replaced by the CRC of the rest: a file that passes the
// checksum, so that the table checks behind it are what is tested.
std::vector<uint8_t> with_valid_crc(std::vector<uint8_t> bytes) {
  if (bytes.size() < 4) return bytes;
  uint32_t crc = zlib_crc(bytes.data(), bytes.size() - 4);
  for (int i = 0; i < 4; ++i) bytes[bytes.size() - 4 + static_cast<size_t>(i)] = static_cast<uint8_t>(crc >> (8 * i));
  return bytes;
}

void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Loads `path` and returns the error, "" if it loaded.
std::string load_error(const std::string& path) {
  try {
    load_weights(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A small file: a bool scalar and an i64 vector.
TensorMap small_tensors() {
  return {{"b", Tensor::scalar(DType::boolean, 1)},
          {"v", Tensor::from(DType::i64, {3}, std::vector<int64_t>{-1, int64_t{1} << 62, 7})}};
}

}  // namespace

TEST_CASE("the weights file is laid out as runtime/aot.h says, with zlib's CRC-32", "[aot][runtime]") {
  TempDir dir;
  const std::string path = dir / "small.weights";
  save_weights(path, small_tensors());
  std::vector<uint8_t> want;
  for (char c : std::string("KILNWTS1")) want.push_back(static_cast<uint8_t>(c));
  put_u32(want, 2);
  put_u32(want, 0);
  // table: 16 + (4+1+4+4+0+8+8) + (4+1+4+4+8+8+8) = 82 bytes: data at 128 and 192, CRC at 216
  want.push_back(1), want.push_back(0), want.push_back(0), want.push_back(0), want.push_back('b');
  put_u32(want, KILN_DTYPE_BOOL), put_u32(want, 0), put_u64(want, 1), put_u64(want, 128);
  put_u32(want, 1), want.push_back('v');
  put_u32(want, KILN_DTYPE_I64), put_u32(want, 1), put_u64(want, 3), put_u64(want, 24), put_u64(want, 192);
  want.resize(128, 0);
  want.push_back(1);
  want.resize(192, 0);
  for (int64_t v : {int64_t{-1}, int64_t{1} << 62, int64_t{7}}) put_u64(want, static_cast<uint64_t>(v));
  put_u32(want, zlib_crc(want.data(), want.size()));
  CHECK(read_bytes(path) == want);
  CHECK(dir.files() == std::vector<std::string>{"small.weights"});  // no temporary left
}

TEST_CASE("the weights file's CRC-32 is zlib's for files of many sizes", "[aot][runtime]") {
  TempDir dir;
  std::mt19937 rng(10);
  for (int64_t n : {0, 1, 3, 4, 5, 63, 64, 65, 1000, 70000, 300001}) {  // around the writer's 64 KiB buffer too
    Tensor t(DType::boolean, {n});
    for (int64_t i = 0; i < n; ++i) t.raw()[i] = static_cast<std::byte>(rng());
    const std::string path = dir / "crc.weights";
    save_weights(path, {{"t", t}});
    std::vector<uint8_t> bytes = read_bytes(path);
    REQUIRE(bytes.size() >= 20);
    CHECK(with_valid_crc(bytes) == bytes);
    CHECK(load_weights(path).at("t") == t);
  }
}

TEST_CASE("kiln::save_weights and load_weights round trip every dtype, scalars, empty tensors and splats",
          "[aot][runtime]") {
  TempDir dir;
  TensorMap tensors{
      {"f32", Tensor::from(DType::f32, {2, 3}, std::vector<float>{1.5f, -0.f, 3e38f, -1e-45f, 0, 6})},
      {"f64", Tensor::from(DType::f64, {1}, std::vector<double>{1e-310})},
      {"i32", Tensor::from(DType::i32, {2, 1, 2}, std::vector<int32_t>{-2147483647 - 1, 0, 1, 2147483647})},
      {"i64", Tensor::scalar(DType::i64, int64_t{-9007199254740993})},  // beyond 2^53: exact
      {"bool", Tensor::from(DType::boolean, {3}, std::vector<int>{1, 0, 1})},
      {"empty", Tensor(DType::f32, {0, 4})},
      {"fc1.w/odd name", Tensor::splat(Tensor::scalar(DType::f32, 0.25), {3, 5})},
  };
  const std::string path = dir / "all.weights";
  save_weights(path, tensors);
  TensorMap back = load_weights(path);
  REQUIRE(back.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    CHECK(back.at(name) == t.materialized());
    CHECK_FALSE(back.at(name).is_splat());
  }
  save_weights(path, {});  // an empty file replaces the old one
  CHECK(load_weights(path).empty());
  CHECK(read_bytes(path).size() == 20);
}

TEST_CASE("kiln_weights_write refuses bad tensors and NULL arguments", "[aot][runtime]") {
  TempDir dir;
  const std::string path = dir / "w.weights";
  char err[256];
  const int64_t shape[] = {2};
  const float data[2] = {1, 2};
  const void* ptrs[] = {data, data};
  KilnAotTensor two[] = {{"a", KILN_DTYPE_F32, 1, shape, 8}, {"a", KILN_DTYPE_F32, 1, shape, 8}};
  CHECK(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == -1);
  CHECK_THAT(err, Equals("cannot write weights file '" + path + "': tensor 0 ('a'): two tensors have this name"));
  two[1].name = "b";
  two[1].bytes = 7;
  CHECK(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == -1);
  CHECK_THAT(err, Equals("cannot write weights file '" + path + "': tensor 1 ('b'): byte size does not match the shape"));
  two[1].bytes = 8;
  two[1].dtype = 9;
  CHECK(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == -1);
  CHECK_THAT(err, ContainsSubstring("tensor 1 ('b'): unknown dtype"));
  two[1].dtype = KILN_DTYPE_F32;
  const void* null_data[] = {data, nullptr};
  CHECK(kiln_weights_write(path.c_str(), 2, two, null_data, err, sizeof err) == -1);
  CHECK_THAT(err, ContainsSubstring("tensor 1 ('b'): its data is NULL"));
  CHECK(kiln_weights_write(nullptr, 2, two, ptrs, err, sizeof err) == -1);
  CHECK_THAT(err, Equals("kiln_weights_write: the path is NULL"));
  CHECK(kiln_weights_write(path.c_str(), 2, nullptr, ptrs, err, sizeof err) == -1);
  CHECK(kiln_weights_write(path.c_str(), -1, two, ptrs, nullptr, 0) == -1);  // no message buffer: no message
  CHECK(kiln_weights_visit(path.c_str(), nullptr, nullptr, err, sizeof err) == -1);
  CHECK_THAT(err, Equals("kiln_weights_visit: the visitor is NULL"));
  CHECK(dir.files().empty());  // nothing written by any of these
  REQUIRE(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == 0);
  CHECK(load_weights(path).size() == 2);
}

TEST_CASE("a weights file that cannot be written or read fails with the path and leaves no temporary",
          "[aot][runtime]") {
  TempDir dir;
  const TensorMap t = small_tensors();
  // A folder where the file should be: the temporary is written, the rename fails.
  std::filesystem::create_directories(dir.path / "taken" / "inside");
  CHECK_THROWS_WITH(save_weights(dir / "taken", t),
                    Equals("cannot write weights file '" + dir / "taken" + "': Is a directory"));
  CHECK(dir.files() == std::vector<std::string>{"taken"});
  CHECK_THROWS_WITH(save_weights(dir / "none/x.weights", t),
                    Equals("cannot write weights file '" + dir / "none/x.weights" + "': No such file or directory"));
  CHECK_THROWS_WITH(load_weights(dir / "absent.weights"),
                    Equals("cannot read weights file '" + dir / "absent.weights" + "': No such file or directory"));
  CHECK_THROWS_WITH(load_weights(dir / "taken"),
                    Equals("cannot read weights file '" + dir / "taken" + "': not a regular file"));
  // An existing file is replaced whole.
  save_weights(dir / "w", t);
  save_weights(dir / "w", {{"only", Tensor(DType::f32, {1})}});
  CHECK(load_weights(dir / "w").size() == 1);
  CHECK(dir.files().size() == 2);

  write_bytes(dir / "npy", {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  CHECK_THAT(load_error(dir / "npy"),
             Equals("'" + dir / "npy" + "' is not a kiln weights file (it does not start with KILNWTS1)"));
}

TEST_CASE("a weights file with any byte changed fails cleanly; with its CRC fixed up the table checks hold",
          "[aot][runtime]") {
  TempDir dir;
  const std::string good = dir / "good.weights", bad = dir / "bad.weights";
  save_weights(good, small_tensors());
  const std::vector<uint8_t> bytes = read_bytes(good);
  REQUIRE(bytes.size() == 220);
  const size_t table_end = 82;
  for (size_t i = 0; i < bytes.size(); ++i)
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      INFO("byte " << i << " ^ " << int(flip));
      std::vector<uint8_t> changed = bytes;
      changed[i] ^= flip;
      write_bytes(bad, changed);
      // Any one-byte change is caught: by the magic or by the CRC.
      std::string error = load_error(bad);
      CHECK_THAT(error, ContainsSubstring("'" + bad + "'"));
      CHECK_THAT(error, ContainsSubstring(i < 8 ? "not a kiln weights file" : "is corrupted or truncated"));
      // The same change with a valid CRC: a change in the table is an invalid file or a
      // renamed tensor, never a read out of bounds; a change in the data is new data.
      if (i < 8 || i >= bytes.size() - 4) continue;
      write_bytes(bad, with_valid_crc(changed));
      error = load_error(bad);
      if (error.empty()) {
        bool name_byte = i == 20 || i == 49;  // 'b' and 'v'
        CHECK((i >= table_end || name_byte));
      } else {
        CHECK_THAT(error, StartsWith("weights file '" + bad + "' is invalid: "));
        CHECK(i < table_end);
      }
    }
}

TEST_CASE("a weights file truncated at any length fails cleanly, with or without a valid CRC", "[aot][runtime]") {
  TempDir dir;
  const std::string good = dir / "good.weights", bad = dir / "bad.weights";
  save_weights(good, small_tensors());
  const std::vector<uint8_t> bytes = read_bytes(good);
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("first " << n << " bytes");
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    write_bytes(bad, cut);
    CHECK_THAT(load_error(bad), ContainsSubstring(n < 20 ? "is truncated: " + std::to_string(n) + " bytes"
                                                         : "is corrupted or truncated"));
    if (n < 20) continue;
    write_bytes(bad, with_valid_crc(cut));
    CHECK_THAT(load_error(bad), StartsWith("weights file '" + bad + "' is invalid: "));
  }
}

TEST_CASE("the weights file reader checks the table's counts, ranks, sizes and offsets", "[aot][runtime]") {
  TempDir dir;
  const std::string path = dir / "crafted.weights";
  // A file of one f32[2] tensor "t" with its table fields chosen by the test.
  auto file = [&](uint32_t count, uint32_t reserved, int32_t rank, uint64_t dim, uint64_t bytes, uint64_t offset) {
    std::vector<uint8_t> b;
    for (char c : std::string("KILNWTS1")) b.push_back(static_cast<uint8_t>(c));
    put_u32(b, count), put_u32(b, reserved);
    put_u32(b, 1), b.push_back('t');
    put_u32(b, KILN_DTYPE_F32), put_u32(b, static_cast<uint32_t>(rank));
    for (int32_t d = 0; d < rank && d < 2; ++d) put_u64(b, dim);
    put_u64(b, bytes), put_u64(b, offset);
    b.resize(128, 0);
    put_u64(b, 0);
    put_u32(b, 0);
    write_bytes(path, with_valid_crc(b));
    return load_error(path);
  };
  const std::string invalid = "weights file '" + path + "' is invalid: ";
  CHECK(file(1, 0, 1, 2, 8, 64).empty());
  CHECK_THAT(file(1, 1, 1, 2, 8, 64), Equals(invalid + "unknown format variant (reserved field 1, expected 0): "
                                                       "written by a newer kiln?"));
  CHECK_THAT(file(0xFFFFFFFF, 0, 1, 2, 8, 64),
             Equals(invalid + "its table claims 4294967295 tensors, more than its 140 bytes can hold"));
  // A second entry read from the zeros after the first: a scalar of 0 bytes.
  CHECK_THAT(file(2, 0, 1, 2, 8, 64), Equals(invalid + "tensor '' (f32[], 0 bytes): byte size does not match the shape"));
  CHECK_THAT(file(1, 0, 16, 2, 8, 64), Equals(invalid + "tensor 't''s table entry runs past the end of the file"));
  CHECK_THAT(file(1, 0, 17, 2, 8, 64), Equals(invalid + "tensor 't' has rank 17 (at most 16)"));
  CHECK_THAT(file(1, 0, -1, 2, 8, 64), Equals(invalid + "tensor 't' has rank 4294967295 (at most 16)"));
  CHECK_THAT(file(1, 0, 1, 2, 12, 64), Equals(invalid + "tensor 't' (f32[2], 12 bytes): byte size does not match "
                                                        "the shape"));
  CHECK_THAT(file(1, 0, 2, uint64_t{1} << 62, 0, 64),
             Equals(invalid + "tensor 't' (f32[4611686018427387904,4611686018427387904], 0 bytes): size overflows "
                              "64 bits"));
  CHECK_THAT(file(1, 0, 1, ~uint64_t{0}, 8, 64),
             Equals(invalid + "tensor 't' (f32[-1], 8 bytes): negative dimension"));
  CHECK_THAT(file(1, 0, 1, 2, 8, 32), ContainsSubstring("tensor 't''s data (8 bytes at offset 32) is misplaced"));
  CHECK_THAT(file(1, 0, 1, 2, 8, 0), ContainsSubstring("is misplaced"));    // inside the table
  CHECK(file(1, 0, 1, 2, 8, 128).empty());                                  // just fits before the CRC
  CHECK_THAT(file(1, 0, 1, 2, 8, 192), ContainsSubstring("is misplaced"));  // past the end
  CHECK_THAT(file(1, 0, 1, uint64_t{1} << 61, uint64_t{1} << 63, 64), ContainsSubstring("size overflows 64 bits"));
  CHECK_THAT(file(1, 0, 1, 2, 8, ~uint64_t{63}), ContainsSubstring("is misplaced"));  // offset + bytes would wrap
}
