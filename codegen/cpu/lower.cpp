// Graph -> LLVM IR for the CPU backend. One function, kiln_entry, runs every node of the
// planned graph in order: elementwise chains become one loop nest each (fused bodies keep
// their intermediates in registers), reductions / softmax / shape ops are generated loops,
// matmul and convolution/pooling call the runtime (runtime/blas.h, runtime/kernels.h).
#include "codegen/cpu/lower.h"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <type_traits>
#include <utility>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include "ir/error.h"
#include "ir/interp.h"
#include "ir/ops.h"
#include "runtime/abi.h"

namespace kiln::cpu::detail {

namespace {

// What the constants of one module may take in all (each is stored in the module and again
// in the JIT'ed code): a splat that only fused loops read takes nothing.
constexpr int64_t kMaxConstantBytes = int64_t{1} << 30;

using llvm::Value;
using RtFn = rt::Fn;

struct Stream {
  std::vector<int64_t> strides;  // per dim of the iteration shape (elements; 0 = broadcast)
  int64_t base = 0;
};

std::vector<int64_t> broadcast_strides(const Shape& from, const Shape& to) {
  std::vector<int64_t> s(to.size(), 0);
  std::vector<int64_t> fs = strides_of(from);
  size_t off = to.size() - from.size();
  for (size_t d = 0; d < from.size(); ++d) s[off + d] = from[d] == 1 ? 0 : fs[d];
  return s;
}

// The LLVM type of a type of runtime/abi.def's vocabulary (runtime/abi.h).
template <typename T>
llvm::Type* abi_type(llvm::LLVMContext& C) {
  using namespace rt::abi;
  if constexpr (std::is_void_v<T>) return llvm::Type::getVoidTy(C);
  else if constexpr (std::is_same_v<T, ptr>) return llvm::PointerType::get(C, 0);
  else if constexpr (std::is_same_v<T, i32>) return llvm::Type::getInt32Ty(C);
  else if constexpr (std::is_same_v<T, i64>) return llvm::Type::getInt64Ty(C);
  else if constexpr (std::is_same_v<T, f32>) return llvm::Type::getFloatTy(C);
  else {
    static_assert(std::is_same_v<T, f64>, "a type outside runtime/abi.def's vocabulary");
    return llvm::Type::getDoubleTy(C);
  }
}
template <typename F>
struct AbiFunction;
template <typename R, typename... A>
struct AbiFunction<R(A...)> {
  static llvm::FunctionType* get(llvm::LLVMContext& C) {
    std::vector<llvm::Type*> params{abi_type<A>(C)...};
    return llvm::FunctionType::get(abi_type<R>(C), params, false);
  }
};

// The name and LLVM type of runtime function f, from its line in runtime/abi.def.
std::pair<const char*, llvm::FunctionType*> runtime_function(RtFn f, llvm::LLVMContext& C) {
  using namespace rt::abi;
  switch (f) {
#define KILN_RT(name, ret, ...) \
  case RtFn::name: return {#name, AbiFunction<ret(__VA_ARGS__)>::get(C)};
#include "runtime/abi.def"
#undef KILN_RT
  }
  internal_error("codegen", "cpu codegen: a runtime function outside runtime/abi.def");
}

bool is_last_two_swap(const std::vector<int64_t>& perm) {
  size_t r = perm.size();
  if (r < 2) return false;
  for (size_t d = 0; d + 2 < r; ++d)
    if (perm[d] != static_cast<int64_t>(d)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

class Lowerer {
 public:
  Lowerer(const Graph& g, const MemoryPlan& plan, llvm::LLVMContext& ctx, LoweringInfo& info, const LowerOptions& options)
      : g_(g), plan_(plan), C_(ctx), info_(info), options_(options), B_(ctx) {
    M_ = std::make_unique<llvm::Module>("kiln_" + g.name(), ctx);
    i8_ = B_.getInt8Ty();
    i32_ = B_.getInt32Ty();
    i64_ = B_.getInt64Ty();
    ptr_ = B_.getPtrTy();
  }

  std::unique_ptr<llvm::Module> run() {
    auto* fty = llvm::FunctionType::get(B_.getVoidTy(), {ptr_, ptr_}, false);
    F_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, "kiln_entry", M_.get());
    F_->addFnAttr(llvm::Attribute::NoUnwind);
    llvm::BasicBlock* entry = llvm::BasicBlock::Create(C_, "entry", F_);
    B_.SetInsertPoint(entry);
    alloca_block_ = entry;
    Value* buffers = F_->getArg(0);
    Value* arena = F_->getArg(1);
    info_.arena_bytes = plan_.report.arena_bytes;
    scratch_ = B_.CreateConstInBoundsGEP1_64(i8_, arena, static_cast<uint64_t>(align_up(plan_.report.arena_bytes, 64)));

    // Pointers of every top-level value.
    std::vector<Value*> ptr(g_.values().size(), nullptr);
    std::vector<Value*> input_ptr(g_.inputs().size(), nullptr);
    for (size_t i = 0; i < g_.inputs().size(); ++i) {
      Value* slot = B_.CreateConstInBoundsGEP1_64(ptr_, buffers, i);
      input_ptr[i] = B_.CreateLoad(ptr_, slot, "in." + g_.value(g_.inputs()[i].value).name);
      ptr[g_.inputs()[i].value.id] = input_ptr[i];
    }
    for (size_t v = 0; v < g_.values().size(); ++v) {
      const ValuePlan& vp = plan_.values[v];
      if (vp.kind == BufferKind::Arena)
        ptr[v] = B_.CreateConstInBoundsGEP1_64(i8_, arena, static_cast<uint64_t>(vp.offset));
      else if (vp.kind == BufferKind::StateInPlace)
        ptr[v] = input_ptr.at(static_cast<size_t>(g_.value(vp.state).input));
    }
    lower_nodes(g_, ptr, /*top=*/true);
    B_.CreateRetVoid();
    info_.scratch_bytes = scratch_peak_;
    info_.parallel_loops = tasks_;
    for (const auto& s : runtime_) info_.runtime_symbols.push_back(s);
    return std::move(M_);
  }

 private:
  // ---- Types, constants, memory -------------------------------------------------------
  llvm::Type* ty(DType t) {
    switch (t) {
      case DType::f32: return B_.getFloatTy();
      case DType::f64: return B_.getDoubleTy();
      case DType::i32: return i32_;
      case DType::i64: return i64_;
      case DType::boolean: return i8_;
    }
    return i8_;
  }
  Value* c64(int64_t v) { return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(v), true); }
  // A scalar of dtype t with value v (exact for the dtype's range).
  Value* scalar(DType t, double v) {
    switch (t) {
      case DType::f32: return llvm::ConstantFP::get(B_.getFloatTy(), static_cast<double>(static_cast<float>(v)));
      case DType::f64: return llvm::ConstantFP::get(B_.getDoubleTy(), v);
      case DType::i32: return llvm::ConstantInt::get(i32_, static_cast<uint64_t>(static_cast<int64_t>(v)), true);
      case DType::i64: return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(static_cast<int64_t>(v)), true);
      case DType::boolean: return llvm::ConstantInt::get(i8_, v != 0 ? 1 : 0);
    }
    return nullptr;
  }
  Value* element_constant(const Tensor& t, int64_t i) {
    const std::byte* p = t.raw() + static_cast<size_t>(i) * dtype_size(t.dtype());
    switch (t.dtype()) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); return llvm::ConstantFP::get(B_.getFloatTy(), static_cast<double>(f)); }
      case DType::f64: { double d; std::memcpy(&d, p, 8); return llvm::ConstantFP::get(B_.getDoubleTy(), d); }
      case DType::i32: { int32_t x; std::memcpy(&x, p, 4); return llvm::ConstantInt::get(i32_, static_cast<uint64_t>(static_cast<int64_t>(x)), true); }
      case DType::i64: { int64_t x; std::memcpy(&x, p, 8); return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(x), true); }
      case DType::boolean: { uint8_t x; std::memcpy(&x, p, 1); return llvm::ConstantInt::get(i8_, x); }
    }
    return nullptr;
  }
  // A splat constant node's scalar, or null.
  Value* splat(const Graph& g, ValueId v) {
    const Node* n = g.defining_node(v);
    if (!n || n->op != Op::Constant) return nullptr;
    const Tensor& val = attr_tensor(n->attrs, "value");
    if (val.numel() != 1 && !val.is_splat()) return nullptr;
    return element_constant(val, 0);
  }
  // The constant's value in full, as a private global. Every global's bytes are counted:
  // a module holds at most kMaxConstantBytes of them.
  Value* global_constant(const Node& n) {
    const Tensor& value = attr_tensor(n.attrs, "value");
    int64_t bytes = value.numel() * static_cast<int64_t>(dtype_size(value.dtype()));
    constant_bytes_ += bytes;
    if (constant_bytes_ > kMaxConstantBytes)
      throw Error("cpu codegen: the constants of @" + g_.name() + " need more than " +
                  std::to_string(kMaxConstantBytes >> 20) + " MiB in the compiled code (the one that crossed it is " +
                  value.type().str() + "); pass large tensors as graph inputs instead");
    Tensor t = value.materialized();
    llvm::StringRef raw(reinterpret_cast<const char*>(t.raw()), t.nbytes());
    llvm::Constant* init = llvm::ConstantDataArray::getRaw(raw, static_cast<uint64_t>(t.numel()), ty(t.dtype()));
    auto* gv = new llvm::GlobalVariable(*M_, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init, "const");
    gv->setAlignment(llvm::Align(64));
    gv->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
    return gv;
  }
  Value* i64_array(const std::vector<int64_t>& xs) {
    llvm::Constant* init = llvm::ConstantDataArray::get(C_, llvm::ArrayRef<uint64_t>(
        reinterpret_cast<const uint64_t*>(xs.data()), xs.size()));
    auto* gv = new llvm::GlobalVariable(*M_, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init, "params");
    gv->setAlignment(llvm::Align(8));
    return gv;
  }
  Value* load(DType t, Value* base, Value* off) {
    return B_.CreateLoad(ty(t), B_.CreateInBoundsGEP(ty(t), base, off));
  }
  void store(DType t, Value* v, Value* base, Value* off) { B_.CreateStore(v, B_.CreateInBoundsGEP(ty(t), base, off)); }
  Value* alloca(llvm::Type* t) {
    llvm::IRBuilder<> b(alloca_block_, alloca_block_->begin());
    return b.CreateAlloca(t);
  }
  Value* scratch(int64_t bytes, int64_t& cursor) {
    int64_t off = cursor;
    cursor = align_up(cursor + std::max<int64_t>(bytes, 1), 64);
    scratch_peak_ = std::max(scratch_peak_, cursor);
    return B_.CreateConstInBoundsGEP1_64(i8_, scratch_, static_cast<uint64_t>(off));
  }
  void copy_bytes(Value* dst, Value* src, int64_t bytes) {
    if (bytes > 0) B_.CreateMemMove(dst, llvm::MaybeAlign(), src, llvm::MaybeAlign(), static_cast<uint64_t>(bytes));
  }
  llvm::FunctionCallee runtime(RtFn f) {
    auto [name, type] = runtime_function(f, C_);
    return external(name, type);
  }
  llvm::FunctionCallee external(const std::string& name, llvm::FunctionType* type) {
    runtime_.insert(name);
    return M_->getOrInsertFunction(name, type);
  }
  Value* intrinsic(llvm::Intrinsic::ID id, Value* x) { return B_.CreateUnaryIntrinsic(id, x); }

  // ---- Loops --------------------------------------------------------------------------
  // for iv in [0, n): body(iv). n > 0.
  void for_loop(int64_t n, const std::function<void(Value*)>& body) {
    if (n <= 0) return;
    llvm::BasicBlock* pre = B_.GetInsertBlock();
    llvm::BasicBlock* header = llvm::BasicBlock::Create(C_, "loop", F_);
    llvm::BasicBlock* exit = llvm::BasicBlock::Create(C_, "loop.end", F_);
    B_.CreateBr(header);
    B_.SetInsertPoint(header);
    llvm::PHINode* iv = B_.CreatePHI(i64_, 2, "i");
    iv->addIncoming(c64(0), pre);
    body(iv);
    Value* next = B_.CreateAdd(iv, c64(1), "i.next", true, true);
    iv->addIncoming(next, B_.GetInsertBlock());
    B_.CreateCondBr(B_.CreateICmpSLT(next, c64(n)), header, exit);
    B_.SetInsertPoint(exit);
  }
  // for iv in [lo, hi): body(iv); nothing when lo >= hi.
  void for_range(Value* lo, Value* hi, const std::function<void(Value*)>& body) {
    llvm::BasicBlock* pre = B_.GetInsertBlock();
    llvm::BasicBlock* header = llvm::BasicBlock::Create(C_, "loop", F_);
    llvm::BasicBlock* exit = llvm::BasicBlock::Create(C_, "loop.end", F_);
    B_.CreateCondBr(B_.CreateICmpSLT(lo, hi), header, exit);
    B_.SetInsertPoint(header);
    llvm::PHINode* iv = B_.CreatePHI(i64_, 2, "i");
    iv->addIncoming(lo, pre);
    body(iv);
    Value* next = B_.CreateAdd(iv, c64(1), "i.next", true, true);
    iv->addIncoming(next, B_.GetInsertBlock());
    B_.CreateCondBr(B_.CreateICmpSLT(next, hi), header, exit);
    B_.SetInsertPoint(exit);
  }

  // for iv in [0, n): body(iv), where each iteration does about `work` element-operations.
  // When n * work >= kParallelWork (and n > 1, and we are not already in a task), the loop
  // is outlined into an internal function kiln_task.K(ctx, begin, end) that kiln_rt_parallel_for
  // runs over [0, n) in chunks of at least kParallelWork / work iterations. The body must
  // not keep state across iterations outside its own allocas (alloca() inside the body
  // allocates in the task's frame, one per thread) or write what another iteration reads.
  void par_for(int64_t n, int64_t work, const std::function<void(Value*)>& body) {
    if (n <= 0) return;
    work = std::max<int64_t>(work, 1);
    if (!options_.parallel || outlining_ || n < 2 || n > std::numeric_limits<int64_t>::max() / work || n * work < kParallelWork) {
      for_loop(n, body);
      return;
    }
    int64_t grain = std::max<int64_t>(1, (kParallelWork + work - 1) / work);
    auto [fn, ctx] = outline("kiln_task." + std::to_string(tasks_++), {i64_, i64_}, [&](llvm::Function* f) {
      outlining_ = true;
      for_range(f->getArg(1), f->getArg(2), body);
      outlining_ = false;
    });
    B_.CreateCall(runtime(RtFn::kiln_rt_parallel_for), {c64(n), c64(grain), fn, ctx});
  }

  // Emits `body` into a new internal function NAME(ctx, extra...) and returns it with the
  // ctx to call it with, built here: the values of the enclosing function that the body
  // used (pointers, mostly), which the new function loads from ctx.
  std::pair<llvm::Function*, Value*> outline(const std::string& name, const std::vector<llvm::Type*>& extra,
                                             const std::function<void(llvm::Function*)>& body) {
    std::vector<llvm::Type*> params = {ptr_};
    params.insert(params.end(), extra.begin(), extra.end());
    auto* fty = llvm::FunctionType::get(B_.getVoidTy(), params, false);
    auto* fn = llvm::Function::Create(fty, llvm::Function::InternalLinkage, name, M_.get());
    fn->addFnAttr(llvm::Attribute::NoUnwind);
    llvm::Function* saved_f = F_;
    llvm::BasicBlock* saved_allocas = alloca_block_;
    llvm::IRBuilderBase::InsertPoint saved_ip = B_.saveIP();
    F_ = fn;
    llvm::BasicBlock* entry = llvm::BasicBlock::Create(C_, "entry", fn);
    alloca_block_ = entry;
    llvm::BasicBlock* start = llvm::BasicBlock::Create(C_, "start", fn);
    B_.SetInsertPoint(start);
    body(fn);
    B_.CreateRetVoid();
    std::vector<Value*> captures;
    std::set<Value*> seen;
    for (llvm::BasicBlock& bb : *fn)
      for (llvm::Instruction& inst : bb)
        for (Value* op : inst.operands()) {
          bool outside = false;
          if (auto* oi = llvm::dyn_cast<llvm::Instruction>(op)) outside = oi->getFunction() != fn;
          else if (auto* oa = llvm::dyn_cast<llvm::Argument>(op)) outside = oa->getParent() != fn;
          if (outside && seen.insert(op).second) captures.push_back(op);
        }
    std::vector<llvm::Type*> field_types;
    for (Value* v : captures) field_types.push_back(v->getType());
    llvm::StructType* ctx_type = llvm::StructType::get(C_, field_types);
    {
      llvm::IRBuilder<> b(entry);
      for (size_t k = 0; k < captures.size(); ++k) {
        Value* field = b.CreateStructGEP(ctx_type, fn->getArg(0), static_cast<unsigned>(k));
        Value* v = b.CreateLoad(field_types[k], field);
        captures[k]->replaceUsesWithIf(v, [fn](llvm::Use& u) {
          auto* user = llvm::dyn_cast<llvm::Instruction>(u.getUser());
          return user && user->getFunction() == fn;
        });
      }
      b.CreateBr(start);
    }
    F_ = saved_f;
    alloca_block_ = saved_allocas;
    B_.restoreIP(saved_ip);
    Value* ctx = llvm::ConstantPointerNull::get(llvm::PointerType::get(C_, 0));
    if (!captures.empty()) {
      ctx = alloca(ctx_type);
      for (size_t k = 0; k < captures.size(); ++k)
        B_.CreateStore(captures[k], B_.CreateStructGEP(ctx_type, ctx, static_cast<unsigned>(k)));
    }
    return {fn, ctx};
  }

  // Row-major loop nest over `shape`; body gets each stream's element offset. Dims of size
  // 1 are dropped and adjacent dims merged where every stream allows, so a contiguous
  // stream's innermost loop has stride 1. `ops` > 0: each element does about that many
  // operations and no element's body touches another's memory, so a big nest may run in
  // parallel over its outermost dims (par_for); 0: always serial.
  void nest(const Shape& shape, std::vector<Stream> streams, const std::function<void(const std::vector<Value*>&)>& body,
            int64_t ops = 0) {
    if (num_elements(shape) == 0) return;
    Shape dims;
    std::vector<std::vector<int64_t>> st(streams.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      bool merge = !dims.empty();
      for (size_t k = 0; k < streams.size() && merge; ++k)
        merge = st[k].back() == streams[k].strides[d] * shape[d];
      if (merge) {
        dims.back() *= shape[d];
        for (size_t k = 0; k < streams.size(); ++k) st[k].back() = streams[k].strides[d];
      } else {
        dims.push_back(shape[d]);
        for (size_t k = 0; k < streams.size(); ++k) st[k].push_back(streams[k].strides[d]);
      }
    }
    std::vector<Value*> off;
    for (const Stream& s : streams) off.push_back(c64(s.base));
    int64_t total = 1;
    for (int64_t d : dims) total *= d;
    if (ops > 0 && options_.parallel && !outlining_ && !dims.empty() && total >= kParallelWork / ops) {
      // Parallel over the flattened outermost k dims (never the innermost unless it is all).
      size_t k = 1;
      int64_t outer = dims[0];
      while (k + 1 < dims.size() && outer < 64) outer *= dims[k++];
      par_for(outer, total / outer * ops, [&](Value* f) {
        std::vector<Value*> o = off;
        Value* rem = f;
        for (size_t d = k; d-- > 0;) {
          Value* idx = d == 0 ? rem : B_.CreateURem(rem, c64(dims[d]));
          if (d > 0) rem = B_.CreateUDiv(rem, c64(dims[d]));
          for (size_t s = 0; s < o.size(); ++s)
            if (st[s][d] != 0)
              o[s] = B_.CreateAdd(o[s], st[s][d] == 1 ? idx : B_.CreateMul(idx, c64(st[s][d])), "", true, true);
        }
        nest_level(dims, st, k, o, body);
      });
      return;
    }
    nest_level(dims, st, 0, off, body);
  }
  void nest_level(const Shape& dims, const std::vector<std::vector<int64_t>>& st, size_t d, const std::vector<Value*>& off,
                  const std::function<void(const std::vector<Value*>&)>& body) {
    if (d == dims.size()) {
      body(off);
      return;
    }
    for_loop(dims[d], [&](Value* iv) {
      std::vector<Value*> next(off.size());
      for (size_t k = 0; k < off.size(); ++k)
        next[k] = st[k][d] == 0 ? off[k] : B_.CreateAdd(off[k], st[k][d] == 1 ? iv : B_.CreateMul(iv, c64(st[k][d])), "", true, true);
      nest_level(dims, st, d + 1, next, body);
    });
  }

  // ---- Elementwise scalar ops ---------------------------------------------------------
  Value* is_nan(Value* x) { return B_.CreateFCmpUNO(x, x); }
  Value* libm(const char* f32_name, const char* f64_name, Value* x) {
    bool f = x->getType()->isFloatTy();
    llvm::FunctionCallee fn =
        external(f ? f32_name : f64_name, llvm::FunctionType::get(x->getType(), {x->getType()}, false));
    llvm::CallInst* call = B_.CreateCall(fn, {x});
    call->setDoesNotThrow();
    call->setOnlyAccessesInaccessibleMemory();
    return call;
  }
  Value* cast_scalar(Value* x, DType from, DType to) {
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
  Value* ew(const Node& n, DType in, DType out, const std::vector<Value*>& a) {
    bool fl = is_float(in);
    auto zero = [&] { return scalar(in, 0); };
    switch (n.op) {
      case Op::Neg: return fl ? B_.CreateFNeg(a[0]) : B_.CreateSub(zero(), a[0]);
      case Op::Abs:
        if (fl) return intrinsic(llvm::Intrinsic::fabs, a[0]);
        return B_.CreateSelect(B_.CreateICmpSLT(a[0], zero()), B_.CreateSub(zero(), a[0]), a[0]);
      case Op::Exp: return intrinsic(llvm::Intrinsic::exp, a[0]);
      case Op::Log: return intrinsic(llvm::Intrinsic::log, a[0]);
      case Op::Sqrt: return intrinsic(llvm::Intrinsic::sqrt, a[0]);
      case Op::Rsqrt: return B_.CreateFDiv(scalar(in, 1), intrinsic(llvm::Intrinsic::sqrt, a[0]));
      case Op::Tanh: return libm("tanhf", "tanh", a[0]);
      case Op::Sigmoid: {
        Value* one = scalar(in, 1);
        Value* pos = B_.CreateFDiv(one, B_.CreateFAdd(one, intrinsic(llvm::Intrinsic::exp, B_.CreateFNeg(a[0]))));
        Value* e = intrinsic(llvm::Intrinsic::exp, a[0]);
        Value* neg = B_.CreateFDiv(e, B_.CreateFAdd(one, e));
        return B_.CreateSelect(B_.CreateFCmpOGE(a[0], zero()), pos, neg);
      }
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
      case Op::Pow: return B_.CreateBinaryIntrinsic(llvm::Intrinsic::pow, a[0], a[1]);
      case Op::Maximum:
      case Op::Minimum: {
        Value* pick_a = n.op == Op::Maximum ? (fl ? B_.CreateFCmpOGT(a[0], a[1]) : B_.CreateICmpSGT(a[0], a[1]))
                                            : (fl ? B_.CreateFCmpOLT(a[0], a[1]) : B_.CreateICmpSLT(a[0], a[1]));
        Value* r = B_.CreateSelect(pick_a, a[0], a[1]);
        if (fl) r = B_.CreateSelect(is_nan(a[0]), a[0], r);  // NaN in b: the comparison is false -> b
        return r;
      }
      case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: {
        using P = llvm::CmpInst::Predicate;
        bool u = in == DType::boolean;
        P p = P::FCMP_OEQ;
        switch (n.op) {
          case Op::Eq: p = fl ? P::FCMP_OEQ : P::ICMP_EQ; break;
          case Op::Ne: p = fl ? P::FCMP_UNE : P::ICMP_NE; break;
          case Op::Lt: p = fl ? P::FCMP_OLT : u ? P::ICMP_ULT : P::ICMP_SLT; break;
          case Op::Le: p = fl ? P::FCMP_OLE : u ? P::ICMP_ULE : P::ICMP_SLE; break;
          case Op::Gt: p = fl ? P::FCMP_OGT : u ? P::ICMP_UGT : P::ICMP_SGT; break;
          default: p = fl ? P::FCMP_OGE : u ? P::ICMP_UGE : P::ICMP_SGE; break;
        }
        Value* c = fl ? B_.CreateFCmp(p, a[0], a[1]) : B_.CreateICmp(p, a[0], a[1]);
        return B_.CreateZExt(c, i8_);
      }
      case Op::Select: return B_.CreateSelect(B_.CreateICmpNE(a[0], llvm::ConstantInt::get(i8_, 0)), a[1], a[2]);
      case Op::Cast: return cast_scalar(a[0], in, out);
      default: break;
    }
    internal_error("codegen", "cpu codegen: " + std::string(op_name(n.op)) + " is not elementwise");
  }

  // ---- Graph lowering -----------------------------------------------------------------
  struct Item {
    bool group = false;  // a loop over `shape` computing the elementwise nodes `nodes`
    Shape shape;
    std::vector<int32_t> nodes;
  };

  static bool elementwise(Op op) { return op_info(op).has(kElementwise); }

  // Lowers the nodes of `g` (the top-level graph, or a fused body) given pointers for its
  // inputs (and, for the top level, every value; for a body, its outputs via `out_ptr`).
  // `alias[k]`: body output k's buffer is the same as body input alias[k]'s (in place), or -1.
  void lower_nodes(const Graph& g, std::vector<Value*>& ptr, bool top, const std::vector<Value*>& out_ptr = {},
                   const std::vector<int>& alias = {}, int64_t* cursor_in = nullptr) {
    const auto& nodes = g.nodes();
    // Items: maximal runs of elementwise nodes over one shape (constants do not break a run).
    std::vector<Item> items;
    std::vector<int> item_of(nodes.size(), -1);
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      if (n.op == Op::Constant) continue;
      if (elementwise(n.op)) {
        const Shape& s = g.type(n.result()).shape;
        if (top || items.empty() || !items.back().group || items.back().shape != s) items.push_back({true, s, {}});
      } else {
        items.push_back({false, {}, {}});
      }
      items.back().nodes.push_back(static_cast<int32_t>(i));
      item_of[i] = static_cast<int>(items.size() - 1);
    }
    // Last item reading each value; whether each value is used outside its own item.
    std::vector<int> last_reader(g.values().size(), -1);
    std::vector<bool> escapes(g.values().size(), false);
    std::vector<int> uses(g.values().size(), 0);
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (ValueId v : nodes[i].operands) {
        ++uses[v.id];
        if (item_of[i] >= 0) last_reader[v.id] = std::max(last_reader[v.id], item_of[i]);
        const Node* def = g.defining_node(v);
        if (def && def->op != Op::Constant) {
          int di = item_of[static_cast<size_t>(g.value(v).node)];
          if (di != item_of[i] || !items[static_cast<size_t>(di)].group) escapes[v.id] = true;
        }
      }
    }
    for (const GraphOutput& o : g.outputs()) {
      escapes[o.value.id] = true;
      ++uses[o.value.id];
    }
    // Matmul operands produced by a transpose of the last two axes: fold into the GEMM flags.
    std::set<int32_t> fold_users;  // matmul node indices whose operand k is folded: encoded i*2+k
    std::vector<int> folded_uses(g.values().size(), 0);
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].op != Op::Matmul) continue;
      for (int k = 0; k < 2; ++k) {
        ValueId x = nodes[i].operands[static_cast<size_t>(k)];
        const Node* t = g.defining_node(x);
        if (!t || t->op != Op::Transpose || !is_last_two_swap(attr_ints(t->attrs, "perm"))) continue;
        if (top && !source_live(t->operands[0], static_cast<int32_t>(i))) continue;
        fold_users.insert(static_cast<int32_t>(i * 2 + static_cast<size_t>(k)));
        ++folded_uses[x.id];
      }
    }
    std::vector<bool> skip(nodes.size(), false);
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].op == Op::Transpose && folded_uses[nodes[i].result().id] == uses[nodes[i].result().id]) skip[i] = true;

    int64_t local_cursor = 0;
    int64_t& cursor = cursor_in ? *cursor_in : local_cursor;
    std::vector<std::pair<int, ValueId>> copies;  // body outputs copied at the end
    std::vector<Value*> redirected;
    if (!top) {
      // Body values: outputs written straight to the results where possible.
      std::set<int32_t> assigned;
      std::set<int32_t> fresh;  // outputs written straight to a buffer no body input shares
      for (size_t k = 0; k < g.outputs().size(); ++k) {
        ValueId v = g.outputs()[k].value;
        const Node* def = g.defining_node(v);
        bool direct = def && def->op != Op::Constant && !assigned.count(v.id);
        if (direct && alias[k] >= 0) {
          // In place over body input alias[k]: legal only if nothing after v's item reads it.
          int vi = item_of[static_cast<size_t>(g.value(v).node)];
          ValueId in = g.inputs()[static_cast<size_t>(alias[k])].value;
          if (last_reader[in.id] > vi) direct = false;
        }
        if (direct) {
          ptr[v.id] = out_ptr[k];
          assigned.insert(v.id);
          if (alias[k] < 0) fresh.insert(v.id);
        } else {
          copies.emplace_back(static_cast<int>(k), v);
        }
      }
      // GEMM epilogue: a matmul whose result only an elementwise group reads, which writes
      // an output of the same type to a fresh buffer, writes that buffer directly; the group
      // then runs in place over it (it loads element i before storing element i), with no
      // scratch round trip. Fresh: no body input (so nothing the GEMM reads) lives there.
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (!options_.gemm_epilogue) break;
        if (skip[i] || nodes[i].op != Op::Matmul || ptr[nodes[i].result().id]) continue;
        ValueId m = nodes[i].result();
        int j = -1;
        bool ok = true;
        for (size_t u = i + 1; u < nodes.size() && ok; ++u)
          for (ValueId v : nodes[u].operands)
            if (v == m) {
              if (j < 0) j = item_of[u];
              ok = ok && item_of[u] == j && j >= 0 && items[static_cast<size_t>(j)].group;
            }
        if (!ok || j < 0) continue;
        for (int32_t u : items[static_cast<size_t>(j)].nodes) {
          ValueId o = nodes[static_cast<size_t>(u)].result();
          if (fresh.count(o.id) && g.type(o) == g.type(m)) {
            ptr[m.id] = ptr[o.id];
            ++info_.gemm_epilogues_in_place;
            break;
          }
        }
      }
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (skip[i]) continue;
        for (ValueId r : nodes[i].results) {
          if (ptr[r.id] || nodes[i].op == Op::Constant) continue;
          if (item_of[i] >= 0 && items[static_cast<size_t>(item_of[i])].group && !escapes[r.id]) continue;  // register
          ptr[r.id] = scratch(g.type(r).numel() * static_cast<int64_t>(dtype_size(g.type(r).dtype)), cursor);
        }
      }
    }
    // Constants: globals, for those read from memory: not a splat that only fused loops
    // read (an immediate there), nor a top-level output (the runtime hands its value out).
    // A body output constant is copied at the end.
    std::vector<bool> in_memory(g.values().size(), false);
    for (size_t i = 0; i < nodes.size(); ++i) {
      bool in_loop = item_of[i] >= 0 && items[static_cast<size_t>(item_of[i])].group;
      for (ValueId v : nodes[i].operands) in_memory[v.id] = in_memory[v.id] || !(in_loop && splat(g, v));
    }
    for (auto [k, v] : copies) in_memory[v.id] = true;
    for (const Node& n : nodes)
      if (n.op == Op::Constant && in_memory[n.result().id]) ptr[n.result().id] = global_constant(n);

    auto emit_here = [&](const Item& it) {
      if (it.group) {
        lower_group(g, it, ptr, escapes);
        return;
      }
      size_t i = static_cast<size_t>(it.nodes[0]);
      if (skip[i]) return;
      if (top) cursor = 0;  // each top-level node starts the scratch area afresh
      lower_node(g, nodes[i], ptr, top, fold_users, static_cast<int32_t>(i), cursor);
    };
    // LLVM's optimizer and register allocator cost more than linear time in a function's
    // length: a graph of thousands of kernels in one function took minutes to compile. So
    // a long graph's top-level kernels go into functions of about kNodesPerFunction nodes
    // each (noinline: the inliner would undo it). Kernels share nothing but memory, so
    // nothing is lost by the split; a graph short enough stays in kiln_entry, where the
    // split would only add compile time (about 20% for the MLP's training step).
    // Nodes of the item, a fused node's body counted in full.
    auto weight = [&](const Item& it) {
      size_t w = 0;
      for (int32_t i : it.nodes) {
        const Node& n = g.nodes()[static_cast<size_t>(i)];
        w += n.body ? n.body->nodes().size() : 1;
      }
      return w;
    };
    size_t total = 0;
    if (top)
      for (const Item& it : items) total += weight(it);
    const bool split = top && total > kNodesInEntry;
    auto emit_items = [&](size_t begin, size_t end) {
      if (!split) {
        for (size_t i = begin; i < end; ++i) emit_here(items[i]);
        return;
      }
      auto [fn, ctx] = outline("kiln_kernels." + std::to_string(begin), {}, [&](llvm::Function*) {
        for (size_t i = begin; i < end; ++i) emit_here(items[i]);
      });
      fn->addFnAttr(llvm::Attribute::NoInline);
      B_.CreateCall(fn, {ctx});
    };
    auto emit = [&](const Item& it) {
      auto i = static_cast<size_t>(&it - items.data());
      emit_items(i, i + 1);
    };
    if (top && options_.profile) {
      // At the top level every item is one node: time each node, constants included.
      llvm::FunctionCallee begin = runtime(RtFn::kiln_rt_prof_begin);
      llvm::FunctionCallee end = runtime(RtFn::kiln_rt_prof_end);
      for (size_t i = 0; i < nodes.size(); ++i) {
        B_.CreateCall(begin, {B_.getInt32(static_cast<uint32_t>(i))});
        if (item_of[i] >= 0) emit(items[static_cast<size_t>(item_of[i])]);
        B_.CreateCall(end, {B_.getInt32(static_cast<uint32_t>(i))});
      }
    } else {
      for (size_t begin = 0, end = 0; begin < items.size(); begin = end) {
        size_t size = 0;
        while (end < items.size() && (end == begin || size + weight(items[end]) <= kNodesPerFunction))
          size += weight(items[end++]);
        emit_items(begin, end);
      }
    }
    for (auto [k, v] : copies) {
      const TensorType& t = g.type(v);
      copy_bytes(out_ptr[static_cast<size_t>(k)], ptr[v.id], t.numel() * static_cast<int64_t>(dtype_size(t.dtype)));
    }
  }

  // At top level: is `src` still intact when node `at` runs?
  bool source_live(ValueId src, int32_t at) {
    const ValuePlan& vp = plan_.at(src);
    switch (vp.kind) {
      case BufferKind::Input:
      case BufferKind::Constant: return true;
      case BufferKind::Arena: return vp.end >= at;
      case BufferKind::StateInPlace: return vp.end >= at;
      case BufferKind::State:
        for (const ValuePlan& o : plan_.values)
          if (o.kind == BufferKind::StateInPlace && o.state == src && o.start <= at) return false;
        return true;
    }
    return false;
  }

  void lower_group(const Graph& g, const Item& it, std::vector<Value*>& ptr, const std::vector<bool>& escapes) {
    // Streams: stores of escaping results (contiguous), loads of outside operands.
    std::set<int32_t> inside;
    for (int32_t i : it.nodes)
      for (ValueId r : g.nodes()[static_cast<size_t>(i)].results) inside.insert(r.id);
    std::vector<ValueId> loads;
    std::map<int32_t, size_t> stream_of;
    std::vector<Stream> streams;
    std::vector<int64_t> contiguous = strides_of(it.shape);
    for (int32_t i : it.nodes)
      for (ValueId v : g.nodes()[static_cast<size_t>(i)].operands) {
        if (inside.count(v.id) || stream_of.count(v.id) || splat(g, v)) continue;
        stream_of[v.id] = streams.size();
        streams.push_back({broadcast_strides(g.type(v).shape, it.shape), 0});
        loads.push_back(v);
      }
    size_t out_stream = streams.size();
    streams.push_back({contiguous, 0});
    nest(it.shape, streams, [&](const std::vector<Value*>& off) {
      std::map<int32_t, Value*> val;
      for (ValueId v : loads) {
        KILN_CHECK(ptr[v.id] != nullptr, "cpu codegen: operand without storage");
        val[v.id] = load(g.type(v).dtype, ptr[v.id], off[stream_of[v.id]]);
      }
      std::vector<std::pair<ValueId, Value*>> results;
      for (int32_t i : it.nodes) {
        const Node& n = g.nodes()[static_cast<size_t>(i)];
        std::vector<Value*> args;
        for (ValueId v : n.operands) {
          Value* s = splat(g, v);
          args.push_back(s ? s : val.at(v.id));
        }
        DType in = g.type(n.operands.back()).dtype;
        Value* r = ew(n, in, g.type(n.result()).dtype, args);
        val[n.result().id] = r;
        if (escapes[n.result().id]) results.emplace_back(n.result(), r);
      }
      // Every load above precedes every store: the in-place contract.
      for (auto& [v, r] : results) store(g.type(v).dtype, r, ptr[v.id], off[out_stream]);
    }, static_cast<int64_t>(it.nodes.size()));
  }

  [[noreturn]] void unsupported(Op op) {
    throw Error("cpu codegen: " + std::string(op_name(op)) + " is not supported yet");
  }

  void lower_node(const Graph& g, const Node& n, std::vector<Value*>& ptr, bool top, const std::set<int32_t>& fold_users,
                  int32_t index, int64_t& cursor) {
    const TensorType& rt = g.type(n.result());
    Value* out = ptr[n.result().id];
    auto in = [&](size_t k) { return ptr[n.operands[k].id]; };
    auto it = [&](size_t k) -> const TensorType& { return g.type(n.operands[k]); };
    int64_t esize = static_cast<int64_t>(dtype_size(rt.dtype));
    switch (n.op) {
      case Op::Neg: case Op::Abs: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Tanh:
      case Op::Sigmoid: case Op::Relu: case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow:
      case Op::Maximum: case Op::Minimum: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt:
      case Op::Ge: case Op::Select: case Op::Cast:
        internal_error("codegen", "cpu codegen: elementwise node outside a loop group");
      case Op::Sum: case Op::Mean: case Op::Max: case Op::Min:
        return lower_reduce(n, it(0), rt, in(0), out, cursor);
      case Op::Argmax: return lower_argmax(n, it(0), in(0), out);
      case Op::Reshape: return copy_bytes(out, in(0), rt.numel() * esize);
      case Op::Transpose: {
        const auto& perm = attr_ints(n.attrs, "perm");
        std::vector<int64_t> s = strides_of(it(0).shape), src(perm.size());
        for (size_t d = 0; d < perm.size(); ++d) src[d] = s[static_cast<size_t>(perm[d])];
        return copy_strided(rt.dtype, rt.shape, out, {strides_of(rt.shape), 0}, in(0), {src, 0});
      }
      case Op::BroadcastTo:
        return copy_strided(rt.dtype, rt.shape, out, {strides_of(rt.shape), 0}, in(0),
                            {broadcast_strides(it(0).shape, rt.shape), 0});
      case Op::Slice: {
        const auto& start = attr_ints(n.attrs, "start");
        const auto& step = attr_ints(n.attrs, "step");
        std::vector<int64_t> s = strides_of(it(0).shape), src(s.size());
        int64_t base = 0;
        for (size_t d = 0; d < s.size(); ++d) {
          base += start[d] * s[d];
          src[d] = step[d] * s[d];
        }
        return copy_strided(rt.dtype, rt.shape, out, {strides_of(rt.shape), 0}, in(0), {src, base});
      }
      case Op::Concat: {
        size_t axis = static_cast<size_t>(attr_int(n.attrs, "axis") < 0 ? attr_int(n.attrs, "axis") + rt.rank()
                                                                         : attr_int(n.attrs, "axis"));
        std::vector<int64_t> os = strides_of(rt.shape);
        int64_t base = 0;
        for (size_t k = 0; k < n.operands.size(); ++k) {
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
      case Op::Matmul: return lower_matmul(g, n, ptr, fold_users, index);
      case Op::Conv2d: {
        RtFn f = rt.dtype == DType::f32 ? RtFn::kiln_rt_conv2d_f32 : RtFn::kiln_rt_conv2d_f64;
        Value* bias = n.operands.size() > 2 ? in(2) : llvm::ConstantPointerNull::get(llvm::PointerType::get(C_, 0));
        B_.CreateCall(runtime(f),
                      {in(0), in(1), bias, out, conv_params(n, it(0).shape, it(1).shape, rt.shape)});
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
      case Op::Constant: return;  // a global (see lower_nodes)
      case Op::Fused: {
        std::vector<Value*> body_ptr(n.body->values().size(), nullptr);
        for (size_t k = 0; k < n.operands.size(); ++k) body_ptr[n.body->inputs()[k].value.id] = in(k);
        std::vector<Value*> outs;
        std::vector<int> alias;
        for (ValueId r : n.results) {
          outs.push_back(ptr[r.id]);
          int a = -1;
          if (top)
            for (size_t k = 0; k < n.operands.size(); ++k)
              if (same_storage(r, n.operands[k])) a = static_cast<int>(k);
          alias.push_back(a);
        }
        lower_nodes(*n.body, body_ptr, false, outs, alias, &cursor);
        return;
      }
    }
    unsupported(n.op);
  }

  // Same top-level storage (in place)?
  bool same_storage(ValueId a, ValueId b) {
    auto key = [&](ValueId v) -> std::pair<int, int64_t> {
      const ValuePlan& p = plan_.at(v);
      switch (p.kind) {
        case BufferKind::Arena: return {1, p.buffer};
        case BufferKind::StateInPlace: return {2, p.state.id};
        case BufferKind::State:
        case BufferKind::Input: return {2, v.id};
        case BufferKind::Constant: return {3, v.id};
      }
      return {0, v.id};
    };
    return key(a) == key(b);
  }

  void copy_strided(DType t, const Shape& shape, Value* dst, Stream ds, Value* src, Stream ss) {
    nest(shape, {ds, ss}, [&](const std::vector<Value*>& off) { store(t, load(t, src, off[1]), dst, off[0]); }, 1);
  }

  Value* conv_params(const Node& n, const Shape& x, const Shape& w, const Shape& y) {
    const auto& s = attr_ints(n.attrs, "stride");
    const auto& p = attr_ints(n.attrs, "padding");
    const auto& d = attr_ints(n.attrs, "dilation");
    return params_array(KilnConv2dParams{.n = x[0], .c = x[1], .h = x[2], .w = x[3], .o = w[0], .kh = w[2],
                                         .kw = w[3], .oh = y[2], .ow = y[3], .stride_h = s[0], .stride_w = s[1],
                                         .pad_h = p[0], .pad_w = p[1], .dil_h = d[0], .dil_w = d[1],
                                         .groups = attr_int(n.attrs, "groups")});
  }
  Value* pool_params(const Node& n, const Shape& x, const Shape& y) {
    const auto& k = attr_ints(n.attrs, "kernel");
    const auto& s = attr_ints(n.attrs, "stride");
    const auto& p = attr_ints(n.attrs, "padding");
    return params_array(KilnPool2dParams{.n = x[0], .c = x[1], .h = x[2], .w = x[3], .oh = y[2], .ow = y[3],
                                         .kh = k[0], .kw = k[1], .stride_h = s[0], .stride_w = s[1], .pad_h = p[0],
                                         .pad_w = p[1]});
  }
  // A runtime parameter struct as the constant i64 array it is laid out as (runtime/kernels.h).
  template <typename Params>
  Value* params_array(const Params& q) {
    std::vector<int64_t> fields(sizeof(Params) / sizeof(int64_t));
    std::memcpy(fields.data(), &q, sizeof(Params));
    return i64_array(fields);
  }

  // The float sum of elem(0), ..., elem(n - 1) in Kiln's summation order (kSumBlock,
  // ir/interp.h; the interpreter's blocked_sum): blocks added left to right from +0, their
  // sums combined as a binary counter. slot[l] holds the sum of the last 2^l finished
  // blocks while bit l of the finished-block count is set: finishing block b adds the
  // ctz(b + 1) lowest slots into it, leftmost first, and stores it in slot ctz(b + 1).
  // After the last block the slots of nb's set bits, combined from the smallest, give the
  // pairwise tree that splits each run of blocks at the largest power of two below its length.
  Value* blocked_sum(DType t, int64_t n, const std::function<Value*(Value*)>& elem) {
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
    for_loop(nb, [&](Value* b) {
      Value* lo = B_.CreateMul(b, c64(kSumBlock), "", true, true);
      Value* hi = B_.CreateAdd(lo, c64(kSumBlock), "", true, true);
      B_.CreateStore(run(lo, B_.CreateSelect(B_.CreateICmpSLT(hi, c64(n)), hi, c64(n))), cur);
      Value* carries = B_.CreateBinaryIntrinsic(llvm::Intrinsic::cttz, B_.CreateAdd(b, c64(1)), B_.getFalse());
      for_range(c64(0), carries, [&](Value* l) {
        B_.CreateStore(B_.CreateFAdd(B_.CreateLoad(ft, slot(l)), B_.CreateLoad(ft, cur)), cur);
      });
      B_.CreateStore(B_.CreateLoad(ft, cur), slot(carries));
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
  void column_sums(DType t, int64_t k1, int64_t r, int64_t k2, Value* x, Value* out, bool mean, int64_t& cursor) {
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

  void lower_reduce(const Node& n, const TensorType& xt, const TensorType& rt, Value* x, Value* out, int64_t& cursor) {
    std::set<int64_t> axes;
    for (int64_t a : attr_ints(n.attrs, "axes")) axes.insert(a < 0 ? a + xt.rank() : a);
    if (attr_ints(n.attrs, "axes").empty())
      for (int64_t d = 0; d < xt.rank(); ++d) axes.insert(d);
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
    Value* init = nullptr;
    double inf = std::numeric_limits<double>::infinity();
    switch (n.op) {
      case Op::Max:
        init = fl ? scalar(t, -inf) : llvm::ConstantInt::get(ty(t), llvm::APInt::getSignedMinValue(ty(t)->getIntegerBitWidth()));
        break;
      case Op::Min:
        init = fl ? scalar(t, inf) : llvm::ConstantInt::get(ty(t), llvm::APInt::getSignedMaxValue(ty(t)->getIntegerBitWidth()));
        break;
      default: init = scalar(t, 0); break;
    }
    int64_t m = rt.numel();
    // Reductions over trailing axes (the common case) accumulate in a register.
    bool trailing = true;
    for (int64_t d = 0; d < xt.rank(); ++d)
      if (axes.count(d) && xt.shape[static_cast<size_t>(d)] != 1)
        for (int64_t e = d + 1; e < xt.rank(); ++e)
          if (!axes.count(e) && xt.shape[static_cast<size_t>(e)] != 1) trailing = false;
    if (blocked && !trailing) {
      // Each output's elements must be added in blocks of its own reduced index. Viewed as
      // [K1, R, K2] (the kept dims outside the innermost kept run, the reduced dims, that
      // run), that is a loop over R with vector work over K2: column_sums. Other layouts are
      // copied into that one first (in the scratch area; the copy's innermost loop is the
      // innermost run of x either way, so it streams).
      Shape order[3];  // K1, R, K2 dims, each in x's order
      std::vector<int64_t> src[3], xs = strides_of(xt.shape);
      bool in_order = true;  // x already is [K1, R, K2]
      for (int64_t d = xt.rank(); d-- > 0;) {
        int64_t size = xt.shape[static_cast<size_t>(d)];
        if (size == 1) continue;
        int part = axes.count(d) ? 1 : order[1].empty() && order[0].empty() ? 2 : 0;
        in_order = in_order && !(part == 1 && !order[0].empty());
        order[part].insert(order[part].begin(), size);
        src[part].insert(src[part].begin(), xs[static_cast<size_t>(d)]);
      }
      if (!in_order) {
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
      switch (n.op) {
        case Op::Max:
        case Op::Min: {
          Value* better = n.op == Op::Max ? (fl ? B_.CreateFCmpOGT(v, acc) : B_.CreateICmpSGT(v, acc))
                                          : (fl ? B_.CreateFCmpOLT(v, acc) : B_.CreateICmpSLT(v, acc));
          if (!fl) return B_.CreateSelect(better, v, acc);
          Value* take = B_.CreateOr(is_nan(v), better);
          return B_.CreateSelect(is_nan(acc), acc, B_.CreateSelect(take, v, acc));
        }
        default: return fl ? B_.CreateFAdd(acc, v) : B_.CreateAdd(acc, v);
      }
    };
    auto finish = [&](Value* acc) -> Value* {
      if (n.op == Op::Mean) return B_.CreateFDiv(acc, scalar(t, static_cast<double>(count)));
      return acc;
    };
    if (trailing) {
      // One output element per iteration, reduced in order by one thread: parallel-safe,
      // and the same whatever the thread count.
      par_for(m, count, [&](Value* j) {
        Value* base = B_.CreateMul(j, c64(count));
        auto elem = [&](Value* k) { return load(t, x, B_.CreateAdd(base, k)); };
        if (blocked) return store(t, finish(blocked_sum(t, count, elem)), out, j);
        Value* slot = alloca(ty(t));
        B_.CreateStore(init, slot);
        for_loop(count, [&](Value* k) { B_.CreateStore(combine(B_.CreateLoad(ty(t), slot), elem(k)), slot); });
        store(t, finish(B_.CreateLoad(ty(t), slot)), out, j);
      });
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

  // outer x len x inner view of `xt` around `axis`.
  static void split_axis(const Shape& s, size_t axis, int64_t& outer, int64_t& len, int64_t& inner) {
    outer = 1;
    inner = 1;
    len = s[axis];
    for (size_t d = 0; d < axis; ++d) outer *= s[d];
    for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  }

  void lower_argmax(const Node& n, const TensorType& xt, Value* x, Value* out) {
    int64_t axis = attr_int(n.attrs, "axis");
    if (axis < 0) axis += xt.rank();
    int64_t outer, len, inner;
    split_axis(xt.shape, static_cast<size_t>(axis), outer, len, inner);
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
  void outer_inner(int64_t outer, int64_t inner, int64_t len, const std::function<void(Value*, Value*)>& body) {
    par_for(outer * inner, len * 4, [&](Value* f) {
      if (inner == 1) return body(f, c64(0));
      if (outer == 1) return body(c64(0), f);
      body(B_.CreateUDiv(f, c64(inner)), B_.CreateURem(f, c64(inner)));
    });
  }

  void lower_softmax(const Node& n, const TensorType& xt, Value* x, Value* out) {
    int64_t axis = attr_int(n.attrs, "axis");
    if (axis < 0) axis += xt.rank();
    int64_t outer, len, inner;
    split_axis(xt.shape, static_cast<size_t>(axis), outer, len, inner);
    DType t = xt.dtype;
    bool log = n.op == Op::LogSoftmax;
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
        Value* s = blocked_sum(t, len, [&](Value* k) {
          return intrinsic(llvm::Intrinsic::exp, B_.CreateFSub(load(t, x, at(k)), m));
        });
        Value* ls = log ? intrinsic(llvm::Intrinsic::log, s) : nullptr;
        for_loop(len, [&](Value* k) {
          Value* d = B_.CreateFSub(load(t, x, at(k)), m);
          Value* r = log ? B_.CreateFSub(d, ls) : B_.CreateFDiv(intrinsic(llvm::Intrinsic::exp, d), s);
          store(t, r, out, at(k));
        });
    });
  }

  void lower_matmul(const Graph& g, const Node& n, std::vector<Value*>& ptr, const std::set<int32_t>& fold_users,
                    int32_t index) {
    const TensorType& rt = g.type(n.result());
    ValueId av = n.operands[0], bv = n.operands[1];
    bool ta = fold_users.count(index * 2), tb = fold_users.count(index * 2 + 1);
    if (ta) av = g.defining_node(av)->operands[0];
    if (tb) bv = g.defining_node(bv)->operands[0];
    const Shape& as = g.type(n.operands[0]).shape;  // logical (untransposed) shapes
    const Shape& bs = g.type(n.operands[1]).shape;
    int64_t m = as[as.size() - 2], k = as[as.size() - 1], nn = bs[bs.size() - 1];
    Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2), ob(rt.shape.begin(), rt.shape.end() - 2);
    bool f32 = rt.dtype == DType::f32;
    llvm::Type* ft = ty(rt.dtype);
    llvm::FunctionCallee gemm = runtime(f32 ? RtFn::kiln_rt_sgemm : RtFn::kiln_rt_dgemm);
    std::vector<int64_t> sa = broadcast_strides(ab, ob), sb = broadcast_strides(bb, ob);
    for (auto& s : sa) s *= m * k;
    for (auto& s : sb) s *= k * nn;
    Value* a = ptr[av.id];
    Value* b = ptr[bv.id];
    Value* c = ptr[n.result().id];
    nest(ob, {{sa, 0}, {sb, 0}, {strides_of(ob), 0}}, [&](const std::vector<Value*>& off) {
      Value* pa = B_.CreateInBoundsGEP(ft, a, off[0]);
      Value* pb = B_.CreateInBoundsGEP(ft, b, off[1]);
      Value* pc = B_.CreateInBoundsGEP(ft, c, B_.CreateMul(off[2], c64(m * nn)));
      B_.CreateCall(gemm, {B_.getInt32(ta ? 1 : 0), B_.getInt32(tb ? 1 : 0), c64(m), c64(nn), c64(k),
                           llvm::ConstantFP::get(ft, 1.0), pa, c64(ta ? m : k), pb, c64(tb ? k : nn),
                           llvm::ConstantFP::get(ft, 0.0), pc, c64(nn)});
    });
  }

  const Graph& g_;
  const MemoryPlan& plan_;
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
  bool outlining_ = false;  // emitting the body of a parallel loop's task function
  int tasks_ = 0;
  std::set<std::string> runtime_;
};

}  // namespace

std::unique_ptr<llvm::Module> lower_graph(const Graph& g, const MemoryPlan& plan, llvm::LLVMContext& ctx,
                                          LoweringInfo& info, const LowerOptions& options) {
  LowerOptions o = options;
  if (const char* e = std::getenv("KILN_CODEGEN_BASELINE"); e && std::string_view(e) == "1") {
    o.parallel = false;
    o.gemm_epilogue = false;
  }
  Lowerer l(g, plan, ctx, info, o);
  return l.run();
}

}  // namespace kiln::cpu::detail
