// ONNX import of Einsum, ScatterElements, TopK and Expand/Where combinations: each checked
// on the interpreter and the compiled code, with its inputs given at run time (so the
// compiled code computes the op) and, where the op folds, known at import.
#include <onnx/onnx_pb.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <algorithm>
#include <functional>
#include <map>

#include "codegen/executable.h"
#include "frontend/onnx_import.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "passes/autodiff.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int32_t elem(DType t) {
  switch (t) {
    case DType::f32: return onnx::TensorProto::FLOAT;
    case DType::f64: return onnx::TensorProto::DOUBLE;
    case DType::i32: return onnx::TensorProto::INT32;
    case DType::i64: return onnx::TensorProto::INT64;
    case DType::boolean: return onnx::TensorProto::BOOL;
  }
  return 0;
}

// One ONNX node over graph inputs and initializers.
class Model {
 public:
  explicit Model(int64_t opset = 17) {
    m_.set_ir_version(8);
    m_.add_opset_import()->set_version(opset);
    m_.mutable_graph()->set_name("g");
  }
  Model& input(const std::string& name, const TensorType& t) {
    onnx::ValueInfoProto* in = m_.mutable_graph()->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem(t.dtype));
    for (int64_t d : t.shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
    return *this;
  }
  Model& init(const std::string& name, const Tensor& v) {
    onnx::TensorProto* t = m_.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(elem(v.dtype()));
    for (int64_t d : v.shape()) t->add_dims(d);
    for (int64_t i = 0; i < v.numel(); ++i) {
      switch (v.dtype()) {
        case DType::f32: t->add_float_data(static_cast<float>(v.get(i))); break;
        case DType::f64: t->add_double_data(v.get(i)); break;
        case DType::i32: case DType::boolean: t->add_int32_data(static_cast<int32_t>(v.get_int(i))); break;
        case DType::i64: t->add_int64_data(v.get_int(i)); break;
      }
    }
    return *this;
  }
  Model& node(const std::string& op, const std::vector<std::string>& in, const std::vector<std::string>& out) {
    onnx::NodeProto* n = m_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(op + std::to_string(m_.graph().node_size()));
    for (const std::string& i : in) n->add_input(i);
    for (const std::string& o : out) n->add_output(o);
    return *this;
  }
  Model& attr(const std::string& name, int64_t v) {
    onnx::AttributeProto* a = last()->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
    return *this;
  }
  Model& attr(const std::string& name, const std::string& v) {
    onnx::AttributeProto* a = last()->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
    return *this;
  }
  // A graph output of rank `rank`, its dimensions left to the importer.
  Model& output(const std::string& name, DType t, int64_t rank) {
    onnx::ValueInfoProto* o = m_.mutable_graph()->add_output();
    o->set_name(name);
    auto* tt = o->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem(t));
    auto* shape = tt->mutable_shape();
    for (int64_t d = 0; d < rank; ++d) shape->add_dim();
    return *this;
  }
  std::string bytes() const {
    std::string s;
    m_.SerializeToString(&s);
    return s;
  }

 private:
  onnx::NodeProto* last() { return m_.mutable_graph()->mutable_node(m_.graph().node_size() - 1); }
  onnx::ModelProto m_;
};

