// Row reductions for the CUDA renderer: sum / mean / max / min over any axes, argmax, and
// softmax / log_softmax along an axis. Each is R rows of L elements (row r's kept
// coordinates, element k's reduced coordinates, both row-major).
//
// Kiln's summation order (ir/interp.h, docs/ir.md) fixes how a float sum is added: blocks
// of 64 elements left to right from +0, the block sums pairwise (a complete binary tree over
// the blocks, absent leaves skipped). A kernel may split the work only along that tree, so
// here every thread owns an aligned run of G blocks (G a power of two: a whole subtree),
// adds each block left to right and its blocks as a binary counter (the CPU backend's
// blocked_sum), and the threads' partials are combined along the same tree: adjacent pairs
// at distance 1, 2, 4, ... with warp shuffles inside a warp, then once more over the warps'
// results through shared memory. The result depends only on the shape, never on the block
// size. Max, min and argmax combine partials in order (left operand first) with the
// interpreter's tie and NaN rules, so the same tree gives its answer too.
//
// A row of at most one block (L <= 64), or of a few blocks when there are many rows, is
// done by one thread (a grid-stride loop over rows); longer rows by one block of up to 256
// threads each (1024 when there are few rows).
#include <bit>

#include "codegen/cuda/render_internal.h"
#include "ir/error.h"

