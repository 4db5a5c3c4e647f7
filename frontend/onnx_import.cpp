// ONNX import, the driver: reads and checks the model with ONNX's own library, turns its
// inputs and initializers into graph inputs, state and constants, maps each node through
// the op table (frontend/onnx_ops.cpp), collects every problem and reports them at once.
#include "frontend/onnx_import.h"

#include <fmt/core.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <sstream>

#include "frontend/onnx_internal.h"
#include "ir/file_read.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "ir/timing.h"
#include "passes/rebatch.h"

namespace kiln {
namespace onnx_import {

// --- types and tensors -------------------------------------------------------------------

std::optional<DType> dtype_of(int32_t elem_type) {
  switch (elem_type) {
    case onnx::TensorProto::FLOAT: return DType::f32;
    case onnx::TensorProto::DOUBLE: return DType::f64;
    case onnx::TensorProto::INT32: return DType::i32;
    case onnx::TensorProto::INT64: return DType::i64;
    case onnx::TensorProto::BOOL: return DType::boolean;
    default: return std::nullopt;
  }
}

std::string elem_type_name(int32_t elem_type) {
  if (onnx::TensorProto::DataType_IsValid(elem_type))
    return onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(elem_type));
  // Added by IR versions after libonnx 1.12's (8): models of any IR version are read.
  static const char* const later[] = {"FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ",
                                      "UINT4", "INT4", "FLOAT4E2M1"};
  if (elem_type >= 17 && elem_type < 17 + static_cast<int32_t>(std::size(later))) return later[elem_type - 17];
  return std::to_string(elem_type) + " (unknown to Kiln)";
}

namespace {

// Copies n typed-field values into t, converting as set_int / set do (exact for integers).
template <typename Field>
void copy_field(Tensor& t, const Field& f) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_floating_point_v<typename Field::value_type>)
      t.set(i, static_cast<double>(f.Get(static_cast<int>(i))));
    else
      t.set_int(i, static_cast<int64_t>(f.Get(static_cast<int>(i))));
  }
}

}  // namespace

Tensor to_tensor(const onnx::TensorProto& p, const std::string& what) {
  std::optional<DType> dt = dtype_of(p.data_type());
  if (!dt)
    throw Unsupported(fmt::format("{} has element type {}; Kiln has float, double, int32, int64 and bool",
                                  what, elem_type_name(p.data_type())));
  // Initializers' external data is read by take_weights; anything else's (a Constant's
  // value, a tensor file) is not.
  if (p.data_location() == onnx::TensorProto::EXTERNAL)
    throw Error(fmt::format("{} keeps its data in an external file, which Kiln reads only for a model's "
                            "initializers; save it with its data inside",
                            what));
  if (p.has_segment()) throw Unsupported(what + " is a segment of a tensor");
  Shape shape;
  for (int64_t d : p.dims()) {
    if (d < 0) throw Error(fmt::format("{} has a negative dimension ({})", what, d));
    shape.push_back(d);
  }
  check_size(TensorType{*dt, shape}, what);
  const int64_t numel = num_elements(shape);
  const size_t esize = *dt == DType::boolean ? 1 : dtype_size(*dt);
  auto count_error = [&](int64_t got) {
    return Error(fmt::format("{} holds {} values for shape {} ({} elements)", what, got, shape_str(shape), numel));
  };
  if (p.has_raw_data()) {
    const std::string& raw = p.raw_data();
    if (raw.size() != static_cast<size_t>(numel) * esize)
      throw Error(fmt::format("{} has {} bytes of data for shape {} of {} ({} bytes)", what, raw.size(),
                              shape_str(shape), elem_type_name(p.data_type()), static_cast<size_t>(numel) * esize));
    Tensor t(*dt, shape);
    if (numel > 0) std::memcpy(t.raw(), raw.data(), raw.size());  // ONNX raw data is little-endian, as this host
    if (*dt == DType::boolean)
      for (int64_t i = 0; i < numel; ++i) t.raw()[i] = std::byte{t.raw()[i] != std::byte{0}};
    return t;
  }
  int64_t got = 0;
  switch (*dt) {
    case DType::f32: got = p.float_data_size(); break;
    case DType::f64: got = p.double_data_size(); break;
    case DType::i32: case DType::boolean: got = p.int32_data_size(); break;
    case DType::i64: got = p.int64_data_size(); break;
  }
  if (got != numel) throw count_error(got);
  Tensor t(*dt, shape);
  switch (*dt) {
    case DType::f32: copy_field(t, p.float_data()); break;
    case DType::f64: copy_field(t, p.double_data()); break;
    case DType::i32: copy_field(t, p.int32_data()); break;
    case DType::boolean:
      for (int64_t i = 0; i < numel; ++i) t.set_int(i, p.int32_data(static_cast<int>(i)) != 0);
      break;
    case DType::i64: copy_field(t, p.int64_data()); break;
  }
  return t;
}

int64_t norm_axis(int64_t a, int64_t rank) {
  if (a < -rank || a >= std::max<int64_t>(rank, 1) || (rank == 0 && a != 0 && a != -1))
    throw Unsupported(fmt::format("axis {} is out of range for rank {}", a, rank));
  return a < 0 ? a + rank : a;
}

// --- Ctx ---------------------------------------------------------------------------------

void Ctx::begin(const onnx::NodeProto& n, std::map<std::string, Val>* env) {
  node_ = &n;
  env_ = env;
  read_.clear();
}

int Ctx::num_inputs() const {
  int n = node_->input_size();
  while (n > 0 && node_->input(n - 1).empty()) --n;
  return n;
}

bool Ctx::has_input(int i) const { return i < node_->input_size() && !node_->input(i).empty(); }

Val Ctx::in(int i) const {
  if (!has_input(i)) throw Unsupported(fmt::format("input {} is missing", i));
  return env_->at(node_->input(i));
}

const TensorType& Ctx::type(int i) const {
  if (!has_input(i)) throw Unsupported(fmt::format("input {} is missing", i));
  return env_->at(node_->input(i)).type;
}

const Tensor& Ctx::in_const(int i, const char* what) const {
  if (!has_input(i)) throw Unsupported(fmt::format("input {} ({}) is missing", i, what));
  const Val& v = env_->at(node_->input(i));
  if (v.known) return *v.known;
  if (v.hint) return *v.hint;
  throw Unsupported(fmt::format("input '{}' ({}) is computed at run time; Kiln needs it known when the model is "
                                "imported (an initializer, a Constant, or computed from shapes)",
                                node_->input(i), what));
}

