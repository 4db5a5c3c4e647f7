// The Lowerer's core (codegen/cpu/lowerer.h): LLVM types, constants, memory, loops, and
// parallel loops outlined into task functions for the runtime's thread pool.
#include "codegen/cpu/lowerer.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <limits>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>

#include "ir/error.h"

namespace kiln::cpu::detail {

Lowerer::Lowerer(const Graph& g, const MemoryPlan& plan, const KernelPlan& kp, llvm::LLVMContext& ctx, LoweringInfo& info,
                 const LowerOptions& options)
    : g_(g), plan_(plan), kp_(kp), C_(ctx), info_(info), options_(options), B_(ctx) {
  M_ = std::make_unique<llvm::Module>("kiln_" + g.name(), ctx);
  i8_ = B_.getInt8Ty();
  i32_ = B_.getInt32Ty();
  i64_ = B_.getInt64Ty();
  ptr_ = B_.getPtrTy();
}

llvm::Type* Lowerer::ty(DType t) {
  switch (t) {
    case DType::f32: return B_.getFloatTy();
    case DType::f64: return B_.getDoubleTy();
    case DType::i32: return i32_;
    case DType::i64: return i64_;
    case DType::boolean: return i8_;
  }
  return i8_;
}

// A scalar of dtype t with value v (exact for the dtype's range).
Value* Lowerer::scalar(DType t, double v) {
  switch (t) {
    case DType::f32: return llvm::ConstantFP::get(B_.getFloatTy(), static_cast<double>(static_cast<float>(v)));
    case DType::f64: return llvm::ConstantFP::get(B_.getDoubleTy(), v);
    case DType::i32: return llvm::ConstantInt::get(i32_, static_cast<uint64_t>(static_cast<int64_t>(v)), true);
    case DType::i64: return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(static_cast<int64_t>(v)), true);
    case DType::boolean: return llvm::ConstantInt::get(i8_, v != 0 ? 1 : 0);
  }
  return nullptr;
}

