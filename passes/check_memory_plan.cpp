// The memory plan checker (see check_memory_plan.h). Deliberately written without the
// planner's code: liveness is recomputed here from scratch, and the in-place rules are
// restated, so a planner bug cannot hide behind itself. Every check is near-linear in the
// graph (a sweep over time for the overlaps), so it can run on every compile.
#include "passes/check_memory_plan.h"

#include <algorithm>
#include <map>

#include "ir/calling.h"
#include "ir/printer.h"
#include "passes/memory_plan.h"

namespace kiln {

namespace {

struct Checker {
  const Graph& g;
  const MemoryPlan& plan;
  mutable std::vector<std::string> names;  // made on the first failure: a passing check needs none
  int32_t end_of_graph = 0;
  std::vector<int32_t> first, last;  // live interval per value, recomputed
  // Per value v: the nodes reading it, ascending, are reader_list[reader_begin[v] ..
  // reader_begin[v + 1]) (one flat array: no allocation per value).
  std::vector<int32_t> reader_begin, reader_list;

  [[noreturn]] void fail(const std::string& message) const {
    internal_error("check_memory_plan", "memory plan of @" + g.name() + ": " + message);
  }

  std::string interval(ValueId v) const {
    return (first[v.id] < 0 ? std::string("in") : std::to_string(first[v.id])) + ".." +
           (last[v.id] >= end_of_graph ? std::string("out") : std::to_string(last[v.id]));
  }
  std::string describe(ValueId v) const {
    const ValuePlan& p = plan.values[v.id];
    if (names.empty()) names = value_names(g);
    std::string s = names[v.id] + " (" + g.type(v).str() + ", live " + interval(v);
    if (p.kind == BufferKind::Arena)
      s += ", bytes [" + std::to_string(p.offset) + ", " + std::to_string(p.offset + p.bytes) + ")";
    return s + ")";
  }

  // Liveness, the simple way: a value is live from its definition to its last reader.
  void compute_liveness() {
    end_of_graph = static_cast<int32_t>(g.nodes().size());
    const size_t values = g.values().size();
    // Count each (value, node) read once, then fill in node order: each list ascends.
    std::vector<int32_t> last_reader(values, -1), count(values + 1, 0);
    for (int32_t i = 0; i < end_of_graph; ++i)
      for (ValueId v : g.nodes()[i].operands)
        if (last_reader[v.id] != i) last_reader[v.id] = i, ++count[v.id + 1];
    reader_begin.assign(values + 1, 0);
    for (size_t id = 0; id < values; ++id) reader_begin[id + 1] = reader_begin[id] + count[id + 1];
    reader_list.resize(static_cast<size_t>(reader_begin[values]));
    std::vector<int32_t> fill(reader_begin.begin(), reader_begin.end() - 1);
    std::fill(last_reader.begin(), last_reader.end(), -1);
    for (int32_t i = 0; i < end_of_graph; ++i)
      for (ValueId v : g.nodes()[i].operands)
        if (last_reader[v.id] != i) last_reader[v.id] = i, reader_list[fill[v.id]++] = i;
    for (size_t id = 0; id < values; ++id) {
      first.push_back(g.values()[id].node);
      bool read = reader_begin[id + 1] > reader_begin[id];
      last.push_back(read ? std::max(first.back(), reader_list[reader_begin[id + 1] - 1]) : first.back());
    }
    for (const GraphOutput& o : g.outputs()) last[o.value.id] = end_of_graph;
    // A transpose folded into its GEMM readers keeps its source live until the last of them.
    const std::vector<bool> folded = gemm_folded_transposes(g);
    for (int32_t i = 0; i < end_of_graph; ++i)
      if (folded[i]) {
        const ValueId src = g.nodes()[i].operands[0];
        last[src.id] = std::max(last[src.id], last[g.nodes()[i].result().id]);
      }
  }

