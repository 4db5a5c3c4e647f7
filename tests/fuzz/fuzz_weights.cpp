// Fuzz target: the weights file reader (runtime/aot.h kiln_weights_visit), which AOT
// objects run on files users hand them: safetensors, parsed by the runtime's own strict
// reader. Whatever it accepts must be well-formed (runtime/aot_internal.h tensor_error),
// must be accepted with the same tensors by ir/safetensors.h (nlohmann-json's parser: the
// runtime's grammar is a subset of what it reads), and must write back (kiln_weights_write,
// and rt::serialize_weights to the same bytes) and read back equal. The seeds
// (corpus/weights) hold Kiln's files, with checksums, and Python's, without: mutations of
// the latter reach the layout checks behind the data. The deprecated KILNWTS1 files are
// still read: such an input is tried a second time with a valid CRC-32 appended, so that
// mutations get past that format's checksum to its table checks.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ir/safetensors.h"
#include "runtime/aot.h"
#include "runtime/aot_internal.h"
#include "runtime/weights_file.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct Read {
  std::string name;
  int32_t dtype = 0;
  std::vector<int64_t> shape;
  std::string data;
  bool operator==(const Read&) const = default;
};

// Reads `path`: true and its tensors, or false (a clean rejection, message in *why).
bool read_all(const std::string& path, std::vector<Read>& out, std::string* why = nullptr) {
  out.clear();
  char err[512];
  err[0] = 0;
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
  if (why) *why = err;
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

int32_t runtime_dtype(kiln::DType d) {
  switch (d) {
    case kiln::DType::f32: return KILN_DTYPE_F32;
    case kiln::DType::f64: return KILN_DTYPE_F64;
    case kiln::DType::i32: return KILN_DTYPE_I32;
    case kiln::DType::i64: return KILN_DTYPE_I64;
    case kiln::DType::boolean: return KILN_DTYPE_BOOL;
  }
  return -1;
}

// What the runtime read must be what ir/safetensors.h reads from the same bytes.
void check_against_ir(std::string_view bytes, const std::vector<Read>& tensors) {
  kiln::SafetensorsFile f;
  try {
    f = kiln::parse_safetensors(bytes, "input");
  } catch (const kiln::Error& e) {
    kiln::fuzz::bug(std::string("the runtime reads a file ir/safetensors.h refuses: ") + e.what());
  }
  if (f.tensors.size() != tensors.size()) kiln::fuzz::bug("the runtime and ir/safetensors.h read different tensors");
  for (const Read& r : tensors) {
    auto it = f.tensors.find(r.name);
    if (it == f.tensors.end()) kiln::fuzz::bug("ir/safetensors.h lacks a tensor the runtime read");
    const kiln::Tensor& t = it->second;
    if (runtime_dtype(t.dtype()) != r.dtype || t.shape() != r.shape || t.nbytes() != r.data.size() ||
        (!r.data.empty() && std::memcmp(t.raw(), r.data.data(), r.data.size()) != 0))
      kiln::fuzz::bug("the runtime and ir/safetensors.h read a tensor differently");
  }
}

void check(std::string_view bytes) {
  kiln::fuzz::MemFile file(bytes);
  std::vector<Read> tensors;
  if (!read_all(file.path(), tensors)) return;
  if (!bytes.starts_with("KILNWTS1")) check_against_ir(bytes, tensors);
  std::vector<KilnAotTensor> table;
  std::vector<const void*> data;
  for (const Read& r : tensors) {
    table.push_back({r.name.c_str(), r.dtype, static_cast<int32_t>(r.shape.size()),
                     r.shape.empty() ? nullptr : r.shape.data(), static_cast<int64_t>(r.data.size())});
    data.push_back(r.data.data());
  }
  std::string path = scratch_dir() + "/again.safetensors";
  char err[512];
  if (kiln_weights_write(path.c_str(), static_cast<int32_t>(table.size()), table.data(), data.data(), err,
                         sizeof err) != 0)
    kiln::fuzz::bug(std::string("a file that reads does not write back: ") + err);
  std::string serialized, why;
  if (!kiln::rt::serialize_weights(static_cast<int32_t>(table.size()), table.data(), data.data(), serialized, why))
    kiln::fuzz::bug("a file that reads does not serialize: " + why);
  std::vector<Read> again;
  if (!read_all(path, again, &why)) kiln::fuzz::bug("a file written back does not read: " + why);
  if (again != tensors) kiln::fuzz::bug("the weights file does not round-trip");
  kiln::fuzz::MemFile written(serialized);
  if (!read_all(written.path(), again) || again != tensors)
    kiln::fuzz::bug("serialize_weights' bytes do not read back as kiln_weights_write's");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  check(bytes);
  if (bytes.starts_with("KILNWTS1")) {
    uint32_t crc = static_cast<uint32_t>(crc32(0L, data, static_cast<uInt>(size)));
    bytes.append(reinterpret_cast<const char*>(&crc), sizeof crc);  // little-endian, as the file
    check(bytes);
  }
  return 0;
}
