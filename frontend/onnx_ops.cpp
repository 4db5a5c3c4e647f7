// ONNX import, the op table: one short function per ONNX op, building Kiln ops for it, in
// one file per op family (onnx_ops_elementwise, _reduce, _nn, _shape, _index,
// _einsum.cpp).
// Ops Kiln has no op for are compositions (LeakyRelu = select, BatchNormalization =
// arithmetic on [C,1,1]-shaped parameters, 1-D convolution = 2-D over a height of one).
// Values that ONNX computes at run time but Kiln needs as attributes (Reshape's shape,
// Slice's starts) must be known at import: constants, initializers of integer type, or
// shape arithmetic, which Ctx::node folds. docs/onnx.md lists what is supported.
#include "frontend/onnx_ops_internal.h"

namespace kiln::onnx_import {

const std::map<std::string, MapFn>& op_table() {
  static const OpTable table = [] {
    OpTable t;
    add_elementwise_ops(t);
    add_reduce_ops(t);
    add_nn_ops(t);
    add_shape_ops(t);
    add_index_ops(t);
    add_einsum_ops(t);
    return t;
  }();
  return table;
}

}  // namespace kiln::onnx_import
