"""The peers' side of the GPU benchmark (scripts/gpu-check.sh --run): PyTorch eager, PyTorch
with the whole step captured as one CUDA graph, and torch.compile, on the same GPU, printed
as JSON on stdout (seconds). Also writes the ResNet-18 inputs and ONNX export that Kiln runs
in the same call (--export DIR), since 45 MB of weights do not travel to the GPU machine.

Figures:
  mlp_epoch    MLP 784-256-10, batch 64, SGD momentum 0.9: one 60000-image epoch, the data on
               the device, each batch gathered on the device from a shuffled index
  lenet_epoch  LeNet (kiln's: conv 8, pool, conv 16, pool, linear), batch 256, likewise
  mlp_b1, lenet_b1            batch-1 inference, input already on the device
  resnet18_b1, resnet18_b64   ResNet-18 inference (random weights, seed 0)
fp32 throughout: TF32 is off for cuBLAS and cuDNN (Kiln's default, CompileOptions::tf32).
Each figure is the best of --reps timed runs after warm-up, timed with CUDA events.

usage: python3 gpu_peers.py [--reps N] [--export DIR] [--skip-compile] [--json FILE]
       python3 gpu_peers.py --table PEERS.json KILN.json
The second form prints the side-by-side table: each figure of Kiln (cuda_bench --figures)
and of every peer, and Kiln's ratio to the best peer (best peer time / Kiln time: above 1,
Kiln is faster).
"""
import argparse
import json
import os
import sys
import time

EPOCH = 60000
FIGURES = [("mlp_epoch", "MLP 784-256-10 b64, s per 60k-image epoch"),
           ("lenet_epoch", "LeNet b256, s per 60k-image epoch"),
           ("mlp_b1", "MLP inference b1, s"),
           ("lenet_b1", "LeNet inference b1, s"),
           ("resnet18_b1", "ResNet-18 inference b1, s"),
           ("resnet18_b64", "ResNet-18 inference b64, s")]


def table(peers_path, kiln_path):
    """Prints Kiln's figures next to the peers' and the ratio to the best peer."""
    with open(peers_path) as f:
        peers = json.load(f)
    with open(kiln_path) as f:
        kiln = json.load(f)
    systems = [k for k in peers if k != "versions"]
    print(f"GPU: {kiln.get('gpu', '?')}; peers: torch {peers['versions'].get('torch', '?')} on "
          f"{peers['versions'].get('gpu', '?')} (the same run)")
    head = f"{'figure':<44}{'kiln':>11}" + "".join(f"{s:>20}" for s in systems) + f"{'best peer / kiln':>18}"
    print(head)
    for key, label in FIGURES:
        k = kiln.get(key)
        vals = [peers[s].get(key) for s in systems]
        known = [v for v in vals if v is not None]
        ratio = f"{min(known) / k:.2f}" if k and known else "-"
        cells = "".join(f"{v:>20.6f}" if v is not None else f"{'-':>20}" for v in vals)
        print(f"{label:<44}{(f'{k:.6f}' if k else '-'):>11}{cells}{ratio:>18}")


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--table":
    table(sys.argv[2], sys.argv[3])
    sys.exit(0)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True
DEV = torch.device("cuda")


def gpu_time(f, reps, calls=1):
    """Best seconds per call of f over `reps` runs of `calls` calls, between CUDA events."""
    f()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(calls):
            f()
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) / 1e3 / calls)
    return best


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def lenet():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(784, 10))


def epoch_figures(make, batch, mode, reps):
    """One epoch of SGD steps; mode: eager, graph (the whole step one CUDA graph), compile."""
    torch.manual_seed(0)
    model = make().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    X = torch.rand(EPOCH, 1, 28, 28, device=DEV)
    Y = torch.randint(0, 10, (EPOCH,), device=DEV)
    steps = EPOCH // batch
    xb = torch.empty(batch, 1, 28, 28, device=DEV)
    yb = torch.empty(batch, dtype=torch.long, device=DEV)
    order = torch.randperm(EPOCH, device=DEV)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    def gather(i):
        idx = order[i * batch:(i + 1) * batch]
        torch.index_select(X, 0, idx, out=xb)
        torch.index_select(Y, 0, idx, out=yb)

    run = step
    if mode == "compile":
        run = torch.compile(step)
    gather(0)
    for _ in range(3):  # warm-up (and momentum buffers made before any capture)
        run()
    if mode == "graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay

    def epoch():
        for i in range(steps):
            gather(i)
            run()

    return gpu_time(epoch, reps)


