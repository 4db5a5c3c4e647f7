// fold_constants: evaluates nodes whose operands are all constants with the reference
// interpreter's kernel for the op (kiln::eval_op), so a folded value has exactly the bits
// the unfolded graph would compute. See passes/simplify.h for what is left alone.
#include <algorithm>
#include <cstring>

#include "ir/error.h"
#include "ir/interp.h"
#include "passes/rebuild.h"
#include "passes/simplify.h"

namespace kiln {

Graph fold_constants(const Graph& g, const PassOptions& options) {
  Rebuilder rb(g);
  Graph& dst = rb.dst();
  for (const Node& n : g.nodes()) {
    // broadcast_to of a scalar is already the folded form of a splat.
    bool canonical_splat = n.op == Op::BroadcastTo && g.type(n.operands[0]).numel() == 1;
    const int64_t result_size = g.type(n.result()).numel();
    bool foldable = n.op != Op::Constant && n.op != Op::Fused && !op_info(n.op).has(kCollective) && !n.operands.empty() && !canonical_splat &&
                    (result_size <= options.fold_max_elements || options.inference);
    std::vector<const Tensor*> operands;
    int64_t largest_dense = 0;  // the largest operand that is not a splat
    for (ValueId v : n.operands) {
      if (!foldable) break;
      const Node* def = dst.defining_node(rb.map(v));
      if (def == nullptr || def->op != Op::Constant) {
        foldable = false;
        break;
      }
      const Tensor& value = attr_tensor(def->attrs, "value");
      // eval_op fills a splat out: only small ones, so that folding stays cheap.
      if (value.is_splat() && value.numel() > options.fold_max_elements) {
        foldable = false;
        break;
      }
      operands.push_back(&value);
      if (!value.is_splat()) largest_dense = std::max(largest_dense, value.numel());
    }
    // Inference (passes/inference.h): a weight's transform of any size folds when its
    // result is no larger than a dense operand, which it replaces.
    if (foldable && result_size > options.fold_max_elements && result_size > largest_dense) foldable = false;
    if (!foldable) {
      rb.copy(n);
      continue;
    }
    Tensor value;
    try {
      value = eval_op(n.op, operands, n.attrs, g.type(n.result()));
    } catch (const Error&) {
      // No kernel fails on a valid graph; should one, the error belongs to run time.
      rb.copy(n);
      continue;
    }
    KILN_CHECK(value.type() == g.type(n.result()), "fold_constants: eval_op gave " + value.type().str() +
                                                       " for " + g.type(n.result()).str());
    // Folding must not materialize a broadcast: a splat stays a scalar constant broadcast
    // to the shape, and a value larger than every operand is not folded at all.
    int64_t largest_operand = 0;
    for (const Tensor* t : operands) largest_operand = std::max(largest_operand, t->numel());
    // A splat: every element has the first one's bits (exact for every dtype: integers are
    // not rounded as they would be through double, and -0.0 is not 0.0).
    const size_t size = dtype_size(value.dtype());
    bool splat = value.numel() > 1;
    for (int64_t i = 1; splat && i < value.numel(); ++i)
      splat = std::memcmp(value.raw() + static_cast<size_t>(i) * size, value.raw(), size) == 0;
    const std::string& name = g.value(n.result()).name;
    ValueId c;
    if (splat) {
      Tensor scalar(value.dtype(), {});
      std::memcpy(scalar.raw(), value.raw(), dtype_size(value.dtype()));
      ValueId s = dst.add_constant(scalar);
      c = dst.add_node_at(Op::BroadcastTo, {s}, {{"shape", value.shape()}}, name, "");
    } else if (value.numel() > largest_operand) {
      rb.copy(n);
      continue;
    } else {
      c = dst.add_constant(value, name);
    }
    if (!n.note.empty()) dst.set_note(c, n.note);
    rb.set(n.result(), c);
  }
  return rb.finish();
}

}  // namespace kiln
