// Small ONNX models for tests, built with ONNX's protobuf classes: graph inputs (a symbolic
// leading dimension where asked), int64 and float initializers, nodes with int and int-list attributes.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/dtype.h"

namespace kiln::testing {

class OnnxBuilder {
 public:
  explicit OnnxBuilder(int64_t opset = 13) {
    m_.set_ir_version(8);
    m_.add_opset_import()->set_version(opset);
    m_.mutable_graph()->set_name("g");
  }

  // A float graph input; with `batch`, dimension 0 is the symbolic "N" (shape[0] ignored).
  OnnxBuilder& input(const std::string& name, const Shape& shape, bool batch = false) {
    onnx::ValueInfoProto* in = m_.mutable_graph()->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (size_t d = 0; d < shape.size(); ++d) {
      auto* dim = tt->mutable_shape()->add_dim();
      if (d == 0 && batch) dim->set_dim_param("N");
      else dim->set_dim_value(shape[d]);
    }
    return *this;
  }
  OnnxBuilder& ints(const std::string& name, const std::vector<int64_t>& values, bool scalar = false) {
    onnx::TensorProto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    if (!scalar) t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
    return *this;
  }
  OnnxBuilder& floats(const std::string& name, const Shape& shape, const std::vector<float>& values) {
    onnx::TensorProto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : shape) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
    return *this;
  }
  OnnxBuilder& node(const std::string& op, const std::vector<std::string>& in, const std::string& out,
                    const std::vector<std::pair<std::string, int64_t>>& attrs = {},
                    const std::vector<std::pair<std::string, std::vector<int64_t>>>& list_attrs = {}) {
    onnx::NodeProto* n = m_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(m_.graph().node_size()));
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
    for (const auto& [k, v] : attrs) {
      onnx::AttributeProto* a = n->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v);
    }
    for (const auto& [k, v] : list_attrs) {
      onnx::AttributeProto* a = n->add_attribute();
      a->set_name(k);
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t e : v) a->add_ints(e);
    }
    return *this;
  }
  // A float graph output of rank `rank`, its dimensions unknown.
  OnnxBuilder& output(const std::string& name, int rank) {
    onnx::ValueInfoProto* o = m_.mutable_graph()->add_output();
    o->set_name(name);
    auto* tt = o->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    auto* shape = tt->mutable_shape();
    for (int d = 0; d < rank; ++d) shape->add_dim();
    return *this;
  }
  std::string bytes() const {
    std::string s;
    m_.SerializeToString(&s);
    return s;
  }

 private:
  onnx::ModelProto m_;
};

}  // namespace kiln::testing