namespace kiln::cuda::detail {

namespace {

constexpr int64_t kBlock = 64;       // kiln::kSumBlock
// Threads per row: 256, or 1024 when there are too few rows to fill the GPU with blocks
// (the block size changes only the speed: the tree is the same).
constexpr int64_t kMaxThreads = 256, kMaxThreadsFewRows = 1024, kFewRows = 128;
// Rows of at most kFewLeaves blocks, when there are at least kManyRows of them, are
// reduced a row per thread.
constexpr int64_t kManyRows = 4096, kFewLeaves = 8;
constexpr int64_t kMaxRowBlocks = 65535;

enum class Fold {
  FloatSum,  // the summation order
  IntSum,    // wraps; any order
  Max,       // NaN propagates, first of equals
  Min,
  Argmax,    // (value, index): first maximum, NaN counts as the maximum
  Greater,   // softmax's max: x > acc from -inf (NaN never wins)
};

std::string sp(int n) { return std::string(static_cast<size_t>(n), ' '); }

}  // namespace

// The kernel text of one row reduction.
class RowKernel {
 public:
  RowKernel(DType t, int64_t rows, int64_t len, Shape kept, std::vector<int64_t> kept_strides, Shape red,
            std::vector<int64_t> red_strides, int64_t extent)
      : t_(t), T_(ctype(t)), rows_(rows), len_(len), kept_(std::move(kept)), kept_st_(std::move(kept_strides)),
        red_(std::move(red)), red_st_(std::move(red_strides)), it_(index_type(extent)) {
    leaves_ = std::max<int64_t>(1, (len_ + kBlock - 1) / kBlock);
    // Many short rows: a thread per row reads neighbouring rows' elements side by side.
    per_row_thread_ = leaves_ == 1 || (rows_ >= kManyRows && leaves_ <= kFewLeaves);
    int64_t most = rows_ < kFewRows ? kMaxThreadsFewRows : kMaxThreads;
    threads_ = per_row_thread_ ? 1 : std::min<int64_t>(most, std::max<int64_t>(32, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(leaves_)))));
    group_ = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>((leaves_ + threads_ - 1) / threads_)));
    if (per_row_thread_) group_ = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(leaves_)));
  }

  bool per_row_thread() const { return per_row_thread_; }
  // Replaces the element load: `code` (a block body, with r and k in scope) assigns x, which
  // is declared before it. The row then has no base offset (rb0).
  void set_element(std::string code) { element_ = std::move(code); }
  const std::string& itype() const { return it_; }

  // Declares rb0, the offset of row r's first element, at `ind`.
  std::string row_base(int ind) const { return stream_offsets(kept_, {{kept_st_, 0}}, "r", it_, "rb", sp(ind)); }
  // Declares ko0, the offset of element k within its row.
  std::string elem_offset(int ind) const { return stream_offsets(red_, {{red_st_, 0}}, "k", it_, "ko", sp(ind)); }

  // Code leaving, in `acc` (and `acci` for argmax), the fold of this thread's elements:
  // value(x) of each element x = X[rb0 + ko0]. `m`-style names used by value() must be in
  // scope. Threads own blocks [lo, hi) of the row, lo = t * G.
  std::string thread_fold(Fold f, const std::string& X, const std::string& value, int ind) const {
    std::string s, in = sp(ind);
    std::string lo = per_row_thread_ ? "(" + it_ + ")0" : "(" + it_ + ")threadIdx.x * " + std::to_string(group_);
    std::string hi = per_row_thread_ ? "(" + it_ + ")" + std::to_string(leaves_)
                                     : "kiln_min(" + lo + " + " + std::to_string(group_) + ", (" + it_ + ")" +
                                           std::to_string(leaves_) + ")";
    s += in + ctype_acc() + " acc = " + identity(f) + ";\n";
    if (f == Fold::Argmax) s += in + "i32 acci = 0;\n";
    auto element = [&](int ind2) {
      if (!element_.empty()) return sp(ind2) + T_ + " x;\n" + sp(ind2) + "{\n" + element_ + sp(ind2) + "}\n";
      return elem_offset(ind2) + sp(ind2) + T_ + " x = " + value_of(value, X + "[rb0 + ko0]") + ";\n";
    };
    if (f != Fold::FloatSum) {
      s += in + "for (" + it_ + " k = " + lo + " * 64; k < kiln_min(" + hi + " * 64, (" + it_ + ")" + std::to_string(len_) +
           "); ++k) {\n";
      s += element(ind + 2) + sp(ind + 2) + step(f) + "\n" + in + "}\n";
      return s;
    }
    // Blocks added left to right; their sums combined as a binary counter (slot l holds the
    // sum of the last 2^l finished blocks while bit l of the count is set).
    auto block = [&](const std::string& b, int ind2) {
      std::string c = sp(ind2) + T_ + " sum = (" + T_ + ")0;\n";
      c += sp(ind2) + "for (" + it_ + " k = " + b + " * 64; k < kiln_min(" + b + " * 64 + 64, (" + it_ + ")" +
           std::to_string(len_) + "); ++k) {\n";
      c += element(ind2 + 2) + sp(ind2 + 2) + "sum = sum + x;\n" + sp(ind2) + "}\n";
      return c;
    };
    if (group_ == 1) {
      s += in + "if (" + lo + " < " + std::to_string(leaves_) + ") {\n" + block(lo, ind + 2) + sp(ind + 2) + "acc = sum;\n" +
           in + "}\n";
      return s;
    }
    int levels = std::bit_width(static_cast<uint64_t>(group_));
    s += in + T_ + " slot[" + std::to_string(levels) + "];\n";
    s += in + "for (" + it_ + " b = " + lo + "; b < " + hi + "; ++b) {\n";
    s += block("b", ind + 2);
    s += sp(ind + 2) + "int l = 0;\n";
    s += sp(ind + 2) + "for (; (((b - " + lo + " + 1) >> l) & 1) == 0; ++l) sum = slot[l] + sum;\n";
    s += sp(ind + 2) + "slot[l] = sum;\n" + in + "}\n";
    s += in + "{\n" + sp(ind + 2) + it_ + " count = " + hi + " - " + lo + ";\n";
    s += sp(ind + 2) + "bool have = false;\n";
    s += sp(ind + 2) + "for (int l = 0; l < " + std::to_string(levels) + "; ++l)\n";
    s += sp(ind + 4) + "if ((count >> l) & 1) { acc = have ? slot[l] + acc : slot[l]; have = true; }\n";
    s += in + "}\n";
    return s;
  }

  // Combines the threads' partials along the tree; every thread then holds the row's result
  // in acc (and acci). Uses shared arrays declared by shared_decls().
  std::string block_tree(Fold f, int ind) const {
    if (per_row_thread_) return "";
    std::string s, in = sp(ind);
    std::string g = std::to_string(group_), leaves = std::to_string(leaves_);
    auto level = [&](const std::string& who, const std::string& limit, const std::string& unit, int ind2) {
      std::string c = sp(ind2) + "for (int s = 1; s < " + limit + "; s <<= 1) {\n";
      c += sp(ind2 + 2) + ctype_acc() + " o = __shfl_down_sync(0xffffffffu, acc, s);\n";
      if (f == Fold::Argmax) c += sp(ind2 + 2) + "i32 oi = __shfl_down_sync(0xffffffffu, acci, s);\n";
      c += sp(ind2 + 2) + "if ((lane & (2 * s - 1)) == 0 && ((i64)" + who + " + s) * " + unit + " < " + leaves + ") " +
           combine(f, "o", "oi") + "\n";
      c += sp(ind2) + "}\n";
      return c;
    };
    int64_t warps = threads_ / 32;
    s += in + "{\n";
    s += sp(ind + 2) + "const int lane = threadIdx.x & 31;\n";
    s += level("threadIdx.x", "32", g, ind + 2);
    if (warps > 1) {
      s += sp(ind + 2) + "const int warp = threadIdx.x >> 5;\n";
      s += sp(ind + 2) + "if (lane == 0) { kiln_sh[warp] = acc;" + (f == Fold::Argmax ? " kiln_shi[warp] = acci;" : "") + " }\n";
      s += sp(ind + 2) + "__syncthreads();\n";
      s += sp(ind + 2) + "if (warp == 0) {\n";
      s += sp(ind + 4) + "if (lane < " + std::to_string(warps) + ") { acc = kiln_sh[lane];" +
           (f == Fold::Argmax ? " acci = kiln_shi[lane];" : "") + " }\n";
      s += level("lane", std::to_string(warps), std::to_string(32 * group_), ind + 4);
      s += sp(ind + 2) + "}\n";
    }
    s += sp(ind + 2) + "if (threadIdx.x == 0) { kiln_shb = acc;" + (f == Fold::Argmax ? " kiln_shbi = acci;" : "") + " }\n";
    s += sp(ind + 2) + "__syncthreads();\n";
    s += sp(ind + 2) + "acc = kiln_shb;" + (f == Fold::Argmax ? " acci = kiln_shbi;" : "") + "\n";
    s += sp(ind + 2) + "__syncthreads();\n";
    s += in + "}\n";
    return s;
  }

  std::string shared_decls(bool argmax) const {
    if (per_row_thread_) return "";
    bool warps = threads_ > 32;
    std::string s = "  __shared__ " + T_ + " kiln_shb;\n";
    if (warps) s += "  __shared__ " + T_ + " kiln_sh[" + std::to_string(threads_ / 32) + "];\n";
    if (argmax) s += "  __shared__ i32 kiln_shbi;\n";
    if (argmax && warps) s += "  __shared__ i32 kiln_shi[" + std::to_string(threads_ / 32) + "];\n";
    return s;
  }

  // The loop over rows (a grid-stride loop of threads or of blocks) around `body`, in which
  // r and rb0 are defined; adds the kernel to `out`.
  void emit(Emitter& out, const std::string& decls, const std::string& body, bool argmax) const {
    std::string s = "  " + decls + shared_decls(argmax);
    if (per_row_thread_) {
      s += "  for (" + it_ + " r = (" + it_ + ")blockIdx.x * blockDim.x + threadIdx.x; r < " + std::to_string(rows_) +
           "; r += (" + it_ + ")gridDim.x * blockDim.x) {\n";
    } else {
      s += "  for (" + it_ + " r = blockIdx.x; r < " + std::to_string(rows_) + "; r += gridDim.x) {\n";
    }
    s += (element_.empty() ? row_base(4) : "") + body + "  }\n";
    if (rows_ == 0) return;
    if (per_row_thread_) {
      int64_t block = std::min<int64_t>(out.block_size(), (rows_ + 31) / 32 * 32);
      out.kernel(s, std::min<int64_t>((rows_ + block - 1) / block, kMaxRowBlocks), block);
    } else {
      out.kernel(s, std::min<int64_t>(rows_, kMaxRowBlocks), threads_);
    }
  }

  int64_t threads() const { return threads_; }

 private:
  std::string ctype_acc() const { return T_; }
  std::string identity(Fold f) const {
    bool fl = is_float(t_);
    std::string inf = t_ == DType::f32 ? "kiln_f32_bits(0x7f800000u)" : "kiln_f64_bits(0x7ff0000000000000ull)";
    std::string ninf = "(-" + inf + ")";
    switch (f) {
      case Fold::FloatSum:
      case Fold::IntSum: return "(" + T_ + ")0";
      case Fold::Max:
      case Fold::Argmax:
      case Fold::Greater:
        return fl ? ninf : t_ == DType::i32 ? "(-2147483647 - 1)" : "(-9223372036854775807LL - 1LL)";
      case Fold::Min: return fl ? inf : t_ == DType::i32 ? "2147483647" : "9223372036854775807LL";
    }
    return "0";
  }
  static std::string value_of(const std::string& value, const std::string& x) {
    if (value.empty()) return x;
    std::string v = value;
    for (size_t p; (p = v.find("$x")) != std::string::npos;) v.replace(p, 2, x);
    return v;
  }
  // acc := acc (+) x for element k.
  std::string step(Fold f) const {
    bool fl = is_float(t_);
    switch (f) {
      case Fold::FloatSum: return "acc = acc + x;";
      case Fold::IntSum: return "acc = kiln_add(acc, x);";
      case Fold::Max:
        return fl ? "if (kiln_isnan(x) || (!kiln_isnan(acc) && x > acc)) acc = x;" : "if (x > acc) acc = x;";
      case Fold::Min:
        return fl ? "if (kiln_isnan(x) || (!kiln_isnan(acc) && x < acc)) acc = x;" : "if (x < acc) acc = x;";
      case Fold::Argmax:
        return fl ? "if (!kiln_isnan(acc) && (kiln_isnan(x) || x > acc)) { acc = x; acci = (i32)k; }"
                  : "if (x > acc) { acc = x; acci = (i32)k; }";
      case Fold::Greater: return "if (x > acc) acc = x;";
    }
    return "";
  }
  // acc := acc (+) o, where o is the partial of the elements right of acc's.
  std::string combine(Fold f, const std::string& o, const std::string& oi) const {
    bool fl = is_float(t_);
    switch (f) {
      case Fold::FloatSum: return "acc = acc + " + o + ";";
      case Fold::IntSum: return "acc = kiln_add(acc, " + o + ");";
      case Fold::Max:
        return fl ? "{ if (kiln_isnan(" + o + ") || (!kiln_isnan(acc) && " + o + " > acc)) acc = " + o + "; }"
                  : "{ if (" + o + " > acc) acc = " + o + "; }";
      case Fold::Min:
        return fl ? "{ if (kiln_isnan(" + o + ") || (!kiln_isnan(acc) && " + o + " < acc)) acc = " + o + "; }"
                  : "{ if (" + o + " < acc) acc = " + o + "; }";
      case Fold::Argmax:
        return fl ? "{ if (!kiln_isnan(acc) && (kiln_isnan(" + o + ") || " + o + " > acc)) { acc = " + o + "; acci = " + oi + "; } }"
                  : "{ if (" + o + " > acc) { acc = " + o + "; acci = " + oi + "; } }";
      case Fold::Greater: return "{ if (" + o + " > acc) acc = " + o + "; }";
    }
    return "";
  }

  DType t_;
  std::string T_;
  int64_t rows_, len_;
  Shape kept_;
  std::vector<int64_t> kept_st_;
  Shape red_;
  std::vector<int64_t> red_st_;
  std::string it_;
  int64_t leaves_ = 1, threads_ = 1, group_ = 1;
  bool per_row_thread_ = true;
  std::string element_;
};

