// Greedy list scheduling for low peak memory (see schedule.h).
#include "passes/schedule.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>

#include "ir/calling.h"
#include "passes/memory_plan.h"
#include "passes/rebuild.h"

namespace kiln {

namespace {

enum class TieBreak { Original, Recent, DepthFirst };

std::vector<int32_t> greedy_order(const Graph& g, TieBreak tie) {
  const std::vector<Node>& nodes = g.nodes();
  const auto num_nodes = static_cast<int32_t>(nodes.size());
  const size_t num_values = g.values().size();
  auto producer = [&](ValueId v) { return g.value(v).node; };
  auto is_constant = [&](int32_t i) { return nodes[i].op == Op::Constant; };

  std::vector<int64_t> bytes(num_values);
  std::vector<bool> in_arena(num_values), is_output(num_values);
  for (size_t id = 0; id < num_values; ++id) {
    const Value& v = g.values()[id];
    bytes[id] = v.type.nbytes();
    in_arena[id] = v.node >= 0 && !is_constant(v.node);
  }
  for (const GraphOutput& o : g.outputs()) is_output[o.value.id] = true;

  // For each result that is some state's X.next: X.
  std::vector<ValueId> next_of(num_values);
  for (const GraphOutput& o : g.outputs()) {
    if (next_of[o.value.id].valid()) continue;
    ValueId x = updated_state(g, o);
    if (x.valid() && in_arena[o.value.id]) next_of[o.value.id] = x;
  }

  // A transpose the GEMMs will read through (memory_plan.h: gemm_folded_transposes) is no
  // step of its own: its readers read its source, and it is emitted just before the first of
  // them. Scheduled as a node, it ran as soon as its source was made (its result costs what
  // it frees), and the GEMMs long after could not read the source, whose buffer was reused.
  const std::vector<bool> folded = gemm_folded_transposes(g);
  auto through = [&](ValueId v) {
    const int32_t p = producer(v);
    return p >= 0 && folded[p] ? nodes[p].operands[0] : v;
  };
  std::vector<std::vector<ValueId>> operands(num_nodes);  // distinct, in operand order
  std::vector<std::vector<int32_t>> readers(num_values);   // distinct reading nodes
  std::vector<int32_t> readers_left(num_values, 0), pending(num_nodes, 0);
  for (int32_t i = 0; i < num_nodes; ++i) {
    if (folded[i]) continue;
    for (ValueId operand : nodes[i].operands) {
      const ValueId v = through(operand);
      if (std::find(operands[i].begin(), operands[i].end(), v) != operands[i].end()) continue;
      operands[i].push_back(v);
      readers[v.id].push_back(i);
      ++readers_left[v.id];
      if (in_arena[v.id]) ++pending[i];  // constants and inputs are always available
    }
  }

  // Collectives (all_reduce) start as soon as their operand is made, and the nodes that read
  // their results run as late as the other ready nodes allow: the CPU code starts each sum on
  // the runtime's communication thread and waits for it just before its first reader
  // (runtime/collective.h), so what runs between is computation overlapped with the
  // communication (a data-parallel step's backward pass of the layers below a bucket).
  // So do the nodes that only feed collectives (every reader of theirs is a collective or
  // such a node: a bucket's weighting and concat, a weight's gradient GEMM, the accuracy
  // summed with the loss): as soon as they are ready, so that the sums start early.
  std::vector<bool> collective(num_nodes, false), waits(num_nodes, false), feeds(num_nodes, false);
  for (int32_t i = 0; i < num_nodes; ++i) collective[i] = op_info(nodes[i].op).has(kCollective);
  for (int32_t i = 0; i < num_nodes; ++i)
    for (ValueId v : operands[i])
      if (int32_t p = producer(v); p >= 0 && collective[p]) waits[i] = true;
  for (int32_t i = num_nodes; i-- > 0;) {  // readers come later in the original order
    if (collective[i] || is_constant(i) || folded[i]) continue;
    bool only = true, any = false;
    for (ValueId r : nodes[i].results) {
      only = only && !is_output[r.id];
      for (int32_t c : readers[r.id]) {
        any = true;
        only = only && (collective[c] || feeds[c]);
      }
    }
    feeds[i] = only && any;
  }

  // The node producing each state X's X.next: its key depends on X's readers left.
  std::vector<int32_t> next_producer(num_values, -1);
  for (int32_t i = 0; i < num_nodes; ++i)
    for (ValueId r : nodes[i].results)
      if (next_of[r.id].valid()) next_producer[next_of[r.id].id] = i;

  std::vector<int32_t> order, position(num_nodes, -1);
  std::vector<bool> emitted(num_nodes, false);
  auto emit = [&](int32_t i) {
    position[i] = static_cast<int32_t>(order.size());
    order.push_back(i);
    emitted[i] = true;
  };
  // The ready nodes, ordered by key; the node index last makes every key unique, so the
  // order picked does not depend on the order nodes became ready. A key changes only
  // when a value's readers left drop (see below), so the set is updated, not rescanned.
  // The first element: 0 for a collective or a node that only feeds them, 2 for a reader of
  // a collective's result, 1 for the rest.
  using Key = std::tuple<int, bool, int64_t, int64_t, int32_t>;
  auto key_of = [&](int32_t i) -> Key {
    int64_t freed = 0, kept = 0, recency = -1;
    bool deferred = false;
    for (ValueId v : operands[i]) {
      if (!in_arena[v.id]) continue;
      recency = std::max<int64_t>(recency, position[producer(v)]);
      if (!is_output[v.id] && readers_left[v.id] == 1) freed += bytes[v.id];
    }
    for (ValueId r : nodes[i].results) {
      if (ValueId x = next_of[r.id]; x.valid()) {
        bool self = std::find(operands[i].begin(), operands[i].end(), x) != operands[i].end();
        if (readers_left[x.id] - (self ? 1 : 0) > 0)
          deferred = true;  // X still has other readers: X.next could not go into X's buffer
        else if (!is_output[x.id])
          continue;  // written into X's buffer, not the arena
      }
      if (readers[r.id].empty() && !is_output[r.id]) continue;  // dead: freed at once
      kept += bytes[r.id];
    }
    const int64_t net = kept - freed;
    const int overlap = collective[i] || feeds[i] ? 0 : waits[i] ? 2 : 1;
    switch (tie) {
      case TieBreak::Original: return {overlap, deferred, net, 0, i};
      case TieBreak::Recent: return {overlap, deferred, net, -recency, i};
      case TieBreak::DepthFirst: return {overlap, deferred, -recency, net, i};
    }
    return {overlap, deferred, net, 0, i};
  };
  std::set<Key> ready;
  std::vector<Key> key(num_nodes);
  std::vector<bool> is_ready(num_nodes, false);
  auto make_ready = [&](int32_t i) {
    is_ready[i] = true;
    key[i] = key_of(i);
    ready.insert(key[i]);
  };
  auto rekey = [&](int32_t i) {
    if (i < 0 || !is_ready[i] || emitted[i]) return;
    ready.erase(key[i]);
    key[i] = key_of(i);
    ready.insert(key[i]);
  };
  for (int32_t i = 0; i < num_nodes; ++i)
    if (!is_constant(i) && !folded[i] && pending[i] == 0) make_ready(i);

  while (!ready.empty()) {
    const int32_t i = std::get<4>(*ready.begin());
    ready.erase(ready.begin());
    for (ValueId v : operands[i])
      if (int32_t p = producer(v); p >= 0 && is_constant(p) && !emitted[p]) emit(p);
    for (ValueId v : nodes[i].operands)
      if (int32_t p = producer(v); p >= 0 && folded[p] && !emitted[p]) emit(p);
    emit(i);
    for (ValueId v : operands[i]) {
      // A value's last reader frees it (once per value, so this scan is linear overall);
      // a state's X.next producer may stop waiting.
      if (--readers_left[v.id] == 1)
        for (int32_t c : readers[v.id]) rekey(c);
      rekey(next_producer[v.id]);
    }
    for (ValueId r : nodes[i].results)
      for (int32_t c : readers[r.id])
        if (--pending[c] == 0) make_ready(c);
  }
  for (int32_t i = 0; i < num_nodes; ++i)
    if (!emitted[i]) {
      KILN_CHECK(is_constant(i), "schedule: node " + std::to_string(i) + " of @" + g.name() + " never became ready");
      emit(i);
    }
  return order;
}

Graph rebuild_in_order(const Graph& g, const std::vector<int32_t>& order) {
  Rebuilder rb(g);
  for (int32_t i : order) rb.copy(g.nodes()[i]);
  return rb.finish();
}

}  // namespace

Graph schedule(const Graph& g, const PassOptions& /*options*/) {
  std::vector<int32_t> original(g.nodes().size());
  std::iota(original.begin(), original.end(), 0);
  std::vector<std::vector<int32_t>> tried = {original};
  // With a collective the greedy orders, which overlap it, are taken even when the original
  // order's peak is lower: the cost of overlap is the memory of the results it keeps alive
  // longer.
  const bool overlap = std::any_of(g.nodes().begin(), g.nodes().end(),
                                   [](const Node& n) { return op_info(n.op).has(kCollective); });
  int64_t best_peak = overlap ? std::numeric_limits<int64_t>::max() : peak_live_bytes(g);
  std::optional<Graph> best;
  for (TieBreak tie : {TieBreak::Original, TieBreak::Recent, TieBreak::DepthFirst}) {
    std::vector<int32_t> order = greedy_order(g, tie);
    if (std::find(tried.begin(), tried.end(), order) != tried.end()) continue;
    tried.push_back(order);
    Graph h = rebuild_in_order(g, order);
    if (int64_t peak = peak_live_bytes(h); peak < best_peak) best_peak = peak, best = std::move(h);
  }
  if (best) return std::move(*best);
  return rebuild_in_order(g, original);
}

}  // namespace kiln
