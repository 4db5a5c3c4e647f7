// safetensors files (ir/safetensors.h): round trips of every dtype, the layout Python's
// library writes, and every malformed input, each refused with one kiln::Error naming the
// file (and the tensor) and never a crash. A file written by Python's safetensors itself is
// read in test_checkpoint.cpp (tests/data/torch_mlp.safetensors).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdint>
#include <fstream>

#include "ir/safetensors.h"
#include "tests/unit/error_of.h"
#include "tests/unit/temp_dir.h"

using namespace kiln;
using kiln::testing::error_of;
using Catch::Matchers::StartsWith;

namespace {

// A file from its JSON header (padded as given) and data.
std::string st_bytes(const std::string& header, const std::string& data = "") {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string parse_error(const std::string& header, const std::string& data = "") {
  return error_of([&] { parse_safetensors(st_bytes(header, data), "f.safetensors"); });
}

// One F32 tensor "x" with this entry.
std::string entry_error(const std::string& entry, const std::string& data = "") {
  return parse_error("{\"x\":" + entry + "}", data);
}

}  // namespace

TEST_CASE("safetensors: every dtype, scalars, empty tensors and splats round-trip", "[safetensors]") {
  TensorMap m;
  m.emplace("a.weight", Tensor::from(DType::f32, {2, 3}, std::vector<float>{1.5f, -2, 0, 3.25f, 1e30f, -0.0f}));
  m.emplace("b", Tensor::scalar(DType::f64, 0.1));
  m.emplace("c", Tensor(DType::i32, {0, 4}));
  m.emplace("d", Tensor::from(DType::i64, {3}, std::vector<int64_t>{int64_t(1) << 62, -1, 7}));
  m.emplace("e", Tensor::from(DType::boolean, {2, 2}, std::vector<int>{1, 0, 0, 1}));
  m.emplace("step", Tensor::scalar(DType::i64, int64_t(123456789012345)));
  m.emplace("splat", Tensor::splat(Tensor::scalar(DType::f32, 2.5), {3, 2}));
  std::map<std::string, std::string> meta{{"epoch", "3"}, {"note", "h\u00e9llo \"quoted\""}};

  std::string bytes = serialize_safetensors(m, meta);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(static_cast<unsigned char>(bytes[size_t(i)])) << (8 * i);
  CHECK(header_len % 8 == 0);  // the data starts 8-aligned, as Python's library writes it
  CHECK(bytes.substr(8).starts_with("{"));

  SafetensorsFile f = parse_safetensors(bytes, "m");
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == m.size());
  for (const auto& [name, t] : m) {
    INFO(name);
    REQUIRE(f.tensors.contains(name));
    CHECK(f.tensors.at(name) == t.materialized());  // splats are written filled out
  }
  CHECK(serialize_safetensors(f.tensors, f.metadata) == bytes);
}

TEST_CASE("safetensors: the layout is Python's (name order, contiguous, 8-byte padded header)", "[safetensors]") {
  TensorMap m;
  m.emplace("b", Tensor::from(DType::i32, {1}, std::vector<int>{7}));
  m.emplace("a", Tensor::from(DType::boolean, {2}, std::vector<int>{1, 0}));
  std::string bytes = serialize_safetensors(m);
  std::string header =
      R"({"a":{"data_offsets":[0,2],"dtype":"BOOL","shape":[2]},"b":{"data_offsets":[2,6],"dtype":"I32","shape":[1]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  CHECK(bytes == st_bytes(header, std::string("\x01\x00\x07\x00\x00\x00", 6)));
  CHECK(serialize_safetensors({}) == st_bytes("{}      "));
  CHECK(parse_safetensors(serialize_safetensors({}), "e").tensors.empty());
}

TEST_CASE("safetensors: whitespace, key order and non-0/1 bools are read as Python writes them", "[safetensors]") {
  SafetensorsFile f = parse_safetensors(
      st_bytes(R"( { "__metadata__" : {}, "t": {"shape": [3], "dtype": "BOOL", "data_offsets": [0, 3]} }   )",
               std::string("\x02\x00\x01", 3)),
      "f");
  CHECK(f.tensors.at("t") == Tensor::from(DType::boolean, {3}, std::vector<int>{1, 0, 1}));
}

