// The CUDA renderer: a prepared graph (codegen/backend.h) to one CUDA C program plus the
// launches that run it. How the kernel plan (passes/kernel_plan.h) maps to launches:
//  - Loop kernel   -> one kernel kiln_kN: a grid-stride loop over the loop's shape; at
//                     element i it loads every operand read from memory (broadcast by
//                     literal strides from i's coordinates), computes the nodes in order as
//                     C expressions (render_expr.cpp) in registers, then stores the stored
//                     results at i. All loads precede all stores, as the memory plan's
//                     in-place rule requires. Splat constants are exact literals.
//  - Gemm kernel   -> one cuBLAS strided-batched GEMM (Launch::Gemm), transposes as flags;
//                     leading batch dims broadcast with a batch stride of 0, and where one
//                     stride cannot express the batch layout, one launch per outer index.
//  - Op kernel     -> one kernel (render_kernels.cpp, render_reduce.cpp); a folded
//                     (elided) transpose and a constant produce nothing.
//  - Region kernel -> the body plan's kernels, each rendered as above against the body's
//                     storage (scratch, the fused node's operands and results, aliases),
//                     then a Launch::Copy per BodyCopy.
// Every address is a literal: `arena + OFFSET` for the arena and the scratch area behind
// it (the plan's, then the renderer's private scratch: Emitter::scratch), `bufs[I] + OFFSET` for graph inputs (state included) and, after them, the materialized
// constants (Rendered::constants; a constant that only loops read as a splat is never
// materialized, and a body's constants are listed there too).
#include "codegen/cuda/render.h"

#include <map>
#include <optional>

#include "codegen/cuda/render_internal.h"
#include "ir/error.h"

namespace kiln::cuda {

namespace detail {

namespace {

constexpr int64_t kMaxGrid = 16384;  // blocks of a grid-stride loop

int64_t align64(int64_t x) { return (x + 63) / 64 * 64; }

}  // namespace

std::string pointer(const Ref& r, DType t) {
  std::string base = r.base == Ref::Base::Arena ? "arena" : "((unsigned char*)bufs[" + std::to_string(r.index) + "])";
  return "((" + ctype(t) + "*)(" + base + " + " + std::to_string(r.offset) + "))";
}

void Emitter::kernel(const std::string& body, int64_t grid, int64_t block) {
  std::string name = "kiln_k" + std::to_string(kernels_++);
  source_ += "// " + label_ + "\nextern \"C\" __global__ void " + name +
             "(unsigned char* __restrict__ arena, void* const* __restrict__ bufs) {\n" + body + "}\n\n";
  Launch l;
  l.kind = Launch::Kind::Kernel;
  l.kernel.name = name;
  l.kernel.grid = {grid, 1, 1};
  l.kernel.block = {block, 1, 1};
  l.node = node_;
  launches_.push_back(std::move(l));
}

void Emitter::elementwise(int64_t n, int64_t extent, const std::string& decls, const std::string& body) {
  if (n <= 0) return;
  std::string it = index_type(std::max(n, extent));
  int64_t block = std::min<int64_t>(block_size_, (n + 31) / 32 * 32);
  int64_t grid = std::min<int64_t>((n + block - 1) / block, kMaxGrid);
  std::string s = decls;
  s += "  for (" + it + " i = (" + it + ")blockIdx.x * (" + it + ")blockDim.x + (" + it + ")threadIdx.x; i < " +
       std::to_string(n) + "; i += (" + it + ")gridDim.x * (" + it + ")blockDim.x) {\n";
  s += body + "  }\n";
  kernel(s, grid, block);
}

void Emitter::all_reduce(const CollectiveLaunch& c) {
  if (c.count <= 0) return;
  Launch l;
  l.kind = Launch::Kind::AllReduce;
  l.collective = c;
  l.node = node_;
  launches_.push_back(std::move(l));
}

void Emitter::gemm(const GemmLaunch& g) {
  Launch l;
  l.kind = Launch::Kind::Gemm;
  l.gemm = g;
  l.node = node_;
  launches_.push_back(std::move(l));
}

Ref Emitter::scratch(int64_t bytes) {
  KILN_CHECK(scratch_offset_ >= 0, "cuda render: private scratch asked for before its offset was set");
  scratch_bytes_ = std::max(scratch_bytes_, bytes);
  return {Ref::Base::Arena, -1, scratch_offset_};
}

void Emitter::copy(const Ref& dst, const Ref& src, int64_t bytes) {
  if (bytes <= 0 || (dst.base == src.base && dst.index == src.index && dst.offset == src.offset)) return;
  Launch l;
  l.kind = Launch::Kind::Copy;
  l.copy_dst = dst;
  l.copy_src = src;
  l.copy_bytes = bytes;
  l.node = node_;
  launches_.push_back(std::move(l));
}

namespace {

// A splat constant (one element standing for all): its one element, else null.
const Tensor* splat_value(const Graph& g, ValueId v) {
  const Node* n = g.defining_node(v);
  if (!n || n->op != Op::Constant) return nullptr;
  const Tensor& t = attr_tensor(n->attrs, "value");
  return t.numel() == 1 || t.is_splat() ? &t : nullptr;
}

// One graph level (the top level, or a fused node's body) and where its values live.
struct Level {
  const Graph& g;
  const KernelPlan& kp;
  Level* parent = nullptr;
  const Node* fused = nullptr;  // the parent's node whose body this is
  std::map<int32_t, int32_t> constants;  // ValueId -> index into Rendered::constants
  // Where this level's scratch offsets start: a body nested in a body puts its
  // intermediates after its parent's (each body plan counts from 0).
  int64_t scratch_base = 0;
};

class Renderer {
 public:
  Renderer(const Prepared& p, const RenderOptions& o) : p_(p), out_(o.block_size) {
    r_.arena_bytes = p.memory.report.arena_bytes;
    r_.scratch_offset = align64(r_.arena_bytes);
    r_.scratch_bytes = p.kernels.scratch_bytes;
    r_.constant_index.assign(p.graph.values().size(), -1);
    plan_scratch_ = align64(plan_scratch_end(p.kernels, 0, true));
    out_.set_scratch_offset(r_.scratch_offset + plan_scratch_);
  }

