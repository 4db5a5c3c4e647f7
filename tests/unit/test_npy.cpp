// .npy reading and writing: round trips for every dtype, files written by NumPy itself
// (tests/data/npy, made with numpy 2.4 by np.save and np.lib.format.write_array), and bad
// input, which must give one kiln::Error naming the file and never crash.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ir/npy.h"
#include "tests/unit/temp_dir.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using kiln::testing::slurp;

namespace {

const std::string kData = std::string(KILN_TEST_DATA_DIR) + "/npy/";

// A .npy file from its header dict and data, laid out as NumPy does (format 1.0).
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  size_t prefix = major == 1 ? 10 : 12;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  size_t len = total - prefix;
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += dict + std::string(len - dict.size() - 1, ' ') + "\n" + data;
  return out;
}

std::string le32(std::initializer_list<int32_t> values) {
  std::string s;
  for (int32_t v : values)
    for (int i = 0; i < 4; ++i) s += static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xff);
  return s;
}

std::string error_of(std::string_view bytes) {
  try {
    parse_npy(bytes, "t.npy");
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("parse_npy accepted bad input");
  return "";
}

Tensor round_trip(const Tensor& t) {
  std::string bytes = serialize_npy(t);
  Tensor back = parse_npy(bytes, "mem");
  CHECK(back == t);
  return back;
}

}  // namespace

TEST_CASE("npy: round trip of every dtype, scalars and empty tensors", "[npy]") {
  round_trip(Tensor::from(DType::f32, {2, 3}, std::vector<double>{1.5, -2, 0, 1e30, -1e-30, 7}));
  round_trip(Tensor::from(DType::f64, {3}, std::vector<double>{0.1, -1e300, 3}));
  round_trip(Tensor::from(DType::i32, {2, 2}, std::vector<double>{-2147483648.0, 2147483647, 0, -1}));
  Tensor big(DType::i64, {2});
  big.data<int64_t>()[0] = INT64_MIN;
  big.data<int64_t>()[1] = 9007199254740993;  // 2^53 + 1: not a double
  CHECK(round_trip(big).data<int64_t>()[1] == 9007199254740993);
  round_trip(Tensor::from(DType::boolean, {4}, std::vector<double>{1, 0, 0, 1}));
  for (DType t : kAllDTypes) {
    INFO(dtype_name(t));
    round_trip(Tensor::scalar(t, 1));
    round_trip(Tensor(t, {0}));
    round_trip(Tensor(t, {2, 0, 3}));
    round_trip(Tensor(t, {1, 1, 1, 1, 1, 1, 1}));
  }
}

TEST_CASE("npy: the writer's layout is NumPy's format 1.0", "[npy]") {
  Tensor t = Tensor::from(DType::i32, {2, 3}, std::vector<double>{1, 2, 3, 4, 5, 6});
  std::string bytes = serialize_npy(t);
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  CHECK(bytes == npy_bytes(dict, le32({1, 2, 3, 4, 5, 6})));
  CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  size_t data_start = bytes.size() - 24;
  CHECK(data_start % 64 == 0);
  CHECK(bytes[data_start - 1] == '\n');
  // Shapes of rank 0 and 1 are written as Python tuples: () and (3,).
  CHECK_THAT(serialize_npy(Tensor::scalar(DType::f64, 2)), ContainsSubstring("'shape': (), }"));
  CHECK_THAT(serialize_npy(Tensor(DType::boolean, {3})),
             ContainsSubstring("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }"));
}

