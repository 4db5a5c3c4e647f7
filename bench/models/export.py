"""Exports the benchmark's models (bench/models/zoo.py) to ONNX, opset 17, random weights
from fixed seeds, with a manifest.json that bench.py reads.

usage: python export.py [--out DIR] [--models a,b,...] [--seed S] [--train-batch N] [--force]

Image models are exported once with a symbolic batch axis (Kiln rebatches them to the
inputs' batch); the text models at each benchmark batch size (1 and 16) separately, with
static shapes, since a text model imported at batch 1 does not rebatch in Kiln today.
The trained models (ResNet-18, BERT) also get NAME_train_bN.onnx: the model in train mode
exported as such (batch norm on the batch's statistics, dropout), for Kiln's training step.
Each file is written under a temporary name and renamed, so a shared folder never holds
half a model. Files already there with the same seed and versions are kept unless --force.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

BATCHES = (1, 16)
OPSET = 17


def versions():
    import onnx
    import torchvision
    import transformers
    return {"torch": torch.__version__, "torchvision": torchvision.__version__,
            "transformers": transformers.__version__, "onnx": onnx.__version__, "opset": OPSET}


def export_one(model, x, path, input_name, dynamic, training=False):
    """Inference: the model in eval mode (the exporter folds batch norm into the convolutions).
    training: the model in train mode, exported as such (BatchNormalization training_mode=1,
    Dropout nodes), the graph Kiln's training step is built from."""
    tmp = path + f".tmp{os.getpid()}"
    kwargs = dict(input_names=[input_name], output_names=["out"], opset_version=OPSET, do_constant_folding=not training,
                  dynamo=False)
    if dynamic:
        kwargs["dynamic_axes"] = {input_name: {0: "batch"}, "out": {0: "batch"}}
    if training:
        kwargs["training"] = torch.onnx.TrainingMode.TRAINING
        model.train()
    try:
        with torch.no_grad():
            torch.onnx.export(model, (x,), tmp, **kwargs)
    finally:
        model.eval()
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/work/models", help="the folder for the .onnx files and manifest.json")
    ap.add_argument("--models", default=",".join(zoo.MODELS), help="comma-separated names (default: all): "
                    + ", ".join(zoo.MODELS))
    ap.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0)")
    ap.add_argument("--force", action="store_true", help="export again even when the files are there")
    ap.add_argument("--train-batch", type=int, default=16,
                    help="the batch of the training exports (" + ", ".join(zoo.TRAINED) + "; default 16)")
    a = ap.parse_args()
    names = [n for n in a.models.split(",") if n]
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        sys.exit(f"export.py: unknown model(s) {', '.join(unknown)}; known: {', '.join(zoo.MODELS)}")
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    manifest_path = os.path.join(a.out, "manifest.json")
    manifest = {"models": {}}
    if os.path.exists(manifest_path):
        manifest = json.load(open(manifest_path))
    ver = versions()
    failed = []
    for name in names:
        label, kind, _ = zoo.MODELS[name]
        old = manifest["models"].get(name)
        if (old and not a.force and old.get("seed") == a.seed and old.get("versions") == ver
                and old.get("train_batch") == (a.train_batch if name in zoo.TRAINED else None)
                and all(os.path.exists(os.path.join(a.out, f)) for f in old["files"].values())):
            print(f"export.py: {name}: up to date", file=sys.stderr)
            continue
        t0 = time.time()
        try:
            model = zoo.build(name, a.seed)
            input_name = "x" if kind == "image" else "input_ids"
            files = {}
            if kind == "image":
                f = f"{name}.onnx"
                export_one(model, zoo.example(name, 1, model, a.seed), os.path.join(a.out, f), input_name, True)
                files = {str(b): f for b in BATCHES}
            else:
                for b in BATCHES:
                    f = f"{name}_b{b}.onnx"
                    export_one(model, zoo.example(name, b, model, a.seed), os.path.join(a.out, f), input_name, False)
                    files[str(b)] = f
            if name in zoo.TRAINED:
                f = f"{name}_train_b{a.train_batch}.onnx"
                export_one(model, zoo.example(name, a.train_batch, model, a.seed), os.path.join(a.out, f), input_name,
                           False, training=True)
                files["train"] = f
            with torch.no_grad():
                out = model(zoo.example(name, 1, model, a.seed))
            params = sum(p.numel() for p in model.parameters())
            manifest["models"][name] = {
                "label": label, "kind": kind, "input": input_name, "files": files, "seed": a.seed,
                "params": params, "weights_bytes": 4 * params, "out_shape_b1": list(out.shape),
                "out_std_b1": float(out.float().std()), "versions": ver,
                "vocab": zoo.vocab(name, model) if kind == "text" else None,
                "train_batch": a.train_batch if name in zoo.TRAINED else None}
            print(f"export.py: {name}: {params / 1e6:.1f}M parameters, output {list(out.shape)} "
                  f"std {float(out.float().std()):.3g}, {time.time() - t0:.1f} s", file=sys.stderr)
        except Exception as e:  # keep the others; bench.py reports the model as not exported
            failed.append(name)
            manifest["models"].pop(name, None)
            print(f"export.py: {name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        tmp = manifest_path + f".tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(manifest, fh, indent=1)
        os.replace(tmp, manifest_path)
    if failed:
        sys.exit(f"export.py: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
