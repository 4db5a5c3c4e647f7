// Memory planning (see memory_plan.h for the conventions). Three steps:
//  1. liveness and kinds: each value's interval; state outputs go into their state's
//     buffer where legal; results take over a dying operand's buffer where legal;
//  2. placement: each buffer (a group of values sharing storage) gets the lowest aligned
//     offset, or the tightest gap, clear of every placed buffer whose interval meets its
//     own; several orders are tried (largest first, earliest first, longest-lived first)
//     and the smallest arena wins;
//  3. the report.
#include "passes/memory_plan.h"

#include <algorithm>
#include <bit>
#include <iomanip>
#include <map>
#include <sstream>

#include "ir/calling.h"
#include "ir/printer.h"
#include "ir/strides.h"
#include "passes/kernel_plan.h"

namespace kiln {

namespace {

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The most bytes a plan may place or count. Every value's type is within kMaxElements
// (below 2^43 bytes), but a graph of many values could still sum past int64: plan_memory
// checks, once, that the values' aligned sizes add up to at most this, which bounds every
// offset, arena size, peak and report sum computed after.
constexpr int64_t kMaxPlanBytes = int64_t{1} << 62;

void check_total_bytes(const Graph& g, int64_t alignment) {
  int64_t total = 0;
  for (const Value& v : g.values())
    if (__builtin_add_overflow(total, align_up(v.type.nbytes(), alignment), &total) || total > kMaxPlanBytes)
      throw Error("plan_memory @" + g.name() + ": the graph's values take more than 2^62 bytes together");
}

struct Analysis {
  std::vector<ValuePlan> values;
  std::vector<Buffer> buffers;  // offsets not assigned yet
  int64_t concat_operands = 0;  // placed in their slices of a concat's result
  int64_t slice_views = 0;      // slice results placed at their runs of the operand
};

// Drops the buffers emptied by moving their values into others.
void drop_empty_buffers(Analysis& a) {
  std::vector<int32_t> index(a.buffers.size(), -1);
  std::vector<Buffer> kept;
  for (size_t b = 0; b < a.buffers.size(); ++b)
    if (!a.buffers[b].values.empty()) index[b] = static_cast<int32_t>(kept.size()), kept.push_back(std::move(a.buffers[b]));
  for (ValuePlan& p : a.values)
    if (p.buffer >= 0) p.buffer = index[static_cast<size_t>(p.buffer)];
  a.buffers = std::move(kept);
}

// Moves buffer `from`'s values (one chain) into buffer `to` at `within`.
void move_chain(Analysis& a, int32_t from, int32_t to, int64_t within) {
  Buffer& f = a.buffers[static_cast<size_t>(from)];
  Buffer& t = a.buffers[static_cast<size_t>(to)];
  for (ValueId v : f.values) {
    a.values[v.id].within = within;
    a.values[v.id].buffer = to;
    t.values.push_back(v);
  }
  t.start = std::min(t.start, f.start);
  t.end = std::max(t.end, f.end);
  f.values.clear();
}

// Concat operands into their slices of the result's buffer (memory_plan.h), then the
// emptied buffers dropped. Linear in the graph.
void place_concat_operands(const Graph& g, Analysis& a, int64_t alignment) {
  const auto num_nodes = static_cast<int32_t>(g.nodes().size());
  std::vector<bool> hosts(a.buffers.size(), false);  // holds concat slices: not itself movable
  bool moved = false;
  for (int32_t i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != Op::Concat || n.results.size() != 1) continue;
    const ValueId r = n.result();
    const ValuePlan& rp = a.values[r.id];
    const Shape& shape = g.type(r).shape;
    const int64_t axis_attr = attr_int(n.attrs, "axis");
    const auto axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + static_cast<int64_t>(shape.size()) : axis_attr);
    if (rp.kind != BufferKind::Arena || axis >= shape.size() || shape[axis] == 0) continue;
    bool leading_ones = true;
    for (size_t d = 0; d < axis; ++d) leading_ones = leading_ones && shape[d] == 1;
    if (!leading_ones) continue;
    const int64_t unit = rp.bytes / shape[axis];  // the bytes of one index along the axis
    int64_t base = 0;
    for (ValueId o : n.operands) {
      const int64_t at = base;
      base += g.type(o).shape.at(axis) * unit;
      const ValuePlan& op = a.values[o.id];
      if (op.kind != BufferKind::Arena || op.end != i || op.buffer == rp.buffer || hosts[op.buffer] ||
          at % alignment != 0 || std::count(n.operands.begin(), n.operands.end(), o) != 1)
        continue;
      Buffer& from = a.buffers[op.buffer];
      if (from.values.empty() || from.values.back() != o) continue;
      move_chain(a, op.buffer, rp.buffer, at);
      hosts[rp.buffer] = true;
      moved = true;
      ++a.concat_operands;
    }
  }
  if (moved) drop_empty_buffers(a);
}

