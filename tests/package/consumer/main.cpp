// The compiler library from C++: trace a tiny model, compile it for the CPU, run it, and
// compare with the reference interpreter; then train it a few epochs with the training loop
// (kiln_train). Prints two lines; exit status 1 on a mismatch.
#include <kiln/codegen/executable.h>
#include <kiln/frontend/losses.h>
#include <kiln/frontend/nn.h>
#include <kiln/ir/interp.h>
#include <kiln/train/trainer.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  kiln::Tracer t("tiny");
  kiln::nn::Scope scope(t, /*seed=*/7);
  kiln::nn::Linear fc(scope.sub("fc"), 3, 2);
  kiln::Sym x = t.input("x", {kiln::DType::f32, {4, 3}});
  t.output("y", kiln::relu(fc(x)));
  kiln::Graph g = t.finish();

  auto exe = kiln::compile(g);
  exe->set_state(t.parameters());
  kiln::Tensor xs = kiln::Tensor::from(kiln::DType::f32, {4, 3}, std::vector<float>{1, -2, 3, 0.5f, 0, -1, 2, 2, 2, -3, 1, 0});
  kiln::Tensor y = exe->run({{"x", xs}}).at("y");
  kiln::TensorMap inputs = t.parameters();
  inputs["x"] = xs;
  kiln::Tensor want = kiln::interpret(g, inputs).at("y");
  for (int64_t i = 0; i < want.numel(); ++i)
    if (std::fabs(y.get(i) - want.get(i)) > 1e-5) {
      std::fprintf(stderr, "trace_cpp: y[%lld] is %g, the interpreter says %g\n", static_cast<long long>(i), y.get(i),
                   want.get(i));
      return 1;
    }
  std::printf("trace_cpp: ok (compiled for %s, %lld outputs match the interpreter)\n", exe->target().c_str(),
              static_cast<long long>(want.numel()));

  // The training loop: the same layer fitted towards zero with SGD.
  kiln::Tracer f("fit");
  kiln::nn::Scope fit_scope(f, /*seed=*/7);
  kiln::nn::Linear layer(fit_scope.sub("fc"), 3, 2);
  kiln::Sym pred = layer(f.input("x", {kiln::DType::f32, {4, 3}}));
  f.output("loss", kiln::nn::mse(pred, f.input("t", {kiln::DType::f32, {4, 2}})));
  kiln::Trainer trainer(f.finish(), f.parameters(), {.optimizer = kiln::SGD{.lr = 0.1}, .batch = 4, .eval_batch = 4});
  kiln::TensorDataset data{{{"x", xs}, {"t", kiln::Tensor(kiln::DType::f32, {4, 2})}}};
  double before = trainer.evaluate(data).loss;
  double after = trainer.fit(data, {}, 5).back().train_loss;
  if (!(after < before)) {
    std::fprintf(stderr, "trace_cpp: training did not lower the loss (%g -> %g)\n", before, after);
    return 1;
  }
  std::printf("trace_cpp: trained 5 epochs with kiln::Trainer, loss %.4f -> %.4f\n", before, after);
}