TEST_CASE("npy: files written by NumPy", "[npy]") {
  Tensor f32 = read_npy(kData + "f32_2x3.npy");
  CHECK(f32 == Tensor::from(DType::f32, {2, 3}, std::vector<double>{-1, -0.5, 0, 0.5, 1, 1.5}));
  Tensor f64 = read_npy(kData + "f64_scalar.npy");
  CHECK(f64 == Tensor::scalar(DType::f64, 3.25));
  CHECK(read_npy(kData + "i32_3.npy") ==
        Tensor::from(DType::i32, {3}, std::vector<double>{-1, 0, 2147483647}));
  Tensor i64 = read_npy(kData + "i64_2x2.npy");
  REQUIRE(i64.type() == TensorType{DType::i64, {2, 2}});
  CHECK(i64.data<int64_t>()[0] == -9007199254740993);
  CHECK(i64.data<int64_t>()[3] == 3);
  CHECK(read_npy(kData + "bool_4.npy") ==
        Tensor::from(DType::boolean, {4}, std::vector<double>{1, 0, 0, 1}));
  CHECK(read_npy(kData + "f32_0x3.npy").type() == TensorType{DType::f32, {0, 3}});
  Tensor v12 = Tensor::from(DType::f64, {3}, std::vector<double>{1.5, -2, 1e300});
  CHECK(read_npy(kData + "f64_3_v2.npy") == v12);
  CHECK(read_npy(kData + "f64_3_v3.npy") == v12);

  // Our writer gives NumPy's bytes back for its format 1.0 files.
  for (const char* name : {"f32_2x3.npy", "f64_scalar.npy", "i32_3.npy", "i64_2x2.npy", "bool_4.npy",
                           "f32_0x3.npy"}) {
    INFO(name);
    std::string bytes = slurp(kData + name);
    CHECK(serialize_npy(parse_npy(bytes, name)) == bytes);
  }
}

TEST_CASE("npy: header variations NumPy accepts", "[npy]") {
  std::string data = le32({7, 8});
  // Double quotes, no trailing comma, keys in another order, Python 2 longs.
  Tensor want = Tensor::from(DType::i32, {2}, std::vector<double>{7, 8});
  CHECK(parse_npy(npy_bytes("{\"shape\": (2,), \"descr\": \"<i4\", \"fortran_order\": False}", data), "a") == want);
  CHECK(parse_npy(npy_bytes("{'descr':'<i4','fortran_order':False,'shape':(2L,)}", data), "b") == want);
  CHECK(parse_npy(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2,), }", data), "c") ==
        want.reshaped({1, 2}));
  CHECK(parse_npy(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", data, 2), "d") == want);
  // A bool byte other than 0 or 1 reads as true.
  Tensor b = parse_npy(npy_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", std::string("\x02\x00", 2)), "e");
  CHECK(b.data<uint8_t>()[0] == 1);
  CHECK(b.data<uint8_t>()[1] == 0);
}

TEST_CASE("npy: bad files give one clear error naming the file", "[npy]") {
  const std::string good = npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }",
                                     le32({1, 2, 3, 4, 5, 6}));
  REQUIRE_NOTHROW(parse_npy(good, "t.npy"));
  auto with_dict = [](const std::string& dict, const std::string& data = le32({1, 2, 3, 4, 5, 6})) {
    return error_of(npy_bytes(dict, data));
  };

  SECTION("magic and version") {
    CHECK_THAT(error_of(""), StartsWith("t.npy: not a .npy file (bad magic"));
    CHECK_THAT(error_of("PK\x03\x04 this is a zip"), StartsWith("t.npy: not a .npy file (bad magic"));
    std::string v9 = good;
    v9[6] = 9;
    CHECK_THAT(error_of(v9), ContainsSubstring("unsupported .npy format version 9.0"));
  }
  SECTION("truncated header") {
    CHECK_THAT(error_of(good.substr(0, 7)), ContainsSubstring("corrupt .npy header"));
    CHECK_THAT(error_of(good.substr(0, 9)), ContainsSubstring("corrupt .npy header"));
    CHECK_THAT(error_of(good.substr(0, 40)),
               ContainsSubstring("the header is 118 bytes but the file ends after 30"));
  }
  SECTION("truncated data and trailing bytes") {
    CHECK(error_of(good.substr(0, good.size() - 4)) ==
          "t.npy: data is truncated: shape [2,3] of i32 needs 24 bytes, found 20");
    CHECK_THAT(error_of(good + "xyz"), ContainsSubstring("3 trailing bytes after the 24 bytes of data"));
  }
  SECTION("unsupported layouts and dtypes") {
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }"),
               ContainsSubstring("Fortran-order arrays are not supported"));
    for (const char* d : {"<f2", ">f4", ">i8", "<u4", "|u1", "|O", "<U3", "=f4"}) {
      INFO(d);
      std::string e = with_dict(std::string("{'descr': '") + d + "', 'fortran_order': False, 'shape': (2, 3), }");
      CHECK_THAT(e, StartsWith("t.npy: unsupported dtype '" + std::string(d) + "'"));
      CHECK_THAT(e, ContainsSubstring("supported: <f4 <f8 <i4 <i8 |b1"));
    }
    CHECK_THAT(with_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }"),
               ContainsSubstring("structured dtypes are not supported"));
    // Real NumPy files: float16, big-endian, Fortran order.
    CHECK_THROWS_WITH(read_npy(kData + "f16_3.npy"), ContainsSubstring("unsupported dtype '<f2'"));
    CHECK_THROWS_WITH(read_npy(kData + "f32_bigendian.npy"), ContainsSubstring("unsupported dtype '>f4'"));
    CHECK_THROWS_WITH(read_npy(kData + "f32_fortran.npy"), ContainsSubstring("Fortran-order"));
  }
  SECTION("malformed header dicts") {
    CHECK_THAT(with_dict("{'descr': '<i4', 'shape': (2, 3), }"), ContainsSubstring("missing key 'fortran_order'"));
    CHECK_THAT(with_dict("{'fortran_order': False, 'shape': (2, 3), }"), ContainsSubstring("missing key 'descr'"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False}"), ContainsSubstring("missing key 'shape'"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}"),
               ContainsSubstring("unexpected key 'x'"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)}"),
               ContainsSubstring("appears twice"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (2, -3), }"),
               ContainsSubstring("negative dimension"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
               ContainsSubstring("overflows"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"),
               ContainsSubstring("is too large"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (6), }"),
               ContainsSubstring("shape must be a tuple"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': 0, 'shape': (2, 3), }"),
               ContainsSubstring("expected True or False"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3) "),
               ContainsSubstring("expected ',' or '}'"));
    CHECK_THAT(with_dict("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3)} junk"),
               ContainsSubstring("unexpected text after the header dict"));
    CHECK_THAT(with_dict("{'descr: '<i4'}"), ContainsSubstring("corrupt .npy header"));
  }
  SECTION("missing file and directories") {
    CHECK_THROWS_WITH(read_npy("/nonexistent/x.npy"),
                      "/nonexistent/x.npy: cannot open file (No such file or directory)");
    CHECK_THROWS_WITH(read_npy(KILN_TEST_DATA_DIR), ContainsSubstring("is a directory"));
  }
}