std::string import_error(const Model& m, const OnnxImportOptions& opt = {}) {
  try {
    import_onnx_bytes(m.bytes(), "m.onnx", opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Output `out` from the interpreter and the compiled code, with `inputs` (by ONNX name)
// given at run time; both must equal `want` exactly (NaN matches NaN) or within rtol.
void check(const Model& m, const std::map<std::string, Tensor>& inputs, size_t out, const Tensor& want,
           double rtol = 0, const OnnxImportOptions& opt = {}) {
  OnnxModel om = import_onnx_bytes(m.bytes(), "m.onnx", opt);
  TensorMap args = om.state;
  for (const auto& [onnx_name, kiln_name] : om.inputs) args.emplace(kiln_name, inputs.at(onnx_name));
  const std::string y = om.outputs.at(out).second;
  const Tensor interp = interpret(om.graph, args).at(y);
  const Tensor jit = compile(om.graph)->evaluate(args).at(y);
  for (const Tensor* t : {&interp, &jit}) {
    CAPTURE(t == &interp ? "interpreter" : "compiled");
    REQUIRE(t->dtype() == want.dtype());
    REQUIRE(t->shape() == want.shape());
    for (int64_t i = 0; i < want.numel(); ++i) {
      CAPTURE(i);
      if (!is_float(want.dtype())) {
        CHECK(t->get_int(i) == want.get_int(i));
        continue;
      }
      const double g = t->get(i), w = want.get(i);
      CAPTURE(g, w);
      if (std::isnan(w)) CHECK(std::isnan(g));
      else CHECK(std::fabs(g - w) <= rtol * std::fabs(w));
    }
  }
}

// The gradients of loss = sum(output 0 * w) with respect to the ONNX inputs `wrt`, w a
// constant of output 0's shape, by Kiln's autodiff of the imported graph (interpreted).
std::vector<Tensor> gradients(const Model& m, const std::map<std::string, Tensor>& inputs, const Tensor& w,
                              const std::vector<std::string>& wrt) {
  OnnxModel om = import_onnx_bytes(m.bytes(), "m.onnx");
  Graph g = om.graph;
  ValueId y = g.find_output(om.outputs.at(0).second);
  ValueId loss = g.add_node(Op::Sum, {g.add_node(Op::Mul, {y, g.add_constant(w)})}, {{"axes", std::vector<int64_t>{}}});
  g.add_output("loss", loss);
  TensorMap args = om.state;
  std::vector<std::string> names;
  for (const auto& [onnx_name, kiln_name] : om.inputs) {
    args.emplace(kiln_name, inputs.at(onnx_name));
    if (std::count(wrt.begin(), wrt.end(), onnx_name)) names.push_back(kiln_name);
  }
  REQUIRE(names.size() == wrt.size());
  TensorMap out = interpret(grad(g, "loss", names).graph, args);
  std::vector<Tensor> r;
  for (const std::string& n : names) r.push_back(out.at("grad." + n));
  return r;
}

void check_exact(const Tensor& got, const std::vector<double>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(got.get(static_cast<int64_t>(i)) == want[i]);
  }
}

Tensor f32(const Shape& s, const std::vector<double>& v) { return Tensor::from(DType::f32, s, v); }
Tensor i64(const Shape& s, const std::vector<int64_t>& v) { return Tensor::from(DType::i64, s, v); }
Tensor ramp(DType t, const Shape& s, double from, double step) {
  Tensor x(t, s);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, from + step * static_cast<double>(i));
  return x;
}

// --- Einsum's reference: every assignment of the labels, summed in f64 or i64 --------------

// Explicit equations of letters only ("ij,jk->ik").
Tensor einsum_reference(const std::string& eq, const std::vector<Tensor>& ops) {
  const size_t arrow = eq.find("->");
  std::vector<std::string> terms;
  for (size_t at = 0;;) {
    const size_t comma = eq.find(',', at);
    terms.push_back(eq.substr(at, std::min(comma, arrow) - at));
    if (comma == std::string::npos || comma > arrow) break;
    at = comma + 1;
  }
  const std::string out = eq.substr(arrow + 2);
  std::map<char, int64_t> size;
  for (size_t k = 0; k < terms.size(); ++k)
    for (size_t a = 0; a < terms[k].size(); ++a) size[terms[k][a]] = ops[k].shape()[a];
  std::vector<char> labels;
  for (auto [l, n] : size) labels.push_back(l);
  Shape os;
  for (char l : out) os.push_back(size.at(l));
  const DType dt = ops[0].dtype();
  Tensor y(dt, os);
  std::map<char, int64_t> at;
  std::function<void(size_t)> walk = [&](size_t li) {
    if (li < labels.size()) {
      for (int64_t v = 0; v < size.at(labels[li]); ++v) {
        at[labels[li]] = v;
        walk(li + 1);
      }
      return;
    }
    auto offset = [&](const std::string& term, const Shape& shape) {
      int64_t o = 0;
      for (size_t a = 0; a < term.size(); ++a) o = o * shape[a] + at.at(term[a]);
      return o;
    };
    const int64_t yo = offset(out, os);
    if (is_float(dt)) {
      double p = 1;
      for (size_t k = 0; k < ops.size(); ++k) p *= ops[k].get(offset(terms[k], ops[k].shape()));
      y.set(yo, y.get(yo) + p);
    } else {
      uint64_t p = 1;
      for (size_t k = 0; k < ops.size(); ++k) p *= static_cast<uint64_t>(ops[k].get_int(offset(terms[k], ops[k].shape())));
      y.set_int(yo, static_cast<int64_t>(static_cast<uint64_t>(y.get_int(yo)) + p));
    }
  };
  walk(0);
  return y;
}

Model einsum_model(const std::string& eq, const std::vector<Tensor>& ops, DType dt, int64_t rank = 2) {
  Model m;
  std::vector<std::string> names;
  for (size_t k = 0; k < ops.size(); ++k) {
    names.push_back("x" + std::to_string(k));
    m.input(names.back(), ops[k].type());
  }
  m.node("Einsum", names, {"y"}).attr("equation", eq).output("y", dt, rank);
  return m;
}

void check_einsum(const std::string& eq, const std::vector<Tensor>& ops, const std::string& explicit_eq = "") {
  CAPTURE(eq);
  std::map<std::string, Tensor> in;
  for (size_t k = 0; k < ops.size(); ++k) in.emplace("x" + std::to_string(k), ops[k]);
  const Tensor want = einsum_reference(explicit_eq.empty() ? eq : explicit_eq, ops);
  check(einsum_model(eq, ops, ops[0].dtype(), want.rank()), in, 0, want, is_float(ops[0].dtype()) ? 1e-5 : 0);
}

}  // namespace

