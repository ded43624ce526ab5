"""The MPI server's effects, without mpiexec: a receive that cannot be re-armed (its worker
has just died, ULFM) is kept for after the event, as a failed reply is, so the shard goes
on answering the other workers of the same event (a completed cut's held pushes)."""

from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from asgd.protocol.server import Server


class Receive:
    def __init__(self, fails: bool):
        self.fails, self.started = fails, 0

    def Start(self):
        if self.fails:
            raise MPI.Exception(MPI.ERR_OTHER)
        self.started += 1


def test_a_failed_rearm_is_kept_for_after_the_event():
    pushes = [Receive(False), Receive(True), Receive(False), Receive(False)]
    server = SimpleNamespace(dead=np.array([False, False, False, True]), pushes=pushes, error=None)
    for j in range(4):   # the shard releases every answered worker of the event, in order
        Server.release(server, j)
    assert [p.started for p in pushes] == [1, 0, 1, 0]   # the dead one's is left alone
    assert isinstance(server.error, MPI.Exception)        # raised by event() once the shard is done
