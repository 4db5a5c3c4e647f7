// kiln::save_weights / load_weights (codegen/aot.h): the runtime's weights file
// (runtime/aot.h, runtime/weights_file.cpp) for a TensorMap, so that the compiler, the CLI
// and AOT objects read and write one format with one implementation.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <vector>

#include "codegen/aot.h"
#include "codegen/aot_dtype.h"
#include "runtime/aot.h"

namespace kiln {
namespace {

// The file's reader checked the dtype, so every value it hands over is one of these.
DType kiln_dtype(int32_t t) {
  for (DType d : kAllDTypes)
    if (aot_dtype(d) == t) return d;
  internal_error("known dtype", "load_weights: the weights file reader passed dtype " + std::to_string(t));
}

// The runtime's view of `tensors`: a table of KilnAotTensor and their data (splats filled
// out, kept in `full`).
struct WeightsTable {
  std::vector<Tensor> full;
  std::vector<KilnAotTensor> table;
  std::vector<const void*> data;
  explicit WeightsTable(const TensorMap& tensors) {
    full.reserve(tensors.size());
    for (const auto& [name, t] : tensors) {
      const Tensor& dense = t.is_splat() ? full.emplace_back(t.materialized()) : t;
      table.push_back({name.c_str(), aot_dtype(dense.dtype()), static_cast<int32_t>(dense.rank()),
                       dense.shape().empty() ? nullptr : dense.shape().data(), static_cast<int64_t>(dense.nbytes())});
      data.push_back(dense.raw());
    }
  }
};

}  // namespace

void save_weights(const std::string& path, const TensorMap& tensors) {
  WeightsTable w(tensors);
  char err[1024];
  if (kiln_weights_write(path.c_str(), static_cast<int32_t>(w.table.size()), w.table.data(), w.data.data(), err,
                         sizeof err))
    throw Error(err);
}

std::string weights_file_bytes(const TensorMap& tensors) {
  // The runtime writes weights files only to a path: one in a private folder, read back.
  std::string dir = (std::filesystem::temp_directory_path() / "kiln-weights-XXXXXX").string();
  if (!::mkdtemp(dir.data())) throw Error("cannot create a temporary folder '" + dir + "': " + std::strerror(errno));
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{dir};
  const std::string path = dir + "/weights";
  save_weights(path, tensors);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error("cannot read back the weights file '" + path + "': " + std::strerror(errno));
  return bytes;
}

TensorMap load_weights(const std::string& path) {
  struct Load {
    TensorMap tensors;
    std::string error;  // of an exception in the visitor, which must not reach C code
  } load;
  auto visit = [](void* ctx, const KilnAotTensor* t, const void* data) -> int {
    Load& l = *static_cast<Load*>(ctx);
    try {
      Tensor tensor(kiln_dtype(t->dtype), Shape(t->shape, t->shape + t->rank));
      if (t->bytes) std::memcpy(tensor.raw(), data, static_cast<size_t>(t->bytes));
      l.tensors.emplace(t->name, std::move(tensor));
      return 0;
    } catch (const std::bad_alloc&) {
      l.error = "out of memory";
      return 1;
    } catch (const std::exception& e) {
      l.error = e.what();
      return 1;
    }
  };
  char err[1024];
  int rc = kiln_weights_visit(path.c_str(), visit, &load, err, sizeof err);
  if (rc > 0) throw Error("cannot read weights file '" + path + "': " + load.error);
  if (rc != 0) throw Error(err);
  return std::move(load.tensors);
}

}  // namespace kiln