TEST_CASE("onnx: Einsum's common patterns against a direct sum over every label", "[onnx][einsum]") {
  const Tensor a = ramp(DType::f32, {2, 3, 4}, -1, 0.25), b = ramp(DType::f32, {2, 4, 5}, 0.5, -0.125);
  const Tensor m34 = ramp(DType::f32, {3, 4}, -2, 0.5), m45 = ramp(DType::f32, {4, 5}, 1, 0.375);
  const Tensor v4 = ramp(DType::f32, {4}, 1, 1), w4 = ramp(DType::f32, {4}, -3, 0.5), v3 = ramp(DType::f32, {3}, 2, -1);
  check_einsum("bij,bjk->bik", {a, b});                   // batched matmul
  check_einsum("ij,jk->ik", {m34, m45});                  // matmul
  check_einsum("ij,jk", {m34, m45}, "ij,jk->ik");         // implicit output: the letters used once
  check_einsum("i,i", {v4, w4}, "i,i->");                 // inner product
  check_einsum("i,j->ij", {v3, v4});                      // outer product
  check_einsum("ij->ji", {m34});                          // transpose
  check_einsum("ij->i", {m34});                           // sum
  check_einsum("ijk->", {a});                             // sum of everything
  check_einsum("bij,bjk->kib", {a, b});                   // output in another order
  check_einsum("bij,bkj->bik", {a, ramp(DType::f32, {2, 5, 4}, 0, 0.1)});  // contracted last on both
  check_einsum("ij,jk,kl->il", {m34, m45, ramp(DType::f32, {5, 2}, -1, 0.3)});  // three operands
  check_einsum("ii->i", {ramp(DType::f32, {3, 3}, 0, 1)});  // diagonal
  check_einsum("ii", {ramp(DType::f32, {3, 3}, 0, 1)}, "ii->");  // trace
  check_einsum("bik,bjk->bij", {ramp(DType::f64, {2, 3, 4}, 1, 0.5), ramp(DType::f64, {2, 5, 4}, -1, 0.25)});
  check_einsum("ij,ij->ij", {m34, ramp(DType::f32, {3, 4}, 3, -0.5)});  // elementwise product
}

