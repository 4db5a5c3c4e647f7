// The CUDA kernels of the non-elementwise ops (reductions and softmax are in
// render_reduce.cpp). Each is one thread per output element in a grid-stride loop, reading
// its inputs by gathering, so no kernel needs atomics and every sum is added in the
// interpreter's order (ir/interp_nn.cpp): that is what makes the results bitwise the
// interpreter's (given the same math functions and no FMA contraction). The exception is
// conv2d_grad_weight: a few weights each summing a whole batch's positions, split over
// blocks and added in a tree (an order fixed by the shapes, not the interpreter's).
#include <array>
#include <bit>
#include <optional>

#include "codegen/cuda/render_internal.h"
#include "ir/error.h"
#include "ir/philox.h"

namespace kiln::cuda::detail {

void render_reduce(Emitter& out, const Graph& g, const Node& n, const std::string& x, const std::string& y);
void render_softmax(Emitter& out, const Graph& g, const Node& n, const std::string& x, const std::string& y);
void render_layer_norm(Emitter& out, const Graph& g, const Node& n, const std::vector<std::string>& in,
                       const std::string& y);

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// y[i] = x[offset of stream 0 at i] over `shape` (a strided copy).
void strided_copy(Emitter& out, DType t, const Shape& shape, const std::string& x, const Stream& src,
                  const std::string& y, int64_t extent) {
  std::string T = ctype(t), it = index_type(extent);
  std::string body = stream_offsets(shape, {src}, "i", it, "o", "    ") + "    Y[i] = X[o0];\n";
  out.elementwise(num_elements(shape), extent, "  " + T + "* X = " + x + "; " + T + "* Y = " + y + ";\n", body);
}

// Declares the coordinates NAME0.. of the row-major index `idx` of `shape` (every dim).
std::string coords(const Shape& shape, const std::string& idx, const std::string& it, const std::string& name) {
  std::string s = "    " + it + " " + name + "r = " + idx + ";\n";
  for (size_t d = shape.size(); d-- > 0;) {
    std::string c = name + str(static_cast<int64_t>(d));
    if (d == 0) s += "    " + it + " " + c + " = " + name + "r;\n";
    else s += "    " + it + " " + c + " = " + name + "r % " + str(shape[d]) + "; " + name + "r /= " + str(shape[d]) + ";\n";
  }
  return s;
}

// The input row (a = 'h') or column (a = 'w') that output position o<a> reads at tap k<a>,
// skipping taps in the padding: "i64 ih = oh * S - P + kh * D; if (outside) continue;".
std::string tap(const std::string& ind, char a, int64_t S, int64_t P, int64_t D, int64_t size) {
  std::string i = std::string("i") + a, o = std::string("o") + a, k = std::string("k") + a;
  return ind + "i64 " + i + " = " + o + " * " + str(S) + " - " + str(P) + " + " + k + " * " + str(D) + ";\n" + ind +
         "if (" + i + " < 0 || " + i + " >= " + str(size) + ") continue;\n";
}

struct Pool {
  int64_t NC, H, W, OH, OW, KH, KW, SH, SW, PH, PW;
};
Pool pool_of(const AttrMap& a, const Shape& x, const Shape& y) {
  const auto& k = attr_ints(a, "kernel");
  const auto& s = attr_ints(a, "stride");
  const auto& p = attr_ints(a, "padding");
  return {x[0] * x[1], x[2], x[3], y[2], y[3], k[0], k[1], s[0], s[1], p[0], p[1]};
}

// The first maximum of window (oh, ow) of plane nc, as max_pool2d picks it: declares
// `best` (its input index, -1 if none) and `bv` (its value).
std::string first_max(const Pool& p, const std::string& T, const std::string& ind) {
  std::string s = ind + "i64 best = -1; " + T + " bv = (" + T + ")0;\n";
  s += ind + "for (i64 kh = 0; kh < " + str(p.KH) + "; ++kh) {\n";
  s += tap(ind + "  ", 'h', p.SH, p.PH, 1, p.H);
  s += ind + "  for (i64 kw = 0; kw < " + str(p.KW) + "; ++kw) {\n";
  s += tap(ind + "    ", 'w', p.SW, p.PW, 1, p.W);
  s += ind + "    i64 src = (nc * " + str(p.H) + " + ih) * " + str(p.W) + " + iw;\n";
  s += ind + "    " + T + " v = X[src];\n";
  s += ind + "    if (best < 0 || (!kiln_isnan(bv) && (kiln_isnan(v) || v > bv))) { best = src; bv = v; }\n";
  s += ind + "  }\n" + ind + "}\n";
  return s;
}

// The windows (oh, ow) that contain input cell (ih, iw), in increasing (oh, ow): kh and kw
// run downwards. `dil` is the dilation (1 for pooling). Opens two loops; close with "}}".
std::string windows_containing(int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW, int64_t DH,
                               int64_t DW, int64_t OH, int64_t OW, const std::string& ind) {
  std::string s;
  s += ind + "for (i64 kh = " + str(KH - 1) + "; kh >= 0; --kh) {\n";
  s += ind + "  i64 th = ih + " + str(PH) + " - kh * " + str(DH) + ";\n";
  s += ind + "  if (th < 0 || th % " + str(SH) + " != 0 || th / " + str(SH) + " >= " + str(OH) + ") continue;\n";
  s += ind + "  i64 oh = th / " + str(SH) + ";\n";
  s += ind + "  for (i64 kw = " + str(KW - 1) + "; kw >= 0; --kw) {\n";
  s += ind + "    i64 tw = iw + " + str(PW) + " - kw * " + str(DW) + ";\n";
  s += ind + "    if (tw < 0 || tw % " + str(SW) + " != 0 || tw / " + str(SW) + " >= " + str(OW) + ") continue;\n";
  s += ind + "    i64 ow = tw / " + str(SW) + ";\n";
  return s;
}

struct Conv {
  int64_t N, C, H, W, O, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW, G;
  int64_t cg() const { return C / G; }
  int64_t og() const { return O / G; }
};
Conv conv_of(const AttrMap& a, const Shape& x, const Shape& w, const Shape& y) {
  const auto& s = attr_ints(a, "stride");
  const auto& p = attr_ints(a, "padding");
  const auto& d = attr_ints(a, "dilation");
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], s[0], s[1], p[0], p[1], d[0], d[1], attr_int(a, "groups")};
}

