// The weights file of runtime/aot.h (kiln_weights_write / kiln_weights_visit, and
// kiln::save_weights / serialize_weights / load_weights over them): safetensors with the
// checksums of Kiln's checkpoints, byte for byte; the same files as checkpoints, Python's
// safetensors and ir/safetensors.h read and write; a strict header parser that fails
// cleanly on every corrupted, truncated or crafted file (run under ASan in CI, where an
// out-of-bounds read would be reported); the deprecated KILNWTS1 files still read.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <sys/stat.h>
#include <zlib.h>

#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "codegen/aot.h"
#include "ir/safetensors.h"
#include "runtime/aot.h"
#include "subprocess.h"
#include "temp_dir.h"
#include "train/checkpoint.h"

using namespace kiln;
using kiln::testing::TempDir;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::Equals;
using Catch::Matchers::StartsWith;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

uint32_t zlib_crc(const void* p, size_t n, uint32_t crc = 0) {
  return static_cast<uint32_t>(crc32(crc, static_cast<const Bytef*>(p), static_cast<uInt>(n)));
}

std::string hex(uint32_t v) {
  char b[9];
  std::snprintf(b, sizeof b, "%08" PRIx32, v);
  return b;
}

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A safetensors file of this JSON header (padded to 8 bytes) and data.
std::string safetensors(std::string json, const std::string& data) {
  json.append((8 - json.size() % 8) % 8, ' ');
  return le64(json.size()) + json + data;
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

TEST_CASE("the weights file is safetensors with the checkpoints' checksums, byte for byte", "[aot][runtime]") {
  TempDir dir;
  const std::string path = dir / "small.safetensors";
  save_weights(path, small_tensors());
  std::string v_data;
  for (int64_t x : {int64_t{-1}, int64_t{1} << 62, int64_t{7}}) v_data += le64(static_cast<uint64_t>(x));
  const std::string b_crc = hex(zlib_crc("\x01", 1)), v_crc = hex(zlib_crc(v_data.data(), v_data.size()));
  // The metadata's checksum: "key\0value\0" of every other entry, in key order.
  std::string entries = "kiln.crc32.b" + std::string(1, '\0') + b_crc + '\0' + "kiln.crc32.v" + '\0' + v_crc + '\0' +
                        "kiln.format" + '\0' + "kiln-state-1" + '\0';
  const std::string meta_crc = hex(zlib_crc(entries.data(), entries.size()));
  // The data largest elements first (each naturally aligned); the header in the given order.
  const std::string json = R"({"__metadata__":{"kiln.crc32.__metadata__":")" + meta_crc + R"(","kiln.crc32.b":")" +
                           b_crc + R"(","kiln.crc32.v":")" + v_crc +
                           R"(","kiln.format":"kiln-state-1"},"b":{"dtype":"BOOL","shape":[],"data_offsets":[24,25]},)"
                           R"("v":{"dtype":"I64","shape":[3],"data_offsets":[0,24]}})";
  CHECK(read_bytes(path) == safetensors(json, v_data + '\x01'));
  CHECK(dir.files() == std::vector<std::string>{"small.safetensors"});  // no temporary left
  CHECK(serialize_weights(small_tensors()) == read_bytes(path));
}