std::vector<int64_t> Ctx::in_ints(int i, const char* what) const {
  const Tensor& t = in_const(i, what);
  if (!is_integer(t.dtype())) throw Unsupported(fmt::format("input {} ({}) is not an integer tensor", i, what));
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  for (int64_t k = 0; k < t.numel(); ++k) out[static_cast<size_t>(k)] = t.get_int(k);
  return out;
}

const onnx::AttributeProto* Ctx::find_attr(const std::string& name) const {
  for (const onnx::AttributeProto& a : node_->attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

bool Ctx::has_attr(const std::string& name) const { return find_attr(name) != nullptr; }

namespace {
// An ONNX name as a Kiln value name: other characters become '_', and a leading '_' is
// added where the name does not start with a letter or '_' ("0.weight" -> "_0.weight").
std::string sanitized(const std::string& onnx_name) {
  std::string s;
  for (char c : onnx_name) s += std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ? c : '_';
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) s = "_" + s;
  return s;
}

// The value an Identity chain starts from (`name` itself when no Identity makes it).
std::string identity_root(const std::map<std::string, std::string>& identity_of, std::string name) {
  for (int hops = 0; hops < 1000; ++hops) {  // Identity chains are acyclic in a checked graph
    auto it = identity_of.find(name);
    if (it == identity_of.end()) break;
    name = it->second;
  }
  return name;
}

void want_attr_type(const onnx::AttributeProto& a, onnx::AttributeProto::AttributeType t) {
  if (a.type() != t && a.type() != onnx::AttributeProto::UNDEFINED)
    throw Error(fmt::format("attribute {} is a {}, expected a {}", a.name(),
                            onnx::AttributeProto::AttributeType_Name(a.type()),
                            onnx::AttributeProto::AttributeType_Name(t)));
}
}  // namespace

int64_t Ctx::attr_int(const std::string& name, int64_t def) {
  read_.insert(name);
  const onnx::AttributeProto* a = find_attr(name);
  if (!a) return def;
  want_attr_type(*a, onnx::AttributeProto::INT);
  return a->i();
}

double Ctx::attr_float(const std::string& name, double def) {
  read_.insert(name);
  const onnx::AttributeProto* a = find_attr(name);
  if (!a) return def;
  want_attr_type(*a, onnx::AttributeProto::FLOAT);
  return a->f();
}

std::vector<int64_t> Ctx::attr_ints(const std::string& name, std::vector<int64_t> def) {
  read_.insert(name);
  const onnx::AttributeProto* a = find_attr(name);
  if (!a) return def;
  want_attr_type(*a, onnx::AttributeProto::INTS);
  return {a->ints().begin(), a->ints().end()};
}

std::vector<double> Ctx::attr_floats(const std::string& name) {
  read_.insert(name);
  const onnx::AttributeProto* a = find_attr(name);
  if (!a) return {};
  want_attr_type(*a, onnx::AttributeProto::FLOATS);
  return {a->floats().begin(), a->floats().end()};
}

std::string Ctx::attr_string(const std::string& name, std::string def) {
  read_.insert(name);
  const onnx::AttributeProto* a = find_attr(name);
  if (!a) return def;
  want_attr_type(*a, onnx::AttributeProto::STRING);
  return a->s();
}

Tensor Ctx::attr_tensor(const std::string& name) {
  read_.insert(name);
  const onnx::AttributeProto* a = find_attr(name);
  if (!a) throw Error("attribute " + name + " is missing");
  want_attr_type(*a, onnx::AttributeProto::TENSOR);
  return to_tensor(a->t(), "attribute " + name);
}

void Ctx::ignore_attr(const std::string& name) { read_.insert(name); }

std::vector<std::string> Ctx::unread_attrs() const {
  std::vector<std::string> out;
  for (const onnx::AttributeProto& a : node_->attribute())
    if (!read_.count(a.name())) out.push_back(a.name());
  return out;
}

void Ctx::update_state(const Val& state, Val next, const char* what) {
  if (!state.id.valid() || !g_.is_state(state.id))
    throw Unsupported(std::string("training needs ") + what + " to be an initializer (state) to update" +
                      (options_.constant_weights ? ", not a constant (--constant-weights)" : ""));
  updates_.emplace_back(g_.value(state.id).name + ".next", std::move(next));
}

std::pair<Val, Val> Ctx::dropout_state() {
  if (dropout_) return *dropout_;
  auto add = [&](const std::string& name, int64_t value) {
    for (const Value& v : g_.values())
      if (v.name == name) throw Unsupported("the model already has a value named '" + name + "' (dropout's state)");
    Tensor t(DType::i64, {});
    t.set_int(0, value);
    Val v;
    v.type = t.type();
    v.id = g_.add_input(name, v.type, /*is_state=*/true);
    if (state_) state_->emplace(name, std::move(t));
    return v;
  };
  Val seed = add("dropout.seed", options_.dropout_seed), counter = add("dropout.counter", 0);
  updates_.emplace_back("dropout.counter.next", node(Op::Add, {counter, scalar(DType::i64, 1)}));
  dropout_ = {seed, counter};
  return *dropout_;
}

bool Ctx::input_shared(int i) const {
  auto it = reads_.find(identity_root(identity_of_, node_->input(i)));
  return it != reads_.end() && it->second > 1;
}

Val Ctx::own_state(int i, const std::string& leaf) {
  Val from = in(i);
  const std::optional<Tensor>& init = from.hint ? from.hint : from.known;
  if (!init) throw Unsupported("input " + std::to_string(i) + " is computed at run time; it must be an initializer");
  const std::string base = sanitized(node_->name().empty() ? node_->output(0) : node_->name()) + "." + leaf;
  std::string name = base;
  for (int k = 2; g_.find(name).valid(); ++k) name = base + "_" + std::to_string(k);
  Val v;
  v.type = init->type();
  v.hint = *init;
  v.id = g_.add_input(name, v.type, /*is_state=*/true);
  if (state_) state_->emplace(name, *init);
  return v;
}

int Ctx::num_outputs() const { return node_->output_size(); }
bool Ctx::output_used(int i) const { return i < node_->output_size() && !node_->output(i).empty(); }

void Ctx::set_output(int i, Val v) {
  if (!output_used(i)) return;
  (*env_)[node_->output(i)] = std::move(v);
}

ValueId Ctx::materialize(Val& v) {
  if (v.id.valid()) return v.id;
  if (v.recipe) {
    std::vector<Val> operands = v.recipe->operands;
    std::vector<ValueId> ids;
    for (Val& o : operands) ids.push_back(materialize(o));
    v.id = g_.add_node_at(v.recipe->op, std::move(ids), v.recipe->attrs, "", "");
    return v.id;
  }
  if (!v.input.empty()) {
    auto it = lazy_inputs_.find(v.input);
    if (it == lazy_inputs_.end()) it = lazy_inputs_.emplace(v.input, g_.add_input(v.input, v.type)).first;
    v.id = it->second;
    return v.id;
  }
  KILN_CHECK(v.known.has_value(), "an ONNX value with neither a graph value nor a known one");
  v.id = g_.add_constant(*v.known);
  return v.id;
}

Val Ctx::constant(Tensor t) {
  Val v;
  v.type = t.type();
  v.known = std::move(t);
  return v;
}

Val Ctx::scalar(DType t, double value) {
  Tensor s(t, {});
  if (is_float(t)) s.set(0, value);
  else s.set_int(0, static_cast<int64_t>(value));
  return constant(std::move(s));
}

// Results up to this many elements are computed at import time when every operand is
// known: shape arithmetic (Shape -> Gather -> Concat -> Reshape) must fold, and small
// weights transformed by constants may; bigger ones are left to the fold_constants pass.
constexpr int64_t kFoldLimit = 1 << 16;

Val Ctx::node(Op op, std::vector<Val> operands, AttrMap attrs, bool from_batch) {
  std::vector<TensorType> types;
  bool all_known = true;
  for (const Val& v : operands) {
    types.push_back(v.type);
    all_known = all_known && v.known.has_value();
    from_batch = from_batch || v.from_batch;
  }
  attrs = complete_attrs(op, std::move(attrs));
  TensorType rt = infer_type(op, types, attrs);
  if (all_known && rt.numel() <= kFoldLimit) {
    std::vector<const Tensor*> ptrs;
    for (const Val& v : operands) ptrs.push_back(&*v.known);
    Val r = constant(eval_op(op, ptrs, attrs, rt));
    if (from_batch) {
      // Known here, but computed from the batch size: as data in the graph it is this node
      // (over the batch-free values it started from), which passes/rebatch can follow.
      r.from_batch = true;
      r.recipe = std::make_shared<const Recipe>(Recipe{op, std::move(operands), std::move(attrs)});
    }
    return r;
  }
  std::vector<ValueId> ids;
  for (Val& v : operands) ids.push_back(materialize(v));
  Val r;
  r.id = g_.add_node_at(op, std::move(ids), std::move(attrs), "", "");
  r.type = rt;
  return r;
}

}  // namespace onnx_import