// Slice results into their runs of the operand's buffer (memory_plan.h). Linear in the graph.
void place_slice_views(const Graph& g, Analysis& a, int64_t alignment) {
  const auto num_nodes = static_cast<int32_t>(g.nodes().size());
  std::vector<std::vector<int32_t>> readers(g.values().size());
  for (int32_t i = 0; i < num_nodes; ++i)
    for (ValueId v : g.nodes()[i].operands) readers[v.id].push_back(i);
  std::vector<bool> is_output(g.values().size(), false);
  for (const GraphOutput& o : g.outputs()) is_output[o.value.id] = true;
  // Per buffer, the latest start of a value in it (views moved in included).
  std::vector<int32_t> latest(a.buffers.size(), -1);
  for (size_t b = 0; b < a.buffers.size(); ++b)
    for (ValueId v : a.buffers[b].values) latest[b] = std::max(latest[b], a.values[v.id].start);
  bool moved = false;
  for (size_t id = 0; id < g.values().size(); ++id) {
    const ValuePlan& op = a.values[id];
    if (op.kind != BufferKind::Arena || op.buffer < 0 || is_output[id] || readers[id].empty()) continue;
    // Nothing written over o's bytes after o (its buffer's other values came before it).
    if (latest[static_cast<size_t>(op.buffer)] > op.start) continue;
    struct View {
      ValueId r;
      int64_t at;
    };
    std::vector<View> views;
    bool all = true;
    for (int32_t i : readers[id]) {
      const Node& n = g.nodes()[i];
      const std::optional<int64_t> at = n.op == Op::Slice ? contiguous_slice_start(g, n) : std::nullopt;
      const ValuePlan* rp = at ? &a.values[n.result().id] : nullptr;
      if (!at || rp->kind != BufferKind::Arena || rp->buffer < 0 || (op.within + *at) % alignment != 0) {
        all = false;
        break;
      }
      const Buffer& rb = a.buffers[static_cast<size_t>(rp->buffer)];
      bool own = rb.values.front() == n.result();  // heads a buffer of its own: one chain at 0
      for (size_t k = 0; own && k < rb.values.size(); ++k) own = a.values[rb.values[k].id].within == 0;
      if (!own) {
        all = false;
        break;
      }
      views.push_back({n.result(), *at});
    }
    if (!all) continue;
    // Disjoint runs: a value written in place over one view changes no other's bytes.
    std::sort(views.begin(), views.end(), [](const View& x, const View& y) { return x.at < y.at; });
    bool disjoint = true;
    for (size_t k = 1; k < views.size(); ++k)
      disjoint = disjoint && views[k - 1].at + a.values[views[k - 1].r.id].bytes <= views[k].at;
    if (!disjoint) continue;
    for (const View& v : views) {
      const auto from = static_cast<size_t>(a.values[v.r.id].buffer);
      latest[static_cast<size_t>(op.buffer)] = std::max(latest[static_cast<size_t>(op.buffer)], latest[from]);
      move_chain(a, static_cast<int32_t>(from), op.buffer, op.within + v.at);
      ++a.slice_views;
      moved = true;
    }
  }
  if (moved) drop_empty_buffers(a);
}

