// Elementwise ops on scalars (codegen/cpu/lowerer.h): the body of every loop kernel.
#include "codegen/cpu/lowerer.h"

#include <bit>
#include <iterator>
#include <limits>

#include <llvm/IR/Constants.h>

#include "ir/error.h"
#include "ir/ops.h"
#include "numerics/math.h"

namespace kiln::cpu::detail {

Value* Lowerer::libm(const char* f32_name, const char* f64_name, Value* x) {
  bool f = x->getType()->isFloatTy();
  llvm::FunctionCallee fn = external(f ? f32_name : f64_name, llvm::FunctionType::get(x->getType(), {x->getType()}, false));
  llvm::CallInst* call = B_.CreateCall(fn, {x});
  call->setDoesNotThrow();
  call->setOnlyAccessesInaccessibleMemory();
  return call;
}

// numerics/math.h's odd_rational, operation for operation: Kiln's f32 erf and tanh, bitwise the
// interpreter's, and vectorizable (no call in the loop).
Value* Lowerer::odd_rational(Value* a, float clamp, std::span<const float> p, std::span<const float> q) {
  llvm::Type* t = a->getType();
  Value* c = llvm::ConstantFP::get(t, clamp);
  Value* x = B_.CreateSelect(B_.CreateFCmpOGT(a, c), c,
                             B_.CreateSelect(B_.CreateFCmpOLT(a, llvm::ConstantFP::get(t, -clamp)),
                                             llvm::ConstantFP::get(t, -clamp), a));
  Value* x2 = B_.CreateFMul(x, x);
  auto horner = [&](std::span<const float> k) {
    Value* acc = llvm::ConstantFP::get(t, k.back());
    for (size_t i = k.size() - 1; i-- > 0;)
      acc = B_.CreateIntrinsic(llvm::Intrinsic::fma, {t}, {x2, acc, llvm::ConstantFP::get(t, k[i])});
    return acc;
  };
  Value* num = horner(p);
  Value* den = horner(q);
  Value* r = B_.CreateFDiv(B_.CreateFMul(x, num), den);
  Value* one = llvm::ConstantFP::get(t, 1.0), *minus_one = llvm::ConstantFP::get(t, -1.0);
  return B_.CreateSelect(B_.CreateFCmpOGT(r, one), one, B_.CreateSelect(B_.CreateFCmpOLT(r, minus_one), minus_one, r));
}

// numerics/math.h's exp_f32, operation for operation.
Value* Lowerer::exp(Value* a) {
  llvm::Type* t = a->getType();
  if (!t->isFloatTy()) return intrinsic(llvm::Intrinsic::exp, a);
  auto f = [&](float v) { return llvm::ConstantFP::get(t, v); };
  llvm::Type* i32 = B_.getInt32Ty();
  Value* x = B_.CreateSelect(B_.CreateFCmpOGT(a, f(math::kExpHi)), f(math::kExpHi),
                             B_.CreateSelect(B_.CreateFCmpOLT(a, f(math::kExpLo)), f(math::kExpLo), a));
  Value* shifted = B_.CreateFAdd(B_.CreateFMul(x, f(math::kExpLog2e)), f(math::kExpRound));
  Value* n = B_.CreateFSub(shifted, f(math::kExpRound));
  auto fma = [&](Value* p, Value* q, Value* r) { return B_.CreateIntrinsic(llvm::Intrinsic::fma, {t}, {p, q, r}); };
  Value* r = fma(n, f(-math::kExpLn2Hi), x);
  r = fma(n, f(-math::kExpLn2Lo), r);
  constexpr size_t np = std::size(math::kExpP);
  Value* p = f(math::kExpP[np - 1]);
  for (size_t i = np - 1; i-- > 0;) p = fma(p, r, f(math::kExpP[i]));
  Value* e = B_.CreateFAdd(fma(p, B_.CreateFMul(r, r), r), f(1.0f));
  Value* ni = B_.CreateSub(B_.CreateBitCast(shifted, i32), llvm::ConstantInt::get(i32, std::bit_cast<uint32_t>(math::kExpRound)));
  Value* n1 = B_.CreateAShr(ni, 1);
  Value* n2 = B_.CreateSub(ni, n1);
  auto pow2 = [&](Value* k) { return B_.CreateBitCast(B_.CreateShl(B_.CreateAdd(k, B_.getInt32(127)), 23), t); };
  return B_.CreateFMul(B_.CreateFMul(e, pow2(n1)), pow2(n2));
}

// numerics/math.h's sigmoid: one exp, of -|x|, one division; NaN gives x.
Value* Lowerer::sigmoid(Value* a) {
  llvm::Type* t = a->getType();
  Value* one = llvm::ConstantFP::get(t, 1.0);
  Value* e = exp(B_.CreateFNeg(intrinsic(llvm::Intrinsic::fabs, a)));
  Value* d = B_.CreateFAdd(one, e);
  Value* zero = llvm::ConstantFP::get(t, 0.0);
  Value* q = B_.CreateFDiv(B_.CreateSelect(B_.CreateFCmpOGE(a, zero), one, e), d);
  return B_.CreateSelect(B_.CreateFCmpUNO(a, a), a, q);
}

Value* Lowerer::cast_scalar(Value* x, DType from, DType to) {
  if (from == to) return x;
  llvm::Type* t = ty(to);
  if (to == DType::boolean) {
    Value* nz = is_float(from) ? B_.CreateFCmpUNE(x, llvm::ConstantFP::get(x->getType(), 0.0))
                               : B_.CreateICmpNE(x, llvm::ConstantInt::get(x->getType(), 0));
    return B_.CreateZExt(nz, i8_);
  }
  if (is_float(from) && is_float(to)) return B_.CreateFPCast(x, t);
  if (is_float(to)) return from == DType::boolean ? B_.CreateUIToFP(x, t) : B_.CreateSIToFP(x, t);
  if (is_float(from)) {  // saturating truncation, NaN -> 0 (the interpreter's convert)
    Value* d = from == DType::f64 ? x : B_.CreateFPExt(x, B_.getDoubleTy());
    Value* tr = intrinsic(llvm::Intrinsic::trunc, d);
    bool wide = to == DType::i64;
    double lo = wide ? -9223372036854775808.0 : -2147483648.0;
    llvm::Constant* cmin = llvm::ConstantInt::get(t, wide ? static_cast<uint64_t>(std::numeric_limits<int64_t>::min())
                                                          : static_cast<uint64_t>(std::numeric_limits<int32_t>::min()), true);
    llvm::Constant* cmax = llvm::ConstantInt::get(t, wide ? static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                                                          : static_cast<uint64_t>(std::numeric_limits<int32_t>::max()), true);
    Value* dlo = llvm::ConstantFP::get(B_.getDoubleTy(), lo);
    Value* dhi = llvm::ConstantFP::get(B_.getDoubleTy(), -lo);
    Value* nan = is_nan(d);
    Value* below = B_.CreateFCmpOLT(tr, dlo);
    Value* above = B_.CreateFCmpOGE(tr, dhi);
    Value* safe = B_.CreateSelect(B_.CreateOr(B_.CreateOr(nan, below), above), llvm::ConstantFP::get(B_.getDoubleTy(), 0.0), tr);
    Value* r = B_.CreateFPToSI(safe, t);
    r = B_.CreateSelect(below, cmin, r);
    r = B_.CreateSelect(above, cmax, r);
    return B_.CreateSelect(nan, llvm::ConstantInt::get(t, 0), r);
  }
  // integer/bool -> integer
  return from == DType::boolean ? B_.CreateZExt(x, t) : B_.CreateSExtOrTrunc(x, t);
}

// One elementwise op on scalars; `in` is the operands' dtype (the second operand's for
// select), `out` the result's.
Value* Lowerer::ew(const Node& n, DType in, DType out, const std::vector<Value*>& a) {
  using P = llvm::CmpInst::Predicate;
  bool fl = is_float(in);
  auto zero = [&] { return scalar(in, 0); };
  switch (n.op) {
    case Op::Neg: return fl ? B_.CreateFNeg(a[0]) : B_.CreateSub(zero(), a[0]);
    case Op::Abs:
      if (fl) return intrinsic(llvm::Intrinsic::fabs, a[0]);
      return B_.CreateSelect(B_.CreateICmpSLT(a[0], zero()), B_.CreateSub(zero(), a[0]), a[0]);
    case Op::Exp: return exp(a[0]);
    case Op::Log: return intrinsic(llvm::Intrinsic::log, a[0]);
    case Op::Sqrt: return intrinsic(llvm::Intrinsic::sqrt, a[0]);
    case Op::Rsqrt: return B_.CreateFDiv(scalar(in, 1), intrinsic(llvm::Intrinsic::sqrt, a[0]));
    case Op::Tanh:
      if (in != DType::f32) return libm("tanhf", "tanh", a[0]);
    {
      Value* r = odd_rational(a[0], math::kTanhClamp, math::kTanhP, math::kTanhQ);
      Value* m = intrinsic(llvm::Intrinsic::fabs, a[0]);
      Value* one = B_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, scalar(in, 1), a[0]);
      return B_.CreateSelect(B_.CreateFCmpOLT(m, scalar(in, math::kTanhTiny)), a[0],
                             B_.CreateSelect(B_.CreateFCmpOGT(m, scalar(in, math::kTanhOne)), one, r));
    }
    case Op::Erf:
      if (in != DType::f32) return libm("erff", "erf", a[0]);
      return odd_rational(a[0], math::kErfClamp, math::kErfP, math::kErfQ);
    case Op::Log1p: return libm("log1pf", "log1p", a[0]);
    case Op::Expm1: return libm("expm1f", "expm1", a[0]);
    case Op::Floor: return intrinsic(llvm::Intrinsic::floor, a[0]);
    case Op::Ceil: return intrinsic(llvm::Intrinsic::ceil, a[0]);
    case Op::Round: return intrinsic(llvm::Intrinsic::roundeven, a[0]);
    case Op::Sin: return libm("sinf", "sin", a[0]);
    case Op::Cos: return libm("cosf", "cos", a[0]);
    case Op::Sigmoid: return sigmoid(a[0]);
    case Op::Relu:
      if (fl) return B_.CreateSelect(B_.CreateFCmpUGT(a[0], zero()), a[0], zero());
      return B_.CreateSelect(B_.CreateICmpSGT(a[0], zero()), a[0], zero());
    case Op::Add: return fl ? B_.CreateFAdd(a[0], a[1]) : B_.CreateAdd(a[0], a[1]);
    case Op::Sub: return fl ? B_.CreateFSub(a[0], a[1]) : B_.CreateSub(a[0], a[1]);
    case Op::Mul: return fl ? B_.CreateFMul(a[0], a[1]) : B_.CreateMul(a[0], a[1]);
    case Op::Div: {
      if (fl) return B_.CreateFDiv(a[0], a[1]);
      // b == 0 gives 0 and INT_MIN / -1 wraps to INT_MIN (docs/ir.md), with no undefined
      // sdiv: those divisors are replaced by 1 before dividing.
      llvm::Type* t = a[0]->getType();
      Value* bz = B_.CreateICmpEQ(a[1], zero());
      Value* ovf = B_.CreateAnd(B_.CreateICmpEQ(a[1], llvm::ConstantInt::get(t, static_cast<uint64_t>(-1), true)),
                                B_.CreateICmpEQ(a[0], llvm::ConstantInt::get(t, llvm::APInt::getSignedMinValue(t->getIntegerBitWidth()))));
      Value* d = B_.CreateSelect(B_.CreateOr(bz, ovf), llvm::ConstantInt::get(t, 1), a[1]);
      return B_.CreateSelect(bz, zero(), B_.CreateSDiv(a[0], d));
    }
    case Op::Fmod: {
      if (fl) return B_.CreateFRem(a[0], a[1]);  // C's fmod
      // b == 0 and b == -1 give 0 (docs/ir.md), with no undefined srem (INT_MIN % -1):
      // those divisors are replaced by 1 before dividing.
      llvm::Type* t = a[0]->getType();
      Value* none = B_.CreateOr(B_.CreateICmpEQ(a[1], zero()),
                                B_.CreateICmpEQ(a[1], llvm::ConstantInt::get(t, static_cast<uint64_t>(-1), true)));
      Value* d = B_.CreateSelect(none, llvm::ConstantInt::get(t, 1), a[1]);
      return B_.CreateSelect(none, zero(), B_.CreateSRem(a[0], d));
    }
    case Op::Pow: return B_.CreateBinaryIntrinsic(llvm::Intrinsic::pow, a[0], a[1]);
    case Op::Maximum:
    case Op::Minimum: {
      Value* pick_a = n.op == Op::Maximum ? (fl ? B_.CreateFCmpOGT(a[0], a[1]) : B_.CreateICmpSGT(a[0], a[1]))
                                          : (fl ? B_.CreateFCmpOLT(a[0], a[1]) : B_.CreateICmpSLT(a[0], a[1]));
      Value* r = B_.CreateSelect(pick_a, a[0], a[1]);
      if (fl) r = B_.CreateSelect(is_nan(a[0]), a[0], r);  // NaN in b: the comparison is false -> b
      return r;
    }
    // Comparisons: the predicate for floats (ordered but for ne), signed integers and bools.
    case Op::Eq: return compare(a, in, P::FCMP_OEQ, P::ICMP_EQ, P::ICMP_EQ);
    case Op::Ne: return compare(a, in, P::FCMP_UNE, P::ICMP_NE, P::ICMP_NE);
    case Op::Lt: return compare(a, in, P::FCMP_OLT, P::ICMP_SLT, P::ICMP_ULT);
    case Op::Le: return compare(a, in, P::FCMP_OLE, P::ICMP_SLE, P::ICMP_ULE);
    case Op::Gt: return compare(a, in, P::FCMP_OGT, P::ICMP_SGT, P::ICMP_UGT);
    case Op::Ge: return compare(a, in, P::FCMP_OGE, P::ICMP_SGE, P::ICMP_UGE);
    case Op::Select: return B_.CreateSelect(B_.CreateICmpNE(a[0], llvm::ConstantInt::get(i8_, 0)), a[1], a[2]);
    case Op::Cast: return cast_scalar(a[0], in, out);
    // Not elementwise: the kernel plan never puts these in a loop.
    case Op::Sum: case Op::Mean: case Op::Max: case Op::Min: case Op::Argmax: case Op::TopK: case Op::AllReduce: case Op::Reshape:
    case Op::Transpose: case Op::BroadcastTo: case Op::Slice: case Op::Concat: case Op::Pad: case Op::Matmul: case Op::Conv2d:
    case Op::MaxPool2d: case Op::AvgPool2d: case Op::Softmax: case Op::LogSoftmax: case Op::OneHot: case Op::Constant:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad: case Op::AvgPool2dGrad: case Op::Fused:
    case Op::Gather: case Op::GatherGrad: case Op::LayerNorm: case Op::BatchNorm: case Op::Dropout:
      break;
  }
  internal_error("codegen", "cpu codegen: " + std::string(op_name(n.op)) + " is not elementwise");
}

// a[0] <op> a[1] as a bool (i8), operands of dtype `in`.
Value* Lowerer::compare(const std::vector<Value*>& a, DType in, llvm::CmpInst::Predicate f, llvm::CmpInst::Predicate s,
                        llvm::CmpInst::Predicate u) {
  Value* c = is_float(in) ? B_.CreateFCmp(f, a[0], a[1]) : B_.CreateICmp(in == DType::boolean ? u : s, a[0], a[1]);
  return B_.CreateZExt(c, i8_);
}

}  // namespace kiln::cpu::detail