TEST_CASE("safetensors: a malformed start or header is refused", "[safetensors]") {
  CHECK(error_of([] { parse_safetensors("", "f.safetensors"); }) ==
        "f.safetensors: not a safetensors file: it is 0 bytes, shorter than the 8-byte header length");
  CHECK(error_of([] { parse_safetensors("\x01\x02\x03", "f.safetensors"); }) ==
        "f.safetensors: not a safetensors file: it is 3 bytes, shorter than the 8-byte header length");
  // The cap is checked before anything is read or allocated.
  std::string huge = st_bytes("{}");
  huge[0] = '\x01', huge[1] = '\xe1', huge[2] = '\xf5', huge[3] = '\x05';  // 100000001
  CHECK(error_of([&] { parse_safetensors(huge, "f.safetensors"); }) ==
        "f.safetensors: the header length is 100000001 bytes, more than the 100000000 allowed (not a safetensors "
        "file?)");
  std::string all_ff(16, '\xff');
  CHECK(error_of([&] { parse_safetensors(all_ff, "f.safetensors"); }) ==
        "f.safetensors: the header length is 18446744073709551615 bytes, more than the 100000000 allowed (not a "
        "safetensors file?)");
  std::string cut = st_bytes("{\"a\":1}").substr(0, 12);
  CHECK(error_of([&] { parse_safetensors(cut, "f.safetensors"); }) ==
        "f.safetensors: the file is truncated: the header is 7 bytes but the file ends after 4");

  CHECK_THAT(parse_error("{\"x\":"), StartsWith("f.safetensors: the JSON header is not valid: [json.exception.parse_error.101]"));
  CHECK_THAT(parse_error("{} x"), StartsWith("f.safetensors: the JSON header is not valid: [json.exception.parse_error.101]"));
  CHECK_THAT(parse_error(std::string("{\"\xff\":1}")), StartsWith("f.safetensors: the JSON header is not valid:"));
  CHECK(parse_error("{\"a\":{},\"a\":{}}") == "f.safetensors: the JSON header is not valid: key 'a' appears twice");
  CHECK(entry_error(R"({"dtype":"F32","dtype":"F32","shape":[],"data_offsets":[0,4]})", "abcd") ==
        "f.safetensors: the JSON header is not valid: key 'dtype' appears twice");
  CHECK(parse_error("[1,2]") == "f.safetensors: the JSON header is array, not an object");
  CHECK(parse_error("{\"__metadata__\":[]}") == "f.safetensors: __metadata__ is array, not an object of strings");
  CHECK(parse_error("{\"__metadata__\":{\"k\":1}}") == "f.safetensors: __metadata__ 'k' is number, not a string");
}

