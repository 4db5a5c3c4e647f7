// ONNX import (frontend/onnx_import.h): PyTorch-exported models run and train, the notes
// map back to ONNX nodes, and bad models give one clear error each. The per-op
// conformance on ONNX's own test data is tests/onnx/conformance.cpp (ctest onnx_conformance).
#include <onnx/onnx_pb.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstring>

#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/onnx_import.h"
#include "ir/interp.h"
#include "ir/npy.h"
#include "passes/train_step.h"
#include "run_step.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

const std::string kDir = std::string(KILN_TEST_DATA_DIR) + "/onnx/";

// A one-node model: y = OP(x) over f32 inputs of `shape`, at `opset`.
onnx::ModelProto one_node(const std::string& op, Shape shape = {2, 3}, int64_t opset = 13, int inputs = 1) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("g");
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(op);
  n->set_name("the_" + op);
  for (int i = 0; i < inputs; ++i) {
    std::string name = "x" + std::to_string(i);
    n->add_input(name);
    onnx::ValueInfoProto* in = g->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : shape) tt->mutable_shape()->add_dim()->set_dim_value(d);
  }
  n->add_output("y");
  onnx::ValueInfoProto* out = g->add_output();
  out->set_name("y");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (size_t d = 0; d < shape.size(); ++d) out->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim();
  return m;
}

std::string bytes(const onnx::ModelProto& m) {
  std::string s;
  m.SerializeToString(&s);
  return s;
}

std::string import_error(const std::string& b) {
  try {
    import_onnx_bytes(b, "m.onnx");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("onnx: PyTorch's MLP and LeNet import, run on both paths and match PyTorch", "[onnx]") {
  for (const char* name : {"mlp", "lenet"}) {
    CAPTURE(name);
    OnnxImportOptions opt;
    opt.batch = 4;
    OnnxModel m = import_onnx(kDir + name + ".onnx", opt);
    CHECK(m.opset == 13);
    CHECK(m.producer.starts_with("pytorch"));
    REQUIRE(m.outputs.size() == 1);
    REQUIRE(m.inputs.size() == 1);
    CHECK(m.inputs[0] == std::pair<std::string, std::string>{"x", "x"});
    // Every node maps back to its ONNX node.
    for (const Node& n : m.graph.nodes())
      if (n.op != Op::Constant) CHECK(n.note.starts_with("onnx "));
    // The float initializers are the state, with their values.
    size_t state = 0;
    for (const GraphInput& in : m.graph.inputs()) state += in.is_state;
    CHECK(state == m.state.size());
    CHECK(state == (std::string(name) == "mlp" ? 4 : 8));

    TensorMap args = m.state;
    args.emplace("x", read_npy(kDir + name + "_x.npy"));
    Tensor want = read_npy(kDir + name + "_logits.npy");
    Tensor interp = interpret(m.graph, args).at("logits");
    Tensor jit = compile(m.graph)->evaluate(args).at("logits");
    CHECK(all_close(interp, want, 1e-4, 1e-5));
    CHECK(all_close(jit, want, 1e-4, 1e-5));
  }
}

TEST_CASE("onnx: an imported LeNet trains 100 steps from PyTorch's weights, compiled as interpreted", "[onnx]") {
  OnnxImportOptions opt;
  opt.batch = 4;
  OnnxModel m = import_onnx(kDir + "lenet.onnx", opt);
  Graph model = with_classifier_loss(m.graph, "lenet.onnx");
  TrainStep step = make_train_step(model, SGD{0.05, 0.9});
  TensorMap state = m.state;
  for (auto& [k, v] : step.initial_state()) state.insert_or_assign(k, v);
  TensorMap interp_state = state;
  const TensorMap inputs{{"x", read_npy(kDir + "lenet_x.npy")}, {"y", read_npy(kDir + "lenet_y.npy")}};
  auto exe = compile(step.graph);
  double first = 0, last = 0;
  for (int i = 0; i < 100; ++i) {
    TensorMap out = testing::run_step(*exe, state, inputs);
    if (i < 3) {  // the compiled step follows the interpreter's
      TensorMap ref = interpret_step(step.graph, interp_state, inputs);
      CHECK(all_close(out.at("loss"), ref.at("loss"), 1e-4, 1e-6));
    }
    (i == 0 ? first : last) = out.at("loss").get(0);
  }
  CAPTURE(first, last);
  CHECK(last < 0.05 * first);  // four images, memorized
  // The trained weights moved away from PyTorch's.
  CHECK(!all_close(state.at("_0.weight"), m.state.at("_0.weight"), 0, 1e-4));
}

TEST_CASE("onnx: a bad file or model is one clear error", "[onnx]") {
  std::string good = bytes(one_node("Relu"));
  REQUIRE_NOTHROW(import_onnx_bytes(good, "m.onnx"));
  CHECK_THAT(import_error(good.substr(0, good.size() / 2)), ContainsSubstring("m.onnx: not an ONNX model"));
  CHECK_THAT(import_error("\x08\x07garbage\xff\xff"), ContainsSubstring("m.onnx: not an ONNX model"));
  CHECK_THAT(import_error(""), ContainsSubstring("has no graph"));

  onnx::ModelProto undefined = one_node("Relu");
  undefined.mutable_graph()->mutable_node(0)->set_input(0, "nowhere");
  CHECK_THAT(import_error(bytes(undefined)), ContainsSubstring("the ONNX checker rejects the model"));

  CHECK_THAT(import_error(bytes(one_node("Relu", {2, 3}, 18))),
             ContainsSubstring("opset 18 is newer than the ONNX library Kiln is built with knows"));

  onnx::ModelProto dynamic = one_node("Relu");
  auto* dim = dynamic.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1);
  dim->set_dim_param("width");
  CHECK_THAT(import_error(bytes(dynamic)), ContainsSubstring("dimension 1 is symbolic 'width'"));
  // A symbolic batch dimension takes the batch size.
  onnx::ModelProto batch = one_node("Relu");
  batch.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)
      ->set_dim_param("N");
  OnnxImportOptions opt;
  opt.batch = 7;
  CHECK(import_onnx_bytes(bytes(batch), "m.onnx", opt).graph.type(ValueId{0}).str() == "f32[7,3]");

  onnx::ModelProto bad_init = one_node("Add", {2, 3}, 13, 1);
  onnx::TensorProto* w = bad_init.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(3);
  w->add_float_data(1), w->add_float_data(2);
  bad_init.mutable_graph()->mutable_node(0)->add_input("w");
  CHECK_THAT(import_error(bytes(bad_init)), ContainsSubstring("initializer 'w' holds 2 values for shape [3]"));
  w->set_raw_data(std::string(5, '\0'));
  w->clear_float_data();
  CHECK_THAT(import_error(bytes(bad_init)), ContainsSubstring("initializer 'w' has 5 bytes of data for shape [3]"));
}

