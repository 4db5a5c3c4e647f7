// rematerialize: a fused loop that reads a value another fused node computed with a few
// elementwise ops recomputes it from that node's own operands instead, when that costs
// no extra reads of activation-sized tensors; a value every reader recomputes is no longer
// written at all. A training step is where this pays: the forward pass keeps what the
// backward pass needs, and fusion makes each such value an output of the forward loop
// (a GELU's x/sqrt(2) and erf(.) + 1 beside its result, a batch norm's x - mean), written
// once and read back later, where the backward loop already reads x itself. The same
// ops on the same operands, so the same bits.
//
// For a result v of a fused node P whose body computes it from P's inputs with at most
// kMaxRecompute elementwise nodes (and constants), or of a lone elementwise node P (a batch
// norm's dy * scale * inv between a max-pool gradient and the loop that reads it): a reader U (a fused node whose body is a
// loop: elementwise ops and reductions, not a GEMM's or a convolution's epilogue) over
// v's own size (a smaller value, a per-channel vector, would be recomputed per element) may
// recompute v when every activation-sized operand of the recipe is already an operand of U
// (its reads do not grow). When every reader of v is such a loop, v is no graph output, and
// the recipes' extra activation-sized operands are no more than v's readers, each reader
// recomputes v and P stops writing it. A value that some recipe reads is never dropped.
// Runs after the fusion passes (before dce and schedule), and only on graphs that are not
// inference graphs (PassOptions::inference): those have no forward values kept for later.
#include <algorithm>
#include <map>
#include <set>

#include "ir/error.h"
#include "passes/fuse.h"
#include "passes/rebuild.h"

