// Internal to codegen/cpu: the Lowerer, which turns a planned graph into an LLVM module.
// Its members live in one file per concern:
//   emitter.cpp     the class itself: types, constants, memory, loops, parallel loops
//   scalar_ops.cpp  elementwise ops on scalars (ew), casts, libm calls
//   op_kernels.cpp  kernels of one node: reductions, argmax, softmax, shape ops, GEMM and
//                   the runtime's convolution / pooling
//   lower.cpp       the graph, kernel by kernel, from the kernel plan (lower_graph)
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "codegen/cpu/layout.h"
#include "codegen/cpu/lower.h"
#include "ir/graph.h"
#include "ir/strides.h"
#include "passes/kernel_plan.h"
#include "passes/memory_plan.h"
#include "runtime/abi.h"
#include "runtime/kernels.h"

namespace kiln::cpu::detail {

using RtFn = rt::Fn;  // runtime/abi.def

using llvm::Value;

// What the constants of one module may take in all (each is stored in the module and again
// in the JIT'ed code): a splat that only fused loops read takes nothing.
inline constexpr int64_t kMaxConstantBytes = int64_t{1} << 30;

using Stream = StridedView;  // per dim of the iteration shape (elements; 0 = broadcast)

class Lowerer {
 public:
  Lowerer(const Graph& g, const MemoryPlan& plan, const KernelPlan& kp, llvm::LLVMContext& ctx, LoweringInfo& info,
          const LowerOptions& options);
  std::unique_ptr<llvm::Module> run();

 private:
  // ---- emitter.cpp: types, constants, memory, loops -----------------------------------
  Value* c64(int64_t v) { return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(v), true); }
  void store(DType t, Value* v, Value* base, Value* off) {
    mark_access(B_.CreateStore(v, B_.CreateInBoundsGEP(ty(t), base, off)));
  }
  // Inside an elementwise loop kernel (lower_loop) every load and store joins the loop's
  // access group and every loop's latch says its iterations are independent
  // (llvm.loop.parallel_accesses): an in-place loop writes each element only after reading
  // it, and reads nothing another iteration writes, which LLVM cannot prove through the
  // task context's pointers; without this its vectorized loop checked the pointers at run
  // time and ran the scalar fallback whenever the output was the input's own buffer.
  void mark_access(llvm::Instruction* i) {
    if (access_group_) i->setMetadata(llvm::LLVMContext::MD_access_group, access_group_);
  }
  // Every loop's latch: parallel_accesses in an access group, and llvm.loop.unroll.disable
  // when `outer` (another loop was closed inside it: loops_closed_ moved).
  void mark_latch(llvm::Instruction* br, bool outer);
  int64_t loops_closed_ = 0;
  llvm::MDNode* access_group_ = nullptr;
  Value* intrinsic(llvm::Intrinsic::ID id, Value* x) { return B_.CreateUnaryIntrinsic(id, x); }
  Value* is_nan(Value* x) { return B_.CreateFCmpUNO(x, x); }
  llvm::Type* ty(DType t);
  Value* scalar(DType t, double v);
  Value* element_constant(const Tensor& t, int64_t i);
  Value* splat(const Graph& g, ValueId v);
  Value* global_constant(const Node& n);
  // The private constant global of `init` (a ConstantDataArray), and whether it is new.
  std::pair<llvm::GlobalVariable*, bool> data_global(llvm::Constant* init, const char* name, uint64_t align);
  Value* i64_array(const std::vector<int64_t>& xs);
  Value* load(DType t, Value* base, Value* off);
  Value* alloca(llvm::Type* t);
  Value* scratch(int64_t bytes, int64_t& cursor);
  void copy_bytes(Value* dst, Value* src, int64_t bytes);
  // True when top-level values a and b of `g` sit at the same arena bytes (a reshape the
  // memory plan wrote in place: nothing to copy).
  // Whether the memory plan put arena value a at b's bytes (plus bytes_in: a concat
  // operand in its slice of the result).
  bool same_storage(const Graph& g, ValueId a, ValueId b, int64_t bytes_in = 0) const;
  llvm::FunctionCallee runtime(RtFn f);  // declared from runtime/abi.def
  llvm::FunctionCallee external(const std::string& name, llvm::FunctionType* type);
  // `keep`: the loop stays a loop (its latch says not to unroll it), for a short innermost
  // loop the vectorizer must see: fully unrolled, its enclosing loop became the innermost
  // and was vectorized instead, with gathers and scatters.
  void for_loop(int64_t n, const std::function<void(Value*)>& body, bool keep = false);
  void if_then(Value* cond, const std::function<void()>& then);
  std::pair<Value*, Value*> load_index(DType t, Value* indices, Value* i, int64_t d);
  void lower_gather(const Node& n, const TensorType& x, const TensorType& idx, Value* xp, Value* ip, Value* out,
                    const TensorType& rt);
  void lower_gather_grad(const Node& n, const TensorType& dy, const TensorType& idx, Value* dyp, Value* ip,
                         Value* out, const TensorType& rt);
  void lower_layer_norm(const Node& n, const TensorType& x, const std::vector<Value*>& in, Value* out);
  void lower_batch_norm(const Node& n, const TensorType& x, const std::vector<Value*>& in, Value* out);
  void lower_dropout(const Node& n, const TensorType& x, const std::vector<Value*>& in, Value* out);
  Value* philox_word0(Value* i, int64_t stream, Value* seed, Value* counter);
  void for_range(Value* lo, Value* hi, const std::function<void(Value*)>& body);
  void par_for(int64_t n, int64_t work, const std::function<void(Value*)>& body);
  std::pair<llvm::Function*, Value*> outline(const std::string& name, const std::vector<llvm::Type*>& extra,
                                             const std::function<void(llvm::Function*)>& body);
  // ---- share.cpp: one function per distinct top-level kernel ----------------------------
  // Emits `body` (one top-level kernel) into an internal function kiln_kernel.N(ctx) called
  // from here, its buffers' pointers passed in ctx (outline). With LowerOptions::share_kernels,
  // a function (and a parallel loop's task function) equal instruction for instruction to
  // one emitted before is deleted and the earlier one called instead.
  void kernel_function(const std::function<void()>& body);
  // The earlier function equal to `f` (FunctionComparator), or null; registers `f` if none.
  llvm::Function* same_function(llvm::Function* f);
  // Marks the kernel functions noinline where they are called more than once or the graph
  // is large (kNodesInEntry); a small graph's other kernels are inlined into the entry.
  void finish_kernel_functions(bool large);
  llvm::BasicBlock* kernel_caller_ = nullptr;  // while emitting a kernel function: its caller's block
  struct SharedFunctions;
  std::shared_ptr<SharedFunctions> shared_;
  // `keep_short_inner`: an innermost loop (after merging) of at most 16 iterations stays a
  // loop (for_loop's `keep`), so that it is vectorized as one step (an NCHW16c loop's 16
  // channels beside a broadcast operand: unrolled, they stayed scalar).
  void nest(const Shape& shape, std::vector<Stream> streams, const std::function<void(const std::vector<Value*>&)>& body,
            int64_t ops = 0, bool keep_short_inner = false);
  void nest_level(const Shape& dims, const std::vector<std::vector<int64_t>>& st, size_t d, const std::vector<Value*>& off,
                  const std::function<void(const std::vector<Value*>&)>& body, bool keep_inner = false);

