// The kernel plan (passes/kernel_plan.h): plans of small hand-built graphs whose kernels are
// known (a fused elementwise body, a matmul reading transposes through GEMM flags, a GEMM
// writing its epilogue's output, body outputs copied), the printed form, and corrupted plans
// the checker must reject with a message naming the kernel.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <functional>

#include "ir/error.h"
#include "passes/kernel_plan.h"
#include "passes/check_memory_plan.h"
#include "passes/memory_plan.h"
#include "passes/schedule.h"

using namespace kiln;
using Catch::Matchers::ContainsSubstring;

namespace {

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }
const AttrMap kSwap{{"perm", std::vector<int64_t>{1, 0}}};

struct Planned {
  MemoryPlan mp;
  KernelPlan kp;
};

Planned plan(const Graph& g, KernelPlanOptions o = {}) {
  Planned p{plan_memory(g, PassOptions{}), {}};
  p.kp = plan_kernels(g, p.mp, o);
  check_kernel_plan(g, p.mp, p.kp);
  return p;
}

std::string rejection(const Graph& g, const Planned& p) {
  try {
    check_kernel_plan(g, p.mp, p.kp);
  } catch (const InternalError& e) {
    return e.what();
  }
  return "accepted";
}

// y = relu(x @ w + b), as the epilogue fusion leaves it: one fused node.
Graph gemm_epilogue_graph() {
  Graph g("mlp");
  ValueId x = g.add_input("x", f32({8, 16})), w = g.add_input("w", f32({16, 4})), b = g.add_input("b", f32({4}));
  Graph body("body");
  ValueId bx = body.add_input("x", f32({8, 16})), bw = body.add_input("w", f32({16, 4})), bb = body.add_input("b", f32({4}));
  ValueId mm = body.add_node(Op::Matmul, {bx, bw});
  body.add_output("y", body.add_node(Op::Relu, {body.add_node(Op::Add, {mm, bb})}));
  g.add_output("y", g.add_fused({x, w, b}, std::move(body))[0]);
  return g;
}

}  // namespace

TEST_CASE("kernel plan: a fused elementwise body is one loop, intermediates in registers", "[kernel_plan]") {
  Graph g("ew");
  ValueId a = g.add_input("a", f32({4, 8})), c = g.add_input("c", f32({8}));
  Graph body("body");
  ValueId p = body.add_input("p", f32({4, 8})), q = body.add_input("q", f32({8}));
  ValueId two = body.add_constant(Tensor::scalar(DType::f32, 2.0));
  ValueId t = body.add_node(Op::Mul, {body.add_node(Op::Add, {p, q}), two});
  body.add_output("t", t);
  body.add_output("e", body.add_node(Op::Exp, {t}));
  std::vector<ValueId> r = g.add_fused({a, c}, std::move(body));
  g.add_output("t", r[0]);
  g.add_output("e", r[1]);
  Planned pl = plan(g);
  REQUIRE(pl.kp.kernels.size() == 1);
  const Kernel& region = pl.kp.kernels[0];
  REQUIRE(region.kind == KernelKind::Region);
  const KernelPlan& b = *region.body;
  REQUIRE(b.kernels.size() == 1);
  const Kernel& loop = b.kernels[0];
  CHECK(loop.kind == KernelKind::Loop);
  CHECK(loop.nodes.size() == 3);  // add, mul, exp; the constant is an immediate
  CHECK(loop.shape == Shape{4, 8});
  CHECK(loop.loads.size() == 2);
  CHECK(loop.stores.size() == 2);
  CHECK(b.scratch_bytes == 0);
  CHECK(b.copies.empty());
  const Graph& body_g = *g.nodes()[0].body;
  CHECK(b.at(body_g.nodes()[1].result()).kind == Storage::Register);  // the add
  CHECK(b.at(body_g.outputs()[0].value).kind == Storage::Output);
  CHECK(b.at(two).kind == Storage::Constant);
  CHECK_FALSE(b.at(two).in_memory);
  CHECK(format_kernel_plan(g, pl.kp) ==
        "k0 region %0, %1 = fused(%a, %c):\n"
        "  k0 loop [4,8] %1 = add(%p, %q), %2 = mul(%1, %0), %3 = exp(%2) -> store %2, %3\n"
        "  storage: %0 immediate, %2 output 0, %3 output 1\n"
        "scratch: 0 bytes; gemm epilogues in place: 0\n");
}

