// Inside the ONNX importer (frontend/onnx_import.cpp drives, frontend/onnx_ops*.cpp map
// the ops): the per-node context each op's mapping function works through.
#pragma once

#include <onnx/onnx_pb.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "frontend/onnx_import.h"
#include "ir/graph.h"
#include "ir/tensor.h"

namespace kiln::onnx_import {

// A node Kiln cannot import as written (an op variant, an attribute value, a type); the
// message says what. The importer collects these and reports them all at once.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Recipe;

// An ONNX value as the importer sees it: a Kiln value, a value known at import time
// (constants, shapes, what folds from them), or both.
struct Val {
  ValueId id;                   // invalid until it is needed at run time
  std::optional<Tensor> known;  // a constant's value
  std::optional<Tensor> hint;   // a graph input's value given in OnnxImportOptions::input_values, or a
                                // float initializer's initial value (it is state)
  std::string input;            // that graph input's Kiln name (added when first needed)
  TensorType type;
  // A known value computed from a value's shape (Shape, Size and what folds from them): it
  // may hold the batch size (the leading dimension of the inputs, symbolic or not). Such a value made
  // by a node has its `recipe`: in the graph (materialize) it is that node over the
  // operands, not a constant, so a broadcast or reshape to the batch stays one that
  // passes/rebatch follows (a constant [1, S] at batch 1 could not be rebatched).
  bool from_batch = false;
  std::shared_ptr<const Recipe> recipe;
};

struct Recipe {
  Op op;
  std::vector<Val> operands;
  AttrMap attrs;
};

class Ctx {
 public:
  Ctx(Graph& g, int64_t opset, const OnnxImportOptions& options = {}, TensorMap* state = nullptr)
      : g_(g), opset_(opset), options_(options), state_(state) {}

  int64_t opset() const { return opset_; }
  Graph& graph() { return g_; }
  const onnx::NodeProto& node() const { return *node_; }

  // --- the current node's inputs ---
  int num_inputs() const;       // without trailing empty (omitted optional) inputs
  bool has_input(int i) const;  // given and not empty
  Val in(int i) const;          // Unsupported-free: the node's checked arity guarantees i
  const TensorType& type(int i) const;
  // The value of input i when it is known at import time; Unsupported naming `what`
  // (e.g. "shape") when it is computed at run time.
  const Tensor& in_const(int i, const char* what) const;
  std::vector<int64_t> in_ints(int i, const char* what) const;  // a known integer tensor's elements

  // --- attributes (each read marks it handled; unread ones are reported unsupported) ---
  bool has_attr(const std::string& name) const;
  int64_t attr_int(const std::string& name, int64_t def);
  double attr_float(const std::string& name, double def);
  std::vector<int64_t> attr_ints(const std::string& name, std::vector<int64_t> def = {});
  std::vector<double> attr_floats(const std::string& name);  // empty when absent
  std::string attr_string(const std::string& name, std::string def = "");
  Tensor attr_tensor(const std::string& name);
  // Marks attributes read without a value check (documented as ignored for inference).
  void ignore_attr(const std::string& name);

  // --- outputs ---
  int num_outputs() const;
  bool output_used(int i) const;  // given and not empty (a consumer may still not exist)
  void set_output(int i, Val v);

  // --- training (OnnxImportOptions::training) ---
  bool training() const { return options_.training; }
  // Makes `next` the new value of `state`, a state input (an initializer): the graph
  // outputs it as "NAME.next" (a buffer the model updates itself). Unsupported when state
  // is not a state input (a constant under constant_weights, a computed value).
  void update_state(const Val& state, Val next, const char* what);
  // The i64 scalar state inputs "dropout.seed" (OnnxImportOptions::dropout_seed) and
  // "dropout.counter" (0, with its update counter + 1), added on first use, and a new
  // Philox stream number per call (one per Dropout node).
  std::pair<Val, Val> dropout_state();
  int64_t next_dropout_stream() { return dropout_streams_++; }
  // The state updates in the order made, for the driver to output after the model's outputs.
  std::vector<std::pair<std::string, Val>>& state_updates() { return updates_; }
  // --- initializers read by several nodes ---
  // How often each ONNX value is read (through Identity chains, graph outputs included).
  void set_reads(std::map<std::string, int> reads, std::map<std::string, std::string> identity_of) {
    reads_ = std::move(reads);
    identity_of_ = std::move(identity_of);
  }
  // True when input i's value (followed through Identity nodes) is read elsewhere too: an
  // exporter merges equal initializers (PyTorch: a fresh batch norm's running mean and
  // bias, both zeros).
  bool input_shared(int i) const;
  // A state input of its own for input i, named after the node ("NODE.leaf"), starting at
  // input i's initial value: for state this node updates that others read unchanged.
  Val own_state(int i, const std::string& leaf);
  // --- building ---
  // Appends `op` (or, when every operand is known and the result small, computes it now).
  // from_batch: the attributes came from a value computed from the batch size (Val::from_batch).
  Val node(Op op, std::vector<Val> operands, AttrMap attrs = {}, bool from_batch = false);
  Val constant(Tensor t);
  Val scalar(DType t, double v);  // a rank-0 constant
  ValueId materialize(Val& v);    // the value in the graph (adding a constant or input)

  // Driver side.
  void begin(const onnx::NodeProto& n, std::map<std::string, Val>* env);
  std::vector<std::string> unread_attrs() const;

 private:
  const onnx::AttributeProto* find_attr(const std::string& name) const;

  Graph& g_;
  int64_t opset_;
  OnnxImportOptions options_;
  TensorMap* state_;
  std::vector<std::pair<std::string, Val>> updates_;
  std::optional<std::pair<Val, Val>> dropout_;
  std::map<std::string, int> reads_;
  std::map<std::string, std::string> identity_of_;
  int64_t dropout_streams_ = 0;
  const onnx::NodeProto* node_ = nullptr;
  std::map<std::string, Val>* env_ = nullptr;
  std::set<std::string> read_;
  std::map<std::string, ValueId> lazy_inputs_;  // Kiln input name -> its value once added
};

// ONNX elem_type -> Kiln dtype; nullopt for types Kiln lacks.
std::optional<DType> dtype_of(int32_t elem_type);
std::string elem_type_name(int32_t elem_type);
Tensor to_tensor(const onnx::TensorProto& t, const std::string& what);

// The op table: ONNX op type (default domain) -> mapping function.
using MapFn = void (*)(Ctx&);
const std::map<std::string, MapFn>& op_table();

// Normalizes axis `a` (may be negative) for rank `rank`; Unsupported when out of range.
int64_t norm_axis(int64_t a, int64_t rank);

}  // namespace kiln::onnx_import
