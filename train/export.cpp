// kiln train --export (train/export.h): the inference graph of a trained model, its weights
// and a README, written together.
#include "train/export.h"

#include <filesystem>
#include <set>

#include "codegen/aot.h"
#include "ir/error.h"
#include "ir/printer.h"
#include "passes/simplify.h"
#include "runtime/file_output.h"

namespace kiln {

namespace {

// A copy of a graph under the same name, and where each source value went (invalid: left out).
struct Copy {
  Graph graph;
  std::vector<ValueId> map;
  ValueId operator()(ValueId v) const { return map[static_cast<size_t>(v.id)]; }
};

// Copies `src` without outputs: each input under input_name(input) ("": left out, with every
// node that reads it, directly or not), every other node with its name (unless a renamed
// input took it), attributes and note.
template <typename InputName>
Copy copy_graph(const Graph& src, InputName input_name) {
  Copy c{Graph(src.name()), std::vector<ValueId>(src.values().size())};
  std::set<std::string> input_names;
  for (const GraphInput& in : src.inputs()) {
    std::string name = input_name(in);
    if (name.empty()) continue;
    c.map[static_cast<size_t>(in.value.id)] = c.graph.add_input(name, src.type(in.value), in.is_state);
    input_names.insert(name);
  }
  auto name_of = [&](ValueId r) {
    const std::string& n = src.value(r).name;
    return input_names.count(n) ? std::string() : n;
  };
  for (const Node& node : src.nodes()) {
    std::vector<ValueId> ops;
    bool copied = true;
    for (ValueId o : node.operands) {
      copied = copied && c(o).valid();
      ops.push_back(c(o));
    }
    if (!copied) continue;
    std::vector<ValueId> results;
    if (node.op == Op::Fused) {
      std::vector<std::string> names;
      for (ValueId r : node.results) names.push_back(name_of(r));
      results = c.graph.add_fused(ops, *node.body, names);
    } else {
      results.push_back(c.graph.add_node_at(node.op, ops, node.attrs, name_of(node.result()), node.location));
    }
    for (size_t i = 0; i < results.size(); ++i) {
      c.map[static_cast<size_t>(node.results[i].id)] = results[i];
      if (!node.note.empty()) c.graph.set_note(results[i], node.note);
    }
  }
  return c;
}

}  // namespace

Graph deployable_classifier(const Graph& classifier, const std::string& what) {
  size_t examples = 0;
  for (const GraphInput& in : classifier.inputs()) examples += !in.is_state;
  if (examples != 1 || classifier.outputs().empty())
    throw Error(what + ": a classifier to deploy has one input (the examples) and its logits as first output; @" +
                classifier.name() + " has " + std::to_string(examples) + " input(s) and " +
                std::to_string(classifier.outputs().size()) + " output(s)");
  const TensorType& logits = classifier.type(classifier.outputs()[0].value);
  if (logits.rank() != 2 || !is_float(logits.dtype))
    throw Error(what + ": a classifier's first output is float logits [N,C]; @" + classifier.name() + " gives " +
                logits.str());
  // The examples' input is %x, as kiln train feeds it.
  Copy c = copy_graph(classifier,
                      [&](const GraphInput& in) { return in.is_state ? classifier.value(in.value).name : "x"; });
  const ValueId out = c(classifier.outputs()[0].value);
  c.graph.add_output("logits", out);
  c.graph.add_output("predicted", c.graph.add_node_at(Op::Argmax, {out}, {{"axis", int64_t{1}}}, "", ""));
  verify(c.graph);
  return dce(c.graph, PassOptions{});
}

Graph inference_graph(const Graph& model, const std::string& what) {
  const ValueId y = model.find("y");
  if (!y.valid() || model.value(y).input < 0 || model.is_state(y))
    throw Error(what + ": @" + model.name() + " has no input %y (the labels) to leave out of its inference form");
  Copy c = copy_graph(model, [&](const GraphInput& in) { return in.value == y ? "" : model.value(in.value).name; });
  std::string dropped;
  for (const GraphOutput& o : model.outputs()) {
    if (c(o.value).valid()) c.graph.add_output(o.name, c(o.value));
    else dropped += (dropped.empty() ? "" : ", ") + o.name;
  }
  if (c.graph.outputs().empty())
    throw Error(what + ": every output of @" + model.name() + " (" + dropped +
                ") reads the labels %y, so its inference form computes nothing; add an output of the logits (or "
                "predictions) to export it");
  verify(c.graph);
  return dce(c.graph, PassOptions{});
}

ExportResult export_model(const std::string& dir, const Graph& inference, const TensorMap& state) {
  ExportResult r;
  TensorMap weights;
  for (const GraphInput& in : inference.inputs()) {
    if (!in.is_state) continue;
    const Value& v = inference.value(in.value);
    auto it = state.find(v.name);
    if (it == state.end())
      throw Error("--export: the trained state has no tensor '" + v.name + "', which @" + inference.name() +
                  " reads (" + v.type.str() + ")");
    if (it->second.type() != v.type)
      throw Error("--export: the trained state's '" + v.name + "' is " + it->second.type().str() + ", @" +
                  inference.name() + " reads " + v.type.str());
    r.bytes += static_cast<int64_t>(it->second.nbytes());
    weights.emplace(v.name, it->second);
  }
  r.tensors = weights.size();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create the export folder (" + ec.message() + ")");
  const std::filesystem::path d(dir);
  const std::string name = inference.name();
  const std::string readme =
      "Compile: kiln compile model.kir --state-weights weights.safetensors -o " + name + ".o --header " + name +
      ".h   (C: " + name + "_create, " + name + "_run; docs/aot.md)  Run: kiln run model.kir --state-weights "
      "weights.safetensors --input x=X.npy\n";
  const std::string kir = print(inference), bytes = serialize_weights(weights);
  const std::vector<rt::OutputBytes> files = {{(d / "model.kir").string(), kir},
                                              {(d / "weights.safetensors").string(), bytes},
                                              {(d / "README").string(), readme}};
  std::string why;
  if (!rt::write_files(files, /*durable=*/false, why)) throw Error(why);
  for (const rt::OutputBytes& f : files) r.files.push_back(f.first);
  return r;
}

}  // namespace kiln