namespace {

// The kept and reduced dims of x for `axes` (sorted, normalized), with x's strides.
RowKernel rows_of(DType t, const Shape& xs, const std::vector<bool>& reduced, int64_t extent) {
  std::vector<int64_t> st = strides_of(xs);
  Shape kept, red;
  std::vector<int64_t> kst, rst;
  int64_t rows = 1, len = 1;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (reduced[d]) {
      red.push_back(xs[d]);
      rst.push_back(st[d]);
      len *= xs[d];
    } else {
      kept.push_back(xs[d]);
      kst.push_back(st[d]);
      rows *= xs[d];
    }
  }
  return RowKernel(t, rows, len, kept, kst, red, rst, extent);
}

}  // namespace

void render_reduce(Emitter& out, const Graph& g, const Node& n, const std::string& x, const std::string& y) {
  const TensorType& xt = g.type(n.operands[0]);
  DType t = xt.dtype;
  std::vector<bool> reduced(xt.shape.size(), false);
  if (n.op == Op::Argmax) {
    int64_t a = attr_int(n.attrs, "axis");
    reduced[static_cast<size_t>(a < 0 ? a + xt.rank() : a)] = true;
  } else {
    const auto& axes = attr_ints(n.attrs, "axes");
    for (int64_t a : axes) reduced[static_cast<size_t>(a < 0 ? a + xt.rank() : a)] = true;
    if (axes.empty()) reduced.assign(reduced.size(), true);
  }
  RowKernel rk = rows_of(t, xt.shape, reduced, xt.numel());
  Fold f = Fold::FloatSum;
  switch (n.op) {
    case Op::Sum: f = is_float(t) ? Fold::FloatSum : Fold::IntSum; break;
    case Op::Mean: f = Fold::FloatSum; break;
    case Op::Max: f = Fold::Max; break;
    case Op::Min: f = Fold::Min; break;
    case Op::Argmax: f = Fold::Argmax; break;
    default: internal_error("reduce", "cuda render: " + std::string(op_name(n.op)) + " is not a reduction");
  }
  int64_t count = 1;
  for (size_t d = 0; d < reduced.size(); ++d)
    if (reduced[d]) count *= xt.shape[d];
  std::string T = ctype(t);
  std::string body = rk.thread_fold(f, "X", "", 4) + rk.block_tree(f, 4);
  std::string result = f == Fold::Argmax ? "acci" : n.op == Op::Mean ? "acc / (" + T + ")" + std::to_string(count) : "acc";
  std::string write = rk.per_row_thread() ? "    Y[r] = " + result + ";\n" : "    if (threadIdx.x == 0) Y[r] = " + result + ";\n";
  std::string decls = T + "* X = " + x + "; " + ctype(g.type(n.result()).dtype) + "* Y = " + y + ";\n";
  rk.emit(out, decls, body + write, f == Fold::Argmax);
}

