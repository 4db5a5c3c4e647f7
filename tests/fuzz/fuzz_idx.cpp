// Fuzz target: the IDX reader. parse_idx (bytes in memory) and read_idx (the file reader,
// header first, gzip or not) must agree on plain files; gzip input exercises zlib's side.
#include <cstdint>

#include "frontend/idx.h"
#include "tests/fuzz/fuzz_util.h"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::MemFile file(bytes);
  auto [read, read_error] = fuzz::outcome([&] { return read_idx(file.path()); });
  if (bytes.starts_with("\x1f\x8b")) return 0;  // gzip: read_idx must only not crash
  auto [parsed, parse_error] = fuzz::outcome([&] { return parse_idx(bytes, file.path()); });
  if (parse_error != read_error) fuzz::bug("parse_idx says '" + parse_error + "' but read_idx '" + read_error + "'");
  if (parse_error.empty() && !(parsed == read)) fuzz::bug("parse_idx and read_idx read different tensors");
  return 0;
}
