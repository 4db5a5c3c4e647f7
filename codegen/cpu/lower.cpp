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
#include "ir/interp.h"
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
  B_.CreateCall(runtime(RtFn::kiln_rt_run_begin), {});
  lower_level(g_, kp_, ptr, /*top=*/true, cursor);
  B_.CreateCall(runtime(RtFn::kiln_rt_run_end), {});
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
  // Body loops whose result a sum or mean that follows computes itself (fold_reduce_loads).
  std::map<size_t, std::vector<int64_t>> folded;
  if (!top)
    for (size_t q = 0; q + 1 < kp.kernels.size(); ++q)
      if (auto rs = fold_reduce_loads(g, kp, q)) folded[q] = std::move(*rs);
  auto emit_here = [&](int item) {
    if (item < 0) return;
    const Kernel& k = kp.kernels[static_cast<size_t>(item)];
    if (folded.count(static_cast<size_t>(item))) return;  // emitted with the reduction
    if (item > 0 && folded.count(static_cast<size_t>(item - 1)))
      return lower_folded_reduce(g, kp.kernels[static_cast<size_t>(item - 1)], k, folded.at(static_cast<size_t>(item - 1)), ptr);
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
  // The all_reduce nodes started and not yet waited for (runtime/collective.h: their sums may
  // run on the communication thread while the kernels between go on), by node: each is
  // waited for in the entry just before the first node that reads its result, the rest at
  // the end. A collective is a kernel boundary: there is none in a fused body.
  std::vector<size_t> in_flight;
  const bool profile = top && options_.profile;
  auto wait = [&](size_t c) {
    const auto node = B_.getInt32(static_cast<uint32_t>(c));
    if (profile) B_.CreateCall(runtime(RtFn::kiln_rt_prof_begin), {node});
    B_.CreateCall(runtime(RtFn::kiln_rt_all_reduce_wait), {ptr[nodes[c].result().id]});
    if (profile) B_.CreateCall(runtime(RtFn::kiln_rt_prof_extend), {node});  // the collective's time, not the reader's
  };
  auto wait_for_operands = [&](const Node& n) {
    std::erase_if(in_flight, [&](size_t c) {
      const ValueId r = nodes[c].result();
      if (std::find(n.operands.begin(), n.operands.end(), r) == n.operands.end()) return false;
      wait(c);
      return true;
    });
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!profile && item_of[i] < 0) continue;  // a constant: at the top level only profiled
    wait_for_operands(nodes[i]);
    if (profile) B_.CreateCall(runtime(RtFn::kiln_rt_prof_begin), {B_.getInt32(static_cast<uint32_t>(i))});
    if (item_of[i] >= 0) emit_here(items[static_cast<size_t>(item_of[i])]);
    if (profile) B_.CreateCall(runtime(RtFn::kiln_rt_prof_end), {B_.getInt32(static_cast<uint32_t>(i))});
    if (nodes[i].op == Op::AllReduce) {
      KILN_CHECK(top, "cpu codegen: an all_reduce inside a fused body");
      in_flight.push_back(i);
    }
  }
  for (size_t c : in_flight) wait(c);
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
//
// A loop whose results are in NCHW16c (layout.cpp: a top-level elementwise node, or the body
// of a fused region of them) runs over [N, C/16, H, W, 16]: its values of its shape are read
// and written in that order, the others (NCHW, broadcast) at their channel's offset.
void Lowerer::lower_loop(const Graph& g, const Kernel& k, std::vector<Value*>& ptr) {
  const auto blocked = [&](ValueId v) {
    if (&g == &g_) return !nchwc_.empty() && nchwc_[static_cast<size_t>(v.id)];
    return !blocked_body_.empty() && g.type(v).shape == blocked_body_;
  };
  std::vector<Stream> streams;
  for (ValueId v : k.loads) streams.push_back({broadcast_strides(g.type(v).shape, k.shape), 0});
  size_t out_stream = streams.size();
  streams.push_back({strides_of(k.shape), 0});
  Shape shape = k.shape;
  const bool blocked_loop = !k.stores.empty() && blocked(k.stores[0]);
  if (blocked_loop) {
    KILN_CHECK(shape.size() == 4 && shape[1] % 16 == 0, "cpu codegen: an NCHW16c loop over a shape not [N, 16c, H, W]");
    shape = {shape[0], shape[1] / 16, shape[2], shape[3], 16};
    const std::vector<int64_t> dense = strides_of(shape);
    for (size_t s = 0; s < k.loads.size(); ++s) {
      std::vector<int64_t>& st = streams[s].strides;
      st = blocked(k.loads[s]) ? dense : std::vector<int64_t>{st[0], 16 * st[1], st[2], st[3], st[1]};
    }
    for (ValueId v : k.stores) KILN_CHECK(blocked(v), "cpu codegen: an NCHW16c loop storing an NCHW value");
    streams[out_stream].strides = dense;
  }
  access_group_ = llvm::MDNode::getDistinct(C_, {});  // lowerer.h: mark_access
  nest(shape, streams, [&](const std::vector<Value*>& off) {
    std::vector<Value*> at(off.begin(), off.begin() + static_cast<std::ptrdiff_t>(k.loads.size()));
    std::map<int32_t, Value*> val = loop_element(g, k, ptr, at);
    // Every load above precedes every store: the in-place contract.
    for (ValueId v : k.stores) store(g.type(v).dtype, val.at(v.id), ptr[v.id], off[out_stream]);
  }, static_cast<int64_t>(k.nodes.size()), blocked_loop);
  access_group_ = nullptr;
}