namespace kiln {
namespace {

constexpr size_t kMaxRecompute = 12;

// A body whose nodes are a loop's: elementwise ops, constants, reductions, softmax.
bool loop_body(const Graph& body) {
  for (const Node& n : body.nodes()) {
    bool ok = op_info(n.op).has(kElementwise) || n.op == Op::Constant || n.op == Op::Sum || n.op == Op::Mean ||
              n.op == Op::Max || n.op == Op::Min || n.op == Op::Softmax || n.op == Op::LogSoftmax;
    if (!ok) return false;
  }
  return true;
}

// How a fused node's body computes one of its outputs from its inputs: body nodes in
// order, and the body inputs (by index) it reads.
struct Recipe {
  std::vector<size_t> nodes;
  std::vector<int32_t> inputs;
  bool single = false;  // the producer is one elementwise node, not a fused one: recompute it
};

bool recipe_for(const Graph& body, ValueId w, Recipe& r) {
  std::set<size_t> nodes;
  std::set<int32_t> inputs;
  std::vector<ValueId> work{w};
  while (!work.empty()) {
    ValueId v = work.back();
    work.pop_back();
    const Value& val = body.value(v);
    if (val.input >= 0) {
      inputs.insert(val.input);
      continue;
    }
    const size_t i = static_cast<size_t>(val.node);
    const Node& n = body.nodes()[i];
    if (!op_info(n.op).has(kElementwise) && n.op != Op::Constant) return false;
    if (!nodes.insert(i).second) continue;
    if (nodes.size() > kMaxRecompute) return false;
    for (ValueId o : n.operands) work.push_back(o);
  }
  r.nodes.assign(nodes.begin(), nodes.end());
  r.inputs.assign(inputs.begin(), inputs.end());
  return true;
}

// One value recomputed in one reader.
struct Remat {
  size_t producer;  // P's node index
  size_t result;    // v = P.results[result]
  const Recipe* recipe;
};

// A copy of `body` without the nodes no output needs and without the inputs nothing
// reads; `keep_input` says which inputs stay.
Graph pruned(const Graph& body, std::vector<bool>& keep_input) {
  std::vector<bool> live(body.values().size(), false);
  for (const GraphOutput& o : body.outputs()) live[o.value.id] = true;
  std::vector<bool> keep(body.nodes().size(), false);
  for (size_t i = body.nodes().size(); i-- > 0;) {
    const Node& n = body.nodes()[i];
    for (ValueId r : n.results) keep[i] = keep[i] || live[r.id];
    if (keep[i])
      for (ValueId v : n.operands) live[v.id] = true;
  }
  keep_input.assign(body.inputs().size(), false);
  for (size_t j = 0; j < body.inputs().size(); ++j) keep_input[j] = live[body.inputs()[j].value.id];
  Rebuilder rb(body, [&](const GraphInput& in) { return live[in.value.id]; });
  for (size_t i = 0; i < body.nodes().size(); ++i)
    if (keep[i]) rb.copy(body.nodes()[i]);
  return rb.finish();
}

}  // namespace

Graph rematerialize(const Graph& g, const PassOptions& options) {
  if (options.inference) return g;
  const auto& nodes = g.nodes();
  std::vector<std::vector<size_t>> users(g.values().size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (ValueId v : nodes[i].operands)
      if (users[v.id].empty() || users[v.id].back() != i) users[v.id].push_back(i);
  std::vector<bool> is_output(g.values().size(), false);
  for (const GraphOutput& o : g.outputs()) is_output[o.value.id] = true;
  std::vector<bool> loop(nodes.size(), false);
  std::vector<int64_t> loop_size(nodes.size(), 0);  // a loop's largest operand or result
  for (size_t i = 0; i < nodes.size(); ++i) {
    loop[i] = nodes[i].op == Op::Fused && loop_body(*nodes[i].body);
    for (const auto* vs : {&nodes[i].operands, &nodes[i].results})
      for (ValueId v : *vs) loop_size[i] = std::max(loop_size[i], g.type(v).numel());
  }

  // The recipes, one per candidate value; the remats chosen, per reader; the dropped values.
  std::map<int32_t, Recipe> recipes;
  std::map<size_t, std::vector<Remat>> into;
  std::vector<bool> dropped(g.values().size(), false);
  // The activation-sized operands a reader gains, per (value, reader), to undo a drop.
  std::map<std::pair<int32_t, size_t>, int> gained;
  auto leaves = [&](const Remat& m) {
    std::vector<ValueId> out;
    for (int32_t j : m.recipe->inputs) out.push_back(nodes[m.producer].operands[static_cast<size_t>(j)]);
    return out;
  };
  for (size_t p = 0; p < nodes.size(); ++p) {
    const Node& pn = nodes[p];
    const bool single = pn.op != Op::Fused && op_info(pn.op).has(kElementwise);
    if (pn.op != Op::Fused && !single) continue;
    for (size_t k = 0; k < pn.results.size(); ++k) {
      const ValueId v = pn.results[k];
      if (users[v.id].empty()) continue;
      Recipe r;
      r.single = single;
      if (single)
        for (size_t j = 0; j < pn.operands.size(); ++j) r.inputs.push_back(static_cast<int32_t>(j));
      else if (!recipe_for(*pn.body, pn.body->outputs()[k].value, r))
        continue;
      const Recipe* rp = &recipes.emplace(v.id, std::move(r)).first->second;
      const Remat m{p, k, rp};
      const int64_t size = g.type(v).numel();
      bool all = !is_output[v.id];
      int total_gained = 0;
      std::vector<int> gain(users[v.id].size(), 0);
      for (size_t u = 0; u < users[v.id].size(); ++u) {
        const Node& un = nodes[users[v.id][u]];
        // Only values of the loop's own size: a smaller one (a per-channel vector) would be
        // recomputed for every element of the loop.
        all = all && loop[users[v.id][u]] && loop_size[users[v.id][u]] == size;
        for (ValueId leaf : leaves(m))
          if (g.type(leaf).numel() >= size && std::find(un.operands.begin(), un.operands.end(), leaf) == un.operands.end())
            ++gain[u];
        total_gained += gain[u];
      }
      const bool drop = all && total_gained <= static_cast<int>(users[v.id].size());
      for (size_t u = 0; u < users[v.id].size(); ++u) {
        const size_t un = users[v.id][u];
        if (!loop[un] || loop_size[un] != size || (!drop && gain[u] > 0)) continue;
        into[un].push_back(m);
        gained[{v.id, un}] = gain[u];
      }
      dropped[v.id] = drop;
    }
  }
  // A dropped value that some recipe reads stays: its readers that gained operands to
  // recompute it read it again instead. Undoing remats only removes reads, so one pass
  // leaves no remaining recipe reading a dropped value.
  std::vector<bool> read(g.values().size(), false);
  for (const auto& [u, ms] : into)
    for (const Remat& m : ms)
      for (ValueId leaf : leaves(m)) read[leaf.id] = true;
  for (size_t v = 0; v < dropped.size(); ++v) {
    if (!dropped[v] || !read[v]) continue;
    dropped[v] = false;
    for (size_t u : users[v]) {
      auto it = into.find(u);
      if (it == into.end() || gained[{static_cast<int32_t>(v), u}] == 0) continue;
      std::erase_if(it->second, [&](const Remat& m) {
        return nodes[m.producer].results[m.result].id == static_cast<int32_t>(v);
      });
    }
  }

  Rebuilder rb(g);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op != Op::Fused && dropped[n.result().id]) continue;  // a lone node recomputed where read
    std::vector<bool> drop_out(n.results.size(), false);
    bool any_drop = false, all_drop = true;
    for (size_t k = 0; k < n.results.size(); ++k) {
      drop_out[k] = dropped[n.results[k].id];
      any_drop = any_drop || drop_out[k];
      all_drop = all_drop && drop_out[k];
    }
    auto it = into.find(i);
    const bool remat = it != into.end() && !it->second.empty();
    if (!remat && !any_drop) {
      rb.copy(n);
      continue;
    }
    if (all_drop) continue;  // every result recomputed where it is read
    const Graph& body = *n.body;
    // The new body: recipes first (in their producers' order), then the body's nodes.
    Graph nb(body.name());
    std::vector<ValueId> operands;                 // source values
    std::map<int32_t, ValueId> available;          // source value -> new body value
    std::vector<ValueId> local(body.values().size());  // body value -> new body value
    std::set<int32_t> recomputed;
    int extra = 0;  // inputs added for recipes
    if (remat)
      for (const Remat& m : it->second) recomputed.insert(nodes[m.producer].results[m.result].id);
    for (size_t j = 0; j < body.inputs().size(); ++j) {
      const ValueId src = n.operands[j];
      if (recomputed.count(src.id) || available.count(src.id)) continue;
      const GraphInput& in = body.inputs()[j];
      available[src.id] = nb.add_input(body.value(in.value).name, body.type(in.value));
      operands.push_back(src);
    }
    if (remat) {
      std::vector<Remat> ms = it->second;
      std::sort(ms.begin(), ms.end(), [](const Remat& a, const Remat& b) { return a.producer < b.producer; });
      for (const Remat& m : ms) {
        const Node& pn = nodes[m.producer];
        std::vector<ValueId> leaf_values;
        for (int32_t j : m.recipe->inputs) {
          const ValueId src = pn.operands[static_cast<size_t>(j)];
          auto a = available.find(src.id);
          if (a == available.end()) {
            a = available.emplace(src.id, nb.add_input("rm" + std::to_string(extra++), g.type(src))).first;
            operands.push_back(src);
          }
          leaf_values.push_back(a->second);
        }
        if (m.recipe->single) {
          available[pn.result().id] = nb.add_node_at(pn.op, leaf_values, pn.attrs, "", pn.location);
          continue;
        }
        const Graph& pb = *pn.body;
        std::vector<ValueId> pl(pb.values().size());
        for (size_t l = 0; l < leaf_values.size(); ++l)
          pl[pb.inputs()[static_cast<size_t>(m.recipe->inputs[l])].value.id] = leaf_values[l];
        for (size_t ni : m.recipe->nodes) {
          const Node& bn = pb.nodes()[ni];
          std::vector<ValueId> ops;
          for (ValueId o : bn.operands) ops.push_back(pl[o.id]);
          pl[bn.result().id] = nb.add_node_at(bn.op, ops, bn.attrs, "", bn.location);
        }
        available[pn.results[m.result].id] = pl[pb.outputs()[m.result].value.id];
      }
    }
    for (size_t j = 0; j < body.inputs().size(); ++j) local[body.inputs()[j].value.id] = available.at(n.operands[j].id);
    for (const Node& bn : body.nodes()) {
      std::vector<ValueId> ops;
      for (ValueId o : bn.operands) ops.push_back(local[o.id]);
      KILN_CHECK(bn.op != Op::Fused, "rematerialize: a loop body holds no fused node");
      local[bn.result().id] = nb.add_node_at(bn.op, ops, bn.attrs, "", bn.location);
    }
    std::vector<std::string> names;
    std::vector<ValueId> kept_results;
    for (size_t k = 0; k < body.outputs().size(); ++k) {
      if (drop_out[k]) continue;
      nb.add_output(body.outputs()[k].name, local[body.outputs()[k].value.id]);
      names.push_back(g.value(n.results[k]).name);
      kept_results.push_back(n.results[k]);
    }
    std::vector<bool> keep_input;
    Graph final_body = pruned(nb, keep_input);
    std::vector<ValueId> mapped;
    for (size_t j = 0; j < operands.size(); ++j)
      if (keep_input[j]) mapped.push_back(rb.map(operands[j]));
    std::vector<ValueId> rs = rb.dst().add_fused(mapped, std::move(final_body), names);
    rb.dst().set_note(rs[0], n.note);
    for (size_t k = 0; k < rs.size(); ++k) rb.set(kept_results[k], rs[k]);
  }
  return rb.finish();
}

}  // namespace kiln