def infer_figure(model, x, mode, reps):
    with torch.inference_mode():
        f = lambda: model(x)  # noqa: E731
        if mode == "compile":
            c = torch.compile(model)
            f = lambda: c(x)  # noqa: E731
        elif mode == "graph":
            for _ in range(3):
                model(x)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                model(x)
            f = g.replay
        for _ in range(3):
            f()
        return gpu_time(f, reps, calls=20)


def resnet18():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def export(dirname):
    """ResNet-18 as ONNX (symbolic batch) with its inputs at batch 1 and 64, for kiln run."""
    import numpy as np
    os.makedirs(dirname, exist_ok=True)
    model = resnet18()
    x = torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    torch.onnx.export(model, (x,), os.path.join(dirname, "resnet18.onnx"), input_names=["x"], output_names=["out"],
                      opset_version=17, dynamic_axes={"x": {0: "batch"}, "out": {0: "batch"}}, dynamo=False)
    for b in (1, 64):
        xb = torch.rand(b, 3, 224, 224, generator=torch.Generator().manual_seed(b))
        np.save(os.path.join(dirname, f"x{b}.npy"), xb.numpy())
        with torch.no_grad():
            np.save(os.path.join(dirname, f"out{b}.npy"), model(xb).numpy())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="timed runs per figure (best is kept)")
    ap.add_argument("--export", metavar="DIR", help="also write DIR/resnet18.onnx and its inputs for Kiln")
    ap.add_argument("--skip-compile", action="store_true", help="leave torch.compile out (it compiles for minutes)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures to FILE (for --table), after each system")
    ap.add_argument("--compile-budget", type=float, default=0, metavar="S",
                    help="stop starting torch.compile figures after S seconds of it (0: no limit); "
                         "the ones not reached are left out")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_peers.py: PyTorch sees no GPU")
    if a.export:
        t0 = time.time()
        export(a.export)
        print(f"gpu_peers.py: exported ResNet-18 in {time.time() - t0:.1f} s", file=sys.stderr)
    result = {"versions": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}}
    modes = ["eager", "graph"] + ([] if a.skip_compile else ["compile"])
    names = {"eager": "pytorch eager", "graph": "pytorch cuda graph", "compile": "torch.compile"}
    def figures(mode):
        """(name, thunk) for every figure of a mode, in the order they are measured."""
        out = [("mlp_epoch", lambda: epoch_figures(mlp, 64, mode, a.reps)),
               ("lenet_epoch", lambda: epoch_figures(lenet, 256, mode, a.reps))]
        for name, make, shape in (("mlp", mlp, (784,)), ("lenet", lenet, (1, 28, 28))):
            def b1(make=make, shape=shape):
                torch.manual_seed(0)
                return infer_figure(make().to(DEV).eval(), torch.rand((1,) + shape, device=DEV), mode, a.reps)
            out.append((name + "_b1", b1))
        for b in (1, 64):
            out.append((f"resnet18_b{b}", lambda b=b: infer_figure(resnet18().to(DEV),
                                                                   torch.rand(b, 3, 224, 224, device=DEV), mode,
                                                                   a.reps)))
        return out

    for mode in modes:
        r = result.setdefault(names[mode], {})
        t0 = time.time()
        try:
            for name, thunk in figures(mode):
                if mode == "compile" and a.compile_budget and time.time() - t0 > a.compile_budget:
                    print(f"gpu_peers.py: torch.compile: over the {a.compile_budget:.0f} s budget, {name} and "
                          "later left out", file=sys.stderr)
                    break
                r[name] = thunk()
        except Exception as e:  # keep what was measured; say what failed
            print(f"gpu_peers.py: {names[mode]} stopped: {type(e).__name__}: {e}", file=sys.stderr)
        print(f"gpu_peers.py: {names[mode]} ({time.time() - t0:.0f} s): {json.dumps(r)}", file=sys.stderr, flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
