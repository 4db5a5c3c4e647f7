"""kiln.Trainer: the C++ Trainer from Python, over NumPy datasets."""
import numpy as np
import pytest

import kiln


def mlp(seed=0):
    t = kiln.Tracer("mlp")
    s = kiln.nn.Scope(t, seed=seed)
    x = t.input("x", kiln.f32[16, 8])
    y = t.input("y", kiln.i32[16])
    logits = kiln.nn.Sequential(kiln.nn.Linear(s.sub("fc1"), 8, 16), kiln.nn.relu,
                                kiln.nn.Linear(s.sub("fc2"), 16, 3))(x)
    t.output("loss", kiln.nn.cross_entropy(logits, y))
    t.output("accuracy", kiln.nn.accuracy(logits, y))
    return t.finish()


def data(n=96, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 1).astype(np.int32)
    return {"x": x, "y": y}


def test_fit_learns_and_reports_history():
    tr = kiln.Trainer(mlp(), optimizer=kiln.optim.SGD(lr=0.1, momentum=0.9), batch=16)
    seen = []

    class Count:
        def on_step(self, info):
            seen.append(info["global_step"])

    hist = tr.fit(data(), data(48, seed=2), epochs=5, callbacks=[Count()])
    assert len(hist) == 5 and hist == tr.history
    assert hist[-1]["train_loss"] < hist[0]["train_loss"]
    assert hist[-1]["test_accuracy"] is not None
    assert seen == list(range(1, 31))  # 96 / 16 = 6 steps an epoch
    assert tr.global_step == 30 and tr.epoch == 5
    ev = tr.evaluate(data(48, seed=2))
    assert ev["samples"] == 48 and 0 <= ev["accuracy"] <= 1


def test_same_results_as_a_second_run():
    a = kiln.Trainer(mlp(), batch=16, data_seed=7)
    b = kiln.Trainer(mlp(), batch=16, data_seed=7)
    ha = a.fit(data(), epochs=2)
    hb = b.fit(data(), epochs=2)
    assert [h["train_loss"] for h in ha] == [h["train_loss"] for h in hb]
    for k, v in a.state.items():
        assert v.tobytes() == b.state[k].tobytes(), k


def test_checkpoint_and_resume(tmp_path):
    ref = kiln.Trainer(mlp(), batch=16)
    ref.fit(data(), epochs=3)
    with kiln.Trainer(mlp(), batch=16, checkpoint_dir=tmp_path) as first:
        first.fit(data(), epochs=2)
    with pytest.raises(AttributeError):
        first.fit(data(), epochs=1)  # closed
    again = kiln.Trainer(mlp(), batch=16, checkpoint_dir=tmp_path)
    assert again.resume() is not None
    assert again.epoch == 2
    assert len(again.fit(data(), epochs=3)) == 1  # up to 3 epochs in all
    for k, v in ref.state.items():
        assert v.tobytes() == again.state[k].tobytes(), k


def test_progress_bar_and_bad_data(capsys):
    tr = kiln.Trainer(mlp(), batch=16)
    tr.fit(data(), epochs=1, progress=True)
    assert "epoch 1" in capsys.readouterr().err
    with pytest.raises(kiln.Error):
        tr.fit({"x": np.zeros((5, 8), np.float32), "y": np.zeros(4, np.int32)}, epochs=1)
    with pytest.raises(kiln.Error):
        kiln.Trainer(mlp(), schedule="sometimes")


def test_callback_exception_stops_training():
    tr = kiln.Trainer(mlp(), batch=16)

    def boom(info):
        if info["global_step"] == 3:
            raise ValueError("stop here")

    class C:
        on_step = staticmethod(boom)

    with pytest.raises(ValueError, match="stop here"):
        tr.fit(data(), epochs=2, callbacks=[C()])


def test_ctrl_c_interrupts_a_long_fit():
    import os
    import signal
    import threading

    tr = kiln.Trainer(mlp(), batch=16)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            tr.fit(data(), epochs=100000)  # hours, unless interrupted
    finally:
        timer.cancel()
    assert 0 < tr.global_step < 600000
