// An installed Kiln's ONNX import: import_onnx MODEL.onnx imports the model, compiles it
// and runs it on zeros, printing the outputs' types.
#include <cstdio>

#include <kiln/codegen/executable.h>
#include <kiln/frontend/onnx_import.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: import_onnx MODEL.onnx\n");
    return 2;
  }
  try {
    kiln::OnnxModel m = kiln::import_onnx(argv[1]);
    auto exe = kiln::compile(m.graph);
    exe->set_state(m.state);
    kiln::TensorMap inputs;
    for (const auto& in : m.graph.inputs())
      if (!in.is_state) inputs.emplace(m.graph.value(in.value).name, kiln::Tensor(m.graph.type(in.value).dtype,
                                                                                  m.graph.type(in.value).shape));
    for (const auto& [name, value] : exe->run(inputs)) std::printf("%s: %s\n", name.c_str(), value.type().str().c_str());
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "import_onnx: %s\n", e.what());
    return 1;
  }
  return 0;
}
