// Scheduling and memory planning (passes/schedule.h, passes/memory_plan.h) and the
// independent checker (passes/check_memory_plan.h): hand-built graphs whose best plans are
// known, report figures worked out by hand, deliberately corrupted plans the checker must
// reject, schedules that cut peak memory, and random graphs and whole training steps
// planned and checked.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <iostream>
#include <random>

#include "codegen/executable.h"
#include "frontend/losses.h"
#include "frontend/nn.h"
#include "frontend/trace.h"
#include "ir/interp.h"
#include "ir/printer.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "passes/pipeline.h"
#include "passes/schedule.h"
#include "passes/train_step.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }
const AttrMap kTranspose{{"perm", std::vector<int64_t>{1, 0}}};
constexpr int64_t kTile = 16 * 16 * 4;  // bytes of an f32[16,16]

MemoryPlan plan(const Graph& g) {
  MemoryPlan p = plan_memory(g, PassOptions{});
  check_memory_plan(g, p);
  return p;
}

bool same_buffer(const MemoryPlan& p, ValueId a, ValueId b) {
  return p.at(a).kind == BufferKind::Arena && p.at(a).buffer == p.at(b).buffer;
}

// Moves value v's whole buffer to `offset` (keeping the plan's bookkeeping consistent, so
// the checker objects to the placement itself).
void move_buffer(MemoryPlan& p, ValueId v, int64_t offset) {
  Buffer& b = p.buffers.at(p.at(v).buffer);
  b.offset = offset;
  for (ValueId m : b.values) p.values[m.id].offset = offset + p.values[m.id].within;
}

// x -> transpose -> transpose -> transpose -> transpose -> out: no node is elementwise, so
// nothing is in place, and two buffers ping-pong.
Graph transpose_chain(std::vector<ValueId>* t = nullptr) {
  Graph g("chain");
  ValueId v = g.add_input("x", f32({16, 16}));
  for (int i = 0; i < 4; ++i) {
    v = g.add_node(Op::Transpose, {v}, kTranspose);
    if (t) t->push_back(v);
  }
  g.add_output("out", v);
  return g;
}

// A state update: w.next = w - g * 0.1, with another reader of w (mul) before it, or, with
// `late_reader`, after it.
Graph state_update(bool late_reader, ValueId* next = nullptr, ValueId* w_out = nullptr) {
  Graph g("update");
  ValueId w = g.add_input("w", f32({16}), /*is_state=*/true);
  ValueId grad = g.add_input("g", f32({16}));
  ValueId c = g.add_constant(Tensor::scalar(DType::f32, 0.1));
  ValueId reader;
  if (!late_reader) reader = g.add_node(Op::Mul, {w, grad});
  ValueId step = g.add_node(Op::Mul, {grad, c});
  ValueId wn = g.add_node(Op::Sub, {w, step});
  if (late_reader) reader = g.add_node(Op::Mul, {w, grad});
  ValueId loss = g.add_node(Op::Sum, {reader}, {{"axes", std::vector<int64_t>{}}});
  g.add_output("loss", loss);
  g.add_output("w.next", wn);
  if (next) *next = wn;
  if (w_out) *w_out = w;
  return g;
}

// Seeded random graphs: elementwise ops (some broadcasting, some changing dtype), matmuls,
// transposes, reductions, constants, fused elementwise nodes with one or two results, and
// state updates placed anywhere (so some cannot go in place).
Graph random_graph(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  Graph g("random" + std::to_string(seed));
  std::vector<ValueId> pool = {g.add_input("x", f32({8, 16})), g.add_input("y", f32({16, 32})),
                               g.add_input("z", f32({32, 8}))};
  const ValueId w = g.add_input("w", f32({16, 16}), true), b = g.add_input("b", f32({32}), true);
  pool.push_back(w);
  pool.push_back(b);
  auto shape = [&](ValueId v) { return g.type(v).shape; };
  auto with_shape = [&](const Shape& s) {
    std::vector<ValueId> out;
    for (ValueId v : pool)
      if (shape(v) == s) out.push_back(v);
    return out;
  };
  const int steps = 8 + static_cast<int>(pick(30));
  const int w_at = static_cast<int>(pick(steps)), b_at = static_cast<int>(pick(steps));
  ValueId w_next, b_next;
  for (int s = 0; s < steps; ++s) {
    if (s == w_at) {
      std::vector<ValueId> c = with_shape({16, 16});
      w_next = g.add_node(Op::Sub, {w, c[pick(c.size())]});
    }
    if (s == b_at) {
      std::vector<ValueId> c = with_shape({32});
      b_next = g.add_node(Op::Mul, {c[pick(c.size())], b});
    }
    ValueId a = pool[pick(pool.size())];
    const Shape sa = shape(a);
    switch (pick(9)) {
      case 0: {
        const Op unary[] = {Op::Relu, Op::Neg, Op::Tanh, Op::Sigmoid};
        pool.push_back(g.add_node(unary[pick(4)], {a}));
        break;
      }
      case 1: {
        std::vector<ValueId> c = with_shape(sa);
        const Op binary[] = {Op::Add, Op::Mul, Op::Sub, Op::Maximum};
        pool.push_back(g.add_node(binary[pick(4)], {a, c[pick(c.size())]}));
        break;
      }
      case 2: {  // broadcast a vector over the rows of a matrix
        if (sa.size() != 2) break;
        std::vector<ValueId> c = with_shape({sa[1]});
        if (c.empty()) c.push_back(g.add_node(Op::Sum, {a}, {{"axes", std::vector<int64_t>{0}}}));
        pool.push_back(g.add_node(Op::Add, {a, c[pick(c.size())]}));
        break;
      }
      case 3: {
        if (sa.size() != 2) break;
        std::vector<ValueId> c;
        for (ValueId v : pool)
          if (shape(v).size() == 2 && shape(v)[0] == sa[1]) c.push_back(v);
        if (!c.empty()) pool.push_back(g.add_node(Op::Matmul, {a, c[pick(c.size())]}));
        break;
      }
      case 4:
        if (sa.size() == 2) pool.push_back(g.add_node(Op::Transpose, {a}, kTranspose));
        break;
      case 5:
        if (sa.size() == 2)
          pool.push_back(g.add_node(Op::Sum, {a}, {{"axes", std::vector<int64_t>{int64_t(pick(2))}}}));
        break;
      case 6: {
        ValueId c = g.add_constant(Tensor::scalar(DType::f32, 0.5));
        pool.push_back(g.add_node(Op::Mul, {a, c}));
        break;
      }
      case 7: {  // a fused elementwise node, one or two results
        std::vector<ValueId> c = with_shape(sa);
        ValueId other = c[pick(c.size())];
        Graph body("f");
        ValueId p = body.add_input("p", g.type(a)), q = body.add_input("q", g.type(other));
        ValueId t = body.add_node(Op::Add, {p, q});
        body.add_output("t", t);
        if (pick(2)) body.add_output("u", body.add_node(Op::Mul, {t, p}));
        for (ValueId r : g.add_fused({a, other}, std::move(body))) pool.push_back(r);
        break;
      }
      case 8: {  // through i32 and back (4 bytes either way) and a bool mask
        ValueId i = g.add_node(Op::Cast, {a}, {{"dtype", DType::i32}});
        ValueId f = g.add_node(Op::Cast, {i}, {{"dtype", DType::f32}});
        ValueId m = g.add_node(Op::Gt, {f, a});
        pool.push_back(g.add_node(Op::Select, {m, f, a}));
        break;
      }
    }
  }
  const size_t outputs = 1 + pick(3);
  for (size_t i = 0; i < outputs; ++i) g.add_output("out" + std::to_string(i), pool[pick(pool.size())]);
  g.add_output("w.next", w_next);
  g.add_output("b.next", b_next);
  verify(g);
  return g;
}

