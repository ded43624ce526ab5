"""Which of a server's workers died (fault_tolerant: Open MPI's ULFM): a worker that dies
makes a wait on its requests fail; the server asks here who died (mpiutil.failed_ranks),
withdraws their requests and tells its shard (asgd.core.shard), which retires them. A
dead server ends the job: its shard cannot be rebuilt."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..mpiutil import failed_ranks, failed_ranks_soon

WATCH_S = 0.25       # a fault-tolerant server looks at the failed group this often while it waits (watch)


class Deaths:
    def __init__(self, comm: MPI.Comm, ranks: list[int], fault_tolerant: bool):
        self.comm, self.ranks, self.fault_tolerant = comm, ranks, fault_tolerant
        self.index = {r: j for j, r in enumerate(ranks)}   # worker rank -> j
        self.dead = np.zeros(len(ranks), bool)
        self.watched = time.monotonic()        # watch()'s last look at the failed group

    def watch(self) -> bool:
        """While waiting, with fault tolerance, every WATCH_S: a worker in the failed group
        that is not yet buried raises (the server's survive() buries it). A death is
        otherwise seen only when a request with the dead fails, and with several killed at
        once one failure can come before the others' news: a dead worker left active
        holds every checkpoint cut (and sync's rounds) forever."""
        if not self.fault_tolerant or time.monotonic() < self.watched + WATCH_S:
            return False
        self.watched = time.monotonic()
        if self.newly_dead(failed_ranks(self.comm)):
            raise MPI.Exception(MPI.ERR_PROC_FAILED)
        return False

    def newly_dead(self, dead: list[int]) -> list[int]:
        """The ranks of `dead` not yet buried here (any rank not my worker counts)."""
        return [r for r in dead if r not in self.index or not self.dead[self.index[r]]]

    def bury(self) -> list[int]:
        """The workers (j) found dead since the last call, now marked dead. With five
        workers killed at once a failure came before its news: wait for it."""
        dead = failed_ranks_soon(self.comm, self.newly_dead)
        others = [r for r in dead if r not in self.index]
        if others:
            raise RuntimeError(f"rank(s) {others} died, and they were not this server's workers: a server's "
                               "shard cannot be rebuilt; restart from the checkpoint (python -m asgd.launch "
                               "--max-restarts, or --resume)")
        new = [self.index[r] for r in self.newly_dead(dead)]
        self.dead[new] = True
        return new