Analysis analyze(const Graph& g, int64_t alignment) {
  const auto num_nodes = static_cast<int32_t>(g.nodes().size());
  Analysis a;
  a.values.resize(g.values().size());
  for (size_t id = 0; id < g.values().size(); ++id) {
    const Value& v = g.values()[id];
    ValuePlan& p = a.values[id];
    p.bytes = v.type.nbytes();
    p.start = p.end = v.node;
    if (v.node < 0)
      p.kind = g.inputs().at(v.input).is_state ? BufferKind::State : BufferKind::Input;
    else
      p.kind = g.nodes()[v.node].op == Op::Constant ? BufferKind::Constant : BufferKind::Arena;
  }
  for (int32_t i = 0; i < num_nodes; ++i)
    for (ValueId v : g.nodes()[i].operands) a.values[v.id].end = i;  // nodes in order: the max
  for (const GraphOutput& o : g.outputs()) a.values[o.value.id].end = num_nodes;
  // A transpose the GEMMs read through keeps its source live until its last reader. (Its
  // readers are matmuls, so no folded transpose's result is another one's source.)
  const std::vector<bool> folded = gemm_folded_transposes(g);
  for (int32_t i = 0; i < num_nodes; ++i)
    if (folded[i]) {
      ValuePlan& src = a.values[g.nodes()[i].operands[0].id];
      src.end = std::max(src.end, a.values[g.nodes()[i].result().id].end);
    }

  // State outputs X.next into X's own buffer, where legal.
  std::vector<bool> state_taken(g.values().size(), false);
  for (const GraphOutput& o : g.outputs()) {
    ValueId x = updated_state(g, o);
    if (!x.valid()) continue;
    ValuePlan& next = a.values[o.value.id];
    const ValuePlan& state = a.values[x.id];
    if (next.kind != BufferKind::Arena || g.type(x) != g.type(o.value)) continue;
    if (state.end == num_nodes) continue;  // X itself is an output: its old value must survive
    if (state.end > next.start) continue;  // read after X.next is written
    if (state.end == next.start && !can_write_in_place(g, g.nodes()[next.start], x, o.value))
      continue;  // X.next's own node reads X, and not only elementwise
    if (state_taken[x.id]) continue;  // another output already put a value in X's buffer
    state_taken[x.id] = true;
    next.kind = BufferKind::StateInPlace;
    next.state = x;
  }

  // Buffers: each arena result starts one, or takes over a dying operand's (in place).
  for (int32_t i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[i];
    std::vector<int32_t> taken;  // buffers this node's results already took over
    for (ValueId r : n.results) {
      ValuePlan& rp = a.values[r.id];
      if (rp.kind != BufferKind::Arena) continue;
      int32_t chosen = -1;
      for (ValueId o : n.operands) {
        const ValuePlan& op = a.values[o.id];
        if (op.kind != BufferKind::Arena || op.end != i || !can_write_in_place(g, n, o, r)) continue;
        if (std::find(taken.begin(), taken.end(), op.buffer) != taken.end()) continue;
        chosen = op.buffer;
        break;
      }
      if (chosen < 0) {
        chosen = static_cast<int32_t>(a.buffers.size());
        a.buffers.push_back(Buffer{{}, 0, rp.bytes, rp.start, rp.end});
      } else {
        taken.push_back(chosen);
      }
      Buffer& b = a.buffers[chosen];
      b.values.push_back(r);
      b.end = std::max(b.end, rp.end);
      rp.buffer = chosen;
    }
  }
  place_concat_operands(g, a, alignment);
  place_slice_views(g, a, alignment);
  return a;
}

}  // namespace

std::optional<int64_t> contiguous_slice_start(const Graph& g, const Node& n) {
  if (n.op != Op::Slice || n.operands.size() != 1 || n.results.size() != 1) return std::nullopt;
  const TensorType& in = g.type(n.operands[0]);
  const TensorType& out = g.type(n.result());
  if (out.numel() == 0) return std::nullopt;
  const StridedView view = source_view(n, in.shape, out.shape);
  const MergedDims m = merge_dims(out.shape, {view});
  if (m.dims.size() > 1 || (m.dims.size() == 1 && m.strides[0][0] != 1)) return std::nullopt;
  return view.base * static_cast<int64_t>(dtype_size(in.dtype));
}

