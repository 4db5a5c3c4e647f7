// Fuzz target: the safetensors reader (ir/safetensors.h). parse_safetensors (bytes in
// memory) and read_safetensors (a file) must agree, error for error; what parses must
// serialize to a file with an 8-aligned header and parse back to the same tensors and metadata.
#include <cstdint>

#include "ir/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

using namespace kiln;

namespace {

std::pair<SafetensorsFile, std::string> outcome(auto read) {
  try {
    return {read(), ""};
  } catch (const Error& e) {
    return {SafetensorsFile(), e.what()};
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::MemFile file(bytes);
  auto [parsed, parse_error] = outcome([&] { return parse_safetensors(bytes, file.path()); });
  auto [read, read_error] = outcome([&] { return read_safetensors(file.path()); });
  if (parse_error != read_error)
    fuzz::bug("parse_safetensors says '" + parse_error + "' but read_safetensors '" + read_error + "'");
  if (!parse_error.empty()) return 0;
  if (parsed.tensors != read.tensors || parsed.metadata != read.metadata)
    fuzz::bug("parse_safetensors and read_safetensors read different files");
  std::string again = serialize_safetensors(parsed.tensors, parsed.metadata);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(static_cast<unsigned char>(again[size_t(i)])) << (8 * i);
  if (header_len % 8 != 0) fuzz::bug("serialize_safetensors wrote a header not padded to 8 bytes");
  SafetensorsFile back = parse_safetensors(again, "again");
  if (back.tensors != parsed.tensors || back.metadata != parsed.metadata)
    fuzz::bug("serialize_safetensors does not round-trip");
  return 0;
}