TEST_CASE("kernel plan: transposes of the last two axes fold into the GEMM flags", "[kernel_plan]") {
  Graph g("tt");
  ValueId x = g.add_input("x", f32({8, 16})), w = g.add_input("w", f32({4, 16}));
  ValueId wt = g.add_node(Op::Transpose, {w}, kSwap);
  ValueId y = g.add_node(Op::Matmul, {x, wt});
  ValueId xt = g.add_node(Op::Transpose, {x}, kSwap);  // also read elsewhere: not elided
  g.add_output("y", y);
  g.add_output("xt", xt);
  g.add_output("z", g.add_node(Op::Matmul, {xt, g.add_node(Op::Exp, {x})}));
  Planned pl = plan(g);
  REQUIRE(pl.kp.kernels.size() == 4);  // gemm, transpose, exp, gemm
  const Kernel& k0 = pl.kp.kernels[0];
  CHECK(k0.kind == KernelKind::Gemm);
  CHECK(k0.a == x);
  CHECK(k0.b == w);
  CHECK_FALSE(k0.trans_a);
  CHECK(k0.trans_b);
  CHECK(pl.kp.at(wt).kind == Storage::Elided);
  CHECK(pl.kp.kernels[1].kind == KernelKind::Op);
  CHECK(pl.kp.at(xt).kind == Storage::Planned);
  CHECK(pl.kp.kernels[3].trans_a);
  CHECK(pl.kp.kernels[3].a == x);
  CHECK_THAT(format_kernel_plan(g, pl.kp), ContainsSubstring("k0 gemm %1 = matmul(%x, %w^T)\n"));
  CHECK_THAT(format_kernel_plan(g, pl.kp), ContainsSubstring("storage: %0 elided\n"));

  KernelPlanOptions off;
  off.fold_transposes = false;
  Planned plain = plan(g, off);
  CHECK(plain.kp.kernels.size() == 5);
  CHECK_FALSE(plain.kp.kernels[1].trans_b);
}

TEST_CASE("kernel plan: a GEMM writes straight into its epilogue's output", "[kernel_plan]") {
  Graph g = gemm_epilogue_graph();
  Planned pl = plan(g);
  const KernelPlan& b = *pl.kp.kernels.at(0).body;
  const Graph& body = *g.nodes()[0].body;
  REQUIRE(b.kernels.size() == 2);
  CHECK(b.kernels[0].kind == KernelKind::Gemm);
  CHECK(b.kernels[1].kind == KernelKind::Loop);
  ValueId mm = body.nodes()[0].result();
  CHECK(b.at(mm).kind == Storage::Alias);
  CHECK(b.at(mm).alias == body.outputs()[0].value);
  CHECK(b.kernels[1].loads.front() == mm);
  CHECK(b.scratch_bytes == 0);
  CHECK(pl.kp.gemm_epilogues_in_place == 1);

  KernelPlanOptions off;
  off.gemm_epilogue = false;
  Planned base = plan(g, off);
  const KernelPlan& bb = *base.kp.kernels.at(0).body;
  CHECK(bb.at(mm).kind == Storage::Scratch);
  CHECK(bb.at(mm).offset == 0);
  CHECK(bb.scratch_bytes == 8 * 4 * 4);
  CHECK(base.kp.scratch_bytes == 8 * 4 * 4);
  CHECK(base.kp.gemm_epilogues_in_place == 0);
}

TEST_CASE("kernel plan: one GEMM per epilogue buffer, and none for a GEMM that is a body output", "[kernel_plan]") {
  Graph g("two");
  ValueId x = g.add_input("x", f32({8, 8}));
  Graph body("body");
  ValueId p = body.add_input("p", f32({8, 8}));
  ValueId m1 = body.add_node(Op::Matmul, {p, p});
  ValueId m2 = body.add_node(Op::Matmul, {p, body.add_node(Op::Exp, {p})});
  body.add_output("s", body.add_node(Op::Add, {m1, m2}));
  std::vector<ValueId> r = g.add_fused({x}, std::move(body));
  g.add_output("s", r[0]);
  Planned pl = plan(g);
  const KernelPlan& b = *pl.kp.kernels.at(0).body;
  CHECK(b.at(m1).kind == Storage::Alias);
  CHECK(b.at(m2).kind == Storage::Scratch);  // the output's buffer already holds m1
  CHECK(pl.kp.gemm_epilogues_in_place == 1);
}

TEST_CASE("kernel plan: body outputs that cannot be written in place are copied", "[kernel_plan]") {
  Graph g("copies");
  ValueId x = g.add_input("x", f32({4}));
  Graph body("body");
  ValueId p = body.add_input("p", f32({4}));
  ValueId e = body.add_node(Op::Exp, {p});
  body.add_output("e", e);
  body.add_output("e2", e);  // the same value twice: the second is copied
  body.add_output("p", p);   // a body input: copied
  body.add_output("k", body.add_constant(Tensor::from<float>(DType::f32, {4}, {1, 2, 3, 4})));  // a constant: copied
  std::vector<ValueId> r = g.add_fused({x}, std::move(body));
  for (size_t k = 0; k < r.size(); ++k) g.add_output("r" + std::to_string(k), r[k]);
  Planned pl = plan(g);
  const KernelPlan& b = *pl.kp.kernels.at(0).body;
  REQUIRE(b.copies.size() == 3);
  CHECK(b.copies[0].output == 1);
  CHECK(b.copies[0].value == e);
  CHECK(b.copies[1].output == 2);
  CHECK(b.copies[2].output == 3);
  const Graph& bg = *g.nodes()[0].body;
  CHECK(b.at(bg.outputs()[3].value).in_memory);
  CHECK_THAT(format_kernel_plan(g, pl.kp), ContainsSubstring("  copy %0 -> output 1\n"));
}

