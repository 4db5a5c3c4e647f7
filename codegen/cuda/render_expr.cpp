// The CUDA renderer's expression table: each elementwise op as a C expression with Kiln's
// numeric semantics (docs/ir.md, the interpreter's kernels), exact literals, the prelude of
// helpers those expressions call, and the index arithmetic of strided loops.
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "codegen/cuda/render_internal.h"
#include "ir/error.h"

namespace kiln::cuda::detail {

std::string ctype(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "u8";
  }
  return "u8";
}

std::string lit(int64_t v) {
  if (v == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807LL - 1LL)";
  return v < 0 ? "(" + std::to_string(v) + "LL)" : std::to_string(v) + "LL";
}

namespace {

// A finite double as a hex-float literal (exact), parenthesized when negative.
std::string hex_float(double d, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a%s", d, suffix);
  return d < 0 || std::signbit(d) ? "(" + std::string(buf) + ")" : std::string(buf);
}

}  // namespace

std::string literal(const Tensor& t, int64_t i) {
  const std::byte* p = t.raw() + (t.is_splat() ? 0 : static_cast<size_t>(i) * dtype_size(t.dtype()));
  switch (t.dtype()) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      if (std::isfinite(f)) return hex_float(static_cast<double>(f), "f");
      return "kiln_f32_bits(" + std::to_string(std::bit_cast<uint32_t>(f)) + "u)";
    }
    case DType::f64: {
      double d;
      std::memcpy(&d, p, 8);
      if (std::isfinite(d)) return hex_float(d, "");
      return "kiln_f64_bits(" + std::to_string(std::bit_cast<uint64_t>(d)) + "ull)";
    }
    case DType::i32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      if (x == std::numeric_limits<int32_t>::min()) return "(-2147483647 - 1)";
      return x < 0 ? "(" + std::to_string(x) + ")" : std::to_string(x);
    }
    case DType::i64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return lit(x);
    }
    case DType::boolean: {
      uint8_t x;
      std::memcpy(&x, p, 1);
      return x ? "(u8)1" : "(u8)0";
    }
  }
  return "0";
}

std::string fn(const char* name, DType t) { return std::string(name) + (t == DType::f32 ? "f" : ""); }

std::string ew_expr(const Node& n, DType in, DType out, const std::vector<std::string>& a) {
  const bool fl = is_float(in);
  const std::string T = ctype(in);
  auto cmp = [&](const char* op) { return "(u8)(" + a[0] + " " + op + " " + a[1] + ")"; };
  switch (n.op) {
    case Op::Neg: return fl ? "(-" + a[0] + ")" : "kiln_neg(" + a[0] + ")";
    case Op::Abs: return fl ? fn("fabs", in) + "(" + a[0] + ")" : "kiln_abs(" + a[0] + ")";
    case Op::Exp: return fn("exp", in) + "(" + a[0] + ")";
    case Op::Log: return fn("log", in) + "(" + a[0] + ")";
    case Op::Sqrt: return fn("sqrt", in) + "(" + a[0] + ")";
    case Op::Rsqrt: return "((" + T + ")1 / " + fn("sqrt", in) + "(" + a[0] + "))";
    case Op::Tanh: return fn("tanh", in) + "(" + a[0] + ")";
    case Op::Erf: return fn("erf", in) + "(" + a[0] + ")";
    case Op::Log1p: return fn("log1p", in) + "(" + a[0] + ")";
    case Op::Expm1: return fn("expm1", in) + "(" + a[0] + ")";
    case Op::Floor: return fn("floor", in) + "(" + a[0] + ")";
    case Op::Ceil: return fn("ceil", in) + "(" + a[0] + ")";
    case Op::Round: return fn("rint", in) + "(" + a[0] + ")";  // to nearest, ties to even
    case Op::Sin: return fn("sin", in) + "(" + a[0] + ")";
    case Op::Cos: return fn("cos", in) + "(" + a[0] + ")";
    case Op::Sigmoid: return "kiln_sigmoid(" + a[0] + ")";
    case Op::Relu:
      return fl ? "((kiln_isnan(" + a[0] + ") || " + a[0] + " > (" + T + ")0) ? " + a[0] + " : (" + T + ")0)"
                : "(" + a[0] + " > 0 ? " + a[0] + " : (" + T + ")0)";
    case Op::Add: return fl ? "(" + a[0] + " + " + a[1] + ")" : "kiln_add(" + a[0] + ", " + a[1] + ")";
    case Op::Sub: return fl ? "(" + a[0] + " - " + a[1] + ")" : "kiln_sub(" + a[0] + ", " + a[1] + ")";
    case Op::Mul: return fl ? "(" + a[0] + " * " + a[1] + ")" : "kiln_mul(" + a[0] + ", " + a[1] + ")";
    case Op::Div: return fl ? "(" + a[0] + " / " + a[1] + ")" : "kiln_div(" + a[0] + ", " + a[1] + ")";
    case Op::Fmod: return (fl ? fn("fmod", in) : std::string("kiln_fmod")) + "(" + a[0] + ", " + a[1] + ")";
    case Op::Pow: return fn("pow", in) + "(" + a[0] + ", " + a[1] + ")";
    case Op::Maximum:
      return fl ? "kiln_maximum(" + a[0] + ", " + a[1] + ")" : "(" + a[0] + " > " + a[1] + " ? " + a[0] + " : " + a[1] + ")";
    case Op::Minimum:
      return fl ? "kiln_minimum(" + a[0] + ", " + a[1] + ")" : "(" + a[0] + " < " + a[1] + " ? " + a[0] + " : " + a[1] + ")";
    case Op::Eq: return cmp("==");
    case Op::Ne: return cmp("!=");
    case Op::Lt: return cmp("<");
    case Op::Le: return cmp("<=");
    case Op::Gt: return cmp(">");
    case Op::Ge: return cmp(">=");
    case Op::Select: return "(" + a[0] + " ? " + a[1] + " : " + a[2] + ")";
    case Op::Cast: {
      if (in == out) return a[0];
      if (out == DType::boolean) return "(u8)(" + a[0] + " != 0)";  // NaN != 0: true
      if (is_float(in) && is_integer(out))  // saturating, NaN -> 0 (the interpreter's convert)
        return std::string(out == DType::i32 ? "kiln_f2i32" : "kiln_f2i64") + "((f64)" + a[0] + ")";
      // Float <-> float and integer -> float round to nearest; integer -> integer wraps;
      // bool is 0 or 1.
      if (is_integer(in) && is_integer(out)) return "(" + ctype(out) + ")(u64)" + a[0];
      return "(" + ctype(out) + ")" + a[0];
    }
    case Op::Sum: case Op::Mean: case Op::Max: case Op::Min: case Op::Argmax: case Op::TopK: case Op::AllReduce:
    case Op::Reshape: case Op::Transpose: case Op::BroadcastTo: case Op::Slice: case Op::Concat: case Op::Pad: case Op::Matmul:
    case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d: case Op::Softmax: case Op::LogSoftmax:
    case Op::OneHot: case Op::Constant: case Op::Conv2dGradInput: case Op::Conv2dGradWeight:
    case Op::MaxPool2dGrad: case Op::AvgPool2dGrad: case Op::Gather: case Op::GatherGrad: case Op::LayerNorm:
    case Op::BatchNorm: case Op::Dropout: case Op::Fused:
      break;
  }
  internal_error("ew", "cuda render: " + std::string(op_name(n.op)) + " is not elementwise");
}

