"""kiln.Trainer: epochs of compiled training steps over NumPy datasets, Kiln's C++ Trainer
(train/trainer.h) from Python: the same data order, schedules, checkpoints and results."""

from __future__ import annotations

import sys
import time

from . import _kiln


class _Progress:
    """One line per epoch that fills as the steps go: tqdm's bar when tqdm is installed,
    a plain one otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.epoch = None
        self.last = 0.0
        try:
            import tqdm  # noqa: F401
            self.tqdm = tqdm.tqdm
        except ImportError:
            self.tqdm = None

    def step(self, info: dict):
        if not self.enabled:
            return
        if info["epoch"] != self.epoch:
            self.close()
            self.epoch = info["epoch"]
            if self.tqdm is not None:
                self.bar = self.tqdm(total=info["batches"], desc=f"epoch {self.epoch + 1}", leave=True)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{info['loss']:.4f}", refresh=False)
            return
        now = time.monotonic()
        done = info["batch_index"] + 1
        if now - self.last < 0.1 and done < info["batches"]:
            return
        self.last = now
        width = 30
        filled = width * done // max(info["batches"], 1)
        sys.stderr.write(f"\repoch {self.epoch + 1} [{'#' * filled}{'.' * (width - filled)}] "
                         f"{done}/{info['batches']} loss {info['loss']:.4f}")
        sys.stderr.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.enabled and self.epoch is not None:
            sys.stderr.write("\n")
        self.epoch = None


class Trainer:
    """Trains a model graph (one with a float scalar loss output, e.g. traced with
    kiln.nn.cross_entropy) with a compiled training step.

    model: a kiln.Graph whose state is its parameters (a traced or imported model);
    eval_model: the graph evaluate() runs (default: the model); optimizer: kiln.optim.SGD,
    Adam or AdamW; batch, shuffle, data_seed, drop_last: the batches of an epoch (the order
    of the C++ Trainer and `kiln train`); schedule: 'constant', 'step:EPOCHS[:GAMMA]' or
    'cosine[:MIN_LR]' (as `kiln train --schedule`);
    checkpoint_dir: a checkpoint (safetensors, the CLI's files) after every epoch and every
    checkpoint_every_steps steps, resume() picks up the latest; target: 'cpu' or 'cuda';
    threads: the most CPU threads a step uses (0: every thread of the process's pool; see
    kiln.compile); distributed: data-parallel over the ranks of an mpirun job (starts MPI;
    batch is then the global batch; kiln.distributed, docs/distributed.md). Datasets are dicts of arrays by input name, sharing their leading dimension.
    """

    def __init__(self, model, *, eval_model=None, optimizer=None, batch: int = 64, shuffle: bool = True,
                 data_seed: int = 0, drop_last: bool = False, schedule: str = "", eval_batch: int = 1000,
                 loss: str = "loss", accuracy: str = "accuracy", target: str = "", epochs: int = 0,
                 checkpoint_dir: str = "", checkpoint_every_steps: int = 0, checkpoint_keep: int = 3,
                 stop_on_nonfinite: bool = True, threads: int = 0, distributed: bool = False):
        if optimizer is None:
            optimizer = _kiln.SGD(lr=0.05, momentum=0.9)
        self._distributed = distributed
        if distributed:
            _kiln._mpi_init()
        self._native = self._guarded(_kiln._Trainer, model, optimizer, batch, drop_last, shuffle, data_seed,
                                     schedule, eval_batch, loss, accuracy, target, eval_model, epochs,
                                     str(checkpoint_dir), checkpoint_every_steps, checkpoint_keep,
                                     stop_on_nonfinite, threads, distributed)

    def _guarded(self, f, *args):
        """f(*args); in a distributed run a failure on this rank ends every rank of the job
        (kiln.distributed.abort), which would otherwise wait for this one in their next
        collective until KILN_DIST_TIMEOUT."""
        if not self._distributed:
            return f(*args)
        try:
            return f(*args)
        except BaseException as e:  # noqa: BLE001 (KeyboardInterrupt too: the job ends)
            _kiln._mpi_abort(f"{type(e).__name__}: {e}")
            raise

    def close(self):
        """Releases the compiled steps and the checkpoint folder's lock (another Trainer may
        then write it); the Trainer is unusable after. `with kiln.Trainer(...) as tr:` closes
        it at the block's end."""
        self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def fit(self, train: dict, test: dict | None = None, epochs: int = 1, callbacks=(), progress: bool = False):
        """Trains until `epochs` epochs are done in all (a resumed trainer goes on from its
        epoch), evaluating on `test` after each when given; returns the metrics of the
        epochs it ran, a list of dicts (train_loss, train_accuracy, test_loss, ...).
        callbacks: objects with on_step(info) and/or on_epoch(metrics), or plain functions
        (called after every epoch). progress: a progress bar on stderr."""
        bar = _Progress(progress)
        steps = [getattr(c, "on_step") for c in callbacks if hasattr(c, "on_step")]
        epochs_cb = [c.on_epoch if hasattr(c, "on_epoch") else c for c in callbacks
                     if hasattr(c, "on_epoch") or (callable(c) and not hasattr(c, "on_step"))]

        def on_step(info):
            bar.step(info)
            for f in steps:
                f(info)

        def on_epoch(metrics):
            bar.close()
            for f in epochs_cb:
                f(metrics)

        try:
            return self._guarded(self._native.fit, train, test, epochs, on_step, on_epoch)
        finally:
            bar.close()

    def train_epoch(self, data: dict, on_step=None) -> dict:
        """One epoch over `data`; its metrics."""
        return self._guarded(self._native.train_epoch, data, on_step)

    def evaluate(self, data: dict) -> dict:
        """The eval model over `data`: example-weighted loss and accuracy."""
        return self._guarded(self._native.evaluate, data)

    def train_batch(self, batch: dict) -> dict:
        """One step on one batch; the step's outputs (loss, ...)."""
        return self._guarded(self._native.train_batch, batch)

    @property
    def history(self) -> list:
        """Every epoch's metrics so far, as dicts."""
        return self._native.history

    @property
    def epoch(self) -> int:
        return self._native.epoch

    @property
    def global_step(self) -> int:
        return self._native.global_step

    @property
    def state(self) -> dict:
        """Copies of every state tensor (parameters, optimizer state) by name."""
        return self._native.state()

    @state.setter
    def state(self, values: dict):
        self._native.set_state(values)

    def save_checkpoint(self, path):
        self._guarded(self._native.save_checkpoint, str(path))

    def load_checkpoint(self, path):
        self._guarded(self._native.load_checkpoint, str(path))

    def resume(self):
        """Loads the latest checkpoint of checkpoint_dir, if any; its path, or None."""
        return self._guarded(self._native.resume)

    @property
    def step_executable(self):
        return self._native.step_executable

    @property
    def eval_executable(self):
        return self._native.eval_executable
