"""kiln.distributed and kiln.Trainer(distributed=True) under mpirun (skipped where mpirun or
MPI is missing): two ranks hold bitwise the same weights, agree with one process at the same
global batch within the tolerance of docs/distributed.md, and report the global metrics."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kiln

SCRIPT = r"""
import sys, numpy as np, kiln, kiln.distributed as dist
out, distributed = sys.argv[1], sys.argv[2] == "1"
t = kiln.Tracer("mlp")
s = kiln.nn.Scope(t, seed=0)
x = t.input("x", kiln.f32[32, 20])
y = t.input("y", kiln.i32[32])
logits = kiln.nn.Sequential(kiln.nn.Linear(s.sub("fc1"), 20, 16), kiln.nn.relu, kiln.nn.Linear(s.sub("fc2"), 16, 3))(x)
t.output("loss", kiln.nn.cross_entropy(logits, y))
t.output("accuracy", kiln.nn.accuracy(logits, y))
rng = np.random.default_rng(0)
data = {"x": rng.standard_normal((1000, 20)).astype(np.float32), "y": rng.integers(0, 3, 1000).astype(np.int32)}
tr = kiln.Trainer(t.finish(), batch=32, distributed=distributed)
hist = tr.fit(data, data, epochs=2)
np.savez(out + f".{dist.rank()}.npz", **{k: np.asarray(v) for k, v in tr.state.items()},
         test_loss=hist[-1]["test_loss"], train_loss=hist[-1]["train_loss"], size=dist.size(),
         overlap=dist.overlap())
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_two_ranks_match_one_process(tmp_path):
    env = dict(os.environ, KILN_DIST_TIMEOUT="60", KILN_NUM_THREADS="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    one = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "one"), "0"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    # The ranks' sums on the communication thread (on 2 cores the default leaves it off).
    two = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-c", SCRIPT,
                          str(tmp_path / "two"), "1"], env=dict(env, KILN_DIST_OVERLAP="1"),
                         capture_output=True, text=True, timeout=300)
    if "built without MPI" in two.stderr:
        pytest.skip("this kiln was built without MPI")
    assert two.returncode == 0, two.stderr
    a = np.load(tmp_path / "one.0.npz")
    r0, r1 = np.load(tmp_path / "two.0.npz"), np.load(tmp_path / "two.1.npz")
    assert int(r0["size"]) == 2 and int(a["size"]) == 1
    assert bool(r0["overlap"]) and not bool(a["overlap"])
    for k in r0.files:
        assert r0[k].tobytes() == r1[k].tobytes(), k  # every rank holds the same bits
        if r0[k].dtype.kind == "f":
            scale = max(np.abs(a[k]).max(), 1e-30)
            assert np.abs(r0[k] - a[k]).max() <= 1e-5 * scale, k


FAILING = r"""
import numpy as np, kiln, kiln.distributed as dist
dist.init()
t = kiln.Tracer("m")
x = t.input("x", kiln.f32[8, 4])
w = t.parameter("w", np.ones((4, 1), np.float32))
t.output("loss", kiln.mean(x @ w, []))
tr = kiln.Trainer(t.finish(), batch=8, distributed=True)
# Rank 1's data has another dtype: it fails alone, and must not leave rank 0 waiting.
xs = np.ones((64, 4), np.float32 if dist.rank() == 0 else np.float64)
tr.fit({"x": xs}, epochs=50)
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) is not installed")
def test_a_rank_that_fails_ends_the_job():
    import time
    env = dict(os.environ, KILN_DIST_TIMEOUT="120")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    start = time.monotonic()
    r = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, "-c", FAILING], env=env,
                       capture_output=True, text=True, timeout=100)
    if "built without MPI" in r.stderr:
        pytest.skip("this kiln was built without MPI")
    assert r.returncode != 0
    assert time.monotonic() - start < 60  # not KILN_DIST_TIMEOUT's 120 s
    assert "kiln: rank 1: Error:" in r.stderr, r.stderr


def test_single_process_defaults():
    # Before MPI starts (and in a single process): rank 0 of 1.
    assert kiln.distributed.rank() == 0 and kiln.distributed.size() == 1
    assert kiln.distributed.launched_by_mpi() is False
    assert kiln.distributed.overlap() is False
