// make_train_step: the model's forward nodes, copied; the backward nodes from autodiff; the
// optimizer update as ordinary elementwise IR over the parameters, their gradients and the
// optimizer's state inputs. Every optimizer node carries a note naming the optimizer, the
// quantity and the parameter ("adam update of %fc1.weight"), so the printed step explains
// itself. The learning rate is the state input "lr" and the other hyper-parameters are f64
// state scalars ("momentum", "beta1", ...), so a schedule or a user changes them between
// steps without recompiling; each is cast to the parameters' dtype where it is used, after
// any derivation (1 - beta1) in f64, which rounds exactly as the double constants did.
//
// Arithmetic follows PyTorch's single-tensor implementations (torch/optim/{sgd,adam,adamw}.py),
// which compute the documented algorithms with the bias corrections folded into scalars:
//   Adam:  step_size = lr / (1 - b1^t);  denom = sqrt(v) / sqrt(1 - b2^t) + eps;
//          p -= step_size * m / denom        (= lr * mhat / (sqrt(vhat) + eps))
//   AdamW: p *= 1 - lr * wd, then the Adam update without the L2 term.
#include "passes/train_step.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <type_traits>

#include "ir/calling.h"
#include "ir/error.h"
#include "passes/autodiff.h"

namespace kiln {

namespace {

// The shortest text that reads back as v in its type: 1e-320, not 9.99989e-321. (Unlike
// the printer's spelling, a whole number stays "0", not "0.0": these are messages.)
template <typename T>
std::string shortest(T v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
std::string fmt_double(double v) { return shortest(v); }

[[noreturn]] void fail(const std::string& message) { throw Error("make_train_step: " + message); }

// PyTorch's constructor checks: the same conditions, the same spirit of message.
void check_optimizer(const Optimizer& optimizer) {
  auto non_negative = [](const char* opt, const char* what, double v) {
    if (!(v >= 0.0))
      fail(std::string(opt) + ": invalid " + what + " " + fmt_double(v) + " (must be >= 0)");
  };
  auto positive = [](const char* opt, double v) {
    if (!(v > 0.0 && std::isfinite(v)))
      fail(std::string(opt) + ": invalid learning rate " + fmt_double(v) + " (must be > 0 and finite)");
  };
  auto beta = [](const char* opt, const char* what, double v) {
    if (!(v >= 0.0 && v < 1.0))
      fail(std::string(opt) + ": invalid " + what + " " + fmt_double(v) + " (must be in [0, 1))");
  };
  std::visit(
      [&](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, SGD>) {
          positive("sgd", o.lr);
          non_negative("sgd", "momentum", o.momentum);
          non_negative("sgd", "weight_decay", o.weight_decay);
          if (!std::isfinite(o.dampening))
            fail("sgd: invalid dampening " + fmt_double(o.dampening));
          if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
            fail("sgd: nesterov momentum requires a momentum > 0 and zero dampening (got momentum " +
                 fmt_double(o.momentum) + ", dampening " + fmt_double(o.dampening) + ")");
        } else {
          const char* name = std::is_same_v<T, Adam> ? "adam" : "adamw";
          positive(name, o.lr);
          non_negative(name, "epsilon", o.eps);
          beta(name, "beta1", o.beta1);
          beta(name, "beta2", o.beta2);
          non_negative(name, "weight_decay", o.weight_decay);
        }
      },
      optimizer);
}

// %lr's initial value. It is state of the parameters' dtype, where a valid double may
// round to 0 (1e-320 in f32: the step would silently do nothing) or overflow (1e39).
Tensor learning_rate(const Optimizer& optimizer, DType dtype) {
  double lr = std::visit([](const auto& o) { return o.lr; }, optimizer);
  bool f32 = dtype == DType::f32;
  std::string where = std::string(dtype_name(dtype)) + ", the dtype of the parameters and of %lr";
  if (f32 && lr > std::numeric_limits<float>::max())
    fail("learning rate " + fmt_double(lr) + " is too large for " + where + " (at most " +
         shortest<float>(std::numeric_limits<float>::max()) + ")");
  Tensor t = Tensor::scalar(dtype, lr);
  if (t.get(0) == 0.0)
    fail("learning rate " + fmt_double(lr) + " rounds to 0 in " + where + " (the smallest positive " +
         std::string(dtype_name(dtype)) + " is " +
         (f32 ? shortest<float>(std::numeric_limits<float>::denorm_min())
              : fmt_double(std::numeric_limits<double>::denorm_min())) +
         ")");
  return t;
}

// The optimizer's state inputs for one parameter, in input order.
std::vector<std::string> optimizer_state_names(const Optimizer& optimizer, const std::string& p) {
  if (const SGD* s = std::get_if<SGD>(&optimizer))
    return s->momentum != 0.0 ? std::vector<std::string>{"sgd.momentum." + p}
                              : std::vector<std::string>{};
  return {"adam.m." + p, "adam.v." + p};
}

// Appends the optimizer's nodes: rank-0 constants shared by (dtype, value), every node noted.
// Callers sequence their calls in statements (C++ leaves the order of function arguments
// unspecified, and the printed graph must not depend on the compiler).
class Emitter {
 public:
  Emitter(Graph& g, DType dtype) : g_(g), dtype_(dtype) {}