// Input cell (ih, iw) of channel grp * C/groups + ch of image `b`, or a zero in the padding
// (which the product with a weight or dy then multiplies: 0 * inf is NaN, docs/ir.md).
std::string padded_read(const Conv& c, const std::string& T, const std::string& b) {
  return "ih < 0 || ih >= " + str(c.H) + " || iw < 0 || iw >= " + str(c.W) + " ? (" + T + ")0 : X[((" + b + " * " +
         str(c.C) + " + grp * " + str(c.cg()) + " + ch) * " + str(c.H) + " + ih) * " + str(c.W) + " + iw]";
}

// Direct convolution kernels (conv2d, conv2d_grad_input): one thread per output element
// looping over its whole reduction (C/groups*KH*KW taps, or the windows a pixel is in),
// accumulating in the output dtype in the interpreter's order. conv2d with enough channels
// per group takes the tiled implicit GEMM below instead (the same sums, in shared memory
// tiles); conv2d_grad_input is still this simple version.
// conv2d as an implicit GEMM, for the convolutions with enough output channels, taps and
// pixels to fill a GPU with its tiles: per group, Y[oc, p] = sum over k of W[oc, k] *
// X_col[k, p], with k = (ch, kh, kw) the taps in the interpreter's order and p = (b, oh, ow)
// an output pixel; X_col is never stored: each tile of it is gathered from X (zeros in the
// padding) into shared memory. A block of 256 threads computes a 64x64 tile of Y (4x4
// outputs a thread) and walks k in steps of 8: every output is the k-ordered sum the
// interpreter adds, each term fused into it (fma: one rounding a term where the
// interpreter has two, so equal to a tolerance, not bitwise; the CPU's GEMM-based
// convolution is not bitwise either). Fewer tiles than about two per multiprocessor of a
// large GPU (batch 1, deep layers) would leave it idle: the direct kernel spreads those
// over a thread per output.
constexpr int64_t kConvTile = 64, kConvStep = 8, kConvMinBlocks = 264;

bool conv_tiled(const Conv& c) {
  // The gather does its per-tap arithmetic in 32 bits: an image's channels and the taps fit.
  const int64_t limit = int64_t{1} << 30;
  const int64_t blocks = c.G * ((c.og() + kConvTile - 1) / kConvTile) * ((c.N * c.OH * c.OW + kConvTile - 1) / kConvTile);
  return c.og() >= 16 && c.cg() * c.KH * c.KW >= 16 && blocks >= kConvMinBlocks && c.C * c.H * c.W < limit &&
         c.cg() * c.KH * c.KW < limit && c.H + c.PH + c.KH * c.DH < limit && c.W + c.PW + c.KW * c.DW < limit;
}

void conv2d_tiled(Emitter& out, const Conv& c, const std::string& T, const std::string& x, const std::string& w,
                  const std::string* bias, const std::string& y) {
  const int64_t M = c.og(), K = c.cg() * c.KH * c.KW, P = c.N * c.OH * c.OW, taps = c.KH * c.KW;
  const bool f32 = T == ctype(DType::f32);
  KILN_CHECK(f32 || T == ctype(DType::f64), "conv2d_tiled: f32 or f64 only");
  const std::string fma = f32 ? "fmaf" : "fma";
  const int64_t mt = (M + kConvTile - 1) / kConvTile, pt = (P + kConvTile - 1) / kConvTile;
  std::string s = "  const " + T + "* __restrict__ X = " + x + ";\n  const " + T + "* __restrict__ Wt = " + w + ";\n  " +
                  T + "* __restrict__ Y = " + y + ";\n";
  if (bias) s += "  const " + T + "* __restrict__ B = " + *bias + ";\n";
  s += "  __shared__ __align__(16) " + T + " As[" + str(kConvStep) + "][" + str(kConvTile) + "];\n";
  s += "  __shared__ __align__(16) " + T + " Bs[" + str(kConvStep) + "][" + str(kConvTile) + "];\n";
  s += "  const int tid = threadIdx.x;\n";
  s += "  i64 bid = blockIdx.x;\n";
  s += "  const i64 p0 = (bid % " + str(pt) + ") * " + str(kConvTile) + "; bid /= " + str(pt) + ";\n";
  s += "  const i64 m0 = (bid % " + str(mt) + ") * " + str(kConvTile) + ";\n";
  s += "  const i64 grp = bid / " + str(mt) + ";\n";
  // The pixel this thread gathers X_col values for (column tid % 64 of every B tile).
  s += "  const i64 lp = p0 + tid % " + str(kConvTile) + ";\n";
  s += "  const bool lp_in = lp < " + str(P) + ";\n";
  s += "  const i64 lb = lp / " + str(c.OH * c.OW) + ", lrest = lp % " + str(c.OH * c.OW) + ";\n";
  s += "  const int lih0 = (int)((lrest / " + str(c.OW) + ") * " + str(c.SH) + " - " + str(c.PH) + ");\n";
  s += "  const int liw0 = (int)((lrest % " + str(c.OW) + ") * " + str(c.SW) + " - " + str(c.PW) + ");\n";
  s += "  const " + T + "* Xb = X + (lb * " + str(c.C) + " + grp * " + str(c.cg()) + ") * " + str(c.H * c.W) + ";\n";
  s += "  const int tr = tid / 16, tc = tid % 16;\n";
  s += "  " + T + " acc[4][4];\n";
  s += "  for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = (" + T + ")0;\n";
  s += "  for (i64 k0 = 0; k0 < " + str(K) + "; k0 += " + str(kConvStep) + ") {\n";
  // A tile: 64 rows (output channels) x 8 taps, two elements a thread.
  s += "    for (int e = tid; e < " + str(kConvTile * kConvStep) + "; e += 256) {\n";
  s += "      int am = e / " + str(kConvStep) + ", ak = e % " + str(kConvStep) + ";\n";
  s += "      i64 m = m0 + am, k = k0 + ak;\n";
  s += "      As[ak][am] = m < " + str(M) + " && k < " + str(K) + " ? Wt[(grp * " + str(M) + " + m) * " + str(K) +
       " + k] : (" + T + ")0;\n";
  s += "    }\n";
  // B tile: 8 taps x 64 pixels; this thread's pixel, taps tid / 64 and tid / 64 + 4.
  s += "    for (int kk = tid / " + str(kConvTile) + "; kk < " + str(kConvStep) + "; kk += 4) {\n";
  s += "      int k = (int)k0 + kk;\n";
  s += "      " + T + " v = (" + T + ")0;\n";
  s += "      if (lp_in && k < " + str(K) + ") {\n";
  s += "        int ch = k / " + str(taps) + ", t = k % " + str(taps) + ";\n";
  s += "        int ih = lih0 + (t / " + str(c.KW) + ") * " + str(c.DH) + ", iw = liw0 + (t % " + str(c.KW) + ") * " +
       str(c.DW) + ";\n";
  s += "        if (ih >= 0 && ih < " + str(c.H) + " && iw >= 0 && iw < " + str(c.W) + ") v = Xb[(ch * " + str(c.H) +
       " + ih) * " + str(c.W) + " + iw];\n";
  s += "      }\n";
  s += "      Bs[kk][tid % " + str(kConvTile) + "] = v;\n";
  s += "    }\n";
  s += "    __syncthreads();\n";
  // Only the taps that exist are added (an added 0 * 0 would turn a -0 sum into +0).
  s += "    const int steps = " + str(K) + " - k0 < " + str(kConvStep) + " ? (int)(" + str(K) + " - k0) : " +
       str(kConvStep) + ";\n";
  s += "    for (int kk = 0; kk < steps; ++kk) {\n";
  // A thread's 4 values of a row in one or two 16-byte loads (rows of 64 and the 4-aligned
  // offsets keep them aligned).
  if (f32) {
    s += "      const float4 av = *(const float4*)&As[kk][tr * 4], bv = *(const float4*)&Bs[kk][tc * 4];\n";
    s += "      const float a[4] = {av.x, av.y, av.z, av.w}, b[4] = {bv.x, bv.y, bv.z, bv.w};\n";
  } else {
    s += "      const double2 a01 = *(const double2*)&As[kk][tr * 4], a23 = *(const double2*)&As[kk][tr * 4 + 2];\n";
    s += "      const double2 b01 = *(const double2*)&Bs[kk][tc * 4], b23 = *(const double2*)&Bs[kk][tc * 4 + 2];\n";
    s += "      const double a[4] = {a01.x, a01.y, a23.x, a23.y}, b[4] = {b01.x, b01.y, b23.x, b23.y};\n";
  }
  s += "      for (int i = 0; i < 4; ++i)\n";
  s += "        for (int j = 0; j < 4; ++j) acc[i][j] = " + fma + "(a[i], b[j], acc[i][j]);\n";
  s += "    }\n";
  s += "    __syncthreads();\n";
  s += "  }\n";
  s += "  for (int i = 0; i < 4; ++i) {\n";
  s += "    i64 m = m0 + tr * 4 + i;\n";
  s += "    if (m >= " + str(M) + ") continue;\n";
  s += "    i64 oc = grp * " + str(M) + " + m;\n";
  s += "    for (int j = 0; j < 4; ++j) {\n";
  s += "      i64 p = p0 + tc * 4 + j;\n";
  s += "      if (p >= " + str(P) + ") continue;\n";
  s += "      i64 b = p / " + str(c.OH * c.OW) + ", q = p % " + str(c.OH * c.OW) + ";\n";
  s += std::string("      Y[(b * ") + str(c.O) + " + oc) * " + str(c.OH * c.OW) + " + q] = " +
       (bias ? "acc[i][j] + B[oc]" : "acc[i][j]") + ";\n";
  s += "    }\n";
  s += "  }\n";
  out.kernel(s, c.G * mt * pt, 256);
}

