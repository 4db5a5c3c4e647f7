"""Data-parallel training over MPI (docs/distributed.md): run the same script as N processes
with ``mpirun -np N python train.py`` (``srun`` under Slurm) and give ``kiln.Trainer``
``distributed=True``. Every rank then trains on its share of each global batch, the
gradients are summed over the ranks inside the compiled step (the same bits on every rank),
and rank 0 writes the checkpoints::

    import kiln, kiln.distributed as dist
    tr = kiln.Trainer(model, batch=256, distributed=True)   # 256: the global batch
    tr.fit(train, test, epochs=3)
    if dist.rank() == 0:
        print(tr.history[-1])
"""
from . import _kiln


def launched_by_mpi() -> bool:
    """Whether this process is one of several ranks started by mpirun / mpiexec / srun
    (read from the environment; MPI is not started by asking)."""
    return _kiln._launched_by_mpi()


def init() -> tuple[int, int]:
    """Starts MPI for this process (once; kiln.Trainer(distributed=True) calls it) and
    returns (rank, size). A process that was not started by mpirun is a job of one rank."""
    return _kiln._mpi_init()


def rank() -> int:
    """This process's rank (0 before init() and in a single process)."""
    c = _kiln._collective()
    return c[0] if c else 0


def size() -> int:
    """The number of ranks (1 before init() and in a single process)."""
    c = _kiln._collective()
    return c[1] if c else 1


def overlap() -> bool:
    """Whether the compiled steps' sums run on the runtime's communication thread while the
    backward pass goes on (``KILN_DIST_OVERLAP``: ``1``, ``0``, or ``auto``, the default: on
    where each rank has a core to spare for that thread). False before init() and in a
    single process."""
    c = _kiln._collective()
    return bool(c[2]) if c else False


def abort(message: str):
    """Ends every rank of the job at once, printing ``kiln: rank R: message`` (a rank that
    fails alone would otherwise leave the others waiting in their next collective until
    KILN_DIST_TIMEOUT)."""
    _kiln._mpi_abort(message)
