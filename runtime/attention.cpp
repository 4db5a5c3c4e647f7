// The fused attention kernel (runtime/attention.h).
#include "runtime/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#include "numerics/math.h"
#include "runtime/blas.h"
#include "runtime/gemm.h"
#include "runtime/kernels.h"
#include "runtime/summation.h"
#include "runtime/thread_pool.h"
#include "runtime/vec_internal.h"

namespace {

void gemm(int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float* c, int64_t ldc) {
  kiln_rt_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
void gemm(int32_t ta, int32_t tb, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda, const double* b,
          int64_t ldb, double* c, int64_t ldc) {
  kiln_rt_dgemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}

// A GEMM operand: a rows x cols matrix at `p` with element strides (srow, scol), read in
// place when one stride is 1 (the other the leading dimension), else first copied, scaled
// by `scale` when `scaled` (the graph's elementwise multiply, done here), into `buf` as a
// contiguous row-major matrix.
template <typename T>
struct Operand {
  const T* p = nullptr;
  int32_t trans = 0;
  int64_t ld = 1;
};

template <typename T>
Operand<T> operand(const T* p, int64_t rows, int64_t cols, int64_t srow, int64_t scol, bool scaled, T scale,
                   std::vector<T>& buf) {
  if (!scaled) {
    if ((scol == 1 || cols == 1) && (rows == 1 || srow >= std::max<int64_t>(cols, 1)))
      return {p, 0, rows == 1 ? std::max<int64_t>(cols, 1) : srow};
    if ((srow == 1 || rows == 1) && (cols == 1 || scol >= std::max<int64_t>(rows, 1)))
      return {p, 1, cols == 1 ? std::max<int64_t>(rows, 1) : scol};
  }
  buf.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      T x = p[i * srow + j * scol];
      buf[static_cast<size_t>(i * cols + j)] = scaled ? x * scale : x;
    }
  return {buf.data(), 0, std::max<int64_t>(cols, 1)};
}

// Query rows per task: the block's scores (rows x sk) stay within about 64 KiB, so they are
// still in cache when the second GEMM reads them, and there are enough tasks for a pool of
// 16 threads where the shape allows. A function of the shape only.
constexpr int64_t kMaxRowBlock = 64;
int64_t row_block(int64_t batches, int64_t sq, int64_t sk, size_t elem) {
  int64_t rows = std::clamp<int64_t>(65536 / std::max<int64_t>(sk * static_cast<int64_t>(elem), 1), 8, kMaxRowBlock);
  while (rows > 16 && batches * ((sq + rows - 1) / rows) < 16) rows /= 2;
  return std::min(rows, std::max<int64_t>(sq, 1));
}

// The first pass over a row of scores: x = x (* or /) scale (+ m[j * ms]), and the
// row's maximum (y > max ? y : max from -inf: NaNs are passed over). The f32 row runs
// 8 lanes at a time where the CPU allows (elementwise, so the same bits; the lanes' maxima
// can differ from the scalar scan only in which zero, +0 or -0, is the maximum, which
// x - max and its exponential do not see).
template <typename T>
T scale_mask_max(T* x, int64_t n, bool mul, bool div, T scale, const T* m, int64_t ms) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    T y = x[j];
    if (mul) y = y * scale;
    if (div) y = y / scale;
    if (m) y = y + m[j * ms];
    x[j] = y;
    mx = y > mx ? y : mx;
  }
  return mx;
}

// The last pass: x = x / sum, a NaN quotient +0 with nan_to_zero.
template <typename T>
void normalize(T* x, int64_t n, T sum, bool nan_to_zero) {
  for (int64_t j = 0; j < n; ++j) {
    T r = x[j] / sum;
    x[j] = nan_to_zero && r != r ? T(0) : r;
  }
}

// x[j] = exp(x[j] - mx): numerics/math.h's exp, the interpreter's softmax's.
template <typename T>
void exp_shifted(T* x, int64_t n, T mx) {
  for (int64_t j = 0; j < n; ++j) x[j] = kiln::math::exp(x[j] - mx);
}

using F8 = kiln::rt::Vec32<float>::type;

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void exp_shifted_f32(float* x, int64_t n,
                                                                                                    float mx) {
  for (int64_t j = 0; j < n; ++j) x[j] = kiln::math::exp_f32(x[j] - mx);
}
void exp_shifted(float* x, int64_t n, float mx) { exp_shifted_f32(x, n, mx); }

