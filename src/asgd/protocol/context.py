"""What every protocol loop is given: its rank's endpoint (communicator, Waiter, phase
clock, and whether a stop was asked), the schedule of its mini-batches, and the counts
a worker keeps. The loops know nothing of options, files or results.json (asgd.run):
train.py builds these from them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI

from ..mpiutil import Waiter


def _never() -> bool:
    return False


_SELF: dict[int, MPI.Comm] = {}   # per communicator (its handle): a communicator of this rank alone


@dataclass
class Endpoint:
    """One rank's means to talk and to account: `clock` is asgd.run.trace's PhaseClock or
    anything with its switch(phase), message(kind, peer, nbytes, flow) and `step`;
    `stop_requested()` says whether a stop (a signal) was asked on this rank."""
    comm: MPI.Comm
    waiter: Waiter
    clock: object
    stop_requested: Callable[[], bool] = _never

    @property
    def rank(self) -> int:
        return self.comm.rank

    def route(self, peer: int) -> tuple[MPI.Comm, int]:
        """The communicator and rank a message with `peer` (a rank of comm) goes by: comm
        itself, or for this rank's messages to itself (a p2p owner and its own worker) a
        duplicate of MPI_COMM_SELF, the same one for every endpoint of comm. Over comm
        MPICH moved a 200 KB message to self in about 28 progress steps (5 ms for a rank
        that sleeps between its tests: a 2-rank p2p step waited 2.4 ms for it); over a
        communicator of one rank, in one."""
        if peer != self.comm.rank:
            return self.comm, peer
        key = self.comm.py2f()
        if key not in _SELF:
            _SELF[key] = MPI.COMM_SELF.Dup()
        return _SELF[key], 0


@dataclass(frozen=True)
class Schedule:
    """Which mini-batches a worker trains and how: epochs first_epoch..epochs-1, each a
    fresh permutation of its share seeded by (run seed, worker index, epoch), so a worker
    shuffles alike whatever its rank and a resumed run repeats none."""
    batch: int
    epochs: int
    seed: tuple[int, int]               # (run seed, worker index)
    lr: float                           # the step's: sgd's lr (it pushes Delta-w), else 1 (the gradient)
    first_epoch: int = 0
    steps_per_epoch: int | None = None  # sync and allreduce: the same number of steps on every worker
    overlap: bool = True                # async, ssp: compute batch k+1 while exchange k is in flight
    adaptive: bool = True               # ... only while exchanges are short against steps (overlap.OverlapRule)
    progress: bool = True               # the step tests the exchange in flight between its sample blocks
    open_ended: bool = False            # sync with backup workers: epochs on until the servers say the run's are done

    def epoch_numbers(self):
        """The epochs to train: first_epoch..epochs-1, or (open_ended) on until told to stop."""
        return itertools.count(self.first_epoch) if self.open_ended else range(self.first_epoch, self.epochs)

    def batches(self, n: int, epoch: int):
        """One epoch of index arrays into a share of n points. With steps_per_epoch,
        exactly that many, the last ones possibly short or empty, so every worker takes
        the same number of steps whatever the size of its share."""
        order = np.random.default_rng([*self.seed, epoch]).permutation(n)
        steps = self.steps_per_epoch if self.steps_per_epoch is not None else -(-n // self.batch)
        for k in range(steps):
            yield order[k * self.batch:(k + 1) * self.batch]


@dataclass
class WorkerStats:
    updates: int = 0
    samples: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    stopped: bool = False  # ended early on a stop request
    refused: int = 0       # allreduce: summed updates with NaN or inf, not applied
    waited: int = 0        # exchanges waited for before the next step (sync: all; protocol.overlap.OverlapRule)

    def record(self) -> dict:
        """This worker's entry of results.json's `ranks` (train.py adds the rest)."""
        return {"role": "worker", "updates": self.updates, "bytes_sent": self.bytes_sent,
                "bytes_recv": self.bytes_recv, "stopped": self.stopped, "refused": self.refused,
                "waited": self.waited}
