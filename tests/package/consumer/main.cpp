// The compiler library from C++: trace a tiny model, compile it for the CPU, run it, and
// compare with the reference interpreter. Prints one line; exit status 1 on a mismatch.
#include <kiln/codegen/executable.h>
#include <kiln/frontend/nn.h>
#include <kiln/ir/interp.h>

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
}