void conv2d(Emitter& out, const Conv& c, const std::string& T, const std::string& x, const std::string& w,
            const std::string* bias, const std::string& y) {
  if (conv_tiled(c)) return conv2d_tiled(out, c, T, x, w, bias, y);
  int64_t n = c.N * c.O * c.OH * c.OW;
  std::string decls = "  " + T + "* X = " + x + "; " + T + "* Wt = " + w + "; " + T + "* Y = " + y + ";\n";
  if (bias) decls += "  " + T + "* B = " + *bias + ";\n";
  std::string s = coords({c.N, c.O, c.OH, c.OW}, "(i64)i", "i64", "y");
  s += "    i64 oc = y1, oh = y2, ow = y3, grp = oc / " + str(c.og()) + ";\n";
  s += "    " + T + " acc = (" + T + ")0;\n";
  s += "    for (i64 ch = 0; ch < " + str(c.cg()) + "; ++ch)\n";
  s += "      for (i64 kh = 0; kh < " + str(c.KH) + "; ++kh) {\n";
  s += "        i64 ih = oh * " + str(c.SH) + " - " + str(c.PH) + " + kh * " + str(c.DH) + ";\n";
  s += "        for (i64 kw = 0; kw < " + str(c.KW) + "; ++kw) {\n";
  s += "          i64 iw = ow * " + str(c.SW) + " - " + str(c.PW) + " + kw * " + str(c.DW) + ";\n";
  s += "          " + T + " xv = " + padded_read(c, T, "y0") + ";\n";
  s += "          acc = acc + xv * Wt[((oc * " + str(c.cg()) + " + ch) * " + str(c.KH) + " + kh) * " + str(c.KW) +
       " + kw];\n";
  s += "        }\n      }\n";
  s += bias ? "    Y[i] = acc + B[oc];\n" : "    Y[i] = acc;\n";
  out.elementwise(n, n, decls, s);
}

void conv2d_grad_input(Emitter& out, const Conv& c, const std::string& T, const std::string& dy, const std::string& w,
                       const std::string& dx) {
  int64_t n = c.N * c.C * c.H * c.W;
  std::string decls = "  " + T + "* D = " + dy + "; " + T + "* Wt = " + w + "; " + T + "* Y = " + dx + ";\n";
  std::string s = coords({c.N, c.C, c.H, c.W}, "(i64)i", "i64", "x");
  s += "    i64 ih = x2, iw = x3, grp = x1 / " + str(c.cg()) + ", ch = x1 % " + str(c.cg()) + ";\n";
  s += "    " + T + " acc = (" + T + ")0;\n";
  s += "    for (i64 oc = grp * " + str(c.og()) + "; oc < (grp + 1) * " + str(c.og()) + "; ++oc) {\n";
  s += windows_containing(c.KH, c.KW, c.SH, c.SW, c.PH, c.PW, c.DH, c.DW, c.OH, c.OW, "      ");
  s += "          acc = acc + D[((x0 * " + str(c.O) + " + oc) * " + str(c.OH) + " + oh) * " + str(c.OW) + " + ow] * Wt[((oc * " +
       str(c.cg()) + " + ch) * " + str(c.KH) + " + kh) * " + str(c.KW) + " + kw];\n";
  s += "        }\n      }\n    }\n    Y[i] = acc;\n";
  out.elementwise(n, n, decls, s);
}

