"""Kiln beside ONNX Runtime and PyTorch eager on real models (bench/models/zoo.py), in one
run: inference at batch 1 and 16, the training step of ResNet-18 and BERT, Kiln's compile
time, each system's peak resident memory and time to the first result, and a per-kernel
profile of ResNet-18 and BERT. Prints the tables, writes JSON and draws a plot.

usage: python bench.py [--threads N] [--models a,b] [--quick] [--rounds R] [--reps K]
                       [--build DIR] [--models-dir DIR] [--json FILE] [--png FILE]
                       [--no-train] [--no-memory] [--no-profile] [--timeout S]
       python bench.py --report FILE.json [--png FILE]
(run it with the Python of a venv that has torch, torchvision, transformers, onnxruntime,
onnx, numpy and matplotlib; bench/models/run.sh makes one.)

How: the models are exported first (export.py; kept when up to date). For each model, R
rounds alternate the systems: Kiln (`kiln run MODEL --time --repeat K` in a fresh process:
its steady-state figure is Executable::evaluate end to end, inputs in and outputs out, after
an untimed first run; its compile figure is the pipeline and the LLVM JIT), ONNX Runtime
(intra-op threads = N, inter-op 1, sequential execution, all graph optimizations) and
PyTorch eager (set_num_threads(N), no_grad, eval mode), at each batch; each figure is the
best of R x K calls, each call timed alone. The training step (SGD lr 0.01 momentum 0.9,
softmax cross-entropy, the model in train mode: batch statistics, dropout) runs as
bench/train_step_bench for Kiln and as an eager step for PyTorch. Memory and time to the
first result: each system in its own process at batch 1 (Kiln: `kiln run MODEL`, with its
disk cache of compiled code off (cold, as every other Kiln figure here) and on after a run
that filled it (warm); ONNX
Runtime: Python, import, session creation and one run; PyTorch: Python, import, the model
built, its state_dict loaded and one run), peak RSS from GNU time (/usr/bin/time). The
ratio column is Kiln's speed over the best peer's (above 1: Kiln is faster); the last one is
the median over the rounds of ONNX Runtime's best over Kiln's best measured back to back in
the round, which a machine whose speed drifts between rounds (this one's does, 1.5-2x within
minutes) moves less than the ratio of the two bests.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BATCHES = (1, 16)
PROFILED = ("resnet18", "bert")


def set_threads_env(threads):
    # Before torch loads (its OpenMP pool reads it); the children inherit them.
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "KILN_NUM_THREADS"):
        os.environ[k] = str(threads)


# --- children: one system in its own process, for memory and time to the first result ----------

def child_main(argv):
    """bench.py --child ort|torch ...: runs one model once and prints a JSON line."""
    t_start = time.perf_counter()
    kind = argv[0]
    import numpy as np
    if kind == "ort":
        path, input_name, npy, threads = argv[1], argv[2], argv[3], int(argv[4])
        import onnxruntime as ort
        t0 = time.perf_counter()
        so = ort_options(ort, threads)
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        out = sess.run(None, {input_name: np.load(npy)})
        first = time.perf_counter() - t0
    else:
        name, weights, npy, threads = argv[1], argv[2], argv[3], int(argv[4])
        import torch
        sys.path.insert(0, HERE)
        import zoo
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        model = zoo.build(name, statistics=False)
        model.load_state_dict(torch.load(weights))
        with torch.no_grad():
            out = [model(torch.from_numpy(np.load(npy))).numpy()]
        first = time.perf_counter() - t0
    print(json.dumps({"first_s": first, "in_process_s": time.perf_counter() - t_start,
                      "out0": float(np.asarray(out[0]).ravel()[0])}))


def ort_options(ort, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return so


def run_measured(cmd, timeout, env=None):
    """Runs cmd (in `env`, default this process's); returns (status, stdout, stderr, wall seconds)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return -1, out, err + f"\n(timed out after {timeout} s)", time.perf_counter() - t0
    return p.returncode, out, err, time.perf_counter() - t0


GNU_TIME = "/usr/bin/time"


def peak_rss_of(cmd, timeout):
    """Runs cmd under GNU time; returns (status, stdout, stderr, wall seconds, its peak RSS in
    bytes). Not wait4 on a child of this process: a forked child's ru_maxrss starts at the
    parent's (this Python with torch loaded) and keeps it across exec; GNU time's child is
    forked from a small process."""
    marker = "@@peak_rss_kb "
    status, out, err, wall = run_measured([GNU_TIME, "-f", marker + "%M", *cmd], timeout)
    lines = err.splitlines()
    at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(marker)), None)
    rss = int(lines[at][len(marker):]) * 1024 if at is not None else None
    if at is not None:
        err = "\n".join(lines[:at] + lines[at + 1:])
    return status, out, err, wall, rss


