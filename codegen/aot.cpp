// kiln::write_object (codegen/aot.h): the checks, the backend's object, and the files,
// written to temporary names and renamed only when all of them were written.
#include "codegen/aot.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <unistd.h>

#include "codegen/executable.h"
#include "ir/error.h"

namespace kiln {

namespace {

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
  return name;
}

// "dir/model.o" -> "dir/model.safetensors".
std::string weights_path(const std::string& object) {
  size_t slash = object.find_last_of('/');
  size_t dot = object.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return object + ".safetensors";
  return object.substr(0, dot) + ".safetensors";
}

// Files written under temporary names next to their final ones; commit() renames them all,
// the destructor removes whatever was not committed.
class PendingFiles {
 public:
  PendingFiles() = default;
  PendingFiles(const PendingFiles&) = delete;
  PendingFiles& operator=(const PendingFiles&) = delete;
  ~PendingFiles() {
    for (const auto& [tmp, path] : files_) std::remove(tmp.c_str());
  }
  void commit() {
    while (!files_.empty()) {
      const auto& [tmp, path] = files_.front();
      if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path);
      files_.erase(files_.begin());
    }
  }

  // Writes `bytes` to a new temporary name for `path`; returns that name.
  std::string write(const std::string& path, const std::string& bytes) {
    std::string tmp = temporary(path);
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) fail(path);
    bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    int err = errno;
    bool closed = std::fclose(f) == 0;
    if (!wrote) fail(path, err);
    if (!closed) fail(path);
    return tmp;
  }

 private:
  // A fresh name for `path`, in its folder; removed unless committed.
  std::string temporary(const std::string& path) {
    static std::atomic<uint64_t> counter{0};
    std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    files_.emplace_back(tmp, path);
    return tmp;
  }
  [[noreturn]] static void fail(const std::string& path, int err = errno) {
    throw Error("cannot write '" + path + "': " + std::strerror(err));
  }
  std::vector<std::pair<std::string, std::string>> files_;  // temporary, final
};

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

  PendingFiles files;
  files.write(aot.object, object.bytes);
  result.files.push_back(aot.object);
  if (!aot.header.empty()) {
    files.write(aot.header, aot_header(g, name, object.target, object.arena_bytes, aot.weights));
    result.files.push_back(aot.header);
  }
  if (aot.weights == WeightsMode::File) {
    std::string path = aot.weights_file.empty() ? weights_path(aot.object) : aot.weights_file;
    files.write(path, serialize_weights(initial));
    result.files.push_back(path);
  }
  files.commit();
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
