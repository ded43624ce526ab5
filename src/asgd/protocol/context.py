"""What every protocol loop is given over MPI: its rank's endpoint (communicator, Waiter,
phase clock, and whether a stop was asked). (The schedule of its mini-batches and the
counts a worker keeps are the protocol's without MPI: asgd.core.schedule and
asgd.core.worker.) The loops know nothing of options, files or results.json (asgd.run):
train.py builds these from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
