// check_kernel_plan (passes/kernel_plan.h): an independent check of a kernel plan against
// its graph, so a planner bug is an internal error naming the kernel, not wrong numbers.
#include <algorithm>

#include "ir/error.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "passes/kernel_plan.h"

namespace kiln {

namespace {

class LevelChecker {
 public:
  // `mp`: the memory plan, for the top level only.
  LevelChecker(const Graph& g, const KernelPlan& kp, std::string where, const MemoryPlan* mp)
      : g_(g), kp_(kp), where_(std::move(where)), top_(mp != nullptr), mp_(mp), names_(value_names(g)) {}

  void run() {
    if (kp_.values.size() != g_.values().size())
      fail("the plan has " + std::to_string(kp_.values.size()) + " value entries for " +
           std::to_string(g_.values().size()) + " values");
    ready_.assign(g_.values().size(), false);
    for (const GraphInput& in : g_.inputs()) ready_[in.value.id] = true;
    check_storage();
    int32_t next = 0;  // the first node no kernel has covered yet
    for (size_t ki = 0; ki < kp_.kernels.size(); ++ki) {
      kernel_ = "k" + std::to_string(ki) + " (" + std::string(kernel_kind_name(kp_.kernels[ki].kind)) + ")";
      const Kernel& k = kp_.kernels[ki];
      if (k.nodes.empty()) fail("runs no node");
      for (int32_t i : k.nodes) {
        if (i < next || i >= static_cast<int32_t>(g_.nodes().size())) fail("node " + std::to_string(i) + " is out of order");
        for (; next < i; ++next) not_run(next);
        ++next;
      }
      check_kernel(k);
    }
    kernel_.clear();
    for (; next < static_cast<int32_t>(g_.nodes().size()); ++next) not_run(next);
    for (const GraphOutput& o : g_.outputs())
      if (!ready_[o.value.id]) fail("output " + o.name + " is never computed");
    check_copies();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    internal_error("kernel plan", "kernel plan of " + where_ + (kernel_.empty() ? "" : ": " + kernel_) + ": " + what);
  }
  const ValueStorage& at(ValueId v) const { return kp_.at(v); }
  std::string name(ValueId v) const { return names_.at(static_cast<size_t>(v.id)); }
  static bool in_memory(const ValueStorage& s) {
    return s.kind != Storage::Register && s.kind != Storage::Elided && (s.kind != Storage::Constant || s.in_memory);
  }
  // A node no kernel runs: a constant, or an elided transpose.
  void not_run(int32_t i) {
    const Node& n = g_.nodes()[static_cast<size_t>(i)];
    Storage s = at(n.result()).kind;
    if (!(n.op == Op::Constant && s == Storage::Constant) && !(n.op == Op::Transpose && s == Storage::Elided))
      fail("node " + std::to_string(i) + " (" + name(n.result()) + " = " + std::string(op_name(n.op)) + ") is never run");
    if (n.op == Op::Constant) ready_[n.result().id] = true;
  }
  // `v` is read from memory by this kernel.
  void read(ValueId v) const {
    if (!ready_[v.id]) fail(name(v) + " is read before it is computed");
    if (!in_memory(at(v))) fail(name(v) + " is read from memory but is " + std::string(storage_name(at(v).kind)));
  }