// dw[oc, ch, kh, kw] = the sum over (b, oh, ow) of x * dy: a row reduction of N*OH*OW
// terms per weight (one block of threads per weight once that is more than 64). Taps in the
// padding add 0 * dy. The order is the summation order's, not the interpreter's serial one
// (whose result the checks accept to a tolerance, as they do the CPU backend's GEMM-based
// version). The fallback of conv2d_grad_weight below, for kernels too large to keep a
// thread's sums in registers.
void conv2d_grad_weight_rows(Emitter& out, const Conv& c, DType t, const std::string& x, const std::string& dy,
                             const std::string& dw) {
  std::string T = ctype(t);
  std::string decls = T + "* X = " + x + "; " + T + "* D = " + dy + "; " + T + "* Y = " + dw + ";\n";
  std::string row = coords({c.O, c.cg(), c.KH, c.KW}, "(i64)r", "i64", "w");
  row += "    i64 oc = w0, ch = w1, kh = w2, kw = w3, grp = oc / " + str(c.og()) + ";\n";
  std::string e = "        i64 b = (i64)k / " + str(c.OH * c.OW) + ", oh = (i64)k / " + str(c.OW) + " % " + str(c.OH) +
                  ", ow = (i64)k % " + str(c.OW) + ";\n";
  e += "        i64 ih = oh * " + str(c.SH) + " - " + str(c.PH) + " + kh * " + str(c.DH) + ";\n";
  e += "        i64 iw = ow * " + str(c.SW) + " - " + str(c.PW) + " + kw * " + str(c.DW) + ";\n";
  e += "        x = (" + padded_read(c, T, "b") + ") * D[((b * " + str(c.O) + " + oc) * " + str(c.OH) + " + oh) * " +
       str(c.OW) + " + ow];\n";
  row_sum(out, t, c.O * c.cg() * c.KH * c.KW, c.N * c.OH * c.OW, decls, row, e, "      Y[r] = acc;\n");
}

// How conv2d_grad_weight splits its work (all fixed by the shapes, so is the summation
// order): a block takes a tile of `oct` output channels by `ct` input channels of one group
// and every tap of them, over chunk s of the output positions p = (b, oh, ow); its threads
// walk the chunk with consecutive threads on consecutive p (coalesced dy reads, and x reads
// that neighbouring taps share in L1), each keeping oct * ct * KH * KW sums in registers:
// a dy value serves ct * KH * KW products, an x value oct. The block's sums are reduced in
// a fixed tree (warp shuffles, then the warps in order) and, with more than one chunk,
// written as partials that a second kernel adds pairwise per weight.
struct DwTiling {
  int64_t oct = 1, ct = 1;   // output and input channels per block
  int64_t tiles = 1;         // blocks per chunk: groups * og / oct * cg / ct
  int64_t threads = 32;      // per block
  int64_t chunk = 0, chunks = 1;  // output positions per block; chunks = ceil(P / chunk)
};

// A thread's sums in register words (4 bytes): a tile's at most kDwTileWords, or one
// channel pair's KH * KW when that alone is more; a kernel whose KH * KW sums need more than
// kDwMaxWords takes the row kernel instead (it would spill).
constexpr int64_t kDwTileWords = 72, kDwMaxWords = 128;
constexpr int64_t kDwThreads = 256;
// Output positions a thread adds serially: at most kDwMaxRun (a run as long as the
// summation order's blocks of 64, so the accuracy stays the row kernel's), and chunks no
// shorter than kDwMinRun per thread (the block's tree costs ~oct*ct*taps*10 instructions a
// thread, so a thread should do some work before it).
constexpr int64_t kDwMaxRun = 64, kDwMinRun = 8;
// Blocks wanted in all: a few per SM of a large GPU (132 SMs on an H100/H200); at least
// kDwMinBlocks (two per SM) where the work allows, even at the price of smaller tiles.
constexpr int64_t kDwTargetBlocks = 512, kDwMinBlocks = 264;

std::optional<DwTiling> dw_tiling(const Conv& c, DType t) {
  const int64_t words = static_cast<int64_t>(dtype_size(t)) / 4, taps = c.KH * c.KW;
  const int64_t P = c.N * c.OH * c.OW;
  if (taps * words > kDwMaxWords || P == 0) return std::nullopt;
  DwTiling d;
  d.threads = std::min<int64_t>(kDwThreads, (P + 31) / 32 * 32);
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t most = ceil_div(P, d.threads * kDwMinRun), least = ceil_div(P, d.threads * kDwMaxRun);
  // Enough blocks first (where some tile gives kDwMinBlocks), then the most products per
  // load: the largest oct * ct within the register budget (each a divisor of its group's
  // channels, at most 8), then the fewest loads (oct + ct), then the larger oct (a thread's
  // x loads are ct * taps, its dy loads oct).
  auto key = [&](int64_t o, int64_t k) {
    return std::array<int64_t, 4>{c.G * (c.og() / o) * (c.cg() / k) * most >= kDwMinBlocks, o * k, -(o + k), o};
  };
  for (int64_t o = 1; o <= std::min<int64_t>(8, c.og()); ++o) {
    if (c.og() % o) continue;
    for (int64_t k = 1; k <= std::min<int64_t>(8, c.cg()); ++k)
      if (c.cg() % k == 0 && o * k * taps * words <= std::max(kDwTileWords, taps * words) && key(o, k) > key(d.oct, d.ct))
        d.oct = o, d.ct = k;
  }
  d.tiles = c.G * (c.og() / d.oct) * (c.cg() / d.ct);
  int64_t chunks = std::max<int64_t>({least, std::min(most, ceil_div(kDwTargetBlocks, d.tiles)), 1});
  d.chunk = ceil_div(P, chunks);
  d.chunks = ceil_div(P, d.chunk);  // none empty
  return d;
}