// One element of loop kernel k: its loads (load s at offset at[s]) and its nodes' values, by
// value id.
std::map<int32_t, Value*> Lowerer::loop_element(const Graph& g, const Kernel& k, const std::vector<Value*>& ptr,
                                                const std::vector<Value*>& at) {
  std::map<int32_t, Value*> val;
  for (size_t s = 0; s < k.loads.size(); ++s) {
    ValueId v = k.loads[s];
    KILN_CHECK(ptr[v.id] != nullptr, "cpu codegen: operand without storage");
    val[v.id] = load(g.type(v).dtype, ptr[v.id], at[s]);
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
  return val;
}

// Streams of x's size a folded loop may have (fold_reduce_loads).
constexpr std::ptrdiff_t kFoldStreams = 3;

// A fused body's loop kernel `loop` followed by the f32 sum or mean `red` of one of its
// stores, x, which nothing else reads (a scratch value), over rows that go sixteen at a time
// (sixteen_row_sums, m a multiple of 16), each of the loop's loads read either like x or
// along the kept dims only (a batch norm's per-channel mean or scale) or as a scalar: the
// reduction computes x's elements itself, sixteen rows by sixteen elements into a tile on the
// stack, storing the loop's other stores as it goes, instead of the loop writing x to scratch
// and the reduction reading it back (a batch norm's variance over [16, 64, 112, 112]: 51 MB
// written and read again; with the fold, 0.42x the time). Every element of x is one row's
// element: each is computed once. The tile's loop over a row's 16 elements is kept a loop
// (for_loop's `keep`) so that the vectorizer makes it one vector step.
// Returns the row stride of each load (-1: read like x; 0: a scalar), or nothing.
std::optional<std::vector<int64_t>> Lowerer::fold_reduce_loads(const Graph& g, const KernelPlan& kp, size_t q) {
  if (q + 1 >= kp.kernels.size()) return std::nullopt;
  const Kernel& loop = kp.kernels[q];
  const Kernel& red = kp.kernels[q + 1];
  if (loop.kind != KernelKind::Loop || red.kind != KernelKind::Op) return std::nullopt;
  const Node& r = g.nodes()[static_cast<size_t>(red.nodes[0])];
  if ((r.op != Op::Sum && r.op != Op::Mean) || g.type(r.result()).dtype != DType::f32) return std::nullopt;
  const ValueId x = r.operands[0];
  if (std::find(loop.stores.begin(), loop.stores.end(), x) == loop.stores.end() || kp.at(x).kind != Storage::Scratch)
    return std::nullopt;
  int uses = 0;
  for (const Node& n : g.nodes())
    for (ValueId v : n.operands) uses += v == x;
  if (uses != 1) return std::nullopt;
  const Shape& xs = g.type(x).shape;
  const std::set<int64_t> axes = reduce_axes(r, static_cast<int64_t>(xs.size()));
  const int64_t m = g.type(r.result()).numel();
  const ReduceView view = reduce_view(xs, axes);
  if (!view.rows || !sixteen_rows(*view.rows, m) || m % 16 != 0 || g.type(x).numel() / m <= kSumBlock)
    return std::nullopt;
  const std::vector<int64_t> contiguous = strides_of(xs);
  std::vector<int64_t> row_strides;
  for (ValueId v : loop.loads) {
    const std::vector<int64_t> bs = broadcast_strides(g.type(v).shape, xs);
    bool like_x = true;
    int64_t row = 0, last_kept = -1;  // the stride along the kept dims' run
    bool along_kept = true;
    for (size_t d = 0; d < xs.size(); ++d) {
      if (xs[d] == 1) continue;
      like_x = like_x && bs[d] == contiguous[d];
      if (axes.count(static_cast<int64_t>(d))) {
        along_kept = along_kept && bs[d] == 0;
      } else {
        along_kept = along_kept && (last_kept < 0 || bs[static_cast<size_t>(last_kept)] == xs[d] * bs[d]);
        last_kept = static_cast<int64_t>(d);
        row = bs[d];
      }
    }
    if (like_x) row_strides.push_back(-1);
    else if (along_kept) row_strides.push_back(row);
    else return std::nullopt;
  }
  // Sixteen rows of every stream of x's size (a load read like x, a store other than x) are
  // in flight at once: with more than three such streams the fold lost to the loop's plain
  // streaming and the scratch round trip (six: 1.1-1.4x the time; three or four: even).
  const auto streams = std::count(row_strides.begin(), row_strides.end(), -1) +
                       static_cast<std::ptrdiff_t>(loop.stores.size()) - 1;
  if (streams > kFoldStreams) return std::nullopt;
  return row_strides;
}

void Lowerer::lower_folded_reduce(const Graph& g, const Kernel& loop, const Kernel& red, const std::vector<int64_t>& row_strides,
                                  std::vector<Value*>& ptr) {
  const Node& r = g.nodes()[static_cast<size_t>(red.nodes[0])];
  const ValueId x = r.operands[0];
  const Shape& xs = g.type(x).shape;
  const RowRuns runs = *reduce_view(xs, reduce_axes(r, static_cast<int64_t>(xs.size()))).rows;
  const int64_t m = g.type(r.result()).numel(), count = g.type(x).numel() / m;
  llvm::Type* ft = B_.getFloatTy();
  auto* vt = llvm::FixedVectorType::get(ft, 16);
  llvm::Type* tile_t = llvm::ArrayType::get(ft, 256);
  const auto work = count * 16 * static_cast<int64_t>(loop.nodes.size() + 1);
  par_for(m / 16, work, [&](Value* grp) {
    Value* j0 = B_.CreateMul(grp, c64(16), "", true, true);
    Value* tile = alloca(tile_t);
    sixteen_row_sums(j0, count, runs, [&](Value* at, std::array<Value*, 16>& rows) {
      access_group_ = llvm::MDNode::getDistinct(C_, {});
      for_loop(16, [&](Value* i) {
        Value* j = B_.CreateAdd(j0, i, "", true, true);
        Value* start = B_.CreateAdd(B_.CreateMul(j, c64(runs.row_stride), "", true, true), at, "", true, true);
        // Each row's streams prefetched four chunks (256 bytes) on: sixteen rows of each
        // stream are in flight at once, more than the hardware prefetcher follows (without
        // it the fold of two streams gained little and the fold of three lost).
        auto prefetch = [&](ValueId v, int write) {
          // Not inbounds: the last chunks prefetch past the buffer (a prefetch never faults).
          Value* p = B_.CreateGEP(ty(g.type(v).dtype), ptr[v.id], B_.CreateAdd(start, c64(64)));
          B_.CreateIntrinsic(llvm::Intrinsic::prefetch, {p->getType()}, {p, B_.getInt32(write), B_.getInt32(3), B_.getInt32(1)});
        };
        for (size_t s = 0; s < loop.loads.size(); ++s)
          if (row_strides[s] < 0) prefetch(loop.loads[s], 0);
        for (ValueId v : loop.stores)
          if (v != x) prefetch(v, 1);
        for_loop(16, [&](Value* k) {
          Value* off = B_.CreateAdd(start, k, "", true, true);
          std::vector<Value*> offs;
          for (int64_t rs : row_strides) offs.push_back(rs < 0 ? off : B_.CreateMul(j, c64(rs), "", true, true));
          std::map<int32_t, Value*> val = loop_element(g, loop, ptr, offs);
          for (ValueId v : loop.stores)
            if (v != x) store(g.type(v).dtype, val.at(v.id), ptr[v.id], off);
          store(DType::f32, val.at(x.id), tile, B_.CreateAdd(B_.CreateMul(i, c64(16), "", true, true), k, "", true, true));
        }, /*keep=*/true);
      });
      access_group_ = nullptr;
      for (int64_t i = 0; i < 16; ++i)
        rows[static_cast<size_t>(i)] = B_.CreateAlignedLoad(vt, B_.CreateConstInBoundsGEP1_64(ft, tile, static_cast<uint64_t>(16 * i)),
                                                            llvm::Align(4));
    }, ptr[r.result().id], r.op == Op::Mean);
  });
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
