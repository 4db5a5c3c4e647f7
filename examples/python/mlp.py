"""Train the Fashion-MNIST MLP (784-256-10) from Python: trace it, compile its training step,
fit three epochs, classify a few test images. Data: apt-get install dataset-fashion-mnist."""
import argparse

import numpy as np

import kiln

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--train-limit", type=int, default=0, help="use only the first N training images")
args = ap.parse_args()

train, test = kiln.datasets.fashion_mnist("train"), kiln.datasets.fashion_mnist("test")
if args.train_limit:
    train = {k: v[: args.train_limit] for k, v in train.items()}

t = kiln.Tracer("mlp")
s = kiln.nn.Scope(t, seed=0)
x, y = t.input("x", kiln.f32[64, 784]), t.input("y", kiln.i32[64])
logits = kiln.nn.Sequential(kiln.nn.Linear(s.sub("fc1"), 784, 256), kiln.nn.relu,
                            kiln.nn.Linear(s.sub("fc2"), 256, 10))(x)
t.output("loss", kiln.nn.cross_entropy(logits, y))
t.output("accuracy", kiln.nn.accuracy(logits, y))
t.output("logits", logits)

trainer = kiln.Trainer(t.finish(), optimizer=kiln.optim.SGD(lr=0.05, momentum=0.9), batch=64)
for e in trainer.fit(train, test, epochs=args.epochs, progress=True):
    print(f"epoch {e['epoch']}: loss {e['train_loss']:.4f}, test accuracy {e['test_accuracy']:.4f}, "
          f"{e['seconds']:.2f} s")

predict = trainer.eval_executable            # the model on the trained state
out = predict(x=test["x"][:8], y=test["y"][:8])
names = kiln.datasets.fashion_mnist_classes()
for p, label in zip(np.argmax(out["logits"], axis=1), test["y"][:8]):
    print(f"predicted {names[p]:12s} label {names[label]}")