// --- the driver ----------------------------------------------------------------------------

namespace {

using onnx_import::Ctx;
using onnx_import::Unsupported;
using onnx_import::Val;

// Kiln spells value names [A-Za-z_][A-Za-z0-9_.]*; ONNX allows anything. Other characters
// become '_', a leading digit gets a '_' before it, and clashes get _2, _3, ...
std::string kiln_name(const std::string& onnx_name, std::set<std::string>& used) {
  const std::string s = onnx_import::sanitized(onnx_name);
  std::string name = s;
  for (int k = 2; used.count(name); ++k) name = s + "_" + std::to_string(k);
  used.insert(name);
  return name;
}

// Every problem found, grouped for one error message.
struct Problems {
  struct OpCount {
    int count = 0;
    std::vector<std::string> nodes;  // the first few
  };
  std::map<std::string, OpCount> ops;  // unsupported op types
  std::vector<std::string> details;    // unsupported attributes, variants, types

  void op(const std::string& type, const std::string& node) {
    OpCount& c = ops[type];
    if (c.nodes.size() < 3) c.nodes.push_back(node);
    ++c.count;
  }
  bool empty() const { return ops.empty() && details.empty(); }
  std::string message(const std::string& what) const {
    int nops = 0;
    for (const auto& [t, c] : ops) nops += c.count;
    // The first line stands alone (the CLI's one-line error); the lines after it detail it.
    std::string m = fmt::format("{}: cannot import the model:", what);
    if (!ops.empty()) {
      constexpr size_t kNamed = 8;
      std::string types;
      size_t named = 0;
      for (auto it = ops.begin(); it != ops.end() && named < kNamed; ++it, ++named)
        types += (named ? ", " : "") + it->first;
      if (ops.size() > kNamed) types += fmt::format(" and {} more", ops.size() - kNamed);
      m += fmt::format(" {} node(s) of {} unsupported op type(s) ({})", nops, ops.size(), types);
    }
    if (!details.empty()) m += fmt::format("{} {} unsupported use(s)", ops.empty() ? "" : " and", details.size());
    m += "; the ops Kiln imports are listed in onnx.md, installed in share/doc/kiln under Kiln's prefix "
         "(docs/onnx.md in its source)";
    for (const auto& [t, c] : ops) {
      std::string names;
      for (const std::string& n : c.nodes) names += (names.empty() ? "" : ", ") + n;
      m += fmt::format("\n  unsupported op {} x{} (first: {})", t, c.count, names);
    }
    constexpr size_t kShown = 40;
    for (size_t i = 0; i < details.size() && i < kShown; ++i) m += "\n  " + details[i];
    if (details.size() > kShown) m += fmt::format("\n  ... and {} more", details.size() - kShown);
    return m;
  }
};

std::string node_label(const onnx::NodeProto& n, int index) {
  if (!n.name().empty()) return "'" + n.name() + "'";
  return fmt::format("#{}", index);
}

// Kiln can run opset 6 and newer as written; older models go through the version converter.
constexpr int64_t kMinNativeOpset = 6;
constexpr int64_t kMaxOpset = 17;  // what ONNX 1.12 (Debian bookworm's libonnx) knows

int64_t default_opset(const onnx::ModelProto& m) {
  int64_t v = 0;
  for (const onnx::OperatorSetIdProto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") v = o.version();
  return v;
}

TensorType input_type(const onnx::ValueInfoProto& vi, const OnnxImportOptions& opt, Problems& problems) {
  const std::string where = fmt::format("graph input '{}'", vi.name());
  if (!vi.type().has_tensor_type()) throw Unsupported(where + " is not a tensor");
  const onnx::TypeProto::Tensor& tt = vi.type().tensor_type();
  std::optional<DType> dt = onnx_import::dtype_of(tt.elem_type());
  if (!dt) throw Unsupported(fmt::format("{} has element type {}", where, onnx_import::elem_type_name(tt.elem_type())));
  if (!tt.has_shape()) throw Unsupported(where + " has no shape (Kiln compiles static shapes)");
  TensorType t{*dt, {}};
  for (int d = 0; d < tt.shape().dim_size(); ++d) {
    const auto& dim = tt.shape().dim(d);
    if (dim.has_dim_value() && dim.dim_value() >= 0) {
      t.shape.push_back(dim.dim_value());
      continue;
    }
    std::string sym = dim.has_dim_param() ? "'" + dim.dim_param() + "'" : "(unnamed)";
    if (d == 0) {
      t.shape.push_back(opt.batch.value_or(1));
      continue;
    }
    problems.details.push_back(fmt::format("{}: dimension {} is symbolic {}; Kiln compiles static shapes and gives a "
                                           "value (--batch) only to the leading, batch dimension",
                                           where, d, sym));
    t.shape.push_back(1);
  }
  check_size(t, where);
  return t;
}

// Every node input defined before its node (by a graph input, an initializer or an earlier
// node) and every graph output defined. ONNX's checker lets some of these through and
// libonnx 1.12's version converter dereferences null on them, so this runs first.
void check_structure(const onnx::GraphProto& gp, const std::string& what) {
  std::set<std::string> defined{""};
  for (const onnx::ValueInfoProto& vi : gp.input()) defined.insert(vi.name());
  for (const onnx::TensorProto& t : gp.initializer()) defined.insert(t.name());
  for (int i = 0; i < gp.node_size(); ++i) {
    const onnx::NodeProto& n = gp.node(i);
    for (const std::string& in : n.input())
      if (!defined.count(in))
        throw Error(fmt::format("{}: node {} ({}) reads '{}', which nothing before it defines", what,
                                node_label(n, i), n.op_type(), in));
    for (const std::string& o : n.output()) defined.insert(o);
  }
  for (const onnx::ValueInfoProto& vi : gp.output())
    if (!defined.count(vi.name()))
      throw Error(fmt::format("{}: graph output '{}' is not computed by any node", what, vi.name()));
}

// --- weights: read once, kept once ----------------------------------------------------------
//
// An initializer's data is taken out of the protobuf before anything else reads the model:
// raw data inside the file moves (no copy) from the parsed protobuf into the tensor that
// keeps it, data in an external file is that file mapped into memory (the tensor views the
// mapping: no copy at all when it is aligned to the element size). The initializer leaves
// the protobuf and becomes a graph input of its type there, so the checker, the version
// converter, shape inference and every import (check_rebatch imports the model three
// times) handle a protobuf without its weights, and each import's tensors share the one
// copy (Tensor storage is shared).

// What an initializer's data became, by name, and the file's order of every initializer.
struct Weights {
  std::vector<std::string> order;       // every initializer's name, in the file's order
  std::map<std::string, Tensor> taken;  // the ones taken out of the protobuf
};

// Raw data below this many bytes stays in the protobuf (shape and axis tensors that ONNX's
// shape inference reads).
constexpr size_t kTakeBytes = 1024;

// The external data file `location` of tensor `what`, a path relative to the model's folder
// `dir` (as ONNX requires: neither absolute nor leaving the folder).
std::string external_path(const std::string& dir, const std::string& location, const std::string& what) {
  if (location.empty()) throw Error(what + " keeps its data in an external file but names none (location)");
  if (location[0] == '/')
    throw Error(fmt::format("{} keeps its data in '{}': an absolute path, where ONNX requires a path relative to "
                            "the model's folder",
                            what, location));
  for (size_t start = 0; start <= location.size();) {
    size_t end = std::min(location.find('/', start), location.size());
    if (location.compare(start, end - start, "..") == 0)
      throw Error(fmt::format("{} keeps its data in '{}', outside the model's folder ('..'), which ONNX does not allow",
                              what, location));
    start = end + 1;
  }
  return dir.empty() ? location : dir + "/" + location;
}

// The data of external tensor `p` (dtype `dt`, `shape`): a view of its file, mapped once per
// file (`files`), or a copy where the data is not aligned to the element size.
Tensor external_tensor(const onnx::TensorProto& p, DType dt, const Shape& shape, const std::string& dir,
                       std::map<std::string, std::shared_ptr<const MappedFile>>& files, const std::string& what) {
  std::string location;
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  for (const onnx::StringStringEntryProto& e : p.external_data()) {
    auto number = [&]() {
      try {
        size_t used = 0;
        unsigned long long v = std::stoull(e.value(), &used);
        if (used != e.value().size() || e.value()[0] == '-') throw std::invalid_argument("");
        return static_cast<uint64_t>(v);
      } catch (const std::exception&) {
        throw Error(fmt::format("{}: external data {} '{}' is not a byte count", what, e.key(), e.value()));
      }
    };
    if (e.key() == "location") location = e.value();
    else if (e.key() == "offset") offset = number();
    else if (e.key() == "length") length = number();
  }
  if (dir.empty())
    throw Error(what + " keeps its data in an external file, which is found from the model's own path: import the "
                       "model from its file");
  const std::string path = external_path(dir, location, what);
  auto it = files.find(path);
  if (it == files.end()) {
    try {
      it = files.emplace(path, MappedFile::map(path, "ONNX external data")).first;
    } catch (const Error& e) {
      throw Error(fmt::format("{} keeps its data in '{}': {}", what, location, e.what()));
    }
  }
  const MappedFile& file = *it->second;
  const uint64_t bytes = static_cast<uint64_t>(num_elements(shape)) * dtype_size(dt);
  if (length && *length != bytes)
    throw Error(fmt::format("{} has {} bytes of external data for shape {} of {} ({} bytes)", what, *length,
                            shape_str(shape), dtype_name(dt), bytes));
  if (offset > file.size() || file.size() - offset < bytes)
    throw Error(fmt::format("{} reads bytes {} to {} of '{}', which has {}", what, offset, offset + bytes, path,
                            file.size()));
  if (bytes == 0) return Tensor(dt, shape);
  const std::byte* data = file.data() + offset;
  if (dt != DType::boolean && reinterpret_cast<uintptr_t>(data) % dtype_size(dt) == 0)
    return Tensor::view(dt, shape, std::shared_ptr<const std::byte>(it->second, data), bytes);
  Tensor t(dt, shape);  // unaligned (ONNX's writer aligns large tensors) or bool: one copy
  std::byte* out = t.raw();
  std::memcpy(out, data, bytes);
  if (dt == DType::boolean)
    for (uint64_t i = 0; i < bytes; ++i) out[i] = std::byte{out[i] != std::byte{0}};
  return t;
}

// Takes the weights out of `model` (see above). Initializers whose data Kiln cannot take (an
// element type it lacks, bool, a segment, small raw data, a name given twice) stay where
// they are, for the import to read or refuse as before; an external one of those gets its
// location made a path from here, for the checker to find.
Weights take_weights(onnx::ModelProto& model, const std::string& what, const std::string& dir) {
  PhaseTimer timer("weights");
  Weights w;
  onnx::GraphProto& gp = *model.mutable_graph();
  std::map<std::string, int> count;
  for (const onnx::TensorProto& t : gp.initializer()) ++count[t.name()];
  std::set<std::string> inputs;
  for (const onnx::ValueInfoProto& vi : gp.input()) inputs.insert(vi.name());
  std::map<std::string, std::shared_ptr<const MappedFile>> files;
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (onnx::TensorProto& p : *gp.mutable_initializer()) {
    w.order.push_back(p.name());
    const std::string label = fmt::format("{}: initializer '{}'", what, p.name());
    std::optional<DType> dt = onnx_import::dtype_of(p.data_type());
    const bool external = p.data_location() == onnx::TensorProto::EXTERNAL;
    // Raw bool data stays (its bytes need making 0 or 1: to_tensor does).
    bool take = dt && (external || *dt != DType::boolean) && !p.has_segment() && count[p.name()] == 1 &&
                !p.name().empty() && (external || p.raw_data().size() >= kTakeBytes);
    Shape shape;
    for (int64_t d : p.dims()) {
      take = take && d >= 0;
      shape.push_back(d);
    }
    if (take) check_size(TensorType{*dt, shape}, label);
    if (take && external) {
      w.taken.emplace(p.name(), external_tensor(p, *dt, shape, dir, files, label));
    } else if (take && p.raw_data().size() == static_cast<size_t>(num_elements(shape)) * dtype_size(*dt)) {
      // The parsed bytes move into the tensor's storage: a string's heap block, 16-byte aligned.
      auto bytes = std::make_shared<std::string>();
      bytes->swap(*p.mutable_raw_data());
      const auto* data = reinterpret_cast<const std::byte*>(bytes->data());
      const size_t n = bytes->size();
      w.taken.emplace(p.name(), Tensor::view(*dt, shape, std::shared_ptr<const std::byte>(std::move(bytes), data), n));
    } else {
      if (external && !dir.empty())
        for (onnx::StringStringEntryProto& e : *p.mutable_external_data())
          if (e.key() == "location" && !e.value().empty() && e.value()[0] != '/') e.set_value(dir + "/" + e.value());
      kept.Add()->Swap(&p);
      continue;
    }
    if (!inputs.count(p.name())) {  // IR < 4 lists it there already
      onnx::ValueInfoProto* vi = gp.add_input();
      vi->set_name(p.name());
      onnx::TypeProto::Tensor* tt = vi->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(p.data_type());
      onnx::TensorShapeProto* sp = tt->mutable_shape();
      for (int64_t d : shape) sp->add_dim()->set_dim_value(d);
    }
  }
  gp.mutable_initializer()->Swap(&kept);
  return w;
}

// ONNX's shape inference as a check on Kiln's: every output dimension it can infer must be
// the one Kiln's shape rules gave (a kiln::Error, not an internal one: on a malformed model
// libonnx's inference can be the one that is wrong; the conformance runner counts it as a
// failure). It runs after Kiln's import has accepted every node and
// attribute, because libonnx 1.12's inference divides by a zero stride and the like on
// models Kiln refuses anyway (the fuzz target found those).
void cross_check_shapes(const onnx::ModelProto& model, OnnxModel& out, const std::string& what) {
  PhaseTimer timer("shape check");
  onnx::ModelProto copy = model;
  copy.mutable_graph()->clear_value_info();
  try {
    onnx::shape_inference::InferShapes(copy);
  } catch (const std::exception& e) {
    out.warnings.push_back(std::string("ONNX's shape inference failed, so Kiln's shapes go unchecked: ") + e.what());
    return;
  }
  for (const onnx::ValueInfoProto& vi : copy.graph().output()) {
    auto it = std::find_if(out.outputs.begin(), out.outputs.end(), [&](const auto& p) { return p.first == vi.name(); });
    if (it == out.outputs.end() || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) continue;
    const TensorType& t = out.graph.type(out.graph.find_output(it->second));
    const onnx::TensorShapeProto& s = vi.type().tensor_type().shape();
    bool same = s.dim_size() == t.rank();
    for (int d = 0; same && d < s.dim_size(); ++d)
      same = !s.dim(d).has_dim_value() || s.dim(d).dim_value() == t.shape[static_cast<size_t>(d)];
    if (!same)
      throw Error(fmt::format("{}: Kiln imports output '{}' as {} but ONNX's shape inference gives it {} dimensions "
                              "({}): the model is inconsistent, or this is a bug in Kiln's ONNX importer (please "
                              "report it)",
                              what, vi.name(), t.str(), s.dim_size(), s.ShortDebugString()));
  }
}

// True when graph input `vi` has a symbolic leading dimension (the batch).
bool symbolic_batch(const onnx::ValueInfoProto& vi) {
  if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return false;
  const onnx::TensorShapeProto& s = vi.type().tensor_type().shape();
  return s.dim_size() > 0 && !(s.dim(0).has_dim_value() && s.dim(0).dim_value() >= 0);
}

OnnxModel import_model(onnx::ModelProto model, const Weights& weights, const std::string& what,
                       const OnnxImportOptions& opt, bool* has_symbolic_batch = nullptr) {
  OnnxModel out;
  out.opset = default_opset(model);
  out.producer = model.producer_name() + (model.producer_version().empty() ? "" : " " + model.producer_version());
  if (out.opset == 0) throw Error(what + ": the model imports no opset of the default ONNX domain");
  if (out.opset > kMaxOpset)
    throw Error(fmt::format("{}: opset {} is newer than the ONNX library Kiln is built with knows (1.12: opsets up to "
                            "{}); export the model at opset {} or older",
                            what, out.opset, kMaxOpset, kMaxOpset));
  // libonnx 1.12's checker refuses every IR version above its own (8), but a current `onnx`
  // package saves every model at its newest one whatever the opset. What later IR versions
  // add that Kiln cannot read (float8 and 4-bit element types, function overloads) Kiln's
  // own reading refuses by name; so the model is read (checked, converted, shape-inferred by
  // libonnx) as of libonnx's own IR version.
  model.set_ir_version(std::min<int64_t>(model.ir_version(), onnx::Version::IR_VERSION));
  try {
    PhaseTimer timer("check");
    onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: the ONNX checker rejects the model: {}", what, e.what()));
  }
  check_structure(model.graph(), what);
  if (out.opset < kMinNativeOpset) {
    try {
      model = onnx::version_conversion::ConvertVersion(model, 9);
    } catch (const std::exception& e) {
      throw Error(fmt::format("{}: opset {} is older than Kiln reads ({}+) and ONNX's version converter cannot "
                              "bring it to opset 9: {}",
                              what, out.opset, kMinNativeOpset, e.what()));
    }
    out.warnings.push_back(fmt::format("converted the model from opset {} to 9", out.opset));
  }
  const int64_t opset = default_opset(model);

  const onnx::GraphProto& gp = model.graph();
  std::set<std::string> used_names;
  out.graph.set_name(kiln_name(gp.name().empty() ? "model" : gp.name(), used_names));
  Graph& g = out.graph;
  Problems problems;
  std::map<std::string, Val> env;
  std::set<std::string> poisoned;
  Ctx ctx(g, opset, opt, &out.state);

  std::set<std::string> initializer_names(weights.order.begin(), weights.order.end());
  std::map<std::string, std::deque<const onnx::TensorProto*>> in_proto;  // the initializers not taken
  for (const onnx::TensorProto& t : gp.initializer()) {
    initializer_names.insert(t.name());
    in_proto[t.name()].push_back(&t);
  }
  if (gp.sparse_initializer_size() > 0) problems.details.push_back("sparse initializers are not supported");

  // Graph inputs first (in ONNX order), then the state (the float initializers).
  for (const onnx::ValueInfoProto& vi : gp.input()) {
    if (initializer_names.count(vi.name())) continue;  // IR < 4: initializers are listed as inputs too
    if (has_symbolic_batch && symbolic_batch(vi)) *has_symbolic_batch = true;
    try {
      TensorType t = input_type(vi, opt, problems);
      std::string name = kiln_name(vi.name(), used_names);
      out.inputs.emplace_back(vi.name(), name);
      Val v;
      v.type = t;
      if (auto it = opt.input_values.find(vi.name()); it != opt.input_values.end() && it->second.type() == t) {
        v.hint = it->second;
        v.input = name;  // added only if something needs it at run time
      } else {
        v.id = g.add_input(name, t);
      }
      env[vi.name()] = std::move(v);
    } catch (const Unsupported& e) {
      problems.details.push_back(e.what());
      poisoned.insert(vi.name());
    }
  }
  // In the file's order (one given twice read twice, as the protobuf lists it), then any the
  // version converter added.
  std::vector<std::pair<std::string, const onnx::TensorProto*>> initializers;
  for (const std::string& name : weights.order) {
    if (weights.taken.count(name)) {
      initializers.emplace_back(name, nullptr);
    } else if (auto it = in_proto.find(name); it != in_proto.end() && !it->second.empty()) {
      initializers.emplace_back(name, it->second.front());
      it->second.pop_front();
    }
  }
  for (auto& [name, left] : in_proto)
    for (const onnx::TensorProto* t : left) initializers.emplace_back(name, t);
  for (const auto& [init_name, proto] : initializers) {
    try {
      Tensor t = proto ? onnx_import::to_tensor(*proto, fmt::format("initializer '{}'", init_name))
                       : weights.taken.at(init_name);
      Val v;
      v.type = t.type();
      if (is_float(t.dtype()) && !opt.constant_weights) {
        std::string name = kiln_name(init_name, used_names);
        v.id = g.add_input(name, t.type(), /*is_state=*/true);
        v.hint = t;  // for a node that needs it at import (Dropout's ratio, Clip's bounds)
        out.state.emplace(name, std::move(t));
      } else {
        v.known = std::move(t);
      }
      env[init_name] = std::move(v);
    } catch (const Unsupported& e) {
      problems.details.push_back(e.what());
      poisoned.insert(init_name);
    }
  }

  {  // How often each value is read, through Identity (Ctx::input_shared).
    std::map<std::string, int> reads;
    std::map<std::string, std::string> identity_of;
    auto is_identity = [](const onnx::NodeProto& n) {
      return n.op_type() == "Identity" && n.input_size() == 1 && n.output_size() == 1 &&
             (n.domain().empty() || n.domain() == "ai.onnx");
    };
    for (const onnx::NodeProto& n : gp.node())
      if (is_identity(n)) identity_of[n.output(0)] = n.input(0);
    for (const onnx::NodeProto& n : gp.node())
      if (!is_identity(n))
        for (const std::string& in : n.input())
          if (!in.empty()) ++reads[onnx_import::identity_root(identity_of, in)];
    for (const onnx::ValueInfoProto& vi : gp.output()) ++reads[onnx_import::identity_root(identity_of, vi.name())];
    ctx.set_reads(std::move(reads), std::move(identity_of));
  }
  const auto& table = onnx_import::op_table();
  for (int i = 0; i < gp.node_size(); ++i) {
    const onnx::NodeProto& n = gp.node(i);
    bool skip = false;
    for (const std::string& in : n.input()) {
      if (in.empty()) continue;
      if (poisoned.count(in)) skip = true;
      else if (!env.count(in)) throw Error(fmt::format("{}: node {} reads '{}', which nothing defines", what,
                                                       node_label(n, i), in));
    }
    const bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
    auto fn = default_domain ? table.find(n.op_type()) : table.end();
    if (fn == table.end()) {  // listed even downstream of another problem: every unsupported op at once
      problems.op(default_domain ? n.op_type() : n.domain() + "." + n.op_type(), node_label(n, i));
      skip = true;
    }
    if (!skip) {
      const size_t first = g.nodes().size();
      try {
        ctx.begin(n, &env);
        fn->second(ctx);
        std::vector<std::string> unread = ctx.unread_attrs();
        if (!unread.empty()) {
          std::string list;
          for (const std::string& a : unread) list += (list.empty() ? "" : ", ") + a;
          throw Unsupported("attribute(s) " + list + " not supported");
        }
        std::string note = fmt::format("onnx {} {}", n.op_type(), node_label(n, i));
        for (size_t k = first; k < g.nodes().size(); ++k)
          if (g.nodes()[k].op != Op::Constant) g.set_note(g.nodes()[k].result(), note);
        for (const std::string& o : n.output())
          if (!o.empty() && !env.count(o)) throw Unsupported("output '" + o + "' is not supported");
      } catch (const Unsupported& e) {
        problems.details.push_back(fmt::format("{} {}: {}", n.op_type(), node_label(n, i), e.what()));
        skip = true;
      } catch (const Error& e) {
        problems.details.push_back(fmt::format("{} {}: {}", n.op_type(), node_label(n, i), e.what()));
        skip = true;
      }
    }
    if (skip)
      for (const std::string& o : n.output())
        if (!o.empty()) poisoned.insert(o);
  }

  for (const onnx::ValueInfoProto& vi : gp.output()) {
    if (poisoned.count(vi.name())) continue;
    auto it = env.find(vi.name());
    if (it == env.end()) throw Error(fmt::format("{}: graph output '{}' is not computed by any node", what, vi.name()));
    std::string name = kiln_name(vi.name(), used_names);
    // An output that is a graph input or another output's value gets a node of its own.
    ValueId v = ctx.materialize(it->second);
    if (g.value(v).node < 0) v = g.add_node_at(Op::Reshape, {v}, {{"shape", g.type(v).shape}}, "", "");
    out.outputs.emplace_back(vi.name(), name);
    g.add_output(name, v);
    if (vi.type().has_tensor_type()) {
      std::optional<DType> dt = onnx_import::dtype_of(vi.type().tensor_type().elem_type());
      if (dt && *dt != g.type(v).dtype)
        problems.details.push_back(fmt::format("graph output '{}' imports as {} but the model declares {}", vi.name(),
                                               g.type(v).str(), dtype_name(*dt)));
    }
  }
  // The state the model updates itself (training), after the model's own outputs.
  for (auto& [name, v] : ctx.state_updates()) {
    if (!out.graph.find_output(name).valid()) g.add_output(name, ctx.materialize(v));
  }
  if (!problems.empty()) throw Error(problems.message(what));
  verify(g);
  cross_check_shapes(model, out, what);
  return out;
}

// --- the batch check -------------------------------------------------------------------------
//
// A model with a symbolic batch is imported at one batch size B, and folding at import
// reads B wherever the model reads its batch size (Shape, Size, a Slice's or Tile's sizes,
// Hardmax's depth, ...). passes/rebatch makes the graph at another size from the types
// alone, so the importer checks it: it imports the model at B + 1 and B + 2 too, and the
// graph rebatched to each must be the graph imported there, node for node. Where one
// differs, or the import there fails, the graph's batch is fixed (Graph::set_fixed_batch),
// the reason naming the first ONNX node that differs; rebatch then refuses the graph. At
// batch 1, where axes of size 1 make the batch's place in a reshape's result ambiguous,
// the import at B + 1 says where it is: the reshape spells it -1 (passes/rebatch.h).

// "%3 = reshape {shape=[2,1]} : f32[2,1] (onnx Tile 'tile')": one node, for messages (a
// large tensor attribute by its type only). A node without a note (a constant) names the
// first node that reads it and has one.
std::string node_text(const Graph& g, const std::vector<std::string>& names, const Node& n) {
  std::string attrs;
  for (const auto& [k, a] : n.attrs) {
    const bool large = attr_kind(a) == AttrKind::Tensor && !std::get<Tensor>(a).is_splat() &&
                       std::get<Tensor>(a).numel() > 16;
    attrs += (attrs.empty() ? "" : ", ") + k + "=" + (large ? std::get<Tensor>(a).type().str() : print_attr(a));
  }
  std::string s = names[static_cast<size_t>(n.results[0].id)] + " = " + std::string(op_name(n.op)) +
                  (attrs.empty() ? "" : " {" + attrs + "}") + " : " + g.type(n.results[0]).str();
  if (!n.note.empty()) return s + " (" + n.note + ")";
  for (const Node& reader : g.nodes())
    if (!reader.note.empty() && std::find(reader.operands.begin(), reader.operands.end(), n.results[0]) !=
                                    reader.operands.end())
      return s + " (read by " + reader.note + ")";
  return s;
}

// The first place `got` (a graph rebatched) differs from `want` (the model imported at
// that batch), as a message; "" when they are the same. A reshape is compared by its
// result type (its shape attribute may spell the batch -1 or not).
std::string first_difference(const Graph& got, const Graph& want) {
  if (got.inputs().size() != want.inputs().size()) return "the inputs differ";
  for (size_t i = 0; i < got.inputs().size(); ++i)
    if (got.type(got.inputs()[i].value) != want.type(want.inputs()[i].value))
      return "input %" + want.value(want.inputs()[i].value).name + " is " + want.type(want.inputs()[i].value).str() +
             " there, " + got.type(got.inputs()[i].value).str() + " rebatched";
  const std::vector<std::string> gn = value_names(got), wn = value_names(want);
  const size_t nodes = std::min(got.nodes().size(), want.nodes().size());
  for (size_t i = 0; i < nodes; ++i) {
    const Node &a = got.nodes()[i], &b = want.nodes()[i];
    bool same = a.op == b.op && a.operands == b.operands && a.results.size() == b.results.size();
    for (size_t r = 0; same && r < a.results.size(); ++r) same = got.type(a.results[r]) == want.type(b.results[r]);
    if (same && a.op != Op::Reshape) same = a.attrs == b.attrs;
    if (!same) return "ONNX gives " + node_text(want, wn, b) + ", the graph rebatched " + node_text(got, gn, a);
  }
  if (got.nodes().size() != want.nodes().size())
    return nodes < want.nodes().size() ? "ONNX gives " + node_text(want, wn, want.nodes()[nodes]) + " too"
                                       : "the graph rebatched has " + node_text(got, gn, got.nodes()[nodes]) + " too";
  for (size_t i = 0; i < got.outputs().size() && i < want.outputs().size(); ++i)
    if (got.outputs()[i].value != want.outputs()[i].value || got.outputs()[i].name != want.outputs()[i].name)
      return "output '" + want.outputs()[i].name + "' differs";
  return got.outputs().size() == want.outputs().size() ? "" : "the outputs differ";
}

// `g` (imported at batch 1) with the batch spelled -1 in each reshape whose result has it
// beside another axis of size 1 (where passes/rebatch cannot tell which axis it is): the
// axis is the one that `next`, the model imported at batch 2, has larger. Nodes, names and
// notes unchanged.
Graph mark_batch_axes(const Graph& g, const Graph& next) {
  Graph out(g.name());
  std::vector<ValueId> map(g.values().size());
  for (const GraphInput& in : g.inputs())
    map[static_cast<size_t>(in.value.id)] = out.add_input(g.value(in.value).name, g.type(in.value), in.is_state);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::vector<ValueId> ops;
    for (ValueId v : n.operands) ops.push_back(map[static_cast<size_t>(v.id)]);
    AttrMap attrs = n.attrs;
    if (n.op == Op::Reshape && i < next.nodes().size() && next.nodes()[i].op == Op::Reshape) {
      const Shape &here = g.type(n.result()).shape, &there = next.type(next.nodes()[i].result()).shape;
      Shape s = attr_ints(attrs, "shape");
      if (here.size() == there.size() && std::find(s.begin(), s.end(), -1) == s.end()) {
        std::vector<size_t> grew;
        for (size_t d = 0; d < here.size(); ++d)
          if (here[d] != there[d]) grew.push_back(d);
        const size_t d = grew.empty() ? 0 : grew[0];
        const bool beside_one = (d > 0 && here[d - 1] == 1) || (d + 1 < here.size() && here[d + 1] == 1);
        if (grew.size() == 1 && here[d] == 1 && beside_one) {
          s[grew[0]] = -1;
          attrs["shape"] = s;
        }
      }
    }
    KILN_CHECK(n.op != Op::Fused, "mark_batch_axes: the importer made a fused node");
    ValueId r = out.add_node_at(n.op, std::move(ops), std::move(attrs), g.value(n.result()).name, n.location);
    if (!n.note.empty()) out.set_note(r, n.note);
    map[static_cast<size_t>(n.result().id)] = r;
  }
  for (const GraphOutput& o : g.outputs()) out.add_output(o.name, map[static_cast<size_t>(o.value.id)]);
  return out;
}

void check_rebatch(const onnx::ModelProto& model, const Weights& weights, OnnxModel& out, const std::string& what,
                   const OnnxImportOptions& opt) {
  PhaseTimer timer("batch check");
  const int64_t batch = opt.batch.value_or(1);
  for (int64_t step = 1; step <= 2 && out.graph.fixed_batch().empty(); ++step) {
    const int64_t other = batch + step;
    std::string why;
    OnnxImportOptions at = opt;
    at.batch = other;
    try {
      Graph want = import_model(model, weights, what, at).graph;
      if (step == 1 && batch == 1) out.graph = mark_batch_axes(out.graph, want);
      try {
        why = first_difference(rebatch(out.graph, other), want);
      } catch (const Error& e) {
        why = e.what();
      }
    } catch (const Error& e) {
      // One line: the import error's lines, without its pointer to the op table.
      std::string lines;
      std::istringstream text(e.what());
      for (std::string line; std::getline(text, line);) {
        line.erase(0, line.find_first_not_of(' '));
        if (!line.empty() && !line.starts_with("(docs/onnx.md")) lines += (lines.empty() ? "" : "; ") + line;
      }
      why = "importing it there fails: " + lines;
    }
    if (!why.empty())
      out.graph.set_fixed_batch(fmt::format("{} reads its batch size: at batch {}, {} (import it at the batch size "
                                            "wanted: --batch)",
                                            what, other, why));
  }
}

}  // namespace