TEST_CASE("kernel plan: the checker rejects corrupted plans, naming the kernel", "[kernel_plan]") {
  Graph g = gemm_epilogue_graph();
  Planned good = plan(g);
  auto corrupt = [&](const std::function<void(KernelPlan&)>& f) {
    Planned p = good;
    auto body = std::make_shared<KernelPlan>(*p.kp.kernels[0].body);
    f(*body);
    p.kp.kernels[0].body = body;
    return rejection(g, p);
  };
  const Graph& bg = *g.nodes()[0].body;
  ValueId mm = bg.nodes()[0].result();
  // The epilogue loop no longer loads the GEMM's result.
  CHECK_THAT(corrupt([](KernelPlan& b) { b.kernels[1].loads.erase(b.kernels[1].loads.begin()); }),
             ContainsSubstring("kernel plan of @mlp: k0 (region) body: k1 (loop): %0 is neither loaded nor computed in the loop"));
  // The GEMM's result kept in a register, though another kernel reads it.
  CHECK_THAT(corrupt([&](KernelPlan& b) { b.values[mm.id] = {}; b.values[mm.id].kind = Storage::Register; }),
             ContainsSubstring("k0 (gemm): %0 is written to memory but is register"));
  // Overlapping scratch.
  CHECK_THAT(corrupt([&](KernelPlan& b) {
               ValueId add = bg.nodes()[1].result();
               b.values[mm.id] = {Storage::Scratch, 0, -1, {}, false};
               b.values[add.id] = {Storage::Scratch, 64, -1, {}, false};
               b.kernels[1].stores.insert(b.kernels[1].stores.begin(), add);
               b.scratch_bytes = 256;
             }),
             ContainsSubstring("scratch ranges overlap at offset 64"));
  // A node run twice / never.
  Planned twice = good;
  twice.kp.kernels.push_back(twice.kp.kernels[0]);
  CHECK_THAT(rejection(g, twice), ContainsSubstring("k1 (region): node 0 is out of order"));
  Planned none = good;
  none.kp.kernels.clear();
  CHECK_THAT(rejection(g, none), ContainsSubstring("node 0 (%0 = fused) is never run"));
  // A GEMM reading the wrong operand.
  CHECK_THAT(corrupt([&](KernelPlan& b) { b.kernels[0].b = bg.inputs()[0].value; }),
             ContainsSubstring("k0 (gemm): reads %x for operand %w"));
}

TEST_CASE("kernel plan: a transposed activation read by a GEMM much later still folds", "[kernel_plan]") {
  // A backward pass's dW = h^T . dy: h^T is ready as soon as h is, the GEMM runs at the end.
  // The scheduler emits the transpose just before the GEMM and the memory plan keeps h live
  // until then, so the GEMM reads h through its flag and nothing is copied.
  Graph g("late");
  ValueId x = g.add_input("x", f32({8, 16})), w = g.add_input("w", f32({16, 4}));
  ValueId h = g.add_node(Op::Exp, {x});
  ValueId ht = g.add_node(Op::Transpose, {h}, kSwap);
  ValueId a = g.add_node(Op::Tanh, {h});
  ValueId b = g.add_node(Op::Neg, {a});
  ValueId c = g.add_node(Op::Mul, {b, b});
  ValueId dy = g.add_node(Op::Matmul, {c, w});       // [8, 4]
  g.add_output("dw", g.add_node(Op::Matmul, {ht, dy}));  // [16, 4]
  CHECK(gemm_folded_transposes(g) == std::vector<bool>{false, true, false, false, false, false, false});

  Graph s = schedule(g, PassOptions{});
  REQUIRE(s.nodes().size() == 7);
  CHECK(s.nodes()[5].op == Op::Transpose);  // just before its GEMM
  CHECK(s.nodes()[6].op == Op::Matmul);
  Planned pl = plan(s);
  check_memory_plan(s, pl.mp);
  const ValueId src = s.nodes()[5].operands[0];
  CHECK(pl.mp.at(src).end >= 6);
  CHECK(pl.kp.at(s.nodes()[5].result()).kind == Storage::Elided);
  const Kernel& last = pl.kp.kernels.back();
  CHECK(last.kind == KernelKind::Gemm);
  CHECK(last.trans_a);
  CHECK(last.a == src);

  // Read by anything but a matmul, a transpose is an ordinary node.
  Graph o("other");
  ValueId y = o.add_input("y", f32({8, 16}));
  ValueId yt = o.add_node(Op::Transpose, {y}, kSwap);
  o.add_output("m", o.add_node(Op::Matmul, {yt, y}));
  o.add_output("e", o.add_node(Op::Exp, {yt}));
  CHECK(gemm_folded_transposes(o) == std::vector<bool>{false, false, false});
}