  // May node `n` write `result` over `operand`? Restated from memory_plan.h: same shape and
  // bytes, and `operand` is read only elementwise on the way to `result`. For a fused node,
  // each body value is asked whether it depends on the operand; every body op that does
  // must be elementwise over the operand's shape, and the result must be one of them.
  bool in_place_ok(const Node& n, ValueId operand, ValueId result) const {
    const TensorType& t = g.type(operand);
    const TensorType& rt = g.type(result);
    if (n.op == Op::Reshape)  // a view: every element keeps its byte offset
      return reads(n, operand) && n.results.at(0) == result && t.numel() == rt.numel() && t.dtype == rt.dtype;
    if (t.shape != rt.shape || t.nbytes() != rt.nbytes())
      return false;
    if (!reads(n, operand)) return false;
    if (n.op != Op::Fused) return op_info(n.op).has(kElementwise);
    if (n.body == nullptr) return false;
    const Graph& body = *n.body;
    std::vector<int> memo(body.values().size(), -1);  // -1 unknown, 0 no, 1 yes
    auto depends = [&](auto&& self, ValueId v) -> bool {
      if (memo[v.id] >= 0) return memo[v.id] == 1;
      bool d = false;
      const Value& bv = body.value(v);
      if (bv.node < 0) {
        d = n.operands.at(bv.input) == operand;
      } else {
        for (ValueId o : body.nodes()[bv.node].operands) d = d || self(self, o);
      }
      memo[v.id] = d ? 1 : 0;
      return d;
    };
    for (const Node& b : body.nodes())
      for (ValueId r : b.results)
        if (depends(depends, r) && (!op_info(b.op).has(kElementwise) || body.type(r).shape != t.shape)) return false;
    size_t index = 0;
    while (n.results.at(index) != result) ++index;
    return depends(depends, body.outputs().at(index).value);
  }

  bool reads(const Node& n, ValueId v) const {
    return std::find(n.operands.begin(), n.operands.end(), v) != n.operands.end();
  }

  // Per value: the concat result whose slice holds it, by the rule restated from
  // memory_plan.h (the concat's last operand reading it, read once, the result's axes before
  // the concat axis all 1, the value planned exactly at its slice), else invalid.
  std::vector<ValueId> concat_slice_of;
  void find_concat_slices() {
    concat_slice_of.assign(g.values().size(), ValueId{});
    for (int32_t i = 0; i < end_of_graph; ++i) {
      const Node& n = g.nodes()[i];
      if (n.op != Op::Concat || n.results.size() != 1) continue;
      const ValueId r = n.result();
      const ValuePlan& rp = plan.values[r.id];
      const Shape& shape = g.type(r).shape;
      const int64_t axis_attr = attr_int(n.attrs, "axis");
      const int64_t axis = axis_attr < 0 ? axis_attr + static_cast<int64_t>(shape.size()) : axis_attr;
      if (rp.kind != BufferKind::Arena || axis < 0 || axis >= static_cast<int64_t>(shape.size()) ||
          shape[static_cast<size_t>(axis)] == 0)
        continue;
      int64_t outer = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
      if (outer != 1) continue;
      const int64_t unit = g.type(r).nbytes() / shape[static_cast<size_t>(axis)];
      int64_t at = 0;
      for (ValueId o : n.operands) {
        const ValuePlan& op = plan.values[o.id];
        if (op.kind == BufferKind::Arena && last[o.id] == i && op.offset == rp.offset + at &&
            std::count(n.operands.begin(), n.operands.end(), o) == 1)
          concat_slice_of[o.id] = r;
        at += g.type(o).shape.at(static_cast<size_t>(axis)) * unit;
      }
    }
  }