namespace {

// The import of a parsed model; `dir` is the folder of its file ("" for bytes), where its
// external data files are.
OnnxModel import_parsed(onnx::ModelProto& model, const std::string& what, const std::string& dir,
                        const OnnxImportOptions& options) {
  if (!model.has_graph()) throw Error(what + ": the ONNX model has no graph");
  const Weights weights = take_weights(model, what, dir);
  bool has_symbolic_batch = false;
  OnnxModel m;
  {
    PhaseTimer timer("import");
    m = import_model(model, weights, what, options, &has_symbolic_batch);
  }
  if (has_symbolic_batch) check_rebatch(model, weights, m, what, options);
  return m;
}

const char* const kNotAModel = ": not an ONNX model (the protobuf does not parse: truncated or not a .onnx file?)";

}  // namespace

OnnxModel import_onnx_bytes(std::string_view bytes, const std::string& what, const OnnxImportOptions& options) {
  onnx::ModelProto model;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw Error(what + ": larger than 2 GiB, which protobuf cannot parse");
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) throw Error(what + kNotAModel);
  return import_parsed(model, what, "", options);
}

namespace {
// protobuf parses at most 2 GiB; a larger file is refused by its size, before reading.
constexpr uint64_t kMaxProtobufBytes = static_cast<uint64_t>(std::numeric_limits<int>::max());
constexpr const char* kProtobufLimit = "protobuf cannot parse more than 2 GiB";
// The parser's read size: its default (8 KiB) makes a read call per 8 KiB of weights.
constexpr int kParseBlockBytes = 1 << 20;
}  // namespace