TEST_CASE("npy: every byte mutated and every truncation parses or throws kiln::Error", "[npy]") {
  const std::string good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                     std::string(24, '\x01'));
  const unsigned char values[] = {0x00, 0xff, 0x80, '(', ')', ',', '-', '9', ' ', '\'', '}', 'L', 'T'};
  int parsed = 0, rejected = 0;
  auto attempt = [&](const std::string& bytes) {
    try {
      Tensor t = parse_npy(bytes, "m.npy");
      CHECK(t.nbytes() <= bytes.size());
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }  // anything else escapes and fails the test
  };
  for (size_t i = 0; i < good.size(); ++i) {
    for (unsigned char v : values) {
      std::string m = good;
      m[i] = static_cast<char>(v);
      attempt(m);
    }
    std::string flipped = good;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x01);
    attempt(flipped);
  }
  for (size_t n = 0; n < good.size(); ++n) attempt(good.substr(0, n));
  CHECK(parsed > 0);
  CHECK(rejected > 0);
}

TEST_CASE("npy: write_npy and read_npy through a file", "[npy]") {
  auto path = (std::filesystem::temp_directory_path() / "kiln_test_npy_roundtrip.npy").string();
  Tensor t = Tensor::from(DType::f64, {2, 2}, std::vector<double>{1, 2, 3, 4});
  write_npy(path, t);
  CHECK(read_npy(path) == t);
  std::remove(path.c_str());
  CHECK_THROWS_WITH(write_npy("/nonexistent/dir/x.npy", t), StartsWith("/nonexistent/dir/x.npy: cannot open"));
}