  Rendered run() {
    Level top{p_.graph, p_.kernels, nullptr, nullptr, {}, 0};
    for (const Kernel& k : p_.kernels.kernels) {
      out_.set_node(k.nodes.empty() ? -1 : k.nodes[0]);
      kernel(top, k);
    }
    // The runtime hands out a constant output from its device copy.
    for (const GraphOutput& o : p_.graph.outputs())
      if (p_.graph.defining_node(o.value) && p_.graph.defining_node(o.value)->op == Op::Constant) ref(top, o.value);
    if (out_.scratch_bytes() > 0) r_.scratch_bytes = plan_scratch_ + out_.scratch_bytes();
    r_.source = prelude() + "\n" + out_.source();
    r_.launches = std::move(out_.launches());
    return std::move(r_);
  }

 private:
  int32_t inputs() const { return static_cast<int32_t>(p_.graph.inputs().size()); }

  // Where the scratch of plan `kp` and of its bodies ends, the plan starting at `base`: a
  // top-level region's body counts from 0, a nested body after its parent's (as kernel()
  // places them). The renderer's private scratch goes after it.
  static int64_t plan_scratch_end(const KernelPlan& kp, int64_t base, bool top) {
    int64_t end = base + kp.scratch_bytes;
    for (const Kernel& k : kp.kernels)
      if (k.kind == KernelKind::Region && k.body)
        end = std::max(end, plan_scratch_end(*k.body, top ? 0 : base + kp.scratch_bytes, false));
    return end;
  }

  Ref constant(Level& L, ValueId v) {
    auto it = L.constants.find(v.id);
    if (it == L.constants.end()) {
      const Node* n = L.g.defining_node(v);
      KILN_CHECK(n && n->op == Op::Constant, "cuda render: constant storage for a value no constant defines");
      it = L.constants.emplace(v.id, static_cast<int32_t>(r_.constants.size())).first;
      r_.constants.push_back(attr_tensor(n->attrs, "value").materialized());
      if (!L.parent) r_.constant_index[static_cast<size_t>(v.id)] = it->second;
    }
    return {Ref::Base::Buffer, inputs() + it->second, 0};
  }

  Ref planned(Level& L, ValueId v) {
    KILN_CHECK(!L.parent, "cuda render: a body value with planned storage");
    const ValuePlan& vp = p_.memory.at(v);
    switch (vp.kind) {
      case BufferKind::Arena: return {Ref::Base::Arena, -1, vp.offset};
      case BufferKind::Input:
      case BufferKind::State: return {Ref::Base::Buffer, L.g.value(v).input, 0};
      case BufferKind::StateInPlace: return {Ref::Base::Buffer, L.g.value(vp.state).input, 0};
      case BufferKind::Constant: return constant(L, v);
    }
    internal_error("kind", "cuda render: unknown buffer kind");
  }