std::vector<bool> gemm_folded_transposes(const Graph& g) {
  const size_t num_nodes = g.nodes().size();
  std::vector<int32_t> uses(g.values().size(), 0), gemm_uses(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.operands) {
      ++uses[v.id];
      if (n.op == Op::Matmul) ++gemm_uses[v.id];
    }
  for (const GraphOutput& o : g.outputs()) ++uses[o.value.id];
  std::vector<bool> folded(num_nodes, false);
  for (size_t i = 0; i < num_nodes; ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != Op::Transpose || !is_last_two_swap(attr_ints(n.attrs, "perm"))) continue;
    const ValueId r = n.result();
    folded[i] = uses[r.id] > 0 && uses[r.id] == gemm_uses[r.id];
  }
  return folded;
}

namespace {

int64_t peak_of(const std::vector<Buffer>& buffers, size_t num_nodes) {
  std::vector<int64_t> delta(num_nodes + 2, 0);
  for (const Buffer& b : buffers) {
    delta[b.start] += b.bytes;
    delta[b.end + 1] -= b.bytes;
  }
  int64_t live = 0, peak = 0;
  for (int64_t d : delta) peak = std::max(peak, live += d);
  return peak;
}

// The placed buffers, found by lifetime: those live at some point of [s, e] are those
// live at s (a stabbing query on a segment tree over time) and those starting in (s, e].
// Each query costs O(log n) plus the buffers it finds, where a scan of every placed
// buffer made placement quadratic in the graph.
//
// One is made per plan and emptied between placements (only the tree nodes a placement
// filled are cleared): making and freeing its 2 x 2^ceil(log2 times) node lists for each of
// plan_memory's six placements was most of its time on a 16k-node graph, and grew faster
// than the graph (the lists outgrow the caches).
class PlacedByTime {
 public:
  explicit PlacedByTime(int32_t times) : times_(std::max(times, 1)), tree_(2 * std::bit_ceil(static_cast<size_t>(times_))) {}

  void insert(int32_t b, int32_t start, int32_t end) {
    insert(1, 0, times_ - 1, start, end, b);
    by_start_.emplace(start, b);
  }
  void clear() {
    for (size_t node : filled_) tree_[node].clear();
    filled_.clear();
    by_start_.clear();
  }
  // Calls f(b) for each placed buffer b whose lifetime meets [start, end], once.
  template <typename F>
  void meeting(int32_t start, int32_t end, F&& f) const {
    for (size_t node = 1, lo = 0, hi = static_cast<size_t>(times_) - 1;;) {
      for (int32_t b : tree_[node]) f(b);
      if (lo == hi) break;
      size_t mid = (lo + hi) / 2;
      if (static_cast<size_t>(start) <= mid) node = 2 * node, hi = mid;
      else node = 2 * node + 1, lo = mid + 1;
    }
    for (auto it = by_start_.upper_bound(start); it != by_start_.end() && it->first <= end; ++it) f(it->second);
  }

 private:
  void insert(size_t node, int32_t lo, int32_t hi, int32_t start, int32_t end, int32_t b) {
    if (end < lo || hi < start) return;
    if (start <= lo && hi <= end) {
      if (tree_[node].empty()) filled_.push_back(node);
      tree_[node].push_back(b);
      return;
    }
    int32_t mid = lo + (hi - lo) / 2;
    insert(2 * node, lo, mid, start, end, b);
    insert(2 * node + 1, mid + 1, hi, start, end, b);
  }

  int32_t times_;
  std::vector<std::vector<int32_t>> tree_;
  std::vector<size_t> filled_;  // tree nodes holding buffers
  std::multimap<int32_t, int32_t> by_start_;
};

// Places buffers in the given order; returns the arena size and fills `offsets`.
int64_t place(const std::vector<Buffer>& buffers, const std::vector<int32_t>& order, bool best_fit,
              int64_t alignment, PlacedByTime& placed, std::vector<int64_t>& offsets) {
  offsets.assign(buffers.size(), 0);
  placed.clear();
  std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of placed buffers live meanwhile
  int64_t arena = 0;
  for (int32_t b : order) {
    const Buffer& buf = buffers[b];
    if (buf.bytes == 0) continue;  // empty: offset 0, overlaps nothing
    busy.clear();
    placed.meeting(buf.start, buf.end, [&](int32_t p) { busy.emplace_back(offsets[p], offsets[p] + buffers[p].bytes); });
    std::sort(busy.begin(), busy.end());
    int64_t candidate = 0, best = -1, best_gap = 0;
    for (const auto& [begin, end] : busy) {
      if (candidate + buf.bytes <= begin) {
        int64_t gap = begin - candidate;
        if (best < 0 || (best_fit && gap < best_gap)) best = candidate, best_gap = gap;
        if (!best_fit) break;
      }
      candidate = std::max(candidate, align_up(end, alignment));
    }
    if (best < 0) best = candidate;  // past everything live meanwhile
    offsets[b] = best;
    arena = std::max(arena, best + buf.bytes);
    placed.insert(b, buf.start, buf.end);
  }
  return align_up(arena, alignment);
}

}  // namespace