  void check_kernel(const Kernel& k) {
    const Node& n = g_.nodes()[static_cast<size_t>(k.nodes[0])];
    if (k.kind != KernelKind::Loop && k.nodes.size() != 1) fail("runs " + std::to_string(k.nodes.size()) + " nodes");
    switch (k.kind) {
      case KernelKind::Loop: return check_loop(k);
      case KernelKind::Gemm: {
        if (n.op != Op::Matmul) fail(std::string(op_name(n.op)) + " is not a matmul");
        ValueId ab[2] = {k.a, k.b};
        bool t[2] = {k.trans_a, k.trans_b};
        for (size_t j = 0; j < 2; ++j) {
          ValueId src = n.operands[j];
          if (t[j]) {
            const Node* tn = g_.defining_node(src);
            if (!tn || tn->op != Op::Transpose || !is_last_two_swap(attr_ints(tn->attrs, "perm")))
              fail("operand " + name(src) + " is not a transpose of the last two axes");
            src = tn->operands[0];
          }
          if (ab[j] != src) fail("reads " + name(ab[j]) + " for operand " + name(n.operands[j]));
          if (t[j] && mp_ && (mp_->at(src).kind == BufferKind::Arena || mp_->at(src).kind == BufferKind::StateInPlace) &&
              mp_->at(src).end < k.nodes[0])
            fail("reads " + name(src) + " after its buffer is reused");
          read(src);
        }
        break;
      }
      case KernelKind::Op:
      case KernelKind::Region: {
        bool region = k.kind == KernelKind::Region;
        if (region != (n.op == Op::Fused) || n.op == Op::Matmul || n.op == Op::Constant || op_info(n.op).has(kElementwise))
          fail(std::string(op_name(n.op)) + " does not run as this kind of kernel");
        for (ValueId v : n.operands) read(v);
        if (region) {
          if (!k.body) fail("has no body plan");
          LevelChecker(*n.body, *k.body, where_ + ": " + kernel_ + " body", nullptr).run();
        }
        break;
      }
    }
    for (ValueId r : n.results) written(r);
  }

  void check_loop(const Kernel& k) {
    if (top_ && k.nodes.size() != 1) fail("a top-level loop runs " + std::to_string(k.nodes.size()) + " nodes");
    for (int32_t i : k.nodes) {
      const Node& n = g_.nodes()[static_cast<size_t>(i)];
      if (!op_info(n.op).has(kElementwise)) fail(std::string(op_name(n.op)) + " is not elementwise");
      if (g_.type(n.result()).shape != k.shape)
        fail(name(n.result()) + " has shape " + shape_str(g_.type(n.result()).shape) + ", not the loop's " + shape_str(k.shape));
      for (ValueId v : n.operands) {
        bool loaded = std::find(k.loads.begin(), k.loads.end(), v) != k.loads.end();
        if (loaded && inside(k, v)) fail(name(v) + " is loaded but computed in the loop");
        if (loaded) read(v);
        else if (!(inside(k, v) && ready_[v.id]) && !immediate(v))
          fail(name(v) + " is neither loaded nor computed in the loop");
      }
      ValueId r = n.result();
      bool stored = std::find(k.stores.begin(), k.stores.end(), r) != k.stores.end();
      if (stored == (at(r).kind == Storage::Register))
        fail(name(r) + " is " + std::string(storage_name(at(r).kind)) + (stored ? " but stored" : " but not stored"));
      ready_[r.id] = true;
    }
  }
  bool immediate(ValueId v) const {
    const Node* def = g_.defining_node(v);
    if (!def || def->op != Op::Constant) return false;
    const Tensor& t = attr_tensor(def->attrs, "value");
    return t.numel() == 1 || t.is_splat();
  }
  bool inside(const Kernel& k, ValueId v) const {
    int32_t def = g_.value(v).node;
    return std::find(k.nodes.begin(), k.nodes.end(), def) != k.nodes.end();
  }
  void written(ValueId r) {
    if (!in_memory(at(r))) fail(name(r) + " is written to memory but is " + std::string(storage_name(at(r).kind)));
    ready_[r.id] = true;
  }

