"""--arch allreduce: no servers; every rank is a worker (the Horovod design).

Each step every rank computes its Delta-w (or, with a server-side optimizer, its negative
gradient), the ranks sum [m * Delta-w | m, loss_sum, stop] with one Iallreduce (waited
through the Waiter, not MPI's spinning Wait), and every rank's optimizer applies the
sample-weighted mean: the same update a sync server applies.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..net import kernels
from ..net.optimizers import Optimizer
from .context import Endpoint, Schedule, WorkerStats
from .server import DIVERGED_AFTER, DivergenceError


def run_allreduce(ep: Endpoint, w: np.ndarray, X: np.ndarray, y: np.ndarray, step, optimizer: Optimizer,
                  plan: Schedule, on_version=None) -> WorkerStats:
    """Train in place on w: each step's Delta-w at plan.lr, then the optimizer moves w
    along the sample-weighted mean of every rank's (every rank alike, its own optimizer
    state for all of w). on_version(updates, loss_sum, samples) sees every applied step's
    sums. A stop request on any rank rides in the sum: every rank stops after the same step."""
    comm, clock = ep.comm, ep.clock
    n_w = len(w)
    st = WorkerStats()
    part, total = np.zeros(n_w + 3), np.zeros(n_w + 3)  # [m * Delta-w | m, loss_sum, stop]
    Xb = np.empty((plan.batch, X.shape[1]))
    yb = np.empty(plan.batch, dtype=np.int64)
    refused = 0  # non-finite updates in a row
    for epoch in range(plan.first_epoch, plan.epochs):
        for idx in plan.batches(len(y), epoch):
            clock.step = st.updates
            clock.switch("compute")
            m = len(idx)
            if m:
                np.take(X, idx, axis=0, out=Xb[:m])
                np.take(y, idx, out=yb[:m])
                loss = step(w, Xb[:m], yb[:m], plan.lr, part[:n_w])
                part[:n_w] *= m
            else:  # an empty last batch: contribute nothing, but take part
                part[:n_w] = 0.0
                loss = 0.0
            part[n_w:] = (m, loss * m, ep.stop_requested())
            clock.switch("comm_wait")
            ep.waiter.all([comm.Iallreduce(part, total, op=MPI.SUM)], "the other ranks' allreduce")
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
            if on_version:
                on_version(st.updates, total[n_w + 1], total[n_w])
            if total[n_w + 2]:
                st.stopped = True
                return st
    return st
