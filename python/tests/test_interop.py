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
