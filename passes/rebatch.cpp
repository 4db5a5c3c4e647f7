// rebatch: one walk over the nodes. Each node is rebuilt over the new operands by the
// ordinary builders (so the shape rules infer every new type); only the attributes that
// spell a shape are edited first. Which axis of a value carries the batch is read off the
// types: the one axis whose size went from the old batch to the new one (any other change
// is refused). Values whose *content* was computed from the batch size at trace time are
// the danger: autodiff's gradient of a mean multiplies by a literal 1/count, which is
// recomputed here; the other literals that spell the batch size are refused or documented.
#include "passes/rebatch.h"

#include <algorithm>

#include "ir/error.h"
#include "ir/printer.h"

namespace kiln {

std::optional<int64_t> batch_size(const Graph& g) {
  std::optional<int64_t> batch;
  for (const GraphInput& in : g.inputs()) {
    if (in.is_state) continue;
    const TensorType& t = g.type(in.value);
    if (t.rank() == 0) return std::nullopt;
    if (batch && *batch != t.shape[0]) return std::nullopt;
    batch = t.shape[0];
  }
  return batch;
}

std::optional<int64_t> other_batch_size(const Graph& g, const TensorMap& inputs) {
  std::optional<int64_t> batch = batch_size(g), n;
  if (!batch) return std::nullopt;
  for (const GraphInput& in : g.inputs()) {
    if (in.is_state) continue;
    auto it = inputs.find(g.value(in.value).name);
    if (it == inputs.end()) return std::nullopt;
    const TensorType& want = g.type(in.value);
    const TensorType& t = it->second.type();
    if (t.dtype != want.dtype || t.rank() != want.rank() || t.shape[0] == *batch || t.shape[0] < 1 ||
        (n && *n != t.shape[0]) || !std::equal(t.shape.begin() + 1, t.shape.end(), want.shape.begin() + 1))
      return std::nullopt;
    n = t.shape[0];
  }
  return n;
}

namespace {

constexpr int kNone = -1;

class Rebatcher {
 public:
  Rebatcher(const Graph& src, int64_t from, int64_t to)
      : src_(src), from_(from), to_(to), dst_(src.name()), map_(src.values().size()),
        axis_(src.values().size(), kNone) {}

  Graph run() {
    for (const GraphInput& in : src_.inputs()) {
      const Value& v = src_.value(in.value);
      TensorType t = v.type;
      if (!in.is_state) {
        t.shape[0] = to_;
        axis_[in.value.id] = 0;
      }
      map_[in.value.id] = dst_.add_input(v.name, t, in.is_state);
    }
    for (const Node& n : src_.nodes()) rebuild(n);
    for (const GraphOutput& o : src_.outputs()) dst_.add_output(o.name, map_[o.value.id]);
    return std::move(dst_);
  }

 private:
  [[noreturn]] void fail(const Node& n, const std::string& why) const {
    std::string attrs;
    for (const auto& [k, a] : n.attrs)
      if (attr_kind(a) != AttrKind::Tensor) attrs += (attrs.empty() ? "" : ", ") + k + "=" + print_attr(a);
    throw Error("rebatch @" + src_.name() + " from " + std::to_string(from_) + " to " + std::to_string(to_) +
                ": " + value_names(src_)[static_cast<size_t>(n.results[0].id)] + " = " + std::string(op_name(n.op)) +
                (attrs.empty() ? "" : " {" + attrs + "}") + (n.note.empty() ? "" : " (" + n.note + ")") + " " + why);
  }

  int axis(ValueId v) const { return axis_[v.id]; }

  // The axes of `out` that a broadcast from `in` creates or stretches from 1 and whose
  // size is the old batch: where a value without the batch becomes one with it.
  std::vector<size_t> broadcast_batch_axes(const Shape& in, const Shape& out) const {
    std::vector<size_t> axes;
    size_t lead = out.size() - in.size();
    for (size_t i = 0; i < out.size(); ++i)
      if ((i < lead || in[i - lead] == 1) && out[i] == from_) axes.push_back(i);
    return axes;
  }