  // A scalar constant of the parameters' dtype (or of `dtype`); `note` is kept from the
  // first request for the value.
  ValueId constant(double v, const std::string& note, std::optional<DType> dtype = std::nullopt) {
    DType d = dtype.value_or(dtype_);
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    auto [it, fresh] = constants_.try_emplace({d, bits});
    if (fresh) {
      it->second = g_.add_constant(Tensor::scalar(d, v));
      g_.set_note(it->second, note);
    }
    return it->second;
  }
  ValueId op(Op op, std::vector<ValueId> operands, std::string note, AttrMap attrs = {}) {
    ValueId v = g_.add_node_at(op, std::move(operands), std::move(attrs), "", "");
    g_.set_note(v, std::move(note));
    return v;
  }
  ValueId add(ValueId a, ValueId b, std::string note) { return op(Op::Add, {a, b}, std::move(note)); }
  ValueId sub(ValueId a, ValueId b, std::string note) { return op(Op::Sub, {a, b}, std::move(note)); }
  ValueId mul(ValueId a, ValueId b, std::string note) { return op(Op::Mul, {a, b}, std::move(note)); }
  ValueId div(ValueId a, ValueId b, std::string note) { return op(Op::Div, {a, b}, std::move(note)); }

 private:
  Graph& g_;
  DType dtype_;
  std::map<std::pair<DType, uint64_t>, ValueId> constants_;
};

// One parameter's update: its value, gradient and optimizer state inputs (in the order of
// optimizer_state_names); fills the next values of the parameter and of that state.
struct ParamUpdate {
  std::string name;
  ValueId param, grad;
  std::vector<ValueId> state;
  ValueId param_next;
  std::vector<ValueId> state_next;
};

// The hyper-parameters other than lr are f64 state scalars (see train_step.h); what the
// update uses is derived in f64 and then cast to the parameters' dtype, so that the update
// is bitwise the one the constants gave (1 - beta1 rounded once, from the double).
struct HyperParameters {
  Emitter& e;
  std::map<std::string, ValueId> inputs;  // by name: the f64 state inputs
  // Whether the step has this hyper-parameter (terms whose value was 0 are left out).
  bool has(const std::string& name) const { return inputs.count(name) != 0; }
  ValueId in_dtype(ValueId v, const std::string& note, DType dtype) {
    return e.op(Op::Cast, {v}, note, {{"dtype", dtype}});
  }
  // cast(NAME) and cast(1 - NAME) in the parameters' dtype.
  ValueId value(const std::string& name, const std::string& note, DType dtype) {
    return in_dtype(inputs.at(name), note, dtype);
  }
  ValueId one_minus(const std::string& name, const std::string& note, DType dtype) {
    ValueId d = e.sub(e.constant(1.0, "", DType::f64), inputs.at(name), note + " (f64)");
    return in_dtype(d, note, dtype);
  }
};

void emit_sgd(Emitter& e, HyperParameters& h, const SGD& o, DType dtype, ValueId step, ValueId lr,
              std::vector<ParamUpdate>& ps) {
  ValueId first, momentum, damp;
  if (o.momentum != 0.0) {
    ValueId zero = e.constant(0, "", DType::i32);
    first = e.op(Op::Eq, {step, zero}, "sgd: first step? (the momentum buffer starts as the gradient)");
    momentum = h.value("momentum", "sgd: momentum", dtype);
    if (h.has("dampening")) damp = h.one_minus("dampening", "sgd: 1 - dampening", dtype);
  }
  ValueId wd;
  if (h.has("weight_decay")) wd = h.value("weight_decay", "sgd: weight_decay", dtype);
  for (ParamUpdate& p : ps) {
    std::string of = " of %" + p.name;
    ValueId g = p.grad;
    if (wd.valid()) {
      ValueId decay = e.mul(wd, p.param, "sgd: weight_decay * %" + p.name);
      g = e.add(g, decay, "sgd: gradient + weight decay" + of);
    }
    if (momentum.valid()) {
      ValueId decayed = e.mul(momentum, p.state[0], "sgd: momentum * buffer" + of);
      ValueId scaled = damp.valid() ? e.mul(damp, g, "sgd: (1 - dampening) * gradient" + of) : g;
      ValueId later = e.add(decayed, scaled, "sgd: momentum buffer after the first step" + of);
      ValueId buf = e.op(Op::Select, {first, g, later}, "sgd: momentum buffer" + of);
      p.state_next = {buf};
      if (o.nesterov) {
        ValueId ahead = e.mul(momentum, buf, "sgd: momentum * buffer (nesterov)" + of);
        g = e.add(g, ahead, "sgd: nesterov direction" + of);
      } else {
        g = buf;
      }
    }
    ValueId delta = e.mul(lr, g, "sgd: lr * direction" + of);
    p.param_next = e.sub(p.param, delta, "sgd update" + of);
  }
}

void emit_adam(Emitter& e, HyperParameters& h, bool decoupled, DType dtype, ValueId t_plus_1, ValueId lr,
               std::vector<ParamUpdate>& ps) {
  const std::string opt = decoupled ? "adamw" : "adam";
  const std::string on = opt + ": ";
  // Scalars shared by every parameter.
  ValueId one = e.constant(1.0, "");
  ValueId beta1 = h.value("beta1", on + "beta1", dtype);
  ValueId beta2 = h.value("beta2", on + "beta2", dtype);
  ValueId one_minus_beta1 = h.one_minus("beta1", on + "1 - beta1", dtype);
  ValueId one_minus_beta2 = h.one_minus("beta2", on + "1 - beta2", dtype);
  ValueId eps = h.value("eps", on + "eps", dtype);
  ValueId t = e.op(Op::Cast, {t_plus_1}, on + "t = step + 1", {{"dtype", dtype}});
  ValueId beta1_t = e.op(Op::Pow, {beta1, t}, on + "beta1^t");
  ValueId bc1 = e.sub(one, beta1_t, on + "bias correction 1 - beta1^t");
  ValueId beta2_t = e.op(Op::Pow, {beta2, t}, on + "beta2^t");
  ValueId bc2 = e.sub(one, beta2_t, on + "bias correction 1 - beta2^t");
  ValueId step_size = e.div(lr, bc1, on + "step size lr / (1 - beta1^t)");
  ValueId bc2_sqrt = e.op(Op::Sqrt, {bc2}, on + "sqrt(1 - beta2^t)");
  ValueId wd, shrink;
  if (h.has("weight_decay")) wd = h.value("weight_decay", on + "weight_decay", dtype);
  if (decoupled && wd.valid()) {
    ValueId lr_wd = e.mul(lr, wd, on + "lr * weight_decay");
    shrink = e.sub(one, lr_wd, on + "decoupled decay factor 1 - lr * weight_decay");
  }

  for (ParamUpdate& p : ps) {
    std::string of = " of %" + p.name;
    ValueId g = p.grad, base = p.param;
    if (!wd.valid()) {
    } else if (!decoupled) {
      ValueId decay = e.mul(wd, p.param, on + "weight_decay * %" + p.name);
      g = e.add(g, decay, on + "gradient + L2 weight decay" + of);
    } else {
      base = e.mul(p.param, shrink, on + "decoupled weight decay" + of);
    }
    ValueId m_old = e.mul(beta1, p.state[0], on + "beta1 * m" + of);
    ValueId m_new = e.mul(one_minus_beta1, g, on + "(1 - beta1) * gradient" + of);
    ValueId m = e.add(m_old, m_new, on + "first moment" + of);
    ValueId v_old = e.mul(beta2, p.state[1], on + "beta2 * v" + of);
    ValueId g2 = e.mul(g, g, on + "gradient^2" + of);
    ValueId v_new = e.mul(one_minus_beta2, g2, on + "(1 - beta2) * gradient^2" + of);
    ValueId v = e.add(v_old, v_new, on + "second moment" + of);
    ValueId sqrt_v = e.op(Op::Sqrt, {v}, on + "sqrt(v)" + of);
    ValueId corrected = e.div(sqrt_v, bc2_sqrt, on + "sqrt(v) / sqrt(1 - beta2^t)" + of);
    ValueId denom = e.add(corrected, eps, on + "denominator" + of);
    ValueId ratio = e.div(m, denom, on + "m / denominator" + of);
    ValueId delta = e.mul(step_size, ratio, on + "step" + of);
    p.param_next = e.sub(base, delta, opt + " update" + of);
    p.state_next = {m, v};
  }
}

// The hyper-parameters held as f64 state, in input order, with their initial values.
// Weight decay and dampening are left out when 0 (unless keep_zero_terms): each costs a pass
// over every parameter per step that the fuser cannot merge into the update.
std::vector<std::pair<std::string, double>> hyper_parameters(const Optimizer& optimizer, bool keep_zero_terms) {
  std::vector<std::pair<std::string, double>> out;
  auto optional = [&](const char* name, double v) {
    if (v != 0.0 || keep_zero_terms) out.emplace_back(name, v);
  };
  if (const SGD* s = std::get_if<SGD>(&optimizer)) {
    if (s->momentum != 0.0) {
      out.emplace_back("momentum", s->momentum);
      optional("dampening", s->dampening);
    }
    optional("weight_decay", s->weight_decay);
    return out;
  }
  std::visit(
      [&](const auto& o) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(o)>, SGD>) {
          out = {{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}};
          optional("weight_decay", o.weight_decay);
        }
      },
      optimizer);
  return out;
}

}  // namespace

