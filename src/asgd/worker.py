"""The worker loop: train mini-batches on my share, push Delta-w, pull w'.

Communication overlaps computation: batch k+1 is computed while batch k's exchange is
in flight, with at most one exchange outstanding. Buffers in flight are never written:
Delta-w alternates between two push buffers, and w' arrives in a second w buffer that
is swapped in (no copy) once the exchange completes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .comm import PULL_HEADER, PUSH_HEADER, SERVER, TAG_DONE, TAG_PULL, TAG_PUSH, Waiter
from .trace import RECV, SEND, PhaseClock


@dataclass
class WorkerStats:
    updates: int = 0
    samples: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    extra: dict = field(default_factory=dict)


def run_worker(comm: MPI.Comm, w0: np.ndarray, X: np.ndarray, y: np.ndarray, step,
               lr: float, batch: int, epochs: int, seed: int,
               waiter: Waiter, clock: PhaseClock) -> WorkerStats:
    """step(w, X, y, lr, dw) -> loss writes Delta-w into dw (see mlp.make_step)."""
    n_w, n = len(w0), len(y)
    stats = WorkerStats()
    push = [np.zeros(n_w + PUSH_HEADER) for _ in range(2)]
    cur = np.zeros(n_w + PULL_HEADER)  # [w | version]; version 0 = the shared initial w
    cur[:n_w] = w0
    nxt = np.empty_like(cur)
    Xb = np.empty((batch, X.shape[1]))
    yb = np.empty(batch, dtype=np.int64)
    rng = np.random.default_rng([seed, comm.rank])
    pending: list[MPI.Request] = []
    k = 0
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch):
            clock.step = stats.updates  # the trace window counts steps
            clock.switch("compute")
            idx = order[start:start + batch]
            m = len(idx)
            np.take(X, idx, axis=0, out=Xb[:m])
            np.take(y, idx, out=yb[:m])
            buf = push[k]
            loss = step(cur[:n_w], Xb[:m], yb[:m], lr, buf[:n_w])
            buf[n_w:] = (cur[n_w], loss * m, m, stats.updates)
            if pending:
                clock.switch("comm_wait")
                waiter.all(pending, f"the server (rank {SERVER}) to answer a push")
                clock.message(RECV, SERVER, nxt.nbytes, comm.rank, stats.updates - 1, True)
                cur, nxt = nxt, cur
            clock.switch("push")
            pending = [comm.Isend([buf, MPI.DOUBLE], SERVER, TAG_PUSH),
                       comm.Irecv([nxt, MPI.DOUBLE], SERVER, TAG_PULL)]
            clock.message(SEND, SERVER, buf.nbytes, comm.rank, stats.updates, False)
            stats.updates += 1
            stats.samples += m
            stats.bytes_sent += buf.nbytes
            stats.bytes_recv += nxt.nbytes
            k ^= 1
    clock.switch("comm_wait")
    if pending:
        waiter.all(pending, f"the server (rank {SERVER}) to answer the last push")
        clock.message(RECV, SERVER, nxt.nbytes, comm.rank, stats.updates - 1, True)
    done = np.zeros(1)
    waiter.all([comm.Isend([done, MPI.DOUBLE], SERVER, TAG_DONE)],
               f"the server (rank {SERVER}) to take the end-of-work message")
    return stats