__attribute__((target_clones("arch=x86-64-v3", "default"))) float scale_mask_max_f32(float* x, int64_t n, bool mul,
                                                                                      bool div, float scale,
                                                                                      const float* m, int64_t ms) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  if (!m || ms == 1) {
    F8 vmx = F8{} - std::numeric_limits<float>::infinity();
    for (; j + 8 <= n; j += 8) {
      F8 y;
      std::memcpy(&y, x + j, sizeof y);
      if (mul) y = y * scale;
      if (div) y = y / scale;
      if (m) {
        F8 mv;
        std::memcpy(&mv, m + j, sizeof mv);
        y = y + mv;
      }
      std::memcpy(x + j, &y, sizeof y);
      vmx = y > vmx ? y : vmx;
    }
    float lanes[8];
    std::memcpy(lanes, &vmx, sizeof lanes);
    for (float l : lanes) mx = l > mx ? l : mx;
  }
  const float rest = scale_mask_max(x + j, n - j, mul, div, scale, m ? m + j * ms : nullptr, ms);
  return rest > mx ? rest : mx;
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void normalize_f32(float* x, int64_t n, float sum,
                                                                                bool nan_to_zero) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    F8 r;
    std::memcpy(&r, x + j, sizeof r);
    r = r / sum;
    if (nan_to_zero) r = r != r ? F8{} : r;
    std::memcpy(x + j, &r, sizeof r);
  }
  normalize(x + j, n - j, sum, nan_to_zero);
}

// The largest of x[0..n) (-inf when none; NaNs passed over), 8 lanes at a time where the CPU
// allows: the maximum of a set, so the scalar scan's value but for which zero, +0 or -0, is
// the maximum, which x - max and its exponential do not see.
__attribute__((target_clones("arch=x86-64-v3", "default"))) float row_max_f32(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  F8 vmx = F8{} - std::numeric_limits<float>::infinity();
  for (; j + 8 <= n; j += 8) {
    F8 y;
    std::memcpy(&y, x + j, sizeof y);
    vmx = y > vmx ? y : vmx;
  }
  float lanes[8];
  std::memcpy(lanes, &vmx, sizeof lanes);
  for (float l : lanes) mx = l > mx ? l : mx;
  for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  return mx;
}

// out[j] = exp(x[j] - mx) (out may be x).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void exp_shifted_into_f32(
    const float* x, float* out, int64_t n, float mx) {
  for (int64_t j = 0; j < n; ++j) out[j] = kiln::math::exp_f32(x[j] - mx);
}

float scale_mask_max(float* x, int64_t n, bool mul, bool div, float scale, const float* m, int64_t ms) {
  return scale_mask_max_f32(x, n, mul, div, scale, m, ms);
}
void normalize(float* x, int64_t n, float sum, bool nan_to_zero) { normalize_f32(x, n, sum, nan_to_zero); }

struct Buffers {
  std::vector<float> f[4];
  std::vector<double> d[4];
  template <typename T>
  std::vector<T>& get(int i) {
    if constexpr (std::is_same_v<T, float>) return f[i];
    else return d[i];
  }
};

// K and V of one batch index packed once for Kiln's GEMM (f32), shared by the tasks of its
// row blocks: the products then pack only their block of Q or of the probabilities.
struct PackedKV {
  kiln::rt::PackedB k, v;
  bool ok = false;
  PackedKV() = default;
  PackedKV(const PackedKV&) = delete;
  PackedKV& operator=(const PackedKV&) = delete;
  ~PackedKV() {
    kiln::rt::forget_packed_b(k, true);
    kiln::rt::forget_packed_b(v, true);
  }
};

// The batch index's two batch coordinates' offset into an operand with strides s.
int64_t batch_offset(const KilnAttentionParams& p, int64_t batch, const int64_t* s) {
  return batch / p.b1 * s[0] + batch % p.b1 * s[1];
}

template <typename T>
Operand<T> k_operand(const T* k, const KilnAttentionParams& p, int64_t batch, T k_scale, std::vector<T>& buf) {
  return operand(k + batch_offset(p, batch, p.k_stride), p.d, p.sk, p.k_stride[2], p.k_stride[3],
                 (p.flags & KILN_ATTN_K_SCALE) != 0, k_scale, buf);
}
template <typename T>
Operand<T> v_operand(const T* v, const KilnAttentionParams& p, int64_t batch, std::vector<T>& buf) {
  return operand(v + batch_offset(p, batch, p.v_stride), p.sk, p.dv, p.v_stride[2], p.v_stride[3], false, T(1), buf);
}