TEST_CASE("onnx: Einsum with ellipses: batch diagonals and broadcast batch dims", "[onnx][einsum]") {
  // ONNX's batch_diagonal: ...ii->...i over [3, 5, 5].
  const Tensor x = ramp(DType::f32, {3, 5, 5}, 0, 1);
  Tensor diag(DType::f32, {3, 5});
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t i = 0; i < 5; ++i) diag.set(b * 5 + i, x.get(b * 25 + i * 6));
  check(einsum_model("...ii->...i", {x}, DType::f32, 2), {{"x0", x}}, 0, diag);
  // ...ij,...jk->...ik with the batch dims [2, 1] against [3]: broadcast to [2, 3].
  const Tensor p = ramp(DType::f32, {2, 1, 2, 3}, -1, 0.5), q = ramp(DType::f32, {3, 3, 2}, 2, -0.25);
  Tensor want(DType::f32, {2, 3, 2, 2});
  for (int64_t b0 = 0; b0 < 2; ++b0)
    for (int64_t b1 = 0; b1 < 3; ++b1)
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t k = 0; k < 2; ++k) {
          double s = 0;
          for (int64_t j = 0; j < 3; ++j) s += p.get((b0 * 2 + i) * 3 + j) * q.get((b1 * 3 + j) * 2 + k);
          want.set(((b0 * 3 + b1) * 2 + i) * 2 + k, s);
        }
  check(einsum_model("...ij,...jk->...ik", {p, q}, DType::f32, 4), {{"x0", p}, {"x1", q}}, 0, want, 1e-6);
}

TEST_CASE("onnx: Einsum of integers is exact (no float matmul)", "[onnx][einsum]") {
  // Products near 2^60, which a double could not hold.
  Tensor a(DType::i64, {2, 3}), b(DType::i64, {3, 2});
  for (int64_t i = 0; i < 6; ++i) {
    a.set_int(i, (int64_t{1} << 40) + i);
    b.set_int(i, (int64_t{1} << 19) + 3 * i);
  }
  check_einsum("ij,jk->ik", {a, b});
  check_einsum("ij->j", {a});
}

TEST_CASE("onnx: Einsum's errors say what is wrong with the equation", "[onnx][einsum]") {
  const Tensor m34 = ramp(DType::f32, {3, 4}, 0, 1), m54 = ramp(DType::f32, {5, 4}, 0, 1);
  CHECK_THAT(import_error(einsum_model("ij,jk->ik", {m34, m54}, DType::f32)),
             ContainsSubstring("label 'j' has sizes 4 and 5"));
  CHECK_THAT(import_error(einsum_model("ijk->i", {m34}, DType::f32)),
             ContainsSubstring("operand 0 'ijk' has 3 labels for a tensor of rank 2"));
  CHECK_THAT(import_error(einsum_model("ij->iz", {m34}, DType::f32)),
             ContainsSubstring("output label 'z' is in no operand"));
  CHECK_THAT(import_error(einsum_model("i1->i", {m34}, DType::f32)), ContainsSubstring("'1' is not a label"));
  CHECK_THAT(import_error(einsum_model("ij,jk->ik", {m34}, DType::f32)),
             ContainsSubstring("names 2 operands; the node has 1"));
  CHECK_THAT(import_error(einsum_model("ij->ii", {m34}, DType::f32)), ContainsSubstring("output label 'i' is repeated"));
}

// --- ScatterElements -------------------------------------------------------------------------

namespace {

// ScatterElements(data, x_idx, updates) with data and updates as inputs (run time) or
// initializers.
Model scatter_model(const Tensor& data, const Shape& idx, const Tensor& upd, int64_t axis, const std::string& reduction,
                    int64_t opset = 17) {
  Model m(opset);
  m.input("data", data.type()).input("idx", {DType::i64, idx}).input("upd", upd.type());
  m.node("ScatterElements", {"data", "idx", "upd"}, {"y"}).attr("axis", axis);
  if (!reduction.empty()) m.attr("reduction", reduction);
  m.output("y", data.dtype(), data.rank());
  return m;
}

}  // namespace