TEST_CASE("onnx: every unsupported op and attribute is listed in one error", "[onnx]") {
  onnx::ModelProto m = one_node("Relu");
  onnx::GraphProto* g = m.mutable_graph();
  g->mutable_output(0)->set_name("z");
  std::string prev = "y";
  // 50 unsupported nodes of three kinds, a LeakyRelu with an unknown attribute, a Pad mode.
  for (int i = 0; i < 50; ++i) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(i % 3 == 0 ? "Tan" : i % 3 == 1 ? "Sinh" : "Cosh");
    n->set_name("n" + std::to_string(i));
    n->add_input(prev);
    prev = "t" + std::to_string(i);
    n->add_output(prev);
  }
  onnx::NodeProto* lr = g->add_node();
  lr->set_op_type("LeakyRelu");
  lr->set_name("leaky");
  lr->add_input("y");
  lr->add_output("l");
  onnx::AttributeProto* a = lr->add_attribute();
  a->set_name("alpha");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(0.1f);
  onnx::NodeProto* cast = g->add_node();
  cast->set_op_type("Cast");
  cast->set_name("to_half");
  cast->add_input("l");
  cast->add_output("h");
  onnx::AttributeProto* to = cast->add_attribute();
  to->set_name("to");
  to->set_type(onnx::AttributeProto::INT);
  to->set_i(onnx::TensorProto::FLOAT16);
  onnx::NodeProto* add = g->add_node();
  add->set_op_type("Sum");
  add->add_input(prev);
  add->add_input("h");
  add->add_output("z");
  std::string e = import_error(bytes(m));
  CAPTURE(e);
  CHECK_THAT(e, ContainsSubstring("cannot import the model: 50 node(s) of 3 unsupported op type(s)"));
  CHECK_THAT(e, ContainsSubstring("unsupported op Tan x17 (first: 'n0', 'n3', 'n6')"));
  CHECK_THAT(e, ContainsSubstring("unsupported op Sinh x17 (first: 'n1', 'n4', 'n7')"));
  CHECK_THAT(e, ContainsSubstring("unsupported op Cosh x16 (first: 'n2', 'n5', 'n8')"));
  CHECK_THAT(e, ContainsSubstring("Cast 'to_half': casts to FLOAT16"));
  // Nodes downstream of an unsupported one are not reported again.
  CHECK(e.find("Sum") == std::string::npos);
}

TEST_CASE("onnx: values Kiln needs at import come from constants and shape arithmetic", "[onnx]") {
  // Reshape(x, Concat(Shape(x)[0], -1)): PyTorch's flatten, folded at import.
  onnx::ModelProto m = one_node("Shape", {2, 3, 4});
  onnx::GraphProto* g = m.mutable_graph();
  g->mutable_node(0)->set_output(0, "s");
  g->mutable_output(0)->set_name("y");
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()->RemoveLast();  // rank 2
  auto node = [&](const std::string& op, std::vector<std::string> ins, const std::string& out) {
    onnx::NodeProto* n = g->add_node();
    n->set_op_type(op);
    for (const std::string& i : ins) n->add_input(i);
    n->add_output(out);
    return n;
  };
  onnx::TensorProto* zero = g->add_initializer();
  zero->set_name("zero");
  zero->set_data_type(onnx::TensorProto::INT64);
  zero->add_int64_data(0);
  onnx::TensorProto* minus1 = g->add_initializer();
  minus1->set_name("minus1");
  minus1->set_data_type(onnx::TensorProto::INT64);
  minus1->add_dims(1);
  minus1->add_int64_data(-1);
  node("Gather", {"s", "zero"}, "n");
  onnx::NodeProto* u = node("Unsqueeze", {"n", "axes"}, "n1");
  (void)u;
  onnx::TensorProto* axes = g->add_initializer();
  axes->set_name("axes");
  axes->set_data_type(onnx::TensorProto::INT64);
  axes->add_dims(1);
  axes->add_int64_data(0);
  onnx::NodeProto* c = node("Concat", {"n1", "minus1"}, "shape");
  onnx::AttributeProto* ax = c->add_attribute();
  ax->set_name("axis");
  ax->set_type(onnx::AttributeProto::INT);
  ax->set_i(0);
  node("Reshape", {"x0", "shape"}, "y");
  OnnxModel r = import_onnx_bytes(bytes(m), "m.onnx");
  // One node left at run time: the reshape (everything else folded into its attribute).
  REQUIRE(r.graph.nodes().size() == 1);
  CHECK(r.graph.nodes()[0].op == Op::Reshape);
  CHECK(r.graph.type(r.graph.outputs()[0].value).str() == "f32[2,12]");
  // A model declaring another output rank than it computes: ONNX's shape inference, run
  // after the import as a check, disagrees with Kiln's, and says so.
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim();
  CHECK_THAT(import_error(bytes(m)), ContainsSubstring("Kiln imports output 'y' as f32[2,12] but ONNX's shape "
                                                       "inference gives it 3 dimensions"));
}

namespace {

void add_initializer(onnx::GraphProto* g, const std::string& name, Shape shape, const std::vector<float>& values) {
  onnx::TensorProto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : shape) t->add_dims(d);
  for (float v : values) t->add_float_data(v);
}

