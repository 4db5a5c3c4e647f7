// Kernels of one node (codegen/cpu/lowerer.h): reductions in Kiln's summation order,
// argmax, softmax, shape ops as strided copies, one_hot, GEMM and the runtime's convolution
// and pooling (runtime/blas.h, runtime/kernels.h).
#include "codegen/cpu/lowerer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <set>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>

#include "codegen/aot_dtype.h"
#include "ir/error.h"
#include "ir/interp.h"
#include "ir/ops.h"
#include "ir/philox.h"
#include "runtime/kernels.h"

namespace kiln::cpu::detail {

[[noreturn]] void Lowerer::unsupported(Op op) {
  throw Error("cpu codegen: " + std::string(op_name(op)) + " is not supported yet");
}

// A kernel other than a loop: its one node.
void Lowerer::lower_node(const Graph& g, const Kernel& kernel, std::vector<Value*>& ptr, int64_t& cursor) {
  const Node& n = g.nodes()[static_cast<size_t>(kernel.nodes[0])];
  const TensorType& rt = g.type(n.result());
  Value* out = ptr[n.result().id];
  auto in = [&](size_t k) { return ptr[n.operands[k].id]; };
  auto it = [&](size_t k) -> const TensorType& { return g.type(n.operands[k]); };
  int64_t esize = static_cast<int64_t>(dtype_size(rt.dtype));
  switch (n.op) {
    case Op::Neg: case Op::Abs: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Tanh:
    case Op::Sigmoid: case Op::Erf: case Op::Log1p: case Op::Expm1: case Op::Floor: case Op::Ceil:
    case Op::Round: case Op::Sin: case Op::Cos: case Op::Fmod: case Op::Relu: case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow:
    case Op::Maximum: case Op::Minimum: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt:
    case Op::Ge: case Op::Select: case Op::Cast:
      internal_error("codegen", "cpu codegen: elementwise node outside a loop group");
    case Op::Sum: case Op::Mean: case Op::Max: case Op::Min:
      if (layout_of(g, n.operands[0], n.result()) & KILN_LAYOUT_X_NCHW16C) {
        // A sum or mean over the planes of an NCHW16c x (layout.cpp: plane_reduction).
        const Shape& xs = it(0).shape;
        B_.CreateCall(runtime(RtFn::kiln_rt_row_sums_nchwc_f32),
                      {in(0), out, c64(xs[0]), c64(xs[1]), c64(xs[2] * xs[3]), B_.getInt32(n.op == Op::Mean ? 1 : 0)});
        return;
      }
      return lower_reduce(n, it(0), rt, in(0), out, cursor);
    case Op::Argmax: return lower_argmax(n, it(0), in(0), out);
    case Op::TopK: {  // the runtime's partial sort per row (runtime/top_k.cpp)
      const Shape& xs = it(0).shape;
      const int64_t axis = attr_int(n.attrs, "axis") < 0 ? attr_int(n.attrs, "axis") + it(0).rank() : attr_int(n.attrs, "axis");
      int64_t outer = 1, inner = 1;
      for (int64_t a = 0; a < axis; ++a) outer *= xs[static_cast<size_t>(a)];
      for (size_t a = static_cast<size_t>(axis) + 1; a < xs.size(); ++a) inner *= xs[a];
      RtFn f = it(0).dtype == DType::f32   ? RtFn::kiln_rt_top_k_f32
               : it(0).dtype == DType::f64 ? RtFn::kiln_rt_top_k_f64
               : it(0).dtype == DType::i32 ? RtFn::kiln_rt_top_k_i32
                                           : RtFn::kiln_rt_top_k_i64;
      B_.CreateCall(runtime(f), {in(0), out, c64(outer), c64(xs[static_cast<size_t>(axis)]), c64(inner),
                                 c64(attr_int(n.attrs, "k")), B_.getInt32(attr_bool(n.attrs, "largest") ? 1 : 0)});
      return;
    }
    case Op::AllReduce:
      // Started in place on the result by the installed collective (runtime/collective.h);
      // lower_level waits for it before the first reader of the result.
      if (!same_storage(g, n.result(), n.operands[0])) copy_bytes(out, in(0), rt.numel() * esize);
      B_.CreateCall(runtime(RtFn::kiln_rt_all_reduce_start), {out, c64(rt.numel()), B_.getInt32(aot_dtype(rt.dtype))});
      return;
    case Op::Reshape:  // a view when the memory plan put it over its dying operand
      if (same_storage(g, n.result(), n.operands[0])) return;
      return copy_bytes(out, in(0), rt.numel() * esize);
    case Op::Transpose: case Op::BroadcastTo: case Op::Slice:
      if (n.op == Op::Slice)  // a view where the memory plan put the result at its run of the operand
        if (auto at = contiguous_slice_start(g, n); at && same_storage(g, n.result(), n.operands[0], *at)) return;
      return copy_strided(rt.dtype, rt.shape, out, {strides_of(rt.shape), 0}, in(0),
                          source_view(n, it(0).shape, rt.shape));
    case Op::Concat: {
      size_t axis = static_cast<size_t>(attr_int(n.attrs, "axis") < 0 ? attr_int(n.attrs, "axis") + rt.rank()
                                                                       : attr_int(n.attrs, "axis"));
      std::vector<int64_t> os = strides_of(rt.shape);
      int64_t base = 0;
      for (size_t k = 0; k < n.operands.size(); ++k) {
        // An operand the memory plan put in its slice (memory_plan.h) is there already.
        if (!same_storage(g, n.operands[k], n.result(), base * os[axis] * esize))
          copy_strided(rt.dtype, it(k).shape, out, {os, base * os[axis]}, in(k), {strides_of(it(k).shape), 0});
        base += it(k).shape[axis];
      }
      return;
    }
    case Op::Pad: {
      const auto& low = attr_ints(n.attrs, "low");
      Value* v = scalar(rt.dtype, 0);
      {
        Tensor t = Tensor::scalar(DType::f64, attr_float(n.attrs, "value")).cast(rt.dtype);
        v = element_constant(t, 0);
      }
      nest(rt.shape, {{strides_of(rt.shape), 0}}, [&](const std::vector<Value*>& off) { store(rt.dtype, v, out, off[0]); }, 1);
      std::vector<int64_t> os = strides_of(rt.shape);
      int64_t base = 0;
      for (size_t d = 0; d < os.size(); ++d) base += low[d] * os[d];
      return copy_strided(rt.dtype, it(0).shape, out, {os, base}, in(0), {strides_of(it(0).shape), 0});
    }
    case Op::Matmul: return lower_matmul(g, n, kernel, ptr);
    case Op::Conv2d: {
      Value* null = llvm::ConstantPointerNull::get(llvm::PointerType::get(C_, 0));
      Value* bias = n.operands.size() > 2 ? in(2) : null;
      Value* params = conv_params(n, it(0).shape, it(1).shape, rt.shape);
      if (int32_t layout = layout_of(g, n.operands[0], n.result()); layout != 0) {
        B_.CreateCall(runtime(RtFn::kiln_rt_conv2d_nchwc_f32),
                      {cacheable_weight(n.operands[1]) ? weight_cache_slot() : null, in(0), in(1), bias, null, out,
                       params, B_.getInt32(KILN_ACT_NONE), B_.getInt32(layout)});
        return;
      }
      if (rt.dtype == DType::f32 && cacheable_weight(n.operands[1])) {
        B_.CreateCall(runtime(RtFn::kiln_rt_conv2d_cached_f32),
                      {weight_cache_slot(), in(0), in(1), bias, null, out, params, B_.getInt32(KILN_ACT_NONE)});
        return;
      }
      RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_conv2d_f32 : RtFn::kiln_rt_conv2d_f64;
      B_.CreateCall(runtime(f), {in(0), in(1), bias, out, params});
      return;
    }
    case Op::Conv2dGradInput: {
      RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_conv2d_grad_input_f32 : RtFn::kiln_rt_conv2d_grad_input_f64;
      B_.CreateCall(runtime(f),
                    {in(0), in(1), out, conv_params(n, rt.shape, it(1).shape, it(0).shape)});
      return;
    }
    case Op::Conv2dGradWeight: {
      RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_conv2d_grad_weight_f32 : RtFn::kiln_rt_conv2d_grad_weight_f64;
      B_.CreateCall(runtime(f),
                    {in(0), in(1), out, conv_params(n, it(0).shape, rt.shape, it(1).shape)});
      return;
    }
    case Op::MaxPool2d: {
      if (int32_t layout = layout_of(g, n.operands[0], n.result()); layout != 0) {
        B_.CreateCall(runtime(RtFn::kiln_rt_max_pool2d_nchwc_f32),
                      {in(0), out, pool_params(n, it(0).shape, rt.shape), B_.getInt32(layout)});
        return;
      }
      RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_max_pool2d_f32 : RtFn::kiln_rt_max_pool2d_f64;
      B_.CreateCall(runtime(f), {in(0), out, pool_params(n, it(0).shape, rt.shape)});
      return;
    }
    case Op::AvgPool2d: {
      RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_avg_pool2d_f32 : RtFn::kiln_rt_avg_pool2d_f64;
      B_.CreateCall(runtime(f),
                    {in(0), out, pool_params(n, it(0).shape, rt.shape),
                     B_.getInt32(attr_bool(n.attrs, "count_include_pad") ? 1 : 0)});
      return;
    }
    case Op::MaxPool2dGrad: {
      RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_max_pool2d_grad_f32 : RtFn::kiln_rt_max_pool2d_grad_f64;
      B_.CreateCall(runtime(f),
                    {in(0), in(1), out, pool_params(n, it(0).shape, it(1).shape)});
      return;
    }
    case Op::AvgPool2dGrad: {
      RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_avg_pool2d_grad_f32 : RtFn::kiln_rt_avg_pool2d_grad_f64;
      B_.CreateCall(runtime(f),
                    {in(0), out, pool_params(n, rt.shape, it(0).shape),
                     B_.getInt32(attr_bool(n.attrs, "count_include_pad") ? 1 : 0)});
      return;
    }
    case Op::Softmax:
    case Op::LogSoftmax: return lower_softmax(n, it(0), in(0), out);
    case Op::OneHot: {
      int64_t depth = rt.shape.back();
      B_.CreateMemSet(out, B_.getInt8(0), static_cast<uint64_t>(rt.numel() * esize), llvm::MaybeAlign());
      DType xt = it(0).dtype;
      Value* one = scalar(rt.dtype, 1);
      for_loop(it(0).numel(), [&](Value* i) {
        Value* x = load(xt, in(0), i);
        Value* idx = xt == DType::boolean ? B_.CreateZExt(x, i64_) : B_.CreateSExtOrTrunc(x, i64_);
        Value* ok = B_.CreateAnd(B_.CreateICmpSGE(idx, c64(0)), B_.CreateICmpSLT(idx, c64(depth)));
        llvm::BasicBlock* then = llvm::BasicBlock::Create(C_, "onehot.set", F_);
        llvm::BasicBlock* done = llvm::BasicBlock::Create(C_, "onehot.next", F_);
        B_.CreateCondBr(ok, then, done);
        B_.SetInsertPoint(then);
        store(rt.dtype, one, out, B_.CreateAdd(B_.CreateMul(i, c64(depth)), idx));
        B_.CreateBr(done);
        B_.SetInsertPoint(done);
      });
      return;
    }
    case Op::Gather: return lower_gather(n, it(0), it(1), in(0), in(1), out, rt);
    case Op::GatherGrad: return lower_gather_grad(n, it(0), it(1), in(0), in(1), out, rt);
    case Op::LayerNorm: case Op::BatchNorm: case Op::Dropout: {
      std::vector<Value*> ins;
      for (size_t k = 0; k < n.operands.size(); ++k) ins.push_back(in(k));
      if (n.op == Op::LayerNorm) return lower_layer_norm(n, it(0), ins, out);
      if (n.op == Op::BatchNorm) return lower_batch_norm(n, it(0), ins, out);
      return lower_dropout(n, it(0), ins, out);
    }
    case Op::Constant: internal_error("codegen", "cpu codegen: a constant planned as a kernel");
    case Op::Fused: {
      if (lower_conv_epilogue(g, n, ptr) || lower_attention(n, ptr)) return;
      std::vector<Value*> body_ptr(n.body->values().size(), nullptr);
      for (size_t j = 0; j < n.operands.size(); ++j) body_ptr[n.body->inputs()[j].value.id] = in(j);
      std::vector<Value*> outs;
      for (ValueId r : n.results) outs.push_back(ptr[r.id]);
      std::vector<bool> outer_weight;
      if (gemm_cache_) {  // the body's weights: its inputs bound to weights
        outer_weight = std::move(weight_);
        weight_.assign(n.body->values().size(), false);
        for (size_t j = 0; j < n.operands.size(); ++j) weight_[n.body->inputs()[j].value.id] = outer_weight[n.operands[j].id];
      }
      // An elementwise region in NCHW16c (layout.cpp): its loops run in that layout.
      Shape outer_blocked = std::move(blocked_body_);
      blocked_body_ = layout_of(g, n.result(), n.result()) ? rt.shape : Shape{};
      lower_level(*n.body, *kernel.body, body_ptr, false, cursor, outs);
      blocked_body_ = std::move(outer_blocked);
      if (gemm_cache_) weight_ = std::move(outer_weight);
      return;
    }
  }
  unsupported(n.op);
}

namespace {
// x (or dx) as [outer, d, inner] around `axis`.
struct GatherDims {
  int64_t outer = 1, d = 1, inner = 1;
};
GatherDims gather_dims(const Shape& x, int64_t axis) {
  if (axis < 0) axis += static_cast<int64_t>(x.size());
  GatherDims g;
  g.d = x[static_cast<size_t>(axis)];
  for (int64_t k = 0; k < axis; ++k) g.outer *= x[static_cast<size_t>(k)];
  for (size_t k = static_cast<size_t>(axis) + 1; k < x.size(); ++k) g.inner *= x[k];
  return g;
}
}  // namespace

// Index `i` of an integer tensor, as i64, and whether it is within 0..d-1.
std::pair<Value*, Value*> Lowerer::load_index(DType t, Value* indices, Value* i, int64_t d) {
  Value* j = B_.CreateSExtOrTrunc(load(t, indices, i), i64_);
  return {j, B_.CreateAnd(B_.CreateICmpSGE(j, c64(0)), B_.CreateICmpSLT(j, c64(d)))};
}

// Runs `then` only where `cond` holds.
void Lowerer::if_then(Value* cond, const std::function<void()>& then) {
  llvm::BasicBlock* yes = llvm::BasicBlock::Create(C_, "if.then", F_);
  llvm::BasicBlock* done = llvm::BasicBlock::Create(C_, "if.end", F_);
  B_.CreateCondBr(cond, yes, done);
  B_.SetInsertPoint(yes);
  then();
  B_.CreateBr(done);
  B_.SetInsertPoint(done);
}

// gather: row by row ([outer * I] rows of `inner` elements), each a copy of x's row at its
// index or zeros (the output is cleared first).
void Lowerer::lower_gather(const Node& n, const TensorType& x, const TensorType& idx, Value* xp, Value* ip,
                           Value* out, const TensorType& rt) {
  const GatherDims g = gather_dims(x.shape, attr_int(n.attrs, "axis"));
  const int64_t count = idx.numel(), es = static_cast<int64_t>(dtype_size(rt.dtype));
  const int64_t row = g.inner * es;
  B_.CreateMemSet(out, B_.getInt8(0), static_cast<uint64_t>(rt.numel() * es), llvm::MaybeAlign());
  if (row == 0) return;
  for_loop(g.outer * count, [&](Value* r) {
    Value* o = B_.CreateSDiv(r, c64(count));
    auto [j, ok] = load_index(idx.dtype, ip, B_.CreateSRem(r, c64(count)), g.d);
    if_then(ok, [&] {
      Value* src = B_.CreateMul(B_.CreateAdd(B_.CreateMul(o, c64(g.d)), j), c64(row));
      B_.CreateMemCpy(B_.CreateInBoundsGEP(B_.getInt8Ty(), out, B_.CreateMul(r, c64(row))), llvm::MaybeAlign(),
                      B_.CreateInBoundsGEP(B_.getInt8Ty(), xp, src), llvm::MaybeAlign(), static_cast<uint64_t>(row));
    });
  });
}

// gather_grad: dx cleared, then for each outer block, the dy rows added to the rows their
// indices name, in index order (the interpreter's order, so the sums are bitwise its own).
void Lowerer::lower_gather_grad(const Node& n, const TensorType& dy, const TensorType& idx, Value* dyp, Value* ip,
                                Value* out, const TensorType& rt) {
  (void)dy;
  const GatherDims g = gather_dims(rt.shape, attr_int(n.attrs, "axis"));
  const int64_t count = idx.numel(), es = static_cast<int64_t>(dtype_size(rt.dtype));
  B_.CreateMemSet(out, B_.getInt8(0), static_cast<uint64_t>(rt.numel() * es), llvm::MaybeAlign());
  for_loop(g.outer, [&](Value* b) {
    for_loop(count, [&](Value* i) {
      auto [j, ok] = load_index(idx.dtype, ip, i, g.d);
      if_then(ok, [&] {
        Value* dst = B_.CreateMul(B_.CreateAdd(B_.CreateMul(b, c64(g.d)), j), c64(g.inner));
        Value* src = B_.CreateMul(B_.CreateAdd(B_.CreateMul(b, c64(count)), i), c64(g.inner));
        for_loop(g.inner, [&](Value* c) {
          Value* at = B_.CreateAdd(dst, c);
          store(rt.dtype, B_.CreateFAdd(load(rt.dtype, out, at), load(rt.dtype, dyp, B_.CreateAdd(src, c))), out, at);
        });
      });
    });
  });
}

// layer_norm: a row per iteration (parallel over rows, each row by one thread, so the
// same whatever the thread count): its mean and variance in the summation order, then
// (x - mean) * (1 / sqrt(var + eps)) * scale + bias, as the interpreter computes it.
void Lowerer::lower_layer_norm(const Node& n, const TensorType& x, const std::vector<Value*>& in, Value* out) {
  const DType t = x.dtype;
  const int64_t rank = x.rank(), a = attr_int(n.attrs, "axis"), axis = a < 0 ? a + rank : a;
  int64_t rows = 1, len = 1;
  for (int64_t d = 0; d < rank; ++d) (d < axis ? rows : len) *= x.shape[static_cast<size_t>(d)];
  if (len == 0) return;
  Value* eps = scalar(t, attr_float(n.attrs, "epsilon"));
  par_for(rows, len * 8, [&](Value* r) {
    Value* base = B_.CreateMul(r, c64(len));
    auto xk = [&](Value* k) { return load(t, in[0], B_.CreateAdd(base, k)); };
    Value* count = scalar(t, static_cast<double>(len));
    Value* mean = B_.CreateFDiv(blocked_sum(t, len, xk), count);
    Value* var = B_.CreateFDiv(blocked_sum(t, len, [&](Value* k) {
      Value* d = B_.CreateFSub(xk(k), mean);
      return B_.CreateFMul(d, d);
    }), count);
    Value* inv = B_.CreateFDiv(scalar(t, 1), intrinsic(llvm::Intrinsic::sqrt, B_.CreateFAdd(var, eps)));
    for_loop(len, [&](Value* k) {
      Value* y = B_.CreateFMul(B_.CreateFMul(B_.CreateFSub(xk(k), mean), inv), load(t, in[1], k));
      if (in.size() > 2) y = B_.CreateFAdd(y, load(t, in[2], k));
      store(t, y, out, B_.CreateAdd(base, k));
    });
  });
}

// batch_norm: a plane (one image's channel) per iteration with that channel's statistics.
void Lowerer::lower_batch_norm(const Node& n, const TensorType& x, const std::vector<Value*>& in, Value* out) {
  const DType t = x.dtype;
  const int64_t channels = x.shape[1];
  int64_t inner = 1;
  for (size_t d = 2; d < x.shape.size(); ++d) inner *= x.shape[d];
  if (inner == 0) return;
  Value* eps = scalar(t, attr_float(n.attrs, "epsilon"));
  par_for(x.shape[0] * channels, inner * 2, [&](Value* plane) {
    Value* c = B_.CreateURem(plane, c64(channels));
    Value* inv = B_.CreateFDiv(scalar(t, 1), intrinsic(llvm::Intrinsic::sqrt, B_.CreateFAdd(load(t, in[4], c), eps)));
    Value *mean = load(t, in[3], c), *scale = load(t, in[1], c), *bias = load(t, in[2], c);
    Value* base = B_.CreateMul(plane, c64(inner));
    for_loop(inner, [&](Value* k) {
      Value* at = B_.CreateAdd(base, k);
      Value* y = B_.CreateFMul(B_.CreateFMul(B_.CreateFSub(load(t, in[0], at), mean), inv), scale);
      store(t, B_.CreateFAdd(y, bias), out, at);
    });
  });
}

// The first output word of Philox4x32-10 (ir/philox.h) for dropout's element i: ten rounds
// unrolled, each two 32x32->64-bit products.
Value* Lowerer::philox_word0(Value* i, int64_t stream, Value* seed, Value* counter) {
  auto lo = [&](Value* v) { return B_.CreateTrunc(v, i32_); };
  auto hi = [&](Value* v) { return B_.CreateTrunc(B_.CreateLShr(v, c64(32)), i32_); };
  Value* c[4] = {lo(i), B_.getInt32(static_cast<uint32_t>(stream)), lo(counter), hi(counter)};
  Value* k[2] = {lo(seed), hi(seed)};
  for (int r = 0; r < philox::kRounds; ++r) {
    if (r > 0) {
      k[0] = B_.CreateAdd(k[0], B_.getInt32(philox::kW0));
      k[1] = B_.CreateAdd(k[1], B_.getInt32(philox::kW1));
    }
    Value* p0 = B_.CreateMul(B_.CreateZExt(c[0], i64_), c64(philox::kM0));
    Value* p1 = B_.CreateMul(B_.CreateZExt(c[2], i64_), c64(philox::kM1));
    Value* next[4] = {B_.CreateXor(B_.CreateXor(hi(p1), c[1]), k[0]), lo(p1),
                      B_.CreateXor(B_.CreateXor(hi(p0), c[3]), k[1]), lo(p0)};
    std::copy(std::begin(next), std::end(next), std::begin(c));
  }
  return c[0];
}

// dropout: each element independently (its draw depends on its index only), so any split
// over threads gives the interpreter's bits.
void Lowerer::lower_dropout(const Node& n, const TensorType& x, const std::vector<Value*>& in, Value* out) {
  const DType t = x.dtype;
  const double ratio = attr_float(n.attrs, "ratio");
  Value* seed = load(DType::i64, in[1], c64(0));
  Value* counter = load(DType::i64, in[2], c64(0));
  Value* scale = element_constant(Tensor::scalar(DType::f64, 1 / (1 - ratio)).cast(t), 0);
  Value* threshold = B_.getInt32(philox::dropout_threshold(ratio));
  Value* zero = scalar(t, 0);
  const int64_t stream = attr_int(n.attrs, "stream");
  par_for(x.numel(), 64, [&](Value* i) {
    Value* keep = B_.CreateICmpUGE(philox_word0(i, stream, seed, counter), threshold);
    store(t, B_.CreateSelect(keep, B_.CreateFMul(load(t, in[0], i), scale), zero), out, i);
  });
}

// A fused conv2d with its epilogue (match_conv_epilogue) as one call of the runtime's
// conv2d_act (relu alone) or conv2d_epi, which apply it to each block of output while it
// is in cache instead of in a second pass over the whole result; conv2d_nchwc where the
// layout assignment (layout.cpp) keeps x or y in NCHW16c. False for any other body (the
// general path: the conv, then a loop over its result).
bool Lowerer::lower_conv_epilogue(const Graph& g, const Node& n, const std::vector<Value*>& ptr) {
  std::optional<ConvEpilogue> m = match_conv_epilogue(n);
  if (!m) return false;
  const Graph& body = *n.body;
  const Node& conv = *m->conv;
  const TensorType& yt = body.type(conv.result());
  std::vector<Value*> in;
  for (ValueId v : m->operands) in.push_back(ptr[v.id]);
  Value* null = llvm::ConstantPointerNull::get(llvm::PointerType::get(C_, 0));
  Value* bias = in.size() > 2 ? in[2] : null;
  Value* residual = m->residual.valid() ? ptr[m->residual.id] : null;
  Value* params = conv_params(conv, body.type(conv.operands[0]).shape, body.type(conv.operands[1]).shape, yt.shape);
  const bool f32 = yt.dtype == DType::f32;
  const int32_t act = m->act;
  const ValueId outer_w = m->operands[1];  // the weight, as the top level (or the enclosing body) sees it
  const int32_t layout = layout_of(g, m->operands[0], n.result());
  if (layout != 0) {
    B_.CreateCall(runtime(RtFn::kiln_rt_conv2d_nchwc_f32),
                  {cacheable_weight(outer_w) ? weight_cache_slot() : null, in[0], in[1], bias, residual,
                   ptr[n.results[0].id], params, B_.getInt32(act), B_.getInt32(layout)});
  } else if (f32 && cacheable_weight(outer_w)) {
    B_.CreateCall(runtime(RtFn::kiln_rt_conv2d_cached_f32),
                  {weight_cache_slot(), in[0], in[1], bias, residual, ptr[n.results[0].id], params, B_.getInt32(act)});
  } else if (!m->residual.valid() && act == KILN_ACT_RELU) {
    B_.CreateCall(runtime(f32 ? RtFn::kiln_rt_conv2d_act_f32 : RtFn::kiln_rt_conv2d_act_f64),
                  {in[0], in[1], bias, ptr[n.results[0].id], params, B_.getInt32(act)});
  } else {
    B_.CreateCall(runtime(f32 ? RtFn::kiln_rt_conv2d_epi_f32 : RtFn::kiln_rt_conv2d_epi_f64),
                  {in[0], in[1], bias, residual, ptr[n.results[0].id], params, B_.getInt32(act)});
  }
  return true;
}

void Lowerer::copy_strided(DType t, const Shape& shape, Value* dst, Stream ds, Value* src, Stream ss) {
  nest(shape, {ds, ss}, [&](const std::vector<Value*>& off) { store(t, load(t, src, off[1]), dst, off[0]); }, 1);
}

Value* Lowerer::conv_params(const Node& n, const Shape& x, const Shape& w, const Shape& y) {
  return params_array(conv_sizes(n, x, w, y));
}

Value* Lowerer::pool_params(const Node& n, const Shape& x, const Shape& y) {
  const auto& k = attr_ints(n.attrs, "kernel");
  const auto& s = attr_ints(n.attrs, "stride");
  const auto& p = attr_ints(n.attrs, "padding");
  return params_array(KilnPool2dParams{.n = x[0], .c = x[1], .h = x[2], .w = x[3], .oh = y[2], .ow = y[3],
                                       .kh = k[0], .kw = k[1], .stride_h = s[0], .stride_w = s[1], .pad_h = p[0],
                                       .pad_w = p[1]});
}

// The float sum of elem(0), ..., elem(n - 1) in Kiln's summation order (kSumBlock,
// ir/interp.h; the interpreter's blocked_sum): blocks added left to right from +0, their
// sums combined as a binary counter. slot[l] holds the sum of the last 2^l finished
// blocks while bit l of the finished-block count is set: finishing block b adds the
// ctz(b + 1) lowest slots into it, leftmost first, and stores it in slot ctz(b + 1).
// After the last block the slots of nb's set bits, combined from the smallest, give the
// pairwise tree that splits each run of blocks at the largest power of two below its length.
Value* Lowerer::blocked_sum(DType t, int64_t n, const std::function<Value*(Value*)>& elem) {
  llvm::Type* ft = ty(t);
  auto run = [&](Value* lo, Value* hi) {  // elem(lo) + ... + elem(hi - 1), left to right from +0
    Value* acc = alloca(ft);
    B_.CreateStore(scalar(t, 0), acc);
    for_range(lo, hi, [&](Value* k) { B_.CreateStore(B_.CreateFAdd(B_.CreateLoad(ft, acc), elem(k)), acc); });
    return B_.CreateLoad(ft, acc);
  };
  if (n <= kSumBlock) return run(c64(0), c64(n));
  int64_t nb = (n + kSumBlock - 1) / kSumBlock;
  auto levels = static_cast<uint64_t>(std::bit_width(static_cast<uint64_t>(nb)));
  llvm::Type* slots_t = llvm::ArrayType::get(ft, levels);
  Value* slots = alloca(slots_t);
  auto slot = [&](Value* l) { return B_.CreateInBoundsGEP(slots_t, slots, {c64(0), l}); };
  Value* cur = alloca(ft);
  // Finishes block b, whose sum is `block`: carries it up the counter.
  auto finish_block = [&](Value* b, Value* block) {
    B_.CreateStore(block, cur);
    Value* carries = B_.CreateBinaryIntrinsic(llvm::Intrinsic::cttz, B_.CreateAdd(b, c64(1)), B_.getFalse());
    for_range(c64(0), carries, [&](Value* l) {
      B_.CreateStore(B_.CreateFAdd(B_.CreateLoad(ft, slot(l)), B_.CreateLoad(ft, cur)), cur);
    });
    B_.CreateStore(B_.CreateLoad(ft, cur), slot(carries));
  };
  // Full blocks kInterleave at a time: their add chains advance together (independent
  // chains, so the adds' latency overlaps), each block still added left to right from +0
  // and finished in block order: the same sum, bit for bit, several times faster.
  constexpr int64_t kInterleave = 8;
  const int64_t groups = n / kSumBlock / kInterleave;
  if (groups > 0) {
    llvm::Type* accs_t = llvm::ArrayType::get(ft, kInterleave);
    Value* accs = alloca(accs_t);
    auto acc = [&](int64_t i) { return B_.CreateInBoundsGEP(accs_t, accs, {c64(0), c64(i)}); };
    for_loop(groups, [&](Value* grp) {
      Value* first = B_.CreateMul(grp, c64(kInterleave * kSumBlock), "", true, true);
      for (int64_t i = 0; i < kInterleave; ++i) B_.CreateStore(scalar(t, 0), acc(i));
      for_loop(kSumBlock, [&](Value* k) {
        for (int64_t i = 0; i < kInterleave; ++i) {
          Value* at = B_.CreateAdd(first, B_.CreateAdd(k, c64(i * kSumBlock), "", true, true), "", true, true);
          B_.CreateStore(B_.CreateFAdd(B_.CreateLoad(ft, acc(i)), elem(at)), acc(i));
        }
      });
      for (int64_t i = 0; i < kInterleave; ++i)
        finish_block(B_.CreateAdd(B_.CreateMul(grp, c64(kInterleave), "", true, true), c64(i), "", true, true),
                     B_.CreateLoad(ft, acc(i)));
    });
  }
  for_range(c64(groups * kInterleave), c64(nb), [&](Value* b) {
    Value* lo = B_.CreateMul(b, c64(kSumBlock), "", true, true);
    Value* hi = B_.CreateAdd(lo, c64(kSumBlock), "", true, true);
    finish_block(b, run(lo, B_.CreateSelect(B_.CreateICmpSLT(hi, c64(n)), hi, c64(n))));
  });
  Value* sum = nullptr;
  for (uint64_t l = 0; l < levels; ++l) {
    if (!((static_cast<uint64_t>(nb) >> l) & 1)) continue;
    Value* s = B_.CreateLoad(ft, slot(c64(static_cast<int64_t>(l))));
    sum = sum ? B_.CreateFAdd(s, sum) : s;
  }
  return sum;
}

// out[a, j] = the sum over k of x[a, k, j] for x: [k1, r, k2], r > kSumBlock, in the
// summation order: blocked_sum's binary counter, run for a chunk of columns j at once
// (each step a vector loop over j). The block partials accumulate in `out`, the slots in
// the scratch area. Iterations (a, chunk) touch only their own columns: parallel-safe,
// and the same whatever the thread count. Divides by r for a mean.
void Lowerer::column_sums(DType t, int64_t k1, int64_t r, int64_t k2, Value* x, Value* out, bool mean, int64_t& cursor) {
  llvm::Type* ft = ty(t);
  int64_t m = k1 * k2, nb = (r + kSumBlock - 1) / kSumBlock;
  auto levels = static_cast<int64_t>(std::bit_width(static_cast<uint64_t>(nb)));
  Value* slots = scratch(levels * m * static_cast<int64_t>(dtype_size(t)), cursor);
  constexpr int64_t kChunk = 4096;  // columns per parallel iteration (whole rows stream better)
  int64_t chunks = (k2 + kChunk - 1) / kChunk;
  par_for(k1 * chunks, r * std::min(k2, kChunk), [&](Value* f) {
    Value* a = B_.CreateUDiv(f, c64(chunks));
    Value* j0 = B_.CreateMul(B_.CreateURem(f, c64(chunks)), c64(kChunk));
    Value* j1 = B_.CreateAdd(j0, c64(kChunk));
    j1 = B_.CreateSelect(B_.CreateICmpSLT(j1, c64(k2)), j1, c64(k2));
    Value* row = B_.CreateMul(a, c64(k2));  // out[a, 0]
    auto columns = [&](const std::function<void(Value* j)>& body) {
      for_range(B_.CreateAdd(row, j0), B_.CreateAdd(row, j1), body);
    };
    auto slot = [&](Value* l, Value* j) { return B_.CreateInBoundsGEP(ft, slots, B_.CreateAdd(B_.CreateMul(l, c64(m)), j)); };
    for_loop(nb, [&](Value* b) {
      columns([&](Value* j) { store(t, scalar(t, 0), out, j); });
      Value* lo = B_.CreateMul(b, c64(kSumBlock));
      Value* hi = B_.CreateAdd(lo, c64(kSumBlock));
      for_range(lo, B_.CreateSelect(B_.CreateICmpSLT(hi, c64(r)), hi, c64(r)), [&](Value* k) {
        // x[a, k, j] for out[a, j]: offset (a * r + k) * k2 + j - a * k2.
        Value* shift = B_.CreateMul(B_.CreateAdd(B_.CreateMul(a, c64(r - 1)), k), c64(k2));
        columns([&](Value* j) {
          store(t, B_.CreateFAdd(load(t, out, j), load(t, x, B_.CreateAdd(shift, j))), out, j);
        });
      });
      Value* carries = B_.CreateBinaryIntrinsic(llvm::Intrinsic::cttz, B_.CreateAdd(b, c64(1)), B_.getFalse());
      for_range(c64(0), carries, [&](Value* l) {
        columns([&](Value* j) { store(t, B_.CreateFAdd(B_.CreateLoad(ft, slot(l, j)), load(t, out, j)), out, j); });
      });
      columns([&](Value* j) { B_.CreateStore(load(t, out, j), slot(carries, j)); });
    });
    columns([&](Value* j) {
      Value* sum = nullptr;
      for (int64_t l = 0; l < levels; ++l) {
        if (!((nb >> l) & 1)) continue;
        Value* s = B_.CreateLoad(ft, slot(c64(l), j));
        sum = sum ? B_.CreateFAdd(s, sum) : s;
      }
      store(t, mean ? B_.CreateFDiv(sum, scalar(t, static_cast<double>(r))) : sum, out, j);
    });
  });
}

// Rows a short reduction does at once (lower_reduce), and a blocked one read in place.
constexpr int64_t kReduceRows = 8;

// out[j0 + i] for i < rows: the float sum (a mean: divided by n) of row j0 + i's n
// elements in Kiln's summation order (blocked_sum's: blocks of kSumBlock added left to
// right from +0, combined by the binary counter), the rows advancing together: step k of
// a block adds element k of every row, so the rows' chains are independent (their adds'
// latency overlaps) and the element's offset, the same in every row, is computed once a
// step and incrementally (no division). Row j's element k is at x[j * row_stride +
// (k / inner) * outer_stride + (k % inner) * inner_stride]. The same operations per row as
// blocked_sum, so the same bits.
void Lowerer::blocked_row_sums(DType t, int64_t rows, Value* j0, int64_t n, const RowRuns& runs, Value* x, Value* out,
                               bool mean) {
  llvm::Type* ft = ty(t);
  const int64_t nb = (n + kSumBlock - 1) / kSumBlock, full = n / kSumBlock;
  const auto levels = static_cast<int64_t>(std::bit_width(static_cast<uint64_t>(nb)));
  llvm::Type* slots_t = llvm::ArrayType::get(ft, static_cast<uint64_t>(levels * rows));
  llvm::Type* row_t = llvm::ArrayType::get(ft, static_cast<uint64_t>(rows));
  Value* slots = alloca(slots_t);
  Value* cur = alloca(row_t);
  Value* seg = alloca(i64_);  // (k / inner) * outer_stride
  Value* off = alloca(i64_);  // k % inner
  auto slot = [&](Value* l, int64_t i) {
    return B_.CreateInBoundsGEP(slots_t, slots, {c64(0), B_.CreateAdd(B_.CreateMul(l, c64(rows)), c64(i))});
  };
  auto cur_at = [&](int64_t i) { return B_.CreateInBoundsGEP(row_t, cur, {c64(0), c64(i)}); };
  std::vector<Value*> base;
  for (int64_t i = 0; i < rows; ++i)
    base.push_back(B_.CreateMul(B_.CreateAdd(j0, c64(i), "", true, true), c64(runs.row_stride), "", true, true));
  B_.CreateStore(c64(0), seg);
  B_.CreateStore(c64(0), off);
  // One block of `len` elements per row into cur[i], then carried up its row's counter.
  auto block = [&](Value* b, int64_t len) {
    for (int64_t i = 0; i < rows; ++i) B_.CreateStore(scalar(t, 0), cur_at(i));
    for_loop(len, [&](Value*) {
      Value* o = B_.CreateLoad(i64_, off);
      Value* at = B_.CreateAdd(B_.CreateLoad(i64_, seg), B_.CreateMul(o, c64(runs.inner_stride), "", true, true), "", true, true);
      for (int64_t i = 0; i < rows; ++i)
        B_.CreateStore(B_.CreateFAdd(B_.CreateLoad(ft, cur_at(i)), load(t, x, B_.CreateAdd(base[static_cast<size_t>(i)], at, "", true, true))),
                       cur_at(i));
      Value* next = B_.CreateAdd(o, c64(1), "", true, true);
      Value* wrap = B_.CreateICmpEQ(next, c64(runs.inner));
      B_.CreateStore(B_.CreateSelect(wrap, c64(0), next), off);
      Value* s = B_.CreateLoad(i64_, seg);
      B_.CreateStore(B_.CreateSelect(wrap, B_.CreateAdd(s, c64(runs.outer_stride), "", true, true), s), seg);
    });
    Value* carries = B_.CreateBinaryIntrinsic(llvm::Intrinsic::cttz, B_.CreateAdd(b, c64(1)), B_.getFalse());
    for_range(c64(0), carries, [&](Value* l) {
      for (int64_t i = 0; i < rows; ++i)
        B_.CreateStore(B_.CreateFAdd(B_.CreateLoad(ft, slot(l, i)), B_.CreateLoad(ft, cur_at(i))), cur_at(i));
    });
    for (int64_t i = 0; i < rows; ++i) B_.CreateStore(B_.CreateLoad(ft, cur_at(i)), slot(carries, i));
  };
  for_loop(full, [&](Value* b) { block(b, kSumBlock); });
  if (n % kSumBlock) block(c64(full), n % kSumBlock);
  for (int64_t i = 0; i < rows; ++i) {
    Value* sum = nullptr;
    for (int64_t l = 0; l < levels; ++l) {
      if (!((nb >> l) & 1)) continue;
      Value* s = B_.CreateLoad(ft, slot(c64(l), i));
      sum = sum ? B_.CreateFAdd(s, sum) : s;
    }
    store(t, mean ? B_.CreateFDiv(sum, scalar(t, static_cast<double>(n))) : sum, out, B_.CreateAdd(j0, c64(i), "", true, true));
  }
}

// lower_reduce's view of a reduction of x over `axes`: x's dims of size > 1 as [K1, R, K2]
// (the kept dims outside the innermost kept run, the reduced dims, that run), each part's
// sizes and x's strides in x's order; and, when no kept dim is innermost, the kept dims merge
// into one run and the reduced ones into two (a batch norm's statistics: [N, C, H, W] over
// N, H, W), where each output's row lies in x.
Lowerer::ReduceView Lowerer::reduce_view(const Shape& shape, const std::set<int64_t>& axes) {
  ReduceView v;
  const std::vector<int64_t> xs = strides_of(shape);
  for (auto d = static_cast<int64_t>(shape.size()); d-- > 0;) {
    int64_t size = shape[static_cast<size_t>(d)];
    if (size == 1) continue;
    int part = axes.count(d) ? 1 : v.order[1].empty() && v.order[0].empty() ? 2 : 0;
    v.in_order = v.in_order && !(part == 1 && !v.order[0].empty());
    v.order[part].insert(v.order[part].begin(), size);
    v.src[part].insert(v.src[part].begin(), xs[static_cast<size_t>(d)]);
  }
  // Runs of dims (size, stride), merged where one dim steps over the whole next one.
  auto runs = [](const Shape& sizes, const std::vector<int64_t>& strides) {
    std::vector<std::pair<int64_t, int64_t>> r;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!r.empty() && strides[i - 1] == sizes[i] * strides[i]) r.back() = {r.back().first * sizes[i], strides[i]};
      else r.emplace_back(sizes[i], strides[i]);
    }
    return r;
  };
  const auto kept_runs = runs(v.order[0], v.src[0]), reduced_runs = runs(v.order[1], v.src[1]);
  if (!v.in_order && v.order[2].empty() && kept_runs.size() == 1 && reduced_runs.size() == 2)
    v.rows = RowRuns{.row_stride = kept_runs[0].second, .inner = reduced_runs[1].first,
                     .inner_stride = reduced_runs[1].second, .outer_stride = reduced_runs[0].second};
  return v;
}

