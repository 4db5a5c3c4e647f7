// Padding with non-finite values (docs/ir.md): a conv reads real zeros in its padding, so an
// infinite weight over it gives NaN (0 * inf), and a ConvTranspose scatters into the cells
// it keeps, so its padding adds nothing. The interpreter and the JIT give ONNX's reference
// values (onnx.reference.ReferenceEvaluator of onnx 1.23 on these models); the op-case
// tables (op_cases.h) check every backend against the interpreter on such values.
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include "codegen/executable.h"
#include "frontend/onnx_import.h"
#include "ir/interp.h"
#include "onnx_builder.h"

using namespace kiln;
using testing::OnnxBuilder;

namespace {

constexpr double kInf = INFINITY, kNaN = NAN;

// y = OP(x, w) with pads 1 on every side, x = 1, 2, 3, ... and w [1,1,3,3] all ones but an
// infinity at (0,0), on the interpreter and the JIT.
void check(const std::string& op, const Shape& x_shape, const std::vector<double>& want) {
  OnnxModel m = import_onnx_bytes(OnnxBuilder()
                                      .input("x", x_shape)
                                      .input("w", {1, 1, 3, 3})
                                      .node(op, {"x", "w"}, "y", {}, {{"pads", {1, 1, 1, 1}}})
                                      .output("y", 4)
                                      .bytes(),
                                  "m.onnx");
  Tensor x(DType::f32, x_shape), w(DType::f32, {1, 1, 3, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(i + 1));
  for (int64_t i = 0; i < w.numel(); ++i) w.set(i, i == 0 ? kInf : 1.0);
  const TensorMap in{{"x", x}, {"w", w}};
  Tensor expected = Tensor::from(DType::f32, {1, 1, x_shape[2], x_shape[3]}, want);
  Tensor interp = interpret(m.graph, in).at("y"), jit = compile(m.graph)->evaluate(in).at("y");
  CAPTURE(op);
  CHECK(all_close(interp, expected, 0, 0));
  CHECK(all_close(jit, expected, 0, 0));
}

}  // namespace

TEST_CASE("conv padding: an infinite weight over a conv's zero padding gives NaN, as ONNX", "[conv][numerics][onnx]") {
  // Output (0,0)'s window has the infinite tap over the padding: 0 * inf. Where that tap
  // reads a real cell the output is inf; the whole top row and left column read padding.
  check("Conv", {1, 1, 3, 3}, {kNaN, kNaN, kNaN, kNaN, kInf, kInf, kNaN, kInf, kInf});
}

TEST_CASE("conv padding: a ConvTranspose's padding crops, so an infinite weight gives no NaN, as ONNX",
          "[conv][numerics][onnx]") {
  check("ConvTranspose", {1, 1, 2, 2}, {kInf, 10, 10, 10});
  check("ConvTranspose", {1, 1, 3, 3}, {kInf, kInf, 16, kInf, kInf, 33, 24, 39, 28});
}