// C = A op(B) from B packed in `packed` where that applies (same bits), else by gemm()
// with the operand `operand()` makes.
template <typename T, typename MakeB>
void product(int32_t ta, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const kiln::rt::PackedB* packed,
             const MakeB& make_b, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    if (packed && kiln::rt::sgemm_packed_b(ta != 0, m, 1.0f, a, lda, *packed, 0.0f, c, ldc)) return;
  Operand<T> b = make_b();
  gemm(ta, b.trans, m, n, k, a, lda, b.p, b.ld, c, ldc);
}

template <typename T>
void attention_rows(const T* q, const T* k, const T* v, const T* mask, T* o, const KilnAttentionParams& p, T q_scale,
                    T k_scale, T scale, int64_t batch, int64_t i0, int64_t rows, const PackedKV* packed) {
  thread_local Buffers tl;
  std::vector<T>& qbuf = tl.get<T>(0);
  std::vector<T>& kbuf = tl.get<T>(1);
  std::vector<T>& vbuf = tl.get<T>(2);
  std::vector<T>& sbuf = tl.get<T>(3);
  auto base = [&](const int64_t* s) { return batch_offset(p, batch, s); };
  const T* qp = q + base(p.q_stride) + i0 * p.q_stride[2];
  T* op = o + base(p.o_stride) + i0 * p.o_stride[2];
  const int64_t sk = p.sk;
  const bool have = packed && packed->ok;
  Operand<T> a = operand(qp, rows, p.d, p.q_stride[2], p.q_stride[3], (p.flags & KILN_ATTN_Q_SCALE) != 0, q_scale, qbuf);
  sbuf.resize(static_cast<size_t>(rows * sk));
  T* s = sbuf.data();
  product(a.trans, rows, sk, p.d, a.p, a.ld, have ? &packed->k : nullptr,
          [&] { return k_operand(k, p, batch, k_scale, kbuf); }, s, sk);
  const bool mul = p.flags & KILN_ATTN_MUL_SCALE, div = p.flags & KILN_ATTN_DIV_SCALE;
  const bool masked = p.flags & KILN_ATTN_MASK, nan_to_zero = p.flags & KILN_ATTN_NAN_TO_ZERO;
  // The unfused graph's operations in its order: scale, mask, then softmax's max,
  // exponentials, denominator and quotients. f32: the block's denominators by the runtime's
  // row sums (sixteen rows at a time in vector lanes, each row's adds in the summation
  // order: the same bits as one scalar chain a row, which took about a cycle an element).
  for (int64_t i = 0; i < rows; ++i) {
    T* x = s + i * sk;
    const T* m = masked ? mask + base(p.mask_stride) + (i0 + i) * p.mask_stride[2] : nullptr;
    exp_shifted(x, sk, scale_mask_max(x, sk, mul, div, scale, m, p.mask_stride[3]));
  }
  if constexpr (std::is_same_v<T, float>) {
    T sums[kMaxRowBlock];
    kiln_rt_row_sums_f32(s, sums, rows, sk, 0);
    for (int64_t i = 0; i < rows; ++i) normalize(s + i * sk, sk, sums[i], nan_to_zero);
  } else {
    for (int64_t i = 0; i < rows; ++i)
      normalize(s + i * sk, sk, kiln::rt::summation_order_sum(s + i * sk, sk), nan_to_zero);
  }
  auto make_v = [&] { return v_operand(v, p, batch, vbuf); };
  const kiln::rt::PackedB* pv = have ? &packed->v : nullptr;
  if (p.o_stride[3] == 1 && (rows == 1 || p.o_stride[2] >= p.dv)) {
    product(0, rows, p.dv, sk, s, sk, pv, make_v, op, rows == 1 ? std::max<int64_t>(p.dv, 1) : p.o_stride[2]);
    return;
  }
  std::vector<T>& obuf = qbuf;  // free again: the scores are computed
  obuf.resize(static_cast<size_t>(rows * p.dv));
  product(0, rows, p.dv, sk, s, sk, pv, make_v, obuf.data(), std::max<int64_t>(p.dv, 1));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < p.dv; ++j) op[i * p.o_stride[2] + j * p.o_stride[3]] = obuf[static_cast<size_t>(i * p.dv + j)];
}

