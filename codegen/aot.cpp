// kiln::write_object (codegen/aot.h): the checks, the backend's object, and the files,
// written all or nothing (runtime/file_output.h write_files).
#include "codegen/aot.h"

#include "codegen/executable.h"
#include "ir/error.h"
#include "runtime/aot_internal.h"
#include "runtime/file_output.h"

namespace kiln {

namespace {

// "dir/model.o" -> "dir/model.safetensors".
std::string weights_path(const std::string& object) {
  size_t slash = object.find_last_of('/');
  size_t dot = object.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return object + ".safetensors";
  return object.substr(0, dot) + ".safetensors";
}

// The files write_object writes: the object, the header (if any), the weights file (if any).
std::vector<std::string> output_paths(const AotOptions& aot) {
  std::vector<std::string> paths{aot.object};
  if (!aot.header.empty()) paths.push_back(aot.header);
  if (aot.weights == WeightsMode::File)
    paths.push_back(aot.weights_file.empty() ? weights_path(aot.object) : aot.weights_file);
  return paths;
}

// The checks that need no compiling: target, name, state. Returns the C prefix.
std::string check_request(const Graph& g, const TensorMap& state, const CompileOptions& options,
                          const AotOptions& aot) {
  const std::string where = "write_object @" + g.name() + ": ";
  verify(g);
  std::string target = resolve_target(options);
  if (target != "cpu")
    throw Error(where + "target '" + target + "' cannot be compiled ahead of time: objects are for the CPU only " +
                "(target \"cpu\")");
  if (aot.object.empty()) throw Error(where + "no object file given (AotOptions::object)");
  std::string name = aot.name.empty() ? g.name() : aot.name;
  if (std::string why = aot_name_error(name); !why.empty()) throw Error(where + why);
  for (const GraphInput& gi : g.inputs()) {
    if (!gi.is_state) continue;
    const Value& v = g.value(gi.value);
    auto it = state.find(v.name);
    if (it == state.end())
      throw Error(where + "no initial value for state '%" + v.name + "' (" + v.type.str() +
                  "): every state input needs one");
    if (it->second.type() != v.type)
      throw Error(where + "state '%" + v.name + "': expected " + v.type.str() + ", got " + it->second.type().str());
  }
  // The runtime describes every input, output and state tensor to the program with at most
  // kMaxRank dimensions (runtime/aot.h KilnAotTensor); NAME_create would refuse more.
  auto check_rank = [&](const std::string& what, const TensorType& t) {
    if (t.rank() > rt::aot::kMaxRank)
      throw Error(where + what + " is " + t.str() + ", of rank " + std::to_string(t.rank()) +
                  ": AOT objects take tensors of rank " + std::to_string(rt::aot::kMaxRank) +
                  " at most (the AOT runtime's limit); reshape it to fewer dimensions");
  };
  for (const GraphInput& gi : g.inputs())
    check_rank((gi.is_state ? "state '%" : "input '%") + g.value(gi.value).name + "'", g.type(gi.value));
  for (const GraphOutput& o : g.outputs()) check_rank("output '" + o.name + "'", g.type(o.value));
  // The output files' names, before any work: two naming one file, or a folder.
  if (std::string why; !rt::check_output_paths(output_paths(aot), why)) throw Error(why);
  return name;
}

AotResult write_checked(const Graph& g, const Prepared& prepared, const TensorMap& state, CompileOptions options,
                        const AotOptions& aot, const std::string& name) {
  options.profile = false;  // the object has no profiler to report to
  // The descriptor follows the prepared graph, the header `g`: the pipeline keeps the signature.
  const Graph& pg = prepared.graph;
  KILN_CHECK(pg.inputs().size() == g.inputs().size() && pg.outputs().size() == g.outputs().size(),
             "write_object: the pipeline changed the signature of @" + g.name());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    KILN_CHECK(pg.value(pg.inputs()[i].value).name == g.value(g.inputs()[i].value).name,
               "write_object: the pipeline reordered the inputs of @" + g.name());
  for (size_t i = 0; i < g.outputs().size(); ++i)
    KILN_CHECK(pg.outputs()[i].name == g.outputs()[i].name,
               "write_object: the pipeline reordered the outputs of @" + g.name());
  TensorMap initial;  // every state input, in full
  AotResult result;
  result.name = name;
  for (const GraphInput& gi : g.inputs()) {
    if (!gi.is_state) continue;
    const std::string& n = g.value(gi.value).name;
    Tensor t = state.find(n)->second.materialized();
    result.weights_bytes += static_cast<int64_t>(t.nbytes());
    initial.emplace(n, std::move(t));
  }
  AotModule module{name, aot.weights == WeightsMode::Embed ? &initial : nullptr};
  AotObject object = backend("cpu").write_object(prepared, options, module);
  result.target = object.target;
  result.arena_bytes = object.arena_bytes;

  // Every file's bytes first, then all of them written together (runtime/file_output.h):
  // all or nothing, never over a device, and never two of them to one file.
  std::string header, weights;
  const std::vector<std::string> paths = output_paths(aot);
  std::vector<rt::OutputBytes> files{{paths[0], object.bytes}};
  if (!aot.header.empty()) {
    header = aot_header(g, name, object.target, object.arena_bytes, aot.weights);
    files.emplace_back(paths[1], header);
  }
  if (aot.weights == WeightsMode::File) {
    weights = serialize_weights(initial);
    files.emplace_back(paths.back(), weights);
  }
  if (std::string why; !rt::write_files(files, false, why)) throw Error(why);
  for (const rt::OutputBytes& f : files) result.files.push_back(f.first);
  return result;
}

}  // namespace

AotResult write_object(const Graph& g, const TensorMap& state, const CompileOptions& options, const AotOptions& aot) {
  std::string name = check_request(g, state, options, aot);
  CompileOptions o = options;
  o.profile = false;
  return write_checked(g, *prepare(g, o), state, o, aot, name);
}

AotResult write_object(const Graph& g, const Prepared& prepared, const TensorMap& state, const CompileOptions& options,
                       const AotOptions& aot) {
  return write_checked(g, prepared, state, options, aot, check_request(g, state, options, aot));
}

}  // namespace kiln
