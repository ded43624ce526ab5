"""--arch allreduce: no servers; every rank is a worker (the Horovod design).

Each step every rank computes its Delta-w (or, with a server-side optimizer, its negative
gradient), the ranks sum [m * Delta-w | m, loss_sum, stop], and every rank's optimizer
applies the sample-weighted mean: the same update a sync server applies. The sum is
  ring  (default) asgd's own ring allreduce (Patarasuk and Yuan 2009; Horovod's): the
        vector in P chunks, a reduce-scatter (P - 1 steps: pass a chunk to the next rank,
        add the one from the previous) then an allgather (P - 1 steps: pass the summed
        chunks on), point to point through the Waiter. Each rank moves 2 (P - 1) / P of
        the vector each way whatever P, the traffic pattern of Alqahtani and Demirbas's
        RA, and every byte is counted (asgd.core.wire.ring_bytes).
  mpi   MPI_Iallreduce, polled through the Waiter: the MPI library picks the algorithm
        (it switches with the size and the rank count), so asgd cannot know its bytes;
        results.json counts the least any allreduce moves, 2 (P - 1) / P of the vector.
Both sum in a fixed order, so every rank applies the same update.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..net import kernels
from ..net.optimizers import Optimizer
from ..core.wire import DOUBLE, TAG_RING, ring_bytes, shard_bounds
from .context import Endpoint, Schedule, WorkerStats
from ..core.shard import DIVERGED_AFTER, DivergenceError


class Ring:
    """asgd's ring allreduce of float64 vectors of n values among ep's ranks."""

    def __init__(self, ep: Endpoint, n: int):
        self.ep, self.P = ep, ep.comm.size
        self.chunks = shard_bounds(n, self.P)
        self.inbox = np.empty(max(hi - lo for lo, hi in self.chunks))
        self.bytes = ring_bytes(n, self.P, ep.rank)   # (sent, received) per allreduce

    def sum(self, part: np.ndarray, total: np.ndarray) -> None:
        """total = the sum of every rank's part (part is left as it was)."""
        total[:] = part
        P, r = self.P, self.ep.rank
        right, left = (r + 1) % P, (r - 1) % P
        for k in range(P - 1):          # reduce-scatter: after it, chunk r+1 is summed here
            lo, hi = self.chunks[(r - k) % P]
            c_lo, c_hi = self.chunks[(r - k - 1) % P]
            got = self.inbox[:c_hi - c_lo]
            self._swap(total[lo:hi], right, got, left, "reduce-scatter")
            kernels.add_into(total[c_lo:c_hi], got)
        for k in range(P - 1):          # allgather: pass the summed chunks around
            lo, hi = self.chunks[(r + 1 - k) % P]
            c_lo, c_hi = self.chunks[(r - k) % P]
            self._swap(total[lo:hi], right, total[c_lo:c_hi], left, "allgather")

    def _swap(self, out, to, into, frm, what):
        comm = self.ep.comm
        self.ep.waiter.all([comm.Isend([out, MPI.DOUBLE], to, TAG_RING),
                            comm.Irecv([into, MPI.DOUBLE], frm, TAG_RING)],
                           lambda: f"rank {frm}'s chunk of the ring allreduce ({what})")


class MPIAllreduce:
    """MPI_Iallreduce, polled through the Waiter; its bytes are the library's."""

    def __init__(self, ep: Endpoint, n: int):
        self.ep = ep
        P = ep.comm.size
        least = int(DOUBLE * 2 * (P - 1) * n / P) if P > 1 else 0   # what any allreduce moves, at least
        self.bytes = (least, least)

    def sum(self, part: np.ndarray, total: np.ndarray) -> None:
        self.ep.waiter.all([self.ep.comm.Iallreduce(part, total, op=MPI.SUM)], "the other ranks' allreduce")


def run_allreduce(ep: Endpoint, w: np.ndarray, X: np.ndarray, y: np.ndarray, step, optimizer: Optimizer,
                  plan: Schedule, on_version=None, algorithm: str = "ring") -> WorkerStats:
    """Train in place on w: each step's Delta-w at plan.lr, then the optimizer moves w
    along the sample-weighted mean of every rank's (every rank alike, its own optimizer
    state for all of w), summed by `algorithm` (ring, mpi). on_version(updates, loss_sum,
    samples) sees every applied step's sums. A stop request on any rank rides in the sum:
    every rank stops after the same step."""
    clock = ep.clock
    n_w = len(w)
    st = WorkerStats()
    part, total = np.zeros(n_w + 3), np.zeros(n_w + 3)  # [m * Delta-w | m, loss_sum, stop]
    summer = (Ring if algorithm == "ring" else MPIAllreduce)(ep, n_w + 3)
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
            summer.sum(part, total)
            st.bytes_sent += summer.bytes[0]
            st.bytes_recv += summer.bytes[1]
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
            if on_version:
                on_version(st.updates, total[n_w + 1], total[n_w])
            if total[n_w + 2]:
                st.stopped = True
                return st
    return st
