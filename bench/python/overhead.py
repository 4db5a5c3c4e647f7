"""What Kiln's Python face costs over its C++ one, measured in one process (2 threads here):

1. a call: `exe(x=...)` of the batch-1 MLP (784-256-10) inference from Python against the
   same Executable::run called from C++ in a loop (kiln._kiln._bench_run); the extra
   microseconds per call (target: <= 2 us);
2. an epoch: kiln.Trainer.fit (with its per-step Ctrl-C check, no callbacks of the user's)
   against the C++ Trainer's train_epoch with no callback, the same trainer alternating,
   Fashion-MNIST's 60,000 images at batch 64 (a synthetic set when the data is missing);
   the ratio (target: <= 1.03).

usage: python bench/python/overhead.py [--calls N] [--rounds R] [--epochs-limit N]
"""
import argparse
import statistics
import time

import numpy as np

import kiln


def mlp(batch, labels=True):
    t = kiln.Tracer("mlp")
    s = kiln.nn.Scope(t, seed=0)
    x = t.input("x", kiln.f32[batch, 784])
    y = t.input("y", kiln.i32[batch]) if labels else None
    logits = kiln.nn.Sequential(kiln.nn.Linear(s.sub("fc1"), 784, 256), kiln.nn.relu,
                                kiln.nn.Linear(s.sub("fc2"), 256, 10))(x)
    return t, logits, y


def call_overhead(calls, rounds):
    t, logits, _ = mlp(1, labels=False)
    t.output("logits", logits)
    exe = kiln.compile(t.finish())
    x = np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32)
    exe(x=x)
    py, cpp = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            exe(x=x)
        py.append((time.perf_counter() - t0) / calls)
        cpp.append(kiln._kiln._bench_run(exe, {"x": x}, calls) / calls)
    p, c = min(py), min(cpp)
    print(f"call: Python {p * 1e6:.2f} us, C++ {c * 1e6:.2f} us, extra {(p - c) * 1e6:.2f} us "
          f"(median of {rounds} rounds: {(statistics.median(py) - statistics.median(cpp)) * 1e6:.2f} us); "
          f"ratio {p / c:.3f}")


def epoch_overhead(rounds, limit):
    try:
        data = kiln.datasets.fashion_mnist("train")
        what = "Fashion-MNIST"
    except kiln.Error:
        rng = np.random.default_rng(0)
        data = {"x": rng.random((60000, 784), dtype=np.float32), "y": rng.integers(0, 10, 60000).astype(np.int32)}
        what = "synthetic"
    if limit:
        data = {k: v[:limit] for k, v in data.items()}
    t, logits, y = mlp(64)
    t.output("loss", kiln.nn.cross_entropy(logits, y))
    tr = kiln.Trainer(t.finish(), batch=64)
    tr.fit(data, epochs=1)  # compiles, warms up
    py, cpp = [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        tr.fit(data, epochs=tr.epoch + 1)
        py.append(time.perf_counter() - t0)
        cpp.append(tr._native._bench_epoch(data))
    p, c = min(py), min(cpp)
    print(f"epoch ({what}, {len(data['y'])} images, batch 64): kiln.Trainer.fit {p * 1e3:.1f} ms, "
          f"C++ train_epoch {c * 1e3:.1f} ms, ratio {p / c:.3f} (median {statistics.median(py) / statistics.median(cpp):.3f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs-limit", type=int, default=0, help="images per epoch (default: all)")
    a = ap.parse_args()
    print(f"kiln {kiln.__version__}, Python face vs C++, best of {a.rounds} rounds")
    call_overhead(a.calls, a.rounds)
    epoch_overhead(a.rounds, a.epochs_limit)


if __name__ == "__main__":
    main()
