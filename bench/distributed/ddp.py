"""PyTorch DDP (Gloo) beside Kiln's data-parallel step, on this machine: the peer of
bench/distributed/resnet.sh. ResNet-18 (torchvision, random initial weights), softmax
cross-entropy, SGD momentum 0.9, lr 0.01, a global batch of --batch random 224x224 images:

  1 process x R threads at the global batch,
  1 process x 1 thread at a rank's share (the compute each rank does),
  R processes x 1 thread under DistributedDataParallel over Gloo (its default bucketing and
  overlap of the gradients' all-reduce with the backward pass),

each the median of --reps timed steps after 2 untimed ones, best of --rounds rounds; the
same table as resnet.sh (step ms, samples/s, the ratio to one process, the efficiency).
Run with the peers' venv (torch, torchvision): never a test dependency.

usage: /work/peers-venv/bin/python bench/distributed/ddp.py [--ranks R] [--batch N]
                                                            [--reps K] [--rounds K]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def step_ms(batch: int, reps: int, distributed: bool) -> float:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1000)
    if distributed:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(batch, 3, 224, 224) * 2 - 1
    y = torch.randint(0, 1000, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(reps + 2):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if i >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    if distributed:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    return statistics.median(times)


def run(threads: int, ranks: int, batch: int, reps: int) -> float:
    """The median step of one configuration, from child processes (a fresh torch each)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--child", str(batch), str(reps), str(threads)]
    if ranks == 1:
        out = subprocess.run(cmd + ["0"], env=env, check=True, capture_output=True, text=True).stdout
        return float(out.split()[-1])
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000), WORLD_SIZE=str(ranks))
    procs = [subprocess.Popen(cmd + ["1"], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              text=True) for r in range(ranks)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("ddp.py: a rank failed")
    return max(float(o.split()[-1]) for o in outs)  # the step ends when the slowest rank's does


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        batch, reps, threads, distributed = (int(a) for a in sys.argv[2:6])
        import torch
        torch.set_num_threads(threads)
        print(f"step_ms {step_ms(batch, reps, bool(distributed)):.3f}")
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="the global batch (default 16)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    if a.ranks < 1 or a.batch % a.ranks:
        p.error(f"--batch {a.batch} is not a multiple of --ranks {a.ranks}")
    share = a.batch // a.ranks
    configs = [(f"1 process x {a.ranks} threads, batch {a.batch}", a.ranks, 1, a.batch),
               (f"1 process x 1 thread, batch {share}", 1, 1, share),
               (f"{a.ranks} ranks x 1 thread, DDP (Gloo)", 1, a.ranks, share)]
    best = {}
    for _ in range(a.rounds):
        for label, threads, ranks, b in configs:
            ms = run(threads, ranks, b, a.reps)
            best[label] = min(ms, best.get(label, ms))
    import torch
    print(f"PyTorch {torch.__version__} DDP, ResNet-18, global batch {a.batch}, {a.ranks} ranks of {share}, "
          f"median of {a.reps} steps, best of {a.rounds} rounds")
    print(f"{'configuration':44} {'step ms':>9} {'samples/s':>10} {'vs 1 process':>13} {'efficiency':>11}")
    one = best[configs[0][0]]
    per_rank = best[configs[1][0]]
    for label, threads, ranks, b in configs:
        ms = best[label]
        n = b * ranks if ranks > 1 else b
        print(f"{label:44} {ms:9.1f} {n * 1e3 / ms:10.1f} {(n / ms) / (a.batch / one):12.2f}x {per_rank / ms:11.2f}")


if __name__ == "__main__":
    main()