TEST_CASE("weights files and checkpoints are one format: each reads the other, checksums checked",
          "[aot][runtime][checkpoint]") {
  TempDir dir;
  TensorMap state{{"fc.weight", Tensor::from(DType::f32, {2, 2}, std::vector<float>{1, -2, 3.5f, 0})},
                  {"step", Tensor::scalar(DType::i64, int64_t{12})},
                  {"mask", Tensor::from(DType::boolean, {3}, std::vector<int>{1, 0, 1})}};
  // A checkpoint (train/checkpoint.h, with its own metadata) is a weights file ...
  save_state(dir / "ckpt.safetensors", state, {{"kiln.epoch", "3"}});
  CHECK(load_weights(dir / "ckpt.safetensors") == state);
  // ... and a weights file a state file, its checksums valid for read_state.
  save_weights(dir / "w.safetensors", state);
  SafetensorsFile back = read_state(dir / "w.safetensors");
  CHECK(back.tensors == state);
  CHECK(back.metadata.at("kiln.format") == "kiln-state-1");
  CHECK(back.metadata.at("kiln.crc32.fc.weight") == hex(zlib_crc(state.at("fc.weight").raw(), 16)));
  // A file of Python's safetensors (no metadata, no checksums) reads too.
  write_bytes(dir / "py.safetensors", serialize_safetensors(state));
  CHECK(load_weights(dir / "py.safetensors") == state);
  // A flipped byte of a checkpoint's data is caught by its checksum, naming the tensor.
  std::string bytes = read_bytes(dir / "ckpt.safetensors");
  bytes[bytes.size() - 1] ^= 0x10;  // the last tensor's data (step, by name order)
  write_bytes(dir / "bad.safetensors", bytes);
  CHECK_THAT(load_error(dir / "bad.safetensors"),
             Equals("weights file '" + dir / "bad.safetensors" +
                    "' is corrupted: tensor 'step': checksum mismatch (the file is corrupt)"));
}

TEST_CASE("the weights file's checksums are zlib's CRC-32 for tensors of many sizes", "[aot][runtime]") {
  TempDir dir;
  std::mt19937 rng(10);
  for (int64_t n : {0, 1, 3, 4, 5, 63, 64, 65, 1000, 70000, 300001}) {
    Tensor t(DType::boolean, {n});
    for (int64_t i = 0; i < n; ++i) t.raw()[i] = static_cast<std::byte>(rng() & 1);
    const std::string path = dir / "crc.safetensors";
    save_weights(path, {{"t", t}});
    SafetensorsFile f = read_safetensors(path);
    CHECK(f.metadata.at("kiln.crc32.t") == hex(zlib_crc(t.raw(), static_cast<size_t>(n))));
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
      {"fc1.w/odd \"name\"\t\x01 \xc3\xa9", Tensor::splat(Tensor::scalar(DType::f32, 0.25), {3, 5})},
  };
  const std::string path = dir / "all.safetensors";
  save_weights(path, tensors);
  TensorMap back = load_weights(path);
  REQUIRE(back.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    CHECK(back.at(name) == t.materialized());
    CHECK_FALSE(back.at(name).is_splat());
  }
  CHECK(read_safetensors(path).tensors == back);  // the JSON escapes as nlohmann-json reads them
  save_weights(path, {});  // an empty file replaces the old one
  CHECK(load_weights(path).empty());
}