# --- Kiln --------------------------------------------------------------------------------------

# `kiln run --time`: the phases up to the first result ("time:   PHASE  MS ms", indented two
# spaces per level), then the steady state of --repeat's runs.
PHASE_RE = re.compile(r"^time: ( *)(\S.*?) +([\d.]+) ms$", re.M)
RUNS_RE = re.compile(r"time: (\d+) runs: best ([\d.]+) ms, median ([\d.]+) ms")


def kiln_phases(out):
    """The top-level phases of `kiln run --time` (load, inputs, compile, first run) in ms."""
    return {m[2]: float(m[3]) for m in PHASE_RE.finditer(out) if len(m[1]) == 2}


def kiln_error(err):
    lines = [ln for ln in err.strip().splitlines() if "warning" not in ln]
    return " / ".join(lines[:4])[:600] or "no output"


def kiln_infer(kiln, path, input_name, npy, reps, timeout):
    cmd = [kiln, "run", path, "--input", f"{input_name}={npy}", "--time", "--repeat", str(reps)]
    status, out, err, _ = run_measured(cmd, timeout)
    m, r = kiln_phases(out), RUNS_RE.search(out)
    if status != 0 or not all(k in m for k in ("load", "inputs", "compile", "first run")) or not r:
        return {"error": kiln_error(err or out), "command": " ".join(cmd)}
    return {"load_s": (m["load"] + m["inputs"]) / 1e3, "compile_s": m["compile"] / 1e3, "first_ms": m["first run"],
            "best_ms": float(r[2]),
            "median_ms": float(r[3])}


def kiln_profile(kiln, path, input_name, npy, reps, timeout, top=15):
    cmd = [kiln, "run", path, "--input", f"{input_name}={npy}", "--profile", "--repeat", str(reps)]
    status, out, err, _ = run_measured(cmd, timeout)
    if status != 0:
        return {"error": kiln_error(err or out), "command": " ".join(cmd)}
    lines = out.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith("profile @")), None)
    if at is None:
        return {"error": "no profile in the output", "command": " ".join(cmd)}
    return {"text": "\n".join(lines[at:at + 2 + top]), "kernels": len(lines) - at - 2}


def kiln_train(train_bench, path, x_npy, y_npy, reps, timeout):
    cmd = [train_bench, path, "--input", x_npy, "--labels", y_npy, "--reps", str(reps)]
    status, out, err, _ = run_measured(cmd, timeout)
    m = re.search(r"train_step import_s ([\d.]+) compile_s ([\d.]+) first_ms ([\d.]+) best_ms ([\d.]+) "
                  r"median_ms ([\d.]+) loss (\S+)", out)
    if status != 0 or not m:
        return {"error": kiln_error(err or out), "command": " ".join(cmd)}
    return {"import_s": float(m[1]), "compile_s": float(m[2]), "first_ms": float(m[3]), "best_ms": float(m[4]),
            "median_ms": float(m[5]), "loss": float(m[6])}


# --- peers -------------------------------------------------------------------------------------

