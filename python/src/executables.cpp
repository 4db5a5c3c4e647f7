// Compiled graphs from Python: kiln.compile -> Executable, called with arrays by name; its
// state as a mapping. Compiling and running release the GIL, so other Python threads run.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>

#include "codegen/executable.h"
#include "runtime/thread_pool.h"
#include "common.h"

namespace kiln::py {

namespace {

using namespace nb::literals;

// The arguments of a call: a dict given positionally, then keyword arrays (which win).
TensorMap call_inputs(nb::handle positional, const nb::kwargs& kwargs, std::string_view what) {
  TensorMap in = to_tensor_map(positional, what);
  for (auto [key, value] : kwargs) {
    std::string name = nb::cast<std::string>(key);
    in.insert_or_assign(name, to_tensor(value, std::string(what) + " '" + name + "'"));
  }
  return in;
}

// An executable's state by name, read and written through the executable.
struct StateView {
  std::shared_ptr<Executable> exe;
};

AotOptions aot_options(const std::string& object, const std::string& header, const std::string& name,
                      const std::string& weights, const std::string& weights_file) {
  AotOptions a;
  a.object = object;
  a.header = header;
  a.name = name;
  if (weights == "file") a.weights = WeightsMode::File;
  else if (weights != "embed") throw Error("weights must be 'embed' or 'file', got '" + weights + "'");
  a.weights_file = weights_file;
  return a;
}

nb::dict aot_result(const AotResult& r) {
  nb::dict d;
  d["name"] = r.name;
  d["target"] = r.target;
  d["files"] = r.files;
  d["arena_bytes"] = r.arena_bytes;
  d["weights_bytes"] = r.weights_bytes;
  return d;
}

}  // namespace

void bind_executables(nb::module_& m) {
  nb::class_<StateView>(m, "State",
                        "An executable's state (parameters, optimizer state) by name. s[name] is a NumPy copy of the "
                        "current value; s[name] = array sets it (same dtype and shape); s.update(dict) sets several.")
      .def("__getitem__", [](const StateView& s, const std::string& name) {
        Tensor t;
        {
          Released release;
          t = s.exe->state(name);
        }
        return to_numpy(t, true);
      })
      .def("__setitem__", [](StateView& s, const std::string& name, nb::handle value) {
        Tensor t = to_tensor(value, "state '" + name + "'");
        Released release;
        s.exe->set_state(name, t);
      })
      .def("update", [](StateView& s, nb::handle values) {
        TensorMap m = to_tensor_map(values, "State.update");
        Released release;
        s.exe->set_state(m);
      }, "values"_a)
      .def("keys", [](const StateView& s) { return s.exe->state_names(); })
      .def("__iter__", [](const StateView& s) { return nb::iter(nb::cast(s.exe->state_names())); })
      .def("__len__", [](const StateView& s) { return s.exe->state_names().size(); })
      .def("__contains__", [](const StateView& s, const std::string& name) {
        for (const std::string& n : s.exe->state_names())
          if (n == name) return true;
        return false;
      })
      .def("to_dict", [](const StateView& s) {
        TensorMap all;
        {
          Released release;
          all = s.exe->state();
        }
        return to_dict(all, true);
      }, "Copies of every state tensor that is set, by name.")
      .def("items", [](nb::handle self) { return nb::list(self.attr("to_dict")().attr("items")()); },
           "(name, copy) for every state tensor that is set.");

  nb::class_<Executable>(m, "Executable",
                         "A graph compiled for a target. exe(x=array, ...) or exe({'x': array}) runs it and returns "
                         "its outputs by name as NumPy arrays over Kiln's memory (no copy); the inputs are read in "
                         "place when C-contiguous and of the graph's dtype.")
      .def(
          "__call__",
          [](Executable& e, nb::handle inputs, const nb::kwargs& kwargs) {
            TensorMap in = call_inputs(inputs, kwargs, "inputs");
            TensorMap out;
            {
              Released release;
              out = e.run(in);
            }
            return to_dict(out, true);
          },
          "inputs"_a = nb::none(), "kwargs"_a,
          "Runs one call: the non-state inputs by name -> every output but the state updates, which become the "
          "new state.")
      .def(
          "step",
          [](Executable& e, nb::handle inputs, const nb::kwargs& kwargs) {
            TensorMap in = call_inputs(inputs, kwargs, "inputs");
            Released release;
            e.step(in);
          },
          "inputs"_a = nb::none(), "kwargs"_a,
          "As a call, without reading any output back: the state is updated (a training loop that reads the "
          "loss now and then).")
      .def(
          "evaluate",
          [](Executable& e, nb::handle inputs) {
            TensorMap in = to_tensor_map(inputs, "inputs");
            TensorMap out;
            {
              Released release;
              out = e.evaluate(in);
            }
            return to_dict(out, true);
          },
          "inputs"_a,
          "Pure: every input, state included, by name -> every output, state updates included; the held state "
          "is neither read nor changed.")
      .def_prop_ro("state", [](std::shared_ptr<Executable> e) { return StateView{std::move(e)}; },
                   "The state by name (kiln.State).")
      .def_prop_ro("input_names", &Executable::input_names, "The non-state inputs, in graph order.")
      .def_prop_ro("state_names", &Executable::state_names, "The state inputs, in graph order.")
      .def_prop_ro("target", &Executable::target, "The target it was compiled for ('cpu', 'cuda').")
      .def_prop_ro("compile_ms", &Executable::compile_milliseconds, "Milliseconds its compile took.")
      .def_prop_ro("from_cache", &Executable::from_cache, "Whether the code came from the compile cache.")
      .def(
          "share_state_with",
          [](Executable& e, const Executable& other) {
            Released release;
            e.share_state_with(other);
          },
          "other"_a,
           "Uses other's state from now on (no copies): an inference executable that sees a training step's "
           "latest weights.")
      .def(
          "profile",
          [](const Executable& e) {
            Released release;
            return e.profile_report();
          },
           "Per-kernel time of the calls so far, slowest first (compile with profile=True).")
      .def("reset_profile", [](Executable& e) {
        Released release;
        e.reset_profile();
      })
      .def("emit", [](const Executable& e, const std::string& form) { return e.emit(form); }, "form"_a,
           "The generated code as text: 'kernels' (every target), 'llvm' / 'asm' (cpu), 'cuda' / 'ptx'.")
      .def_prop_ro("emit_forms", &Executable::emit_forms)
      .def(
          "write_object",
          [](const Executable& e, const std::string& object, const std::string& header, const std::string& name,
              const std::string& weights, const std::string& weights_file) {
            AotOptions a = aot_options(object, header, name, weights, weights_file);
            AotResult r;
            {
              Released release;
              r = e.write_object(a);
            }
            return aot_result(r);
          },
          "object"_a, "header"_a = "", "name"_a = "", "weights"_a = "embed", "weights_file"_a = "",
          "Writes this executable's code as an object file with its current state as the initial state "
          "(kiln.compile_aot's files): train in Python, deploy the object.");

  m.def(
      "compile_aot",
      [](const PyGraph& g, const std::string& object, const std::string& header, const std::string& name,
          const std::string& weights, const std::string& weights_file, const std::string& cpu,
          const std::string& features, int opt) {
        CompileOptions o;
        o.target = "cpu";
        o.cpu = cpu;
        o.features = features;
        o.opt_level = opt;
        AotOptions a = aot_options(object, header, name, weights, weights_file);
        AotResult r;
        {
          nb::gil_scoped_release release;
          r = write_object(g.graph, g.state, o, a);
        }
        return aot_result(r);
      },
      "graph"_a, "object"_a, "header"_a = "", "name"_a = "", "weights"_a = "embed", "weights_file"_a = "",
      "cpu"_a = "", "features"_a = "", "opt"_a = 3,
      "Compiles the graph ahead of time, as `kiln compile` does: an object file for the CPU (cpu='' is the "
      "portable x86-64-v3 default: AVX2 and FMA; 'native' this machine) with the graph's state as its initial state, and the "
      "C header (header=) declaring NAME_create, NAME_run, ... (name: the C prefix; default the graph's name). "
      "weights='file' writes the state to a safetensors file (weights_file, default the object's name with "
      ".safetensors) instead of embedding it. Returns what was written.");
  m.def(
      "save_weights",
      [](const std::string& path, nb::handle tensors) {
        TensorMap t = to_tensor_map(tensors, "save_weights");
        nb::gil_scoped_release release;
        save_weights(path, t);
      },
      "path"_a, "tensors"_a,
      "Writes arrays by name to a safetensors file with Kiln's checksums (the format of checkpoints and AOT "
      "weights files), atomically.");
  m.def(
      "load_weights",
      [](const std::string& path) {
        TensorMap t;
        {
          nb::gil_scoped_release release;
          t = load_weights(path);
        }
        return to_dict(t, true);
      },
      "path"_a, "Every tensor of a safetensors file (Kiln's, a checkpoint, or Python's safetensors) by name.");
  m.def(
      "_bench_run",
      [](Executable& e, nb::handle inputs, int64_t calls) {
        TensorMap in = to_tensor_map(inputs, "inputs");
        Released release;
        auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < calls; ++i) TensorMap out = e.run(in);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      },
      "exe"_a, "inputs"_a, "calls"_a,
      "Seconds for `calls` Executable::run calls made from C++ (bench/python: the baseline of a call from "
      "Python).");
  m.def(
      "compile",
      [](const PyGraph& g, const std::string& target, int opt, bool inference, bool profile, const std::string& cpu,
         const std::string& features, int threads) {
        if (threads < 0) throw Error("threads must be 0 (every thread) or more, got " + std::to_string(threads));
        CompileOptions o;
        o.target = target;
        o.opt_level = opt;
        o.inference = inference;
        o.profile = profile;
        o.cpu = cpu;
        o.features = features;
        o.threads = threads;
        std::shared_ptr<Executable> e;
        {
          nb::gil_scoped_release release;
          e = kiln::compile(g.graph, o);
          // The graph's state values (parameters, optimizer state) that it has inputs for.
          TensorMap state;
          for (const std::string& name : e->state_names())
            if (auto it = g.state.find(name); it != g.state.end()) state.emplace(name, it->second);
          if (!state.empty()) e->set_state(state);
        }
        return e;
      },
      "graph"_a, "target"_a = "", "opt"_a = 3, "inference"_a = true, "profile"_a = false, "cpu"_a = "",
      "features"_a = "", "threads"_a = 0,
      "Compiles a graph for a target ('cpu': LLVM JIT; 'cuda': NVIDIA GPUs; '' : $KILN_TARGET, else cpu) and "
      "sets the graph's state values on it. opt is LLVM's level (0-3); profile adds per-kernel timers; a graph "
      "without state updates compiles in inference mode unless inference=False. threads: the most CPU threads "
      "a call uses (0: all of the process's pool, which has $KILN_NUM_THREADS threads, default every core; "
      "more than the pool's is the pool's); the results are the same bits for any count.");
  m.def("num_threads", [] { return rt::started_threads(); },
        "The CPU runtime's pool's thread count ($KILN_NUM_THREADS, default every core), or 0 before its "
        "threads start (the first kernel that runs in parallel starts them).");
}

}  // namespace kiln::py