  // ---- scalar_ops.cpp -----------------------------------------------------------------
  Value* libm(const char* f32_name, const char* f64_name, Value* x);
  Value* odd_rational(Value* a, float clamp, std::span<const float> p, std::span<const float> q);
  // exp and sigmoid of a float scalar: numerics/math.h's for f32 (bitwise the interpreter's,
  // no call, so the loop vectorizes), libm's exp for f64.
  Value* exp(Value* x);
  Value* sigmoid(Value* x);
  Value* cast_scalar(Value* x, DType from, DType to);
  Value* ew(const Node& n, DType in, DType out, const std::vector<Value*>& a);
  Value* compare(const std::vector<Value*>& a, DType in, llvm::CmpInst::Predicate f, llvm::CmpInst::Predicate s,
                 llvm::CmpInst::Predicate u);

  // ---- op_kernels.cpp -----------------------------------------------------------------
  [[noreturn]] void unsupported(Op op);
  void lower_node(const Graph& g, const Kernel& kernel, std::vector<Value*>& ptr, int64_t& cursor);
  void copy_strided(DType t, const Shape& shape, Value* dst, Stream ds, Value* src, Stream ss);
  Value* conv_params(const Node& n, const Shape& x, const Shape& w, const Shape& y);
  bool lower_conv_epilogue(const Graph& g, const Node& n, const std::vector<Value*>& ptr);
  // The layout argument (KILN_LAYOUT_*) of a kernel of `g` reading x and writing y: 0 but
  // at the top level, where nchwc_ (nchwc_values) says.
  int32_t layout_of(const Graph& g, ValueId x, ValueId y) const {
    if (&g != &g_ || nchwc_.empty()) return 0;
    return (nchwc_[static_cast<size_t>(x.id)] ? KILN_LAYOUT_X_NCHW16C : 0) |
           (nchwc_[static_cast<size_t>(y.id)] ? KILN_LAYOUT_Y_NCHW16C : 0);
  }
  std::vector<bool> nchwc_;
  // While a fused elementwise region whose result is in NCHW16c is lowered: that result's
  // shape, which its body's values of that shape share with it (layout.cpp); else empty.
  Shape blocked_body_;
  // ---- attention.cpp: a fuse_attention body as one runtime call (false: not one) -----
  bool lower_attention(const Node& n, const std::vector<Value*>& ptr);
  Value* pool_params(const Node& n, const Shape& x, const Shape& y);
  // A runtime parameter struct as the constant i64 array it is laid out as (runtime/kernels.h).
  template <typename Params>
  Value* params_array(const Params& q) {
    std::vector<int64_t> fields(sizeof(Params) / sizeof(int64_t));
    std::memcpy(fields.data(), &q, sizeof(Params));
    return i64_array(fields);
  }
  Value* blocked_sum(DType t, int64_t n, const std::function<Value*(Value*)>& elem);
  // Where a row's elements lie (blocked_row_sums): row j's element k at j * row_stride +
  // (k / inner) * outer_stride + (k % inner) * inner_stride.
  struct RowRuns {
    int64_t row_stride, inner, inner_stride, outer_stride;
  };
  void blocked_row_sums(DType t, int64_t rows, Value* j0, int64_t n, const RowRuns& runs, Value* x, Value* out, bool mean);
  void column_sums(DType t, int64_t k1, int64_t r, int64_t k2, Value* x, Value* out, bool mean, int64_t& cursor);
  void transpose16(std::array<Value*, 16>& r);
  void sixteen_row_sums(Value* j0, int64_t n, const RowRuns& runs,
                        const std::function<void(Value*, std::array<Value*, 16>&)>& chunk, Value* out, bool mean);
  // Whether m rows laid out as `runs` go sixteen at a time (sixteen_row_sums).
  static bool sixteen_rows(const RowRuns& runs, int64_t m) { return runs.inner_stride == 1 && runs.inner % 16 == 0 && m >= 16; }
  struct ReduceView {
    Shape order[3];
    std::vector<int64_t> src[3];
    bool in_order = true;  // x already is [K1, R, K2]
    std::optional<RowRuns> rows;
  };
  static ReduceView reduce_view(const Shape& shape, const std::set<int64_t>& axes);
  void lower_reduce(const Node& n, const TensorType& xt, const TensorType& rt, Value* x, Value* out, int64_t& cursor);
  static void split_axis(const Node& n, const TensorType& xt, int64_t& outer, int64_t& len, int64_t& inner);
  void lower_argmax(const Node& n, const TensorType& xt, Value* x, Value* out);
  void outer_inner(int64_t outer, int64_t inner, int64_t len, const std::function<void(Value*, Value*)>& body);
  void lower_softmax(const Node& n, const TensorType& xt, Value* x, Value* out);
  void lower_matmul(const Graph& g, const Node& n, const Kernel& k, std::vector<Value*>& ptr);