  // The one axis of a broadcast target (or splat) that is the batch; kNone when none is.
  int guess_batch_axis(const Node& n, const Shape& in, const Shape& out) const {
    std::vector<size_t> axes = broadcast_batch_axes(in, out);
    if (axes.size() > 1)
      fail(n, "has several axes of the batch size " + std::to_string(from_) +
                  ", so which one is the batch is ambiguous; trace the model at the batch size wanted");
    return axes.empty() ? kNone : static_cast<int>(axes[0]);
  }

  // Edits the attributes that spell shapes; returns them.
  AttrMap attributes(const Node& n) const {
    AttrMap attrs = n.attrs;
    const Shape& out = src_.type(n.results[0]).shape;
    if (n.op == Op::Reshape && axis(n.operands[0]) != kNone) {
      const Shape& in = src_.type(n.operands[0]).shape;
      int64_t before = 1;  // elements before the batch axis, in the operand and in the result
      for (int a = 0; a < axis(n.operands[0]); ++a) before *= in[a];
      // The result's batch axis j has the same elements before it and the batch's size.
      // Axes of size 1 (or of the batch's size) next to it can make several such j: a -1
      // in the shape says which one (the importer spells the batch so), else it is
      // ambiguous (at batch 1, [1,3] -> [1,1,3] may put the batch first or second).
      Shape s = attr_ints(attrs, "shape");
      std::vector<size_t> candidates;
      int64_t prefix = 1;
      for (size_t j = 0; j < out.size() && prefix <= before; prefix *= out[j++])
        if (prefix == before && out[j] == from_) candidates.push_back(j);
      if (candidates.empty())
        fail(n, "mixes the batch dimension into another axis (or splits it); reshape the other axes only");
      size_t j = candidates[0];
      if (candidates.size() > 1) {
        auto minus = std::find(s.begin(), s.end(), -1);
        const size_t at = static_cast<size_t>(minus - s.begin());
        if (std::find(candidates.begin(), candidates.end(), at) == candidates.end())
          fail(n, "could put the batch at axis " + std::to_string(candidates[0]) + " or " +
                      std::to_string(candidates[1]) + " of " + shape_str(out) +
                      ", so which one is the batch is ambiguous; spell it -1 in the shape, or trace the model at "
                      "the batch size wanted");
        j = at;
      }
      if (s[j] != -1) s[j] = to_;
      attrs["shape"] = s;
    } else if (n.op == Op::BroadcastTo) {
      const Shape& in = src_.type(n.operands[0]).shape;
      int a = axis(n.operands[0]);
      int j = a != kNone ? a + static_cast<int>(out.size() - in.size()) : guess_batch_axis(n, in, out);
      if (j != kNone) {
        Shape s = attr_ints(attrs, "shape");
        s[j] = to_;
        attrs["shape"] = s;
      }
    } else if (n.op == Op::Slice && axis(n.operands[0]) != kNone) {
      size_t a = static_cast<size_t>(axis(n.operands[0]));
      Shape start = attr_ints(attrs, "start"), stop = attr_ints(attrs, "stop");
      const Shape& step = attr_ints(attrs, "step");
      if (start[a] != 0 || stop[a] < from_ || step[a] != 1)
        fail(n, "takes part of the batch axis; only a whole batch can be rebatched");
      stop[a] = to_;
      attrs["stop"] = stop;
    } else if (n.op == Op::Constant) {
      const Tensor& t = attr_tensor(attrs, "value");
      // At batch 1 a full constant's axis of size 1 is a broadcast axis: its one row serves
      // every batch element, as the rows of a value expanded from batch-free data (a BERT's
      // position and token-type ids, exported as [1, S] constants) all would.
      if (!t.is_splat() && from_ == 1) return attrs;
      int j = guess_batch_axis(n, Shape{}, out);
      if (j != kNone) {
        if (!t.is_splat())
          fail(n, "is a constant tensor whose axis " + std::to_string(j) + " has the batch size " +
                      std::to_string(from_) + "; its values cannot be made for another batch size "
                      "(compute it from the inputs, or trace the model at the batch size wanted)");
        Shape s = out;
        s[static_cast<size_t>(j)] = to_;
        attrs["value"] = Tensor::splat(t.element(), s);
      }
    }
    return attrs;
  }