void row_sum(Emitter& out, DType t, int64_t rows, int64_t len, const std::string& decls, const std::string& row,
             const std::string& element, const std::string& write) {
  RowKernel rk(t, rows, len, {rows}, {1}, {len}, {1}, std::max(rows, len));
  rk.set_element(element);
  std::string body = row + rk.thread_fold(Fold::FloatSum, "", "", 4) + rk.block_tree(Fold::FloatSum, 4);
  body += rk.per_row_thread() ? write : "    if (threadIdx.x == 0) {\n" + write + "    }\n";
  rk.emit(out, decls, body, false);
}

void render_softmax(Emitter& out, const Graph& g, const Node& n, const std::string& x, const std::string& y) {
  const TensorType& xt = g.type(n.operands[0]);
  DType t = xt.dtype;
  std::string T = ctype(t);
  int64_t axis = attr_int(n.attrs, "axis");
  std::vector<bool> reduced(xt.shape.size(), false);
  reduced[static_cast<size_t>(axis < 0 ? axis + xt.rank() : axis)] = true;
  RowKernel rk = rows_of(t, xt.shape, reduced, xt.numel());
  bool log = n.op == Op::LogSoftmax;
  // The max (from -inf, NaN never wins), the sum of exp(x - max) in the summation order,
  // then every element: exp(x - max) / sum, or x - max - log(sum).
  std::string body = "    " + T + " m, total;\n";
  body += "    {\n" + rk.thread_fold(Fold::Greater, "X", "", 6) + rk.block_tree(Fold::Greater, 6) + "      m = acc;\n    }\n";
  body += "    {\n" + rk.thread_fold(Fold::FloatSum, "X", fn("exp", t) + "($x - m)", 6) + rk.block_tree(Fold::FloatSum, 6) +
          "      total = acc;\n    }\n";
  std::string lo = rk.per_row_thread() ? "0" : "threadIdx.x";
  std::string step = rk.per_row_thread() ? "1" : std::to_string(rk.threads());
  int64_t len = 1;
  for (size_t d = 0; d < reduced.size(); ++d)
    if (reduced[d]) len = xt.shape[d];
  if (log) body += "    " + T + " lt = " + fn("log", t) + "(total);\n";
  body += "    for (" + rk.itype() + " k = " + lo + "; k < " + std::to_string(len) + "; k += " + step + ") {\n";
  body += rk.elem_offset(6);
  body += log ? "      Y[rb0 + ko0] = X[rb0 + ko0] - m - lt;\n"
              : "      Y[rb0 + ko0] = " + fn("exp", t) + "(X[rb0 + ko0] - m) / total;\n";
  body += "    }\n";
  rk.emit(out, T + "* X = " + x + "; " + T + "* Y = " + y + ";\n", body, false);
}