// x [4,3] -> BatchNormalization (initializers s, b, mean, var) -> Dropout(ratio 0.5) -> y.
onnx::ModelProto bn_dropout() {
  onnx::ModelProto m = one_node("BatchNormalization", {4, 3}, 15);
  onnx::GraphProto* g = m.mutable_graph();
  onnx::NodeProto* bn = g->mutable_node(0);
  bn->set_output(0, "h");
  for (const char* p : {"s", "b", "mean", "var"}) bn->add_input(p);
  add_initializer(g, "s", {3}, {1, 2, 0.5});
  add_initializer(g, "b", {3}, {0, 1, -1});
  add_initializer(g, "mean", {3}, {0.5, -1, 2});
  add_initializer(g, "var", {3}, {1, 4, 0.25});
  add_initializer(g, "ratio", {}, {0.5});
  onnx::NodeProto* d = g->add_node();
  d->set_op_type("Dropout");
  d->add_input("h");
  d->add_input("ratio");
  d->add_output("y");
  return m;
}

}  // namespace

TEST_CASE("onnx: imported for training, batch norm uses the batch and updates its running statistics; dropout draws",
          "[onnx]") {
  const std::string model = bytes(bn_dropout());
  const Tensor x = Tensor::from(DType::f32, {4, 3}, std::vector<float>{1, 2, 3, -1, 0, 5, 2, 2, 4, 0, -4, 0});

  // Inference: running statistics, dropout the identity.
  OnnxModel inf = import_onnx_bytes(model, "m.onnx");
  REQUIRE(inf.graph.outputs().size() == 1);
  TensorMap args = inf.state;
  args.emplace("x0", x);
  Tensor y = interpret(inf.graph, args).at("y");
  CHECK(std::abs(y.get(0) - (1 - 0.5) / std::sqrt(1 + 1e-5)) < 1e-6);  // (x - mean) / sqrt(var + eps) * s + b

  OnnxImportOptions opt;
  opt.training = true;
  opt.dropout_seed = 7;
  OnnxModel tr = import_onnx_bytes(model, "m.onnx", opt);
  std::vector<std::string> outs;
  for (const GraphOutput& o : tr.graph.outputs()) outs.push_back(o.name);
  CHECK(outs == std::vector<std::string>{"y", "mean.next", "var.next", "dropout.counter.next"});
  CHECK(tr.state.at("dropout.seed").get_int(0) == 7);
  CHECK(tr.state.at("dropout.counter").get_int(0) == 0);
  TensorMap targs = tr.state;
  targs.emplace("x0", x);
  TensorMap ref = interpret(tr.graph, targs);
  // Channel 0 holds 1, -1, 2, 0: batch mean 0.5, biased variance 1.25; ONNX's update is
  // running * 0.9 + batch * 0.1.
  CHECK(std::abs(ref.at("mean.next").get(0) - (0.5 * 0.9 + 0.5 * 0.1)) < 1e-6);
  CHECK(std::abs(ref.at("var.next").get(0) - (1 * 0.9 + 1.25 * 0.1)) < 1e-6);
  CHECK(ref.at("dropout.counter.next").get_int(0) == 1);
  // Each y is 0 or the batch-normalized value doubled (ratio 0.5).
  int dropped = 0;
  for (int64_t i = 0; i < 12; i += 3) {
    double want = 2 * (x.get(i) - 0.5) / std::sqrt(1.25 + 1e-5);
    double got = ref.at("y").get(i);
    dropped += got == 0;
    CHECK((got == 0 || std::abs(got - want) < 1e-5));
  }
  // The compiled graph draws the same mask and computes the same values, bit for bit.
  auto exe = compile(tr.graph);
  TensorMap state = tr.state;
  TensorMap got = testing::run_step(*exe, state, {{"x0", x}});
  CHECK(all_close(got.at("y"), ref.at("y"), 0, 0));
  CHECK(state.at("dropout.counter").get_int(0) == 1);
  CHECK(all_close(state.at("mean"), ref.at("mean.next"), 0, 0));
  // The next step (counter 1) draws another mask over the same batch.
  TensorMap second = testing::run_step(*exe, state, {{"x0", x}});
  CHECK(!all_close(second.at("y"), got.at("y"), 0, 0));
  (void)dropped;
}

TEST_CASE("onnx: running statistics merged with another initializer get state of their own", "[onnx]") {
  // PyTorch exports a fresh batch norm's running mean (zeros) as an Identity of its bias
  // (zeros too): training must update a statistic of its own and keep training the bias.
  onnx::ModelProto m = bn_dropout();
  onnx::GraphProto* g = m.mutable_graph();
  g->mutable_node(0)->set_input(3, "mean_alias");
  onnx::NodeProto* id = g->add_node();
  id->set_op_type("Identity");
  id->add_input("b");
  id->add_output("mean_alias");
  g->mutable_node()->SwapElements(0, 2);  // the Identity first
  g->mutable_node()->SwapElements(1, 2);
  g->mutable_node(1)->set_name("bn1");
  for (bool training : {false, true}) {
    OnnxImportOptions opt;
    opt.training = training;
    OnnxModel r = import_onnx_bytes(bytes(m), "m.onnx", opt);
    CAPTURE(training);
    REQUIRE(r.state.count("bn1.running_mean") == 1);
    CHECK(all_close(r.state.at("bn1.running_mean"), r.state.at("b"), 0, 0));  // starts at b's values
    CHECK(r.graph.find_output("bn1.running_mean.next").valid() == training);
    CHECK(!r.graph.find_output("b.next").valid());
    CHECK(r.graph.find_output("var.next").valid() == training);  // var is read once: updated in place
  }
}

// --- numbers that must match ONNX's (found by the differential fuzzer, tests/onnx_diff) ----