  // Slice views, by the rule restated from memory_plan.h. view_of: per value, the operand
  // whose run it holds (a slice result planned at its run of the operand, or a value
  // written in place over such a one), else invalid. view_end: per operand with views, the
  // last time one of them is live (else -1). The overlap sweep leaves the views out and
  // keeps their operand live to view_end instead.
  std::vector<ValueId> view_of;
  std::vector<int32_t> view_end;
  void find_slice_views() {
    const size_t values = g.values().size();
    view_of.assign(values, ValueId{});
    view_end.assign(values, -1);
    std::vector<bool> has_views(values, false);
    for (int32_t i = 0; i < end_of_graph; ++i) {
      const Node& n = g.nodes()[i];
      if (n.op != Op::Slice) continue;
      const std::optional<int64_t> at = contiguous_slice_start(g, n);
      const ValueId o = n.operands[0], r = n.result();
      const ValuePlan& po = plan.values[o.id];
      const ValuePlan& pr = plan.values[r.id];
      if (!at || po.kind != BufferKind::Arena || pr.kind != BufferKind::Arena || pr.offset != po.offset + *at) continue;
      view_of[r.id] = o;
      has_views[o.id] = true;
    }
    for (size_t id = 0; id < values; ++id) {
      if (!has_views[id]) continue;
      const ValueId o{static_cast<int32_t>(id)};
      // Every reader of o one of its views, at disjoint runs, and o no output: then nothing
      // reads o's bytes where a value written over a view could have changed them.
      if (last[id] >= end_of_graph) fail(describe(o) + " has slices planned as views but is a graph output");
      std::vector<std::pair<int64_t, int64_t>> runs;
      for (int32_t k = reader_begin[id]; k < reader_begin[id + 1]; ++k) {
        const Node& n = g.nodes()[reader_list[k]];
        if (n.op != Op::Slice || view_of[n.result().id] != o)
          fail(describe(o) + " has slices planned as views, and node " + std::to_string(reader_list[k]) +
               " reads it otherwise");
        const ValuePlan& pr = plan.values[n.result().id];
        runs.emplace_back(pr.offset, pr.offset + pr.bytes);
      }
      std::sort(runs.begin(), runs.end());
      for (size_t k = 1; k < runs.size(); ++k)
        if (runs[k].first < runs[k - 1].second) fail(describe(o) + " has slices planned as views at overlapping runs");
    }
    // Values written in place over a view join its operand's views, in definition order.
    for (int32_t i = 0; i < end_of_graph; ++i) {
      const Node& n = g.nodes()[i];
      for (ValueId r : n.results) {
        const ValuePlan& pr = plan.values[r.id];
        if (pr.kind != BufferKind::Arena || view_of[r.id].valid()) continue;
        for (ValueId p : n.operands) {
          const ValuePlan& pp = plan.values[p.id];
          if (view_of[p.id].valid() && pp.offset == pr.offset && pp.bytes == pr.bytes && last[p.id] == i &&
              in_place_ok(n, p, r)) {
            view_of[r.id] = view_of[p.id];
            break;
          }
        }
      }
    }
    for (size_t id = 0; id < values; ++id)
      if (view_of[id].valid()) view_end[view_of[id].id] = std::max(view_end[view_of[id].id], last[id]);
  }

  // a and b are arena values at overlapping bytes and overlapping lifetimes: is it one
  // value written in place over the other, or a concat operand in its slice of the result
  // (whose bytes it holds until the concat, the result's first node, its last reader)?
  bool legal_in_place(ValueId a, ValueId b) const {
    if (concat_slice_of[a.id] == b || concat_slice_of[b.id] == a) return true;
    if (first[a.id] > first[b.id]) std::swap(a, b);
    const ValueId operand = a, result = b;
    const ValuePlan& po = plan.values[operand.id];
    const ValuePlan& pr = plan.values[result.id];
    if (first[operand.id] == first[result.id]) return false;  // two results of one node
    if (po.offset != pr.offset || po.bytes != pr.bytes) return false;
    if (last[operand.id] != first[result.id]) return false;  // operand must die right there
    if (view_end[operand.id] > first[result.id]) return false;  // its views still read its bytes
    return in_place_ok(g.nodes()[first[result.id]], operand, result);
  }

