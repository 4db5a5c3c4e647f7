// ONNX import: an ONNX model file becomes a Kiln graph, through ONNX's own C++ library
// (Debian's libonnx-dev): its protobuf model, checker, shape inference and version
// converter. docs/onnx.md lists the ops and what each maps to.
//
// Initializers: float ones become state inputs (the model's parameters, named as in the
// file), so an imported model trains like a traced one and its weights can be swapped
// without a recompile; their values come back in OnnxModel::state. Integer and bool
// initializers (shapes, axes, indices) become constants. With
// OnnxImportOptions::constant_weights every initializer is a constant (inference only:
// the passes can fold through the weights).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/calling.h"
#include "ir/graph.h"

namespace kiln {

struct OnnxImportOptions {
  // The value of a symbolic (named or unknown) leading dimension of the graph inputs: the
  // batch size. Default 1. Any other symbolic dimension is an error naming it.
  std::optional<int64_t> batch;
  bool constant_weights = false;  // every initializer a constant, none state
  // Import for training (`kiln train` does): BatchNormalization normalizes with the batch's
  // statistics and updates its running mean and variance (their initializers' state) by
  // ONNX's rule, as outputs "NAME.next"; Dropout drops, from Philox keyed by the i64 state
  // "dropout.seed" and "dropout.counter" (updated to counter + 1 each step). Nodes that
  // ask for their training mode themselves (BatchNormalization training_mode=1, Dropout's
  // training_mode input true) get it either way.
  bool training = false;
  int64_t dropout_seed = 0;  // the initial value of "dropout.seed"
  // Values of graph inputs known at import time. An input listed here that a node needs
  // as a constant (Reshape's shape, Slice's starts, ...) is read from here; an input
  // that only such nodes use is not an input of the imported graph. Others stay inputs.
  TensorMap input_values;
};

struct OnnxModel {
  Graph graph;
  TensorMap state;  // the initializers behind the graph's state inputs, by name
  int64_t opset = 0;       // of the default domain, as the file declares it
  std::string producer;    // e.g. "pytorch 2.15.0"
  // ONNX names of the graph's inputs and outputs -> Kiln names (ONNX allows names such
  // as "input.1" or "/fc1/Gemm_output_0" that Kiln spells differently), in ONNX order.
  std::vector<std::pair<std::string, std::string>> inputs, outputs;
  std::vector<std::string> warnings;
};

// Reads, checks (onnx::checker), infers shapes, converts old opsets and imports the model
// at `path`. Throws kiln::Error: for a file that is not a valid model, for a model the
// checker rejects, for an opset Kiln does not know, and for unsupported ops, attributes
// or types, listing every one of them at once (count and first node names per op).
OnnxModel import_onnx(const std::string& path, const OnnxImportOptions& options = {});
// The same from the bytes of a model; `what` names it in errors (the fuzz target's entry).
OnnxModel import_onnx_bytes(std::string_view bytes, const std::string& what, const OnnxImportOptions& options = {});

// A serialized onnx.TensorProto (the backend test data's input_N.pb and output_N.pb) as a
// Kiln tensor; its name (may be empty) in *name. Throws kiln::Error for bad data or a type
// Kiln has no dtype for.
Tensor read_onnx_tensor(const std::string& path, std::string* name = nullptr);

// True for paths ending in ".onnx": the tools accept such files wherever a .kir goes.
bool is_onnx_path(std::string_view path);

}  // namespace kiln
