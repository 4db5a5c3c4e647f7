#include "frontend/losses.h"

namespace kiln::nn {

namespace {
// logits [N,C] float and labels [N] integer, or an error naming the caller's line.
void check_classification(const char* what, Sym logits, Sym labels, bool want_float,
                          std::source_location loc) {
  TensorType lt = logits.type(), yt = labels.type();
  std::string where = " (at " + format_location(loc) + ")";
  if (lt.rank() != 2 || (want_float && !is_float(lt.dtype)))
    throw Error(std::string(what) + ": logits must be " + (want_float ? "f32 or f64 " : "") +
                "[N,C], got " + lt.str() + where);
  if (yt.rank() != 1 || !is_integer(yt.dtype))
    throw Error(std::string(what) + ": labels must be i32 or i64 [N], got " + yt.str() + where);
  if (yt.shape[0] != lt.shape[0])
    throw Error(std::string(what) + ": " + std::to_string(lt.shape[0]) + " rows of logits but " +
                std::to_string(yt.shape[0]) + " labels" + where);
}
}  // namespace

Sym cross_entropy(Sym logits, Sym labels, std::source_location loc) {
  check_classification("cross_entropy", logits, labels, true, loc);
  Sym targets = one_hot(labels, logits.dim(1), logits.dtype(), loc);
  Sym per_example = neg(sum(mul(targets, log_softmax(logits, 1, loc), loc), {1}, false, loc), loc);
  return mean(per_example, {}, false, loc);
}

Sym mse(Sym pred, Sym target, std::source_location loc) {
  Sym d = sub(pred, target, loc);
  return mean(mul(d, d, loc), {}, false, loc);
}

Sym accuracy(Sym logits, Sym labels, std::source_location loc) {
  check_classification("accuracy", logits, labels, false, loc);
  Sym predicted = argmax(logits, 1, false, loc);  // i32
  if (labels.dtype() != DType::i32) labels = cast(labels, DType::i32, loc);
  return mean(cast(eq(predicted, labels, loc), DType::f32, loc), {}, false, loc);
}

}  // namespace kiln::nn
