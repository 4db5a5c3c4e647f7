// top_k (runtime/kernels.h): per row, a partial sort of the row's positions over the strict
// total order the interpreter uses (ir/interp.cpp's top_k): value, with NaN as the largest,
// then position. The order is total, so the result is the interpreter's whatever the sort
// does and however the rows are split over threads.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>
#include <vector>

#include "runtime/kernels.h"
#include "runtime/thread_pool.h"

namespace {

template <typename T>
bool nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

template <typename T>
void top_k(const T* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k, bool largest) {
  constexpr int64_t kMinWork = 1 << 14;  // elements per chunk
  kiln::rt::parallel_for(outer * inner, kMinWork / std::max<int64_t>(d, 1) + 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> pos(static_cast<size_t>(d));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / inner, c = row % inner;
      const T* r = x + b * d * inner + c;
      auto before = [&](int64_t i, int64_t j) {  // i is picked before j
        const T u = r[i * inner], v = r[j * inner];
        const bool un = nan(u), vn = nan(v);
        if (un != vn) return largest ? un : vn;
        if (un || u == v) return i < j;
        return largest ? u > v : u < v;
      };
      std::iota(pos.begin(), pos.end(), int64_t{0});
      std::partial_sort(pos.begin(), pos.begin() + k, pos.end(), before);
      for (int64_t j = 0; j < k; ++j) out[(b * k + j) * inner + c] = pos[static_cast<size_t>(j)];
    }
  });
}

}  // namespace

extern "C" {
void kiln_rt_top_k_f32(const float* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest) {
  top_k(x, out, outer, d, inner, k, largest != 0);
}
void kiln_rt_top_k_f64(const double* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest) {
  top_k(x, out, outer, d, inner, k, largest != 0);
}
void kiln_rt_top_k_i32(const int32_t* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest) {
  top_k(x, out, outer, d, inner, k, largest != 0);
}
void kiln_rt_top_k_i64(const int64_t* x, int64_t* out, int64_t outer, int64_t d, int64_t inner, int64_t k,
                       int32_t largest) {
  top_k(x, out, outer, d, inner, k, largest != 0);
}
}