TensorMap random_inputs(const Graph& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  TensorMap m;
  for (const GraphInput& in : g.inputs()) {
    Tensor t(g.type(in.value).dtype, g.type(in.value).shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
    m[g.value(in.value).name] = t;
  }
  return m;
}

Graph train_step_of(bool cnn) {
  Tracer t(cnn ? "lenet" : "mlp");
  nn::Scope s(t, 1);
  Sym x = t.input("x", {DType::f32, cnn ? Shape{64, 1, 28, 28} : Shape{64, 784}});
  Sym y = t.input("y", {DType::i32, {64}});
  Sym logits = cnn ? nn::lenet(s)(x) : nn::mlp(s, {784, 256, 10})(x);
  t.output("loss", nn::cross_entropy(logits, y));
  return make_train_step(t.finish(), SGD{.lr = 0.1, .momentum = 0.9}).graph;
}

}  // namespace

TEST_CASE("memory plan: a chain of non-elementwise nodes ping-pongs two buffers", "[memory_plan]") {
  std::vector<ValueId> t;
  Graph g = transpose_chain(&t);
  MemoryPlan p = plan(g);
  CHECK(p.report.arena_bytes == 2 * kTile);
  CHECK(p.report.peak_live_bytes == 2 * kTile);
  CHECK(p.report.value_bytes == 4 * kTile);
  CHECK(p.report.buffer_count == 4);
  CHECK(p.report.in_place_values == 0);
  CHECK(p.at(t[0]).offset == p.at(t[2]).offset);
  CHECK(p.at(t[1]).offset == p.at(t[3]).offset);
  CHECK(p.at(t[0]).offset != p.at(t[1]).offset);
  CHECK(p.at(t[0]).start == 0);
  CHECK(p.at(t[0]).end == 1);
  CHECK(p.at(t[3]).end == 4);  // an output: live to the end
  CHECK(p.at(g.inputs()[0].value).kind == BufferKind::Input);
}

TEST_CASE("memory plan: an elementwise chain runs in one buffer, in place", "[memory_plan]") {
  Graph g("ew");
  ValueId x = g.add_input("x", f32({16, 16}));
  ValueId a = g.add_node(Op::Relu, {x});
  ValueId b = g.add_node(Op::Neg, {a});
  ValueId c = g.add_node(Op::Exp, {b});
  g.add_output("out", c);
  MemoryPlan p = plan(g);
  CHECK(p.report.arena_bytes == kTile);
  CHECK(p.report.buffer_count == 1);
  CHECK(p.report.in_place_values == 2);
  CHECK(p.buffers[0].values == std::vector<ValueId>{a, b, c});
  CHECK(p.buffers[0].start == 0);
  CHECK(p.buffers[0].end == 3);
}

TEST_CASE("memory plan: a diamond", "[memory_plan]") {
  Graph g("diamond");
  ValueId x = g.add_input("x", f32({16, 16}));
  ValueId a = g.add_node(Op::Exp, {x});                  // 0: live 0..2
  ValueId b = g.add_node(Op::Transpose, {a}, kTranspose);  // 1: live 1..3
  ValueId c = g.add_node(Op::Transpose, {a}, kTranspose);  // 2: live 2..3
  ValueId d = g.add_node(Op::Add, {b, c});                // 3: in place over b
  g.add_output("out", d);
  MemoryPlan p = plan(g);
  CHECK(same_buffer(p, b, d));
  CHECK_FALSE(same_buffer(p, c, d));
  CHECK(p.report.buffer_count == 3);
  CHECK(p.report.peak_live_bytes == 3 * kTile);  // a, b, c at node 2
  CHECK(p.report.arena_bytes == 3 * kTile);
  CHECK(p.report.value_bytes == 4 * kTile);
}

