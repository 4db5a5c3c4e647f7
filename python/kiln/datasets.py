"""Data sets Kiln reads natively: Fashion-MNIST from its IDX files (the Debian package
dataset-fashion-mnist installs them in /usr/share/datasets/fashion-mnist)."""

from __future__ import annotations

from . import _kiln


def fashion_mnist(split: str = "train", dir: str = "", flat: bool = True) -> dict:
    """Fashion-MNIST's "train" (60,000) or "test" (10,000) split as {"x": f32 images scaled to
    [0, 1], [N, 784] (flat) or [N, 1, 28, 28], "y": i32 labels [N]}; dir defaults to
    $KILN_FASHION_MNIST_DIR, else /usr/share/datasets/fashion-mnist. kiln.Error names a missing file."""
    return _kiln._fashion_mnist(split, dir, flat)


def fashion_mnist_classes() -> list:
    """The ten class names, by label."""
    return _kiln._fashion_mnist_classes()
