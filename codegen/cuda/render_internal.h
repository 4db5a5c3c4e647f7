// Pieces shared by the CUDA renderer's files (render.cpp: the plan walk, launches and
// prelude; render_expr.cpp: ops as C expressions and exact literals; render_kernels.cpp:
// the kernels of the non-elementwise ops). Not a public API.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "codegen/cuda/render.h"
#include "ir/graph.h"
#include "ir/strides.h"

namespace kiln::cuda::detail {

// --- render_expr.cpp ---------------------------------------------------------------------

// The prelude's name of a dtype's C type: f32, f64, i32, i64, u8 (bool).
std::string ctype(DType t);
// An exact C literal: element i of t in t's dtype (hex floats; bit patterns for inf/NaN).
std::string literal(const Tensor& t, int64_t i);
// An i64 literal ("-5LL").
std::string lit(int64_t v);
// The C expression of one elementwise op over operand expressions `a` (plain names or
// literals, each used possibly more than once). `in` is the operands' dtype (the second
// operand's for select), `out` the result's. Internal error for a non-elementwise op.
std::string ew_expr(const Node& n, DType in, DType out, const std::vector<std::string>& a);
// A math function of the operand's float dtype: fn("exp", f32) = "expf".
std::string fn(const char* name, DType t);
// The prelude (typedefs and the helpers ew_expr and the kernels call).
std::string prelude();

// --- index arithmetic --------------------------------------------------------------------

// A strided walk over a row-major shape: one stride per dim (elements; 0 = broadcast).
using Stream = StridedView;

// The C type of indices for a kernel whose indices stay below `extent`: i32 when that
// leaves room for a grid-stride step, else i64.
std::string index_type(int64_t extent);

// Writes code that declares `prefix`0.. = the offsets of each stream at row-major position
// `idx` of `shape` (dims of size 1 dropped, adjacent dims merged where every stream allows).
// A stream that is contiguous from 0 gets `idx` itself.
std::string stream_offsets(const Shape& shape, const std::vector<Stream>& streams, const std::string& idx,
                           const std::string& itype, const std::string& prefix, const std::string& indent);

// --- kernels -----------------------------------------------------------------------------

// Collects the kernels of one program (one NVRTC source) and their launches, in order.
class Emitter {
 public:
  explicit Emitter(int block_size) : block_size_(block_size) {}
  int block_size() const { return block_size_; }
  void set_node(int32_t node) { node_ = node; }
  // A comment put before the next kernels (what they compute), for readers of the source.
  void set_label(std::string label) { label_ = std::move(label); }
  // Adds `extern "C" __global__ void kiln_kN(...) { body }` launched on grid x block.
  void kernel(const std::string& body, int64_t grid, int64_t block);
  // A grid-stride loop kernel over n elements: `body` is the loop body, with the index
  // `i` of type `itype` (index_type(extent)) in scope. Nothing for n == 0.
  void elementwise(int64_t n, int64_t extent, const std::string& decls, const std::string& body);
  void gemm(const GemmLaunch& g);
  void all_reduce(const CollectiveLaunch& c);  // in place (render.h CollectiveLaunch)
  void copy(const Ref& dst, const Ref& src, int64_t bytes);
  // Renderer-private scratch for one kernel's intermediates (conv2d_grad_weight's
  // partial sums): `bytes` at the same address for every caller, after all of the kernel
  // plan's scratch. The launches run in order on one stream, so the kernels that use it
  // take turns; the area is the largest request.
  Ref scratch(int64_t bytes);
  void set_scratch_offset(int64_t offset) { scratch_offset_ = offset; }
  int64_t scratch_bytes() const { return scratch_bytes_; }
  std::string source() const { return source_; }
  std::vector<Launch>& launches() { return launches_; }

 private:
  int block_size_;
  int32_t node_ = -1;
  int kernels_ = 0;
  std::string label_;
  std::string source_;
  std::vector<Launch> launches_;
  int64_t scratch_offset_ = -1, scratch_bytes_ = 0;
};

// A C pointer expression of element type t at ref: "((f32*)(arena + 64))".
std::string pointer(const Ref& r, DType t);

// Y[r] = the float sum over k < len of x(r, k) for r < rows, in the summation order (a row
// of more than 64 terms by one block of threads): `row` declares what the row needs (r in
// scope), `element` assigns x (r and k in scope), `write` stores acc. For kernels whose
// reduction is not a plain strided row (conv2d_grad_weight).
void row_sum(Emitter& out, DType t, int64_t rows, int64_t len, const std::string& decls, const std::string& row,
             const std::string& element, const std::string& write);

// Renders the kernel of one non-elementwise, non-GEMM, non-region node `n` of `g`; ptr(v)
// is the pointer expression of value v (operands and the result).
void render_op(Emitter& out, const Graph& g, const Node& n, const std::function<std::string(ValueId)>& ptr);

}  // namespace kiln::cuda::detail