std::string prelude() {
  // NVRTC has no <cstdint>: Kiln's dtypes get their own names. Every helper is a pure
  // function of its arguments; integer arithmetic goes through unsigned types so it wraps
  // without undefined behaviour.
  return R"(// Generated by Kiln (codegen/cuda/render.cpp).
typedef float f32;
typedef double f64;
typedef int i32;
typedef long long i64;
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
#define KILN_FN __device__ __forceinline__

KILN_FN bool kiln_isnan(f32 x) { return x != x; }
KILN_FN bool kiln_isnan(f64 x) { return x != x; }
KILN_FN f32 kiln_f32_bits(u32 b) { union { u32 u; f32 f; } c; c.u = b; return c.f; }
KILN_FN f64 kiln_f64_bits(u64 b) { union { u64 u; f64 f; } c; c.u = b; return c.f; }

KILN_FN i32 kiln_add(i32 a, i32 b) { return (i32)((u32)a + (u32)b); }
KILN_FN i64 kiln_add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
KILN_FN i32 kiln_sub(i32 a, i32 b) { return (i32)((u32)a - (u32)b); }
KILN_FN i64 kiln_sub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
KILN_FN i32 kiln_mul(i32 a, i32 b) { return (i32)((u32)a * (u32)b); }
KILN_FN i64 kiln_mul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
KILN_FN i32 kiln_neg(i32 a) { return (i32)(0u - (u32)a); }
KILN_FN i64 kiln_neg(i64 a) { return (i64)(0ull - (u64)a); }
KILN_FN i32 kiln_abs(i32 a) { return a < 0 ? kiln_neg(a) : a; }
KILN_FN i64 kiln_abs(i64 a) { return a < 0 ? kiln_neg(a) : a; }
// x / 0 = 0 and INT_MIN / -1 = INT_MIN (x / -1 is the wrapping negation).
KILN_FN i32 kiln_div(i32 a, i32 b) { return b == 0 ? 0 : b == -1 ? kiln_neg(a) : a / b; }
KILN_FN i64 kiln_div(i64 a, i64 b) { return b == 0 ? 0 : b == -1 ? kiln_neg(a) : a / b; }
// x fmod 0 = 0 and x fmod -1 = 0 (INT_MIN % -1 overflows in C).
KILN_FN i32 kiln_fmod(i32 a, i32 b) { return b == 0 || b == -1 ? 0 : a % b; }
KILN_FN i64 kiln_fmod(i64 a, i64 b) { return b == 0 || b == -1 ? 0 : a % b; }

KILN_FN i32 kiln_min(i32 a, i32 b) { return a < b ? a : b; }
KILN_FN i64 kiln_min(i64 a, i64 b) { return a < b ? a : b; }

// Float -> integer: truncate toward zero, saturate, NaN -> 0.
KILN_FN i32 kiln_f2i32(f64 x) {
  if (x != x) return 0;
  f64 t = trunc(x);
  if (t < -2147483648.0) return (-2147483647 - 1);
  if (t >= 2147483648.0) return 2147483647;
  return (i32)t;
}
KILN_FN i64 kiln_f2i64(f64 x) {
  if (x != x) return 0;
  f64 t = trunc(x);
  if (t < -9223372036854775808.0) return (-9223372036854775807LL - 1LL);
  if (t >= 9223372036854775808.0) return 9223372036854775807LL;
  return (i64)t;
}

// NaN propagates (from a first, then b); otherwise the larger / smaller, b on ties.
KILN_FN f32 kiln_maximum(f32 a, f32 b) { return kiln_isnan(a) ? a : kiln_isnan(b) ? b : a > b ? a : b; }
KILN_FN f64 kiln_maximum(f64 a, f64 b) { return kiln_isnan(a) ? a : kiln_isnan(b) ? b : a > b ? a : b; }
KILN_FN f32 kiln_minimum(f32 a, f32 b) { return kiln_isnan(a) ? a : kiln_isnan(b) ? b : a < b ? a : b; }
KILN_FN f64 kiln_minimum(f64 a, f64 b) { return kiln_isnan(a) ? a : kiln_isnan(b) ? b : a < b ? a : b; }
// No overflow for large |x|: exp of a non-positive number only.
KILN_FN f32 kiln_sigmoid(f32 x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  f32 e = expf(x);
  return e / (1.0f + e);
}
KILN_FN f64 kiln_sigmoid(f64 x) {
  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));
  f64 e = exp(x);
  return e / (1.0 + e);
}
)";
}

