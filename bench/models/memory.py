#!/usr/bin/env python3
"""Peak memory and time to the first result of `kiln run` on large ONNX models.

Makes synthetic models with large float initializers (an MLP stack, f32 weights of about
--mb MiB, symbolic batch) in two forms, the weights inside the .onnx file and the weights
in an external data file beside it, and measures for each model, as a child process:

  * Kiln: `kiln run MODEL --input ... --time` -- peak resident memory (the child's
    ru_maxrss from wait4), wall time to its exit (time to the first result, process start,
    LLVM and printing included) and the phases it reports (read, import,
    compile, weights, first run);
  * ONNX Runtime (with --ort-python, a Python that has onnxruntime): session creation +
    first run timed in the child (the interpreter's start and `import onnxruntime` not
    counted) and the child's peak resident memory.

Real models (e.g. /work/models/distilbert.onnx, resnet18.onnx) are measured with --model;
their inputs are made from the graph's input types (zeros for integer ids, a fixed
random normal for floats), batch 1.

Not a test: figures depend on the machine. Each figure is the best of --reps runs, the
systems alternating.

usage: memory.py [--kiln build/tools/kiln] [--base-kiln OLD/kiln] [--dir DIR] [--mb 256]
                 [--reps 3] [--ort-python PYTHON] [--model FILE.onnx ...] [--no-synthetic]

--base-kiln measures another kiln binary (e.g. a build of the previous commit) in the same
run, alternating with the others, as the system "base".
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_mlp(path, mb, external, seed=0):
    """An MLP stack x -> (MatMul, Add, Relu) * L -> y, with square hidden layers of width
    1024 and 4096 alternating, f32 weights of about `mb` MiB in all, batch symbolic."""
    rng = np.random.default_rng(seed)
    d, h = 1024, 4096
    per_layer = 2 * d * h * 4  # two matrices of d x h floats
    layers = max(1, round(mb * 2**20 / per_layer))
    nodes, inits = [], []
    cur = "x"
    for i in range(layers):
        for j, (a, b) in enumerate(((d, h), (h, d))):
            w = (rng.standard_normal((a, b), dtype=np.float32) / np.sqrt(a)).astype(np.float32)
            bias = (rng.standard_normal((b,), dtype=np.float32) * 0.01).astype(np.float32)
            wn, bn = f"w{i}_{j}", f"b{i}_{j}"
            inits += [numpy_helper.from_array(w, wn), numpy_helper.from_array(bias, bn)]
            mm, add, act = f"mm{i}_{j}", f"add{i}_{j}", f"act{i}_{j}"
            nodes.append(helper.make_node("MatMul", [cur, wn], [mm]))
            nodes.append(helper.make_node("Add", [mm, bn], [add]))
            last = i == layers - 1 and j == 1
            if last:
                nodes.append(helper.make_node("Identity", [add], ["y"]))
            else:
                nodes.append(helper.make_node("Relu", [add], [act]))
                cur = act
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-bench")
    model.ir_version = 8
    tmp = path + ".tmp"
    if external:
        data = os.path.basename(path) + ".data"
        onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data + ".tmp", size_threshold=1024)
        # Written under temporary names, then renamed; the location inside names the final file.
        m = onnx.load_model(tmp, load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = data
        onnx.save_model(m, tmp)
        os.replace(os.path.join(os.path.dirname(path), data + ".tmp"), os.path.join(os.path.dirname(path), data))
    else:
        onnx.save_model(model, tmp)
    os.replace(tmp, path)
    return layers


def weights_bytes(path):
    m = onnx.load_model(path, load_external_data=False)
    total = 0
    for t in m.graph.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        total += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def make_inputs(path, outdir):
    """One .npy per graph input (batch 1): zeros for integers, N(0,1) for floats."""
    m = onnx.load_model(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(1)
    specs, feeds = [], {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        a = (rng.standard_normal(shape).astype(dt) if np.issubdtype(dt, np.floating)
             else (np.ones(shape, dt) if "mask" in vi.name else np.zeros(shape, dt)))
        name = re.sub(r"[^A-Za-z0-9_.]", "_", vi.name)
        if not re.match(r"[A-Za-z_]", name):
            name = "_" + name
        f = os.path.join(outdir, name + ".npy")
        np.save(f, a)
        specs += ["--input", f"{name}={f}"]
        feeds[vi.name] = f
    return specs, feeds


def run_child(cmd, env=None):
    """Runs cmd; returns (wall seconds, peak RSS bytes, stdout, stderr)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{err.decode()[-2000:]}")
    return wall, out.decode(), err.decode()


def peak_cmd(cmd):
    """cmd wrapped so that the wrapper prints the child's peak RSS (KiB) on stderr last."""
    wrapper = ("import os,sys,resource\n"
               "pid=os.fork()\n"
               "if pid==0:\n os.execvp(sys.argv[1],sys.argv[1:])\n"
               "_,st,ru=os.wait4(pid,0)\n"
               "sys.stderr.write('\\npeak_rss_kib %d\\n'%ru.ru_maxrss)\n"
               "sys.exit(os.waitstatus_to_exitcode(st))\n")
    return [sys.executable, "-c", wrapper] + cmd


def parse_peak(err):
    m = re.findall(r"peak_rss_kib (\d+)", err)
    return int(m[-1]) * 1024