namespace {

onnx::AttributeProto* attr(onnx::NodeProto* n, const std::string& name, onnx::AttributeProto::AttributeType t) {
  onnx::AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(t);
  return a;
}

void add_initializer(onnx::ModelProto& m, const std::string& name, const Tensor& v, int input_slot) {
  onnx::TensorProto* t = m.mutable_graph()->add_initializer();
  t->set_name(name);
  for (int64_t d : v.shape()) t->add_dims(d);
  if (v.dtype() == DType::i64) {
    t->set_data_type(onnx::TensorProto::INT64);
    for (int64_t i = 0; i < v.numel(); ++i) t->add_int64_data(v.get_int(i));
  } else {
    t->set_data_type(v.dtype() == DType::f64 ? onnx::TensorProto::DOUBLE : onnx::TensorProto::FLOAT);
    for (int64_t i = 0; i < v.numel(); ++i) {
      if (v.dtype() == DType::f64) t->add_double_data(v.get(i));
      else t->add_float_data(static_cast<float>(v.get(i)));
    }
  }
  onnx::NodeProto* n = m.mutable_graph()->mutable_node(0);
  while (n->input_size() <= input_slot) n->add_input("");
  n->set_input(input_slot, name);
}

// The model's output 'y' for input x0 = x, from the interpreter and from the compiled code
// (x given at run time, so that the compiled code computes it, not the importer).
std::pair<Tensor, Tensor> run_model(const onnx::ModelProto& m, const Tensor& x) {
  OnnxModel om = import_onnx_bytes(bytes(m), "m.onnx");
  TensorMap args = om.state;
  args.emplace(om.inputs.at(0).second, x);
  const std::string y = om.outputs.at(0).second;
  return {interpret(om.graph, args).at(y), compile(om.graph)->evaluate(args).at(y)};
}

// Both paths give `want` (NaN matches NaN, infinities exactly), within a relative 1e-6.
void check_both(const onnx::ModelProto& m, const Tensor& x, const std::vector<double>& want) {
  auto [interp, jit] = run_model(m, x);
  for (const Tensor* t : {&interp, &jit}) {
    REQUIRE(t->numel() == static_cast<int64_t>(want.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      double g = t->get(static_cast<int64_t>(i)), w = want[i];
      CAPTURE(t == &interp ? "interpreter" : "compiled", i, g, w);
      if (std::isnan(w)) CHECK(std::isnan(g));
      else if (!std::isfinite(w) || w == 0) CHECK(g == w);
      else CHECK(std::fabs(g - w) <= 1e-6 * std::fabs(w));
    }
  }
}

void set_shape(onnx::ValueInfoProto* v, const Shape& s) {
  auto* shape = v->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->clear_dim();
  for (int64_t d : s) shape->add_dim()->set_dim_value(d);
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

TEST_CASE("onnx: ReduceLogSumExp is shifted by the maximum, and rows of infinities are the formula's", "[onnx]") {
  onnx::ModelProto m = one_node("ReduceLogSumExp", {7, 2});
  onnx::AttributeProto* axes = attr(m.mutable_graph()->mutable_node(0), "axes", onnx::AttributeProto::INTS);
  axes->add_ints(1);
  attr(m.mutable_graph()->mutable_node(0), "keepdims", onnx::AttributeProto::INT)->set_i(0);
  set_shape(m.mutable_graph()->mutable_output(0), {7});
  Tensor x = Tensor::from(DType::f32, {7, 2},
                          std::vector<double>{100, 0, -200, -200, -kInf, -kInf, kInf, 1, kInf, -kInf, kNaN, 1, -kInf, 3});
  // log(e^100 + 1) = 100; log(2 e^-200) = -200 + log 2; all -inf: -inf; any +inf: +inf.
  check_both(m, x, {100, -199.30685281944005, -kInf, kInf, kInf, kNaN, 3});
}

TEST_CASE("onnx: Softplus keeps its precision for very negative inputs", "[onnx]") {
  onnx::ModelProto m = one_node("Softplus", {6});
  set_shape(m.mutable_graph()->mutable_output(0), {6});
  Tensor x = Tensor::from(DType::f32, {6}, std::vector<double>{-20, -80, 0, 30, -kInf, kInf});
  // log(1 + e^x): e^x itself where it is tiny (Log(Softplus(-20)) is -20, not log 0).
  check_both(m, x, {2.0611536900435727e-09, 1.8048513878454153e-35, 0.6931471805599453, 30, 0, kInf});
}

TEST_CASE("onnx: Elu's negative side keeps its precision for tiny inputs", "[onnx]") {
  onnx::ModelProto m = one_node("Elu", {5});
  attr(m.mutable_graph()->mutable_node(0), "alpha", onnx::AttributeProto::FLOAT)->set_f(1.5f);
  set_shape(m.mutable_graph()->mutable_output(0), {5});
  Tensor x = Tensor::from(DType::f32, {5}, std::vector<double>{-1e-30, -1e-10, -1, 2, -kInf});
  // 1.5 expm1(x): 1.5 x for tiny x (exp(x) - 1 is 0 there).
  check_both(m, x, {-1.5e-30, -1.5e-10, -0.9481808382428367, 2, -1.5});
}

TEST_CASE("onnx: ReduceSum with noop_with_empty_axes and axes given reduces them", "[onnx]") {
  onnx::ModelProto m = one_node("ReduceSum", {3, 4}, 13);
  attr(m.mutable_graph()->mutable_node(0), "noop_with_empty_axes", onnx::AttributeProto::INT)->set_i(1);
  attr(m.mutable_graph()->mutable_node(0), "keepdims", onnx::AttributeProto::INT)->set_i(0);
  set_shape(m.mutable_graph()->mutable_output(0), {3});
  onnx::ModelProto empty = m;
  add_initializer(m, "axes", Tensor::from(DType::i64, {1}, std::vector<double>{1}), 1);
  Tensor x = Tensor::from(DType::f32, {3, 4}, std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  check_both(m, x, {6, 22, 38});
  // Empty axes with the attribute: the input as it is.
  set_shape(empty.mutable_graph()->mutable_output(0), {3, 4});
  check_both(empty, x, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
}

TEST_CASE("onnx: Sign of NaN is NaN", "[onnx]") {
  onnx::ModelProto m = one_node("Sign", {7});
  set_shape(m.mutable_graph()->mutable_output(0), {7});
  check_both(m, Tensor::from(DType::f32, {7}, std::vector<double>{kNaN, -0.0, 0, 3, -2, kInf, -kInf}),
             {kNaN, 0, 0, 1, -1, 1, -1});
}

TEST_CASE("onnx: Clip's omitted bounds are the type's lowest and max, not infinities", "[onnx]") {
  const double flt_max = std::numeric_limits<float>::max(), dbl_max = std::numeric_limits<double>::max();
  const std::vector<double> xs{kInf, -kInf, kNaN, -5, 5};
  SECTION("opset 13, min given, f32") {
    onnx::ModelProto m = one_node("Clip", {5}, 13);
    add_initializer(m, "lo", Tensor::from(DType::f32, {}, std::vector<double>{-1}), 1);
    check_both(m, Tensor::from(DType::f32, {5}, xs), {flt_max, -1, kNaN, -1, 5});
  }
  SECTION("opset 11, no bounds, f64") {
    onnx::ModelProto m = one_node("Clip", {5}, 11);
    m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::DOUBLE);
    m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::DOUBLE);
    check_both(m, Tensor::from(DType::f64, {5}, xs), {dbl_max, -dbl_max, kNaN, -5, 5});
  }
  SECTION("opset 9: the attributes' defaults, ±3.40282347e38") {
    onnx::ModelProto m = one_node("Clip", {5}, 9);
    attr(m.mutable_graph()->mutable_node(0), "max", onnx::AttributeProto::FLOAT)->set_f(2);
    check_both(m, Tensor::from(DType::f32, {5}, xs), {2, -flt_max, kNaN, -5, 2});
  }
}

TEST_CASE("onnx: a model saved at a newer IR version than libonnx's checker knows imports", "[onnx]") {
  onnx::ModelProto m = one_node("Relu");
  for (int64_t v : {9, 10, 11, 14}) {
    CAPTURE(v);
    m.set_ir_version(v);  // what a current onnx package writes, whatever the opset
    CHECK_NOTHROW(import_onnx_bytes(bytes(m), "m.onnx"));
  }
  // What such a version adds that Kiln cannot read is still refused by name.
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(17);  // FLOAT8E4M3FN
  CHECK_THAT(import_error(bytes(m)), ContainsSubstring("graph input 'x0' has element type FLOAT8E4M3FN"));
}

// --- ops real exports need: elementwise rounding and trigonometry, Mod, GatherElements ------

namespace {

void set_elem_type(onnx::ModelProto& m, int32_t t) {
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(t);
  m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(t);
}

}  // namespace

TEST_CASE("onnx: Floor, Ceil, Round (ties to even), Sin and Cos", "[onnx]") {
  const std::vector<double> halves{2.5, -2.5, 0.5, -0.5, 1.7, kNaN};
  const std::vector<double> angles{0, 1, -2, 3.5, 100, kInf};
  struct Want {
    const char* op;
    const std::vector<double>& x;
    std::vector<double> y;
  };
  for (const Want& w : {Want{"Floor", halves, {2, -3, 0, -1, 1, kNaN}}, Want{"Ceil", halves, {3, -2, 1, -0.0, 2, kNaN}},
                        Want{"Round", halves, {2, -2, 0, -0.0, 2, kNaN}},
                        Want{"Sin", angles, {0, 0.8414709848078965, -0.9092974268256817, -0.35078322768961984,
                                             -0.5063656411097588, kNaN}},
                        Want{"Cos", angles, {1, 0.5403023058681398, -0.4161468365471424, -0.9364566872907963,
                                             0.8623188722876839, kNaN}}}) {
    CAPTURE(w.op);
    onnx::ModelProto m = one_node(w.op, {6});
    set_shape(m.mutable_graph()->mutable_output(0), {6});
    check_both(m, Tensor::from(DType::f32, {6}, w.x), w.y);
  }
}

TEST_CASE("onnx: Mod takes the divisor's sign with fmod=0 and the dividend's with fmod=1", "[onnx]") {
  SECTION("integers, fmod=0 (Python's %) and fmod=1 (C's %), zero divisors give 0") {
    for (int64_t f : {0, 1}) {
      CAPTURE(f);
      onnx::ModelProto m = one_node("Mod", {6});
      set_elem_type(m, onnx::TensorProto::INT64);
      attr(m.mutable_graph()->mutable_node(0), "fmod", onnx::AttributeProto::INT)->set_i(f);
      add_initializer(m, "b", Tensor::from(DType::i64, {6}, std::vector<double>{3, 3, -3, -3, 0, 2}), 1);
      Tensor a = Tensor::from(DType::i64, {6}, std::vector<double>{7, -7, 7, -7, 5, 0});
      check_both(m, a, f ? std::vector<double>{1, -1, 1, -1, 0, 0} : std::vector<double>{1, 2, -2, -1, 0, 0});
    }
  }
  SECTION("floats, fmod=1: exact, whatever the quotient's size") {
    onnx::ModelProto m = one_node("Mod", {6});
    attr(m.mutable_graph()->mutable_node(0), "fmod", onnx::AttributeProto::INT)->set_i(1);
    add_initializer(m, "b", Tensor::from(DType::f32, {6}, std::vector<double>{2, 2, -2, 0.75, 1, 1}), 1);
    // 1e10 = 0.75 * 13333333333 + 0.25: a - trunc(a / b) * b in float would not give 0.25.
    Tensor a = Tensor::from(DType::f32, {6}, std::vector<double>{5.5, -5.5, 5.5, 1e10, -0.0, kInf});
    check_both(m, a, {1.5, -1.5, 1.5, 0.25, -0.0, kNaN});
  }
  SECTION("floats, fmod=0: the divisor's sign, as NumPy's mod") {
    onnx::ModelProto m = one_node("Mod", {3});
    add_initializer(m, "b", Tensor::from(DType::f32, {3}, std::vector<double>{2, -2, kInf}), 1);
    check_both(m, Tensor::from(DType::f32, {3}, std::vector<double>{-5.5, 5.5, -5}), {0.5, -0.5, kInf});
  }
}

namespace {

// OP(data, x0): i64 indices x0 (given at run time) into a float data initializer.
onnx::ModelProto indexing(const std::string& op, const Shape& idx_shape, const Tensor& data, const char* attr_name,
                          int64_t attr_value) {
  onnx::ModelProto m = one_node(op, idx_shape);
  set_elem_type(m, onnx::TensorProto::INT64);
  m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  attr(m.mutable_graph()->mutable_node(0), attr_name, onnx::AttributeProto::INT)->set_i(attr_value);
  add_initializer(m, "data", data, 0);
  m.mutable_graph()->mutable_node(0)->add_input("x0");
  return m;
}

}  // namespace

TEST_CASE("onnx: GatherElements picks along one axis, at run time and folded at import", "[onnx]") {
  auto model = [](const Shape& idx_shape, const Tensor& data, int64_t axis) {
    return indexing("GatherElements", idx_shape, data, "axis", axis);
  };
  SECTION("ONNX's example, negative indices, and out-of-range ones at run time read 0") {
    onnx::ModelProto m = model({2, 2}, Tensor::from(DType::f32, {2, 2}, std::vector<double>{1, 2, 3, 4}), 1);
    check_both(m, Tensor::from(DType::i64, {2, 2}, std::vector<double>{0, 0, 1, 0}), {1, 1, 4, 3});
    check_both(m, Tensor::from(DType::i64, {2, 2}, std::vector<double>{-1, 0, 1, -2}), {2, 1, 4, 3});
    check_both(m, Tensor::from(DType::i64, {2, 2}, std::vector<double>{2, 0, -3, 1}), {0, 1, 0, 4});
  }
  SECTION("axis 0 of a rank-3 input, indices smaller than the input along the other axes") {
    Tensor data(DType::f32, {3, 2, 2});
    for (int64_t i = 0; i < 12; ++i) data.set(i, static_cast<double>(i));
    onnx::ModelProto m = model({2, 1, 2}, data, 0);
    check_both(m, Tensor::from(DType::i64, {2, 1, 2}, std::vector<double>{2, 0, 1, 2}), {8, 1, 4, 9});
  }
  SECTION("indices and data known at import: folded to a constant, checked") {
    onnx::ModelProto m = model({2, 2}, Tensor::from(DType::f32, {2, 2}, std::vector<double>{1, 2, 3, 4}), 1);
    onnx::ModelProto bad = m;
    add_initializer(m, "idx", Tensor::from(DType::i64, {2, 2}, std::vector<double>{1, 0, -1, 0}), 1);
    OnnxImportOptions opt;
    opt.constant_weights = true;
    OnnxModel om = import_onnx_bytes(bytes(m), "m.onnx", opt);
    for (const Node& n : om.graph.nodes()) CHECK(n.op == Op::Constant);
    // x0, the graph input the indices were, is still an input (read by nothing).
    Tensor y = interpret(om.graph, {{"x0", Tensor(DType::i64, {2, 2})}}).at(om.outputs.at(0).second);
    CHECK(y.shape() == Shape{2, 2});
    for (int64_t i = 0; i < 4; ++i) CHECK(y.get(i) == std::vector<double>{2, 1, 4, 3}[i]);
    add_initializer(bad, "idx", Tensor::from(DType::i64, {2, 2}, std::vector<double>{0, 2, 0, 0}), 1);
    CHECK_THAT(import_error(bytes(bad)), ContainsSubstring("index 2 is out of range for axis 1 of f32[2,2]"));
  }
}

// --- importer attributes: ReduceProd, select_last_index, negative steps, partial windows ---

namespace {

void ints_attr(onnx::ModelProto& m, const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto* a = attr(m.mutable_graph()->mutable_node(0), name, onnx::AttributeProto::INTS);
  for (int64_t e : v) a->add_ints(e);
}

void int_attr(onnx::ModelProto& m, const std::string& name, int64_t v) {
  attr(m.mutable_graph()->mutable_node(0), name, onnx::AttributeProto::INT)->set_i(v);
}

Tensor iota_f32(const Shape& s, double from = 0) {
  Tensor t(DType::f32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, from + static_cast<double>(i));
  return t;
}

}  // namespace

TEST_CASE("onnx: ReduceProd multiplies, exact for zeros and negatives, odd lengths too", "[onnx]") {
  const Tensor x = Tensor::from(DType::f32, {3, 5}, std::vector<double>{1, 2, 3, 4, 5, -1, -1, -1, -1, -1, 0, -2, 3, 7, 9});
  SECTION("one axis, opset 13 (an attribute)") {
    onnx::ModelProto m = one_node("ReduceProd", {3, 5}, 13);
    ints_attr(m, "axes", {1});
    int_attr(m, "keepdims", 0);
    set_shape(m.mutable_graph()->mutable_output(0), {3});
    check_both(m, x, {120, -1, -0.0});
  }
  SECTION("axis 0 kept") {
    onnx::ModelProto m = one_node("ReduceProd", {3, 5}, 13);
    ints_attr(m, "axes", {0});
    check_both(m, x, {-0.0, 4, -9, -28, -45});
  }
  SECTION("all axes") {
    onnx::ModelProto m = one_node("ReduceProd", {3, 5}, 13);
    int_attr(m, "keepdims", 0);
    Tensor y = Tensor::from(DType::f32, {3, 5}, std::vector<double>{1, 2, 3, 4, 5, -1, -1, -1, -1, -1, 0.5, -2, 3, 1, 1});
    check_both(m, y, {360});
  }
}

TEST_CASE("onnx: ArgMax and ArgMin with select_last_index, ArgMin of integers", "[onnx]") {
  for (int64_t last : {0, 1}) {
    CAPTURE(last);
    onnx::ModelProto m = one_node("ArgMax", {2, 4});
    int_attr(m, "axis", 1);
    int_attr(m, "keepdims", 0);
    int_attr(m, "select_last_index", last);
    m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
    check_both(m, Tensor::from(DType::f32, {2, 4}, std::vector<double>{1, 3, 3, 2, 5, 5, 5, 5}),
               last ? std::vector<double>{2, 3} : std::vector<double>{1, 0});

    onnx::ModelProto mi = one_node("ArgMin", {2, 4});
    int_attr(mi, "axis", -1);
    int_attr(mi, "select_last_index", last);
    set_elem_type(mi, onnx::TensorProto::INT64);
    const double lowest = -9223372036854775808.0;  // -1 - x has no overflow there, -x would
    check_both(mi, Tensor::from(DType::i64, {2, 4}, std::vector<double>{3, -1, -1, 4, lowest, 0, lowest, 5}),
               last ? std::vector<double>{2, 2} : std::vector<double>{1, 0});
  }
}

TEST_CASE("onnx: Slice with negative steps", "[onnx]") {
  auto model = [](const Shape& s, std::vector<double> starts, std::vector<double> ends, std::vector<double> axes,
                  std::vector<double> steps) {
    onnx::ModelProto m = one_node("Slice", s);
    const int64_t n = static_cast<int64_t>(starts.size());
    add_initializer(m, "starts", Tensor::from(DType::i64, {n}, starts), 1);
    add_initializer(m, "ends", Tensor::from(DType::i64, {n}, ends), 2);
    add_initializer(m, "axes", Tensor::from(DType::i64, {n}, axes), 3);
    add_initializer(m, "steps", Tensor::from(DType::i64, {n}, steps), 4);
    return m;
  };
  const double int64_min = -9223372036854775808.0, int64_max = 9223372036854775807.0;
  // Reversed whole: from the last element to past the first (an end of INT64_MIN).
  check_both(model({10}, {-1}, {int64_min}, {0}, {-1}), iota_f32({10}), {9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  check_both(model({10}, {int64_max}, {1}, {0}, {-3}), iota_f32({10}), {9, 6, 3});
  check_both(model({10}, {8}, {8}, {0}, {-1}), iota_f32({10}), {});
  // A negative step on one axis and a positive one on the other.
  check_both(model({3, 4}, {2, 0}, {-4, 4}, {0, 1}, {-1, 2}), iota_f32({3, 4}), {8, 10, 4, 6, 0, 2});
  CHECK_THAT(import_error(bytes(model({10}, {0}, {5}, {0}, {0}))), ContainsSubstring("step 0 on axis 0"));
}

TEST_CASE("onnx: AveragePool's partial windows (ceil_mode) and pads with count_include_pad=0", "[onnx]") {
  // Reference values from ONNX's reference evaluator.
  auto model = [](const Shape& s, std::vector<int64_t> kernel, std::vector<int64_t> strides, std::vector<int64_t> pads,
                  int64_t ceil, int64_t include) {
    onnx::ModelProto m = one_node("AveragePool", s);
    ints_attr(m, "kernel_shape", kernel);
    ints_attr(m, "strides", strides);
    ints_attr(m, "pads", pads);
    int_attr(m, "ceil_mode", ceil);
    int_attr(m, "count_include_pad", include);
    return m;
  };
  SECTION("ceil_mode: the last window covers one column and row") {
    check_both(model({1, 1, 5, 5}, {2, 2}, {2, 2}, {0, 0, 0, 0}, 1, 0), iota_f32({1, 1, 5, 5}, 1),
               {4, 6, 7.5, 14, 16, 17.5, 21.5, 23.5, 25});
  }
  SECTION("asymmetric pads larger than half the window, padded cells not counted") {
    check_both(model({1, 1, 4, 4}, {3, 3}, {1, 1}, {2, 1, 0, 1}, 0, 0), iota_f32({1, 1, 4, 4}, 1),
               {1.5, 2, 3, 3.5, 3.5, 4, 5, 5.5, 5.5, 6, 7, 7.5, 9.5, 10, 11, 11.5});
  }
  SECTION("ceil_mode past the pads: the pads count with count_include_pad=1, what lies past them never") {
    check_both(model({1, 1, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, 1, 1), iota_f32({1, 1, 6, 6}, 1),
               {2, 4, 5.333333492279053, 3, 9, 15, 17, 9, 17, 27, 29, 15, 10.5, 16.5, 17.5, 9});
    check_both(model({1, 1, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, 1, 0), iota_f32({1, 1, 6, 6}, 1),
               {4.5, 6, 8, 9, 13.5, 15, 17, 18, 25.5, 27, 29, 30, 31.5, 33, 35, 36});
  }
}

TEST_CASE("onnx: GatherND, with batch dims, at run time and known at import", "[onnx]") {
  Tensor data = iota_f32({2, 3, 4});
  SECTION("two of three dims named, a negative index") {
    onnx::ModelProto m = indexing("GatherND", {2, 2}, data, "batch_dims", 0);
    check_both(m, Tensor::from(DType::i64, {2, 2}, std::vector<double>{1, -1, 0, 2}), {20, 21, 22, 23, 8, 9, 10, 11});
    // Out of range at run time: zeros, not a neighbouring slice.
    check_both(m, Tensor::from(DType::i64, {2, 2}, std::vector<double>{2, 0, 0, 3}), {0, 0, 0, 0, 0, 0, 0, 0});
  }
  SECTION("batch_dims=1") {
    onnx::ModelProto m = indexing("GatherND", {2, 2}, data, "batch_dims", 1);
    check_both(m, Tensor::from(DType::i64, {2, 2}, std::vector<double>{2, 1, 0, 3}), {9, 15});
  }
  SECTION("indices known at import") {
    onnx::ModelProto m = indexing("GatherND", {2, 2}, data, "batch_dims", 1);
    onnx::ModelProto bad = m;
    add_initializer(m, "idx", Tensor::from(DType::i64, {2, 2}, std::vector<double>{2, 1, 0, -1}), 1);
    OnnxImportOptions opt;
    opt.constant_weights = true;
    OnnxModel om = import_onnx_bytes(bytes(m), "m.onnx", opt);
    for (const Node& n : om.graph.nodes()) CHECK(n.op == Op::Constant);
    Tensor y = interpret(om.graph, {{"x0", Tensor(DType::i64, {2, 2})}}).at(om.outputs.at(0).second);
    CHECK(y.shape() == Shape{2});
    CHECK(y.get(0) == 9);
    CHECK(y.get(1) == 15);
    add_initializer(bad, "idx", Tensor::from(DType::i64, {2, 2}, std::vector<double>{0, 4, 0, 0}), 1);
    CHECK_THAT(import_error(bytes(bad)), ContainsSubstring("index 4 is out of range for axis 2 of f32[2,3,4]"));
  }
}

TEST_CASE("onnx: CumSum, exclusive and reverse, floats and integers", "[onnx]") {
  const Tensor x = Tensor::from(DType::f32, {2, 5}, std::vector<double>{1, 2, 3, 4, 5, -1, 0.5, 2, 8, -3});
  const std::vector<std::vector<double>> want = {{1, 3, 6, 10, 15, -1, -0.5, 1.5, 9.5, 6.5},
                                                 {15, 14, 12, 9, 5, 6.5, 7.5, 7, 5, -3},
                                                 {0, 1, 3, 6, 10, 0, -1, -0.5, 1.5, 9.5},
                                                 {14, 12, 9, 5, 0, 7.5, 7, 5, -3, 0}};
  for (int64_t exclusive : {0, 1})
    for (int64_t reverse : {0, 1}) {
      CAPTURE(exclusive, reverse);
      onnx::ModelProto m = one_node("CumSum", {2, 5});
      add_initializer(m, "axis", Tensor::from(DType::i64, {}, std::vector<double>{1}), 1);
      int_attr(m, "exclusive", exclusive);
      int_attr(m, "reverse", reverse);
      check_both(m, x, want[static_cast<size_t>(2 * exclusive + reverse)]);
    }
  onnx::ModelProto m = one_node("CumSum", {3, 4});
  set_elem_type(m, onnx::TensorProto::INT64);
  add_initializer(m, "axis", Tensor::from(DType::i64, {}, std::vector<double>{-2}), 1);
  Tensor xi(DType::i64, {3, 4});
  for (int64_t i = 0; i < 12; ++i) xi.set_int(i, i);
  check_both(m, xi, {0, 1, 2, 3, 4, 6, 8, 10, 12, 15, 18, 21});
}

TEST_CASE("onnx: Resize in nearest and linear modes, by scales and by sizes", "[onnx]") {
  // Reference values from ONNX's reference evaluator.
  auto model = [](const std::string& mode, const std::string& coords, const std::string& nearest,
                  std::vector<double> scales, std::vector<double> sizes) {
    onnx::ModelProto m = one_node("Resize", {1, 1, 2, 2});
    onnx::NodeProto* n = m.mutable_graph()->mutable_node(0);
    attr(n, "mode", onnx::AttributeProto::STRING)->set_s(mode);
    if (!coords.empty()) attr(n, "coordinate_transformation_mode", onnx::AttributeProto::STRING)->set_s(coords);
    if (!nearest.empty()) attr(n, "nearest_mode", onnx::AttributeProto::STRING)->set_s(nearest);
    add_initializer(m, "roi", Tensor(DType::f32, {0}), 1);
    if (!scales.empty()) add_initializer(m, "scales", Tensor::from(DType::f32, {4}, scales), 2);
    if (!sizes.empty()) add_initializer(m, "sizes", Tensor::from(DType::i64, {4}, sizes), 3);
    return m;
  };
  const Tensor x = iota_f32({1, 1, 2, 2}, 1);
  check_both(model("linear", "", "", {1, 1, 2, 2}, {}), x,
             {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4});
  check_both(model("nearest", "", "", {1, 1, 1.5, 1.5}, {}), x, {1, 1, 2, 1, 1, 2, 3, 3, 4});
  check_both(model("linear", "align_corners", "", {}, {1, 1, 3, 3}), x, {1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4});
  check_both(model("nearest", "asymmetric", "ceil", {}, {1, 1, 3, 1}), x, {1, 3, 3});
}

// GPT-2's tanh GELU has Pow(x, 3): a known exponent of 2 or 3 imports as x * x or
// x * x * x (ONNX Runtime's own computation, and loops that vectorize, not a libm call per
// element); other exponents, and exponents that are state, stay a pow.
TEST_CASE("onnx: Pow by a known 2 or 3 is x * x or x * x * x, other exponents a pow", "[onnx]") {
  const std::vector<double> xs{1.1, -2.7, 0.3, -0.0, 1e20, kInf, -kInf, kNaN};
  for (double p : {2.0, 3.0, 2.5}) {
    CAPTURE(p);
    onnx::ModelProto m = one_node("Pow", {8});
    set_shape(m.mutable_graph()->mutable_output(0), {8});
    onnx::GraphProto* g = m.mutable_graph();
    onnx::NodeProto* k = g->add_node();  // e = Constant(p), before the Pow
    k->set_op_type("Constant");
    k->add_output("e");
    onnx::TensorProto* t = attr(k, "value", onnx::AttributeProto::TENSOR)->mutable_t();
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(static_cast<float>(p));
    g->mutable_node()->SwapElements(0, 1);
    g->mutable_node(1)->add_input("e");
    OnnxModel om = import_onnx_bytes(bytes(m), "m.onnx");
    bool has_pow = false;
    for (const Node& n : om.graph.nodes()) has_pow = has_pow || n.op == Op::Pow;
    CHECK(has_pow == (p == 2.5));
    const Tensor x = Tensor::from(DType::f32, {8}, xs);
    auto [interp, jit] = run_model(m, x);
    for (int64_t i = 0; i < 8; ++i) {
      const float v = static_cast<float>(xs[static_cast<size_t>(i)]);
      const float want = p == 2 ? v * v : p == 3 ? (v * v) * v : std::pow(v, 2.5f);
      CAPTURE(i, v);
      for (const Tensor* t : {&interp, &jit}) {
        const float got = static_cast<float>(t->get(i));
        if (std::isnan(want)) CHECK(std::isnan(got));
        else if (p != 2.5 || !std::isfinite(want)) CHECK(std::memcmp(&got, &want, sizeof got) == 0);
        else CHECK(std::fabs(got - want) <= 1e-6f * std::fabs(want));
      }
    }
  }
  // An exponent that is state (a float initializer) may change: it stays a pow.
  onnx::ModelProto m = one_node("Pow", {8});
  add_initializer(m, "e", Tensor::scalar(DType::f32, 3), 1);
  const OnnxModel state_exponent = import_onnx_bytes(bytes(m), "m.onnx");
  bool has_pow = false;
  for (const Node& n : state_exponent.graph.nodes()) has_pow = has_pow || n.op == Op::Pow;
  CHECK(has_pow);
}
