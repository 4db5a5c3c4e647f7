"""ONNX import from Python, and results bit for bit those of the C++ library (the kiln CLI)."""
import os
import subprocess

import numpy as np
import pytest

import kiln


@pytest.fixture
def lenet(source_dir):
    return source_dir / "tests" / "data" / "onnx" / "lenet.onnx"


def test_import_path_bytes_and_batch(lenet):
    g = kiln.import_onnx(lenet)
    assert g.inputs == {"x": "f32[1,1,28,28]"}
    assert "_0.weight" in g.state and g.state["_0.weight"].shape == (4, 1, 5, 5)
    same = kiln.import_onnx(lenet.read_bytes())
    assert str(same) == str(g)
    assert kiln.import_onnx(str(lenet), batch=8).inputs == {"x": "f32[8,1,28,28]"}
    assert str(kiln.load(lenet)) == str(g)


def test_import_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(kiln.Error):
        kiln.import_onnx(bad)
    with pytest.raises(kiln.Error):
        kiln.import_onnx(b"\x00\x01garbage")


def test_run_matches_the_cli_bit_for_bit(lenet, tmp_path):
    cli = os.environ.get("KILN_CLI")
    if not cli:
        pytest.skip("KILN_CLI (the kiln command of this build) is not set")
    x = np.random.default_rng(5).standard_normal((4, 1, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out_dir = tmp_path / "out"
    subprocess.run([cli, "run", str(lenet), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(out_dir)],
                   check=True, capture_output=True)
    exe = kiln.compile(kiln.import_onnx(lenet))
    got = exe(x=x)  # another batch size than the import's: a sibling executable
    for name, value in got.items():
        want = np.load(out_dir / f"{name}.npy")
        assert value.shape == want.shape
        assert value.tobytes() == want.tobytes(), name
    ref = kiln.interpret(kiln.import_onnx(lenet, batch=4), {"x": x})
    for name, value in got.items():
        np.testing.assert_allclose(value, ref[name], rtol=1e-5, atol=1e-5)
