"""--arch allreduce: no servers; every rank is a worker (the Horovod design).

Each step every rank computes its Delta-w (or, with a server-side optimizer, its negative
gradient), the ranks sum [m * Delta-w | m, loss_sum] with one Iallreduce (waited through
the Waiter, not MPI's spinning Wait), and every rank's optimizer applies the
sample-weighted mean: the same update a sync server applies.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..net import kernels
from ..net.optimizers import Optimizer
from ..run import signals
from ..run.progress import EpochTracker
from ..run.trace import PhaseClock
from .comm import Waiter
from .server import DIVERGED_AFTER, DivergenceError
from .worker import WorkerStats, batches


def run_allreduce(comm: MPI.Comm, w: np.ndarray, X: np.ndarray, y: np.ndarray, step, lr: float,
                  optimizer: Optimizer, batch: int, epochs: int, steps_per_epoch: int, seed, waiter: Waiter,
                  clock: PhaseClock, tracker: EpochTracker | None, first_epoch: int = 0,
                  on_update=None) -> WorkerStats:
    """Train in place on w: each step's lr, then the optimizer moves w along the
    sample-weighted mean of every rank's update (every rank alike, its own optimizer state
    for all of w). tracker (rank 0 only) sees every step's summed samples. A stop request
    on any rank rides in the sum: every rank stops after the same step."""
    n_w = len(w)
    st = WorkerStats()
    part, total = np.zeros(n_w + 3), np.zeros(n_w + 3)  # [m * Delta-w | m, loss_sum, stop]
    Xb = np.empty((batch, X.shape[1]))
    yb = np.empty(batch, dtype=np.int64)
    refused = 0  # non-finite updates in a row
    for epoch in range(first_epoch, epochs):
        for idx in batches(len(y), batch, steps_per_epoch, np.random.default_rng([*seed, epoch])):
            clock.step = st.updates
            clock.switch("compute")
            m = len(idx)
            if m:
                np.take(X, idx, axis=0, out=Xb[:m])
                np.take(y, idx, out=yb[:m])
                loss = step(w, Xb[:m], yb[:m], lr, part[:n_w])
                part[:n_w] *= m
            else:  # an empty last batch: contribute nothing, but take part
                part[:n_w] = 0.0
                loss = 0.0
            part[n_w:] = (m, loss * m, signals.requested() is not None)
            clock.switch("comm_wait")
            waiter.all([comm.Iallreduce(part, total, op=MPI.SUM)], "the other ranks' allreduce")
            clock.switch("aggregate")
            if not kernels.all_finite(total[:n_w + 2]):  # every rank sees the same sum: all refuse it alike
                refused += 1
                st.refused += 1
                if refused >= DIVERGED_AFTER:
                    raise DivergenceError(f"{refused} allreduced updates in a row had NaN or inf values: "
                                          "training diverged; lower --lr")
                continue
            refused = 0
            if total[n_w]:
                optimizer.step(w, total[:n_w], 1.0 / total[n_w])
            st.updates += 1
            st.samples += m
            st.bytes_sent += part.nbytes
            st.bytes_recv += total.nbytes
            if tracker:
                tracker.add(total[n_w + 1], total[n_w])
            if on_update:
                on_update(st.updates)
            if total[n_w + 2]:
                st.stopped = True
                return st
    return st