// The transpose of a 16x16 matrix of floats held as sixteen <16 x float> rows: off-diagonal
// blocks of 8, then 4, 2 and 1 swapped, each swap two two-source shuffles a pair of rows.
void Lowerer::transpose16(std::array<Value*, 16>& r) {
  for (int s = 8; s >= 1; s /= 2)
    for (int i = 0; i < 16; ++i) {
      if (i & s) continue;
      std::array<int, 16> lo{}, hi{};
      for (int j = 0; j < 16; ++j) {
        lo[static_cast<size_t>(j)] = (j & s) ? 16 + j - s : j;
        hi[static_cast<size_t>(j)] = (j & s) ? 16 + j : j + s;
      }
      Value* a = B_.CreateShuffleVector(r[static_cast<size_t>(i)], r[static_cast<size_t>(i + s)], lo);
      Value* b = B_.CreateShuffleVector(r[static_cast<size_t>(i)], r[static_cast<size_t>(i + s)], hi);
      r[static_cast<size_t>(i)] = a;
      r[static_cast<size_t>(i + s)] = b;
    }
}

// blocked_row_sums for sixteen f32 rows j0..j0+15 whose elements come sixteen at a time:
// runs.inner_stride is 1 and runs.inner a multiple of 16 (sixteen_rows), so the 16 elements
// of a row from any multiple of 16 lie together, at `at` from the row's start, the same for
// every row; `chunk(at, r)` gives them, row j0 + i's as r[i], a <16 x float>.
// Each step loads the same 16 elements of the sixteen rows, transposes them in registers,
// and adds vector k (element k of every row) into the rows' block sums, lane i row i: each
// lane does the scalar chain's adds in its order, and the blocks are carried up the same
// binary counter, so the sums are blocked_row_sums' bits. A batch norm's mean over
// [16, 64, 112, 112]: 0.26x the time of blocked_row_sums' eight scalar chains (two threads,
// alternated runs, median of 5).
void Lowerer::sixteen_row_sums(Value* j0, int64_t n, const RowRuns& runs,
                               const std::function<void(Value*, std::array<Value*, 16>&)>& chunk, Value* out, bool mean) {
  llvm::Type* ft = B_.getFloatTy();
  auto* vt = llvm::FixedVectorType::get(ft, 16);
  const int64_t nb = (n + kSumBlock - 1) / kSumBlock, full = n / kSumBlock;
  const auto levels = static_cast<int64_t>(std::bit_width(static_cast<uint64_t>(nb)));
  llvm::Type* slots_t = llvm::ArrayType::get(vt, static_cast<uint64_t>(levels));
  Value* slots = alloca(slots_t);
  auto slot = [&](Value* l) { return B_.CreateInBoundsGEP(slots_t, slots, {c64(0), l}); };
  Value* acc = alloca(vt);
  // Each block's chunks of 16 elements (4, or fewer in a partial last block), one copy of
  // the code for every block: one loop over the blocks, one over a block's chunks.
  for_loop(nb, [&](Value* b) {
    B_.CreateStore(llvm::ConstantAggregateZero::get(vt), acc);
    Value* chunks = B_.CreateSelect(B_.CreateICmpSLT(b, c64(full)), c64(kSumBlock / 16), c64(n % kSumBlock / 16));
    for_range(c64(0), chunks, [&](Value* c) {
      Value* e0 = B_.CreateAdd(B_.CreateMul(b, c64(kSumBlock), "", true, true), B_.CreateMul(c, c64(16), "", true, true), "", true, true);
      Value* at = B_.CreateAdd(B_.CreateMul(B_.CreateUDiv(e0, c64(runs.inner)), c64(runs.outer_stride), "", true, true),
                               B_.CreateURem(e0, c64(runs.inner)), "", true, true);
      std::array<Value*, 16> r{};
      chunk(at, r);
      transpose16(r);
      Value* cur = B_.CreateLoad(vt, acc);
      for (Value* v : r) cur = B_.CreateFAdd(cur, v);
      B_.CreateStore(cur, acc);
    });
    Value* carries = B_.CreateBinaryIntrinsic(llvm::Intrinsic::cttz, B_.CreateAdd(b, c64(1)), B_.getFalse());
    for_range(c64(0), carries, [&](Value* l) {
      B_.CreateStore(B_.CreateFAdd(B_.CreateLoad(vt, slot(l)), B_.CreateLoad(vt, acc)), acc);
    });
    B_.CreateStore(B_.CreateLoad(vt, acc), slot(carries));
  });
  Value* sum = nullptr;
  for (int64_t l = 0; l < levels; ++l) {
    if (!((nb >> l) & 1)) continue;
    Value* s = B_.CreateLoad(vt, slot(c64(l)));
    sum = sum ? B_.CreateFAdd(s, sum) : s;
  }
  if (mean) sum = B_.CreateFDiv(sum, llvm::ConstantFP::get(vt, static_cast<double>(n)));
  B_.CreateAlignedStore(sum, B_.CreateInBoundsGEP(ft, out, j0), llvm::Align(4));
}

