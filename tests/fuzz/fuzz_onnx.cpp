// Fuzz target: the ONNX importer (frontend/onnx_import.h) on arbitrary bytes, the protobuf
// parse, ONNX's checker and shape inference included. A kiln::Error is the expected answer
// to bad input; what imports must be a valid graph that prints and parses back the same,
// whose memory plan checks out.
//
// Models older than opset 6 are left out: the importer hands them to libonnx 1.12's version
// converter, whose adapters trust the model's shapes (Gemm_6_7 read past a rank-1 operand
// and asked for 52 GB, which ASan aborts on; a normal build catches the std::bad_alloc and
// reports a kiln::Error). The importer refuses what it can before converting (undefined
// values); the converter itself is not Kiln's to harden.
#include <onnx/onnx_pb.h>

#include <cstdint>

#include "frontend/onnx_import.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "tests/fuzz/fuzz_util.h"

using namespace kiln;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  onnx::ModelProto proto;
  if (proto.ParseFromArray(data, static_cast<int>(size)))
    for (const onnx::OperatorSetIdProto& o : proto.opset_import())
      if ((o.domain().empty() || o.domain() == "ai.onnx") && o.version() < 6) return 0;
  OnnxModel m;
  try {
    m = import_onnx_bytes(bytes, "fuzz.onnx");
  } catch (const Error&) {
    return 0;
  }
  verify(m.graph);
  for (const auto& [name, t] : m.state)
    if (!m.graph.find(name).valid() || !m.graph.is_state(m.graph.find(name)) ||
        m.graph.type(m.graph.find(name)) != t.type())
      fuzz::bug("state '" + name + "' does not match a state input of the graph");
  std::string text = print(m.graph);
  if (print(parse(text, "fuzz.kir")) != text) fuzz::bug("the imported graph does not print and parse back the same");
  // Every type is within kMaxElements, so the memory plan's sizes cannot wrap around (a
  // 2^62-element Tile once planned into an arena of 128 bytes); a plan past 2^62 bytes in
  // all is a kiln::Error.
  try {
    check_memory_plan(m.graph, plan_memory(m.graph, PassOptions{}));
  } catch (const Error&) {
  }
  return 0;
}
