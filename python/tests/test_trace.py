"""Tracing from Python: the C++ tracer's ops and modules, errors naming the Python line."""
import numpy as np
import pytest

import kiln


def test_trace_mlp_and_run():
    t = kiln.Tracer("mlp")
    x = t.input("x", kiln.f32[4, 3])
    w = t.parameter("w", np.full((3, 2), 0.5, np.float32))
    b = t.parameter("b", np.array([1.0, -1.0], np.float32))
    y = kiln.relu(x @ w + b)
    assert isinstance(y, kiln.Sym) and y.shape == (4, 2) and y.dtype == "f32"
    t.output("y", 2.0 * y - 1)
    g = t.finish()
    assert set(g.state) == {"w", "b"}
    xs = np.arange(12, dtype=np.float32).reshape(4, 3) - 6
    out = kiln.compile(g)(x=xs)["y"]
    np.testing.assert_allclose(out, 2 * np.maximum(xs @ np.full((3, 2), 0.5) + [1, -1], 0) - 1, rtol=1e-6)


def test_parameters_are_copies():
    t = kiln.Tracer()
    init = np.zeros(3, np.float32)
    t.parameter("p", init)
    init[0] = 7
    assert t.parameters["p"][0] == 0


def test_shape_error_names_the_python_line():
    t = kiln.Tracer()
    a = t.input("a", kiln.f32[2, 3])
    b = t.input("b", kiln.f32[4, 5])
    with pytest.raises(kiln.Error) as e:
        a @ b  # the offending line
    assert "test_trace.py:" in str(e.value)
    line = int(str(e.value).split("test_trace.py:")[1].split(")")[0])
    src = open(__file__).read().splitlines()[line - 1]
    assert "the offending line" in src
    with pytest.raises(kiln.Error, match="test_trace.py"):
        kiln.reshape(a, [7])


def test_type_spellings():
    t = kiln.Tracer()
    x = t.input("x", "f32[2,3]")
    assert x.type == kiln.f32[2, 3]
    assert str(kiln.i64[5]) == "i64[5]"
    with pytest.raises(kiln.Error, match="dtype"):
        t.input("y", kiln.TensorType("f16", [2]))
    with pytest.raises(kiln.Error):
        t.input("z", 3)


def test_scalars_take_the_other_operands_dtype():
    t = kiln.Tracer()
    x = t.input("x", kiln.f64[3])
    assert (x + 1).dtype == "f64"
    assert (1.5 * x).dtype == "f64"
    i = t.input("i", kiln.i32[3])
    with pytest.raises(kiln.Error):
        i + 0.5  # an i32 cannot hold 0.5


def test_nn_lenet_trains_with_the_cpp_modules():
    t = kiln.Tracer("lenet")
    s = kiln.nn.Scope(t, seed=3)
    x = t.input("x", kiln.f32[8, 1, 28, 28])
    labels = t.input("labels", kiln.i32[8])
    model = kiln.nn.Sequential(
        kiln.nn.Conv2d(s.sub("c1"), 1, 4, 5, padding=2), kiln.nn.relu, kiln.nn.MaxPool2d(2),
        kiln.nn.Conv2d(s.sub("c2"), 4, 8, 5), kiln.nn.relu, kiln.nn.MaxPool2d(2),
        kiln.nn.Flatten(), kiln.nn.Linear(s.sub("fc"), 200, 10))
    logits = model(x)
    assert logits.shape == (8, 10)
    t.output("loss", kiln.nn.cross_entropy(logits, labels))
    t.output("accuracy", kiln.nn.accuracy(logits, labels))
    g = t.finish()
    assert {"c1.weight", "c1.bias", "c2.weight", "fc.weight"} <= set(g.state)
    exe = kiln.compile(kiln.train_step(g, kiln.optim.SGD(lr=0.05, momentum=0.9)))
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((8, 1, 28, 28)).astype(np.float32)
    ys = rng.integers(0, 10, 8).astype(np.int32)
    losses = [float(exe(x=xs, labels=ys)["loss"]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0], losses


def test_more_builders():
    t = kiln.Tracer()
    x = t.input("x", kiln.f32[2, 4])
    t.output("s", kiln.sum(x, [1]))
    t.output("m", kiln.mean(x, keepdims=True))
    t.output("sm", kiln.softmax(x))
    t.output("tr", kiln.transpose(x))
    t.output("c", kiln.concat([x, x], 0))
    t.output("sl", kiln.slice(x, [0, 1], [2, 3]))
    t.output("am", kiln.argmax(x))
    t.output("sel", kiln.select(x > 0, x, 0.0))
    g = t.finish()
    xs = np.array([[1, -2, 3, -4], [5, 6, -7, 8]], np.float32)
    out = kiln.compile(g)(x=xs)
    ref = kiln.interpret(g, {"x": xs})
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-6)
    np.testing.assert_array_equal(out["am"], [2, 3])
    np.testing.assert_array_equal(out["sel"], np.where(xs > 0, xs, 0))


def test_sym_keeps_its_tracer_alive():
    def make():
        t = kiln.Tracer()
        return t.input("x", kiln.f32[2]) * 2

    y = make()  # the tracer is gone from Python's view, the Sym still works
    assert (y + 1).shape == (2,)


def test_bool_and_integer_inputs_in_place():
    t = kiln.Tracer()
    c = t.input("c", kiln.boolean[4])
    i = t.input("i", kiln.i64[4])
    t.output("y", kiln.select(c, i, i * 2))
    exe = kiln.compile(t.finish())
    c_in = np.array([True, False, True, False])
    i_in = np.array([1, 2, 3, 2**40], np.int64)
    assert kiln._kiln._data_pointer(c_in) == c_in.ctypes.data
    y = exe(c=c_in, i=i_in)["y"]
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, np.where(c_in, i_in, i_in * 2))