// A reduction's axes, non-negative (none given: every axis).
std::set<int64_t> Lowerer::reduce_axes(const Node& n, int64_t rank) {
  std::set<int64_t> axes;
  for (int64_t a : attr_ints(n.attrs, "axes")) axes.insert(a < 0 ? a + rank : a);
  if (attr_ints(n.attrs, "axes").empty())
    for (int64_t d = 0; d < rank; ++d) axes.insert(d);
  return axes;
}

void Lowerer::lower_reduce(const Node& n, const TensorType& xt, const TensorType& rt, Value* x, Value* out, int64_t& cursor) {
  const std::set<int64_t> axes = reduce_axes(n, xt.rank());
  Shape kept = xt.shape;
  int64_t count = 1;
  for (int64_t d : axes) {
    count *= xt.shape[static_cast<size_t>(d)];
    kept[static_cast<size_t>(d)] = 1;
  }
  DType t = rt.dtype;
  bool fl = is_float(t);
  // Float sums of more than one block follow the summation order, which needs each
  // output's elements in one row (a float sum of at most one block adds left to right
  // like any other reduction).
  bool blocked = fl && (n.op == Op::Sum || n.op == Op::Mean) && count > kSumBlock;
  // Only sum, mean, max and min get here (lower_node): max and min pick, the others add.
  bool extremum = n.op == Op::Max || n.op == Op::Min;
  double inf = std::numeric_limits<double>::infinity();
  unsigned bits = fl ? 0 : ty(t)->getIntegerBitWidth();
  Value* init = scalar(t, 0);
  if (n.op == Op::Max) init = fl ? scalar(t, -inf) : llvm::ConstantInt::get(ty(t), llvm::APInt::getSignedMinValue(bits));
  if (n.op == Op::Min) init = fl ? scalar(t, inf) : llvm::ConstantInt::get(ty(t), llvm::APInt::getSignedMaxValue(bits));
  int64_t m = rt.numel();
  // Reductions over trailing axes (the common case) accumulate in a register.
  bool trailing = true;
  for (int64_t d = 0; d < xt.rank(); ++d)
    if (axes.count(d) && xt.shape[static_cast<size_t>(d)] != 1)
      for (int64_t e = d + 1; e < xt.rank(); ++e)
        if (!axes.count(e) && xt.shape[static_cast<size_t>(e)] != 1) trailing = false;
  // The trailing path's row j, element k: x[row_base(j) + row_offset(k)], by default the
  // rows of a contiguous [m, count].
  std::function<Value*(Value*)> row_base = [&](Value* j) { return B_.CreateMul(j, c64(count)); };
  std::function<Value*(Value*)> row_offset = [](Value* k) { return k; };
  bool contiguous_rows = true;  // row_base and row_offset as above
  if (blocked && !trailing) {
    // Each output's elements must be added in blocks of its own reduced index. Viewed as
    // [K1, R, K2] (the kept dims outside the innermost kept run, the reduced dims, that
    // run), that is a loop over R with vector work over K2: column_sums. Other layouts are
    // copied into that one first (in the scratch area; the copy's innermost loop is the
    // innermost run of x either way, so it streams), except when no kept dim is innermost
    // and the kept dims merge into one run and the reduced ones into two (a batch norm's
    // statistics: [N, C, H, W] over N, H, W): then each output's row is read in place, in
    // the same order.
    const ReduceView view = reduce_view(xt.shape, axes);
    const Shape* order = view.order;
    const std::vector<int64_t>* src = view.src;
    const bool in_order = view.in_order;
    if (view.rows) {
      const RowRuns& runs = *view.rows;
      const int64_t kept_stride = runs.row_stride, inner = runs.inner;
      const int64_t outer_stride = runs.outer_stride, inner_stride = runs.inner_stride;
      if (m >= kReduceRows) {
        // kReduceRows rows at a time, their block sums advancing together (blocked_row_sums):
        // one row at a time was a single chain per block whose every element's offset took a
        // division, about 11 cycles an element on batch norm's statistics. Sixteen at a time
        // in vector lanes where the rows' elements come sixteen together (sixteen_row_sums).
        const bool mean = n.op == Op::Mean;
        int64_t done = 0;  // rows summed sixteen at a time
        if (t == DType::f32 && sixteen_rows(runs, m)) {
          done = m / 16 * 16;
          auto* vt = llvm::FixedVectorType::get(B_.getFloatTy(), 16);
          par_for(m / 16, count * 16, [&](Value* grp) {
            Value* j0 = B_.CreateMul(grp, c64(16), "", true, true);
            sixteen_row_sums(j0, count, runs, [&](Value* at, std::array<Value*, 16>& r) {
              for (int64_t i = 0; i < 16; ++i) {
                Value* row = B_.CreateMul(B_.CreateAdd(j0, c64(i), "", true, true), c64(kept_stride), "", true, true);
                r[static_cast<size_t>(i)] = B_.CreateAlignedLoad(
                    vt, B_.CreateInBoundsGEP(B_.getFloatTy(), x, B_.CreateAdd(row, at, "", true, true)), llvm::Align(4));
              }
            }, out, mean);
          });
        }
        const int64_t groups = (m - done) / kReduceRows;
        par_for(groups, count * kReduceRows, [&](Value* grp) {
          blocked_row_sums(t, kReduceRows, B_.CreateAdd(c64(done), B_.CreateMul(grp, c64(kReduceRows), "", true, true)), count,
                           runs, x, out, mean);
        });
        for_range(c64(done + groups * kReduceRows), c64(m), [&](Value* j) { blocked_row_sums(t, 1, j, count, runs, x, out, mean); });
        return;
      }
      contiguous_rows = false;
      row_base = [&, kept_stride](Value* j) { return B_.CreateMul(j, c64(kept_stride)); };
      row_offset = [&, inner, outer_stride, inner_stride](Value* k) {
        Value* hi = B_.CreateMul(B_.CreateUDiv(k, c64(inner)), c64(outer_stride));
        return B_.CreateAdd(hi, B_.CreateMul(B_.CreateURem(k, c64(inner)), c64(inner_stride)));
      };
    } else if (!in_order) {
      Shape shape;
      std::vector<int64_t> strides;
      for (int part = 0; part < 3; ++part) {
        shape.insert(shape.end(), order[part].begin(), order[part].end());
        strides.insert(strides.end(), src[part].begin(), src[part].end());
      }
      Value* copy = scratch(xt.numel() * static_cast<int64_t>(dtype_size(t)), cursor);
      copy_strided(t, shape, copy, {strides_of(shape), 0}, x, {strides, 0});
      x = copy;
    }
    int64_t k2 = num_elements(order[2]);
    if (k2 > 1) return column_sums(t, m / k2, count, k2, x, out, n.op == Op::Mean, cursor);
    trailing = true;  // rows of `count` elements
  }
  auto combine = [&](Value* acc, Value* v) -> Value* {
    if (!extremum) return fl ? B_.CreateFAdd(acc, v) : B_.CreateAdd(acc, v);
    Value* better = n.op == Op::Max ? (fl ? B_.CreateFCmpOGT(v, acc) : B_.CreateICmpSGT(v, acc))
                                    : (fl ? B_.CreateFCmpOLT(v, acc) : B_.CreateICmpSLT(v, acc));
    if (!fl) return B_.CreateSelect(better, v, acc);
    Value* take = B_.CreateOr(is_nan(v), better);
    return B_.CreateSelect(is_nan(acc), acc, B_.CreateSelect(take, v, acc));
  };
  auto finish = [&](Value* acc) -> Value* {
    if (n.op == Op::Mean) return B_.CreateFDiv(acc, scalar(t, static_cast<double>(count)));
    return acc;
  };
  // Row j of a trailing reduction, reduced in order by one thread.
  auto reduce_row = [&](Value* j) {
    Value* base = row_base(j);
    auto elem = [&](Value* k) { return load(t, x, B_.CreateAdd(base, row_offset(k))); };
    if (blocked) return store(t, finish(blocked_sum(t, count, elem)), out, j);
    Value* slot = alloca(ty(t));
    B_.CreateStore(init, slot);
    for_loop(count, [&](Value* k) { B_.CreateStore(combine(B_.CreateLoad(ty(t), slot), elem(k)), slot); });
    store(t, finish(B_.CreateLoad(ty(t), slot)), out, j);
  };
  if (trailing && !blocked && contiguous_rows && t == DType::f32 && (n.op == Op::Sum || n.op == Op::Mean) &&
      m >= 16 && count > 1) {
    // Contiguous f32 rows of one block (a global average pool's 7x7 planes: 49 elements
    // each): the runtime's row sums, sixteen rows a step in vector lanes, each still added
    // left to right from +0 (2-3x faster than the rows' scalar chains below).
    B_.CreateCall(runtime(RtFn::kiln_rt_row_sums_f32),
                  {x, out, c64(m), c64(count), B_.getInt32(n.op == Op::Mean ? 1 : 0)});
    return;
  }
  if (trailing && !blocked && m >= 2 * kReduceRows && count > 1) {
    // Short rows (a global max pool over 7x7 planes, an integer or f64 sum; f32 sums of
    // contiguous rows went to the runtime above), kReduceRows at a time: each row still
    // reduced in order by one chain, but the rows' chains advance together, so the adds'
    // latency overlaps (one row at a time took 17x ONNX Runtime's time on MobileNetV2's pool
    // at batch 16). The same operations per row, so the same bits.
    const int64_t groups = m / kReduceRows;
    par_for(groups, count * kReduceRows, [&](Value* grp) {
      Value* first = B_.CreateMul(grp, c64(kReduceRows), "", true, true);
      std::vector<Value*> slots, bases;
      for (int64_t i = 0; i < kReduceRows; ++i) {
        slots.push_back(alloca(ty(t)));
        B_.CreateStore(init, slots.back());
        bases.push_back(row_base(B_.CreateAdd(first, c64(i), "", true, true)));
      }
      for_loop(count, [&](Value* k) {
        Value* off = row_offset(k);
        for (int64_t i = 0; i < kReduceRows; ++i)
          B_.CreateStore(combine(B_.CreateLoad(ty(t), slots[static_cast<size_t>(i)]),
                                 load(t, x, B_.CreateAdd(bases[static_cast<size_t>(i)], off))),
                         slots[static_cast<size_t>(i)]);
      });
      for (int64_t i = 0; i < kReduceRows; ++i)
        store(t, finish(B_.CreateLoad(ty(t), slots[static_cast<size_t>(i)])), out,
              B_.CreateAdd(first, c64(i), "", true, true));
    });
    // The last m % kReduceRows rows one at a time.
    for_range(c64(groups * kReduceRows), c64(m), reduce_row);
    return;
  }
  if (trailing && blocked && contiguous_rows && t == DType::f32) {
    // Contiguous f32 rows of several blocks (a global average pool's planes): the runtime's
    // row sums (runtime/row_sums.cpp), which add sixteen blocks at once in vector lanes.
    B_.CreateCall(runtime(RtFn::kiln_rt_row_sums_f32),
                  {x, out, c64(m), c64(count), B_.getInt32(n.op == Op::Mean ? 1 : 0)});
    return;
  }
  if (trailing) {
    // One output element per iteration: parallel-safe, and the same whatever the thread count.
    par_for(m, count, reduce_row);
    return;
  }
  // Each output adds its elements in row-major order: for a float sum (at most one block
  // here) that is the summation order.
  for_loop(m, [&](Value* j) { store(t, init, out, j); });
  nest(xt.shape, {{strides_of(xt.shape), 0}, {broadcast_strides(kept, xt.shape), 0}}, [&](const std::vector<Value*>& off) {
    store(t, combine(load(t, out, off[1]), load(t, x, off[0])), out, off[1]);
  });
  if (n.op == Op::Mean) for_loop(m, [&](Value* j) { store(t, finish(load(t, out, j)), out, j); });
}