OnnxModel import_onnx(const std::string& path, const OnnxImportOptions& options) {
  onnx::ModelProto model;
  {
    // Parsed as it is read, a buffer at a time: the file's bytes are never all in memory
    // besides the parsed model's.
    PhaseTimer timer("parse");
    RegularFile file(path, "ONNX", kMaxProtobufBytes, kProtobufLimit);
    google::protobuf::io::FileInputStream in(file.fd(), kParseBlockBytes);
    if (!model.ParseFromZeroCopyStream(&in)) {
      if (in.GetErrno() != 0) throw Error(path + ": read error (" + std::string(std::strerror(in.GetErrno())) + ")");
      throw Error(path + kNotAModel);
    }
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  return import_parsed(model, path, dir, options);
}

Tensor read_onnx_tensor(const std::string& path, std::string* name) {
  std::string bytes = read_regular_file(path, "ONNX", kMaxProtobufBytes, kProtobufLimit);
  onnx::TensorProto t;
  if (!t.ParseFromString(bytes)) throw Error(path + ": not a serialized ONNX TensorProto");
  if (name) *name = t.name();
  try {
    return onnx_import::to_tensor(t, path);
  } catch (const Unsupported& e) {
    throw Error(e.what());
  }
}

bool is_onnx_path(std::string_view path) { return path.size() >= 5 && path.substr(path.size() - 5) == ".onnx"; }

}  // namespace kiln