TEST_CASE("onnx: ScatterElements writes updates along an axis, at run time", "[onnx][scatter]") {
  const Tensor data = ramp(DType::f32, {3, 3}, 0, 0);
  SECTION("ONNX's examples: axis 0, and axis 1 with a negative index") {
    const Tensor upd = f32({2, 3}, {1, 1.1, 1.2, 2, 2.1, 2.2});
    check(scatter_model(data, {2, 3}, upd, 0, ""), {{"data", data}, {"idx", i64({2, 3}, {1, 0, 2, 0, 2, 1})}, {"upd", upd}},
          0, f32({3, 3}, {2, 1.1, 0, 1, 0, 2.2, 0, 2.1, 1.2}));
    const Tensor row = f32({1, 5}, {1, 2, 3, 4, 5});
    check(scatter_model(row, {1, 2}, f32({1, 2}, {1.1, 2.1}), 1, ""),
          {{"data", row}, {"idx", i64({1, 2}, {1, -2})}, {"upd", f32({1, 2}, {1.1, 2.1})}}, 0,
          f32({1, 5}, {1, 1.1, 3, 2.1, 5}));
  }
  SECTION("reduction add sums repeated indices into data; out of range at run time writes nothing") {
    const Tensor row = f32({1, 5}, {1, 2, 3, 4, 5});
    const Tensor upd = f32({1, 3}, {1.5, 2.5, 10});
    check(scatter_model(row, {1, 3}, upd, 1, "add"), {{"data", row}, {"idx", i64({1, 3}, {1, 1, 7})}, {"upd", upd}}, 0,
          f32({1, 5}, {1, 6, 3, 4, 5}));
    check(scatter_model(row, {1, 3}, upd, 1, ""), {{"data", row}, {"idx", i64({1, 3}, {0, 4, -9})}, {"upd", upd}}, 0,
          f32({1, 5}, {1.5, 2, 3, 4, 2.5}));
  }
  SECTION("integers stay exact: 2^53 + 1 is written as itself") {
    const Tensor d = i64({2, 2}, {1, 2, 3, 4}), u = i64({2, 1}, {9007199254740993, -7});
    check(scatter_model(d, {2, 1}, u, 1, "none"), {{"data", d}, {"idx", i64({2, 1}, {1, 0})}, {"upd", u}}, 0,
          i64({2, 2}, {1, 9007199254740993, -7, 4}));
  }
}

TEST_CASE("onnx: ScatterElements known at import: folded, every reduction, duplicates keep the last", "[onnx][scatter]") {
  const Tensor data = f32({1, 4}, {1, 2, 3, 4}), upd = f32({1, 4}, {5, 0.5, -1, 7});
  const Tensor idx = i64({1, 4}, {2, 0, 2, -1});
  struct Want {
    const char* reduction;
    std::vector<double> y;
  };
  for (const Want& w : {Want{"none", {0.5, 2, -1, 7}}, Want{"add", {1.5, 2, 7, 11}}, Want{"mul", {0.5, 2, -15, 28}}}) {
    CAPTURE(w.reduction);
    Model m(17);
    m.input("x", {DType::f32, {1}}).init("data", data).init("idx", idx).init("upd", upd);
    m.node("ScatterElements", {"data", "idx", "upd"}, {"s"}).attr("axis", 1).attr("reduction", w.reduction);
    m.node("Add", {"s", "x"}, {"y"}).output("y", DType::f32, 2);
    OnnxImportOptions opt;
    opt.constant_weights = true;
    OnnxModel om = import_onnx_bytes(m.bytes(), "m.onnx", opt);
    for (const Node& n : om.graph.nodes()) CHECK((n.op == Op::Constant || n.op == Op::Add));
    check(m, {{"x", f32({1}, {0})}}, 0, f32({1, 4}, w.y), 0, opt);
  }
  // With the indices known and data at run time, repeated indices keep the last update too.
  Model m(17);
  m.input("data", data.type()).input("upd", upd.type()).init("idx", idx);
  m.node("ScatterElements", {"data", "idx", "upd"}, {"y"}).attr("axis", 1).output("y", DType::f32, 2);
  check(m, {{"data", data}, {"upd", upd}}, 0, f32({1, 4}, {0.5, 2, -1, 7}));
}

