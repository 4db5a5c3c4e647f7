// Fuzz target: the weights file reader (runtime/aot.h kiln_weights_visit), which AOT
// objects run on files users hand them. The input is tried twice: as it is, and with a
// correct CRC-32 appended, so that mutations reach the table checks behind the checksum
// (random bytes almost never carry a valid CRC). Whatever the reader accepts must be
// well-formed (runtime/aot_internal.h tensor_error), and must write back and read back equal.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/aot.h"
#include "runtime/aot_internal.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct Read {
  std::string name;
  int32_t dtype = 0;
  std::vector<int64_t> shape;
  std::string data;
  bool operator==(const Read&) const = default;
};

// Reads `path`: true and its tensors, or false (a clean rejection, message in err).
bool read_all(const std::string& path, std::vector<Read>& out) {
  out.clear();
  char err[512];
  int rc = kiln_weights_visit(
      path.c_str(),
      [](void* ctx, const KilnAotTensor* t, const void* data) {
        if (const char* why = kiln::rt::aot::tensor_error(*t)) kiln::fuzz::bug(std::string("accepted a tensor: ") + why);
        Read r{t->name, t->dtype, std::vector<int64_t>(t->shape, t->shape + t->rank),
               std::string(static_cast<const char*>(data), static_cast<size_t>(t->bytes))};
        static_cast<std::vector<Read>*>(ctx)->push_back(std::move(r));
        return 0;
      },
      &out, err, sizeof err);
  if (rc != 0 && err[0] == 0) kiln::fuzz::bug("a rejected file without a message");
  return rc == 0;
}

const std::string& scratch_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/kiln_fuzz_weights_XXXXXX";
    if (!mkdtemp(tmpl)) kiln::fuzz::bug("mkdtemp failed");
    return std::string(tmpl);
  }();
  return dir;
}

void check(std::string_view bytes) {
  kiln::fuzz::MemFile file(bytes);
  std::vector<Read> tensors;
  if (!read_all(file.path(), tensors)) return;
  std::vector<KilnAotTensor> table;
  std::vector<const void*> data;
  for (const Read& r : tensors) {
    table.push_back({r.name.c_str(), r.dtype, static_cast<int32_t>(r.shape.size()),
                     r.shape.empty() ? nullptr : r.shape.data(), static_cast<int64_t>(r.data.size())});
    data.push_back(r.data.data());
  }
  std::string path = scratch_dir() + "/again.weights";
  char err[512];
  if (kiln_weights_write(path.c_str(), static_cast<int32_t>(table.size()), table.data(), data.data(), err,
                         sizeof err) != 0)
    kiln::fuzz::bug(std::string("a file that reads does not write back: ") + err);
  std::vector<Read> again;
  if (!read_all(path, again)) kiln::fuzz::bug("a file written back does not read");
  if (again != tensors) kiln::fuzz::bug("the weights file does not round-trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  check(bytes);
  uint32_t crc = static_cast<uint32_t>(crc32(0L, data, static_cast<uInt>(size)));
  bytes.append(reinterpret_cast<const char*>(&crc), sizeof crc);  // little-endian, as the file
  check(bytes);
  return 0;
}
