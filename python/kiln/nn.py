"""Modules and losses for traced models, Kiln's C++ ``nn`` (frontend/nn.h) from Python.

    t = kiln.Tracer("mlp")
    s = kiln.nn.Scope(t, seed=0)
    x = t.input("x", kiln.f32[64, 784])
    model = kiln.nn.Sequential(kiln.nn.Linear(s.sub("fc1"), 784, 256), kiln.nn.relu,
                               kiln.nn.Linear(s.sub("fc2"), 256, 10))
    logits = model(x)

Parameters are the tracer's state inputs named by the scope ("fc1.weight", ...), initialised
as PyTorch does from the scope's seed (the same values as the C++ modules with that seed).
"""

from __future__ import annotations

from . import _kiln as _native  # the extension module (kiln/__init__.py finds it)

_nn = _native._nn

Scope = _nn.Scope
Linear = _nn.Linear
Conv2d = _nn.Conv2d
MaxPool2d = _nn.MaxPool2d
AvgPool2d = _nn.AvgPool2d
Flatten = _nn.Flatten
BatchNorm = _nn.BatchNorm
LayerNorm = _nn.LayerNorm
Dropout = _nn.Dropout
cross_entropy = _nn.cross_entropy
mse = _nn.mse
accuracy = _nn.accuracy
relu = _native.relu
sigmoid = _native.sigmoid
tanh = _native.tanh

__all__ = ["AvgPool2d", "BatchNorm", "Conv2d", "Dropout", "Flatten", "LayerNorm", "Linear", "MaxPool2d",
           "Scope", "Sequential", "accuracy", "cross_entropy", "mse", "relu", "sigmoid", "tanh"]


class Sequential:
    """Calls each layer (a module or any function of one kiln.Sym) on the output of the one before."""

    def __init__(self, *layers):
        self.layers = list(layers)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __len__(self):
        return len(self.layers)

    def __getitem__(self, i):
        return self.layers[i]
