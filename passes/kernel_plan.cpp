// The kernel plan (passes/kernel_plan.h): the backend-neutral decisions of how a planned
// graph runs as kernels, taken once here so every backend renders the same kernels.
#include "passes/kernel_plan.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "ir/error.h"
#include "ir/ops.h"
#include "ir/printer.h"

namespace kiln {

std::string_view kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::Loop: return "loop";
    case KernelKind::Gemm: return "gemm";
    case KernelKind::Op: return "op";
    case KernelKind::Region: return "region";
  }
  return "?";
}

bool is_last_two_swap(const std::vector<int64_t>& perm) {
  size_t r = perm.size();
  if (r < 2) return false;
  for (size_t d = 0; d + 2 < r; ++d)
    if (perm[d] != static_cast<int64_t>(d)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}

std::string_view storage_name(Storage s) {
  switch (s) {
    case Storage::Planned: return "planned";
    case Storage::Register: return "register";
    case Storage::Scratch: return "scratch";
    case Storage::Output: return "output";
    case Storage::Input: return "input";
    case Storage::Alias: return "alias";
    case Storage::Constant: return "constant";
    case Storage::Elided: return "elided";
  }
  return "?";
}

namespace {

bool is_splat_constant(const Graph& g, ValueId v) {
  const Node* n = g.defining_node(v);
  if (!n || n->op != Op::Constant) return false;
  const Tensor& val = attr_tensor(n->attrs, "value");
  return val.numel() == 1 || val.is_splat();
}

bool elementwise(Op op) { return op_info(op).has(kElementwise); }


// The source of operand k of matmul `n` when that operand is a transpose of the last two axes.
const Node* last_two_transpose(const Graph& g, const Node& n, size_t k) {
  const Node* t = g.defining_node(n.operands[k]);
  if (!t || t->op != Op::Transpose || !is_last_two_swap(attr_ints(t->attrs, "perm"))) return nullptr;
  return t;
}

// Plans one level: the top-level graph (`mp` set) or a fused body (`alias[k]`: body output
// k's buffer is body input alias[k]'s, or -1).
class LevelPlanner {
 public:
  LevelPlanner(const Graph& g, const MemoryPlan* mp, std::vector<int> alias, const KernelPlanOptions& o)
      : g_(g), mp_(mp), alias_(std::move(alias)), o_(o), top_(mp != nullptr) {}

  KernelPlan run() {
    group();
    find_readers();
    fold_transposes();
    kp_.values.assign(g_.values().size(), ValueStorage{});
    for (size_t k = 0; k < g_.inputs().size(); ++k)
      if (!top_) kp_.values[g_.inputs()[k].value.id] = {Storage::Input, -1, static_cast<int32_t>(k), {}, false};
    for (size_t i = 0; i < nodes().size(); ++i) {
      if (nodes()[i].op == Op::Constant) kp_.values[nodes()[i].result().id].kind = Storage::Constant;
      if (skip_[i]) kp_.values[nodes()[i].result().id].kind = Storage::Elided;
    }
    if (!top_) {
      body_outputs();
      gemm_epilogues();
    }
    registers_and_scratch();
    constants_in_memory();
    build_kernels();
    return std::move(kp_);
  }

 private:
  const std::vector<Node>& nodes() const { return g_.nodes(); }
  bool in_group(size_t i) const { return item_of_[i] >= 0 && items_[static_cast<size_t>(item_of_[i])].loop; }

  struct Item {
    bool loop = false;  // elementwise nodes over `shape`
    Shape shape;
    std::vector<int32_t> nodes;
  };

  // Items: maximal runs of elementwise nodes over one shape (constants do not break a run);
  // at the top level every node is its own item.
  void group() {
    item_of_.assign(nodes().size(), -1);
    for (size_t i = 0; i < nodes().size(); ++i) {
      const Node& n = nodes()[i];
      if (n.op == Op::Constant) continue;
      if (elementwise(n.op)) {
        const Shape& s = g_.type(n.result()).shape;
        if (top_ || items_.empty() || !items_.back().loop || items_.back().shape != s) items_.push_back({true, s, {}});
      } else {
        items_.push_back({false, {}, {}});
      }
      items_.back().nodes.push_back(static_cast<int32_t>(i));
      item_of_[i] = static_cast<int>(items_.size() - 1);
    }
  }

  // Per value: the last item reading it, whether it is used outside its own loop, its use
  // count (outputs included), and the one loop item all its readers are in (-1 none, -2 not one loop).
  void find_readers() {
    size_t nv = g_.values().size();
    last_reader_.assign(nv, -1);
    escapes_.assign(nv, false);
    uses_.assign(nv, 0);
    only_loop_.assign(nv, -1);
    is_output_.assign(nv, false);
    for (size_t i = 0; i < nodes().size(); ++i) {
      for (ValueId v : nodes()[i].operands) {
        ++uses_[v.id];
        last_reader_[v.id] = std::max(last_reader_[v.id], item_of_[i]);
        int& one = only_loop_[v.id];
        if (!in_group(i)) one = -2;
        else if (one == -1) one = item_of_[i];
        else if (one != item_of_[i]) one = -2;
        const Node* def = g_.defining_node(v);
        if (def && def->op != Op::Constant) {
          int di = item_of_[static_cast<size_t>(g_.value(v).node)];
          if (di != item_of_[i] || !items_[static_cast<size_t>(di)].loop) escapes_[v.id] = true;
        }
      }
    }
    for (const GraphOutput& o : g_.outputs()) {
      escapes_[o.value.id] = true;
      is_output_[o.value.id] = true;
      ++uses_[o.value.id];
    }
  }

  // Matmul operands produced by a transpose of the last two axes read the transpose's
  // source with a GEMM flag; a transpose all of whose uses fold is skipped. At the top
  // level the source must still be intact when the matmul runs.
  void fold_transposes() {
    trans_.assign(nodes().size() * 2, false);
    skip_.assign(nodes().size(), false);
    if (!o_.fold_transposes) return;
    std::vector<int32_t> overwritten;  // per state input: the earliest StateInPlace writer's start
    if (top_) {
      overwritten.assign(g_.values().size(), std::numeric_limits<int32_t>::max());
      for (const ValuePlan& p : mp_->values)
        if (p.kind == BufferKind::StateInPlace) overwritten[p.state.id] = std::min(overwritten[p.state.id], p.start);
    }
    std::vector<int> folded(g_.values().size(), 0);
    for (size_t i = 0; i < nodes().size(); ++i) {
      if (nodes()[i].op != Op::Matmul) continue;
      for (size_t k = 0; k < 2; ++k) {
        const Node* t = last_two_transpose(g_, nodes()[i], k);
        if (!t || (top_ && !source_live(t->operands[0], static_cast<int32_t>(i), overwritten))) continue;
        trans_[i * 2 + k] = true;
        ++folded[nodes()[i].operands[k].id];
      }
    }
    for (size_t i = 0; i < nodes().size(); ++i)
      if (nodes()[i].op == Op::Transpose && folded[nodes()[i].result().id] == uses_[nodes()[i].result().id]) skip_[i] = true;
  }

  // At the top level: is `src` still intact when node `at` runs?
  bool source_live(ValueId src, int32_t at, const std::vector<int32_t>& overwritten) const {
    const ValuePlan& vp = mp_->at(src);
    switch (vp.kind) {
      case BufferKind::Input:
      case BufferKind::Constant: return true;
      case BufferKind::Arena:
      case BufferKind::StateInPlace: return vp.end >= at;
      case BufferKind::State: return overwritten[src.id] > at;
    }
    return false;
  }

  // Body outputs are written straight into the fused node's results where possible: not a
  // constant, not a value already written to another output, and, in place over body input
  // alias[k], only if nothing after the value's item reads that input. The rest are copied.
  void body_outputs() {
    fresh_.assign(g_.values().size(), false);
    for (size_t k = 0; k < g_.outputs().size(); ++k) {
      ValueId v = g_.outputs()[k].value;
      const Node* def = g_.defining_node(v);
      ValueStorage& s = kp_.values[v.id];
      bool direct = def && def->op != Op::Constant && s.kind != Storage::Output;
      if (direct && alias_[k] >= 0) {
        int vi = item_of_[static_cast<size_t>(g_.value(v).node)];
        ValueId in = g_.inputs()[static_cast<size_t>(alias_[k])].value;
        if (last_reader_[in.id] > vi) direct = false;
      }
      if (direct) {
        s.kind = Storage::Output;
        s.index = static_cast<int32_t>(k);
        fresh_[v.id] = alias_[k] < 0;
      } else {
        kp_.copies.push_back({static_cast<int32_t>(k), v});
      }
    }
  }

  // GEMM epilogue: a matmul whose result only one loop reads (and is no body output), where
  // that loop writes an output of the same type to a fresh buffer (no body input, so nothing
  // the GEMM reads, lives there), writes that buffer directly; the loop then runs in place
  // over it (it loads element i before storing element i), with no scratch round trip.
  void gemm_epilogues() {
    if (!o_.gemm_epilogue) return;
    for (size_t i = 0; i < nodes().size(); ++i) {
      ValueId m = nodes()[i].result();
      if (skip_[i] || nodes()[i].op != Op::Matmul || kp_.values[m.id].kind != Storage::Planned) continue;
      int j = only_loop_[m.id];
      if (j < 0 || is_output_[m.id]) continue;
      for (int32_t u : items_[static_cast<size_t>(j)].nodes) {
        ValueId o = nodes()[static_cast<size_t>(u)].result();
        if (fresh_[o.id] && g_.type(o) == g_.type(m)) {
          kp_.values[m.id] = {Storage::Alias, -1, -1, o, false};
          fresh_[o.id] = false;  // one GEMM per buffer
          ++kp_.gemm_epilogues_in_place;
          break;
        }
      }
    }
  }

  // Results used only inside their loop stay in registers; other body intermediates get
  // scratch offsets, in node order.
  void registers_and_scratch() {
    int64_t cursor = 0;
    for (size_t i = 0; i < nodes().size(); ++i) {
      if (skip_[i] || nodes()[i].op == Op::Constant) continue;
      for (ValueId r : nodes()[i].results) {
        ValueStorage& s = kp_.values[r.id];
        if (s.kind != Storage::Planned) continue;
        if (in_group(i) && !escapes_[r.id]) {
          s.kind = Storage::Register;
        } else if (!top_) {
          s.kind = Storage::Scratch;
          s.offset = cursor;
          // Each value is below 2^43 bytes (kMaxElements); the sum is checked.
          int64_t end = 0;
          if (__builtin_add_overflow(cursor, std::max<int64_t>(g_.type(r).nbytes(), 1), &end) ||
              end > (int64_t{1} << 62))
            throw Error("plan_kernels: a fused body's intermediates take more than 2^62 bytes of scratch");
          cursor = align_up(end, 64);
        }
      }
    }
    kp_.scratch_bytes = cursor;
  }

  // Constants read from memory: not a splat that only loops read (an immediate there), nor
  // a top-level output (the runtime hands its value out). A copied body output is read.
  void constants_in_memory() {
    for (size_t i = 0; i < nodes().size(); ++i)
      for (ValueId v : nodes()[i].operands)
        if (!(in_group(i) && is_splat_constant(g_, v))) kp_.values[v.id].in_memory = true;
    for (const BodyCopy& c : kp_.copies) kp_.values[c.value.id].in_memory = true;
    for (ValueStorage& s : kp_.values)
      if (s.kind != Storage::Constant) s.in_memory = false;
  }

  void build_kernels() {
    for (const Item& it : items_) {
      size_t i = static_cast<size_t>(it.nodes[0]);
      if (skip_[i]) continue;
      const Node& n = nodes()[i];
      Kernel k;
      k.nodes = it.nodes;
      if (it.loop) {
        k.kind = KernelKind::Loop;
        k.shape = it.shape;
        loop_streams(k);
      } else if (n.op == Op::Matmul) {
        k.kind = KernelKind::Gemm;
        k.trans_a = trans_[i * 2];
        k.trans_b = trans_[i * 2 + 1];
        k.a = k.trans_a ? g_.defining_node(n.operands[0])->operands[0] : n.operands[0];
        k.b = k.trans_b ? g_.defining_node(n.operands[1])->operands[0] : n.operands[1];
      } else if (n.op == Op::Fused) {
        k.kind = KernelKind::Region;
        k.body = std::make_shared<const KernelPlan>(plan_body(n));
        kp_.gemm_epilogues_in_place += k.body->gemm_epilogues_in_place;
        if (top_) kp_.scratch_bytes = std::max(kp_.scratch_bytes, k.body->scratch_bytes);
      } else {
        k.kind = KernelKind::Op;
      }
      kp_.kernels.push_back(std::move(k));
    }
  }

  // Loads: operands computed outside the loop, not immediates, in first-use order; stores:
  // results read outside the loop, in node order.
  void loop_streams(Kernel& k) const {
    std::vector<ValueId> seen;
    auto computed_here = [&](ValueId v) {
      const Value& val = g_.value(v);
      return val.node >= 0 && item_of_[static_cast<size_t>(val.node)] == item_of_[static_cast<size_t>(k.nodes[0])];
    };
    for (int32_t i : k.nodes) {
      const Node& n = nodes()[static_cast<size_t>(i)];
      for (ValueId v : n.operands)
        if (!computed_here(v) && !is_splat_constant(g_, v) && std::find(k.loads.begin(), k.loads.end(), v) == k.loads.end())
          k.loads.push_back(v);
      if (escapes_[n.result().id]) k.stores.push_back(n.result());
    }
  }

  // A fused node's body: at the top level its outputs may share its operands' buffers
  // (written in place); nested bodies' results are fresh buffers of the enclosing body.
  KernelPlan plan_body(const Node& n) const {
    std::vector<int> alias;
    for (ValueId r : n.results) {
      int a = -1;
      if (top_)
        for (size_t k = 0; k < n.operands.size(); ++k)
          if (same_storage(r, n.operands[k])) a = static_cast<int>(k);
      alias.push_back(a);
    }
    return LevelPlanner(*n.body, nullptr, std::move(alias), o_).run();
  }

  bool same_storage(ValueId a, ValueId b) const {
    // An arena value by its buffer and its bytes in it (a concat operand's slice is in its
    // result's buffer, but not over the result).
    auto key = [&](ValueId v) -> std::tuple<int, int64_t, int64_t, int64_t> {
      const ValuePlan& p = mp_->at(v);
      switch (p.kind) {
        case BufferKind::Arena: return {1, p.buffer, p.within, p.bytes};
        case BufferKind::StateInPlace: return {2, p.state.id, 0, 0};
        case BufferKind::State:
        case BufferKind::Input: return {2, v.id, 0, 0};
        case BufferKind::Constant: return {3, v.id, 0, 0};
      }
      return {0, v.id, 0, 0};
    };
    return key(a) == key(b);
  }

  static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

  const Graph& g_;
  const MemoryPlan* mp_;
  std::vector<int> alias_;
  KernelPlanOptions o_;
  bool top_;
  std::vector<Item> items_;
  std::vector<int> item_of_;
  std::vector<int> last_reader_, uses_, only_loop_;
  std::vector<bool> escapes_, is_output_, fresh_, trans_, skip_;
  KernelPlan kp_;
};

}  // namespace

KernelPlan plan_kernels(const Graph& g, const MemoryPlan& plan, const KernelPlanOptions& options) {
  return LevelPlanner(g, &plan, {}, options).run();
}

namespace {

void format_level(const Graph& g, const KernelPlan& kp, const std::string& indent, std::string& out) {
  std::vector<std::string> names = value_names(g);
  auto name = [&](ValueId v) { return names.at(static_cast<size_t>(v.id)); };
  auto list = [&](const std::vector<ValueId>& vs, const char* sep) {
    std::string s;
    for (size_t k = 0; k < vs.size(); ++k) s += (k ? sep : "") + name(vs[k]);
    return s;
  };
  auto node_text = [&](const Node& n, const std::vector<ValueId>& operands, const std::vector<bool>& transposed) {
    std::string s = list(n.results, ", ") + " = " + std::string(op_name(n.op)) + "(";
    for (size_t k = 0; k < operands.size(); ++k)
      s += (k ? ", " : "") + name(operands[k]) + (k < transposed.size() && transposed[k] ? "^T" : "");
    return s + ")";
  };
  for (size_t ki = 0; ki < kp.kernels.size(); ++ki) {
    const Kernel& k = kp.kernels[ki];
    const Node& first = g.nodes().at(static_cast<size_t>(k.nodes.at(0)));
    out += indent + "k" + std::to_string(ki) + " " + std::string(kernel_kind_name(k.kind)) + " ";
    switch (k.kind) {
      case KernelKind::Loop: {
        out += shape_str(k.shape) + " ";
        for (size_t j = 0; j < k.nodes.size(); ++j) {
          const Node& n = g.nodes().at(static_cast<size_t>(k.nodes[j]));
          out += (j ? ", " : "") + node_text(n, n.operands, {});
        }
        if (!k.stores.empty()) out += " -> store " + list(k.stores, ", ");
        break;
      }
      case KernelKind::Gemm: out += node_text(first, {k.a, k.b}, {k.trans_a, k.trans_b}); break;
      case KernelKind::Op: out += node_text(first, first.operands, {}); break;
      case KernelKind::Region:
        out += node_text(first, first.operands, {});
        if (k.body) {
          if (k.body->scratch_bytes > 0) out += " scratch " + std::to_string(k.body->scratch_bytes);
          out += ":\n";
          format_level(*first.body, *k.body, indent + "  ", out);
        }
        continue;
    }
    out += "\n";
  }
  for (const BodyCopy& c : kp.copies) out += indent + "copy " + name(c.value) + " -> output " + std::to_string(c.output) + "\n";
  std::string storage;
  for (size_t v = 0; v < kp.values.size(); ++v) {
    const ValueStorage& s = kp.values[v];
    std::string what;
    switch (s.kind) {
      case Storage::Planned:
      case Storage::Register:
      case Storage::Input: continue;
      case Storage::Scratch: what = "scratch +" + std::to_string(s.offset); break;
      case Storage::Output: what = "output " + std::to_string(s.index); break;
      case Storage::Alias: what = "alias " + name(s.alias); break;
      case Storage::Constant: what = s.in_memory ? "constant in memory" : "immediate"; break;
      case Storage::Elided: what = "elided"; break;
    }
    storage += (storage.empty() ? "" : ", ") + names[v] + " " + what;
  }
  if (!storage.empty()) out += indent + "storage: " + storage + "\n";
}

}  // namespace

std::string format_kernel_plan(const Graph& g, const KernelPlan& kp) {
  std::string out;
  format_level(g, kp, "", out);
  out += "scratch: " + std::to_string(kp.scratch_bytes) + " bytes; gemm epilogues in place: " +
         std::to_string(kp.gemm_epilogues_in_place) + "\n";
  return out;
}

}  // namespace kiln
