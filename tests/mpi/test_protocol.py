"""Protocol invariants, run inside one MPI job: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
Every wait has a deadline, and assertions come after the last collective, so a
failure cannot leave the other ranks hanging."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from asgd import data, mlp
from asgd.comm import Waiter, oversubscribed
from asgd.server import EpochTracker, run_server
from asgd.trace import PhaseClock
from asgd.worker import run_worker

pytestmark = pytest.mark.mpi(min_size=2)


def run_job(epochs=2, batch=32, n=600, hidden=20):
    comm = MPI.COMM_WORLD
    layout = mlp.Layout(2, hidden, 2)
    w0 = mlp.init_params(layout, 0)
    w = w0.copy()
    train, test = data.rings(n, 0), data.rings(100, 1)
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 60, f"rank {comm.rank}")
    clock = PhaseClock("init")
    sent = np.zeros(layout.n_w)  # sum of every Delta-w this rank sent
    if comm.rank == 0:
        tracker = EpochTracker(n, epochs, mlp.make_evaluate(layout, w, test), lambda s: None, 1e9, clock)
        st = run_server(comm, w, mlp.add_into, tracker, waiter, clock)
        mine = (st.updates, st.samples, st.stale_sum.sum(), st.stale_max.max())
    else:
        step = mlp.make_step(layout, batch)

        def counting_step(w_, X, y, lr, dw):
            loss = step(w_, X, y, lr, dw)
            sent[:] += dw
            return loss
        idx = np.arange(comm.rank - 1, n, comm.size - 1)
        st = run_worker(comm, w, train.X[idx], train.y[idx], counting_step, 0.05, batch, epochs, 0,
                        waiter, clock)
        mine = (st.updates, st.samples, 0, 0)
    total_sent = np.zeros_like(sent)
    comm.Reduce(sent, total_sent, op=MPI.SUM, root=0)
    counts = comm.gather(mine, root=0)
    return comm.rank, w0, w, total_sent, counts


def test_async_server_applies_every_update_once():
    rank, w0, w, total_sent, counts = run_job()
    if rank == 0:
        server, workers = counts[0], counts[1:]
        assert server[0] == sum(c[0] for c in workers) > 0        # updates
        assert server[1] == sum(c[1] for c in workers) == 2 * 600  # samples: 2 epochs
        # the server's w is the initial w plus every Delta-w sent, each exactly once
        np.testing.assert_allclose(w, w0 + total_sent, rtol=0, atol=1e-10)
        assert server[2] >= 0 and server[3] >= 0                    # staleness counted


def test_uneven_shares_and_partial_batches():
    rank, w0, w, total_sent, counts = run_job(epochs=1, batch=64, n=601)
    if rank == 0:
        assert counts[0][1] == 601
        np.testing.assert_allclose(w, w0 + total_sent, rtol=0, atol=1e-10)