  // Where value v of level L lives in memory.
  Ref ref(Level& L, ValueId v) {
    if (static_cast<size_t>(v.id) >= L.kp.values.size()) return planned(L, v);
    const ValueStorage& s = L.kp.at(v);
    switch (s.kind) {
      case Storage::Planned: return planned(L, v);
      case Storage::Scratch: return {Ref::Base::Arena, -1, r_.scratch_offset + L.scratch_base + s.offset};
      case Storage::Output: return ref(*L.parent, L.fused->results.at(static_cast<size_t>(s.index)));
      case Storage::Input: return ref(*L.parent, L.fused->operands.at(static_cast<size_t>(s.index)));
      case Storage::Alias: return ref(L, s.alias);
      case Storage::Constant: return constant(L, v);
      case Storage::Register:
      case Storage::Elided: break;
    }
    internal_error("storage", "cuda render: value %" + std::to_string(v.id) + " of @" + L.g.name() + " is " +
                                  std::string(storage_name(s.kind)) + ", not in memory");
  }
  std::string ptr(Level& L, ValueId v) { return pointer(ref(L, v), L.g.type(v).dtype); }

  void kernel(Level& L, const Kernel& k) {
    // "node 7 (fused @body): mul, neg -> f32[64,10]": the top-level node, the ops, the type.
    std::string label = "node " + std::to_string(L.parent ? L.fused - L.parent->g.nodes().data() : k.nodes.at(0)) +
                        (L.parent ? " (fused @" + L.g.name() + "):" : ":");
    for (size_t j = 0; j < k.nodes.size(); ++j)
      label += (j ? ", " : " ") + std::string(op_name(L.g.nodes()[static_cast<size_t>(k.nodes[j])].op));
    label += " -> " + L.g.type(L.g.nodes()[static_cast<size_t>(k.nodes.back())].results.at(0)).str();
    out_.set_label(label);
    switch (k.kind) {
      case KernelKind::Loop: return loop(L, k);
      case KernelKind::Gemm: return gemm(L, k);
      case KernelKind::Op: {
        const Node& n = L.g.nodes().at(static_cast<size_t>(k.nodes.at(0)));
        if (n.op == Op::Constant) return;  // materialized where it is read
        if (n.op == Op::AllReduce) {
          const TensorType& t = L.g.type(n.result());
          out_.copy(ref(L, n.result()), ref(L, n.operands[0]), t.numel() * static_cast<int64_t>(dtype_size(t.dtype)));
          return out_.all_reduce({t.dtype, t.numel(), ref(L, n.result())});
        }
        if (static_cast<size_t>(n.result().id) < L.kp.values.size() && L.kp.at(n.result()).kind == Storage::Elided)
          return;  // a transpose folded into its GEMMs
        return render_op(out_, L.g, n, [&](ValueId v) { return ptr(L, v); });
      }
      case KernelKind::Region: {
        const Node& n = L.g.nodes().at(static_cast<size_t>(k.nodes.at(0)));
        KILN_CHECK(n.body && k.body, "cuda render: region kernel without a body or a body plan");
        Level body{*n.body, *k.body, &L, &n, {}, L.parent ? L.scratch_base + L.kp.scratch_bytes : 0};
        r_.scratch_bytes = std::max(r_.scratch_bytes, body.scratch_base + k.body->scratch_bytes);
        for (const Kernel& bk : k.body->kernels) kernel(body, bk);
        for (const BodyCopy& c : k.body->copies) {
          const TensorType& t = n.body->type(c.value);
          out_.copy(ref(L, n.results.at(static_cast<size_t>(c.output))), ref(body, c.value),
                    t.numel() * static_cast<int64_t>(dtype_size(t.dtype)));
        }
        return;
      }
    }
  }

  void loop(Level& L, const Kernel& k) {
    const Graph& g = L.g;
    int64_t n = num_elements(k.shape);
    std::map<int32_t, bool> inside;
    for (int32_t i : k.nodes)
      for (ValueId r : g.nodes()[static_cast<size_t>(i)].results) inside[r.id] = true;
    std::vector<ValueId> loads;
    std::map<int32_t, bool> loaded;
    for (int32_t i : k.nodes)
      for (ValueId v : g.nodes()[static_cast<size_t>(i)].operands)
        if (!inside.count(v.id) && !splat_value(g, v) && !loaded[v.id]) {
          loaded[v.id] = true;
          loads.push_back(v);
        }
    auto var = [](ValueId v) { return "v" + std::to_string(v.id); };
    std::string decls, body;
    std::vector<Stream> streams;
    for (size_t j = 0; j < loads.size(); ++j) {
      const TensorType& t = g.type(loads[j]);
      decls += "  " + ctype(t.dtype) + "* L" + std::to_string(j) + " = " + ptr(L, loads[j]) + ";\n";
      streams.push_back({broadcast_strides(t.shape, k.shape), 0});
    }
    body += stream_offsets(k.shape, streams, "i", index_type(n), "o", "    ");
    for (size_t j = 0; j < loads.size(); ++j)
      body += "    " + ctype(g.type(loads[j]).dtype) + " " + var(loads[j]) + " = L" + std::to_string(j) + "[o" +
              std::to_string(j) + "];\n";
    for (int32_t i : k.nodes) {
      const Node& nd = g.nodes()[static_cast<size_t>(i)];
      if (nd.op == Op::Constant) continue;  // a literal or a load where it is read
      std::vector<std::string> args;
      for (ValueId v : nd.operands) {
        const Tensor* s = splat_value(g, v);
        args.push_back(s ? literal(*s, 0) : var(v));
      }
      DType in = g.type(nd.operands.back()).dtype, out = g.type(nd.result()).dtype;
      body += "    " + ctype(out) + " " + var(nd.result()) + " = " + ew_expr(nd, in, out, args) + ";\n";
    }
    for (size_t j = 0; j < k.stores.size(); ++j) {
      ValueId v = k.stores[j];
      decls += "  " + ctype(g.type(v).dtype) + "* S" + std::to_string(j) + " = " + ptr(L, v) + ";\n";
      body += "    S" + std::to_string(j) + "[i] = " + var(v) + ";\n";
    }
    out_.elementwise(n, n, decls, body);
  }

