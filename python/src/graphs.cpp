// Graphs from Python: load / parse / import_onnx, printing, the interpreter, grad,
// train_step and the pass pipeline. The heavy calls release the GIL.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sstream>

#include "common.h"
#include "frontend/onnx_import.h"
#include "ir/dot.h"
#include "ir/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/autodiff.h"
#include "passes/pipeline.h"
#include "passes/train_step.h"

namespace kiln::py {

namespace {

using namespace nb::literals;

PyGraph from_onnx(OnnxModel model) { return PyGraph{std::move(model.graph), std::move(model.state)}; }

OnnxImportOptions onnx_options(std::optional<int64_t> batch, bool training, bool constant_weights) {
  OnnxImportOptions o;
  o.batch = batch;
  o.training = training;
  o.constant_weights = constant_weights;
  return o;
}

// name -> "f32[2,3]" for the graph's inputs (state or not) or outputs.
nb::dict input_types(const Graph& g, bool state) {
  nb::dict d;
  for (const GraphInput& in : g.inputs())
    if (in.is_state == state) d[nb::str(g.value(in.value).name.c_str())] = g.type(in.value).str();
  return d;
}

// The graph's state values as given, merged under the caller's (theirs win).
TensorMap with_state(const PyGraph& g, TensorMap given) {
  for (const auto& [name, t] : g.state) given.emplace(name, t);
  return given;
}

}  // namespace

void bind_graphs(nb::module_& m) {
  nb::class_<PyGraph>(m, "Graph",
                      "A Kiln graph (the IR) and the initial values of its state inputs (parameters, optimizer "
                      "state). str(g) is its .kir text; kiln.compile(g) makes it runnable.")
      .def_prop_ro("name", [](const PyGraph& g) { return g.graph.name(); }, "The graph's name (@name in .kir).")
      .def("text", [](const PyGraph& g) { return print(g.graph); }, "The canonical .kir text (as kiln dump prints it).")
      .def("__str__", [](const PyGraph& g) { return print(g.graph); })
      .def("__repr__",
           [](const PyGraph& g) {
             return "<kiln.Graph @" + g.graph.name() + ": " + std::to_string(g.graph.inputs().size()) + " inputs, " +
                    std::to_string(g.graph.nodes().size()) + " nodes, " + std::to_string(g.graph.outputs().size()) +
                    " outputs>";
           })
      .def("dot", [](const PyGraph& g) { return to_dot(g.graph); }, "The graph in Graphviz's dot language.")
      .def_prop_ro("inputs", [](const PyGraph& g) { return input_types(g.graph, false); },
                   "The non-state inputs: name -> type (e.g. 'f32[64,784]'), in graph order.")
      .def_prop_ro("state_inputs", [](const PyGraph& g) { return input_types(g.graph, true); },
                   "The state inputs (parameters, optimizer state): name -> type, in graph order.")
      .def_prop_ro(
          "outputs",
          [](const PyGraph& g) {
            nb::dict d;
            for (const GraphOutput& o : g.graph.outputs()) d[nb::str(o.name.c_str())] = g.graph.type(o.value).str();
            return d;
          },
          "The outputs: name -> type, in graph order (a training step's 'X.next' state updates included).")
      .def_prop_ro("num_nodes", [](const PyGraph& g) { return g.graph.nodes().size(); }, "Top-level nodes.")
      .def_prop_rw(
          "state", [](const PyGraph& g) { return to_dict(g.state, false); },
          [](PyGraph& g, nb::handle values) { g.state = to_tensor_map(values, "Graph.state"); },
          "The initial values of the state inputs by name, as read-only NumPy arrays; assign a dict to "
          "replace them (kiln.compile sets them on the executable).")
      .def("__copy__", [](const PyGraph& g) { return PyGraph(g); });

  m.def(
      "parse",
      [](const std::string& text, const std::string& filename) {
        nb::gil_scoped_release release;
        return PyGraph{parse(text, filename), {}};
      },
      "text"_a, "filename"_a = "<string>", "A graph from .kir text; errors name filename:line:column.");
  m.def(
      "_load_kir",
      [](const std::string& path) {
        nb::gil_scoped_release release;
        return PyGraph{parse_file(path), {}};
      },
      "path"_a);
  m.def(
      "_import_onnx_file",
      [](const std::string& path, std::optional<int64_t> batch, bool training, bool constant_weights) {
        nb::gil_scoped_release release;
        return from_onnx(import_onnx(path, onnx_options(batch, training, constant_weights)));
      },
      "path"_a, "batch"_a = nb::none(), "training"_a = false, "constant_weights"_a = false);
  m.def(
      "_import_onnx_bytes",
      [](nb::bytes data, std::optional<int64_t> batch, bool training, bool constant_weights) {
        std::string bytes(data.c_str(), data.size());
        nb::gil_scoped_release release;
        return from_onnx(import_onnx_bytes(bytes, "<bytes>", onnx_options(batch, training, constant_weights)));
      },
      "data"_a, "batch"_a = nb::none(), "training"_a = false, "constant_weights"_a = false);

  m.def(
      "interpret",
      [](const PyGraph& g, nb::handle inputs) {
        TensorMap given = with_state(g, to_tensor_map(inputs, "kiln.interpret"));
        TensorMap out;
        {
          nb::gil_scoped_release release;
          out = interpret(g.graph, given);
        }
        return to_dict(out, true);
      },
      "graph"_a, "inputs"_a = nb::dict(),
      "Runs the graph with Kiln's reference interpreter: inputs by name (the graph's state values fill in "
      "what is not given) -> every output by name. Slow and exact: the semantics the compiled code is checked "
      "against.");

  m.def(
      "grad",
      [](const PyGraph& g, const std::string& loss, std::vector<std::string> wrt) {
        if (wrt.empty())
          for (const GraphInput& in : g.graph.inputs())
            if (in.is_state && is_float(g.graph.type(in.value).dtype)) wrt.push_back(g.graph.value(in.value).name);
        nb::gil_scoped_release release;
        GradResult r = grad(g.graph, loss, wrt);
        return PyGraph{std::move(r.graph), g.state};
      },
      "graph"_a, "loss"_a = "loss", "wrt"_a = std::vector<std::string>{},
      "A graph that also outputs 'grad.NAME' = d(loss)/d(NAME) for each name in wrt (default: every float "
      "state input, the parameters). loss names a float scalar output.");

  nb::class_<SGD>(m, "SGD", "Stochastic gradient descent, as torch.optim.SGD.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](SGD* o, double lr, double momentum, double dampening, double weight_decay, bool nesterov) {
            new (o) SGD{lr, momentum, dampening, weight_decay, nesterov};
          },
          "lr"_a = 0.01, "momentum"_a = 0.0, "dampening"_a = 0.0, "weight_decay"_a = 0.0, "nesterov"_a = false)
      .def_rw("lr", &SGD::lr)
      .def_rw("momentum", &SGD::momentum)
      .def_rw("dampening", &SGD::dampening)
      .def_rw("weight_decay", &SGD::weight_decay)
      .def_rw("nesterov", &SGD::nesterov);
  nb::class_<Adam>(m, "Adam", "Adam with L2 weight decay, as torch.optim.Adam.")
      .def(
          "__init__",
          [](Adam* o, double lr, double beta1, double beta2, double eps, double weight_decay) {
            new (o) Adam{lr, beta1, beta2, eps, weight_decay};
          },
          "lr"_a = 1e-3, "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8, "weight_decay"_a = 0.0)
      .def_rw("lr", &Adam::lr)
      .def_rw("beta1", &Adam::beta1)
      .def_rw("beta2", &Adam::beta2)
      .def_rw("eps", &Adam::eps)
      .def_rw("weight_decay", &Adam::weight_decay);
  nb::class_<AdamW>(m, "AdamW", "Adam with decoupled weight decay, as torch.optim.AdamW.")
      .def(
          "__init__",
          [](AdamW* o, double lr, double beta1, double beta2, double eps, double weight_decay) {
            new (o) AdamW{lr, beta1, beta2, eps, weight_decay};
          },
          "lr"_a = 1e-3, "beta1"_a = 0.9, "beta2"_a = 0.999, "eps"_a = 1e-8, "weight_decay"_a = 1e-2)
      .def_rw("lr", &AdamW::lr)
      .def_rw("beta1", &AdamW::beta1)
      .def_rw("beta2", &AdamW::beta2)
      .def_rw("eps", &AdamW::eps)
      .def_rw("weight_decay", &AdamW::weight_decay);

  auto train_step = [](const PyGraph& g, const Optimizer& opt, const std::string& loss) {
    TrainStepOptions options;
    options.loss = loss;
    TrainStep step;
    {
      nb::gil_scoped_release release;
      step = make_train_step(g.graph, opt, options);
    }
    PyGraph out{std::move(step.graph), g.state};
    for (auto& [name, t] : step.initial_state()) out.state.insert_or_assign(name, std::move(t));
    return out;
  };
  const char* train_doc =
      "The whole training step as one graph: forward, loss, backward and the optimizer's update. Its state is "
      "the model's parameters plus the optimizer's buffers, 'step', 'lr' and the hyper-parameters (all "
      "initialised in the returned graph's state); its outputs are the model's plus 'X.next' for each state "
      "input X.";
  m.def("train_step", [=](const PyGraph& g, const SGD& o, const std::string& loss) { return train_step(g, o, loss); },
        "graph"_a, "optimizer"_a, "loss"_a = "loss", train_doc);
  m.def("train_step", [=](const PyGraph& g, const Adam& o, const std::string& loss) { return train_step(g, o, loss); },
        "graph"_a, "optimizer"_a, "loss"_a = "loss");
  m.def("train_step", [=](const PyGraph& g, const AdamW& o, const std::string& loss) { return train_step(g, o, loss); },
        "graph"_a, "optimizer"_a, "loss"_a = "loss");

  m.def(
      "optimize",
      [](const PyGraph& g, std::optional<std::vector<std::string>> passes, bool inference, bool print_after_all) {
        PipelineOptions o;
        if (passes) o.passes = *passes;
        o.pass_options.inference = inference;
        o.print_after_all = print_after_all;
        o.verify_each = true;
        std::ostringstream log;
        o.log = &log;
        PipelineResult r;
        {
          nb::gil_scoped_release release;
          r = run_pipeline(g.graph, o);
        }
        if (print_after_all) nb::print(nb::str(log.str().c_str()), nb::str(""));
        return PyGraph{std::move(r.graph), g.state};
      },
      "graph"_a, "passes"_a = nb::none(), "inference"_a = false, "print_after_all"_a = false,
      "Runs the pass pipeline (default: the one kiln.compile runs; or the named passes, as kiln opt "
      "--passes) and returns the optimized graph; print_after_all prints the graph after every pass.");
  m.def("passes", [] {
    std::vector<std::string> names;
    for (const PassInfo& p : registered_passes()) names.push_back(p.name);
    return names;
  }, "The names of the registered passes.");
}

}  // namespace kiln::py