TEST_CASE("kiln_weights_write refuses bad tensors and NULL arguments", "[aot][runtime]") {
  TempDir dir;
  const std::string path = dir / "w.safetensors";
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
  two[1].name = "__metadata__";
  CHECK(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == -1);
  CHECK_THAT(err, ContainsSubstring("tensor 1 ('__metadata__'): a safetensors file cannot hold a tensor of this name"));
  two[1].name = "\xff";
  CHECK(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == -1);
  CHECK_THAT(err, ContainsSubstring("its name is not UTF-8 (a safetensors header is JSON)"));
  two[1].name = "b";
  // Empty, but its other dimensions' product overflows: the safetensors reader refuses such
  // a header, so the writer (and the KILNWTS1 reader, which shares this check) refuses it
  // too, as fuzz_weights found.
  const int64_t huge[] = {0, int64_t{1} << 40, int64_t{1} << 40};
  two[1].rank = 3, two[1].shape = huge, two[1].bytes = 0;
  CHECK(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == -1);
  CHECK_THAT(err, ContainsSubstring("tensor 1 ('b'): size overflows 64 bits"));
  const int64_t fits[] = {0, int64_t{1} << 20, int64_t{1} << 20};
  two[1].shape = fits;
  REQUIRE(kiln_weights_write(path.c_str(), 2, two, ptrs, err, sizeof err) == 0);
  CHECK(load_weights(path).at("b").shape() == std::vector<int64_t>{0, 1 << 20, 1 << 20});
  std::filesystem::remove(path);
  two[1].rank = 1, two[1].shape = shape, two[1].bytes = 8;
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
  std::filesystem::create_directories(dir.path / "taken" / "inside");
  CHECK_THROWS_WITH(save_weights(dir / "taken", t),
                    Equals("cannot write '" + dir / "taken" + "': it is a folder (name a file in it)"));
  CHECK(dir.files() == std::vector<std::string>{"taken"});
  CHECK_THROWS_WITH(save_weights(dir / "none/x.safetensors", t),
                    Equals("cannot write '" + dir / "none/x.safetensors" + "': its folder '" + dir / "none" +
                           "' does not exist"));
  CHECK_THROWS_WITH(load_weights(dir / "absent.safetensors"),
                    Equals("cannot read weights file '" + dir / "absent.safetensors" + "': No such file or directory"));
  CHECK_THROWS_WITH(load_weights(dir / "taken"),
                    Equals("cannot read weights file '" + dir / "taken" + "': not a regular file"));
  // A FIFO would block a reader forever, /dev/zero never end: neither is read.
  REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
  CHECK_THAT(load_error(dir / "fifo"), Equals("cannot read weights file '" + dir / "fifo" + "': not a regular file"));
  CHECK_THAT(load_error("/dev/zero"), Equals("cannot read weights file '/dev/zero': not a regular file"));
  // An existing file is replaced whole; a device is written in place, never replaced.
  save_weights(dir / "w", t);
  save_weights(dir / "w", {{"only", Tensor(DType::f32, {1})}});
  CHECK(load_weights(dir / "w").size() == 1);
  CHECK(dir.files().size() == 3);
  save_weights("/dev/null", t);
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));

  // Not safetensors: an .npy file's first 8 bytes make a header length far above the cap.
  write_bytes(dir / "npy", std::string("\x93NUMPY\x01\x00", 8) + std::string(20, ' '));
  CHECK_THAT(load_error(dir / "npy"),
             Equals("'" + dir / "npy" +
                    "' is not a weights file (safetensors): its header length is 379676406402707 bytes, more than "
                    "the 100000000 allowed"));
  write_bytes(dir / "short", "abc");
  CHECK_THAT(load_error(dir / "short"),
             Equals("'" + dir / "short" +
                    "' is not a weights file: it is 3 bytes, shorter than a safetensors file's 8-byte header length"));
}

TEST_CASE("a weights file with any byte changed fails cleanly", "[aot][runtime]") {
  TempDir dir;
  const std::string good = dir / "good.safetensors", bad = dir / "bad.safetensors";
  save_weights(good, small_tensors());
  const std::string bytes = read_bytes(good);
  for (size_t i = 0; i < bytes.size(); ++i)
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      INFO("byte " << i << " ^ " << int(flip));
      std::string changed = bytes;
      changed[i] = static_cast<char>(changed[i] ^ flip);
      write_bytes(bad, changed);
      // The header's length, its JSON, the metadata's checksum and the data's: every change is caught.
      CHECK_THAT(load_error(bad), ContainsSubstring("'" + bad + "'"));
    }
}

TEST_CASE("a weights file truncated at any length fails cleanly", "[aot][runtime]") {
  TempDir dir;
  const std::string good = dir / "good.safetensors", bad = dir / "bad.safetensors";
  save_weights(good, small_tensors());
  const std::string bytes = read_bytes(good);
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("first " << n << " bytes");
    write_bytes(bad, bytes.substr(0, n));
    CHECK_THAT(load_error(bad), ContainsSubstring("'" + bad + "'"));
  }
}