// outer x len x inner view of `xt` around node n's "axis" attribute (negative: from the end).
void Lowerer::split_axis(const Node& n, const TensorType& xt, int64_t& outer, int64_t& len, int64_t& inner) {
  int64_t axis = attr_int(n.attrs, "axis");
  auto a = static_cast<size_t>(axis < 0 ? axis + xt.rank() : axis);
  const Shape& s = xt.shape;
  outer = 1;
  inner = 1;
  len = s[a];
  for (size_t d = 0; d < a; ++d) outer *= s[d];
  for (size_t d = a + 1; d < s.size(); ++d) inner *= s[d];
}

void Lowerer::lower_argmax(const Node& n, const TensorType& xt, Value* x, Value* out) {
  int64_t outer, len, inner;
  split_axis(n, xt, outer, len, inner);
  DType t = xt.dtype;
  bool fl = is_float(t);
  outer_inner(outer, inner, len, [&](Value* a, Value* b) {
      Value* best = alloca(ty(t));
      Value* idx = alloca(i32_);
      Value* base = B_.CreateAdd(B_.CreateMul(a, c64(len * inner)), b);
      B_.CreateStore(load(t, x, base), best);
      B_.CreateStore(B_.getInt32(0), idx);
      for_loop(len - 1, [&](Value* k0) {
        Value* k = B_.CreateAdd(k0, c64(1));
        Value* v = load(t, x, B_.CreateAdd(base, B_.CreateMul(k, c64(inner))));
        Value* cur = B_.CreateLoad(ty(t), best);
        Value* take = fl ? B_.CreateAnd(B_.CreateNot(is_nan(cur)), B_.CreateOr(is_nan(v), B_.CreateFCmpOGT(v, cur)))
                         : B_.CreateICmpSGT(v, cur);
        B_.CreateStore(B_.CreateSelect(take, v, cur), best);
        B_.CreateStore(B_.CreateSelect(take, B_.CreateTrunc(k, i32_), B_.CreateLoad(i32_, idx)), idx);
      });
      store(DType::i32, B_.CreateLoad(i32_, idx), out, B_.CreateAdd(B_.CreateMul(a, c64(inner)), b));
  });
}