TEST_CASE("memory plan: in place only over a dying, same-shaped arena operand", "[memory_plan]") {
  Graph g("inplace");
  ValueId x = g.add_input("x", f32({16, 16}));
  ValueId s = g.add_node(Op::Sum, {x}, {{"axes", std::vector<int64_t>{0}}});  // f32[16]
  ValueId m = g.add_node(Op::Exp, {x});  // over an input: never in place
  ValueId r = g.add_node(Op::Add, {s, m});  // s broadcasts: only m's buffer fits
  ValueId kept = g.add_node(Op::Exp, {r});
  ValueId o = g.add_node(Op::Relu, {kept});  // kept is an output: not overwritten
  ValueId e = g.add_node(Op::Cast, {o}, {{"dtype", DType::i32}});  // 4 bytes: in place
  ValueId k = g.add_node(Op::Gt, {e, e});    // bool: 1 byte, a new buffer
  g.add_output("kept", kept);
  g.add_output("k", k);
  MemoryPlan p = plan(g);
  CHECK(p.at(x).kind == BufferKind::Input);
  CHECK_FALSE(same_buffer(p, x, m));
  CHECK(same_buffer(p, m, r));
  CHECK(same_buffer(p, r, kept));
  CHECK_FALSE(same_buffer(p, kept, o));
  CHECK(same_buffer(p, o, e));
  CHECK_FALSE(same_buffer(p, e, k));
  CHECK(p.report.in_place_values == 3);
}

TEST_CASE("memory plan: a reshape is a view of an operand that dies there", "[memory_plan]") {
  Graph g("views");
  ValueId x = g.add_input("x", f32({16, 16}));
  ValueId e = g.add_node(Op::Exp, {x});
  ValueId flat = g.add_node(Op::Reshape, {e}, {{"shape", std::vector<int64_t>{256}}});  // e dies: a view
  ValueId t = g.add_node(Op::Tanh, {flat});
  ValueId kept = g.add_node(Op::Reshape, {t}, {{"shape", std::vector<int64_t>{4, 64}}});  // t read later: a copy
  ValueId u = g.add_node(Op::Sum, {t}, {{"axes", std::vector<int64_t>{0}}});
  ValueId back = g.add_node(Op::Reshape, {kept}, {{"shape", std::vector<int64_t>{2, 128}}});  // an output is not overwritten
  g.add_output("u", u);
  g.add_output("kept", kept);
  g.add_output("back", back);
  MemoryPlan p = plan(g);
  CHECK(same_buffer(p, e, flat));
  CHECK(same_buffer(p, flat, t));
  CHECK_FALSE(same_buffer(p, t, kept));
  CHECK_FALSE(same_buffer(p, kept, back));
  CHECK(can_write_in_place(g, g.nodes()[1], e, flat));
  CHECK_FALSE(can_write_in_place(g, g.nodes()[1], x, flat));  // not its operand
  // A plan that puts a reshape over an operand still read afterwards is rejected.
  MemoryPlan bad = p;
  Buffer& b = bad.buffers.at(bad.at(kept).buffer);
  for (ValueId v : b.values) bad.values[v.id].offset = bad.at(t).offset;
  b.offset = bad.at(t).offset;
  CHECK_THROWS(check_memory_plan(g, bad));
}

TEST_CASE("memory plan: a batch-1 concat's operands are written in their slices of its result", "[memory_plan]") {
  // x -> a, b, c, d (transposes: nothing in place) -> concat(a, b, x, c, c) along axis 1 of
  // [1, 2, 16, 16] tiles, and d after the concat (reading c: c stays out of the result).
  const AttrMap swap{{"perm", std::vector<int64_t>{0, 1, 3, 2}}};
  Graph g("concat");
  ValueId x = g.add_input("x", f32({1, 2, 16, 16}));
  ValueId t = g.add_node(Op::Transpose, {x}, swap);
  ValueId a = g.add_node(Op::Exp, {t});  // in place over t: a chain of two values
  ValueId b = g.add_node(Op::Transpose, {x}, swap);
  ValueId c = g.add_node(Op::Transpose, {x}, swap);
  ValueId cat = g.add_node(Op::Concat, {a, b, x, c, c}, {{"axis", int64_t{1}}});
  ValueId d = g.add_node(Op::Neg, {c});
  g.add_output("cat", cat);
  g.add_output("d", d);
  MemoryPlan p = plan(g);
  const int64_t slice = 2 * kTile;
  // a's chain (t, a) at slice 0, b at slice 1; x (an input), c (read twice, and after the
  // concat) copied.
  CHECK(same_buffer(p, a, cat));
  CHECK(same_buffer(p, t, cat));
  CHECK(same_buffer(p, b, cat));
  CHECK_FALSE(same_buffer(p, c, cat));
  CHECK(p.at(a).offset == p.at(cat).offset);
  CHECK(p.at(t).offset == p.at(cat).offset);
  CHECK(p.at(b).offset == p.at(cat).offset + slice);
  CHECK(p.at(b).within == slice);
  CHECK(p.report.concat_operands == 2);
  CHECK(p.report.in_place_values == 2);  // a over t, d over c
  // The result's buffer lives from t's node on.
  CHECK(p.buffers.at(p.at(cat).buffer).start == 0);
  CHECK_THAT(format_memory_report(p), ContainsSubstring("concat: 2 operands in their slices"));

  SECTION("a plan with an operand off its slice is rejected") {
    MemoryPlan bad = p;
    bad.values[b.id].offset += 64;
    bad.values[b.id].within += 64;
    CHECK_THROWS_WITH(check_memory_plan(g, bad), ContainsSubstring("overlap"));
  }
  SECTION("at batch 2 a slice is not one run of bytes: everything copied") {
    Graph g2("concat2");
    ValueId x2 = g2.add_input("x", f32({2, 2, 16, 16}));
    ValueId a2 = g2.add_node(Op::Transpose, {x2}, swap);
    ValueId b2 = g2.add_node(Op::Transpose, {x2}, swap);
    ValueId cat2 = g2.add_node(Op::Concat, {a2, b2}, {{"axis", int64_t{1}}});
    g2.add_output("cat", cat2);
    MemoryPlan p2 = plan(g2);
    CHECK_FALSE(same_buffer(p2, a2, cat2));
    CHECK_FALSE(same_buffer(p2, b2, cat2));
    CHECK(p2.report.concat_operands == 0);
  }
  SECTION("a slice that starts off the alignment is copied") {
    Graph g3("concat3");
    ValueId x3 = g3.add_input("x", f32({1, 3, 5}));  // 15 floats: the second slice at 60 bytes
    ValueId a3 = g3.add_node(Op::Exp, {x3});
    ValueId b3 = g3.add_node(Op::Tanh, {x3});
    ValueId cat3 = g3.add_node(Op::Concat, {a3, b3}, {{"axis", int64_t{1}}});
    g3.add_output("cat", cat3);
    MemoryPlan p3 = plan(g3);
    CHECK(same_buffer(p3, a3, cat3));
    CHECK_FALSE(same_buffer(p3, b3, cat3));
  }
}