def timing_flag(kiln):
    """The flag with which this kiln's `run` prints its phases: --time (as "time: PHASE  MS ms"
    lines on stdout), --timings in older builds (as "kiln: timing: PHASE  MS ms" on stderr),
    or None in builds older still (measured as a baseline)."""
    h = subprocess.run([kiln, "run", "--help"], capture_output=True, text=True)
    text = " ".join((h.stdout + h.stderr).split())
    return "--timings" if "--timings" in text else "--time" if "up to the first result" in text else None


def kiln_once(kiln, model, specs, flag):
    wall, out, err = run_child(peak_cmd([kiln, "run", model] + ([flag] if flag else []) + specs))
    phases = {}
    lines, pattern = (out, r"time: +(.+?) +([0-9.]+) ms$") if flag == "--time" else \
        (err, r"kiln: timing: (.+?) +([0-9.]+) ms")
    for line in lines.splitlines():
        m = re.match(pattern, line)
        if m:
            phases[m.group(1)] = float(m.group(2)) / 1e3
    return {"wall": wall, "peak": parse_peak(err), "phases": phases}


ORT_CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
model, feeds, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
inputs = {k: np.load(v) for k, v in feeds.items()}
t0 = time.perf_counter()
o = ort.SessionOptions(); o.intra_op_num_threads = threads; o.inter_op_num_threads = 1
o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
s = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
t1 = time.perf_counter()
s.run(None, inputs)
t2 = time.perf_counter()
print(json.dumps({"session": t1 - t0, "first_run": t2 - t1}))
"""


def ort_once(python, model, feeds, threads):
    wall, out, err = run_child(peak_cmd([python, "-c", ORT_CHILD, model, json.dumps(feeds), str(threads)]))
    r = json.loads(out.strip().splitlines()[-1])
    return {"wall": r["session"] + r["first_run"], "peak": parse_peak(err),
            "phases": {"session": r["session"], "first run": r["first_run"]}}


def kiln_error(e):
    """The child's last line of error output (the wrapper's peak line left out)."""
    lines = [l for l in str(e).splitlines() if l.strip() and not l.startswith("peak_rss_kib")]
    return lines[-1] if lines else str(e)


def best(runs):
    b = min(runs, key=lambda r: r["wall"])
    return dict(b, peak=min(r["peak"] for r in runs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", default="build/tools/kiln")
    ap.add_argument("--base-kiln", default=None, help="another kiln to compare with (a baseline build)")
    ap.add_argument("--dir", default=None, help="where the synthetic models go (default: a temporary folder)")
    ap.add_argument("--mb", type=float, default=256, help="MiB of f32 weights in the synthetic model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ort-python", default=None, help="a Python with onnxruntime (ORT figures)")
    ap.add_argument("--model", action="append", default=[], help="a real model to measure too")
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--json", default=None, help="write the figures here as JSON too")
    a = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    d = a.dir or tmp.name
    os.makedirs(d, exist_ok=True)
    models = []
    if not a.no_synthetic:
        for ext in (False, True):
            p = os.path.join(d, f"mlp{int(a.mb)}{'_ext' if ext else ''}.onnx")
            if not os.path.exists(p):
                make_mlp(p, a.mb, ext)
            models.append(p)
    models += a.model
    env = dict(os.environ, KILN_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    os.environ.update(env)
    results = {}
    timings = timing_flag(a.kiln)
    base_timings = timing_flag(a.base_kiln) if a.base_kiln else None
    for model in models:
        indir = os.path.join(d, "inputs_" + os.path.basename(model).replace(".onnx", ""))
        os.makedirs(indir, exist_ok=True)
        specs, feeds = make_inputs(model, indir)
        k, o, b, failed = [], [], [], {}
        for _ in range(a.reps):
            try:
                k.append(kiln_once(a.kiln, model, specs, timings))
            except RuntimeError as e:
                failed["kiln"] = kiln_error(e)
            if a.base_kiln:
                try:
                    b.append(kiln_once(a.base_kiln, model, specs, base_timings))
                except RuntimeError as e:
                    failed["base"] = kiln_error(e)
            if a.ort_python:
                try:
                    o.append(ort_once(a.ort_python, model, feeds, a.threads))
                except RuntimeError as e:
                    failed["ort"] = kiln_error(e)
        results[model] = {"weights": weights_bytes(model), "kiln": best(k) if k else None,
                          "base": best(b) if b else None, "ort": best(o) if o else None, "failed": failed}

    mib = lambda b: b / 2**20
    print(f"{'model':<28} {'weights':>9} {'system':<6} {'peak RSS':>9} {'x wts':>6} {'first result':>12}  phases (s)")
    for model, r in results.items():
        name = os.path.basename(model)
        for system in ("kiln", "base", "ort"):
            s = r[system]
            if not s:
                if system in r["failed"]:
                    print(f"{name:<28} {mib(r['weights']):>7.1f}Mi {system:<6} fails: {r['failed'][system]}")
                continue
            phases = ", ".join(f"{k} {v:.3f}" for k, v in s["phases"].items())
            print(f"{name:<28} {mib(r['weights']):>7.1f}Mi {system:<6} {mib(s['peak']):>7.1f}Mi "
                  f"{s['peak'] / r['weights']:>6.2f} {s['wall']:>11.3f}s  {phases}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
