"""The worker loop: train mini-batches on my share, push Delta-w, pull w'.

With `overlap` (async and ssp), batch k+1 is computed while batch k's exchange is in
flight, at most one exchange outstanding; without it (sync) each step waits for its
reply, so every step starts from the same w on every worker. Buffers in flight are never
written: Delta-w alternates between two push buffers, and w' arrives in a second w
buffer that is swapped in (no copy) once the exchange completes. Each buffer is the flat
vector followed by one header per server (comm.shard_types picks each server's part).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..run import signals
from ..run.trace import RECV, SEND, PhaseClock
from .comm import PULL_HEADER, PUSH_HEADER, TAG_DONE, TAG_PULL, TAG_PUSH, Waiter, shard_types


@dataclass
class WorkerStats:
    updates: int = 0
    samples: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    stopped: bool = False  # ended early on a stop request


def batches(n: int, batch: int, steps: int | None, rng: np.random.Generator):
    """One epoch of index arrays over a fresh permutation of range(n). With `steps`
    (sync), exactly that many, the last ones possibly short or empty, so every worker
    takes the same number of steps whatever the size of its share."""
    order = rng.permutation(n)
    for k in range(steps if steps is not None else -(-n // batch)):
        yield order[k * batch:(k + 1) * batch]


def run_worker(comm: MPI.Comm, shards: list[tuple[int, int]], w0: np.ndarray, X: np.ndarray,
               y: np.ndarray, step, lr: float, batch: int, epochs: int, seed,
               waiter: Waiter, clock: PhaseClock, overlap: bool = True,
               steps_per_epoch: int | None = None, first_epoch: int = 0) -> WorkerStats:
    """step(w, X, y, lr, dw) -> loss writes Delta-w into dw (see mlp.make_step).
    Servers are ranks 0..len(shards)-1; seed ([run seed, worker index]) and the epoch seed
    my shuffles: a worker shuffles alike whatever its rank, and a resumed run (from
    first_epoch) repeats none. A stop request (signal) ends the loop at a step boundary:
    at once in async/ssp; in sync when the servers' replies say so, after the same
    round on every worker."""
    S, n_w, me = len(shards), len(w0), comm.rank
    st = WorkerStats()
    push_t, pull_t = shard_types(n_w, shards, PUSH_HEADER), shard_types(n_w, shards, PULL_HEADER)
    push = [np.zeros(n_w + S * PUSH_HEADER) for _ in range(2)]
    cur = np.zeros(n_w + S * PULL_HEADER)  # [w | (version, stop) per server]; version 0: initial w
    cur[:n_w] = w0
    nxt = np.empty_like(cur)
    push_bytes = [8 * (hi - lo + PUSH_HEADER) for lo, hi in shards]
    pull_bytes = [8 * (hi - lo + PULL_HEADER) for lo, hi in shards]
    Xb = np.empty((batch, X.shape[1]))
    yb = np.empty(batch, dtype=np.int64)
    pending: list[MPI.Request] = []
    told_to_stop = lambda: cur[n_w:].reshape(S, PULL_HEADER)[:, 1].any()  # noqa: E731
    stop = False

    def complete(pending):
        clock.switch("comm_wait")
        waiter.all(pending, lambda: f"server rank(s) {_ranks(S)} to answer push {st.updates - 1}")
        for s in range(S):
            clock.message(RECV, s, pull_bytes[s], me, st.updates - 1, True)

    k = 0
    for epoch in range(first_epoch, epochs):
        for idx in batches(len(y), batch, steps_per_epoch, np.random.default_rng([*seed, epoch])):
            stop = stop or (overlap and signals.requested() is not None)
            if stop:
                break
            clock.step = st.updates  # the trace window counts steps
            clock.switch("compute")
            m = len(idx)
            buf = push[k]
            if m:
                np.take(X, idx, axis=0, out=Xb[:m])
                np.take(y, idx, out=yb[:m])
                loss = step(cur[:n_w], Xb[:m], yb[:m], lr, buf[:n_w])
            else:  # an empty last batch (sync): a zero-weight Delta-w keeps the workers in step
                buf[:n_w] = 0.0
                loss = 0.0
            hdr = buf[n_w:].reshape(S, PUSH_HEADER)
            hdr[:, 0] = cur[n_w:].reshape(S, PULL_HEADER)[:, 0]
            hdr[:, 1:] = (loss * m, m, st.updates, signals.requested() is not None)
            if pending:
                complete(pending)
                cur, nxt = nxt, cur
            clock.switch("push")
            pending = []
            for s in range(S):
                pending.append(comm.Isend([buf, 1, push_t[s]], s, TAG_PUSH))
                pending.append(comm.Irecv([nxt, 1, pull_t[s]], s, TAG_PULL))
                clock.message(SEND, s, push_bytes[s], me, st.updates, False)
            st.updates += 1
            st.samples += m
            st.bytes_sent += sum(push_bytes)
            st.bytes_recv += sum(pull_bytes)
            k ^= 1
            if not overlap:
                complete(pending)
                cur, nxt = nxt, cur
                pending = []
            stop = told_to_stop()
        if stop:
            break
    if pending:
        complete(pending)
        cur, nxt = nxt, cur
    st.stopped = stop or told_to_stop()
    done = np.zeros(1)
    waiter.all([comm.Isend([done, MPI.DOUBLE], s, TAG_DONE) for s in range(S)],
               lambda: f"server rank(s) {_ranks(S)} to take the end-of-work message")
    for t in push_t + pull_t:
        t.Free()
    return st


def _ranks(n: int) -> str:
    return "0" if n == 1 else f"0-{n - 1}"