TEST_CASE("memory plan: slices of a value read only by slices are views of it", "[memory_plan]") {
  // x -> s = exp(x) [64] -> a = s[0:16], b = s[16:64] (disjoint contiguous runs, the second
  // at 64 bytes) -> relu(a) (in place over a: a's chain), neg(b), both outputs. Nothing
  // copies a or b.
  auto slice = [](Graph& g, ValueId v, int64_t start, int64_t stop) {
    return g.add_node(Op::Slice, {v}, {{"start", std::vector<int64_t>{start}}, {"stop", std::vector<int64_t>{stop}},
                                       {"step", std::vector<int64_t>{1}}});
  };
  Graph g("views");
  ValueId x = g.add_input("x", f32({64}));
  ValueId sx = g.add_node(Op::Exp, {x});
  ValueId a = slice(g, sx, 0, 16);
  ValueId b = slice(g, sx, 16, 64);
  ValueId ra = g.add_node(Op::Relu, {a});
  ValueId nb = g.add_node(Op::Neg, {b});
  g.add_output("ra", ra);
  g.add_output("nb", nb);
  MemoryPlan p = plan(g);
  CHECK(same_buffer(p, a, sx));
  CHECK(same_buffer(p, b, sx));
  CHECK(p.at(a).offset == p.at(sx).offset);
  CHECK(p.at(b).offset == p.at(sx).offset + 64);
  CHECK(p.report.slice_views == 2);
  CHECK_THAT(format_memory_report(p), ContainsSubstring("slice: 2 results at their runs of the operand"));
  // s's buffer lives until the last view's chain dies.
  CHECK(p.buffers.at(p.at(sx).buffer).end >= p.at(ra).end);
  REQUIRE(contiguous_slice_start(g, *g.defining_node(b)) == 64);
  // The compiled code reads the views in place: the same values as the interpreter.
  Tensor xs(DType::f32, {64});
  for (int64_t i = 0; i < 64; ++i) xs.set(i, std::sin(0.3 * static_cast<double>(i)));
  const TensorMap want = interpret(g, {{"x", xs}});
  const TensorMap got = compile(g, CompileOptions{.target = "cpu"})->run({{"x", xs}});
  for (const char* name : {"ra", "nb"}) {
    REQUIRE(got.at(name).numel() == want.at(name).numel());
    for (int64_t i = 0; i < want.at(name).numel(); ++i) CHECK(got.at(name).get(i) == want.at(name).get(i));
  }

  SECTION("another reader of s: every slice copied") {
    Graph h("views2");
    ValueId hx = h.add_input("x", f32({64}));
    ValueId hs = h.add_node(Op::Exp, {hx});
    ValueId ha = slice(h, hs, 0, 16);
    ValueId hm = h.add_node(Op::Sum, {hs}, {{"axes", std::vector<int64_t>{}}, {"keepdims", false}});
    h.add_output("a", h.add_node(Op::Neg, {ha}));
    h.add_output("m", hm);
    MemoryPlan hp = plan(h);
    CHECK_FALSE(same_buffer(hp, ha, hs));
    CHECK(hp.report.slice_views == 0);
    SECTION("and a plan that makes a view anyway is rejected") {
      MemoryPlan bad = hp;
      move_buffer(bad, ha, bad.at(hs).offset);
      CHECK_THROWS_WITH(check_memory_plan(h, bad), ContainsSubstring("reads it otherwise"));
    }
  }
  SECTION("overlapping or unaligned runs: copied") {
    for (auto [s0, e0, s1, e1] : {std::array<int64_t, 4>{0, 32, 16, 48}, std::array<int64_t, 4>{0, 10, 10, 64}}) {
      Graph h("views3");
      ValueId hx = h.add_input("x", f32({64}));
      ValueId hs = h.add_node(Op::Exp, {hx});
      ValueId h0 = slice(h, hs, s0, e0), h1 = slice(h, hs, s1, e1);
      h.add_output("a", h.add_node(Op::Neg, {h0}));
      h.add_output("b", h.add_node(Op::Neg, {h1}));
      MemoryPlan hp = plan(h);
      CHECK(hp.report.slice_views == 0);
    }
  }
  SECTION("a strided slice is no run") {
    Graph h("views4");
    ValueId hx = h.add_input("x", f32({8, 8}));
    ValueId hs = h.add_node(Op::Exp, {hx});
    ValueId col = h.add_node(Op::Slice, {hs}, {{"start", std::vector<int64_t>{0, 0}}, {"stop", std::vector<int64_t>{8, 4}},
                                               {"step", std::vector<int64_t>{1, 1}}});
    ValueId row = h.add_node(Op::Slice, {hs}, {{"start", std::vector<int64_t>{2, 0}}, {"stop", std::vector<int64_t>{4, 8}},
                                               {"step", std::vector<int64_t>{1, 1}}});
    CHECK_FALSE(contiguous_slice_start(h, *h.defining_node(col)).has_value());
    CHECK(contiguous_slice_start(h, *h.defining_node(row)) == 2 * 8 * 4);
  }
}