  void check_values() {
    if (plan.values.size() != g.values().size())
      fail("plans " + std::to_string(plan.values.size()) + " values, the graph has " +
           std::to_string(g.values().size()));
    if (plan.alignment <= 0) fail("alignment " + std::to_string(plan.alignment));
    std::vector<int> times_listed(g.values().size(), 0);  // in any buffer's value list
    for (const Buffer& b : plan.buffers)
      for (ValueId v : b.values)
        if (v.valid() && v.id < static_cast<int32_t>(times_listed.size())) ++times_listed[v.id];
    std::vector<int> in_state_buffer(g.values().size(), 0);  // per state: values planned in its buffer
    for (const ValuePlan& p : plan.values)
      if (p.kind == BufferKind::StateInPlace && p.state.valid() && p.state.id < static_cast<int32_t>(g.values().size()))
        ++in_state_buffer[p.state.id];
    for (size_t id = 0; id < g.values().size(); ++id) {
      const ValueId v{static_cast<int32_t>(id)};
      const Value& value = g.value(v);
      const ValuePlan& p = plan.values[id];
      const int64_t bytes = value.type.nbytes();
      if (p.bytes != bytes)
        fail(describe(v) + " is planned as " + std::to_string(p.bytes) + " bytes, not " + std::to_string(bytes));
      if (p.start != first[id] || p.end != last[id])
        fail(describe(v) + " has planned interval " + std::to_string(p.start) + ".." + std::to_string(p.end));
      BufferKind expected = BufferKind::Arena;
      if (value.node < 0)
        expected = g.is_state(v) ? BufferKind::State : BufferKind::Input;
      else if (g.nodes()[value.node].op == Op::Constant)
        expected = BufferKind::Constant;
      const bool kind_ok = p.kind == expected ||
                           (expected == BufferKind::Arena && p.kind == BufferKind::StateInPlace);
      if (!kind_ok)
        fail(describe(v) + " is planned as " + std::string(buffer_kind_name(p.kind)) + ", expected " +
             std::string(buffer_kind_name(expected)));
      if (p.kind == BufferKind::StateInPlace) check_state_in_place(v, in_state_buffer);
      if (p.kind != BufferKind::Arena) continue;
      if (p.offset < 0 || p.offset % plan.alignment != 0)
        fail(describe(v) + " is not aligned to " + std::to_string(plan.alignment) + " bytes");
      if (p.offset + p.bytes > plan.report.arena_bytes)
        fail(describe(v) + " ends past the arena's " + std::to_string(plan.report.arena_bytes) + " bytes");
      if (p.buffer < 0 || p.buffer >= static_cast<int32_t>(plan.buffers.size()))
        fail(describe(v) + " has no buffer");
      const Buffer& b = plan.buffers[p.buffer];
      // Listed once, and (the loop below) only in the buffer it is planned in.
      if (times_listed[id] != 1 || p.within < 0 || b.offset + p.within != p.offset || p.within + p.bytes > b.bytes)
        fail(describe(v) + " disagrees with its buffer b" + std::to_string(p.buffer));
    }
    for (size_t b = 0; b < plan.buffers.size(); ++b)
      for (ValueId v : plan.buffers[b].values)
        if (!v.valid() || v.id >= static_cast<int32_t>(plan.values.size()) ||
            plan.values[v.id].kind != BufferKind::Arena || plan.values[v.id].buffer != static_cast<int32_t>(b))
          fail("buffer b" + std::to_string(b) + " lists a value not planned in it");
  }

  void check_state_in_place(ValueId v, const std::vector<int>& in_state_buffer) {
    const ValueId x = plan.values[v.id].state;
    if (!x.valid() || x.id >= static_cast<int32_t>(g.values().size()) || g.value(x).node >= 0 || !g.is_state(x))
      fail(describe(v) + " is in a state buffer, but not of a state input");
    const std::string next_name = update_name(g.value(x).name);
    bool is_next = false;
    for (const GraphOutput& o : g.outputs()) {
      if (o.value == x) fail(describe(v) + " overwrites " + describe(x) + ", which is an output");
      is_next |= o.name == next_name && o.value == v;
    }
    if (!is_next) fail(describe(v) + " is in the buffer of " + describe(x) + " but is not its output " + next_name);
    const int32_t at = first[v.id];
    for (int32_t k = reader_begin[x.id]; k < reader_begin[x.id + 1]; ++k) {
      const int32_t i = reader_list[k];
      if (i > at)
        fail(describe(v) + " overwrites " + describe(x) + ", which node " + std::to_string(i) + " reads later");
      if (i == at && (!in_place_ok(g.nodes()[i], x, v) || g.type(x) != g.type(v)))
        fail(describe(v) + " overwrites " + describe(x) + " in a node that reads it other than elementwise");
    }
    if (in_state_buffer[x.id] > 1)
      for (size_t id = 0; id < plan.values.size(); ++id)
        if (static_cast<int32_t>(id) != v.id && plan.values[id].kind == BufferKind::StateInPlace &&
            plan.values[id].state == x)
          fail(describe(v) + " and " + describe(ValueId{static_cast<int32_t>(id)}) + " are both in the buffer of " +
               describe(x));
  }

