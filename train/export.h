// Exporting a trained model for deployment (`kiln train --export DIR`): its inference graph
// and the trained state that graph reads, as `kiln compile` and `kiln run` take them:
//   kiln train lenet --data fashion-mnist --export out/
//   kiln compile out/model.kir --state-weights out/weights.safetensors -o m.o --header m.h
#pragma once

#include <string>
#include <vector>

#include "ir/calling.h"
#include "ir/graph.h"

namespace kiln {

// A classifier (one non-state input of examples [N,...], its first output float logits
// [N,C]: a built-in model without its loss, an ONNX model imported for inference) as it is
// deployed: input %x, outputs "logits" and "predicted" (argmax of the logits: i32 [N]); its
// state inputs kept, its other outputs (state updates) dropped. kiln::Error naming `what`
// when the graph is not of that form.
Graph deployable_classifier(const Graph& classifier, const std::string& what);

// The inference form of a training graph (inputs %x, %y, ...; outputs such as "loss"): the
// graph without its labels %y and without every output that depends on them, dead code
// removed. kiln::Error naming `what` when nothing is left (a .kir model is exported through
// an output of its logits or predictions that does not read %y).
Graph inference_graph(const Graph& model, const std::string& what);

struct ExportResult {
  std::vector<std::string> files;  // DIR/model.kir, DIR/weights.safetensors, DIR/README
  size_t tensors = 0;              // in the weights file
  int64_t bytes = 0;               // of the tensors' data
};
// Writes DIR (created if needed): model.kir (`inference`), weights.safetensors (the tensors
// of `state` that are its state inputs: every one must be there, with its type) and README
// (one line: how to compile and run it). All three or none: a failure leaves DIR's files as
// they were. kiln::Error naming what is missing or what cannot be written.
ExportResult export_model(const std::string& dir, const Graph& inference, const TensorMap& state);

}  // namespace kiln