TEST_CASE("memory plan: a state update goes into the state's own buffer when legal", "[memory_plan]") {
  ValueId next, w;
  Graph g = state_update(false, &next, &w);
  MemoryPlan p = plan(g);
  CHECK(p.at(w).kind == BufferKind::State);
  CHECK(p.at(next).kind == BufferKind::StateInPlace);
  CHECK(p.at(next).state == w);
  CHECK(p.at(next).offset == -1);
  CHECK(p.report.state_in_place == 1);
  CHECK_THAT(format_memory_plan(g, p), ContainsSubstring("state-in-place  %w"));

  SECTION("not when w is read after the update") {
    Graph late = state_update(true, &next);
    MemoryPlan q = plan(late);
    CHECK(q.at(next).kind == BufferKind::Arena);
    CHECK(q.at(next).end == static_cast<int32_t>(late.nodes().size()));
    // schedule() moves the late reader first, and then it is legal.
    Graph s = schedule(late, PassOptions{});
    MemoryPlan r = plan(s);
    CHECK(r.at(s.find_output("w.next")).kind == BufferKind::StateInPlace);
    CHECK(peak_live_bytes(s) < peak_live_bytes(late));
  }
  SECTION("not when w's old value is an output too") {
    Graph h = state_update(false, &next, &w);
    h.add_output("old_w", w);
    CHECK(plan(h).at(next).kind == BufferKind::Arena);
  }
  SECTION("not when the update reads w other than elementwise") {
    Graph h("matmul_update");
    ValueId ws = h.add_input("w", f32({4, 4}), true);
    ValueId gs = h.add_input("g", f32({4, 4}));
    ValueId reads_w = h.add_node(Op::Matmul, {gs, ws});
    ValueId not_w = h.add_node(Op::Matmul, {gs, gs});
    h.add_output("w.next", reads_w);
    h.add_output("g2", not_w);
    CHECK(plan(h).at(reads_w).kind == BufferKind::Arena);

    Graph h2("matmul_update2");
    ValueId ws2 = h2.add_input("w", f32({4, 4}), true);
    ValueId gs2 = h2.add_input("g", f32({4, 4}));
    ValueId r2 = h2.add_node(Op::Relu, {ws2});
    ValueId n2 = h2.add_node(Op::Matmul, {gs2, gs2});  // does not read w: fine
    h2.add_output("w.next", n2);
    h2.add_output("r", r2);
    CHECK(plan(h2).at(n2).kind == BufferKind::StateInPlace);
  }
  SECTION("a state passed through (w.next = w) needs nothing") {
    Graph h("pass");
    ValueId ws = h.add_input("w", f32({4}), true);
    h.add_output("w.next", ws);
    MemoryPlan q = plan(h);
    CHECK(q.at(ws).kind == BufferKind::State);
    CHECK(q.report.arena_bytes == 0);
    CHECK(q.report.buffer_count == 0);
  }
}

TEST_CASE("memory plan: outputs live to the end", "[memory_plan]") {
  Graph g("outs");
  ValueId x = g.add_input("x", f32({16, 16}));
  ValueId a = g.add_node(Op::Transpose, {x}, kTranspose);  // an output
  ValueId b = g.add_node(Op::Transpose, {a}, kTranspose);
  ValueId c = g.add_node(Op::Transpose, {b}, kTranspose);
  g.add_output("a", a);
  g.add_output("c", c);
  MemoryPlan p = plan(g);
  CHECK(p.at(a).end == 3);
  CHECK(p.at(b).end == 2);
  CHECK(p.report.arena_bytes == 3 * kTile);  // without the rule, c could reuse a
  CHECK(p.report.peak_live_bytes == 3 * kTile);
}

TEST_CASE("memory plan: fused nodes with several results", "[memory_plan]") {
  Graph g("fused");
  ValueId x = g.add_input("x", f32({16, 16}));
  ValueId pv = g.add_node(Op::Exp, {x});
  ValueId qv = g.add_node(Op::Neg, {x});
  Graph body("sum_diff");
  ValueId p = body.add_input("p", f32({16, 16})), q = body.add_input("q", f32({16, 16}));
  body.add_output("s", body.add_node(Op::Add, {p, q}));
  body.add_output("d", body.add_node(Op::Sub, {p, q}));
  std::vector<ValueId> sd = g.add_fused({pv, qv}, std::move(body));
  ValueId y = g.add_node(Op::Mul, {sd[0], sd[1]});
  g.add_output("y", y);
  MemoryPlan p1 = plan(g);
  CHECK(same_buffer(p1, pv, sd[0]));  // each result over its own dying operand
  CHECK(same_buffer(p1, qv, sd[1]));
  CHECK(same_buffer(p1, sd[0], y));
  CHECK(p1.report.buffer_count == 2);
  CHECK(p1.report.arena_bytes == 2 * kTile);
  CHECK(p1.at(sd[0]).offset != p1.at(sd[1]).offset);

  // A body that is not purely elementwise (a matmul) or whose results differ in shape:
  // never in place.
  Graph g2("fused_mm");
  ValueId x2 = g2.add_input("x", f32({16, 16}));
  ValueId a2 = g2.add_node(Op::Exp, {x2});
  Graph mm("mm");
  ValueId m = mm.add_input("m", f32({16, 16}));
  ValueId prod = mm.add_node(Op::Matmul, {m, m});
  mm.add_output("r", mm.add_node(Op::Relu, {prod}));
  ValueId r2 = g2.add_fused({a2}, std::move(mm))[0];
  Graph two("two_shapes");
  ValueId t = two.add_input("t", f32({16, 16}));
  two.add_output("e", two.add_node(Op::Exp, {t}));
  two.add_output("s", two.add_node(Op::Sum, {t}, {{"axes", std::vector<int64_t>{0}}}));
  std::vector<ValueId> es = g2.add_fused({r2}, std::move(two));
  g2.add_output("e", es[0]);
  g2.add_output("s", es[1]);
  MemoryPlan p2 = plan(g2);
  CHECK_FALSE(same_buffer(p2, a2, r2));
  CHECK_FALSE(same_buffer(p2, r2, es[0]));
  CHECK(p2.report.in_place_values == 0);
  CHECK(p2.report.buffer_count == 4);
}