def best_of(f, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def merge_best(old, new):
    """Keeps the better steady figure of two rounds (Kiln's dicts, or plain ms)."""
    if old is None:
        return new
    if isinstance(new, dict):
        if "error" in new:
            return old
        if "error" in old:
            return new
        best = dict(old)
        for k in new:
            if k.endswith("_s") or k.endswith("_ms"):
                best[k] = min(old[k], new[k])
        return best
    return min(old, new)


# --- the run -----------------------------------------------------------------------------------

def header(kiln, threads):
    fields = {}
    try:
        for ln in open("/proc/cpuinfo"):
            if ":" not in ln:
                break  # the first processor's block only
            k, v = ln.split(":", 1)
            fields[k.strip()] = v.strip()
    except OSError:
        pass
    cpu = fields.get("model name", platform.processor() or "unknown")
    if "cpu family" in fields:  # a VM's model name can be as vague as "Intel(R) Xeon(R) Processor"
        flags = fields.get("flags", "").split()
        vec = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags]
        cpu += f" (family {fields['cpu family']}, model {fields.get('model', '?')}; {' '.join(vec) or 'no avx2'})"
    info = subprocess.run([kiln, "info"], capture_output=True, text=True).stdout.strip()
    git = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                         text=True).stdout.strip()
    import numpy
    import onnxruntime
    import torch
    import torchvision
    import transformers
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu, "cores": os.cpu_count(), "threads": threads, "kernel": platform.release(),
        "kiln_info": info, "kiln_git": git,
        "blas": next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("blas:")), "?"),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "transformers": transformers.__version__, "onnxruntime": onnxruntime.__version__,
                     "numpy": numpy.__version__, "python": platform.python_version()},
    }


