"""examples/python and the README's Python snippets, run as a user would."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

import kiln

SOURCE = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
EXAMPLES = SOURCE / "examples" / "python"


def have_fashion_mnist():
    try:
        kiln.datasets.fashion_mnist("test")
        return True
    except kiln.Error:
        return False


def run(*args, cwd=None):
    done = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


needs_data = pytest.mark.skipif(not have_fashion_mnist(),
                                reason="no Fashion-MNIST here (apt-get install dataset-fashion-mnist)")


@needs_data
def test_mlp_example():
    out = run(EXAMPLES / "mlp.py", "--epochs", "1", "--train-limit", "2000")
    assert "epoch 1:" in out and out.count("predicted") == 8


@needs_data
def test_lenet_example_trains_resumes_and_writes_an_object(tmp_path):
    out = run(EXAMPLES / "lenet.py", "--epochs", "1", "--train-limit", "640", "--out", tmp_path / "run")
    assert "epoch 1:" in out and (tmp_path / "run" / "lenet.o").exists()
    again = run(EXAMPLES / "lenet.py", "--epochs", "1", "--train-limit", "640", "--out", tmp_path / "run")
    assert "resumed at epoch 1" in again


def test_classify_onnx_example():
    out = run(EXAMPLES / "classify_onnx.py", SOURCE / "tests" / "data" / "onnx" / "lenet.onnx")
    assert out.count("image ") == 4


def test_readme_python_blocks_run(tmp_path):
    text = (SOURCE / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks, "README.md has no python block"
    for block in blocks:
        script = tmp_path / "snippet.py"
        script.write_text(block)
        run(script, cwd=SOURCE)
