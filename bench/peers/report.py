"""Joins Kiln's figures and the peers' (bench/peers/run.sh) into one table and a plot.

usage: report.py KILN_SWEEP_LINE_FILE PEERS_JSON OUT_PNG

Each row is one figure; each column one system; the last column is Kiln's speed-up over
the best peer (above 1: Kiln is faster). Epoch times are 60,000 images at the step time.
"""
import json
import sys

FIGURES = [  # key, label, scale, unit, samples per epoch step (None: a latency)
    ("mlp_step", "MLP 784-256-10 b64 training", 60000 / 64, "s/epoch"),
    ("lenet_step", "LeNet b256 training", 60000 / 256, "s/epoch"),
    ("mlp_b1", "MLP batch-1 inference", 1e6, "us"),
    ("lenet_b1", "LeNet batch-1 inference", 1e6, "us"),
]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    kiln_line, peers_path, png = sys.argv[1:]
    fields = open(kiln_line).read().split()
    if len(fields) != 6 or fields[0] != "sweep":
        sys.exit(f"report.py: {kiln_line}: expected 'sweep T mlp_step lenet_step mlp_b1 lenet_b1'")
    threads = int(fields[1])
    systems = {"kiln": dict(zip(["mlp_step", "lenet_step", "mlp_b1", "lenet_b1"], map(float, fields[2:])))}
    peers = json.load(open(peers_path))
    versions = peers.pop("versions", {})
    systems.update(peers)
    names = list(systems)
    print(f"Kiln vs peers, {threads} threads ({', '.join(f'{k} {v}' for k, v in versions.items())})")
    head = f"{'figure':34s}" + "".join(f"{n:>15s}" for n in names) + f"{'kiln vs best':>14s}"
    print(head)
    print("-" * len(head))
    table = {}
    for key, label, scale, unit in FIGURES:
        row = {n: systems[n].get(key) for n in names}
        table[key] = row
        cells = "".join(f"{row[n] * scale:15.3f}" if row[n] is not None else f"{'n/a':>15s}" for n in names)
        peer_values = [v for n, v in row.items() if n != "kiln" and v is not None]
        ratio = f"{min(peer_values) / row['kiln']:13.2f}x" if peer_values else f"{'n/a':>14s}"
        print(f"{label + ' (' + unit + ')':34s}{cells}{ratio}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
    colors = ["#d95f02", "#7570b3", "#1b9e77", "#e7298a", "#66a61e"]
    for ax, (key, label, scale, unit) in zip(axes, FIGURES):
        shown = [n for n in names if table[key][n] is not None]
        vals = [table[key][n] * scale for n in shown]
        bars = ax.bar(range(len(shown)), vals, color=[colors[names.index(n) % len(colors)] for n in shown])
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels(shown, rotation=20, ha="right", fontsize=8)
        ax.set_title(label, fontsize=9)
        ax.set_ylabel(unit + " (lower is better)", fontsize=8)
        for b, v in zip(bars, vals):
            ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                        fontsize=7)
    fig.suptitle(f"Kiln vs PyTorch and ONNX Runtime on the CPU, {threads} threads", fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