TEST_CASE("onnx: ScatterElements' errors and what is only scattered at import", "[onnx][scatter]") {
  const Tensor data = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Model bad_idx(17);
  bad_idx.input("data", data.type()).input("upd", {DType::f32, {1, 1}}).init("idx", i64({1, 1}, {3}));
  bad_idx.node("ScatterElements", {"data", "idx", "upd"}, {"y"}).attr("axis", 1).output("y", DType::f32, 2);
  CHECK_THAT(import_error(bad_idx), ContainsSubstring("index 3 is out of range for axis 1 of f32[2,3]"));
  CHECK_THAT(import_error(scatter_model(data, {1, 2}, f32({1, 3}, {1, 2, 3}), 0, "")),
             ContainsSubstring("updates f32[1,3] must have the indices' shape [1,2]"));
  CHECK_THAT(import_error(scatter_model(data, {2}, f32({2}, {1, 2}), 0, "")),
             ContainsSubstring("indices i64[2] must have the input's rank, 2"));
  CHECK_THAT(import_error(scatter_model(data, {1, 1}, f32({1, 1}, {1}), 0, "sub")),
             ContainsSubstring("reduction 'sub' is not one of none, add, mul"));
  CHECK_THAT(import_error(scatter_model(data, {1, 1}, f32({1, 1}, {1}), 0, "mul")),
             ContainsSubstring("ScatterElements with reduction 'mul' of f32 data computed at run time"));
}

TEST_CASE("onnx: ScatterElements differentiates: data where not written, updates where written", "[onnx][scatter]") {
  const Tensor data = ramp(DType::f64, {2, 3}, 1, 1), upd = ramp(DType::f64, {2, 2}, 10, 10);
  const Tensor w = ramp(DType::f64, {2, 3}, 1, 1);  // d loss / d y
  const Tensor idx = i64({2, 2}, {2, 0, -1, 1});      // flat positions 2, 0, 5, 4
  for (const char* reduction : {"none", "add"}) {
    CAPTURE(reduction);
    const bool add = std::string(reduction) == "add";
    std::vector<Tensor> g = gradients(scatter_model(data, {2, 2}, upd, 1, reduction),
                                      {{"data", data}, {"idx", idx}, {"upd", upd}}, w, {"data", "upd"});
    check_exact(g[0], add ? std::vector<double>{1, 2, 3, 4, 5, 6} : std::vector<double>{0, 2, 0, 4, 0, 0});
    check_exact(g[1], {3, 1, 6, 5});
  }
}

// --- TopK ------------------------------------------------------------------------------------

namespace {

Model top_k_model(const Shape& x, int64_t k, int64_t axis, int64_t largest, DType dt = DType::f32) {
  Model m(17);
  m.input("x", {dt, x}).init("K", i64({1}, {k}));
  m.node("TopK", {"x", "K"}, {"values", "indices"}).attr("axis", axis).attr("largest", largest);
  m.output("values", dt, static_cast<int64_t>(x.size())).output("indices", DType::i64, static_cast<int64_t>(x.size()));
  return m;
}

}  // namespace

TEST_CASE("onnx: TopK's values and indices, ties to the lower index, largest and smallest", "[onnx][topk]") {
  const Tensor x = f32({2, 5}, {3, 1, 3, kNaN, 2, 0, 0, -1, 5, 0});
  Model largest = top_k_model({2, 5}, 3, -1, 1);
  check(largest, {{"x", x}}, 0, f32({2, 3}, {kNaN, 3, 3, 5, 0, 0}));
  check(largest, {{"x", x}}, 1, i64({2, 3}, {3, 0, 2, 3, 0, 1}));
  Model smallest = top_k_model({2, 5}, 2, 1, 0);
  check(smallest, {{"x", x}}, 0, f32({2, 2}, {1, 2, -1, 0}));
  check(smallest, {{"x", x}}, 1, i64({2, 2}, {1, 4, 2, 0}));
  // Axis 0 of integers; k = 0 is empty.
  const Tensor xi = i64({3, 2}, {4, -1, 7, -1, 4, 9});
  check(top_k_model({3, 2}, 2, 0, 1, DType::i64), {{"x", xi}}, 0, i64({2, 2}, {7, 9, 4, -1}));
  check(top_k_model({3, 2}, 2, 0, 1, DType::i64), {{"x", xi}}, 1, i64({2, 2}, {1, 2, 0, 0}));
  check(top_k_model({3, 2}, 0, 0, 1, DType::i64), {{"x", xi}}, 1, Tensor(DType::i64, {0, 2}));
}

TEST_CASE("onnx: TopK before opset 10 takes k as an attribute; K out of range is an error", "[onnx][topk]") {
  Model m(9);
  m.input("x", {DType::f32, {4}});
  m.node("TopK", {"x"}, {"values", "indices"}).attr("k", 2);
  m.output("values", DType::f32, 1).output("indices", DType::i64, 1);
  check(m, {{"x", f32({4}, {1, 4, 2, 4})}}, 1, i64({2}, {1, 3}));
  CHECK_THAT(import_error(top_k_model({2, 5}, 6, 1, 1)), ContainsSubstring("K = 6 is not in 0..5, the size of axis 1 of f32[2,5]"));
}