// for a in [0, outer), b in [0, inner): body(a, b), as one (possibly parallel) loop over
// outer * inner rows of `len` elements each.
void Lowerer::outer_inner(int64_t outer, int64_t inner, int64_t len, const std::function<void(Value*, Value*)>& body) {
  par_for(outer * inner, len * 4, [&](Value* f) {
    if (inner == 1) return body(f, c64(0));
    if (outer == 1) return body(c64(0), f);
    body(B_.CreateUDiv(f, c64(inner)), B_.CreateURem(f, c64(inner)));
  });
}

void Lowerer::lower_softmax(const Node& n, const TensorType& xt, Value* x, Value* out) {
  int64_t outer, len, inner;
  split_axis(n, xt, outer, len, inner);
  DType t = xt.dtype;
  bool log = n.op == Op::LogSoftmax;
  if (!log && t == DType::f32 && inner == 1 && len > 1) {
    // Rows along the last axis: the runtime's softmax (runtime/attention.cpp), the same
    // bits with the row's maximum and exponentials vectorized and the denominators summed
    // sixteen rows at a time in vector lanes; the loop below adds each denominator in one
    // scalar chain (BERT's attention probabilities in training took ~4 ns an element).
    B_.CreateCall(runtime(RtFn::kiln_rt_softmax_f32), {x, out, c64(outer), c64(len)});
    return;
  }
  outer_inner(outer, inner, len, [&](Value* a, Value* b) {
      Value* mx = alloca(ty(t));
      Value* base = B_.CreateAdd(B_.CreateMul(a, c64(len * inner)), b);
      auto at = [&](Value* k) { return B_.CreateAdd(base, B_.CreateMul(k, c64(inner))); };
      B_.CreateStore(scalar(t, -std::numeric_limits<double>::infinity()), mx);
      for_loop(len, [&](Value* k) {
        Value* v = load(t, x, at(k));
        Value* cur = B_.CreateLoad(ty(t), mx);
        B_.CreateStore(B_.CreateSelect(B_.CreateFCmpOGT(v, cur), v, cur), mx);
      });
      Value* m = B_.CreateLoad(ty(t), mx);
      // softmax keeps each exponential in its output element (x[k] is read just before
      // out[k] is written, so out may be x's own buffer) and divides in place: one exp per
      // element, not two.
      Value* s = blocked_sum(t, len, [&](Value* k) {
        Value* e = exp(B_.CreateFSub(load(t, x, at(k)), m));
        if (!log) store(t, e, out, at(k));
        return e;
      });
      Value* ls = log ? intrinsic(llvm::Intrinsic::log, s) : nullptr;
      for_loop(len, [&](Value* k) {
        Value* r = log ? B_.CreateFSub(B_.CreateFSub(load(t, x, at(k)), m), ls) : B_.CreateFDiv(load(t, out, at(k)), s);
        store(t, r, out, at(k));
      });
  });
}

