// Fuzz target: the .npy reader. parse_npy (bytes in memory) and read_npy (the streaming
// file reader) must agree, error for error; what parses must serialize and parse back equal.
#include <cstdint>

#include "ir/npy.h"
#include "tests/fuzz/fuzz_util.h"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::MemFile file(bytes);
  auto [parsed, parse_error] = fuzz::outcome([&] { return parse_npy(bytes, file.path()); });
  auto [read, read_error] = fuzz::outcome([&] { return read_npy(file.path()); });
  if (parse_error != read_error) fuzz::bug("parse_npy says '" + parse_error + "' but read_npy '" + read_error + "'");
  if (!parse_error.empty()) return 0;
  if (!(parsed == read)) fuzz::bug("parse_npy and read_npy read different tensors");
  if (!(parse_npy(serialize_npy(parsed), "again") == parsed)) fuzz::bug("serialize_npy does not round-trip");
  return 0;
}