TEST_CASE("safetensors: a malformed tensor entry is refused, naming the tensor", "[safetensors]") {
  const std::string four(4, '\0');
  CHECK(entry_error("3") == "f.safetensors: tensor 'x': the entry is number, not an object");
  CHECK(entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":0})", four) ==
        "f.safetensors: tensor 'x': unexpected field 'extra' (expected dtype, shape, data_offsets)");
  CHECK(entry_error(R"({"dtype":"F32","data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': missing field 'shape'");
  CHECK(entry_error(R"({"dtype":5,"shape":[1],"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': dtype is number, not a string");
  CHECK(entry_error(R"({"dtype":"BF16","shape":[2],"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': dtype BF16 is not supported; Kiln reads F32, F64, I32, I64, BOOL");
  CHECK(entry_error(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': unknown dtype 'f32'; Kiln reads F32, F64, I32, I64, BOOL");
  CHECK(entry_error(R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': shape is number, not an array");
  CHECK(entry_error(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': a shape dimension is negative (-1)");
  CHECK(parse_safetensors(st_bytes(R"({"x":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}})"), "f")
            .tensors.at("x")
            .shape() == Shape{0});
  CHECK(entry_error(R"({"dtype":"F32","shape":[1.0],"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': a shape dimension is 1.0, not a non-negative integer");
  CHECK(entry_error(R"({"dtype":"F32","shape":["1"],"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': a shape dimension is string, not a non-negative integer");
  CHECK(entry_error(R"({"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})") ==
        "f.safetensors: tensor 'x': shape [4294967296,4294967296,0] is too large");
  CHECK(entry_error(R"({"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]})") ==
        "f.safetensors: tensor 'x': shape [18446744073709551615] is too large");
  CHECK(entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", four) ==
        "f.safetensors: tensor 'x': data_offsets is [0], not an array [begin, end]");
  CHECK(entry_error(R"({"dtype":"F32","shape":[1],"data_offsets":[0,-4]})", four) ==
        "f.safetensors: tensor 'x': data_offsets' end is negative (-4)");
  CHECK(entry_error(R"({"dtype":"F32","shape":[0],"data_offsets":[4,0]})", four) ==
        "f.safetensors: tensor 'x': data_offsets [4,0] end before they begin");
  CHECK(entry_error(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", four) ==
        "f.safetensors: tensor 'x': data_offsets [0,8] reach beyond the data (4 bytes; the file is truncated?)");
  CHECK(entry_error(R"({"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]})", four) ==
        "f.safetensors: tensor 'x': data_offsets [0,18446744073709551615] reach beyond the data (4 bytes; the file "
        "is truncated?)");
  CHECK(entry_error(R"({"dtype":"F64","shape":[1],"data_offsets":[0,4]})", four) ==
        "f.safetensors: tensor 'x': data_offsets [0,4] hold 4 bytes, but F64[1] is 8");
  CHECK(entry_error(R"({"dtype":"F32","shape":[],"data_offsets":[0,4]})", four + "zz") ==
        "f.safetensors: 2 trailing bytes after the tensors' 4 bytes of data");
  CHECK(entry_error("{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}") ==
        "f.safetensors: tensor 'x': data_offsets [0,4] reach beyond the data (0 bytes; the file is truncated?)");
  // Names are shown with control bytes escaped.
  CHECK(parse_error("{\"a\\u0001\":3}") == "f.safetensors: tensor 'a\\x01': the entry is number, not an object");
}

TEST_CASE("safetensors: overlapping data and holes are refused, as Python's library does", "[safetensors]") {
  const std::string eight(8, '\0');
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                    eight) == "f.safetensors: tensor 'b': its data overlaps tensor 'a''s");
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[4,8]}})", eight) ==
        "f.safetensors: tensor 'a': a hole of 4 bytes before its data (at offset 0)");
  // Empty tensors take no bytes, anywhere among the others.
  SafetensorsFile f = parse_safetensors(
      st_bytes(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[4,8]},"z":{"dtype":"I64","shape":[0,3],)"
               R"("data_offsets":[4,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
               eight),
      "f");
  CHECK(f.tensors.at("z").type() == TensorType{DType::i64, {0, 3}});
}

TEST_CASE("safetensors: read_safetensors names the path of a missing or unreadable file", "[safetensors]") {
  kiln::testing::TempDir dir;
  CHECK_THAT(error_of([&] { read_safetensors(dir / "none.safetensors"); }),
             StartsWith(dir / "none.safetensors" + ": cannot open file (No such file or directory)"));
  CHECK(error_of([&] { read_safetensors(dir.path.string()); }) ==
        dir.path.string() + ": is a directory, not a safetensors file");
  {
    std::ofstream out(dir / "bad.safetensors", std::ios::binary);
    out << "nope";
  }
  CHECK(error_of([&] { read_safetensors(dir / "bad.safetensors"); }) ==
        dir / "bad.safetensors" + ": not a safetensors file: it is 4 bytes, shorter than the 8-byte header length");
  TensorMap m;
  m.emplace("w", Tensor::from(DType::f32, {2}, std::vector<float>{1, 2}));
  {
    std::ofstream out(dir / "ok.safetensors", std::ios::binary);
    out << serialize_safetensors(m);
  }
  CHECK(read_safetensors(dir / "ok.safetensors").tensors == m);
}

TEST_CASE("safetensors: a name that cannot be written is a clear error", "[safetensors]") {
  TensorMap m;
  m.emplace("__metadata__", Tensor::scalar(DType::f32, 1.0));
  CHECK(error_of([&] { serialize_safetensors(m); }) ==
        "cannot write a safetensors file with a tensor named '__metadata__'");
  TensorMap bad;
  bad.emplace("\xff", Tensor::scalar(DType::f32, 1.0));
  CHECK_THAT(error_of([&] { serialize_safetensors(bad); }), StartsWith("cannot write a safetensors file: "));
}