bool Lowerer::cacheable_weight(ValueId v) const { return gemm_cache_ && !outlining_ && weight_.at(v.id); }

Value* Lowerer::weight_cache_slot() {
  // Made where the kernel function is called (as a constant's address is, lower.cpp), so
  // that the kernel gets its slot in its ctx and layers that differ only in their slots
  // stay one shared function.
  auto* slot = llvm::GetElementPtrInst::CreateInBounds(ptr_, gemm_cache_, {c64(gemm_cache_slots_++)}, "gemm.slot");
  if (kernel_caller_) slot->insertInto(kernel_caller_, kernel_caller_->end());
  else B_.Insert(slot);
  return slot;
}

// The GEMM kernel `k` of node `n`: reads k.a / k.b with its transpose flags.
void Lowerer::lower_matmul(const Graph& g, const Node& n, const Kernel& k, std::vector<Value*>& ptr) {
  const TensorType& rt = g.type(n.result());
  bool ta = k.trans_a, tb = k.trans_b;
  const Shape& as = g.type(n.operands[0]).shape;  // logical (untransposed) shapes
  const Shape& bs = g.type(n.operands[1]).shape;
  int64_t m = as[as.size() - 2], kk = as[as.size() - 1], nn = bs[bs.size() - 1];
  Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2), ob(rt.shape.begin(), rt.shape.end() - 2);
  bool f32 = rt.dtype == DType::f32;
  llvm::Type* ft = ty(rt.dtype);
  llvm::FunctionCallee gemm = runtime(f32 ? RtFn::kiln_rt_sgemm : RtFn::kiln_rt_dgemm);
  std::vector<int64_t> sa = broadcast_strides(ab, ob), sb = broadcast_strides(bb, ob);
  for (auto& s : sa) s *= m * kk;
  for (auto& s : sb) s *= kk * nn;
  Value* a = ptr[k.a.id];
  Value* b = ptr[k.b.id];
  Value* c = ptr[n.result().id];
  auto call = [&](Value* pa, Value* pb, Value* pc, int64_t rows) {
    B_.CreateCall(gemm, {B_.getInt32(ta ? 1 : 0), B_.getInt32(tb ? 1 : 0), c64(rows), c64(nn), c64(kk),
                         llvm::ConstantFP::get(ft, 1.0), pa, c64(ta ? m : kk), pb, c64(tb ? kk : nn),
                         llvm::ConstantFP::get(ft, 0.0), pc, c64(nn)});
  };
  // A weight shared by every batch index ([B, S, K] x [K, N], a linear layer over a batch
  // of sequences) with A's batch not broadcast: the batch's rows are one matrix of B * M
  // rows, so one GEMM (one packing of the weight, pieces cut over all the rows) instead of
  // one per batch index.
  const int64_t batch = num_elements(ob);
  const bool b_shared = std::all_of(sb.begin(), sb.end(), [](int64_t s) { return s == 0; });
  // A weight (LowerOptions::gemm_cache) in one call: B packed once, in the instance's slot.
  const bool one_call = batch == 1 || (b_shared && !ta && ab == ob);
  if (f32 && one_call && cacheable_weight(k.b) && m * batch >= 2 && nn >= 2) {
    B_.CreateCall(runtime(RtFn::kiln_rt_sgemm_cached_b),
                  {weight_cache_slot(), B_.getInt32(ta ? 1 : 0), B_.getInt32(tb ? 1 : 0), c64(batch * m), c64(nn), c64(kk),
                   llvm::ConstantFP::get(ft, 1.0), a, c64(ta ? m : kk), b, c64(tb ? kk : nn),
                   llvm::ConstantFP::get(ft, 0.0), c, c64(nn)});
    return;
  }
  if (batch > 1 && b_shared && !ta && ab == ob) return call(a, b, c, batch * m);
  // Otherwise one GEMM per batch index; small ones (below what kiln_rt_sgemm would cut
  // into pieces) run in parallel over the batch, each call then inline on its thread:
  // the same calls as one after another, so the same bits at any thread count.
  const int64_t macs = m * nn * kk;
  const int64_t ops = macs < (int64_t{1} << 22) ? std::max<int64_t>(macs, 1) : 0;
  nest(ob, {{sa, 0}, {sb, 0}, {strides_of(ob), 0}}, [&](const std::vector<Value*>& off) {
    Value* pa = B_.CreateInBoundsGEP(ft, a, off[0]);
    Value* pb = B_.CreateInBoundsGEP(ft, b, off[1]);
    Value* pc = B_.CreateInBoundsGEP(ft, c, B_.CreateMul(off[2], c64(m * nn)));
    call(pa, pb, pc, m);
  }, ops);
}

}  // namespace kiln::cpu::detail
