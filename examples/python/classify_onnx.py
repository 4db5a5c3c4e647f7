"""Import an ONNX image classifier (e.g. torchvision's ResNet-18 exported to ONNX), compile it
and classify a batch of images given as a .npy file [N, 3, H, W] (random ones without)."""
import argparse

import numpy as np

import kiln

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("model", help="an .onnx file")
ap.add_argument("--images", help="a .npy file of float32 images [N, 3, H, W]")
ap.add_argument("--top", type=int, default=3)
args = ap.parse_args()

g = kiln.import_onnx(args.model)
(name, typ), = g.inputs.items()                  # e.g. x: "f32[1,3,224,224]"
dims = [int(d) for d in typ[typ.index("[") + 1:-1].split(",")]
if args.images:
    images = np.load(args.images).astype(np.float32)
else:
    images = np.random.default_rng(0).standard_normal((4, *dims[1:])).astype(np.float32)
exe = kiln.compile(g)
out = next(iter(exe({name: images}).values()))
for i, row in enumerate(out):
    best = np.argsort(row)[::-1][: args.top]
    print(f"image {i}: " + ", ".join(f"class {c} ({row[c]:.3f})" for c in best))
print(f"compiled in {exe.compile_ms:.0f} ms")
