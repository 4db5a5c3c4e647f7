// Graph -> LLVM IR for the CPU backend: a translation of the kernel plan
// (passes/kernel_plan.h). One function, the entry (kiln_entry in the JIT), runs the planned kernels in order: a
// loop kernel becomes one loop nest (its intermediates in registers), the other kernels
// are emitted by op_kernels.cpp, a fused region's body recursively.
#include "codegen/cpu/lowerer.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string_view>

#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>

#include "ir/calling.h"
#include "ir/error.h"

namespace kiln::cpu::detail {

std::unique_ptr<llvm::Module> Lowerer::run() {
  auto* fty = llvm::FunctionType::get(B_.getVoidTy(), {ptr_, ptr_}, false);
  F_ = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, options_.entry_name, M_.get());
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
  if (options_.gemm_cache && !updates_state(signature(g_))) {
    gemm_cache_ = B_.CreateLoad(ptr_, B_.CreateConstInBoundsGEP1_64(ptr_, buffers, g_.inputs().size()), "gemm.cache");
    weight_.assign(g_.values().size(), false);
    for (const GraphInput& gi : g_.inputs()) weight_[gi.value.id] = gi.is_state;
    for (const Node& n : g_.nodes())
      if (n.op == Op::Constant) weight_[n.result().id] = true;
  }
  for (size_t v = 0; v < g_.values().size(); ++v) {
    const ValuePlan& vp = plan_.values[v];
    if (vp.kind == BufferKind::Arena)
      ptr[v] = B_.CreateConstInBoundsGEP1_64(i8_, arena, static_cast<uint64_t>(vp.offset));
    else if (vp.kind == BufferKind::StateInPlace)
      ptr[v] = input_ptr.at(static_cast<size_t>(g_.value(vp.state).input));
  }
  if (options_.nchwc) nchwc_ = nchwc_values(g_);
  int64_t cursor = 0;
  lower_level(g_, kp_, ptr, /*top=*/true, cursor);
  B_.CreateRetVoid();
  info_.scratch_bytes = scratch_peak_;
  info_.parallel_loops = tasks_;
  info_.gemm_cache_slots = gemm_cache_slots_;
  for (const auto& s : runtime_) info_.runtime_symbols.push_back(s);
  return std::move(M_);
}

// Lowers the kernels `kp` of `g` (the top-level graph, or a fused body) given pointers for
// its inputs (and, at the top level, every planned value; for a body, its results via
// `out_ptr`). A body's scratch values start at `cursor`, which ends past them and past
// the temporaries its kernels take.
void Lowerer::lower_level(const Graph& g, const KernelPlan& kp, std::vector<Value*>& ptr, bool top, int64_t& cursor,
                          const std::vector<Value*>& out_ptr) {
  const auto& nodes = g.nodes();
  if (!top) {
    for (size_t v = 0; v < kp.values.size(); ++v)
      if (kp.values[v].kind == Storage::Output) ptr[v] = out_ptr.at(static_cast<size_t>(kp.values[v].index));
    for (size_t v = 0; v < kp.values.size(); ++v)
      if (kp.values[v].kind == Storage::Alias) ptr[v] = ptr[kp.values[v].alias.id];
    for (const Node& n : nodes)
      for (ValueId r : n.results)
        if (kp.at(r).kind == Storage::Scratch)
          ptr[r.id] = B_.CreateConstInBoundsGEP1_64(i8_, scratch_, static_cast<uint64_t>(cursor + kp.at(r).offset));
    cursor += kp.scratch_bytes;
    scratch_peak_ = std::max(scratch_peak_, cursor);
  }
  for (const Node& n : nodes)
    if (n.op == Op::Constant && kp.at(n.result()).in_memory) {
      Value* c = global_constant(n);
      // An instruction of the entry: a kernel function gets its address in its ctx like
      // any other buffer's (outline passes instructions), so that kernels equal but for
      // their constants' values are one function.
      // So is a fused body's constant: made where the kernel function is called.
      if (top) {
        c = B_.Insert(llvm::GetElementPtrInst::CreateInBounds(i8_, c, {c64(0)}), "const.ptr");
      } else if (kernel_caller_) {
        auto* gep = llvm::GetElementPtrInst::CreateInBounds(i8_, c, {c64(0)}, "const.ptr");
        gep->insertInto(kernel_caller_, kernel_caller_->end());
        c = gep;
      }
      ptr[n.result().id] = c;
    }

  // Items in node order: the kernels and, at the top level, the elided transposes (one
  // node each there, which the profile and the split into functions count).
  std::vector<int> items;  // kernel index, or -1 for an elided node
  std::vector<int> item_of(nodes.size(), -1);
  size_t next_kernel = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].op == Op::Constant) continue;
    bool starts = next_kernel < kp.kernels.size() && kp.kernels[next_kernel].nodes[0] == static_cast<int32_t>(i);
    if (starts) items.push_back(static_cast<int>(next_kernel++));
    else if (top) items.push_back(-1);
    else continue;
    item_of[i] = static_cast<int>(items.size() - 1);
  }
  auto emit_here = [&](int item) {
    if (item < 0) return;
    const Kernel& k = kp.kernels[static_cast<size_t>(item)];
    if (top) {
      // A function of its own (share.cpp), scratch from the area's start.
      return kernel_function([&] {
        int64_t at = 0;
        if (k.kind == KernelKind::Loop) lower_loop(g, k, ptr);
        else lower_node(g, k, ptr, at);
      });
    }
    if (k.kind == KernelKind::Loop) return lower_loop(g, k, ptr);
    lower_node(g, k, ptr, cursor);
  };
  if (top && options_.profile) {
    // At the top level every item is one node: time each node, constants included.
    llvm::FunctionCallee begin = runtime(RtFn::kiln_rt_prof_begin);
    llvm::FunctionCallee end = runtime(RtFn::kiln_rt_prof_end);
    for (size_t i = 0; i < nodes.size(); ++i) {
      B_.CreateCall(begin, {B_.getInt32(static_cast<uint32_t>(i))});
      if (item_of[i] >= 0) emit_here(items[static_cast<size_t>(item_of[i])]);
      B_.CreateCall(end, {B_.getInt32(static_cast<uint32_t>(i))});
    }
  } else {
    for (int item : items) emit_here(item);
  }
  if (top) {
    // LLVM's optimizer and register allocator cost more than linear time in a function's
    // length: a graph of thousands of kernels in one function took minutes to compile. A
    // long graph's kernels stay functions (noinline: the inliner would undo it); kernels
    // share nothing but memory, so nothing is lost. A short graph's kernels called once
    // are inlined into kiln_entry, where separate functions would only add compile time.
    size_t total = 0;  // nodes, a fused node's body counted in full
    for (int item : items)
      total += item < 0 ? 1 : [&] {
        const Node& n = nodes[static_cast<size_t>(kp.kernels[static_cast<size_t>(item)].nodes[0])];
        return n.body ? n.body->nodes().size() : size_t{1};
      }();
    finish_kernel_functions(total > kNodesInEntry);
  }
  for (const BodyCopy& c : kp.copies) {
    const TensorType& t = g.type(c.value);
    copy_bytes(out_ptr.at(static_cast<size_t>(c.output)), ptr[c.value.id], t.numel() * static_cast<int64_t>(dtype_size(t.dtype)));
  }
}

