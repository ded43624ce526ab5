"""What every part of a run shares: the Job (its options, communicator, shape, run folder,
waiting and clocks, the bytes it counted) and the Model init made (this rank's data,
the weights, where training starts)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..data.formats import Dataset
from ..mpiutil import Waiter
from ..net import mlp
from ..protocol.context import Endpoint
from . import signals
from .config import Config
from .progress import EpochTracker
from ..core.topology import Topology
from .trace import PhaseClock


@dataclass
class Job:
    """The run's shape and this rank's means, the same kind on every rank."""
    cfg: Config
    comm: MPI.Comm
    topo: Topology | None  # set by init, once the model's size is known
    servers: int           # ranks 0..servers-1 only serve (0: p2p and allreduce, every rank a worker)
    out: str               # the run folder
    waiter: Waiter
    clock: PhaseClock
    crowded: float         # ranks per core on this node where they outnumber the cores, else 0.0
    tracker: EpochTracker | None = None  # rank 0's epochs and progress, once the loop starts
    traffic: dict = field(default_factory=lambda: {k: {"sent": 0, "recv": 0} for k in ("init", "train", "finish")})
                           # bytes of asgd's own messages by part of the run (results.json's per-rank `bytes`)
    replica_comm: MPI.Comm | None = None  # --model-parallel: my replica's members (train.split_replicas)
    hosts: list = field(default_factory=list)   # every rank's hostname (init's agreement)
    slice_comm: MPI.Comm | None = None    # allreduce: the ranks summing with me (my slice's, or all)

    def count(self, part: str, sent: int, recv: int) -> None:
        self.traffic[part]["sent"] += int(sent)
        self.traffic[part]["recv"] += int(recv)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def endpoint(self) -> Endpoint:
        """What the protocol's loops need of this rank."""
        return Endpoint(self.comm, self.waiter, self.clock, lambda: signals.requested() is not None)

    @property
    def role(self) -> str:
        if self.cfg.arch == "p2p":
            return "peer"
        return "server" if self.rank < self.servers else "worker"

    @property
    def workers(self) -> int:
        return self.comm.size - self.servers

    def say(self, line: str) -> None:
        """A progress line, from rank 0 only."""
        if self.rank == 0 and not self.cfg.quiet:
            print(line, flush=True)


@dataclass
class Model:
    """What init made: this rank's data, the weights, and where training starts."""
    train: Dataset           # this rank's share (servers: none; a replica's members: the same)
    test: Dataset | None     # the held-out set (rank 0)
    n_train: int             # all workers' training points together
    read_times: dict         # init's read / parse / shuffle seconds
    layout: mlp.Layout
    sliced: mlp.Sliced | None  # --model-parallel K > 1: w's slices (w is then in their order)
    w: np.ndarray | None     # all of w (a server serves its shards, views of it); None on a
                             # model-parallel worker that is not rank 0, which keeps its slice only
    lr: float                # the optimizer's (sgd: the workers' step's)
    resumed: dict            # the checkpoint's progress, or {}
    saved_optimizer: dict    # the optimizer's state from the checkpoint, full-length arrays, or {}
    scaling: tuple | None    # --standardize: (mean, std) of every feature
    labels: object = None    # data.labels.Labels of a data file's labels (names: labels.json)
    dialect: dict | None = None        # how the data file was read (results.json's data)
    test_lines: np.ndarray | None = None   # rank 0: the held-out points' rows in their file
    feature_stats: tuple = (0.0, 1.0)      # rank 0: the held-out features' largest |value| and std ratio, unscaled

    @property
    def first_epoch(self) -> int:
        return self.resumed.get("epoch", 0)

    def standard(self, w: np.ndarray) -> np.ndarray:
        """w in the layout's own order (model-parallel runs keep it in slice order)."""
        return self.sliced.to_standard(w) if self.sliced is not None else w

    def columns(self, k: int | None = None):
        """What 1-bit messages take their columns from: the layout; with slices, the
        sliced vector (a server's shard: k None) or slice k's own layout (a member's)."""
        if self.sliced is None:
            return self.layout
        return self.sliced if k is None else self.sliced.layouts[k]