  // ---- lower.cpp: the graph from the kernel plan --------------------------------------
  void lower_level(const Graph& g, const KernelPlan& kp, std::vector<Value*>& ptr, bool top, int64_t& cursor,
                   const std::vector<Value*>& out_ptr = {});
  void lower_loop(const Graph& g, const Kernel& k, std::vector<Value*>& ptr);
  std::map<int32_t, Value*> loop_element(const Graph& g, const Kernel& k, const std::vector<Value*>& ptr,
                                         const std::vector<Value*>& at);
  std::optional<std::vector<int64_t>> fold_reduce_loads(const Graph& g, const KernelPlan& kp, size_t q);
  void lower_folded_reduce(const Graph& g, const Kernel& loop, const Kernel& red, const std::vector<int64_t>& row_strides,
                           std::vector<Value*>& ptr);
  static std::set<int64_t> reduce_axes(const Node& n, int64_t rank);

  const Graph& g_;
  const MemoryPlan& plan_;
  const KernelPlan& kp_;
  llvm::LLVMContext& C_;
  LoweringInfo& info_;
  LowerOptions options_;
  llvm::IRBuilder<> B_;
  std::unique_ptr<llvm::Module> M_;
  llvm::Function* F_ = nullptr;
  llvm::BasicBlock* alloca_block_ = nullptr;
  llvm::Type *i8_, *i32_, *i64_, *ptr_;
  Value* scratch_ = nullptr;
  int64_t scratch_peak_ = 0;
  int64_t constant_bytes_ = 0;  // of the globals so far
  // Globals of equal contents are one global (constants and runtime parameter arrays), so
  // that kernels equal but for them are one function: by initializer (data_global).
  std::map<llvm::Constant*, llvm::GlobalVariable*> globals_;
  // LowerOptions::constants_by_address: the symbol of each addressed tensor's data.
  std::map<const void*, llvm::GlobalVariable*> addressed_;
  // LowerOptions::gemm_cache: the table of cache slots (loaded in the entry), the slots
  // used so far, and per value of the graph being lowered (the top level or a fused body)
  // whether it is a weight: a state input or a constant of the top level, or a body input
  // bound to one.
  Value* gemm_cache_ = nullptr;
  int64_t gemm_cache_slots_ = 0;
  std::vector<bool> weight_;
  // Whether a kernel may keep `v` (of the graph being lowered) packed in a cache slot: a
  // weight, read outside any parallel loop (a slot is not shared between threads).
  bool cacheable_weight(ValueId v) const;
  // A new slot of the table: its address, made where the kernel function is called.
  Value* weight_cache_slot();
  bool outlining_ = false;  // emitting the body of a parallel loop's task function
  int tasks_ = 0;
  std::set<std::string> runtime_;
};

}  // namespace kiln::cpu::detail