Value* Lowerer::element_constant(const Tensor& t, int64_t i) {
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
Value* Lowerer::splat(const Graph& g, ValueId v) {
  const Node* n = g.defining_node(v);
  if (!n || n->op != Op::Constant) return nullptr;
  const Tensor& val = attr_tensor(n->attrs, "value");
  if (val.numel() != 1 && !val.is_splat()) return nullptr;
  return element_constant(val, 0);
}

// The constant's value in full, as a private global (one per contents). Every global's bytes are counted:
// a module holds at most kMaxConstantBytes of them. For the JIT a large one is its
// tensor's address instead (LowerOptions::constants_by_address).
Value* Lowerer::global_constant(const Node& n) {
  const Tensor& value = attr_tensor(n.attrs, "value");
  int64_t bytes = value.numel() * static_cast<int64_t>(dtype_size(value.dtype()));
  if (options_.constants_by_address && !value.is_splat() && bytes >= kAddressedConstantBytes) {
    auto [it, added] = addressed_.try_emplace(value.raw(), nullptr);
    if (added) {
      const std::string name = "kiln_const." + std::to_string(info_.addressed_constants.size());
      it->second = new llvm::GlobalVariable(*M_, i8_, /*isConstant=*/true, llvm::GlobalValue::ExternalLinkage,
                                            nullptr, name);
      info_.addressed_constants.emplace_back(name, value.raw());
    }
    return it->second;
  }
  if (constant_bytes_ + bytes > kMaxConstantBytes)
    throw Error("cpu codegen: the constants of @" + g_.name() + " need more than " +
                std::to_string(kMaxConstantBytes >> 20) + " MiB in the compiled code (the one that crossed it is " +
                value.type().str() + "); pass large tensors as graph inputs instead");
  Tensor t = value.materialized();
  llvm::StringRef raw(reinterpret_cast<const char*>(t.raw()), t.nbytes());
  auto* init = llvm::ConstantDataArray::getRaw(raw, static_cast<uint64_t>(t.numel()), ty(t.dtype()));
  auto [gv, added] = data_global(init, "const", 64);
  if (added) constant_bytes_ += bytes;
  return gv;
}

// LLVM keeps one ConstantDataArray per contents: one global per initializer.
std::pair<llvm::GlobalVariable*, bool> Lowerer::data_global(llvm::Constant* init, const char* name, uint64_t align) {
  auto [it, added] = globals_.emplace(init, nullptr);
  if (!added) return {it->second, false};
  auto* gv = new llvm::GlobalVariable(*M_, init->getType(), true, llvm::GlobalValue::PrivateLinkage, init, name);
  gv->setAlignment(llvm::Align(align));
  gv->setUnnamedAddr(llvm::GlobalValue::UnnamedAddr::Global);
  it->second = gv;
  return {gv, true};
}

Value* Lowerer::i64_array(const std::vector<int64_t>& xs) {
  llvm::Constant* init = llvm::ConstantDataArray::get(C_, llvm::ArrayRef<uint64_t>(
      reinterpret_cast<const uint64_t*>(xs.data()), xs.size()));
  return data_global(init, "params", 8).first;
}

Value* Lowerer::load(DType t, Value* base, Value* off) {
  llvm::LoadInst* l = B_.CreateLoad(ty(t), B_.CreateInBoundsGEP(ty(t), base, off));
  mark_access(l);
  return l;
}

// A loop with another loop inside is marked not to be unrolled: its trip count is a
// constant, so LLVM's full unroller copied whole nests (16 images around a vector loop over
// a plane, 16 copies of it), making a training step's module ten times the size of what
// was emitted and its compile minutes long. Innermost loops keep LLVM's defaults: the
// vectorizer vectorizes and interleaves them (with the hint on them too, an AOT object for
// x86-64-v3 + avx512vp2intersect hit an LLVM instruction-selection failure on a masked store).
void Lowerer::mark_latch(llvm::Instruction* br, bool outer) {
  ++loops_closed_;
  std::vector<llvm::Metadata*> ops = {nullptr};
  if (access_group_)
    ops.push_back(llvm::MDNode::get(C_, {llvm::MDString::get(C_, "llvm.loop.parallel_accesses"), access_group_}));
  if (outer) ops.push_back(llvm::MDNode::get(C_, {llvm::MDString::get(C_, "llvm.loop.unroll.disable")}));
  llvm::MDNode* loop = llvm::MDNode::getDistinct(C_, ops);
  loop->replaceOperandWith(0, loop);
  br->setMetadata(llvm::LLVMContext::MD_loop, loop);
}

Value* Lowerer::alloca(llvm::Type* t) {
  llvm::IRBuilder<> b(alloca_block_, alloca_block_->begin());
  return b.CreateAlloca(t);
}

Value* Lowerer::scratch(int64_t bytes, int64_t& cursor) {
  int64_t off = cursor;
  cursor = align_up(cursor + std::max<int64_t>(bytes, 1), 64);
  scratch_peak_ = std::max(scratch_peak_, cursor);
  return B_.CreateConstInBoundsGEP1_64(i8_, scratch_, static_cast<uint64_t>(off));
}

bool Lowerer::same_storage(const Graph& g, ValueId a, ValueId b, int64_t bytes_in) const {
  if (&g != &g_) return false;  // a fused body's values are not in the memory plan
  const ValuePlan& pa = plan_.values[static_cast<size_t>(a.id)];
  const ValuePlan& pb = plan_.values[static_cast<size_t>(b.id)];
  return pa.kind == BufferKind::Arena && pb.kind == BufferKind::Arena && pa.offset == pb.offset + bytes_in;
}

void Lowerer::copy_bytes(Value* dst, Value* src, int64_t bytes) {
  if (bytes > 0) B_.CreateMemMove(dst, llvm::MaybeAlign(), src, llvm::MaybeAlign(), static_cast<uint64_t>(bytes));
}

namespace {

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

}  // namespace

llvm::FunctionCallee Lowerer::runtime(RtFn f) {
  auto [name, type] = runtime_function(f, C_);
  return external(name, type);
}

llvm::FunctionCallee Lowerer::external(const std::string& name, llvm::FunctionType* type) {
  runtime_.insert(name);
  return M_->getOrInsertFunction(name, type);
}

// for iv in [0, n): body(iv). n > 0.
void Lowerer::for_loop(int64_t n, const std::function<void(Value*)>& body, bool keep) {
  if (n <= 0) return;
  llvm::BasicBlock* pre = B_.GetInsertBlock();
  llvm::BasicBlock* header = llvm::BasicBlock::Create(C_, "loop", F_);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(C_, "loop.end", F_);
  B_.CreateBr(header);
  B_.SetInsertPoint(header);
  llvm::PHINode* iv = B_.CreatePHI(i64_, 2, "i");
  iv->addIncoming(c64(0), pre);
  const int64_t closed = loops_closed_;
  body(iv);
  Value* next = B_.CreateAdd(iv, c64(1), "i.next", true, true);
  iv->addIncoming(next, B_.GetInsertBlock());
  mark_latch(B_.CreateCondBr(B_.CreateICmpSLT(next, c64(n)), header, exit), loops_closed_ != closed || keep);
  B_.SetInsertPoint(exit);
}

// for iv in [lo, hi): body(iv); nothing when lo >= hi.
void Lowerer::for_range(Value* lo, Value* hi, const std::function<void(Value*)>& body) {
  llvm::BasicBlock* pre = B_.GetInsertBlock();
  llvm::BasicBlock* header = llvm::BasicBlock::Create(C_, "loop", F_);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(C_, "loop.end", F_);
  B_.CreateCondBr(B_.CreateICmpSLT(lo, hi), header, exit);
  B_.SetInsertPoint(header);
  llvm::PHINode* iv = B_.CreatePHI(i64_, 2, "i");
  iv->addIncoming(lo, pre);
  const int64_t closed = loops_closed_;
  body(iv);
  Value* next = B_.CreateAdd(iv, c64(1), "i.next", true, true);
  iv->addIncoming(next, B_.GetInsertBlock());
  mark_latch(B_.CreateCondBr(B_.CreateICmpSLT(next, hi), header, exit), loops_closed_ != closed);
  B_.SetInsertPoint(exit);
}

// for iv in [0, n): body(iv), where each iteration does about `work` element-operations.
// When n * work >= kParallelWork (and n > 1, and we are not already in a task), the loop
// is outlined into an internal function kiln_task.K(ctx, begin, end) that kiln_rt_parallel_for
// runs over [0, n) in chunks of at least kParallelWork / work iterations. The body must
// not keep state across iterations outside its own allocas (alloca() inside the body
// allocates in the task's frame, one per thread) or write what another iteration reads.
void Lowerer::par_for(int64_t n, int64_t work, const std::function<void(Value*)>& body) {
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
std::pair<llvm::Function*, Value*> Lowerer::outline(const std::string& name, const std::vector<llvm::Type*>& extra,
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
void Lowerer::nest(const Shape& shape, std::vector<Stream> streams,
                   const std::function<void(const std::vector<Value*>&)>& body, int64_t ops, bool keep_short_inner) {
  if (num_elements(shape) == 0) return;
  MergedDims merged = merge_dims(shape, streams);
  const Shape& dims = merged.dims;
  const std::vector<std::vector<int64_t>>& st = merged.strides;
  const bool keep = keep_short_inner && !dims.empty() && dims.back() <= 16;
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
      nest_level(dims, st, k, o, body, keep);
    });
    return;
  }
  nest_level(dims, st, 0, off, body, keep);
}

void Lowerer::nest_level(const Shape& dims, const std::vector<std::vector<int64_t>>& st, size_t d,
                         const std::vector<Value*>& off, const std::function<void(const std::vector<Value*>&)>& body,
                         bool keep_inner) {
  if (d == dims.size()) {
    body(off);
    return;
  }
  for_loop(dims[d], [&](Value* iv) {
    std::vector<Value*> next(off.size());
    for (size_t k = 0; k < off.size(); ++k)
      next[k] = st[k][d] == 0 ? off[k] : B_.CreateAdd(off[k], st[k][d] == 1 ? iv : B_.CreateMul(iv, c64(st[k][d])), "", true, true);
    nest_level(dims, st, d + 1, next, body, keep_inner);
  }, keep_inner && d + 1 == dims.size());
}

}  // namespace kiln::cpu::detail
