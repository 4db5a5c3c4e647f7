"""The peers' side of bench/peers/run.sh: PyTorch eager, torch.compile and ONNX Runtime on
kiln_bench's models, batches and thread count, printed as JSON on stdout.

Figures (seconds): mlp_step (MLP 784-256-10, batch 64, SGD momentum 0.9, one training
step), lenet_step (LeNet, batch 256), mlp_b1 and lenet_b1 (batch-1 inference). Each is the
best of several timed runs of at least 20 ms each, after warm-up, as kiln_bench times Kiln.
"""
import argparse
import json
import os
import sys
import tempfile
import time


def per_call(f, reps):
    """Seconds per call: each timed run repeats f for >= 20 ms; best of `reps` runs."""
    f()
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        if time.perf_counter() - t0 >= 0.02:
            break
        calls *= 2
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, time.perf_counter() - t0)
    return best / calls


def models(torch):
    nn = torch.nn

    def mlp():
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))

    def lenet():
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(784, 10))

    return {"mlp": (mlp, (784,)), "lenet": (lenet, (1, 28, 28))}


def torch_figures(torch, compiled, reps):
    out = {}
    gen = torch.Generator().manual_seed(0)
    for name, (make, shape) in models(torch).items():
        batch = 64 if name == "mlp" else 256
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        x = torch.rand((batch,) + shape, generator=gen) * 2 - 1
        y = torch.randint(0, 10, (batch,), generator=gen)

        def step_eager():
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

        step = step_eager
        if compiled:
            step = torch.compile(step_eager)
            for _ in range(3):  # compiles here, not while timed
                step()
        out[name + "_step"] = per_call(step, reps)

        infer_model = make().eval()
        x1 = torch.rand((1,) + shape, generator=gen)
        fwd = torch.compile(infer_model) if compiled else infer_model
        with torch.inference_mode():
            for _ in range(3):
                fwd(x1)
            out[name + "_b1"] = per_call(lambda: fwd(x1), reps)
    return out


def ort_figures(torch, threads, reps):
    import numpy as np
    import onnxruntime as ort
    out = {}
    for name, (make, shape) in models(torch).items():
        model = make().eval()
        x1 = torch.rand((1,) + shape)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, name + ".onnx")
            torch.onnx.export(model, (x1,), path, input_names=["x"], output_names=["logits"], dynamo=False)
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        feed = {"x": x1.numpy().astype(np.float32)}
        out[name + "_b1"] = per_call(lambda: sess.run(None, feed), reps)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="threads every system may use")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per figure (best is kept)")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    result = {"versions": {"torch": torch.__version__}}
    result["pytorch eager"] = torch_figures(torch, False, a.reps)
    try:
        result["torch.compile"] = torch_figures(torch, True, a.reps)
    except Exception as e:  # a compiler toolchain missing: say so, keep the rest
        print(f"peers.py: torch.compile skipped: {type(e).__name__}: {e}", file=sys.stderr)
    try:
        import onnxruntime
        result["versions"]["onnxruntime"] = onnxruntime.__version__
        result["onnx runtime"] = ort_figures(torch, a.threads, a.reps)
    except Exception as e:
        print(f"peers.py: ONNX Runtime skipped: {type(e).__name__}: {e}", file=sys.stderr)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