TEST_CASE("the weights file reader parses exactly the flat JSON of a safetensors header", "[aot][runtime]") {
  TempDir dir;
  const std::string path = dir / "crafted.safetensors";
  // The error of a file with this header and data ("" if it loads).
  auto error = [&](const std::string& json, const std::string& data = std::string(8, '\0')) {
    write_bytes(path, safetensors(json, data));
    return load_error(path);
  };
  const std::string invalid = "weights file '" + path + "' is invalid: ";
  auto t = [](const std::string& fields) { return R"({"t":{)" + fields + "}}"; };
  const std::string ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  CHECK(error(t(ok)).empty());
  CHECK(error(" {\n\t\"t\" : {\"shape\" : [ 2 ] , \"data_offsets\":[0, 8],\"dtype\":\"F32\"} }\r\n").empty());
  CHECK(error("{}", "").empty());
  CHECK(error(R"({"__metadata__":{},"\u0041\ud83d\ude00\n":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})").empty());
  CHECK(load_weights(path).count("A\xf0\x9f\x98\x80\n") == 1);

  // The grammar, with the byte where it breaks.
  CHECK_THAT(error("[]"), Equals(invalid + "expected the header to be a JSON object (at byte 0 of the header)"));
  CHECK_THAT(error(t(ok) + "x"), Equals(invalid + "text after the header's JSON object (at byte 54 of the header)"));
  CHECK_THAT(error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},})"),
             Equals(invalid + "expected a tensor name (a JSON string) (at byte 54 of the header)"));
  CHECK_THAT(error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"),
             Equals(invalid + "expected ',' or '}' after a tensor, found the end of the header (at byte 56 of the "
                              "header)"));  // after the padding
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])")),
             ContainsSubstring("a dimension of tensor 't' is negative"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])")),
             ContainsSubstring("a dimension of tensor 't' is not an integer"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2e0],"data_offsets":[0,8])")), ContainsSubstring("is not an integer"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[02],"data_offsets":[0,8])")), ContainsSubstring("has a leading zero"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,8])")),
             ContainsSubstring("is too large (more than 64 bits)"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":["2"],"data_offsets":[0,8])")),
             ContainsSubstring("expected a dimension of tensor 't' (a non-negative integer)"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1)")),
             ContainsSubstring("tensor 't': unexpected field 'extra' (expected dtype, shape, data_offsets)"));
  CHECK_THAT(error(t(R"("dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8])")),
             ContainsSubstring("tensor 't': field dtype appears twice"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2])")), ContainsSubstring("tensor 't': missing field 'data_offsets'"));
  CHECK_THAT(error(t(R"("dtype":"BF16","shape":[4],"data_offsets":[0,8])")),
             ContainsSubstring("tensor 't': dtype BF16 is not supported; Kiln reads F32, F64, I32, I64, BOOL"));
  CHECK_THAT(error(t(R"("dtype":"F31","shape":[2],"data_offsets":[0,8])")), ContainsSubstring("unknown dtype 'F31'"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[0,8,8])")),
             ContainsSubstring("tensor 't''s data_offsets has more than two entries"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[8])")),
             ContainsSubstring("tensor 't''s data_offsets is not [begin, end]"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4])"), std::string(4, '\0')),
             ContainsSubstring("tensor 't' has more than 16 dimensions"));
  CHECK_THAT(error(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})"),
             Equals(invalid + "two tensors are named 't'"));
  CHECK_THAT(error(R"({"__metadata__":{},"__metadata__":{}})", ""), ContainsSubstring("__metadata__ appears twice"));
  CHECK_THAT(error(R"({"__metadata__":{"a":"1","a":"2"}})", ""), Equals(invalid + "__metadata__ 'a' appears twice"));
  CHECK_THAT(error(R"({"__metadata__":{"a":{"b":"c"}}})", ""), ContainsSubstring("__metadata__ 'a' is not a string"));
  CHECK_THAT(error(R"({"__metadata__":{"a":1}})", ""), ContainsSubstring("__metadata__ 'a' is not a string"));
  // Strings: escapes, UTF-8, control bytes.
  CHECK_THAT(error(R"({"\q":{}})"), ContainsSubstring("an invalid escape in a string"));
  CHECK_THAT(error(R"({"\ud800":{}})"), ContainsSubstring("a \\u escape of a lone high surrogate"));
  CHECK_THAT(error(R"({"\udc00":{}})"), ContainsSubstring("a \\u escape of a lone low surrogate"));
  CHECK_THAT(error(R"({"\u00":{}})"), ContainsSubstring("a \\u escape without four hex digits"));
  CHECK_THAT(error(R"({"\u0000":{}})"), ContainsSubstring("a string holds a NUL character"));
  CHECK_THAT(error("{\"a\nb\":{}}"), ContainsSubstring("a control byte in a string (JSON needs it escaped)"));
  CHECK_THAT(error("{\"\xc0\xaf\":{}}"), ContainsSubstring("a string is not valid UTF-8"));
  CHECK_THAT(error("{\"\xed\xa0\x80\":{}}"), ContainsSubstring("a string is not valid UTF-8"));
  CHECK_THAT(error(R"({"abc)"), ContainsSubstring("a string runs past the end of the header"));

  // Sizes and the layout of the data.
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[0,12])"), std::string(12, '\0')),
             Equals(invalid + "tensor 't': its data_offsets hold 12 bytes, but f32[2] is 8"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])")),
             Equals(invalid + "tensor 't': its data_offsets [8, 0] end before they begin"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])"), std::string(4, '\0')),
             Equals(invalid + "tensor 't': its data_offsets [0, 8] reach beyond the data (4 bytes; the file is "
                              "truncated?)"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,0])")),
             ContainsSubstring("end before they begin"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,0])")),
             Equals(invalid + "tensor 't': its shape is too large (its size overflows 64 bits)"));
  // The size over the non-zero dimensions must fit, whatever the order of a zero (as ir/safetensors.h).
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[4611686018427387904,0],"data_offsets":[0,0])"), ""),
             ContainsSubstring("its size overflows 64 bits"));
  // Within 64 bits, but past the IR's own element limit (docs/ir.md), which counts a 0 as 1.
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[1152921504606846976,0],"data_offsets":[0,0])"), ""),
             ContainsSubstring("has more than 2^40 elements, Kiln's limit for one tensor"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[2],"data_offsets":[0,8])"), std::string(12, '\0')),
             Equals(invalid + "4 trailing bytes after the tensors' 8 bytes of data"));
  CHECK_THAT(error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
             Equals(invalid + "tensor 'b': its data overlaps tensor 'a''s"));
  CHECK_THAT(error(t(R"("dtype":"F32","shape":[1],"data_offsets":[4,8])")),
             Equals(invalid + "tensor 't': a hole of 4 bytes before its data (at offset 0)"));
  // The header length against the file and the 100 MB cap.
  write_bytes(path, le64(100) + "{}");
  CHECK_THAT(load_error(path),
             Equals("weights file '" + path + "' is truncated: its header is 100 bytes but the file ends after 2"));
  write_bytes(path, le64(100'000'001) + "{}");
  CHECK_THAT(load_error(path), ContainsSubstring("its header length is 100000001 bytes, more than the 100000000 allowed"));

  // Kiln's checksums: a file with kiln.format must carry and match them all.
  const std::string crc = hex(zlib_crc(std::string(8, '\0').data(), 8));
  const std::string corrupted = "weights file '" + path + "' is corrupted: ";
  auto with_meta = [&](const std::string& meta) { return R"({"__metadata__":{)" + meta + R"(},"t":{)" + ok + "}}"; };
  CHECK(error(with_meta(R"("kiln.crc32.t":")" + crc + "\"")).empty());  // a checksum without kiln.format: checked
  CHECK_THAT(error(with_meta(R"("kiln.crc32.t":"00000000")")),
             Equals(corrupted + "tensor 't': checksum mismatch (the file is corrupt)"));
  CHECK_THAT(error(with_meta(R"("kiln.crc32.u":")" + crc + "\"")),
             Equals(corrupted + "a checksum for tensor 'u', which is not in the file (the file is corrupt)"));
  CHECK_THAT(error(with_meta(R"("kiln.format":"kiln-state-2")")),
             Equals(corrupted + "kiln.format is 'kiln-state-2', this Kiln reads 'kiln-state-1' (written by another "
                                "version of Kiln, or the file is corrupt)"));
  CHECK_THAT(error(with_meta(R"("kiln.format":"kiln-state-1")")),
             Equals(corrupted + "the metadata's checksum does not match (the file's header is corrupt)"));
  CHECK_THAT(error(with_meta(R"("kiln.crc32.__metadata__":"00000000")")),
             Equals(corrupted + "the metadata has Kiln's checksum but no kiln.format (the file is corrupt)"));
  std::string entries = std::string("kiln.format") + '\0' + "kiln-state-1" + '\0';
  CHECK_THAT(error(with_meta(R"("kiln.crc32.__metadata__":")" + hex(zlib_crc(entries.data(), entries.size())) +
                             R"(","kiln.format":"kiln-state-1")")),
             Equals(corrupted + "tensor 't' has no checksum (the file is corrupt)"));
}