TrainStep make_train_step(const Graph& model, const Optimizer& optimizer,
                          const TrainStepOptions& options) {
  check_optimizer(optimizer);
  verify(model);
  const std::string where = "model @" + model.name();

  // The loss.
  ValueId loss = model.find_output(options.loss);
  if (!loss.valid()) {
    std::string outs;
    for (const GraphOutput& o : model.outputs()) outs += (outs.empty() ? "" : ", ") + o.name;
    fail(where + " has no output '" + options.loss + "' to minimize (" +
         (outs.empty() ? "it has no outputs" : "its outputs: " + outs) + ")");
  }
  if (model.type(loss).rank() != 0 || !is_float(model.type(loss).dtype))
    fail("loss '" + options.loss + "' of " + where + " must be a float scalar (f32[] or f64[]), got " +
         model.type(loss).str());

  // Parameters: float state inputs the model does not update itself (an output "X.next" of
  // the model makes X a buffer, like batch-norm statistics, whose update the model owns).
  std::vector<const GraphInput*> params;
  for (const GraphInput& in : model.inputs()) {
    const Value& v = model.value(in.value);
    if (in.is_state && is_float(v.type.dtype) && !model.find_output(update_name(v.name)).valid())
      params.push_back(&in);
  }
  if (params.empty()) {
    // Float state the model already updates itself: a step made twice, or only buffers.
    std::string updated;
    for (const GraphInput& in : model.inputs()) {
      const Value& v = model.value(in.value);
      if (in.is_state && is_float(v.type.dtype))
        updated += (updated.empty() ? "" : ", ") + update_name(v.name);
    }
    if (!updated.empty())
      fail(where + " has no parameters to train: it already returns " + updated + " for its float state, " +
           "so it updates that state itself (is it a training step already? make the step from the model)");
    fail(where + " has no float state inputs (parameters) to train");
  }
  const DType dtype = model.type(params[0]->value).dtype;
  for (const GraphInput* p : params)
    if (model.type(p->value).dtype != dtype)
      fail("parameters of " + where + " mix dtypes (%" + model.value(params[0]->value).name + " is " +
           std::string(dtype_name(dtype)) + ", %" + model.value(p->value).name + " is " +
           std::string(dtype_name(model.type(p->value).dtype)) + "); one learning rate needs one dtype");

  // The names the step adds must be free.
  std::vector<std::string> added;
  for (const GraphInput* p : params)
    for (std::string& s : optimizer_state_names(optimizer, model.value(p->value).name))
      added.push_back(std::move(s));
  added.push_back("step");
  added.push_back("lr");
  if (options.data_parallel) added.push_back("data_parallel.weight");
  for (auto& [name, value] : hyper_parameters(optimizer, options.keep_zero_terms)) added.push_back(name);
  for (const std::string& name : added) {
    if (model.find(name).valid())
      fail(where + " already has a value named '%" + name +
           "', which the training step adds as optimizer state; rename it");
    if (model.find_output(name).valid() || model.find_output(update_name(name)).valid())
      fail(where + " already has an output named '" +
           (model.find_output(name).valid() ? name : update_name(name)) +
           "', which the training step adds; rename it");
  }

  TrainStep result;
  Graph& g = result.graph;
  g.set_name(model.name() + "_train_step");
  g.set_fixed_batch(model.fixed_batch());

  // The model, copied: inputs in order, then every node with the same attributes, names,
  // notes and source lines.
  std::vector<ValueId> map(model.values().size());
  for (const GraphInput& in : model.inputs()) {
    const Value& v = model.value(in.value);
    map[in.value.id] = g.add_input(v.name, v.type, in.is_state);
  }
  for (const Node& n : model.nodes()) {
    if (n.op == Op::Fused)
      fail(where + " has a fused node; fused graphs cannot be differentiated: differentiate (grad / "
           "train-step) before fusing (opt)");
    if (n.results.size() != 1)
      fail(where + ": node %" + model.value(n.results[0]).name + " (" + std::string(op_name(n.op)) +
           ") has " + std::to_string(n.results.size()) + " results; train before fusing");
    std::vector<ValueId> operands;
    for (ValueId v : n.operands) operands.push_back(map[v.id]);
    ValueId r = g.add_node_at(n.op, std::move(operands), n.attrs, model.value(n.result()).name,
                              n.location);
    if (!n.note.empty()) g.set_note(r, n.note);
    map[n.result().id] = r;
  }
  result.nodes.forward = g.nodes().size();

  // Optimizer state, "step" and "lr".
  std::vector<ParamUpdate> updates;
  for (const GraphInput* p : params) {
    ParamUpdate u;
    u.name = model.value(p->value).name;
    u.param = map[p->value.id];
    const TensorType& type = model.type(p->value);
    for (const std::string& s : optimizer_state_names(optimizer, u.name)) {
      u.state.push_back(g.add_input(s, type, /*is_state=*/true));
      result.initial_values.emplace(s, Tensor::splat(Tensor(type.dtype, {}), type.shape));
    }
    updates.push_back(std::move(u));
  }
  ValueId step = g.add_input("step", {DType::i32, {}}, true);
  result.initial_values.emplace("step", Tensor::scalar(DType::i32, 0));
  ValueId lr = g.add_input("lr", {dtype, {}}, true);
  result.initial_values.emplace("lr", learning_rate(optimizer, dtype));
  std::vector<ValueId> hyper_inputs;
  for (const auto& [name, value] : hyper_parameters(optimizer, options.keep_zero_terms)) {
    hyper_inputs.push_back(g.add_input(name, {DType::f64, {}}, true));
    result.initial_values.emplace(name, Tensor::scalar(DType::f64, value));
    result.hyper_parameters.push_back(name);
  }

  // The backward pass.
  std::vector<ValueId> wrt;
  for (const ParamUpdate& u : updates) wrt.push_back(u.param);
  std::vector<ValueId> grads = append_gradients(g, map[loss.id], wrt, &result.warnings);
  KILN_CHECK(grads.size() == updates.size(), "append_gradients returned a wrong count");
  size_t before_optimizer = g.nodes().size();
  result.nodes.backward = before_optimizer - result.nodes.forward;

  // The optimizer.
  Emitter e(g, dtype);
  HyperParameters h{e, {}};
  for (ValueId v : hyper_inputs) h.inputs.emplace(g.value(v).name, v);
  for (size_t i = 0; i < updates.size(); ++i) {
    ParamUpdate& u = updates[i];
    u.grad = grads[i];
    const TensorType& pt = g.type(u.param);
    const TensorType& gt = g.type(u.grad);
    if (gt.dtype != pt.dtype || gt.numel() > pt.numel())
      internal_error("grad type", "gradient of %" + u.name + " is " + gt.str() + " for a " + pt.str());
    if (gt.shape != pt.shape)  // a splat zero for a parameter the loss ignores
      u.grad = e.op(Op::BroadcastTo, {u.grad}, "gradient of %" + u.name + " (unused)",
                    {{"shape", pt.shape}});
  }
  // Data-parallel: each rank's gradient weighted by its share of the global batch, summed
  // over the ranks in buckets.
  ValueId dp_weight;
  // Sums `vs` over the ranks with one all_reduce, each weighted by this rank's share: flattened
  // and concatenated, those of a multiple of 16 elements first (each then starts 64-byte
  // aligned in the bucket, where the memory plan can have its product written in place
  // instead of copied in by the concat; the order otherwise kept), summed, and sliced back;
  // a value alone is summed as it is. The notes name value i `what` + labels[i] and the
  // bucket "a bucket of `kind` (labels...)". The summed values, in the order of `vs`.
  auto sum_over_ranks = [&](const std::vector<ValueId>& vs, const std::vector<std::string>& labels,
                            const std::string& what, const std::string& kind) {
    std::vector<std::string> whats;
    std::string names;
    for (const std::string& l : labels) {
      whats.push_back(what + l);
      names += (names.empty() ? "" : ", ") + l;
    }
    std::vector<ValueId> shares;
    for (size_t i = 0; i < vs.size(); ++i)
      shares.push_back(e.mul(dp_weight, vs[i], "data parallel: this rank's share of " + whats[i]));
    if (vs.size() == 1) return std::vector<ValueId>{e.op(Op::AllReduce, {shares[0]}, "data parallel: " + whats[0] + " over the ranks")};
    std::vector<size_t> order(vs.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_partition(order.begin(), order.end(), [&](size_t i) { return g.type(vs[i]).numel() % 16 == 0; });
    std::vector<ValueId> flat;
    for (size_t i : order) {
      ValueId share = shares[i];
      if (g.type(share).rank() != 1)
        share = e.op(Op::Reshape, {share}, "data parallel: " + whats[i] + " flattened",
                     {{"shape", std::vector<int64_t>{g.type(share).numel()}}});
      flat.push_back(share);
    }
    ValueId joined = e.op(Op::Concat, flat, "data parallel: a bucket of " + kind + " (" + names + ")", {{"axis", int64_t{0}}});
    ValueId summed = e.op(Op::AllReduce, {joined}, "data parallel: the bucket over the ranks");
    std::vector<ValueId> out(vs.size());
    int64_t at = 0;
    for (size_t i : order) {
      const TensorType t = g.type(vs[i]);  // a copy: emitting adds values
      const int64_t n = t.numel();
      ValueId piece = e.op(Op::Slice, {summed}, "data parallel: " + whats[i] + " summed",
                           {{"start", std::vector<int64_t>{at}}, {"stop", std::vector<int64_t>{at + n}},
                            {"step", std::vector<int64_t>{1}}});
      out[i] = t.rank() == 1 ? piece
                             : e.op(Op::Reshape, {piece}, "data parallel: " + whats[i] + " summed", {{"shape", t.shape}});
      at += n;
    }
    return out;
  };
  if (options.data_parallel) {
    if (options.bucket_bytes < 1 || options.first_bucket_bytes < 1)
      fail("data_parallel: bucket_bytes and first_bucket_bytes must be at least 1");
    dp_weight = g.add_input("data_parallel.weight", {dtype, {}}, true);
    result.initial_values.emplace("data_parallel.weight", Tensor::scalar(dtype, 1.0));
    std::vector<size_t> bucket;  // indices into updates
    int64_t bytes = 0, cap = std::min(options.first_bucket_bytes, options.bucket_bytes);
    auto flush = [&] {
      if (bucket.empty()) return;
      std::vector<ValueId> grads;
      std::vector<std::string> labels;
      for (size_t i : bucket) {
        grads.push_back(updates[i].grad);
        labels.push_back("%" + updates[i].name);
      }
      std::vector<ValueId> summed = sum_over_ranks(grads, labels, "the gradient of ", "gradients");
      for (size_t k = 0; k < bucket.size(); ++k) updates[bucket[k]].grad = summed[k];
      bucket.clear();
      bytes = 0;
      cap = options.bucket_bytes;
    };
    for (size_t i = updates.size(); i-- > 0;) {
      const TensorType& t = g.type(updates[i].grad);
      const int64_t b = t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
      if (!bucket.empty() && bytes + b > cap) flush();
      bucket.push_back(i);
      bytes += b;
    }
    flush();
  }
  ValueId one_step = e.constant(1, "", DType::i32);
  ValueId step_next = e.add(step, one_step, "step + 1");
  std::visit(
      [&](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, SGD>) emit_sgd(e, h, o, dtype, step, lr, updates);
        else emit_adam(e, h, std::is_same_v<T, AdamW>, dtype, step_next, lr, updates);
      },
      optimizer);
  result.nodes.optimizer = g.nodes().size() - before_optimizer;

  // Outputs: the loss, the model's other outputs, then every state input's next value.
  // Data-parallel: float scalars and the model's own float state updates (batch norm's
  // running statistics) over the ranks, one all_reduce per dtype: they are all made by the
  // forward pass, so their sum starts before the backward pass (ResNet-18's 42 would each
  // be a message of their own).
  std::vector<std::pair<std::string, ValueId>> model_outputs{{options.loss, map[loss.id]}};
  for (const GraphOutput& o : model.outputs())
    if (o.name != options.loss) model_outputs.emplace_back(o.name, map[o.value.id]);
  if (options.data_parallel) {
    std::map<DType, std::vector<size_t>> by_dtype;  // the outputs summed over the ranks
    for (size_t i = 0; i < model_outputs.size(); ++i) {
      const auto& [name, v] = model_outputs[i];
      const TensorType& t = g.type(v);
      if (is_float(t.dtype) &&
          (t.rank() == 0 || (name.ends_with(".next") && model.find(name.substr(0, name.size() - 5)).valid())))
        by_dtype[t.dtype].push_back(i);
    }
    for (const auto& [dt, members] : by_dtype) {
      std::vector<ValueId> vs;
      std::vector<std::string> labels;
      for (size_t i : members) {
        vs.push_back(model_outputs[i].second);
        labels.push_back("'" + model_outputs[i].first + "'");
      }
      std::vector<ValueId> summed = sum_over_ranks(vs, labels, "", "outputs");
      for (size_t k = 0; k < members.size(); ++k) model_outputs[members[k]].second = summed[k];
    }
  }
  for (const auto& [name, v] : model_outputs) g.add_output(name, v);
  size_t next_param = 0;
  for (const GraphInput& in : model.inputs()) {
    if (!in.is_state) continue;
    const std::string& name = model.value(in.value).name;
    if (next_param < updates.size() && updates[next_param].name == name)
      g.add_output(update_name(name), updates[next_param++].param_next);
    else if (!model.find_output(update_name(name)).valid())
      g.add_output(update_name(name), map[in.value.id]);  // state the model never changes
  }
  for (const ParamUpdate& u : updates)
    for (size_t k = 0; k < u.state.size(); ++k)
      g.add_output(update_name(g.value(u.state[k]).name), u.state_next[k]);
  g.add_output(update_name("step"), step_next);
  g.add_output(update_name("lr"), lr);
  for (ValueId v : hyper_inputs) g.add_output(update_name(g.value(v).name), v);
  if (dp_weight.valid()) g.add_output(update_name("data_parallel.weight"), dp_weight);

  verify(g);
  return result;
}

TensorMap TrainStep::initial_state() const {
  TensorMap out;
  for (const auto& [name, value] : initial_values) out.emplace(name, value.materialized());
  return out;
}

}  // namespace kiln
