// The fused attention kernel that generated code calls for a region of the
// fuse_attention pass (passes/fuse_attention.h):
//
//   O = softmax((Q * q_scale) . (K * k_scale) (* or / scale) + mask, last axis) . V
//
// for every batch index, without writing the [batch..., Sq, Sk] scores to memory: each
// task takes one batch index and a block of query rows, computes the block's scores with
// one GEMM into a buffer that stays in cache, normalizes each row there, and multiplies it
// by V with a second GEMM straight into O. The products go through kiln_rt_sgemm /
// kiln_rt_dgemm (runtime/blas.h) or, f32 with Kiln's GEMM and several row blocks, read K
// and V packed once per batch index (the same bits); the scaling, the mask and the
// softmax do exactly what the unfused graph's kernels do (the same operations in the same
// order, the softmax's denominator in Kiln's summation order), so the result differs from
// the unfused graph's only by how the BLAS rounds a block of rows against the whole matrix.
//
// Tasks are cut by the shape alone (the row block depends on Sq and Sk, never on the
// thread count) and each writes its own rows of O, so results are bitwise the same for any
// thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

// Sizes and element strides of one attention region. Every operand is seen through four
// logical dims: two batch dims (b0, b1; size 1 where the graph has fewer), then the two
// matrix dims: Q [b0, b1, sq, d], K as the product's right operand [b0, b1, d, sk],
// V [b0, b1, sk, dv], mask [b0, b1, sq, sk] and O [b0, b1, sq, dv]. A stride of 0
// broadcasts. For each GEMM operand one of its two matrix strides is 1 (the other is its
// leading dimension); O's last stride is 1.
struct KilnAttentionParams {
  int64_t b0, b1, sq, sk, d, dv;
  int64_t q_stride[4], k_stride[4], v_stride[4], mask_stride[4], o_stride[4];
  int64_t flags;  // KILN_ATTN_* bits
};
static_assert(std::is_standard_layout_v<KilnAttentionParams> && std::is_trivially_copyable_v<KilnAttentionParams> &&
                  sizeof(KilnAttentionParams) == 27 * sizeof(int64_t) &&
                  offsetof(KilnAttentionParams, flags) == 26 * sizeof(int64_t),
              "KilnAttentionParams must be 27 int64 fields, as generated code writes it");

enum {
  KILN_ATTN_Q_SCALE = 1,       // Q is multiplied by q_scale first (elementwise, before the product)
  KILN_ATTN_K_SCALE = 2,       // K is multiplied by k_scale first
  KILN_ATTN_MUL_SCALE = 4,     // the scores are multiplied by scale
  KILN_ATTN_DIV_SCALE = 8,     // the scores are divided by scale
  KILN_ATTN_MASK = 16,         // the mask is added to the scores
  KILN_ATTN_NAN_TO_ZERO = 32,  // a NaN probability becomes +0 (select(p != p, 0, p))
};

extern "C" {

// o = attention(q, k, v, mask) as KilnAttentionParams describes; mask may be null without
// KILN_ATTN_MASK. o must not overlap the operands.
void kiln_rt_attention_f32(const float* q, const float* k, const float* v, const float* mask, float* o,
                           const KilnAttentionParams* p, float q_scale, float k_scale, float scale);
void kiln_rt_attention_f64(const double* q, const double* k, const double* v, const double* mask, double* o,
                           const KilnAttentionParams* p, double q_scale, double k_scale, double scale);
}
