"""Train LeNet on Fashion-MNIST from Python with Adam and a cosine schedule, checkpointing
every epoch (run it again to resume), then write the trained model as an AOT object."""
import argparse

import kiln

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--train-limit", type=int, default=0)
ap.add_argument("--out", default="lenet_run", help="checkpoints and the AOT object go here")
args = ap.parse_args()

train = kiln.datasets.fashion_mnist("train", flat=False)
test = kiln.datasets.fashion_mnist("test", flat=False)
if args.train_limit:
    train = {k: v[: args.train_limit] for k, v in train.items()}

t = kiln.Tracer("lenet")
s = kiln.nn.Scope(t, seed=1)
x, y = t.input("x", kiln.f32[64, 1, 28, 28]), t.input("y", kiln.i32[64])
nn = kiln.nn
logits = nn.Sequential(
    nn.Conv2d(s.sub("conv1"), 1, 6, 5, padding=2), nn.relu, nn.MaxPool2d(2),
    nn.Conv2d(s.sub("conv2"), 6, 16, 5), nn.relu, nn.MaxPool2d(2), nn.Flatten(),
    nn.Linear(s.sub("fc1"), 400, 120), nn.relu, nn.Linear(s.sub("fc2"), 120, 10))(x)
t.output("loss", nn.cross_entropy(logits, y))
t.output("accuracy", nn.accuracy(logits, y))

with kiln.Trainer(t.finish(), optimizer=kiln.optim.Adam(lr=2e-3), batch=64, schedule="cosine",
                  epochs=args.epochs, checkpoint_dir=args.out) as trainer:
    if trainer.resume():
        print(f"resumed at epoch {trainer.epoch}")
    for e in trainer.fit(train, test, epochs=args.epochs, progress=True):
        print(f"epoch {e['epoch']}: loss {e['train_loss']:.4f}, test accuracy {e['test_accuracy']:.4f}")
    files = trainer.eval_executable.write_object(f"{args.out}/lenet.o", header=f"{args.out}/lenet.h")
    print("wrote", ", ".join(files["files"]))