TEST_CASE("the KILNWTS1 weights files of the previous release still read, with a deprecation line",
          "[aot][runtime]") {
  TempDir dir;
  // The old layout: "KILNWTS1", count, reserved; per tensor name, dtype, rank, shape, bytes,
  // offset (64-aligned); the data; a CRC-32 of everything before it.
  std::string b = "KILNWTS1";
  auto u32 = [&](uint32_t v) { b += le64(v).substr(0, 4); };
  u32(1), u32(0);
  u32(1), b += 't';
  u32(KILN_DTYPE_F32), u32(1), b += le64(2), b += le64(8), b += le64(64);
  b.resize(64, '\0');
  const float values[2] = {1.5f, -2};
  b.append(reinterpret_cast<const char*>(values), 8);
  u32(zlib_crc(b.data(), b.size()));
  write_bytes(dir / "old.weights", b);
  TensorMap old = load_weights(dir / "old.weights");
  CHECK(old.at("t") == Tensor::from(DType::f32, {2}, std::vector<float>{1.5f, -2}));
  // The CLI, which reads it through the same runtime function, shows the line on stderr.
  write_bytes(dir / "m.kir", "graph @m(%x: f32[2], state %t: f32[2]) {\n  %0 = add(%x, %t) : f32[2]\n  return y = %0\n}\n");
  RunResult r = run_shell(kiln_binary() + " compile " + dir / "m.kir" + " -o " + dir / "m.o" +
                          " --state-weights " + dir / "old.weights");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK_THAT(r.output, ContainsSubstring("kiln: warning: '" + dir / "old.weights" +
                                         "' is a KILNWTS1 weights file, which this release still reads but the next "
                                         "will not"));
  // A name that is not UTF-8 (safetensors could not hold it: the file could not be saved
  // again) is refused, as fuzz_weights found.
  std::string latin1 = b;
  latin1[20] = '\xe9';
  latin1.resize(latin1.size() - 4);  // the CRC, made again for the changed bytes
  uint32_t crc = zlib_crc(latin1.data(), latin1.size());
  latin1 += le64(crc).substr(0, 4);
  write_bytes(dir / "latin1.weights", latin1);
  CHECK_THAT(load_error(dir / "latin1.weights"),
             Equals("weights file '" + dir / "latin1.weights" +
                    "' is invalid: tensor 0's name is not UTF-8 (a safetensors file could not hold it)"));
  // A corrupted one still fails cleanly.
  b[70] ^= 1;
  write_bytes(dir / "old.weights", b);
  CHECK_THAT(load_error(dir / "old.weights"), ContainsSubstring("is corrupted or truncated: its checksum is"));
}

TEST_CASE("the weights fuzzer's safetensors seeds are valid weights files", "[aot][runtime]") {
  size_t seeds = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(KILN_SOURCE_DIR) + "/tests/fuzz/corpus/weights")) {
    if (e.path().extension() != ".safetensors") continue;
    INFO(e.path());
    CHECK(load_error(e.path().string()).empty());
    CHECK(read_safetensors(e.path().string()).tensors == load_weights(e.path().string()));
    ++seeds;
  }
  CHECK(seeds >= 5);
}