template <typename T>
void attention(const T* q, const T* k, const T* v, const T* mask, T* o, const KilnAttentionParams* pp, T q_scale,
               T k_scale, T scale) {
  const KilnAttentionParams& p = *pp;
  const int64_t batches = p.b0 * p.b1;
  if (batches == 0 || p.sq == 0 || p.dv == 0) return;
  if (p.sk == 0) {
    // No keys: each output element is a sum over no terms, +0, as the unfused graph's
    // second GEMM gives it.
    for (int64_t b = 0; b < batches; ++b)
      for (int64_t i = 0; i < p.sq; ++i)
        for (int64_t j = 0; j < p.dv; ++j)
          o[(b / p.b1) * p.o_stride[0] + (b % p.b1) * p.o_stride[1] + i * p.o_stride[2] + j * p.o_stride[3]] = T(0);
    return;
  }
  const int64_t rows = row_block(batches, p.sq, p.sk, sizeof(T));
  const int64_t blocks = (p.sq + rows - 1) / rows;
  // f32 K and V packed once per batch index when its row blocks are several (and Kiln's
  // GEMM runs): in parallel over the batch first, then the row blocks read them.
  std::unique_ptr<PackedKV[]> packed;
  if constexpr (std::is_same_v<T, float>) {
    if (blocks >= 2 && kiln::rt::gemm_kernel() != kiln::rt::GemmKernel::openblas)
      packed.reset(new (std::nothrow) PackedKV[static_cast<size_t>(batches)]);  // null: each task packs its own
    if (packed)
      kiln::rt::parallel_for(batches, 1, [&](int64_t begin, int64_t end) {
        thread_local Buffers tl;
        for (int64_t b = begin; b < end; ++b) {
          PackedKV& kv = packed[static_cast<size_t>(b)];
          try {
            Operand<float> kb = k_operand(k, p, b, k_scale, tl.get<float>(1));
            bool ok = kiln::rt::pack_b(kv.k, kb.trans != 0, p.d, p.sk, kb.p, kb.ld);
            Operand<float> vb = v_operand(v, p, b, tl.get<float>(2));
            kv.ok = ok && kiln::rt::pack_b(kv.v, vb.trans != 0, p.sk, p.dv, vb.p, vb.ld);
          } catch (const std::bad_alloc&) {
            kv.ok = false;
          }
        }
      });
  }
  auto run = [&](int64_t begin, int64_t end) {
    try {
      for (int64_t t = begin; t < end; ++t) {
        int64_t i0 = (t % blocks) * rows;
        const PackedKV* kv = packed ? &packed[static_cast<size_t>(t / blocks)] : nullptr;
        attention_rows(q, k, v, mask, o, p, q_scale, k_scale, scale, t / blocks, i0, std::min(rows, p.sq - i0), kv);
      }
    } catch (const std::bad_alloc&) {
      kiln::rt::record_error("attention: out of memory for a block of scores");
    }
  };
  // Each task does about rows * sk * (d + dv) multiply-adds; tasks are whole (batch, row
  // block) pairs, so the split over threads does not change any result.
  const double macs = static_cast<double>(rows) * static_cast<double>(p.sk) * static_cast<double>(p.d + p.dv);
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(65536.0 / std::max(macs, 1.0)));
  kiln::rt::parallel_for(batches * blocks, grain, run);
}

}  // namespace

extern "C" {

// Each row: its maximum, the exponentials of x - max into out, then (runs of up to 64
// rows) their sums by the row sums, the quotients in place. Rows run over the pool, each
// computed alone: any thread count gives the same bits.
void kiln_rt_softmax_f32(const float* x, float* out, int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / n);
  kiln::rt::parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    float sums[kMaxRowBlock];
    for (int64_t r = r0; r < r1; r += kMaxRowBlock) {
      const int64_t count = std::min(kMaxRowBlock, r1 - r);
      for (int64_t i = r; i < r + count; ++i)
        exp_shifted_into_f32(x + i * n, out + i * n, n, row_max_f32(x + i * n, n));
      kiln_rt_row_sums_f32(out + r * n, sums, count, n, 0);
      for (int64_t i = 0; i < count; ++i) normalize_f32(out + (r + i) * n, n, sums[i], false);
    }
  });
}

void kiln_rt_attention_f32(const float* q, const float* k, const float* v, const float* mask, float* o,
                           const KilnAttentionParams* p, float q_scale, float k_scale, float scale) {
  attention(q, k, v, mask, o, p, q_scale, k_scale, scale);
}

void kiln_rt_attention_f64(const double* q, const double* k, const double* v, const double* mask, double* o,
                           const KilnAttentionParams* p, double q_scale, double k_scale, double scale) {
  attention(q, k, v, mask, o, p, q_scale, k_scale, scale);
}
}