// One loop over the kernel's shape: load its loads, compute its nodes in registers (splat
// constants as immediates), store its stores.
void Lowerer::lower_loop(const Graph& g, const Kernel& k, std::vector<Value*>& ptr) {
  std::vector<Stream> streams;
  for (ValueId v : k.loads) streams.push_back({broadcast_strides(g.type(v).shape, k.shape), 0});
  size_t out_stream = streams.size();
  streams.push_back({strides_of(k.shape), 0});
  access_group_ = llvm::MDNode::getDistinct(C_, {});  // lowerer.h: mark_access
  nest(k.shape, streams, [&](const std::vector<Value*>& off) {
    std::map<int32_t, Value*> val;
    for (size_t s = 0; s < k.loads.size(); ++s) {
      ValueId v = k.loads[s];
      KILN_CHECK(ptr[v.id] != nullptr, "cpu codegen: operand without storage");
      val[v.id] = load(g.type(v).dtype, ptr[v.id], off[s]);
    }
    for (int32_t i : k.nodes) {
      const Node& n = g.nodes()[static_cast<size_t>(i)];
      std::vector<Value*> args;
      for (ValueId v : n.operands) {
        auto it = val.find(v.id);
        args.push_back(it != val.end() ? it->second : splat(g, v));
        KILN_CHECK(args.back() != nullptr, "cpu codegen: a loop operand neither loaded, computed nor an immediate");
      }
      DType in = g.type(n.operands.back()).dtype;
      val[n.result().id] = ew(n, in, g.type(n.result()).dtype, args);
    }
    // Every load above precedes every store: the in-place contract.
    for (ValueId v : k.stores) store(g.type(v).dtype, val.at(v.id), ptr[v.id], off[out_stream]);
  }, static_cast<int64_t>(k.nodes.size()));
  access_group_ = nullptr;
}

namespace {
bool codegen_baseline() {
  const char* e = std::getenv("KILN_CODEGEN_BASELINE");
  return e && std::string_view(e) == "1";
}
}  // namespace

std::unique_ptr<llvm::Module> lower_graph(const Graph& g, const MemoryPlan& plan, const KernelPlan& kernels,
                                          llvm::LLVMContext& ctx, LoweringInfo& info, const LowerOptions& options) {
  LowerOptions o = options;
  if (codegen_baseline()) o.parallel = false;
  if (const char* e = std::getenv("KILN_NCHWC"); e && std::string_view(e) == "0") o.nchwc = false;
  Lowerer l(g, plan, kernels, ctx, info, o);
  return l.run();
}

}  // namespace kiln::cpu::detail