std::string index_type(int64_t extent) { return extent < (int64_t{1} << 30) ? "i32" : "i64"; }

std::string stream_offsets(const Shape& shape, const std::vector<Stream>& streams, const std::string& idx,
                           const std::string& itype, const std::string& prefix, const std::string& indent) {
  // Merge dims as the CPU backend's nest() does.
  MergedDims merged = merge_dims(shape, streams);
  const Shape& dims = merged.dims;
  const std::vector<std::vector<int64_t>>& st = merged.strides;
  std::string code;
  std::vector<int64_t> contiguous = strides_of(dims);
  auto plain = [&](size_t k) { return st[k] == contiguous && streams[k].base == 0; };
  // Coordinates of the dims some strided stream steps along, innermost first:
  // c_d = rest % dims[d], then rest /= dims[d]; the outermost takes what is left.
  std::vector<bool> used(dims.size(), false);
  size_t outermost_used = dims.size();
  for (size_t d = 0; d < dims.size(); ++d)
    for (size_t k = 0; k < streams.size(); ++k)
      if (!plain(k) && st[k][d] != 0 && !used[d]) {
        used[d] = true;
        outermost_used = std::min(outermost_used, d);
      }
  std::vector<std::string> coord(dims.size());
  if (outermost_used < dims.size()) {
    if (dims.size() == 1) {
      coord[0] = idx;
    } else {
      std::string rest = prefix + "_r";
      code += indent + itype + " " + rest + " = " + idx + ";\n";
      for (size_t d = dims.size(); d-- > outermost_used;) {
        std::string size = std::to_string(dims[d]);
        if (used[d]) {
          coord[d] = prefix + "_c" + std::to_string(d);
          code += indent + itype + " " + coord[d] + " = " + rest + (d == 0 ? "" : " % " + size) + ";\n";
        }
        if (d > outermost_used) code += indent + rest + " /= " + size + ";\n";
      }
    }
  }
  for (size_t k = 0; k < streams.size(); ++k) {
    std::string e;
    if (plain(k)) {
      e = idx;
    } else {
      for (size_t d = 0; d < dims.size(); ++d)
        if (st[k][d] != 0) e += (e.empty() ? "" : " + ") + coord[d] + (st[k][d] == 1 ? "" : " * " + std::to_string(st[k][d]));
      if (streams[k].base != 0 || e.empty()) e = std::to_string(streams[k].base) + (e.empty() ? "" : " + " + e);
    }
    code += indent + itype + " " + prefix + std::to_string(k) + " = " + e + ";\n";
  }
  return code;
}

}  // namespace kiln::cuda::detail
