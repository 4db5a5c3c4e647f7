"""DLPack with PyTorch (only where torch is installed: it is never a test dependency)."""
import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the DLPack interop test is skipped")


def test_torch_tensors_in_and_out_without_copies(mlp_text):
    g = kiln.parse(mlp_text)
    g.state = {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)}
    exe = kiln.compile(g)
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    t = torch.zeros(4, 2)
    assert kiln._kiln._data_pointer(x) == x.data_ptr()  # read in place through __dlpack__
    out = exe(x=x, t=t)
    y = torch.from_dlpack(out["y"])
    assert y.data_ptr() == out["y"].ctypes.data  # no copy out either
    torch.testing.assert_close(y, x @ torch.ones(3, 2))
    with pytest.raises(kiln.Error, match="C-contiguous"):
        exe(x=torch.zeros(3, 4).T, t=t)


def test_from_torch_matches_pytorch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()
    x = torch.randn(4, 3, 16, 16)
    g = kiln.from_torch(model, x)
    assert list(g.inputs) == ["x0"] and list(g.outputs) == ["y0"]
    exe = kiln.compile(g)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(exe(x0=x)["y0"], want, rtol=1e-4, atol=1e-5)
    # another batch size
    x2 = torch.randn(7, 3, 16, 16)
    with torch.no_grad():
        np.testing.assert_allclose(exe(x0=x2)["y0"], model(x2).numpy(), rtol=1e-4, atol=1e-5)
