// rebatch: the same graph at another batch size.
//
// The batch dimension is the leading dimension of every non-state input (they must all share
// it; state inputs, the parameters, must not depend on it). rebatch(g, n) returns g with those
// inputs' leading dimension set to n and every node's type inferred again; the attributes that
// spell a shape (reshape's and broadcast_to's `shape`, a constant's splat shape) have their
// leading entry changed from the old batch to n where it is the batch dimension flowing from
// the inputs. Anything that cannot be rebatched safely is a kiln::Error saying which node and
// why ("rebatch @mlp from 64 to 16: %7 = reshape {shape=[4096]} mixes the batch dimension
// into another axis ..."). rebatch(g, batch_size(g)) returns g unchanged. Linear in the
// graph's size. Fused bodies are not entered: rebatch runs before the pipeline. A graph
// whose Graph::fixed_batch() is set is refused with that reason (the ONNX importer sets it
// when the model reads its symbolic batch size in a way the rebatched graph would not
// follow: a Tile or Slice along the batch, a Size or Shape folded into a constant, ...).
//
// A reshape of a batched value finds the batch's axis in its result by the sizes: the axis
// with the batch's size and as many elements before it as before the batch in the operand.
// Where several axes qualify (axes of size 1 beside it, the common case at batch 1), a -1
// in the reshape's shape names the batch's axis; without one the reshape is refused as
// ambiguous.
//
// Where the batch comes from nothing (a splat constant, a broadcast_to of a value without
// it), the axis of the old batch size is taken to be the batch; two such axes are refused
// as ambiguous, and a full constant tensor with one is refused, except at batch 1: there a
// full constant's axes of size 1 are broadcast axes and it is kept as it is (one row for
// every batch element, as a [1, S] position-id constant of a BERT exported at batch 1 is;
// the consumers broadcast it, and one that cannot is refused naming itself). Values computed from the
// batch size at trace time: autodiff's gradient of a mean (a literal 1/count) is
// recomputed; a literal a hand-written .kir spells itself (x * 0.015625 for a mean over 64)
// cannot be told from any other number and is kept: write mean, not such a literal.
#pragma once

#include <cstdint>
#include <optional>

#include "ir/calling.h"
#include "ir/graph.h"

namespace kiln {

// The shared leading dimension of g's non-state inputs, or nullopt when there is none (no
// non-state inputs, a scalar input, or inputs that disagree).
std::optional<int64_t> batch_size(const Graph& g);

Graph rebatch(const Graph& g, int64_t batch);

// The other batch size that `inputs` (by name; others ignored) give g: when every non-state
// input of g is there with g's type but for its leading dimension, which is n for all of
// them and n != batch_size(g), returns n; else nullopt (the inputs are g's own, or mismatch).
std::optional<int64_t> other_batch_size(const Graph& g, const TensorMap& inputs);

}  // namespace kiln