  // Per value: the storage kinds legal at this level, indices in range, scratch in bounds,
  // aligned and disjoint.
  void check_storage() const {
    std::vector<std::pair<int64_t, int64_t>> ranges;  // [offset, end) of scratch values
    for (size_t v = 0; v < kp_.values.size(); ++v) {
      const ValueStorage& s = kp_.values[v];
      ValueId id{static_cast<int32_t>(v)};
      std::string what = name(id) + " (" + std::string(storage_name(s.kind)) + ")";
      bool body_only = s.kind == Storage::Scratch || s.kind == Storage::Output || s.kind == Storage::Input || s.kind == Storage::Alias;
      if (top_ && body_only) fail(what + " at the top level");
      if (!top_ && s.kind == Storage::Planned) fail(what + " in a body");
      const Node* def = g_.defining_node(id);
      if ((s.kind == Storage::Constant) != (def && def->op == Op::Constant)) fail(what + ": only constants are constant");
      if ((s.kind == Storage::Input) != (!top_ && !def)) fail(what + ": only body inputs are inputs");
      if (s.kind == Storage::Input && (s.index < 0 || static_cast<size_t>(s.index) >= g_.inputs().size() ||
                                       g_.inputs()[static_cast<size_t>(s.index)].value != id))
        fail(what + " has a wrong input index " + std::to_string(s.index));
      if (s.kind == Storage::Output && (s.index < 0 || static_cast<size_t>(s.index) >= g_.outputs().size() ||
                                        g_.outputs()[static_cast<size_t>(s.index)].value != id))
        fail(what + " has a wrong output index " + std::to_string(s.index));
      if (s.kind == Storage::Alias) {
        if (!s.alias.valid() || static_cast<size_t>(s.alias.id) >= kp_.values.size() || at(s.alias).kind != Storage::Output ||
            g_.type(s.alias) != g_.type(id))
          fail(what + " aliases a value that is not an output of its type");
      }
      if (s.kind == Storage::Scratch) {
        int64_t bytes = std::max<int64_t>(g_.type(id).nbytes(), 1);
        if (s.offset < 0 || s.offset % 64 != 0 || s.offset + bytes > kp_.scratch_bytes)
          fail(what + " at offset " + std::to_string(s.offset) + " is outside the body's " + std::to_string(kp_.scratch_bytes) +
               " scratch bytes or unaligned");
        ranges.emplace_back(s.offset, s.offset + bytes);
      }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t k = 1; k < ranges.size(); ++k)
      if (ranges[k].first < ranges[k - 1].second)
        fail("scratch ranges overlap at offset " + std::to_string(ranges[k].first));
  }

  // Every body output is written in place or copied exactly once, and not from a GEMM's
  // aliased buffer (its epilogue overwrites it).
  void check_copies() const {
    std::vector<int> copied(g_.outputs().size(), 0);
    if (top_ && !kp_.copies.empty()) fail("copies at the top level");
    for (const BodyCopy& c : kp_.copies) {
      if (c.output < 0 || static_cast<size_t>(c.output) >= g_.outputs().size() ||
          g_.outputs()[static_cast<size_t>(c.output)].value != c.value)
        fail("copy of " + name(c.value) + " to a wrong output " + std::to_string(c.output));
      if (!in_memory(at(c.value)) || at(c.value).kind == Storage::Alias)
        fail("copy of " + name(c.value) + " from " + std::string(storage_name(at(c.value).kind)));
      ++copied[static_cast<size_t>(c.output)];
    }
    for (size_t k = 0; k < g_.outputs().size() && !top_; ++k) {
      const ValueStorage& s = at(g_.outputs()[k].value);
      int direct = s.kind == Storage::Output && s.index == static_cast<int32_t>(k) ? 1 : 0;
      if (direct + copied[k] != 1) fail("body output " + std::to_string(k) + " is written " + std::to_string(direct + copied[k]) + " times");
    }
  }

  const Graph& g_;
  const KernelPlan& kp_;
  std::string where_;
  bool top_;
  const MemoryPlan* mp_;
  std::vector<std::string> names_;
  std::vector<bool> ready_;
  std::string kernel_;
};

}  // namespace

void check_kernel_plan(const Graph& g, const MemoryPlan& plan, const KernelPlan& kp) {
  if (plan.values.size() != g.values().size())
    internal_error("kernel plan", "kernel plan of @" + g.name() + ": the memory plan does not belong to this graph");
  LevelChecker(g, kp, "@" + g.name(), &plan).run();
}

}  // namespace kiln
