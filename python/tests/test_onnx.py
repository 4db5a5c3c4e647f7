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


def test_compile_aot_writes_what_kiln_compile_writes(lenet, tmp_path):
    cli = os.environ.get("KILN_CLI")
    g = kiln.import_onnx(lenet)
    r = kiln.compile_aot(g, str(tmp_path / "py.o"), header=str(tmp_path / "py.h"), name="lenet")
    assert r["name"] == "lenet" and len(r["files"]) == 2
    header = (tmp_path / "py.h").read_text()
    assert "lenet_create" in header and "lenet_run" in header
    if cli:
        subprocess.run([cli, "compile", str(lenet), "-o", str(tmp_path / "cli.o"), "--header",
                        str(tmp_path / "cli.h"), "--name", "lenet"], check=True, capture_output=True)
        assert (tmp_path / "cli.o").read_bytes() == (tmp_path / "py.o").read_bytes()
        assert (tmp_path / "cli.h").read_text() == header.replace("py.h", "cli.h").replace("PY_H", "CLI_H")
    with pytest.raises(kiln.Error):
        kiln.compile_aot(g, str(tmp_path / "x.o"), name="not an identifier")
    # weights in a file, and an executable's current state as the object's
    exe = kiln.compile(g)
    exe.state["_0.bias"] = np.ones(4, np.float32)
    r = exe.write_object(str(tmp_path / "trained.o"), weights="file")
    weights = kiln.load_weights(str(tmp_path / "trained.safetensors"))
    np.testing.assert_array_equal(weights["_0.bias"], np.ones(4, np.float32))


def test_weights_roundtrip(tmp_path):
    w = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array([1, 2], np.int64)}
    kiln.save_weights(str(tmp_path / "w.safetensors"), w)
    back = kiln.load_weights(str(tmp_path / "w.safetensors"))
    assert set(back) == {"a", "n"}
    for k in w:
        assert back[k].dtype == w[k].dtype and back[k].tobytes() == w[k].tobytes()
    with pytest.raises(kiln.Error, match="nope"):
        kiln.load_weights(str(tmp_path / "nope.safetensors"))
