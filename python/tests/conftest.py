import os
import pathlib

import pytest

SOURCE = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture
def source_dir():
    return SOURCE


MLP_KIR = """graph @mlp(%x: f32[4,3], state %w: f32[3,2], state %b: f32[2], %t: f32[4,2]) {
  %h = matmul(%x, %w) : f32[4,2]
  %y = add(%h, %b) : f32[4,2]
  %d = sub(%y, %t) : f32[4,2]
  %s = mul(%d, %d) : f32[4,2]
  %l = mean(%s) {axes=[]} : f32[]
  return y = %y, loss = %l
}
"""


@pytest.fixture
def mlp_text():
    return MLP_KIR
