"""Graphs from Python: parse, load, print, dot, grad, train_step, optimize, interpret."""
import numpy as np
import pytest

import kiln


def test_parse_print_roundtrip(mlp_text):
    g = kiln.parse(mlp_text)
    assert g.name == "mlp"
    assert list(g.inputs) == ["x", "t"]
    assert g.inputs["x"] == "f32[4,3]"
    assert list(g.state_inputs) == ["w", "b"]
    assert list(g.outputs) == ["y", "loss"]
    text = str(g)
    assert text == g.text()
    assert str(kiln.parse(text)) == text  # canonical text parses back to itself
    assert "matmul" in g.dot()
    assert repr(g).startswith("<kiln.Graph @mlp")


def test_load_kir_file(tmp_path, mlp_text):
    p = tmp_path / "m.kir"
    p.write_text(mlp_text)
    assert str(kiln.load(p)) == str(kiln.parse(mlp_text))


def test_parse_error_is_kiln_error_with_location():
    with pytest.raises(kiln.Error) as e:
        kiln.parse("graph @g(%x: f32[2]) {\n  %y = nosuchop(%x)\n  return y = %y\n}\n", "bad.kir")
    assert "bad.kir:2" in str(e.value)
    assert isinstance(e.value, Exception)


def test_missing_file_is_kiln_error(tmp_path):
    with pytest.raises(kiln.Error, match="nope.kir"):
        kiln.load(tmp_path / "nope.kir")


def test_interpret_uses_graph_state(mlp_text):
    g = kiln.parse(mlp_text)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    w = np.ones((3, 2), np.float32)
    b = np.array([1, 2], np.float32)
    t = np.zeros((4, 2), np.float32)
    g.state = {"w": w, "b": b}
    out = kiln.interpret(g, {"x": x, "t": t})
    np.testing.assert_array_equal(out["y"], x @ w + b)
    assert out["loss"].shape == ()
    st = g.state
    assert set(st) == {"w", "b"}
    assert not st["w"].flags.writeable  # the graph's own values are never written through


def test_grad_matches_numpy(mlp_text):
    g = kiln.parse(mlp_text)
    gg = kiln.grad(g, "loss", ["w", "b"])
    assert "grad.w" in gg.outputs and "grad.b" in gg.outputs
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    t = rng.standard_normal((4, 2)).astype(np.float32)
    out = kiln.interpret(gg, {"x": x, "t": t, "w": w, "b": b})
    d = (x @ w + b - t) * (2.0 / 8)
    np.testing.assert_allclose(out["grad.w"], x.T @ d, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["grad.b"], d.sum(0), rtol=1e-5, atol=1e-6)
    # wrt defaults to every float state input
    assert set(o for o in kiln.grad(g).outputs if o.startswith("grad.")) == {"grad.w", "grad.b"}


def test_train_step_graph_has_optimizer_state(mlp_text):
    g = kiln.parse(mlp_text)
    g.state = {"w": np.zeros((3, 2), np.float32), "b": np.zeros(2, np.float32)}
    step = kiln.train_step(g, kiln.optim.SGD(lr=0.1, momentum=0.9))
    assert "sgd.momentum.w" in step.state_inputs
    assert "w.next" in step.outputs
    st = step.state
    assert st["lr"] == np.float32(0.1)
    assert int(st["step"]) == 0
    adam = kiln.train_step(g, kiln.optim.Adam(lr=1e-3))
    assert "adam.m.w" in adam.state_inputs
    with pytest.raises(kiln.Error):
        kiln.train_step(g, kiln.SGD(lr=-1.0))


def test_optimize_and_passes(mlp_text, capsys):
    g = kiln.parse(mlp_text)
    names = kiln.passes()
    assert "simplify" in names and "fuse_elementwise" in names
    opt = kiln.optimize(g)
    assert opt.num_nodes <= g.num_nodes
    kiln.optimize(g, print_after_all=True)
    assert "graph @mlp" in capsys.readouterr().out
    with pytest.raises(kiln.Error, match="nosuchpass"):
        kiln.optimize(g, passes=["nosuchpass"])


def test_repr_svg_without_or_with_graphviz(mlp_text):
    g = kiln.parse(mlp_text)
    svg = g._repr_svg_()
    assert svg is None or "<svg" in svg


def test_error_classes_carry_where():
    with pytest.raises(kiln.ParseError) as e:
        kiln.parse("graph @g(%x: f32[2]) {\n  %y = nosuchop(%x)\n  return y = %y\n}\n", "bad.kir")
    assert e.value.file == "bad.kir" and e.value.line == 2 and e.value.column > 1
    assert isinstance(e.value, kiln.Error)
    t = kiln.Tracer()
    a = t.input("a", kiln.f32[2, 3])
    with pytest.raises(kiln.ShapeError) as e:
        kiln.matmul(a, a)
    assert e.value.location.startswith(__file__) or "test_graphs.py:" in e.value.location
    assert isinstance(e.value, kiln.Error)
    for cls in (kiln.ParseError, kiln.ShapeError, kiln.VerifyError):
        assert issubclass(cls, kiln.Error) and cls.__doc__
