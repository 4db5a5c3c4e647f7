// Losses and metrics, traced from ordinary ops so autodiff and every backend see them as
// plain graph code. Each returns a rank-0 value: losses in the logits' (or predictions')
// dtype, accuracy in f32.
#pragma once

#include "frontend/trace.h"

namespace kiln::nn {

// Softmax cross-entropy with integer class labels, averaged over the batch:
//   mean_n( -sum_c one_hot(labels)[n,c] * log_softmax(logits)[n,c] )
// logits: float [N,C]; labels: i32 or i64 [N] in 0..C-1 (a label outside that range
// contributes 0, as one_hot gives a zero row).
Sym cross_entropy(Sym logits, Sym labels,
                  std::source_location loc = std::source_location::current());

// Mean squared error: mean((pred - target)^2) over all elements (shapes broadcast).
Sym mse(Sym pred, Sym target, std::source_location loc = std::source_location::current());

// Fraction of rows whose argmax equals the label: logits [N,C], labels [N] -> f32 scalar.
Sym accuracy(Sym logits, Sym labels, std::source_location loc = std::source_location::current());

}  // namespace kiln::nn

namespace kiln {

// A classifier graph (one non-state input of examples [N,...], one output of float logits
// [N,C]; an imported ONNX model, say) made trainable: its input renamed %x, labels %y:
// i32[N] added, and outputs "loss" (softmax cross-entropy averaged over the batch, as
// nn::cross_entropy) and "accuracy" (as nn::accuracy). State inputs and notes are kept, and
// so are outputs after the logits that update state ("X.next" for a state input X: batch
// norm's running statistics, dropout's counter), after loss and accuracy.
// kiln::Error naming `what` when the graph is not of that form.
Graph with_classifier_loss(const Graph& classifier, const std::string& what);

}  // namespace kiln