void conv2d_grad_weight(Emitter& out, const Conv& c, DType t, const std::string& x, const std::string& dy,
                        const std::string& dw) {
  const int64_t weights = c.O * c.cg() * c.KH * c.KW;
  if (weights == 0) return;
  const std::string T = ctype(t);
  const int64_t P = c.N * c.OH * c.OW;
  if (P == 0) {  // an empty sum
    out.elementwise(weights, weights, "  " + T + "* Y = " + dw + ";\n", "    Y[i] = (" + T + ")0;\n");
    return;
  }
  std::optional<DwTiling> td = dw_tiling(c, t);
  if (!td) return conv2d_grad_weight_rows(out, c, t, x, dy, dw);
  const DwTiling& d = *td;
  const int64_t taps = c.KH * c.KW, sums = d.oct * d.ct * taps, warps = d.threads / 32;
  const std::string it = index_type(std::max({c.N * c.C * c.H * c.W, c.N * c.O * c.OH * c.OW, weights * d.chunks,
                                              d.chunks * d.tiles + d.threads}));
  // Partials [chunk][weight] (coalesced for the second kernel's thread per weight).
  const std::string part = d.chunks > 1 ? pointer(out.scratch(weights * d.chunks * static_cast<int64_t>(dtype_size(t))), t) : dw;
  const std::string fma = fn("fma", t);
  std::string s = "  const " + T + "* __restrict__ X = " + x + "; const " + T + "* __restrict__ D = " + dy + "; " + T +
                  "* Y = " + part + ";\n";
  s += "  __shared__ " + T + " kiln_sh[" + str(warps * sums) + "];\n";
  // Block = chunk * tiles + tile: the blocks running at once share a chunk of x and dy in L2.
  s += "  const " + it + " tile = (" + it + ")blockIdx.x % " + str(d.tiles) + ", chunk = (" + it + ")blockIdx.x / " +
       str(d.tiles) + ";\n";
  s += "  const " + it + " grp = tile / " + str(c.og() / d.oct * (c.cg() / d.ct)) + ", sub = tile % " +
       str(c.og() / d.oct * (c.cg() / d.ct)) + ";\n";
  s += "  const " + it + " oc0 = grp * " + str(c.og()) + " + sub / " + str(c.cg() / d.ct) + " * " + str(d.oct) +
       ", ch0 = sub % " + str(c.cg() / d.ct) + " * " + str(d.ct) + ";\n";
  s += "  " + T + " acc[" + str(sums) + "];\n";
  s += "#pragma unroll\n  for (int a = 0; a < " + str(sums) + "; ++a) acc[a] = (" + T + ")0;\n";
  s += "  const " + it + " hi = kiln_min(chunk * " + str(d.chunk) + " + " + str(d.chunk) + ", (" + it + ")" + str(P) + ");\n";
  s += "  for (" + it + " p = chunk * " + str(d.chunk) + " + (" + it + ")threadIdx.x; p < hi; p += " + str(d.threads) + ") {\n";
  s += "    const " + it + " ow = p % " + str(c.OW) + ", q = p / " + str(c.OW) + ", oh = q % " + str(c.OH) + ", b = q / " +
       str(c.OH) + ";\n";
  s += "    " + T + " dv[" + str(d.oct) + "];\n";
  s += "#pragma unroll\n    for (int o = 0; o < " + str(d.oct) + "; ++o) dv[o] = D[((b * " + str(c.O) + " + oc0 + o) * " +
       str(c.OH) + " + oh) * " + str(c.OW) + " + ow];\n";
  s += "    const " + T + "* xb = X + (b * " + str(c.C) + " + grp * " + str(c.cg()) + " + ch0) * " + str(c.H * c.W) + ";\n";
  s += "#pragma unroll\n    for (int kh = 0; kh < " + str(c.KH) + "; ++kh) {\n";
  s += "      const " + it + " ih = oh * " + str(c.SH) + " - " + str(c.PH) + " + kh * " + str(c.DH) + ";\n";
  s += "      const bool inh = ih >= 0 && ih < " + str(c.H) + ";\n";
  s += "#pragma unroll\n      for (int kw = 0; kw < " + str(c.KW) + "; ++kw) {\n";
  s += "        const " + it + " iw = ow * " + str(c.SW) + " - " + str(c.PW) + " + kw * " + str(c.DW) + ";\n";
  s += "        const bool in = inh && iw >= 0 && iw < " + str(c.W) + ";\n";
  s += "#pragma unroll\n        for (int k = 0; k < " + str(d.ct) + "; ++k) {\n";
  // A tap in the padding reads 0, which still multiplies dy (0 * inf is NaN, docs/ir.md).
  s += "          const " + T + " xv = in ? xb[(" + it + ")k * " + str(c.H * c.W) + " + ih * " + str(c.W) + " + iw] : (" + T + ")0;\n";
  s += "#pragma unroll\n          for (int o = 0; o < " + str(d.oct) + "; ++o) {\n";
  s += "            const int a = ((o * " + str(d.ct) + " + k) * " + str(c.KH) + " + kh) * " + str(c.KW) + " + kw;\n";
  s += "            acc[a] = " + fma + "(xv, dv[o], acc[a]);\n";
  s += "          }\n        }\n      }\n    }\n  }\n";
  // Each sum over the warp (lane 0 ends with ((l0 + l1) + (l2 + l3)) + ...), then over the
  // warps in order.
  s += "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n";
  s += "#pragma unroll\n  for (int a = 0; a < " + str(sums) + "; ++a) {\n";
  s += "    " + T + " v = acc[a];\n";
  s += "    for (int o = 1; o < 32; o <<= 1) v = v + __shfl_down_sync(0xffffffffu, v, o);\n";
  s += "    if (lane == 0) kiln_sh[warp * " + str(sums) + " + a] = v;\n  }\n";
  s += "  __syncthreads();\n";
  s += "  for (int a = threadIdx.x; a < " + str(sums) + "; a += " + str(d.threads) + ") {\n";
  s += "    " + T + " v = kiln_sh[a];\n";
  s += "    for (int w = 1; w < " + str(warps) + "; ++w) v = v + kiln_sh[w * " + str(sums) + " + a];\n";
  s += "    const int o = a / " + str(d.ct * taps) + ", k = a / " + str(taps) + " % " + str(d.ct) + ", tap = a % " + str(taps) +
       ";\n";
  s += "    Y[" + std::string(d.chunks > 1 ? "chunk * " + str(weights) + " + " : "") + "((oc0 + o) * " + str(c.cg()) +
       " + ch0 + k) * " + str(taps) + " + tap] = v;\n  }\n";
  out.kernel(s, d.chunks * d.tiles, d.threads);
  if (d.chunks == 1) return;
  // Each weight's partials, pairwise in chunk order (a binary counter: slot l holds the sum
  // of the last 2^l chunks while bit l of the count is set).
  const int levels = std::bit_width(static_cast<uint64_t>(d.chunks));
  std::string sum = "    " + T + " slot[" + std::to_string(levels) + "];\n";
  sum += "    for (" + it + " k = 0; k < " + str(d.chunks) + "; ++k) {\n";
  sum += "      " + T + " v = Pt[k * " + str(weights) + " + i];\n";
  sum += "      int l = 0;\n      for (; (((k + 1) >> l) & 1) == 0; ++l) v = slot[l] + v;\n      slot[l] = v;\n    }\n";
  sum += "    " + T + " acc = (" + T + ")0; bool have = false;\n";
  sum += "    for (int l = 0; l < " + std::to_string(levels) + "; ++l)\n";
  sum += "      if ((" + str(d.chunks) + " >> l) & 1) { acc = have ? slot[l] + acc : slot[l]; have = true; }\n";
  sum += "    Y[i] = acc;\n";
  out.elementwise(weights, weights * d.chunks, "  const " + T + "* Pt = " + part + "; " + T + "* Y = " + dw + ";\n", sum);
}