  // No two arena values may overlap in memory while both live, unless one is written in
  // place over the other (then their bytes are the same). A sweep over time: values enter
  // in order of definition, each checked against the values live then, which are kept by
  // offset. Those pairwise overlap only in place, at equal ranges, so the values that can
  // overlap a new one are its neighbours by offset: the check costs O(log n) per value.
  void check_overlaps() {
    std::vector<ValueId> arena;
    for (size_t id = 0; id < plan.values.size(); ++id)
      if (plan.values[id].kind == BufferKind::Arena && plan.values[id].bytes > 0 && !view_of[id].valid())
        arena.push_back(ValueId{static_cast<int32_t>(id)});
    // An operand with views holds its bytes until the last of them dies.
    std::vector<int32_t> end = last;
    for (size_t id = 0; id < end.size(); ++id) end[id] = std::max(end[id], view_end[id]);
    // Times are node indices (or end_of_graph), so a counting sort orders them in linear time.
    auto by_time = [&](const std::vector<ValueId>& vs, const std::vector<int32_t>& time) {
      std::vector<int32_t> start(static_cast<size_t>(end_of_graph) + 2, 0);
      for (ValueId v : vs) ++start[static_cast<size_t>(time[v.id]) + 1];
      for (size_t t = 1; t < start.size(); ++t) start[t] += start[t - 1];
      std::vector<ValueId> out(vs.size());
      for (ValueId v : vs) out[static_cast<size_t>(start[static_cast<size_t>(time[v.id])]++)] = v;
      return out;
    };
    arena = by_time(arena, first);
    const std::vector<ValueId> by_end = by_time(arena, end);
    std::multimap<int64_t, ValueId> live;  // by offset
    std::vector<std::multimap<int64_t, ValueId>::iterator> where(plan.values.size());
    size_t ended = 0;
    auto check_pair = [&](ValueId x, ValueId y) {
      const ValuePlan& a = plan.values[x.id];
      const ValuePlan& b = plan.values[y.id];
      bool overlap = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
      if (overlap && !legal_in_place(x, y)) {
        if (a.offset > b.offset || (a.offset == b.offset && x.id > y.id)) std::swap(x, y);
        fail(describe(x) + " and " + describe(y) + " overlap in memory while both live");
      }
    };
    for (ValueId y : arena) {
      while (ended < by_end.size() && end[by_end[ended].id] < first[y.id]) live.erase(where[by_end[ended++].id]);
      const ValuePlan& p = plan.values[y.id];
      auto at = live.lower_bound(p.offset);
      // Below: live ranges are disjoint but for equal ones, so their ends fall as we go
      // down, and the first that ends at or before p.offset ends the search.
      for (auto it = at; it != live.begin();) {
        --it;
        if (it->first + plan.values[it->second.id].bytes <= p.offset) break;
        check_pair(it->second, y);
      }
      for (auto it = at; it != live.end() && it->first < p.offset + p.bytes; ++it) check_pair(it->second, y);
      where[y.id] = live.emplace(p.offset, y);
    }
  }
};

}  // namespace

void check_memory_plan(const Graph& g, const MemoryPlan& plan) {
  Checker c{g, plan, {}, 0, {}, {}, {}, {}, {}, {}, {}};
  c.compute_liveness();
  c.find_concat_slices();
  c.find_slice_views();
  c.check_values();
  c.check_overlaps();
}

}  // namespace kiln