// layer_norm: per row, the mean and then the variance in the summation order (as the
// interpreter adds them), then (x - mean) * inv * scale + bias for every element.
void render_layer_norm(Emitter& out, const Graph& g, const Node& n, const std::vector<std::string>& in,
                       const std::string& y) {
  const TensorType& xt = g.type(n.operands[0]);
  DType t = xt.dtype;
  std::string T = ctype(t);
  const int64_t rank = xt.rank(), a = attr_int(n.attrs, "axis"), axis = a < 0 ? a + rank : a;
  std::vector<bool> reduced(xt.shape.size(), false);
  int64_t len = 1;
  for (int64_t d = axis; d < rank; ++d) {
    reduced[static_cast<size_t>(d)] = true;
    len *= xt.shape[static_cast<size_t>(d)];
  }
  if (len == 0) return;
  RowKernel rk = rows_of(t, xt.shape, reduced, xt.numel());
  std::string count = "(" + T + ")" + std::to_string(len);
  std::string body = "    " + T + " mean, inv;\n";
  body += "    {\n" + rk.thread_fold(Fold::FloatSum, "X", "", 6) + rk.block_tree(Fold::FloatSum, 6) + "      mean = acc / " +
          count + ";\n    }\n";
  body += "    {\n" + rk.thread_fold(Fold::FloatSum, "X", "($x - mean) * ($x - mean)", 6) + rk.block_tree(Fold::FloatSum, 6) +
          "      inv = (" + T + ")1 / " + fn("sqrt", t) + "(acc / " + count + " + " +
          literal(Tensor::scalar(DType::f64, attr_float(n.attrs, "epsilon")).cast(t), 0) + ");\n    }\n";
  std::string lo = rk.per_row_thread() ? "0" : "threadIdx.x";
  std::string step = rk.per_row_thread() ? "1" : std::to_string(rk.threads());
  body += "    for (" + rk.itype() + " k = " + lo + "; k < " + std::to_string(len) + "; k += " + step + ") {\n";
  body += rk.elem_offset(6);  // ko0 == k: the row is x's trailing dims
  body += "      Y[rb0 + ko0] = (X[rb0 + ko0] - mean) * inv * S[ko0]" + std::string(in.size() > 2 ? " + B[ko0]" : "") +
          ";\n    }\n";
  std::string decls = T + "* X = " + in[0] + "; " + T + "* S = " + in[1] + "; " + T + "* Y = " + y + ";";
  if (in.size() > 2) decls += " " + T + "* B = " + in[2] + ";";
  rk.emit(out, decls + "\n", body, false);
}

}  // namespace kiln::cuda::detail