void pool(Emitter& out, const Node& n, const Pool& p, const std::string& T, const std::string& x, const std::string& y) {
  int64_t total = p.NC * p.OH * p.OW;
  std::string decls = "  " + T + "* X = " + x + "; " + T + "* Y = " + y + ";\n";
  std::string s = coords({p.NC, p.OH, p.OW}, "(i64)i", "i64", "y");
  s += "    i64 nc = y0, oh = y1, ow = y2;\n";
  if (n.op == Op::MaxPool2d) {
    // Padded cells never win; the first NaN wins over everything.
    s += "    " + T + " acc = -" + (T == "f32" ? std::string("kiln_f32_bits(0x7f800000u)") : "kiln_f64_bits(0x7ff0000000000000ull)") + ";\n";
  } else {
    s += "    " + T + " acc = (" + T + ")0; i64 inside = 0;\n";
  }
  s += "    for (i64 kh = 0; kh < " + str(p.KH) + "; ++kh) {\n";
  s += tap("      ", 'h', p.SH, p.PH, 1, p.H);
  s += "      for (i64 kw = 0; kw < " + str(p.KW) + "; ++kw) {\n";
  s += tap("        ", 'w', p.SW, p.PW, 1, p.W);
  s += "        " + T + " v = X[(nc * " + str(p.H) + " + ih) * " + str(p.W) + " + iw];\n";
  s += n.op == Op::MaxPool2d ? "        if (!kiln_isnan(acc) && (kiln_isnan(v) || v > acc)) acc = v;\n"
                             : "        acc = acc + v; ++inside;\n";
  s += "      }\n    }\n";
  if (n.op == Op::MaxPool2d) s += "    Y[i] = acc;\n";
  else if (attr_bool(n.attrs, "count_include_pad")) s += "    Y[i] = acc / (" + T + ")" + str(p.KH * p.KW) + ";\n";
  else s += "    Y[i] = acc / (" + T + ")inside;\n";
  out.elementwise(total, std::max(total, p.NC * p.H * p.W), decls, s);
}

// dx cell (nc, ih, iw) gathers dy of every window containing it, in increasing (oh, ow):
// for max pooling those whose first maximum it is, for average pooling dy / divisor.
void pool_grad(Emitter& out, const Node& n, const Pool& p, const std::string& T, const std::string* x,
               const std::string& dy, const std::string& dx) {
  int64_t total = p.NC * p.H * p.W;
  std::string decls = "  " + T + "* D = " + dy + "; " + T + "* Y = " + dx + ";\n";
  if (x) decls += "  " + T + "* X = " + *x + ";\n";
  std::string s = coords({p.NC, p.H, p.W}, "(i64)i", "i64", "x");
  s += "    i64 nc = x0, ih = x1, iw = x2;\n";
  s += "    " + T + " acc = (" + T + ")0;\n";
  s += windows_containing(p.KH, p.KW, p.SH, p.SW, p.PH, p.PW, 1, 1, p.OH, p.OW, "    ");
  std::string dyv = "D[(nc * " + str(p.OH) + " + oh) * " + str(p.OW) + " + ow]";
  if (n.op == Op::MaxPool2dGrad) {
    s += "      {\n" + first_max(p, T, "        ");
    s += "        if (best == i) acc = acc + " + dyv + ";\n      }\n";
  } else if (attr_bool(n.attrs, "count_include_pad")) {
    s += "      acc = acc + " + dyv + " / (" + T + ")" + str(p.KH * p.KW) + ";\n";
  } else {
    // The window's real cells: rows times columns inside the input.
    s += "      i64 rows = 0, cols = 0;\n";
    s += "      for (i64 k = 0; k < " + str(p.KH) + "; ++k) { i64 r = oh * " + str(p.SH) + " - " + str(p.PH) +
         " + k; rows += r >= 0 && r < " + str(p.H) + "; }\n";
    s += "      for (i64 k = 0; k < " + str(p.KW) + "; ++k) { i64 q = ow * " + str(p.SW) + " - " + str(p.PW) +
         " + k; cols += q >= 0 && q < " + str(p.W) + "; }\n";
    s += "      acc = acc + " + dyv + " / (" + T + ")(rows * cols);\n";
  }
  s += "      }\n    }\n    Y[i] = acc;\n";
  out.elementwise(total, std::max(total, p.NC * p.OH * p.OW), decls, s);
}

}  // namespace

