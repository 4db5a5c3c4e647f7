// Input files that are not regular files (ir/file_read.h): safetensors and ONNX readers
// refuse a device (/dev/zero would be read without end) and a FIFO (which would wait for a
// writer forever) with a clear error; and a safetensors header must be flat JSON, refused
// before parsing when it nests deeper (a 99 MB header of brackets cost 5 GB to parse).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <string>

#include "error_of.h"
#include "frontend/onnx_import.h"
#include "ir/file_read.h"
#include "ir/safetensors.h"
#include "temp_dir.h"

using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;
using kiln::testing::error_of;
using kiln::testing::TempDir;

namespace {

// The error `read` gives for a FIFO nobody writes to. A reader that waits on it is
// released after 10 s (the test writer opens and closes the FIFO) and the test fails,
// rather than hanging.
std::string fifo_error(const std::string& fifo, const std::function<void()>& read) {
  auto done = std::async(std::launch::async, [&] { return error_of(read); });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return done.get();
  int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // a writer that closes: the reader sees EOF
  if (fd >= 0) ::close(fd);
  FAIL_CHECK("reading the FIFO waited for a writer (released after 10 s)");
  return done.get();
}

std::string st_bytes(const std::string& header) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xff);
  return out + header;
}

std::string parse_error(const std::string& header) {
  return error_of([&] { kiln::parse_safetensors(st_bytes(header), "f.safetensors"); });
}

}  // namespace

TEST_CASE("safetensors and ONNX readers refuse a FIFO and a device at once", "[safetensors][onnx][file_read]") {
  TempDir dir;
  const std::string fifo = dir / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(fifo_error(fifo, [&] { kiln::read_safetensors(fifo); }) ==
        fifo + ": is a FIFO, not a regular file: safetensors files are read from regular files only (save the "
               "stream to a file first)");
  CHECK(fifo_error(fifo, [&] { kiln::import_onnx(fifo); }) ==
        fifo + ": is a FIFO, not a regular file: ONNX files are read from regular files only (save the stream to "
               "a file first)");
  CHECK(fifo_error(fifo, [&] { kiln::read_onnx_tensor(fifo); }) ==
        fifo + ": is a FIFO, not a regular file: ONNX files are read from regular files only (save the stream to "
               "a file first)");
  // /dev/zero never ends: refused before a byte is read.
  CHECK(error_of([] { kiln::read_safetensors("/dev/zero"); }) ==
        "/dev/zero: is a character device, not a regular file: safetensors files are read from regular files only "
        "(save the stream to a file first)");
  CHECK_THAT(error_of([] { kiln::import_onnx("/dev/zero"); }), StartsWith("/dev/zero: is a character device"));
  CHECK(error_of([&] { kiln::read_safetensors(dir.path.string()); }) ==
        dir.path.string() + ": is a directory, not a safetensors file");
  CHECK(error_of([&] { kiln::read_safetensors(dir / "none"); }) ==
        dir / "none" + ": cannot open file (No such file or directory)");
}

TEST_CASE("read_regular_file refuses a file above its limit by size, before reading it", "[file_read]") {
  TempDir dir;
  std::ofstream(dir / "f.bin") << std::string(100, 'x');
  CHECK(kiln::read_regular_file(dir / "f.bin", "test") == std::string(100, 'x'));
  CHECK(error_of([&] { kiln::read_regular_file(dir / "f.bin", "test", 99, "a reason"); }) ==
        dir / "f.bin" + ": the test file is 100 bytes, more than the 99 it may be (a reason)");
}

TEST_CASE("a safetensors header must be flat JSON: deeper nesting is refused before parsing", "[safetensors]") {
  const std::string why =
      " (a header is an object of tensor entries, objects whose shape and data_offsets are arrays of numbers)";
  CHECK(parse_error(R"({"x":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})") ==
        "f.safetensors: the JSON header is not a flat safetensors header: more than three levels of nesting at "
        "byte 29" + why);
  CHECK(parse_error(R"({"__metadata__":{"k":{}}})") ==
        "f.safetensors: the JSON header is not a flat safetensors header: an object inside an entry at byte 21" + why);
  CHECK(parse_error(R"({"a":[[],[]]})") ==
        "f.safetensors: the JSON header is not a flat safetensors header: a container inside an array at byte 6" + why);
  CHECK(parse_error("[[[1]]]") ==
        "f.safetensors: the JSON header is not a flat safetensors header: a container inside an array at byte 2" + why);
  // 20 MB of brackets: refused at the fourth, without building anything.
  const std::string deep = std::string(20'000'000, '[');
  CHECK_THAT(parse_error(deep), ContainsSubstring("a container inside an array at byte 2 "));
  CHECK_THAT(parse_error("{\"a\":{\"b\":" + std::string(20'000'000, '{')),
             ContainsSubstring("an object inside an entry at byte 10 "));
  // Brackets inside strings (escaped quotes too) are text, not nesting.
  kiln::SafetensorsFile f = kiln::parse_safetensors(
      st_bytes(R"({"__metadata__":{"k\"[[":"[[[{{{\"]]]"},"x[{":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"),
      "f.safetensors");
  CHECK(f.metadata.at("k\"[[") == "[[[{{{\"]]]");
  CHECK(f.tensors.count("x[{") == 1);
  // What is not too deep keeps the parser's own messages.
  CHECK(parse_error("[1,2]") == "f.safetensors: the JSON header is array, not an object");
  CHECK(parse_error(R"({"__metadata__":[]})") == "f.safetensors: __metadata__ is array, not an object of strings");
}