def fmt_ms(v):
    if v is None:
        return "n/a"
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def ratio(kiln_ms, peers):
    vals = [v for v in peers if v is not None]
    if kiln_ms is None or not vals:
        return None
    return min(vals) / kiln_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="threads for every system (default 2)")
    ap.add_argument("--models", default=None, help="comma-separated models (default: all; --quick: resnet18)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: batch 1 only, 1 round of 2 calls, no training step")
    ap.add_argument("--rounds", type=int, default=3, help="rounds alternating the systems (default 3)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per system per round (default 5)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="Kiln's build folder (default: build)")
    ap.add_argument("--models-dir", default="/work/models", help="the exported models (default /work/models)")
    ap.add_argument("--json", default=os.path.join(HERE, "results.json"), help="where to write the figures")
    ap.add_argument("--png", default=os.path.join(HERE, "results.png"), help="where to draw the plot")
    ap.add_argument("--no-train", action="store_true", help="skip the training steps")
    ap.add_argument("--no-memory", action="store_true", help="skip peak memory and time to the first result")
    ap.add_argument("--no-profile", action="store_true", help="skip Kiln's per-kernel profiles")
    ap.add_argument("--timeout", type=int, default=900, help="seconds any one Kiln process may take (default 900)")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ap.add_argument("--report", metavar="FILE.json",
                    help="measure nothing: print the tables of an earlier run's JSON and draw its plot (--png)")
    a = ap.parse_args()
    if a.child:
        return child_main(a.child)
    if a.report:
        sys.path.insert(0, HERE)
        import zoo
        result = json.load(open(a.report))
        keys = list(result["inference"])
        names = list(dict.fromkeys(k.split("/")[0] for k in keys))
        batches = sorted({int(k.split("/")[1]) for k in keys})
        print(f"# {result['header']['date']}, {result['header']['cpu']}, {result['header']['threads']} threads, "
              f"kiln {result['header']['kiln_git']}; blas: {result['header']['blas']}")
        report(result, names, batches, zoo)
        plot(result, names, batches, zoo, a.png, result["header"]["threads"])
        return print(f"wrote {a.png}")
    if a.threads < 1 or a.rounds < 1 or a.reps < 1:
        sys.exit("bench.py: --threads, --rounds and --reps need positive counts")
    set_threads_env(a.threads)

    sys.path.insert(0, HERE)
    import zoo
    names = a.models.split(",") if a.models else (["resnet18"] if a.quick else list(zoo.MODELS))
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        sys.exit(f"bench.py: unknown model(s) {', '.join(unknown)}; known: {', '.join(zoo.MODELS)}")
    batches = (1,) if a.quick else BATCHES
    rounds, reps = (1, 2) if a.quick else (a.rounds, a.reps)
    train = not (a.quick or a.no_train)
    kiln = os.path.join(a.build, "tools", "kiln")
    train_bench = os.path.join(a.build, "bench", "train_step_bench")
    for exe in (kiln,) + ((train_bench,) if train else ()):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench.py: {exe} is missing: build Kiln first (cmake --build {a.build})")

    # The exports (kept when up to date).
    print(f"bench.py: exporting {', '.join(names)} to {a.models_dir} (kept when up to date)", file=sys.stderr)
    ex = subprocess.run([sys.executable, os.path.join(HERE, "export.py"), "--out", a.models_dir, "--models",
                         ",".join(names)])
    manifest = json.load(open(os.path.join(a.models_dir, "manifest.json")))["models"]
    if ex.returncode != 0:
        print("bench.py: some exports failed; those models are left out", file=sys.stderr)

    import numpy as np
    import onnxruntime as ort
    import torch
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass

    head = header(kiln, a.threads)
    result = {"header": head, "rounds": rounds, "reps": reps, "inference": {}, "training": {}, "memory": {},
              "profiles": {}, "failures": []}
    print(f"# Kiln vs ONNX Runtime and PyTorch eager, {a.threads} threads, {head['date']}")
    print(f"# CPU: {head['cpu']} ({head['cores']} cores); OPENBLAS_CORETYPE={head['OPENBLAS_CORETYPE']}")
    print(f"# kiln {head['kiln_git']}; blas: {head['blas']}")
    print("# " + ", ".join(f"{k} {v}" for k, v in head["versions"].items()))
    print(f"# best of {rounds} rounds x {reps} calls, the systems alternating", flush=True)

    tmp = tempfile.mkdtemp(prefix="kiln_models_bench_")
    # Kiln compiles cold everywhere (its disk cache of compiled code off): the compile figure
    # is LLVM's work. Time to the first result is measured both ways below.
    os.environ["KILN_CACHE"] = "0"
    warm_env = {k: v for k, v in os.environ.items() if k != "KILN_CACHE"}
    warm_env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
    for name in names:
        if name not in manifest:
            result["failures"].append({"model": name, "system": "export", "error": "not exported (see export.py)"})
            continue
        info = manifest[name]
        print(f"bench.py: {name}", file=sys.stderr, flush=True)
        model = zoo.build(name)
        inputs, npys, sessions = {}, {}, {}
        for b in batches:
            inputs[b] = zoo.example(name, b, model)
            npys[b] = os.path.join(tmp, f"{name}_b{b}.npy")
            np.save(npys[b], inputs[b].numpy())
            path = os.path.join(a.models_dir, info["files"][str(b)])
            try:
                sessions[b] = ort.InferenceSession(path, ort_options(ort, a.threads),
                                                   providers=["CPUExecutionProvider"])
            except Exception as e:
                sessions[b] = None
                result["failures"].append({"model": name, "batch": b, "system": "onnxruntime", "error": str(e)[:400]})
        weights_pt = os.path.join(tmp, f"{name}.pt")  # for the PyTorch child of the memory figures
        torch.save(model.state_dict(), weights_pt)
        figures = {b: {"kiln": None, "onnxruntime": None, "pytorch": None} for b in batches}
        paired = {b: [] for b in batches}  # per round: ORT's best over Kiln's best, measured back to back
        for r in range(rounds):
            for b in batches:
                path = os.path.join(a.models_dir, info["files"][str(b)])
                k = kiln_infer(kiln, path, info["input"], npys[b], reps, a.timeout)
                figures[b]["kiln"] = merge_best(figures[b]["kiln"], k)
                if sessions[b] is not None:
                    feed = {info["input"]: inputs[b].numpy()}
                    if r == 0:
                        sessions[b].run(None, feed)
                    o = best_of(lambda: sessions[b].run(None, feed), reps)
                    figures[b]["onnxruntime"] = merge_best(figures[b]["onnxruntime"], o)
                    if k.get("best_ms"):
                        paired[b].append(o / k["best_ms"])
                with torch.no_grad():
                    if r == 0:
                        model(inputs[b])
                    figures[b]["pytorch"] = merge_best(figures[b]["pytorch"],
                                                       best_of(lambda: model(inputs[b]), reps))
        for b in batches:
            k = figures[b]["kiln"]
            if "error" in k:
                result["failures"].append({"model": name, "batch": b, "system": "kiln", **k})
            kiln_ms = k.get("best_ms")
            row = {"kiln_ms": kiln_ms, "onnxruntime_ms": figures[b]["onnxruntime"], "pytorch_ms": figures[b]["pytorch"],
                   "kiln_compile_s": k.get("compile_s"), "kiln_load_s": k.get("load_s"),
                   "kiln_first_ms": k.get("first_ms"), "kiln_error": k.get("error")}
            row["ratio"] = ratio(kiln_ms, [row["onnxruntime_ms"], row["pytorch_ms"]])
            # Robust to a machine whose speed drifts between rounds: the median over rounds of
            # the ratio of figures taken back to back.
            row["ort_ratio_paired"] = statistics.median(paired[b]) if paired[b] else None
            result["inference"][f"{name}/{b}"] = row
            print(f"bench.py: {name} b{b}: kiln {fmt_ms(kiln_ms)} ms, ort {fmt_ms(row['onnxruntime_ms'])} ms, "
                  f"pytorch {fmt_ms(row['pytorch_ms'])} ms" + (f" (kiln: {k['error'][:200]})" if "error" in k else ""),
                  file=sys.stderr, flush=True)
        sessions.clear()

        # The training step.
        if train and name in zoo.TRAINED and "train" in info["files"]:
            tb = info["train_batch"]
            classes = info["out_shape_b1"][-1]
            x = zoo.example(name, tb, model)
            y = zoo.labels(name, tb, classes)
            x_npy, y_npy = os.path.join(tmp, f"{name}_train_x.npy"), os.path.join(tmp, f"{name}_train_y.npy")
            np.save(x_npy, x.numpy())
            np.save(y_npy, y.numpy().astype(np.int32))
            tmodel = zoo.build(name).train()
            opt = torch.optim.SGD(tmodel.parameters(), lr=0.01, momentum=0.9)
            loss_fn = torch.nn.CrossEntropyLoss()

            def step():
                opt.zero_grad(set_to_none=True)
                loss_fn(tmodel(x), y).backward()
                opt.step()

            step()
            kt, pt = None, None
            path = os.path.join(a.models_dir, info["files"]["train"])
            for r in range(rounds):
                kt = merge_best(kt, kiln_train(train_bench, path, x_npy, y_npy, reps, a.timeout))
                pt = merge_best(pt, best_of(step, reps))
            if "error" in kt:
                result["failures"].append({"model": name, "batch": tb, "system": "kiln train step", **kt})
            row = {"batch": tb, "kiln_ms": kt.get("best_ms"), "pytorch_ms": pt, "kiln_compile_s": kt.get("compile_s"),
                   "kiln_error": kt.get("error")}
            row["ratio"] = ratio(row["kiln_ms"], [pt])
            result["training"][name] = row
            del tmodel, opt
        del model

        # Kiln's per-kernel profile.
        if not a.no_profile and name in PROFILED:
            for b in batches:
                path = os.path.join(a.models_dir, info["files"][str(b)])
                result["profiles"][f"{name}/{b}"] = kiln_profile(kiln, path, info["input"], npys[b], reps, a.timeout)

        # Peak memory and time to the first result, each system in its own process, batch 1.
        if not a.no_memory and not os.access(GNU_TIME, os.X_OK):
            print(f"bench.py: no {GNU_TIME} (Debian package 'time'): peak memory skipped", file=sys.stderr)
        elif not a.no_memory:
            path = os.path.join(a.models_dir, info["files"]["1"])
            mem = {"weights_mb": info["weights_bytes"] / 1e6}
            st, out, err, wall, rss = peak_rss_of([kiln, "run", path, "--input", f"{info['input']}={npys[1]}"],
                                                  a.timeout)
            mem.update(kiln_rss_mb=rss / 1e6 if st == 0 else None, kiln_first_s=wall if st == 0 else None)
            # Again with the disk cache of compiled code, after a run that fills it.
            kiln_cmd = [kiln, "run", path, "--input", f"{info['input']}={npys[1]}"]
            st = run_measured(kiln_cmd, a.timeout, warm_env)[0]
            st, out, err, wall = run_measured(kiln_cmd, a.timeout, warm_env) if st == 0 else (st, "", "", None)
            mem.update(kiln_first_warm_s=wall if st == 0 else None)
            st, out, err, wall, rss = peak_rss_of([sys.executable, __file__, "--child", "ort", path, info["input"],
                                                   npys[1], str(a.threads)], a.timeout)
            if st == 0:
                c = json.loads(out.strip().splitlines()[-1])
                mem.update(ort_rss_mb=rss / 1e6, ort_first_s=c["first_s"], ort_process_s=wall)
            st, out, err, wall, rss = peak_rss_of([sys.executable, __file__, "--child", "torch", name, weights_pt,
                                                   npys[1], str(a.threads)], a.timeout)
            if st == 0:
                c = json.loads(out.strip().splitlines()[-1])
                mem.update(pytorch_rss_mb=rss / 1e6, pytorch_first_s=c["first_s"], pytorch_process_s=wall)
            result["memory"][name] = mem

        write_json(result, a.json)  # after each model: a run cut short keeps what it measured
    shutil.rmtree(tmp, ignore_errors=True)
    report(result, names, batches, zoo)
    write_json(result, a.json)
    print(f"wrote {a.json}")
    try:
        plot(result, names, batches, zoo, a.png, a.threads)
        print(f"wrote {a.png}")
    except Exception as e:
        print(f"bench.py: no plot: {type(e).__name__}: {e}", file=sys.stderr)


def write_json(result, path):
    tmp = path + f".tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, path)


def report(result, names, batches, zoo):
    inf = result["inference"]
    print()
    print("| model | batch | Kiln ms | ONNX Runtime ms | PyTorch eager ms | Kiln vs best peer | "
          "Kiln vs ORT, median of rounds |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        for b in batches:
            row = inf.get(f"{name}/{b}")
            if row is None:
                continue
            kiln_cell = fmt_ms(row["kiln_ms"]) if row["kiln_ms"] is not None else "fails"
            rt = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "n/a"
            pr = row.get("ort_ratio_paired")
            pr = f"{pr:.2f}x" if pr is not None else "n/a"
            print(f"| {zoo.MODELS[name][0]} | {b} | {kiln_cell} | {fmt_ms(row['onnxruntime_ms'])} | "
                  f"{fmt_ms(row['pytorch_ms'])} | {rt} | {pr} |")
    if result["training"]:
        print()
        print("| training step (SGD momentum, cross-entropy) | batch | Kiln ms | PyTorch eager ms | Kiln vs PyTorch |")
        print("|---|---|---|---|---|")
        for name, row in result["training"].items():
            rt = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "n/a"
            kiln_cell = fmt_ms(row["kiln_ms"]) if row["kiln_ms"] is not None else "fails"
            print(f"| {zoo.MODELS[name][0]} | {row['batch']} | {kiln_cell} | {fmt_ms(row['pytorch_ms'])} | {rt} |")
    print()
    print("| model | weights MB | Kiln load + compile s (b1) | Kiln peak RSS MB | ORT peak RSS MB | PyTorch peak RSS MB "
          "| Kiln process to first result s, cold / warm cache | ORT session + first run s | ORT process s |")
    print("|---|---|---|---|---|---|---|---|---|")

    def f(v, d=2):
        return "n/a" if v is None else f"{v:.{d}f}"

    for name in names:
        row = inf.get(f"{name}/1")
        mem = result["memory"].get(name, {})
        lc = None if row is None or row["kiln_compile_s"] is None else row["kiln_load_s"] + row["kiln_compile_s"]
        lc_cell = "n/a" if lc is None else f"{row['kiln_load_s']:.2f} + {row['kiln_compile_s']:.2f}"
        print(f"| {zoo.MODELS[name][0]} | {f(mem.get('weights_mb'), 0)} | {lc_cell} | {f(mem.get('kiln_rss_mb'), 0)} | "
              f"{f(mem.get('ort_rss_mb'), 0)} | {f(mem.get('pytorch_rss_mb'), 0)} | "
              f"{f(mem.get('kiln_first_s'))} / {f(mem.get('kiln_first_warm_s'))} | "
              f"{f(mem.get('ort_first_s'))} | {f(mem.get('ort_process_s'))} |")
    for key, prof in result["profiles"].items():
        print()
        print(f"Kiln profile, {key.replace('/', ' batch ')} (top 15 kernels):")
        print(prof.get("text") or f"  fails: {prof.get('error')}")
    if result["failures"]:
        print()
        print("Failures:")
        for fl in result["failures"]:
            where = f"{fl['model']}" + (f" b{fl['batch']}" if "batch" in fl else "")
            print(f"- {where} ({fl['system']}): {fl['error']}" + (f"\n  command: {fl['command']}" if "command" in fl
                                                                   else ""))


def plot(result, names, batches, zoo, png, threads):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    inf = result["inference"]
    keys = [f"{n}/{b}" for n in names for b in batches if f"{n}/{b}" in inf]
    keys += [f"train:{n}" for n in result["training"]]
    labels, rows = [], []
    for k in keys:
        if k.startswith("train:"):
            n = k[6:]
            row = result["training"][n]
            labels.append(f"{zoo.MODELS[n][0].split(' (')[0]}\ntrain b{row['batch']}")
            rows.append((row["kiln_ms"], None, row["pytorch_ms"], row["ratio"]))
        else:
            n, b = k.split("/")
            row = inf[k]
            labels.append(f"{zoo.MODELS[n][0].split(' (')[0]}\nb{b}")
            rows.append((row["kiln_ms"], row["onnxruntime_ms"], row["pytorch_ms"], row["ratio"]))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(keys) + 2), 8))
    colors = {"Kiln": "#d95f02", "ONNX Runtime": "#1b9e77", "PyTorch eager": "#7570b3"}
    w = 0.27
    for i, (sysname, col) in enumerate(colors.items()):
        xs = [j + (i - 1) * w for j in range(len(rows))]
        vals = [r[i] if r[i] is not None else 0 for r in rows]
        ax1.bar(xs, vals, w, label=sysname, color=col)
    ax1.set_yscale("log")
    ax1.set_ylabel("ms per inference / step (log, lower is better)")
    ax1.set_xticks(range(len(rows)))
    ax1.set_xticklabels(labels, fontsize=7)
    ax1.legend(fontsize=8)
    ratios = [r[3] if r[3] is not None else 0 for r in rows]
    bars = ax2.bar(range(len(rows)), ratios, color=["#1b9e77" if v >= 1 else "#d95f02" for v in ratios])
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_xticks(range(len(rows)))
    ax2.set_xticklabels(labels, fontsize=7)
    ax2.set_ylabel("Kiln's speed / best peer's (>1: Kiln faster)")
    for b_, v in zip(bars, ratios):
        ax2.annotate(f"{v:.2f}" if v else "fails", (b_.get_x() + b_.get_width() / 2, b_.get_height()), ha="center",
                     va="bottom", fontsize=7)
    h = result["header"]
    fig.suptitle(f"Kiln vs ONNX Runtime and PyTorch eager, {threads} threads, {h['cpu']}, {h['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=80)


if __name__ == "__main__":
    main()