TEST_CASE("onnx: TopK's values pass their gradient to the positions selected", "[onnx][topk]") {
  const Tensor x = Tensor::from(DType::f64, {2, 4}, std::vector<double>{3, 1, 3, 2, 0, 8, -1, 9});
  const Tensor w = Tensor::from(DType::f64, {2, 2}, std::vector<double>{10, 20, 30, 40});
  std::vector<Tensor> g = gradients(top_k_model({2, 4}, 2, 1, 1, DType::f64), {{"x", x}}, w, {"x"});
  check_exact(g[0], {10, 0, 20, 0, 0, 40, 0, 30});
}

// --- Expand and Where together -----------------------------------------------------------------

TEST_CASE("onnx: Where broadcasts all three operands; Expand broadcasts both ways", "[onnx][expand]") {
  SECTION("Where: a [2,1] condition, a [1,3] and a scalar, floats and integers") {
    const Tensor cond = Tensor::from(DType::boolean, {2, 1}, std::vector<double>{1, 0});
    Model m;
    m.input("c", cond.type()).input("a", {DType::f32, {1, 3}}).init("b", f32({}, {-1}));
    m.node("Where", {"c", "a", "b"}, {"y"}).output("y", DType::f32, 2);
    check(m, {{"c", cond}, {"a", f32({1, 3}, {1, 2, 3})}}, 0, f32({2, 3}, {1, 2, 3, -1, -1, -1}));
    Model mi;
    mi.input("c", cond.type()).input("a", {DType::i64, {3}}).init("b", i64({2, 1}, {7, 9007199254740993}));
    mi.node("Where", {"c", "a", "b"}, {"y"}).output("y", DType::i64, 2);
    check(mi, {{"c", cond}, {"a", i64({3}, {1, 2, 3})}}, 0, i64({2, 3}, {1, 2, 3, 9007199254740993, 9007199254740993,
                                                                          9007199254740993}));
  }
  SECTION("Expand: to more dims, keeping the input's where the shape says 1, and to fewer") {
    Model m;
    m.input("x", {DType::f32, {3, 1}}).init("s", i64({3}, {2, 1, 4}));
    m.node("Expand", {"x", "s"}, {"y"}).output("y", DType::f32, 3);
    Tensor want(DType::f32, {2, 3, 4});
    for (int64_t i = 0; i < 24; ++i) want.set(i, static_cast<double>(i / 4 % 3));
    check(m, {{"x", f32({3, 1}, {0, 1, 2})}}, 0, want);
    Model fewer;
    fewer.input("x", {DType::f32, {2, 3}}).init("s", i64({1}, {1}));
    fewer.node("Expand", {"x", "s"}, {"y"}).output("y", DType::f32, 2);
    check(fewer, {{"x", ramp(DType::f32, {2, 3}, 0, 1)}}, 0, ramp(DType::f32, {2, 3}, 0, 1));
  }
  SECTION("Expand to a shape made by Where (PyTorch's expand(-1, n)), over a Where's result") {
    // shape = Where(s == -1, 1, s) with s = [-1, 4]; y = Expand(Where(x > 0, x, 0), shape).
    Model m;
    m.input("x", {DType::f32, {3, 1}}).init("s", i64({2}, {-1, 4})).init("m1", i64({}, {-1}));
    m.init("one", i64({}, {1})).init("zero", f32({}, {0}));
    m.node("Equal", {"s", "m1"}, {"is"}).node("Where", {"is", "one", "s"}, {"shape"});
    m.node("Greater", {"x", "zero"}, {"pos"}).node("Where", {"pos", "x", "zero"}, {"r"});
    m.node("Expand", {"r", "shape"}, {"y"}).output("y", DType::f32, 2);
    check(m, {{"x", f32({3, 1}, {-1, 2, 0.5})}}, 0, f32({3, 4}, {0, 0, 0, 0, 2, 2, 2, 2, 0.5, 0.5, 0.5, 0.5}));
  }
}
