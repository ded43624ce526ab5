"""What a rank loads before its data: the numba kernels its role calls, and the parsers
when it reads a file; nothing else. A rank spends most of its start-up importing numpy,
mpi4py and numba and loading numba's cache, so each role loads only its own kernels,
and one rank per node loads them first (a cold cache is compiled once, not N times).

    role            kernels (net.mlp.compile_kernels)             data
    worker          step (+ onebit)                               parsers (file), shares (embedded)
    server          aggregate, its optimizer (+ onebit);          parsers (file)
                    rank 0 evaluate
    peer (p2p)      a worker's and a server's; rank 0 evaluate    parsers (file), shares (embedded)
    (--model-parallel: mp_step, a slice's step, in place of step)
    allreduce rank  step, aggregate, its optimizer; rank 0 eval.  parsers (file), shares (embedded)
    (+ onebit: with --compress 1bit)

calibrate's start-up probes call the same functions, so the model measures what a run
pays.
"""

from __future__ import annotations

import contextlib
import sys

from mpi4py import MPI

from ..data import shares
from ..mpiutil import Waiter, once_per_node
from ..net import mlp

# what every rank of asgd.train imports (calibrate times it; a test keeps it true)
RANK_MODULES = ("numpy", "mpi4py.MPI", "asgd.core.wire", "asgd.mpiutil", "asgd.data.shares", "asgd.data.standardize",
                "asgd.net.mlp", "asgd.net.optimizers", "asgd.protocol.allreduce", "asgd.protocol.context",
                "asgd.protocol.messages", "asgd.protocol.onebit", "asgd.protocol.p2p", "asgd.protocol.replica",
                "asgd.protocol.server", "asgd.protocol.worker", "asgd.run.checkpoint", "asgd.run.config",
                "asgd.run.folder", "asgd.run.job", "asgd.run.results", "asgd.run.roles", "asgd.run.signals",
                "asgd.run.startup", "asgd.run.progress", "asgd.core.topology", "asgd.run.trace")


def loads(role: str, rank: int, reads_file: bool, allreduce: bool = False,
          optimizer: str = "sgd", compress: bool = False, model_parallel: bool = False) -> tuple[str, ...]:
    """The kernel uses of a rank (see the table above), plus 'parsers' or 'shares'.
    model_parallel: a worker's step is its slice's (mp_step)."""
    update = f"update:{optimizer}"
    step = "mp_step" if model_parallel else "step"
    if allreduce:
        uses = (step, "aggregate", update)
    else:
        uses = {"worker": (step,), "server": ("aggregate", update), "peer": (step, "aggregate", update)}[role]
        if compress:
            uses += ("onebit",)
    if rank == 0:
        uses += ("evaluate",)
    if reads_file:
        uses += ("parsers",)
    elif role in ("worker", "peer"):
        uses += ("shares",)  # the embedded problem: assign's permutation kernel
    return uses


def node_loads(reads_file: bool, allreduce: bool = False, optimizer: str = "sgd",
               compress: bool = False, model_parallel: bool = False) -> tuple[str, ...]:
    """Every rank's loads together: what a node's first rank compiles when the cache is cold."""
    return tuple(dict.fromkeys(u for role in ("server", "worker") for rank in (0, 1)
                               for u in loads(role, rank, reads_file, allreduce, optimizer, compress,
                                              model_parallel)))


def load(uses: tuple[str, ...], dtype="float64") -> None:
    """Compile or cache-load the kernels of `uses` for w of `dtype` (this rank only)."""
    with _no_blas_probe():
        _load(uses, dtype)


@contextlib.contextmanager
def _no_blas_probe():
    """numba's first compile or cache load imports its array-math module, which looks
    for a BLAS by importing scipy.linalg: 0.7 s of CPU per rank where SciPy is installed
    (more than all of a rank's other imports), for np.vdot and np.inner, which asgd's
    kernels do not call. While that module loads, scipy.linalg is absent."""
    if "scipy.linalg" in sys.modules or "numba.np.arraymath" in sys.modules:
        yield
        return
    sys.modules["scipy.linalg"] = None   # its import raises ImportError: numba's probe says no BLAS
    try:
        yield
    finally:
        if sys.modules.get("scipy.linalg", 0) is None:
            del sys.modules["scipy.linalg"]


def _load(uses: tuple[str, ...], dtype) -> None:
    mlp.compile_kernels(*(u for u in uses if u in mlp.KERNEL_USES), dtype=dtype)
    if "parsers" in uses:
        from ..data import parse   # the parsers' module: only a rank that reads a file imports it
        parse.compile_parsers()
    if "parsers" in uses or "shares" in uses:
        shares.assign(3, 0, 1, 1, False)


def warm_up(comm: MPI.Comm, waiter: Waiter, uses: tuple[str, ...], node_uses: tuple[str, ...],
            dtype="float64") -> Exception | None:
    """The node's first rank loads `node_uses` (every use of any rank on the node, so a
    cold cache is compiled there, once), then the node's other ranks their own `uses`,
    for w of `dtype` (--precision). Returns this rank's exception, if any, for the
    caller's next agreement."""
    return once_per_node(comm, waiter, lambda first: load(node_uses if first else uses, dtype),
                         "load the numba kernels")