  void gemm(Level& L, const Kernel& k) {
    const Graph& g = L.g;
    const Node& mm = g.nodes().at(static_cast<size_t>(k.nodes.at(0)));
    const TensorType& rt = g.type(mm.result());
    const Shape& as = g.type(mm.operands[0]).shape;  // logical (after any transpose) shapes
    const Shape& bs = g.type(mm.operands[1]).shape;
    int64_t m = as[as.size() - 2], kk = as[as.size() - 1], n = bs[bs.size() - 1];
    GemmLaunch gl;
    gl.dtype = rt.dtype;
    gl.trans_a = k.trans_a;
    gl.trans_b = k.trans_b;
    gl.m = m;
    gl.n = n;
    gl.k = kk;
    gl.lda = k.trans_a ? m : kk;
    gl.ldb = k.trans_b ? kk : n;
    gl.ldc = n;
    Ref a = ref(L, k.a), b = ref(L, k.b), c = ref(L, mm.result());
    if (rt.numel() == 0) return;
    if (kk == 0) {  // an empty sum: zeros, without asking cuBLAS about k = 0
      std::string T = ctype(rt.dtype);
      return out_.elementwise(rt.numel(), rt.numel(), "  " + T + "* Y = " + pointer(c, rt.dtype) + ";\n",
                              "    Y[i] = (" + T + ")0;\n");
    }
    Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2), ob(rt.shape.begin(), rt.shape.end() - 2);
    std::vector<int64_t> sa = broadcast_strides(ab, ob), sb = broadcast_strides(bb, ob), sc = strides_of(ob);
    for (auto& s : sa) s *= m * kk;
    for (auto& s : sb) s *= kk * n;
    for (auto& s : sc) s *= m * n;
    // Merge the batch dims where all three walk them as one; the innermost becomes the
    // batch of one launch, the others are enumerated.
    std::vector<int64_t> dims;
    std::vector<std::array<int64_t, 3>> st;
    for (size_t d = 0; d < ob.size(); ++d) {
      if (ob[d] == 1) continue;
      std::array<int64_t, 3> s{sa[d], sb[d], sc[d]};
      if (!dims.empty() && st.back()[0] == s[0] * ob[d] && st.back()[1] == s[1] * ob[d] && st.back()[2] == s[2] * ob[d]) {
        dims.back() *= ob[d];
        st.back() = s;
      } else {
        dims.push_back(ob[d]);
        st.push_back(s);
      }
    }
    if (!dims.empty()) {
      gl.batch = dims.back();
      gl.stride_a = st.back()[0];
      gl.stride_b = st.back()[1];
      gl.stride_c = st.back()[2];
      dims.pop_back();
    }
    int64_t outer = 1, esize = static_cast<int64_t>(dtype_size(rt.dtype));
    for (int64_t d : dims) outer *= d;
    for (int64_t o = 0; o < outer; ++o) {
      GemmLaunch one = gl;
      int64_t rest = o;
      std::array<int64_t, 3> off{0, 0, 0};
      for (size_t d = dims.size(); d-- > 0;) {
        int64_t cidx = rest % dims[d];
        rest /= dims[d];
        for (int s = 0; s < 3; ++s) off[static_cast<size_t>(s)] += cidx * st[d][static_cast<size_t>(s)];
      }
      one.a = a;
      one.b = b;
      one.c = c;
      one.a.offset += off[0] * esize;
      one.b.offset += off[1] * esize;
      one.c.offset += off[2] * esize;
      out_.gemm(one);
    }
  }

  const Prepared& p_;
  Emitter out_;
  Rendered r_;
  int64_t plan_scratch_ = 0;  // the plan's scratch, 64-aligned: private scratch follows
};

}  // namespace

}  // namespace detail

Rendered render(const Prepared& p, const RenderOptions& options) {
  return detail::Renderer(p, options).run();
}

}  // namespace kiln::cuda