  // Autodiff's gradient of a mean: mul(broadcast_to(dy) creating the batch, 1/count) with
  // count the broadcast's element ratio, a literal of the old batch size. Returns the
  // operand index of that literal, or -1.
  int mean_scale_operand(const Node& n) const {
    if (n.op != Op::Mul) return -1;
    for (int k = 0; k < 2; ++k) {
      const Node* c = src_.defining_node(n.operands[static_cast<size_t>(k)]);
      const Node* b = src_.defining_node(n.operands[static_cast<size_t>(1 - k)]);
      if (!c || !b || c->op != Op::Constant || b->op != Op::BroadcastTo) continue;
      const Tensor& value = attr_tensor(c->attrs, "value");
      if (value.rank() != 0 || axis(b->operands[0]) != kNone || axis(b->results[0]) == kNone) continue;
      double count = static_cast<double>(src_.type(b->results[0]).numel()) /
                     static_cast<double>(src_.type(b->operands[0]).numel());
      if (value == Tensor::scalar(value.dtype(), 1.0 / count)) return k;
    }
    return -1;
  }

  void rebuild(const Node& n) {
    std::vector<ValueId> operands;
    bool batched = false;
    for (ValueId v : n.operands) {
      operands.push_back(map_[v.id]);
      batched = batched || axis(v) != kNone;
    }
    std::vector<ValueId> results;
    if (n.op == Op::Fused) {
      if (batched) fail(n, "is a fused node over the batch; rebatch before fusing (before the pipeline)");
      std::vector<std::string> names;
      for (ValueId r : n.results) names.push_back(src_.value(r).name);
      results = dst_.add_fused(std::move(operands), *n.body, std::move(names));
    } else {
      int k = mean_scale_operand(n);
      if (k >= 0) {
        ValueId b = operands[static_cast<size_t>(1 - k)];
        double count = static_cast<double>(dst_.type(b).numel()) /
                       static_cast<double>(dst_.type(dst_.defining_node(b)->operands[0]).numel());
        DType dt = src_.type(n.results[0]).dtype;
        operands[static_cast<size_t>(k)] = dst_.add_constant(Tensor::scalar(dt, 1.0 / count));
      }
      AttrMap attrs = attributes(n);
      try {
        results = {dst_.add_node_at(n.op, std::move(operands), std::move(attrs),
                                    src_.value(n.result()).name, n.location)};
      } catch (const Error& e) {
        fail(n, "cannot take the new shapes: " + std::string(e.what()));
      }
    }
    if (!n.note.empty()) dst_.set_note(results[0], n.note);
    for (size_t i = 0; i < results.size(); ++i) {
      map_[n.results[i].id] = results[i];
      axis_[n.results[i].id] = batch_axis(n, src_.type(n.results[i]).shape, dst_.type(results[i]).shape);
    }
  }

  // The axis that went from the old batch size to the new one; any other change is refused
  // (a concat along the batch, say, whose size is a multiple of it).
  int batch_axis(const Node& n, const Shape& before, const Shape& after) const {
    int found = kNone;
    for (size_t i = 0; i < before.size(); ++i) {
      if (before[i] == after[i]) continue;
      if (found != kNone || before[i] != from_ || after[i] != to_)
        fail(n, "changes its shape from " + shape_str(before) + " to " + shape_str(after) +
                    ", not just the batch axis; only graphs that keep the batch as one axis can be rebatched");
      found = static_cast<int>(i);
    }
    return found;
  }

  const Graph& src_;
  int64_t from_, to_;
  Graph dst_;
  std::vector<ValueId> map_;
  std::vector<int> axis_;
};

}  // namespace

Graph rebatch(const Graph& g, int64_t batch) {
  if (batch < 1)
    throw Error("rebatch @" + g.name() + " to " + std::to_string(batch) + ": the batch size must be at least 1");
  std::optional<int64_t> from = batch_size(g);
  if (!from)
    throw Error("rebatch @" + g.name() + " to " + std::to_string(batch) +
                ": the graph has no batch dimension (its non-state inputs must all have a leading "
                "dimension, the same one)");
  if (*from == batch) return g;
  if (!g.fixed_batch().empty())
    throw Error("rebatch @" + g.name() + " from " + std::to_string(*from) + " to " + std::to_string(batch) +
                ": its batch size is fixed: " + g.fixed_batch());
  return Rebatcher(g, *from, batch).run();
}

}  // namespace kiln