TEST_CASE("memory plan: in place through a fused node's elementwise epilogue", "[memory_plan]") {
  // %r = add(%c, matmul(%a, %b)) fused: the epilogue reads %c elementwise, so %r may take
  // %c's buffer; the raw matmul result, also returned, may not.
  Graph g("gemm");
  ValueId x = g.add_input("x", f32({16, 16}));
  ValueId c = g.add_node(Op::Exp, {x});
  ValueId a = g.add_node(Op::Neg, {x});
  Graph body("gemm_acc");
  ValueId ba = body.add_input("a", f32({16, 16})), bb = body.add_input("b", f32({16, 16}));
  ValueId bc = body.add_input("c", f32({16, 16}));
  ValueId mm = body.add_node(Op::Matmul, {ba, bb});
  body.add_output("mm", mm);
  body.add_output("acc", body.add_node(Op::Add, {bc, mm}));
  std::vector<ValueId> r = g.add_fused({a, a, c}, std::move(body));
  g.add_output("mm", r[0]);
  g.add_output("acc", r[1]);
  MemoryPlan p = plan(g);
  CHECK(same_buffer(p, c, r[1]));
  CHECK_FALSE(same_buffer(p, a, r[0]));  // a feeds the matmul
  CHECK(can_write_in_place(g, g.nodes()[2], c, r[1]));
  CHECK_FALSE(can_write_in_place(g, g.nodes()[2], c, r[0]));  // mm does not come from c
  CHECK_FALSE(can_write_in_place(g, g.nodes()[2], a, r[1]));

  // A bias update in a reduction's epilogue, b.next = b - lr * sum(dy, 0), goes into b's
  // buffer; a body that reduces b itself does not.
  Graph h("bias");
  ValueId b = h.add_input("b", f32({16}), true);
  ValueId dy = h.add_input("dy", f32({8, 16}));
  Graph red("update");
  ValueId rb = red.add_input("b", f32({16})), rdy = red.add_input("dy", f32({8, 16}));
  ValueId db = red.add_node(Op::Sum, {rdy}, {{"axes", std::vector<int64_t>{0}}});
  red.add_output("next", red.add_node(Op::Sub, {rb, db}));
  ValueId next = h.add_fused({b, dy}, std::move(red))[0];
  h.add_output("b.next", next);
  CHECK(plan(h).at(next).kind == BufferKind::StateInPlace);

  Graph h2("bias2");
  ValueId b2 = h2.add_input("b", f32({16}), true);
  Graph red2("center");
  ValueId rb2 = red2.add_input("b", f32({16}));
  ValueId mean = red2.add_node(Op::Mean, {rb2}, {{"axes", std::vector<int64_t>{}}});
  red2.add_output("next", red2.add_node(Op::Sub, {rb2, mean}));
  ValueId next2 = h2.add_fused({b2}, std::move(red2))[0];
  h2.add_output("b.next", next2);
  CHECK(plan(h2).at(next2).kind == BufferKind::Arena);

  // And the checker agrees: forcing it in place is rejected.
  MemoryPlan bad = plan(h2);
  std::vector<ValueId>& members = bad.buffers[bad.at(next2).buffer].values;
  members.erase(std::find(members.begin(), members.end(), next2));
  bad.values[next2.id] = ValuePlan{BufferKind::StateInPlace, 64, 0, 1, -1, -1, b2};
  CHECK_THROWS_WITH(check_memory_plan(h2, bad), ContainsSubstring("other than elementwise"));
}

