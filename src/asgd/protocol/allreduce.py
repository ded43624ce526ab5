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
from ..core.schedule import Schedule
from ..core.wire import TAG_RING, ring_bytes, shard_bounds, stop_share, summed_stop
from ..core.shard import DIVERGED_AFTER, DivergenceError
from ..core.worker import WorkerStats, allreduce_loop
from .context import Endpoint


class Ring:
    """asgd's ring allreduce of vectors of n values of `dtype` among ep's ranks."""

    def __init__(self, ep: Endpoint, n: int, dtype=np.float64):
        self.ep, self.P = ep, ep.comm.size
        self.chunks = shard_bounds(n, self.P)
        self.inbox = np.empty(max(hi - lo for lo, hi in self.chunks), dtype)
        self.bytes = ring_bytes(n, self.P, ep.rank, self.inbox.itemsize)   # (sent, received) per allreduce

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
        self.ep.waiter.all([comm.Isend(out, to, TAG_RING), comm.Irecv(into, frm, TAG_RING)],   # MPI type: the dtype's
                           lambda: f"rank {frm}'s chunk of the ring allreduce ({what})")


class MPIAllreduce:
    """MPI_Iallreduce, polled through the Waiter; its bytes are the library's."""

    def __init__(self, ep: Endpoint, n: int, dtype=np.float64):
        self.ep = ep
        P = ep.comm.size
        least = int(np.dtype(dtype).itemsize * 2 * (P - 1) * n / P) if P > 1 else 0   # what any allreduce moves
        self.bytes = (least, least)

    def sum(self, part: np.ndarray, total: np.ndarray) -> None:
        self.ep.waiter.all([self.ep.comm.Iallreduce(part, total, op=MPI.SUM)], "the other ranks' allreduce")


class Summed:
    """An allreduce rank's side of asgd.core.worker.allreduce_loop over MPI: each step's
    [m * Delta-w | m, loss_sum, stop] summed by `summer` (Ring, MPIAllreduce), then w
    moved by the optimizer along the sample-weighted mean, every rank alike."""

    def __init__(self, w: np.ndarray, summer, optimizer: Optimizer, on_version=None):
        self.w, self.summer, self.optimizer, self.on_version = w, summer, optimizer, on_version
        self.n_w = n_w = len(w)
        # [m * Delta-w | m, loss_sum, stop] in w's dtype: m and stop exact (float32: to 2^24 samples a step)
        self.part, self.total = np.zeros(n_w + 3, w.dtype), np.zeros(n_w + 3, w.dtype)
        self.refused = 0   # non-finite sums in a row
        self.told_to_stop = False    # the last sum said to stop: asked (a signal), or done
        self.asked_to_stop = False   # ... and it was asked
        self.finished = False        # on_version said the run is done (rank 0: its target reached)
        self.stats = WorkerStats()

    def delta(self) -> np.ndarray:
        return self.part[:self.n_w]

    def sum(self, dw: np.ndarray, loss_sum: float, m: int, stop: bool) -> None:
        """Sum my [m * dw | m, loss_sum, stop] (dw: delta()'s buffer) with every rank's."""
        n_w = self.n_w
        self.part[:n_w] *= m
        self.part[n_w:] = (m, loss_sum, stop_share(stop, self.finished, self.summer.ep.comm.size))
        self.summer.sum(self.part, self.total)
        self.stats.bytes_sent += self.summer.bytes[0]
        self.stats.bytes_recv += self.summer.bytes[1]

    def apply(self, m: int) -> bool:
        """Apply the summed update, or refuse it (False) if it has NaN or inf: every rank
        sees the same sum, so all refuse it alike. A sum that says the run is done (a
        target reached) is not applied: every rank ends with the w that reached it."""
        n_w, total, st = self.n_w, self.total, self.stats
        if not kernels.all_finite(total[:n_w + 2]):
            self.refused += 1
            st.refused += 1
            if self.refused >= DIVERGED_AFTER:
                raise DivergenceError(f"{self.refused} allreduced updates in a row had NaN or inf values: "
                                      "training diverged; lower --lr")
            return False
        self.refused = 0
        self.told_to_stop, self.asked_to_stop = summed_stop(total[n_w + 2])
        if self.told_to_stop and not self.asked_to_stop:
            return True   # done (rank 0's target reached): every rank keeps the w that reached it
        if total[n_w]:
            self.optimizer.step(self.w, total[:n_w], 1.0 / total[n_w])
        st.updates += 1
        st.samples += m
        if self.on_version and self.on_version(st.updates, float(total[n_w + 1]), float(total[n_w])):
            self.finished = True   # said in my next sum: every rank ends with it, not applying it
        return True


def run_allreduce(ep: Endpoint, w: np.ndarray, X: np.ndarray, y: np.ndarray, step, optimizer: Optimizer,
                  plan: Schedule, on_version=None, algorithm: str = "ring") -> WorkerStats:
    """Train in place on w (asgd.core.worker.allreduce_loop over MPI): each step's
    Delta-w at plan.lr, then the optimizer moves w along the sample-weighted mean of
    every rank's (every rank alike, its own optimizer state for all of w), summed by
    `algorithm` (ring, mpi). on_version(updates, loss_sum, samples) sees every applied
    step's sums. A stop request on any rank rides in the sum: every rank stops after the
    same step."""
    reducer = Summed(w, (Ring if algorithm == "ring" else MPIAllreduce)(ep, len(w) + 3, w.dtype), optimizer, on_version)
    Xb = np.empty((plan.batch, X.shape[1]), X.dtype)
    yb = np.empty(plan.batch, dtype=np.int64)

    def compute(idx: np.ndarray, dw: np.ndarray) -> float:
        m = len(idx)
        np.take(X, idx, axis=0, out=Xb[:m])
        np.take(y, idx, out=yb[:m])
        return step(w, Xb[:m], yb[:m], plan.lr, dw)
    return allreduce_loop(reducer, compute, ep.clock, plan, len(y), ep.stop_requested)
