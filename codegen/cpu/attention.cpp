// A fuse_attention body (passes/fuse_attention.h) as one call of the runtime's attention
// kernel (runtime/attention.h): the operands' transposes become strides, nothing of the
// body is materialized.
#include <llvm/IR/Constants.h>

#include "codegen/cpu/lowerer.h"
#include "ir/attrs.h"
#include "passes/fuse_attention.h"
#include "runtime/attention.h"

namespace kiln::cpu::detail {
namespace {

// The element strides of the logical operand transpose(x, perm) (x contiguous; no perm:
// x itself), and its shape.
void logical_view(const Shape& x, const std::vector<int64_t>& perm, Shape& shape, std::vector<int64_t>& strides) {
  std::vector<int64_t> own = strides_of(x);
  shape = x;
  strides = own;
  for (size_t i = 0; i < perm.size(); ++i) {
    shape[i] = x[static_cast<size_t>(perm[i])];
    strides[i] = own[static_cast<size_t>(perm[i])];
  }
}

// Strides of a view of `shape` over the frame [b0, b1, rows, cols] whose batch dims are
// `batch` (aligned to the right, at most two): a missing or broadcast dim gets stride 0.
void frame(const Shape& shape, const std::vector<int64_t>& strides, const Shape& batch, int64_t out[4]) {
  const size_t r = shape.size();
  out[2] = shape[r - 2] == 1 ? 0 : strides[r - 2];
  out[3] = shape[r - 1] == 1 ? 0 : strides[r - 1];
  out[0] = out[1] = 0;
  for (size_t k = 0; k < batch.size() && k + 2 < r; ++k) {
    size_t d = r - 3 - k;  // the operand's k-th batch dim from the right
    if (shape[d] != 1) out[1 - k] = strides[d];
  }
}

}  // namespace

bool Lowerer::lower_attention(const Node& n, const std::vector<Value*>& ptr) {
  if (n.body->name().rfind("attention_", 0) != 0) return false;
  std::optional<AttentionMatch> m = match_attention_body(*n.body);
  if (!m) return false;
  const Graph& body = *n.body;
  const Shape& scores = body.type(m->scores).shape;
  const Shape batch(scores.begin(), scores.end() - 2);
  const Shape& product = body.type(m->product).shape;
  if (batch.size() > 2 || Shape(product.begin(), product.end() - 2) != batch) return false;
  KilnAttentionParams p{};
  p.b0 = batch.size() == 2 ? batch[0] : 1;
  p.b1 = batch.empty() ? 1 : batch.back();
  p.sq = scores[scores.size() - 2];
  p.sk = scores.back();
  p.dv = product.back();
  Shape s;
  std::vector<int64_t> st;
  logical_view(body.type(m->q).shape, m->q_perm, s, st);
  p.d = s.back();
  frame(s, st, batch, p.q_stride);
  logical_view(body.type(m->k).shape, m->k_perm, s, st);
  frame(s, st, batch, p.k_stride);
  logical_view(body.type(m->v).shape, m->v_perm, s, st);
  frame(s, st, batch, p.v_stride);
  if (m->mask.valid()) {
    const Shape& ms = body.type(m->mask).shape;
    Shape full(scores.size() - ms.size(), 1);  // the mask's dims, right-aligned to the scores'
    full.insert(full.end(), ms.begin(), ms.end());
    frame(full, strides_of(full), batch, p.mask_stride);
  }
  // O: the product in the region's result buffer, itself or through the output transpose.
  std::vector<int64_t> os = strides_of(product);
  if (!m->out_perm.empty()) {
    std::vector<int64_t> rs = strides_of(body.type(m->out).shape);
    for (size_t j = 0; j < m->out_perm.size(); ++j) os[static_cast<size_t>(m->out_perm[j])] = rs[j];
  }
  frame(product, os, batch, p.o_stride);
  p.o_stride[3] = 1;  // dv = 1: any stride reads the one column; the kernel wants 1
  p.flags = (m->q_scale ? KILN_ATTN_Q_SCALE : 0) | (m->k_scale ? KILN_ATTN_K_SCALE : 0) |
            (m->scale ? (m->divide ? KILN_ATTN_DIV_SCALE : KILN_ATTN_MUL_SCALE) : 0) |
            (m->mask.valid() ? KILN_ATTN_MASK : 0) | (m->nan_to_zero ? KILN_ATTN_NAN_TO_ZERO : 0);
  const DType t = body.type(m->out).dtype;
  auto in = [&](ValueId v) { return ptr[n.operands.at(static_cast<size_t>(body.value(v).input)).id]; };
  Value* mask = m->mask.valid() ? in(m->mask) : llvm::ConstantPointerNull::get(llvm::PointerType::get(C_, 0));
  auto scale = [&](const std::optional<double>& c) { return scalar(t, c.value_or(1.0)); };
  B_.CreateCall(runtime(t == DType::f32 ? RtFn::kiln_rt_attention_f32 : RtFn::kiln_rt_attention_f64),
                {in(m->q), in(m->k), in(m->v), mask, ptr[n.results[0].id], params_array(p), scale(m->q_scale),
                 scale(m->k_scale), scale(m->scale)});
  return true;
}

}  // namespace kiln::cpu::detail
