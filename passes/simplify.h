// The simplification passes: constant folding, common-subexpression elimination, dead-code
// elimination and exact algebraic identities, and `simplify`, which runs them together.
//
// Every pass here has the one pass signature (passes/pass.h), never mutates its input and
// returns a verified-valid graph that computes, for every output, the same type and (in
// the reference interpreter) the same bits as its input: none of them changes results,
// except where noted for NaN payloads (two NaNs may trade places; a NaN stays a NaN).
// None of them ever adds nodes overall: a pass replaces a node by at most one new node,
// except simplify_algebra's pooled-gradient mask (below), which adds three while making
// two dead and one (the max_pool2d) a duplicate of the forward pass's for cse, and its
// broadcast moved below an elementwise node (below), which adds one while making one dead.
// Graph inputs, their order and state flags, and the outputs' names never change.
#pragma once

#include "ir/graph.h"
#include "passes/pass.h"

namespace kiln {

// fold_constants: a node whose operands are all constants becomes a constant holding the
// value the reference interpreter (kiln::eval_op) computes for it, keeping the node's
// name and note. Not folded: constants themselves; fused nodes (their bodies are for the
// backends); nodes whose result has more than options.fold_max_elements elements (a
// broadcast of a scalar stays a broadcast); and nodes whose evaluation fails (which no op
// of a valid graph does: integer division by zero is 0, docs/ir.md). The operand constants
// are left in place; a later dce removes those that became dead. Folding never
// materializes a broadcast: a folded value whose elements are all equal becomes a scalar
// constant and a broadcast_to, and a value with more elements than its largest operand
// is left unfolded.
// Needs: a valid graph. Keeps: everything above; the node order.
Graph fold_constants(const Graph& g, const PassOptions& options);

// cse: merges nodes that compute the same thing: same op, same operands (after earlier
// merges), equal attributes (constant tensors compared bit for bit, so 0.0 and -0.0 stay
// apart and equal NaNs merge), and for fused nodes the same printed body (ignoring the
// body graph's name and its notes, which are cosmetic). The first node of each class is
// kept; it takes the first user-visible name in its class if it had none (that name is
// free: its owner is gone). Operands of add, mul, eq and ne also match
// swapped. maximum and minimum are commutative (kCommutative) only up to the sign of
// zero: the interpreter returns the second operand on a tie, so maximum(0.0, -0.0) is
// -0.0 and maximum(-0.0, 0.0) is 0.0; they are matched in order only.
// Needs: a valid graph. Keeps: node order of the kept nodes; notes of kept nodes.
Graph cse(const Graph& g, const PassOptions& options);

// dce: removes every node none of whose results reaches an output. Every graph input is
// kept, used or not: the inputs are the graph's interface.
// Needs: a valid graph. Keeps: order, names and notes of the kept nodes.
Graph dce(const Graph& g, const PassOptions& options);

// simplify_algebra: rewrites with identities that hold bit for bit in IEEE arithmetic
// (and in integer arithmetic, which wraps), so never x*0 -> 0, x-x -> 0 or (a+b)-b -> a.
// A node is replaced by an existing value or by one new node (a broadcast_to where the
// identity's constant operand would have broadcast x to the result's shape, or a merged
// shape op). The list, with why each is exact:
//   add(x, -0.0), add(-0.0, x) -> x     x + (-0.0) == x for every x, -0.0 included. NOT
//                                       x + (+0.0): it maps -0.0 to +0.0. For integer
//                                       dtypes any all-zeros constant.
//   sub(x, +0.0) -> x                   x - (+0.0) == x + (-0.0). Not x - (-0.0).
//   mul(x, 1), mul(1, x), div(x, 1)     exact (integers too).
//   pow(x, 1) -> x                      IEEE pow(x, 1) is x (x exactly representable, libm
//                                       error < 1 ulp; pow(+-0, 1) = +-0, pow(+-inf, 1) = +-inf).
//   neg(neg x) -> x, abs(abs x) -> abs x, abs(neg x) -> abs x, relu(relu x) -> relu x
//   maximum(x, x), minimum(x, x) -> x   the same value on both sides.
//   select(c, a, b) with c a constant all true (false) -> a (b); select(c, a, a) -> a.
//   cast(x) to x's own dtype -> x.
//   transpose(transpose(x, p), q) -> transpose(x, p o q); transpose(x, identity) -> x.
//   reshape(reshape(x)) -> reshape(x); reshape(x) to x's shape -> x.
//   broadcast_to(broadcast_to(x)) -> broadcast_to(x); broadcast_to(x) to x's shape -> x.
//   slice(x) taking every element (start 0, same shape) -> x; pad(x) with zero low and
//   high -> x; concat(x) of one operand -> x.
//   select(gt(r, 0), max_pool2d_grad(r, dy), 0) -> max_pool2d_grad(r, select(gt(max_pool2d(r),
//   0), dy, 0))                         a ReLU's gradient under a max-pool's (the pool
//                                       gradient read only here): the scatter is nonzero
//                                       only at each window's first maximum, where r is
//                                       the window's max_pool2d value bit for bit, so the
//                                       mask is taken on the pooled cells (a quarter as
//                                       many for 2x2) and every other cell is +0.0 either
//                                       way.
//   an elementwise node reading broadcast_to(v) (v of more than one element: a splat's
//   broadcast stays) -> the node reading v, where its other operands still broadcast
//   to the result's shape (NumPy broadcasting does the broadcast_to's work); else, when
//   the others are single elements and the broadcast_to has no other reader, ->
//   broadcast_to(the node over v), which the next reader absorbs in turn. Exact: each
//   element is the op over the same operand elements either way. A batch norm's backward
//   materialized its statistics' gradients (mean's gradient) at the activation's size.
//   max, min over axes that all have size 1 (an empty axes list means every axis) ->
//   reshape(x) (or x). Also sum over such axes for integer dtypes; NOT sum or mean of
//   floats: the interpreter computes them as 0.0 + x, which maps -0.0 to +0.0.
// "A constant c": a constant node every element of which is the given value (bits
// compared: 1.0, -0.0); if c would broadcast x to a larger shape, x is broadcast_to the
// result's shape instead of dropped. Results always keep their exact type.
// Names: a node replaced by a new node gives it its name and note; a node replaced by an
// existing value loses its name (names of values are cosmetic; outputs keep their output
// names). Replaced nodes are left behind (often dead): run dce after this pass.
// Needs: a valid graph. Keeps: node order; inputs.
Graph simplify_algebra(const Graph& g, const PassOptions& options);

// simplify: fold_constants, simplify_algebra, cse, dce, repeated until the printed graph
// stops changing (at most 8 rounds). The node count never grows.
Graph simplify(const Graph& g, const PassOptions& options);

}  // namespace kiln
