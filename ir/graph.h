// The IR: a graph of SSA values. Values are defined by graph inputs (plain or state) or
// by node results; nodes are appended in a valid topological order and never mutated
// after they are built (passes build new graphs). Builders infer result types and reject
// bad operands with an error naming the op, the operand types and the caller's line.
#pragma once

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ir/attrs.h"
#include "ir/dtype.h"
#include "ir/ops.h"

namespace kiln {

struct ValueId {
  int32_t id = -1;
  bool valid() const { return id >= 0; }
  bool operator==(const ValueId&) const = default;
};

struct Value {
  TensorType type;
  std::string name;   // empty: unnamed (printed as %N)
  int32_t node = -1;  // defining node, or -1 for a graph input
  int32_t input = -1; // index into Graph::inputs(), or -1
};

class Graph;

struct Node {
  Op op;
  std::vector<ValueId> operands;
  AttrMap attrs;
  std::vector<ValueId> results;  // one for every op in ops.def; fused ops may have more
  std::string note;              // printed as a trailing comment (e.g. what a node came from)
  std::string location;          // user source line for traced code; not printed
  // Op::Fused only: the fused computation. Its inputs take the operands (same types, in
  // order; never state) and its outputs are the node's results, in order.
  std::shared_ptr<const Graph> body;
  ValueId result() const { return results.at(0); }
};

struct GraphInput {
  ValueId value;
  bool is_state = false;  // parameters and optimizer state
};

struct GraphOutput {
  std::string name;
  ValueId value;
};

class Graph {
 public:
  explicit Graph(std::string name = "main") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  // Why the batch size of this graph cannot change, or "" when nothing fixed it:
  // passes/rebatch refuses the graph with this reason. The ONNX importer sets it for a
  // model that computes something from its symbolic batch size that the graph rebatched
  // would not (docs/onnx.md); passes that copy a graph keep it; .kir spells it
  // `graph @g(...) fixed_batch {  // reason`.
  const std::string& fixed_batch() const { return fixed_batch_; }
  void set_fixed_batch(std::string why) { fixed_batch_ = std::move(why); }

  ValueId add_input(std::string name, TensorType type, bool is_state = false);
  // Completes attributes from the op's schema, infers the result type and appends the
  // node. Throws kiln::Error naming the op, the operand types and `loc`.
  ValueId add_node(Op op, std::vector<ValueId> operands, AttrMap attrs = {},
                   std::string name = "",
                   std::source_location loc = std::source_location::current());
  // As add_node, but without a user source line in errors (for parsers and passes).
  ValueId add_node_at(Op op, std::vector<ValueId> operands, AttrMap attrs, std::string name,
                      std::string location);
  ValueId add_constant(const Tensor& value, std::string name = "");
  // Appends an Op::Fused node computing `body` on `operands`: one result per body output,
  // with the body output's type, named by `result_names` (empty or "" = unnamed). Throws
  // kiln::Error if the body is invalid or its inputs do not match the operands.
  std::vector<ValueId> add_fused(std::vector<ValueId> operands, Graph body,
                                 std::vector<std::string> result_names = {});
  void add_output(std::string name, ValueId v);
  void set_note(ValueId v, std::string note);

  const Value& value(ValueId v) const;
  const TensorType& type(ValueId v) const { return value(v).type; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<GraphInput>& inputs() const { return inputs_; }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }
  const Node* defining_node(ValueId v) const;

  // By value name (inputs and named node results); invalid ValueId if absent.
  ValueId find(std::string_view name) const;
  // By output name; invalid ValueId if absent.
  ValueId find_output(std::string_view name) const;
  bool is_state(ValueId v) const;

 private:
  ValueId new_value(TensorType type, std::string name);

  std::string name_;
  std::string fixed_batch_;
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<GraphInput> inputs_;
  std::vector<GraphOutput> outputs_;
  std::unordered_map<std::string, int32_t> by_name_;
};

// Checks attributes against the op's schema (kinds, unknown names, required ones) and
// fills in defaults. Throws kiln::Error.
AttrMap complete_attrs(Op op, AttrMap given);
// The shape rule: the result type of `op` over operand types and complete attributes.
// Throws kiln::Error naming the op and operand types.
TensorType infer_type(Op op, const std::vector<TensorType>& operands, const AttrMap& attrs);
// Checks a whole graph: operands defined before use, arity, attributes, types agree with
// the shape rules, unique names, outputs defined, state outputs match their inputs. A fused
// node's body is verified too (recursively): its inputs take the operands' types, its
// outputs give the results' types, and it nests at most kMaxFusedNesting deep. Throws
// kiln::Error naming the offending node (and the body it is in).
void verify(const Graph& g);

// How deep fused bodies may nest (a fused node inside a body inside a body ...): the
// printer, parser, verifier and interpreter recurse once per level.
inline constexpr int kMaxFusedNesting = 16;

// Valid value names: a letter or '_' then letters, digits, '_' and '.'.
bool is_valid_name(std::string_view name);
// Broadcast two shapes NumPy-style; nullopt when incompatible.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace kiln