TEST_CASE("memory plan: the report of a small graph, by hand", "[memory_plan]") {
  Graph g("small");
  ValueId x = g.add_input("x", f32({10}));           // 40 bytes, external
  ValueId a = g.add_node(Op::Exp, {x});              // 0: 40 bytes, live 0..1
  ValueId b = g.add_node(Op::Sum, {a}, {{"axes", std::vector<int64_t>{}}});  // 1: 4 bytes, 1..3
  ValueId c = g.add_constant(Tensor::scalar(DType::f32, 2.0));  // 2: embedded
  ValueId d = g.add_node(Op::Mul, {b, c});           // 3: in place over b, live 3..out
  g.add_output("d", d);
  MemoryPlan p = plan(g);
  // a and {b, d} meet at node 1: offsets 0 and 64 (aligned), arena 128.
  CHECK(p.at(a).offset == 0);
  CHECK(p.at(b).offset == 64);
  CHECK(p.at(d).offset == 64);
  CHECK(p.at(c).kind == BufferKind::Constant);
  CHECK(p.at(d).start == 3);
  CHECK(p.at(d).end == 4);
  const MemoryReport& r = p.report;
  CHECK(r.arena_bytes == 128);
  CHECK(r.value_bytes == 48);       // 40 + 4 + 4
  CHECK(r.peak_live_bytes == 44);   // a and b at node 1
  CHECK(r.buffer_count == 2);
  CHECK(r.in_place_values == 1);
  CHECK(r.input_bytes == 40);
  CHECK(r.constant_bytes == 4);
  const std::string text = format_memory_plan(g, p);
  CHECK_THAT(text, ContainsSubstring("arena: 128 bytes in 2 buffers (alignment 64)"));
  CHECK_THAT(text, ContainsSubstring("sum of values: 48 bytes"));
  CHECK_THAT(text, ContainsSubstring("peak live: 44 bytes"));
  std::cout << text;
  auto line_of = [&](const std::string& name) {
    size_t at = text.find("\n" + name + " ");
    REQUIRE(at != std::string::npos);
    return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  CHECK_THAT(line_of("%x"), ContainsSubstring("f32[10]") && ContainsSubstring("input") && ContainsSubstring("in..0"));
  CHECK_THAT(line_of("%3"), ContainsSubstring("arena") && ContainsSubstring("b1") && ContainsSubstring("3..out"));
  CHECK_THAT(line_of("%2"), ContainsSubstring("constant"));

  // Another alignment.
  MemoryPlan p16 = plan_memory(g, PassOptions{.alignment = 16});
  check_memory_plan(g, p16);
  CHECK(p16.at(b).offset == 48);         // 40 rounded up to 16
  CHECK(p16.report.arena_bytes == 64);  // 52 rounded up to 16
}

TEST_CASE("check_memory_plan rejects corrupted plans", "[memory_plan][check]") {
  std::vector<ValueId> t;
  Graph g = transpose_chain(&t);
  const MemoryPlan good = plan(g);

  SECTION("two values live at once at the same bytes") {
    MemoryPlan p = good;
    move_buffer(p, t[1], p.at(t[0]).offset);  // t0 dies at node 1, where t1 is written: not elementwise
    CHECK_THROWS_AS(check_memory_plan(g, p), InternalError);
    CHECK_THROWS_WITH(check_memory_plan(g, p), ContainsSubstring("%0") && ContainsSubstring("%1") &&
                                                   ContainsSubstring("overlap") && ContainsSubstring("live 0..1"));
  }
  SECTION("a partial overlap") {
    MemoryPlan p = good;
    move_buffer(p, t[3], p.at(t[2]).offset + 64);
    p.report.arena_bytes += 64;
    CHECK_THROWS_WITH(check_memory_plan(g, p), ContainsSubstring("overlap") && ContainsSubstring("%2"));
  }
  SECTION("misaligned") {
    MemoryPlan p = good;
    move_buffer(p, t[1], p.at(t[1]).offset + 4);
    p.report.arena_bytes += 64;
    CHECK_THROWS_WITH(check_memory_plan(g, p), ContainsSubstring("not aligned"));
  }
  SECTION("past the end of the arena") {
    MemoryPlan p = good;
    p.report.arena_bytes -= 64;
    CHECK_THROWS_WITH(check_memory_plan(g, p), ContainsSubstring("past the arena"));
  }
  SECTION("a lifetime cut short") {
    MemoryPlan p = good;
    p.values[t[3].id].end = 3;
    CHECK_THROWS_WITH(check_memory_plan(g, p), ContainsSubstring("planned interval"));
  }
  SECTION("an input planned into the arena") {
    MemoryPlan p = good;
    p.values[g.inputs()[0].value.id].kind = BufferKind::Arena;
    CHECK_THROWS_WITH(check_memory_plan(g, p), ContainsSubstring("expected input"));
  }
  SECTION("illegal in place: the operand is still needed") {
    Graph h("ew");
    ValueId x = h.add_input("x", f32({16, 16}));
    ValueId a = h.add_node(Op::Exp, {x});
    ValueId b = h.add_node(Op::Relu, {a});
    ValueId c = h.add_node(Op::Add, {a, b});  // a is read here, after b is written
    h.add_output("c", c);
    MemoryPlan p = plan(h);
    REQUIRE_FALSE(same_buffer(p, a, b));
    move_buffer(p, b, p.at(a).offset);
    CHECK_THROWS_WITH(check_memory_plan(h, p), ContainsSubstring("overlap"));
  }
  SECTION("illegal in place: two results of one node over one operand") {
    Graph h("fused");
    ValueId x = h.add_input("x", f32({16, 16}));
    ValueId a = h.add_node(Op::Exp, {x});
    Graph body("two");
    ValueId p = body.add_input("p", f32({16, 16}));
    body.add_output("u", body.add_node(Op::Neg, {p}));
    body.add_output("v", body.add_node(Op::Relu, {p}));
    std::vector<ValueId> uv = h.add_fused({a}, std::move(body));
    h.add_output("u", uv[0]);
    h.add_output("v", uv[1]);
    MemoryPlan mp = plan(h);
    REQUIRE(same_buffer(mp, a, uv[0]));
    move_buffer(mp, uv[1], mp.at(a).offset);
    CHECK_THROWS_WITH(check_memory_plan(h, mp), ContainsSubstring("overlap"));
  }
  SECTION("illegal state in place: the state is read later") {
    ValueId next, w;
    Graph h = state_update(true, &next, &w);
    MemoryPlan p = plan(h);
    REQUIRE(p.at(next).kind == BufferKind::Arena);
    p.values[next.id].kind = BufferKind::StateInPlace;
    p.values[next.id].state = w;
    p.values[next.id].offset = -1;
    std::vector<ValueId>& members = p.buffers[p.at(next).buffer].values;
    members.erase(std::find(members.begin(), members.end(), next));
    p.values[next.id].buffer = -1;
    CHECK_THROWS_WITH(check_memory_plan(h, p), ContainsSubstring("reads later") && ContainsSubstring("%w"));
  }
  SECTION("illegal state in place: not that state's output") {
    Graph h("two_states");
    ValueId a = h.add_input("a", f32({4}), true);
    ValueId b = h.add_input("b", f32({4}), true);
    ValueId an = h.add_node(Op::Neg, {a});
    ValueId bn = h.add_node(Op::Neg, {b});
    h.add_output("a.next", an);
    h.add_output("b.next", bn);
    MemoryPlan p = plan(h);
    REQUIRE(p.at(an).state == a);
    p.values[an.id].state = b;
    CHECK_THROWS_WITH(check_memory_plan(h, p), ContainsSubstring("not its output b.next"));
  }
}

TEST_CASE("schedule: a bad order's peak comes down", "[memory_plan][schedule]") {
  // Four exp(x) of 16 KiB each computed first, then reduced: the original order holds all
  // four at once; running each sum right after its exp holds one.
  Graph g("fan");
  ValueId x = g.add_input("x", f32({64, 64}));
  std::vector<ValueId> big, small;
  for (int i = 0; i < 4; ++i) big.push_back(g.add_node(Op::Exp, {x}));
  for (ValueId b : big) small.push_back(g.add_node(Op::Sum, {b}, {{"axes", std::vector<int64_t>{}}}));
  ValueId total = small[0];
  for (int i = 1; i < 4; ++i) total = g.add_node(Op::Add, {total, small[i]});
  g.add_output("total", total);

  Graph s = schedule(g, PassOptions{});
  verify(s);
  CHECK(s.nodes().size() == g.nodes().size());
  CHECK(peak_live_bytes(g) == 4 * 16384 + 4);
  CHECK(peak_live_bytes(s) <= 16384 + 3 * 4);
  MemoryPlan p = plan(s);
  CHECK(p.report.arena_bytes < plan(g).report.arena_bytes);
  TensorMap in = random_inputs(g, 1);
  CHECK(interpret(s, in) == interpret(g, in));
  std::cout << "schedule, fan-out of 4 exp/sum: peak " << peak_live_bytes(g) << " -> " << peak_live_bytes(s)
            << " bytes\n";

  // An order that is already good is kept as it is.
  Graph again = schedule(s, PassOptions{});
  CHECK(print(again) == print(s));
}

TEST_CASE("schedule and plan: random graphs", "[memory_plan][schedule]") {
  int improved = 0, state_in_place_before = 0, state_in_place_after = 0;
  int64_t arena_sum = 0, peak_sum = 0, value_sum = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    Graph g = random_graph(seed);
    CAPTURE(seed, print(g));
    MemoryPlan p = plan(g);  // plans and checks
    CHECK(p.report.arena_bytes >= p.report.peak_live_bytes);
    CHECK(p.report.arena_bytes <= (p.report.value_bytes + 63 * p.report.buffer_count));

    Graph s = schedule(g, PassOptions{});
    verify(s);
    REQUIRE(s.nodes().size() == g.nodes().size());
    CHECK(peak_live_bytes(s) <= peak_live_bytes(g));
    improved += peak_live_bytes(s) < peak_live_bytes(g);
    MemoryPlan q = plan(s);
    state_in_place_before += static_cast<int>(p.report.state_in_place);
    state_in_place_after += static_cast<int>(q.report.state_in_place);
    arena_sum += q.report.arena_bytes;
    peak_sum += q.report.peak_live_bytes;
    value_sum += q.report.value_bytes;
    // Same computation: bit-identical outputs.
    TensorMap in = random_inputs(g, seed);
    CHECK(interpret(s, in) == interpret(g, in));
    // Other alignments plan and check too.
    for (int64_t alignment : {1, 4, 256}) check_memory_plan(s, plan_memory(s, PassOptions{.alignment = alignment}));
  }
  std::cout << "random graphs: schedule lowered the peak of " << improved << " of 60; state updates in place "
            << state_in_place_before << " -> " << state_in_place_after << " of 120; totals after scheduling: arena "
            << arena_sum << ", peak live " << peak_sum << ", sum of values " << value_sum << " bytes\n";
  CHECK(state_in_place_after >= state_in_place_before);
}