void render_op(Emitter& out, const Graph& g, const Node& n, const std::function<std::string(ValueId)>& ptr) {
  const TensorType& rt = g.type(n.result());
  auto it = [&](size_t k) -> const TensorType& { return g.type(n.operands[k]); };
  auto in = [&](size_t k) { return ptr(n.operands[k]); };
  std::string y = ptr(n.result());
  std::string T = ctype(rt.dtype);
  int64_t numel = rt.numel();
  switch (n.op) {
    case Op::Neg: case Op::Abs: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Tanh:
    case Op::Sigmoid: case Op::Erf: case Op::Log1p: case Op::Expm1: case Op::Floor: case Op::Ceil:
    case Op::Round: case Op::Sin: case Op::Cos: case Op::Fmod: case Op::Relu: case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow:
    case Op::Maximum: case Op::Minimum: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt:
    case Op::Ge: case Op::Select: case Op::Cast: case Op::Matmul: case Op::Fused: case Op::Constant:
    case Op::AllReduce:  // a CollectiveLaunch (render.cpp)
      internal_error("op", "cuda render: " + std::string(op_name(n.op)) + " is not an op kernel (the plan runs it otherwise)");
    case Op::Sum: case Op::Mean: case Op::Max: case Op::Min: case Op::Argmax:
      return render_reduce(out, g, n, in(0), y);
    case Op::Softmax: case Op::LogSoftmax:
      return render_softmax(out, g, n, in(0), y);
    case Op::Reshape:
      return strided_copy(out, rt.dtype, rt.shape, in(0), {strides_of(rt.shape), 0}, y, numel);
    case Op::Transpose: case Op::BroadcastTo: case Op::Slice:
      // Indices stay below the larger size: a slice's reads go past its result's.
      return strided_copy(out, rt.dtype, rt.shape, in(0), source_view(n, it(0).shape, rt.shape), y,
                          std::max(numel, it(0).numel()));
    case Op::Concat: {
      int64_t axis = attr_int(n.attrs, "axis");
      size_t a = static_cast<size_t>(axis < 0 ? axis + rt.rank() : axis);
      int64_t inner = 1;
      for (size_t d = a + 1; d < rt.shape.size(); ++d) inner *= rt.shape[d];
      std::string it_ = index_type(numel);
      std::string s = "    " + it_ + " in = i % " + str(inner) + ", rest = i / " + str(inner) + ";\n";
      s += "    " + it_ + " c = rest % " + str(rt.shape[a]) + ", outer = rest / " + str(rt.shape[a]) + ";\n";
      std::string decls;
      int64_t base = 0;
      for (size_t k = 0; k < n.operands.size(); ++k) {
        int64_t len = it(k).shape[a];
        decls += "  " + T + "* X" + str(static_cast<int64_t>(k)) + " = " + in(k) + ";\n";
        s += std::string(k == 0 ? "    " : "    else ") + "if (c < " + str(base + len) + ") Y[i] = X" +
             str(static_cast<int64_t>(k)) + "[(outer * " + str(len) + " + (c - " + str(base) + ")) * " + str(inner) + " + in];\n";
        base += len;
      }
      return out.elementwise(numel, numel, "  " + T + "* Y = " + y + ";\n" + decls, s);
    }
    case Op::Pad: {
      const auto& low = attr_ints(n.attrs, "low");
      std::string value = literal(Tensor::scalar(DType::f64, attr_float(n.attrs, "value")).cast(rt.dtype), 0);
      std::string it_ = index_type(numel);
      std::string s = coords(rt.shape, "i", it_, "c") + "    bool inside = true; " + it_ + " src = 0;\n";
      std::vector<int64_t> xs = strides_of(it(0).shape);
      for (size_t d = 0; d < rt.shape.size(); ++d) {
        std::string c = "(c" + str(static_cast<int64_t>(d)) + " - " + str(low[d]) + ")";
        s += "    inside = inside && " + c + " >= 0 && " + c + " < " + str(it(0).shape[d]) + "; src += " + c + " * " +
             str(xs[d]) + ";\n";
      }
      s += "    Y[i] = inside ? X[src] : " + value + ";\n";
      return out.elementwise(numel, numel, "  " + T + "* X = " + in(0) + "; " + T + "* Y = " + y + ";\n", s);
    }
    case Op::OneHot: {
      int64_t depth = rt.shape.back();
      std::string it_ = index_type(numel);
      std::string one = literal(Tensor::scalar(DType::i64, int64_t{1}).cast(rt.dtype), 0);
      std::string zero = literal(Tensor(rt.dtype, {}), 0);
      std::string s = "    i64 index = (i64)X[i / " + str(depth) + "];\n";
      s += "    Y[i] = index == (i64)(i % " + str(depth) + ") ? " + one + " : " + zero + ";\n";
      return out.elementwise(numel, numel, "  " + ctype(it(0).dtype) + "* X = " + in(0) + "; " + T + "* Y = " + y + ";\n", s);
    }
    case Op::TopK: {
      // One thread per row (x as [outer, d, inner]): k passes of a selection, each taking the
      // best element after the previous pick in the strict order (value, NaN as the largest,
      // then position) that the interpreter sorts by, so no scratch memory and its result.
      int64_t axis = attr_int(n.attrs, "axis");
      if (axis < 0) axis += it(0).rank();
      const Shape& xs = it(0).shape;
      int64_t outer = 1, inner = 1, d = xs[static_cast<size_t>(axis)], k = attr_int(n.attrs, "k");
      for (int64_t a = 0; a < axis; ++a) outer *= xs[static_cast<size_t>(a)];
      for (size_t a = static_cast<size_t>(axis) + 1; a < xs.size(); ++a) inner *= xs[a];
      const std::string X = ctype(it(0).dtype);
      const std::string cmp = attr_bool(n.attrs, "largest") ? ">" : "<";
      const std::string nan_first = attr_bool(n.attrs, "largest") ? "un" : "vn";
      const bool fp = is_float(it(0).dtype);  // integers have no NaN (and x != x would be a warning)
      std::string s = "    i64 b = (i64)i / " + str(inner) + ", c = (i64)i % " + str(inner) + ";\n";
      s += "    const " + X + "* R = X + b * " + str(d * inner) + " + c;\n";
      // before(i, j): element i is picked before element j.
      s += "    auto before = [&](i64 p, i64 q) {\n      " + X + " u = R[p * " + str(inner) + "], v = R[q * " +
           str(inner) + "];\n      bool un = " + (fp ? "u != u" : "false") + ", vn = " + (fp ? "v != v" : "false") +
           ";\n      if (un != vn) return " + nan_first +
           ";\n      if (un || u == v) return p < q;\n      return u " + cmp + " v;\n    };\n";
      s += "    i64 prev = -1;\n    for (i64 r = 0; r < " + str(k) + "; ++r) {\n      i64 best = -1;\n";
      s += "      for (i64 j = 0; j < " + str(d) + "; ++j)\n";
      s += "        if ((prev < 0 || before(prev, j)) && (best < 0 || before(j, best))) best = j;\n";
      s += "      Y[(b * " + str(k) + " + r) * " + str(inner) + " + c] = best;\n      prev = best;\n    }\n";
      return out.elementwise(outer * inner, std::max(numel, it(0).numel()),
                             "  " + X + "* X = " + in(0) + "; i64* Y = " + y + ";\n", s);
    }
    case Op::Gather: case Op::GatherGrad: {
      // x (dx for gather_grad) as [outer, d, inner], the indices as [count].
      const bool grad = n.op == Op::GatherGrad;
      const Shape& xs = grad ? rt.shape : it(0).shape;
      int64_t axis = attr_int(n.attrs, "axis");
      if (axis < 0) axis += static_cast<int64_t>(xs.size());
      int64_t outer = 1, inner = 1, d = xs[static_cast<size_t>(axis)], count = it(1).numel();
      for (int64_t k = 0; k < axis; ++k) outer *= xs[static_cast<size_t>(k)];
      for (size_t k = static_cast<size_t>(axis) + 1; k < xs.size(); ++k) inner *= xs[k];
      const std::string decls = "  " + T + "* X = " + in(0) + "; " + ctype(it(1).dtype) + "* I = " + in(1) + "; " +
                                T + "* Y = " + y + ";\n";
      const std::string valid = "(j >= 0 && j < " + str(d) + ")";
      if (!grad) {  // one thread per output element
        std::string s = "    i64 c = (i64)i % " + str(inner) + ", r = (i64)i / " + str(inner) + ";\n";
        s += "    i64 o = r / " + str(count) + ", j = (i64)I[r % " + str(count) + "];\n";
        s += "    Y[i] = " + valid + " ? X[(o * " + str(d) + " + j) * " + str(inner) + " + c] : (" + T + ")0;\n";
        return out.elementwise(numel, std::max(numel, it(0).numel()), decls, s);
      }
      // One thread per (outer, inner) column of dx: cleared, then dy's rows added in index
      // order, as the interpreter adds them (no atomics: the sums are bitwise its own).
      std::string s = "    i64 b = (i64)i / " + str(inner) + ", c = (i64)i % " + str(inner) + ";\n";
      s += "    for (i64 j = 0; j < " + str(d) + "; ++j) Y[(b * " + str(d) + " + j) * " + str(inner) + " + c] = (" + T +
           ")0;\n";
      s += "    for (i64 k = 0; k < " + str(count) + "; ++k) {\n      i64 j = (i64)I[k];\n      if " + valid +
           " Y[(b * " + str(d) + " + j) * " + str(inner) + " + c] += X[(b * " + str(count) + " + k) * " + str(inner) +
           " + c];\n    }\n";
      return out.elementwise(outer * inner, std::max(numel, it(0).numel()), decls, s);
    }
    case Op::LayerNorm: {
      std::vector<std::string> ins;
      for (size_t k = 0; k < n.operands.size(); ++k) ins.push_back(in(k));
      return render_layer_norm(out, g, n, ins, y);
    }
    case Op::BatchNorm: {
      int64_t inner = 1;
      for (size_t d = 2; d < rt.shape.size(); ++d) inner *= rt.shape[d];
      std::string eps = literal(Tensor::scalar(DType::f64, attr_float(n.attrs, "epsilon")).cast(rt.dtype), 0);
      std::string decls = "  " + T + "* X = " + in(0) + "; " + T + "* S = " + in(1) + "; " + T + "* B = " + in(2) + "; " +
                          T + "* M = " + in(3) + "; " + T + "* V = " + in(4) + "; " + T + "* Y = " + y + ";\n";
      std::string s = "    i64 c = (i64)i / " + str(inner) + " % " + str(rt.shape[1]) + ";\n";
      s += "    Y[i] = (X[i] - M[c]) * ((" + T + ")1 / " + fn("sqrt", rt.dtype) + "(V[c] + " + eps + ")) * S[c] + B[c];\n";
      return out.elementwise(numel, numel, decls, s);
    }
    case Op::Dropout: {
      // Philox4x32-10 (ir/philox.h) per element: key (seed lo, hi), counter (i, stream,
      // counter lo, hi); the element is kept when the first word is at least the threshold.
      const double ratio = attr_float(n.attrs, "ratio");
      auto u32 = [](uint32_t v) { return std::to_string(v) + "u"; };
      std::string decls = "  " + T + "* X = " + in(0) + "; i64 seed = *(i64*)" + in(1) + ", ctr = *(i64*)" + in(2) +
                          "; " + T + "* Y = " + y + ";\n";
      std::string s = "    u32 c0 = (u32)(u64)i, c1 = " + u32(static_cast<uint32_t>(attr_int(n.attrs, "stream"))) +
                      ", c2 = (u32)(u64)ctr, c3 = (u32)((u64)ctr >> 32);\n";
      s += "    u32 k0 = (u32)(u64)seed, k1 = (u32)((u64)seed >> 32);\n";
      s += "    for (int r = 0; r < " + std::to_string(philox::kRounds) + "; ++r) {\n";
      s += "      if (r > 0) { k0 += " + u32(philox::kW0) + "; k1 += " + u32(philox::kW1) + "; }\n";
      s += "      u64 p0 = (u64)" + u32(philox::kM0) + " * c0, p1 = (u64)" + u32(philox::kM1) + " * c2;\n";
      s += "      c0 = (u32)(p1 >> 32) ^ c1 ^ k0; c1 = (u32)p1; c2 = (u32)(p0 >> 32) ^ c3 ^ k1; c3 = (u32)p0;\n    }\n";
      s += "    Y[i] = c0 >= " + u32(philox::dropout_threshold(ratio)) + " ? X[i] * " +
           literal(Tensor::scalar(DType::f64, 1 / (1 - ratio)).cast(rt.dtype), 0) + " : (" + T + ")0;\n";
      return out.elementwise(numel, numel, decls, s);
    }
    case Op::Conv2d: {
      std::string bias = n.operands.size() > 2 ? in(2) : "";
      return conv2d(out, conv_of(n.attrs, it(0).shape, it(1).shape, rt.shape), T, in(0), in(1),
                    n.operands.size() > 2 ? &bias : nullptr, y);
    }
    case Op::Conv2dGradInput:
      return conv2d_grad_input(out, conv_of(n.attrs, rt.shape, it(1).shape, it(0).shape), T, in(0), in(1), y);
    case Op::Conv2dGradWeight:
      return conv2d_grad_weight(out, conv_of(n.attrs, it(0).shape, rt.shape, it(1).shape), rt.dtype, in(0), in(1), y);
    case Op::MaxPool2d:
    case Op::AvgPool2d:
      return pool(out, n, pool_of(n.attrs, it(0).shape, rt.shape), T, in(0), y);
    case Op::MaxPool2dGrad: {
      std::string x = in(0);
      return pool_grad(out, n, pool_of(n.attrs, it(0).shape, it(1).shape), T, &x, in(1), y);
    }
    case Op::AvgPool2dGrad:
      return pool_grad(out, n, pool_of(n.attrs, rt.shape, it(0).shape), T, nullptr, in(0), y);
  }
  internal_error("op", "cuda render: no kernel for op " + std::to_string(static_cast<int>(n.op)));
}

}  // namespace kiln::cuda::detail
