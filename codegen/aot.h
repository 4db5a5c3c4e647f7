// Ahead-of-time compilation: a graph and its state -> an object file, a C header and
// (optionally) a weights file, linked by a C or C++ program against libkiln_runtime.a and
// OpenBLAS only (no LLVM, no Kiln compiler). docs/aot.md is the user's guide and the ABI.
//
//   kiln::AotOptions aot{.object = "mlp.o", .header = "mlp.h", .name = "mlp"};
//   kiln::write_object(step.graph, state, {.cpu = "haswell"}, aot);   // or:
//   exe->write_object(aot);  // an Executable's graph, options and current state
//
// The object is written from the same optimized LLVM module the JIT would run for the same
// CompileOptions (one lowering, one optimization): AOT results are bitwise those of the JIT.
// The module gets the per-model glue (a KilnAotModel descriptor, runtime/aot.h, and the
// NAME_* functions) after optimization, and is emitted for a target machine made from
// LLVM's registry: CompileOptions::cpu / features may name a CPU this machine lacks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/backend.h"
#include "ir/calling.h"

namespace kiln {

enum class WeightsMode {
  Embed,  // the initial state is read-only data in the object; NAME_create copies it
  File,   // written to AotOptions::weights; NAME_create starts at zero, NAME_load_weights reads it
};

struct AotOptions {
  std::string object{};   // the object file to write (required)
  std::string header{};   // the C header; empty: none
  // The C prefix of every symbol (NAME_create, ...): a C identifier, not a reserved one
  // (not starting with "__" or "_" + upper case). Empty: the graph's name.
  std::string name{};
  WeightsMode weights = WeightsMode::Embed;
  // WeightsMode::File: the weights file (safetensors) to write; empty: the object's path
  // with its extension replaced by ".safetensors" (model.o -> model.safetensors).
  std::string weights_file{};
};

// What was written, for messages and tests.
struct AotResult {
  std::string name;                // the C prefix used
  std::string target;              // the target line recorded in the header
  std::vector<std::string> files;  // object, header, weights file: the ones written
  int64_t arena_bytes = 0;
  int64_t weights_bytes = 0;       // the state's total size
};

// Compiles `g` ahead of time for the CPU (options.target must resolve to "cpu") with
// `state` as its initial state: every state input of `g`, with its exact type (missing or
// mistyped state is an error naming it; extra names are ignored). Throws kiln::Error, and
// leaves none of the files behind (each is written to a temporary name and renamed only
// when all succeeded), for: a graph that does not verify, an unknown CPU or feature, a name
// that is not a C identifier, an output path that cannot be written.
AotResult write_object(const Graph& g, const TensorMap& state, const CompileOptions& options, const AotOptions& aot);

// The same for a graph already prepared (Executable::write_object): `g` is the graph as
// given (its signature), `prepared` what compile() made of it with `options`.
AotResult write_object(const Graph& g, const Prepared& prepared, const TensorMap& state, const CompileOptions& options,
                       const AotOptions& aot);

// The C header for graph `g` (its signature: inputs, outputs, state; pure text, written by
// write_object). Exposed for tests.
std::string aot_header(const Graph& g, const std::string& name, const std::string& target,
                       int64_t arena_bytes, WeightsMode weights);

// Whether `name` can prefix the object's C symbols; "" if so, else why not.
std::string aot_name_error(const std::string& name);

// The weights file of runtime/aot.h (safetensors with Kiln's checksums, as a training
// checkpoint) from C++: every tensor of `tensors` (full, not splats), written atomically;
// its bytes (for a writer of several files); and read back, every tensor in it (a file of
// Kiln's, a checkpoint, Python's safetensors, or a deprecated KILNWTS1 file). kiln::Error
// naming the file and the problem (no such file, not safetensors, a checksum mismatch,
// truncated, an unsupported dtype).
void save_weights(const std::string& path, const TensorMap& tensors);
// The bytes save_weights writes, for a writer that puts them in a file of its own
// (write_object and `kiln import --weights` write all their outputs together).
std::string serialize_weights(const TensorMap& tensors);
TensorMap load_weights(const std::string& path);

}  // namespace kiln
