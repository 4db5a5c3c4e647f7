#include "passes/resident_data.h"

#include <fmt/format.h>

#include <limits>
#include <vector>

#include "ir/error.h"
#include "passes/rebuild.h"

namespace kiln {

namespace {

Tensor iota_i32(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return Tensor::from<int32_t>(DType::i32, {n}, v);
}

// A scalar output of `step` by name, checked.
const GraphOutput& scalar_output(const Graph& step, const std::string& name, const char* what) {
  for (const GraphOutput& o : step.outputs())
    if (o.name == name) {
      if (step.type(o.value).rank() != 0)
        throw Error(fmt::format("make_resident_step @{}: the {} output '{}' is {}, not a scalar", step.name(), what,
                                name, step.type(o.value).str()));
      return o;
    }
  throw Error(fmt::format("make_resident_step @{}: no {} output named '{}'", step.name(), what, name));
}

}  // namespace

Graph make_resident_step(const Graph& step, int64_t rows, int64_t log_capacity, const std::string& loss,
                         const std::string& accuracy, const std::string& lr) {
  const std::string where = "make_resident_step @" + step.name() + ": ";
  if (rows < 1 || rows > std::numeric_limits<int32_t>::max())
    throw Error(where + fmt::format("rows must be in 1..{}, got {}", std::numeric_limits<int32_t>::max(), rows));
  if (log_capacity < 1) throw Error(where + fmt::format("log_capacity must be at least 1, got {}", log_capacity));
  const GraphOutput& loss_out = scalar_output(step, loss, "loss");
  const GraphOutput* acc_out = accuracy.empty() ? nullptr : &scalar_output(step, accuracy, "accuracy");

  // The columns: every non-state input, sharing the batch dimension.
  std::vector<const GraphInput*> columns;
  int64_t batch = -1;
  for (const GraphInput& in : step.inputs()) {
    if (in.is_state) continue;
    const Value& v = step.value(in.value);
    if (v.type.rank() < 1)
      throw Error(where + fmt::format("input %{} is {}: a batch column needs a leading batch dimension", v.name,
                                      v.type.str()));
    if (batch >= 0 && v.type.shape[0] != batch)
      throw Error(where + fmt::format("input %{} has {} rows but the batch has {}: every non-state input is a "
                                      "column of the batch",
                                      v.name, v.type.shape[0], batch));
    batch = v.type.shape[0];
    columns.push_back(&in);
  }
  if (columns.empty()) throw Error(where + "the step has no non-state input to feed from resident data");
  if (batch > rows) throw Error(where + fmt::format("the batch ({}) is larger than the data ({} rows)", batch, rows));
  auto check_free = [&](const std::string& name) {
    if (step.find(name).valid() || step.find_output(name).valid())
      throw Error(where + "the step already has a value or output named '" + name + "'");
  };

  ValueId lr_in;
  if (!lr.empty()) {
    lr_in = step.find(lr);
    if (!lr_in.valid() || step.value(lr_in).input < 0 || !step.is_state(lr_in) || step.type(lr_in).rank() != 0)
      throw Error(where + "no scalar state input named '" + lr + "' to take the rate from");
  }

  Rebuilder r(step, [&](const GraphInput& in) { return in.is_state && in.value != lr_in; });
  Graph& g = r.dst();
  auto state = [&](const std::string& name, TensorType type) {
    check_free(name);
    return g.add_input(name, std::move(type), /*is_state=*/true);
  };
  std::vector<ValueId> data;
  for (const GraphInput* c : columns) {
    const Value& v = step.value(c->value);
    Shape shape = v.type.shape;
    shape[0] = rows;
    data.push_back(state("data." + v.name, {v.type.dtype, shape}));
  }
  ValueId order = state("data.order", {DType::i32, {rows}});
  ValueId cursor = state("data.cursor", {DType::i32, {}});
  const DType loss_dtype = step.type(loss_out.value).dtype;
  ValueId losses = state("data.losses", {loss_dtype, {log_capacity}});
  ValueId accuracies;
  if (acc_out) accuracies = state("data.accuracies", {step.type(acc_out->value).dtype, {log_capacity}});

  // The batch: rows order[cursor * B + i] for i in 0..B-1, of every column.
  ValueId base = r.add(Op::Mul, {cursor, g.add_constant(Tensor::scalar(DType::i32, batch))});
  ValueId positions = r.add(Op::Add, {base, g.add_constant(iota_i32(batch))});
  ValueId picked = r.add(Op::Gather, {order, positions}, {{"axis", int64_t{0}}});
  for (size_t i = 0; i < columns.size(); ++i)
    r.set(columns[i]->value, r.add(Op::Gather, {data[i], picked}, {{"axis", int64_t{0}}}));
  if (lr_in.valid()) {
    ValueId lrs = state("data.lrs", {step.type(lr_in).dtype, {log_capacity}});
    r.set(lr_in, r.add(Op::Gather, {lrs, cursor}, {{"axis", int64_t{0}}}));
  }
  for (const Node& n : step.nodes()) r.copy(n);
  // The step's outputs, but the rate's pass-through update: the rate is data.lrs's now.
  Graph out = std::move(r.dst());
  for (const GraphOutput& o : step.outputs())
    if (!lr_in.valid() || o.name != lr + ".next") out.add_output(o.name, r.map(o.value));

  // The logs: slot `cursor` takes this step's value; then the cursor moves on.
  ValueId slot = out.add_node_at(Op::Eq, {out.add_constant(iota_i32(log_capacity)), cursor}, {}, "", "");
  out.add_output("data.losses.next", out.add_node_at(Op::Select, {slot, r.map(loss_out.value), losses}, {}, "", ""));
  if (acc_out)
    out.add_output("data.accuracies.next",
                   out.add_node_at(Op::Select, {slot, r.map(acc_out->value), accuracies}, {}, "", ""));
  out.add_output("data.cursor.next",
                 out.add_node_at(Op::Add, {cursor, out.add_constant(Tensor::scalar(DType::i32, 1))}, {}, "", ""));
  verify(out);
  return out;
}

}  // namespace kiln