std::string_view buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::Arena: return "arena";
    case BufferKind::Input: return "input";
    case BufferKind::State: return "state";
    case BufferKind::StateInPlace: return "state-in-place";
    case BufferKind::Constant: return "constant";
  }
  return "?";
}

bool can_write_in_place(const Graph& g, const Node& n, ValueId operand, ValueId result) {
  const TensorType& type = g.type(operand);
  // A reshape keeps every element's byte offset: its result is a view of the operand.
  if (n.op == Op::Reshape)
    return n.operands.at(0) == operand && n.result() == result && type.nbytes() == g.type(result).nbytes();
  if (type.shape != g.type(result).shape || type.nbytes() != g.type(result).nbytes()) return false;
  if (std::find(n.operands.begin(), n.operands.end(), operand) == n.operands.end()) return false;
  const auto at = std::find(n.results.begin(), n.results.end(), result);
  if (at == n.results.end()) return false;
  if (n.op != Op::Fused) return op_info(n.op).has(kElementwise);
  if (!n.body) return false;

  // The operand's elementwise cone in the body: every body value computed from it.
  const Graph& body = *n.body;
  std::vector<bool> cone(body.values().size(), false);
  for (size_t k = 0; k < n.operands.size(); ++k)
    if (n.operands[k] == operand) cone[body.inputs().at(k).value.id] = true;
  for (const Node& b : body.nodes()) {
    bool reads_cone = false;
    for (ValueId v : b.operands) reads_cone |= cone[v.id];
    if (!reads_cone) continue;
    if (!op_info(b.op).has(kElementwise)) return false;
    for (ValueId r : b.results) {
      if (body.type(r).shape != type.shape) return false;
      cone[r.id] = true;
    }
  }
  return cone[body.outputs().at(at - n.results.begin()).value.id];
}

MemoryPlan plan_memory(const Graph& g, const PassOptions& options) {
  KILN_CHECK(options.alignment > 0 && options.alignment <= (int64_t{1} << 30),
             "plan_memory: alignment must be in 1..2^30");
  check_total_bytes(g, options.alignment);
  Analysis a = analyze(g, options.alignment);
  MemoryPlan plan;
  plan.alignment = options.alignment;

  // Candidate orders; ties keep the buffer index (definition order), so it is deterministic.
  std::vector<int32_t> by_index(a.buffers.size());
  for (size_t i = 0; i < by_index.size(); ++i) by_index[i] = static_cast<int32_t>(i);
  auto sorted = [&](auto less) {
    std::vector<int32_t> o = by_index;
    std::stable_sort(o.begin(), o.end(), [&](int32_t x, int32_t y) { return less(a.buffers[x], a.buffers[y]); });
    return o;
  };
  const std::vector<std::vector<int32_t>> orders = {
      sorted([](const Buffer& x, const Buffer& y) { return x.bytes > y.bytes; }),
      sorted([](const Buffer& x, const Buffer& y) { return x.start < y.start; }),
      sorted([](const Buffer& x, const Buffer& y) {
        return x.end - x.start != y.end - y.start ? x.end - x.start > y.end - y.start : x.bytes > y.bytes;
      }),
  };
  int64_t best = -1;
  std::vector<int64_t> offsets, best_offsets;
  PlacedByTime placed(static_cast<int32_t>(g.nodes().size()) + 1);
  for (const auto& order : orders) {
    for (bool best_fit : {false, true}) {
      int64_t arena = place(a.buffers, order, best_fit, options.alignment, placed, offsets);
      if (best < 0 || arena < best) best = arena, best_offsets = offsets;
    }
  }
  plan.report.arena_bytes = std::max<int64_t>(best, 0);

  for (size_t b = 0; b < a.buffers.size(); ++b) {
    a.buffers[b].offset = best_offsets[b];
    for (ValueId v : a.buffers[b].values) a.values[v.id].offset = best_offsets[b] + a.values[v.id].within;
  }
  MemoryReport& r = plan.report;
  r.peak_live_bytes = peak_of(a.buffers, g.nodes().size());
  r.buffer_count = static_cast<int64_t>(a.buffers.size());
  for (const ValuePlan& p : a.values) {
    switch (p.kind) {
      case BufferKind::Arena: r.value_bytes += p.bytes; break;
      case BufferKind::Input: r.input_bytes += p.bytes; break;
      case BufferKind::State: r.state_bytes += p.bytes; break;
      case BufferKind::StateInPlace: ++r.state_in_place; break;
      case BufferKind::Constant: r.constant_bytes += p.bytes; break;
    }
  }
  for (const Buffer& b : a.buffers) r.in_place_values += static_cast<int64_t>(b.values.size()) - 1;
  r.in_place_values -= a.concat_operands + a.slice_views;  // heads of chains moved into other buffers
  r.concat_operands = a.concat_operands;
  r.slice_views = a.slice_views;
  plan.values = std::move(a.values);
  plan.buffers = std::move(a.buffers);
  return plan;
}