TEST_CASE("memory plan: MLP and LeNet training steps at batch 64", "[memory_plan][model]") {
  for (bool cnn : {false, true}) {
    Graph step = train_step_of(cnn);
    CAPTURE(step.name());
    MemoryPlan before = plan(step);
    Graph s = schedule(step, PassOptions{});
    verify(s);
    MemoryPlan after = plan(s);
    CHECK(after.report.peak_live_bytes <= before.report.peak_live_bytes);
    CHECK(after.report.arena_bytes >= after.report.peak_live_bytes);
    CHECK(after.report.arena_bytes < after.report.value_bytes);
    // Every parameter and momentum buffer is updated in its own buffer.
    int64_t state_outputs = 0;
    for (const GraphOutput& o : s.outputs()) {
      if (!updated_state(s, o).valid()) continue;
      if (s.defining_node(o.value) == nullptr) continue;  // passed through (lr)
      ++state_outputs;
    }
    // Scheduling keeps the original order unless it lowers the peak (which counts a state
    // update left in the arena), so it never loses an in-place state update.
    CHECK(after.report.state_in_place >= before.report.state_in_place);
    auto line = [](const MemoryReport& r) {
      return "arena " + std::to_string(r.arena_bytes) + " B, sum of values " + std::to_string(r.value_bytes) +
             " B, peak live " + std::to_string(r.peak_live_bytes) + " B, " + std::to_string(r.buffer_count) +
             " buffers, " + std::to_string(r.in_place_values) + " in place, " + std::to_string(r.state_in_place) +
             " state updates in place";
    };
    std::cout << step.name() << " (" << step.nodes().size() << " nodes), original order: " << line(before.report)
              << "\n" << step.name() << " scheduled: " << line(after.report) << "\n";

    // The whole default pipeline (simplify, fuse, schedule), as `kiln opt` runs it.
    PipelineOptions options;
    options.verify_each = true;
    Graph optimized = run_pipeline(step, options).graph;
    MemoryPlan fused = plan(optimized);
    CHECK(fused.report.state_in_place == state_outputs);
    CHECK(fused.report.arena_bytes >= fused.report.peak_live_bytes);
    std::cout << step.name() << " after the default pipeline (" << optimized.nodes().size()
              << " nodes): " << line(fused.report) << "\n";
    if (!cnn) {  // scheduling computes the same thing, bit for bit
      TensorMap in = random_inputs(step, 7);
      CHECK(interpret(s, in) == interpret(step, in));
    }
  }
}
