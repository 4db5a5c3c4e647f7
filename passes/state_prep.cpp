// split_state_prep (passes/inference.h): the weight preparation of an inference graph.
#include <algorithm>
#include <set>

#include "ir/error.h"
#include "passes/inference.h"
#include "passes/simplify.h"

namespace kiln {

StatePrep split_state_prep(const Graph& g) {
  const size_t nv = g.values().size();
  std::vector<int8_t> memo(nv, 0);
  // reads_state[v]: v's computation reads a state input; arith[v]: and has an op that is
  // not a shape op (only such values are worth a buffer of their own).
  // moves[v]: it has a shape op that moves elements (not a reshape, a view).
  std::vector<bool> reads_state(nv, false), arith(nv, false), moves(nv, false);
  for (const GraphInput& in : g.inputs())
    if (in.is_state) reads_state[static_cast<size_t>(in.value.id)] = true;
  std::vector<bool> weights_only(g.nodes().size(), false), hoist(g.nodes().size(), false);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    bool rs = false, ar = false, mv = false;
    for (ValueId v : n.operands) {
      rs = rs || reads_state[static_cast<size_t>(v.id)];
      ar = ar || arith[static_cast<size_t>(v.id)];
      mv = mv || moves[static_cast<size_t>(v.id)];
    }
    if (n.op == Op::Constant || !rs || !depends_on_weights_only(g, n.result(), memo)) continue;
    ar = ar || !op_info(n.op).has(kShape);
    mv = mv || n.op != Op::Reshape;
    for (ValueId r : n.results) {
      reads_state[static_cast<size_t>(r.id)] = true;
      arith[static_cast<size_t>(r.id)] = ar;
      moves[static_cast<size_t>(r.id)] = mv;
    }
    weights_only[i] = true;
    hoist[i] = ar;
  }
  // A transpose (or slice, broadcast) of state is left to the kernels only where a matmul
  // reads it, which folds a transpose into its GEMM; any other reader (a conv, a fused node
  // reading it from outside: fuse_matmul_epilogue takes into the GEMM's region a transpose
  // only its matmul reads) would copy it on every run, so it is prepared once instead.
  std::vector<std::vector<size_t>> readers(nv);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId v : g.nodes()[i].operands) readers[static_cast<size_t>(v.id)].push_back(i);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!weights_only[i] || hoist[i] || !moves[static_cast<size_t>(g.nodes()[i].result().id)]) continue;
    for (size_t u : readers[static_cast<size_t>(g.nodes()[i].result().id)])
      if (!weights_only[u] && g.nodes()[u].op != Op::Matmul) hoist[i] = true;
  }
  // The hoisted values the rest of the graph reads.
  std::vector<bool> in_prep_value(nv, false);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (hoist[i])
      for (ValueId r : g.nodes()[i].results) in_prep_value[static_cast<size_t>(r.id)] = true;
  std::vector<ValueId> boundary;
  std::set<int32_t> seen;
  auto need = [&](ValueId v) {
    if (in_prep_value[static_cast<size_t>(v.id)] && seen.insert(v.id).second) boundary.push_back(v);
  };
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (!hoist[i])
      for (ValueId v : g.nodes()[i].operands) need(v);
  for (const GraphOutput& o : g.outputs()) need(o.value);
  StatePrep out;
  if (boundary.empty()) {
    out.main = g;
    out.prep = Graph(g.name() + ".prep");
    return out;
  }

  // Names for the new state inputs, free in g.
  auto free_name = [&](int k) {
    std::string base = "kiln.prep." + std::to_string(k), name = base;
    for (int s = 2; g.find(name).valid(); ++s) name = base + "_" + std::to_string(s);
    return name;
  };
  for (size_t k = 0; k < boundary.size(); ++k) out.names.push_back(free_name(static_cast<int>(k)));

  // prep: the hoisted nodes and what they read (constants, shape ops of state).
  std::vector<bool> wanted(nv, false);
  for (ValueId v : boundary) wanted[static_cast<size_t>(v.id)] = true;
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    bool w = false;
    for (ValueId r : n.results) w = w || wanted[static_cast<size_t>(r.id)];
    if (w)
      for (ValueId v : n.operands) wanted[static_cast<size_t>(v.id)] = true;
  }
  Graph prep(g.name() + ".prep");
  std::vector<ValueId> pmap(nv);
  for (const GraphInput& in : g.inputs())
    if (wanted[static_cast<size_t>(in.value.id)])
      pmap[static_cast<size_t>(in.value.id)] = prep.add_input(g.value(in.value).name, g.type(in.value));
  for (const Node& n : g.nodes()) {
    bool w = false;
    for (ValueId r : n.results) w = w || wanted[static_cast<size_t>(r.id)];
    if (!w) continue;
    std::vector<ValueId> ops;
    for (ValueId v : n.operands) ops.push_back(pmap[static_cast<size_t>(v.id)]);
    std::vector<ValueId> rs;
    if (n.op == Op::Fused) rs = prep.add_fused(std::move(ops), *n.body);
    else rs = {prep.add_node_at(n.op, std::move(ops), n.attrs, "", n.location)};
    for (size_t r = 0; r < rs.size(); ++r) pmap[static_cast<size_t>(n.results[r].id)] = rs[r];
  }
  for (size_t k = 0; k < boundary.size(); ++k) prep.add_output(out.names[k], pmap[static_cast<size_t>(boundary[k].id)]);

  // main: g with the boundary values read from the new state inputs.
  Graph main(g.name());
  main.set_fixed_batch(g.fixed_batch());
  std::vector<ValueId> mmap(nv);
  for (const GraphInput& in : g.inputs())
    mmap[static_cast<size_t>(in.value.id)] = main.add_input(g.value(in.value).name, g.type(in.value), in.is_state);
  for (size_t k = 0; k < boundary.size(); ++k)
    mmap[static_cast<size_t>(boundary[k].id)] = main.add_input(out.names[k], g.type(boundary[k]), true);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (hoist[i]) continue;
    std::vector<ValueId> ops;
    for (ValueId v : n.operands) {
      KILN_CHECK(mmap[static_cast<size_t>(v.id)].valid(), "split_state_prep: an operand is not mapped");
      ops.push_back(mmap[static_cast<size_t>(v.id)]);
    }
    std::vector<ValueId> rs;
    std::vector<std::string> names;
    for (ValueId r : n.results) names.push_back(g.value(r).name);
    if (n.op == Op::Fused) rs = main.add_fused(std::move(ops), *n.body, names);
    else rs = {main.add_node_at(n.op, std::move(ops), n.attrs, names[0], n.location)};
    if (!n.note.empty()) main.set_note(rs[0], n.note);
    for (size_t r = 0; r < rs.size(); ++r) mmap[static_cast<size_t>(n.results[r].id)] = rs[r];
  }
  for (const GraphOutput& o : g.outputs()) main.add_output(o.name, mmap[static_cast<size_t>(o.value.id)]);
  out.main = dce(main, PassOptions{});
  out.prep = std::move(prep);
  return out;
}

}  // namespace kiln