int64_t peak_live_bytes(const Graph& g) {
  check_total_bytes(g, 1);
  return peak_of(analyze(g, PassOptions{}.alignment).buffers, g.nodes().size());
}

std::string format_memory_report(const MemoryPlan& plan) {
  const MemoryReport& r = plan.report;
  std::ostringstream out;
  out << "arena: " << r.arena_bytes << " bytes in " << r.buffer_count << " buffers (alignment " << plan.alignment
      << ")\n";
  out << "sum of values: " << r.value_bytes << " bytes (arena values, as if nothing shared)\n";
  out << "peak live: " << r.peak_live_bytes << " bytes (a lower bound for the arena)\n";
  out << "in place: " << r.in_place_values << " values over an operand's buffer, " << r.state_in_place
      << " state updates in their state's buffer\n";
  if (r.concat_operands > 0)
    out << "concat: " << r.concat_operands << " operands in their slices of the result (nothing copied)\n";
  if (r.slice_views > 0) out << "slice: " << r.slice_views << " results at their runs of the operand (nothing copied)\n";
  out << "external: inputs " << r.input_bytes << " bytes, state " << r.state_bytes << " bytes, constants "
      << r.constant_bytes << " bytes\n";
  return out.str();
}

std::string format_memory_plan(const Graph& g, const MemoryPlan& plan) {
  const std::vector<std::string> names = value_names(g);
  const auto num_nodes = static_cast<int32_t>(g.nodes().size());
  std::vector<std::vector<std::string>> rows = {{"value", "type", "kind", "buffer", "offset", "bytes", "live"}};
  for (size_t id = 0; id < plan.values.size() && id < g.values().size(); ++id) {
    const ValuePlan& p = plan.values[id];
    std::string buffer = "-", offset = "-";
    if (p.kind == BufferKind::Arena) buffer = "b" + std::to_string(p.buffer), offset = std::to_string(p.offset);
    if (p.kind == BufferKind::StateInPlace && p.state.valid()) buffer = names.at(p.state.id);
    std::string live = (p.start < 0 ? std::string("in") : std::to_string(p.start)) + ".." +
                       (p.end >= num_nodes ? std::string("out") : std::to_string(p.end));
    rows.push_back({names[id], g.values()[id].type.str(), std::string(buffer_kind_name(p.kind)), buffer, offset,
                    std::to_string(p.bytes), live});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::ostringstream out;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      bool numeric = c == 4 || c == 5;  // offset, bytes: right-aligned
      if (c + 1 == row.size()) {
        out << row[c];
      } else {
        out << (numeric ? std::right : std::left) << std::setw(static_cast<int>(width[c])) << row[c] << "  ";
      }
    }
    out << '\n';
  }
  return out.str() + format_memory_report(plan);
}

}  // namespace kiln
