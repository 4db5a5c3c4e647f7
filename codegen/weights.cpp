// kiln::save_weights / serialize_weights / load_weights (codegen/aot.h): the runtime's
// weights file (safetensors: runtime/aot.h, runtime/weights_file.cpp) for a TensorMap, so
// that the compiler, the CLI and AOT objects read and write one format with one
// implementation.
#include <cstring>
#include <new>
#include <vector>

#include "codegen/aot.h"
#include "codegen/aot_dtype.h"
#include "runtime/aot.h"
#include "runtime/weights_file.h"

namespace kiln {
namespace {

// The file's reader checked the dtype, so every value it hands over is one of these.
DType kiln_dtype(int32_t t) {
  for (DType d : kAllDTypes)
    if (aot_dtype(d) == t) return d;
  internal_error("known dtype", "load_weights: the weights file reader passed dtype " + std::to_string(t));
}

// The runtime's description of `tensors`: a table and data pointers into them (or into the
// filled-out copies of splats, which it keeps).
struct Table {
  explicit Table(const TensorMap& tensors) {
    full.reserve(tensors.size());
    for (const auto& [name, t] : tensors) {
      const Tensor& dense = t.is_splat() ? full.emplace_back(t.materialized()) : t;
      table.push_back({name.c_str(), aot_dtype(dense.dtype()), static_cast<int32_t>(dense.rank()),
                       dense.shape().empty() ? nullptr : dense.shape().data(), static_cast<int64_t>(dense.nbytes())});
      data.push_back(dense.raw());
    }
  }
  int32_t size() const { return static_cast<int32_t>(table.size()); }
  std::vector<Tensor> full;  // splats filled out; only those are copied
  std::vector<KilnAotTensor> table;
  std::vector<const void*> data;
};

}  // namespace

void save_weights(const std::string& path, const TensorMap& tensors) {
  Table t(tensors);
  char err[1024];
  if (kiln_weights_write(path.c_str(), t.size(), t.table.data(), t.data.data(), err, sizeof err)) throw Error(err);
}

std::string serialize_weights(const TensorMap& tensors) {
  Table t(tensors);
  std::string bytes, why;
  if (!rt::serialize_weights(t.size(), t.table.data(), t.data.data(), bytes, why))
    throw Error("cannot write a weights file: " + why);
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
