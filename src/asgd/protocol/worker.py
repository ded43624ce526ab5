"""The worker: its link to the servers (PushPull), and the training loop on top of it.

PushPull is the worker's side of the protocol, in the spirit of ps-lite's KVWorker: write
Delta-w into `delta()`, `push_pull(...)` sends it to every server and posts the receive of
w' (a ticket), `wait(ticket)` completes the exchange and swaps w' in. It owns the buffers,
so none in flight is ever written: Delta-w alternates between two push buffers, and w'
arrives in a second w buffer. Each buffer is the flat vector followed by one header per
server, and comm.shard_types picks each server's slice and header: no copies.

With `overlap` (async and ssp) the loop computes batch k+1 while batch k's exchange is in
flight; without it (sync) each step waits for its reply, so every step starts from the
same w on every worker.

Progress while computing: MPI moves a large (rendezvous-sized) message only inside MPI
calls, and a numba step makes none. So the step calls `progress()` between its sample
blocks (about a millisecond each; mlp.make_step), which tests the exchange in flight once
(MPI_Testall: it returns at once, it never waits, spins or sleeps) until it is complete;
then the rest of the batch runs in one call. Nothing in flight: the step is one call.

OneBitPushPull (--compress 1bit) sends each server 1-bit messages (protocol.onebit): the
push is quantized with the worker's error feedback, the reply is the quantized change of
the server's shard since this worker's last one, added to w in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..run import signals
from ..run.trace import RECV, SEND, PhaseClock, flow_id
from .comm import PULL_HEADER, PUSH_HEADER, TAG_DONE, TAG_PULL, TAG_PUSH, Waiter, shard_types
from .onebit import OneBit


@dataclass
class WorkerStats:
    updates: int = 0
    samples: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    stopped: bool = False  # ended early on a stop request
    refused: int = 0       # allreduce: summed updates with NaN or inf, not applied

    def record(self) -> dict:
        """This worker's entry of results.json's `ranks` (train.py adds the rest)."""
        return {"role": "worker", "updates": self.updates, "bytes_sent": self.bytes_sent,
                "bytes_recv": self.bytes_recv, "stopped": self.stopped, "refused": self.refused}


class PushPull:
    """A worker's link to servers 0..S-1 that own `shards` of w: one exchange in flight
    at most. Counts what it sends and receives in `stats`."""

    def __init__(self, comm: MPI.Comm, shards: list[tuple[int, int]], w0: np.ndarray, waiter: Waiter,
                 clock: PhaseClock):
        S, n = len(shards), len(w0)
        self.comm, self.waiter, self.clock, self.S, self.n = comm, waiter, clock, S, n
        self.push_t, self.pull_t = shard_types(n, shards, PUSH_HEADER), shard_types(n, shards, PULL_HEADER)
        self.push_bytes = [8 * (hi - lo + PUSH_HEADER) for lo, hi in shards]
        self.pull_bytes = [8 * (hi - lo + PULL_HEADER) for lo, hi in shards]
        self.pushes = [np.zeros(n + S * PUSH_HEADER) for _ in range(2)]
        self.cur = np.zeros(n + S * PULL_HEADER)  # [w | (version, stop) per server]; version 0: initial w
        self.cur[:n] = w0
        self.nxt = np.empty_like(self.cur)
        self.free = 0            # the push buffer not in flight
        self.pending: list[MPI.Request] = []
        self.step = 0            # the number of the next push (names it in traces)
        self.stats = WorkerStats()

    @property
    def w(self) -> np.ndarray:
        """The weights to compute the next Delta-w from (the last w' pulled)."""
        return self.cur[:self.n]

    @property
    def told_to_stop(self) -> bool:
        """A server's last reply carried a stop request."""
        return bool(self.cur[self.n:].reshape(self.S, PULL_HEADER)[:, 1].any())

    def delta(self) -> np.ndarray:
        """The free push buffer's Delta-w part: write the Delta-w computed from `w` here.
        Stamps the push with the versions of `w`, which staleness is counted from."""
        buf = self.pushes[self.free]
        buf[self.n:].reshape(self.S, PUSH_HEADER)[:, 0] = self.cur[self.n:].reshape(self.S, PULL_HEADER)[:, 0]
        return buf[:self.n]

    def push_pull(self, dw: np.ndarray, loss_sum: float, samples: int, stop: bool = False) -> int:
        """Send dw (delta()'s buffer) to every server, each its slice, and post the receive
        of w'; returns the ticket to wait on. The previous exchange must be complete."""
        buf = self.pushes[self.free]
        if self.pending or not np.shares_memory(dw, buf):
            raise RuntimeError("push_pull: wait for the previous exchange, and push the buffer delta() gave")
        buf[self.n:].reshape(self.S, PUSH_HEADER)[:, 1:] = (loss_sum, samples, self.step, stop)
        me = self.comm.rank
        for s in range(self.S):
            self.pending.append(self.comm.Isend([buf, 1, self.push_t[s]], s, TAG_PUSH))
            self.pending.append(self.comm.Irecv([self.nxt, 1, self.pull_t[s]], s, TAG_PULL))
            self.clock.message(SEND, s, self.push_bytes[s], flow_id(me, s, self.step, False))
        self.free ^= 1
        return self._sent(samples)

    def _sent(self, samples: int) -> int:
        """Count the exchange just started; its ticket."""
        st = self.stats
        st.updates += 1
        st.samples += samples
        st.bytes_sent += sum(self.push_bytes)
        st.bytes_recv += sum(self.pull_bytes)
        self.step += 1
        return self.step - 1

    def progress(self) -> bool:
        """Let MPI move the exchange in flight: one MPI_Testall, which returns at once.
        True when nothing is in flight any more (then wait() returns at once)."""
        return not self.pending or MPI.Request.Testall(self.pending)

    def wait(self, ticket: int) -> None:
        """Complete exchange `ticket` (the last one pushed); w' becomes `w`."""
        if not self.pending or ticket != self.step - 1:
            raise RuntimeError(f"wait: exchange {ticket} is not the one in flight")
        self.waiter.all(self.pending, lambda: f"server rank(s) {_ranks(self.S)} to answer push {ticket}")
        for s in range(self.S):
            self.clock.message(RECV, s, self.pull_bytes[s], flow_id(self.comm.rank, s, ticket, True))
        self.pending = []
        self.cur, self.nxt = self.nxt, self.cur

    def close(self) -> WorkerStats:
        """Tell every server this worker is done (after its last exchange completed)."""
        self._say_done()
        for t in self.push_t + self.pull_t:
            t.Free()
        return self.stats

    def _say_done(self) -> None:
        if self.pending:
            raise RuntimeError("close: an exchange is still in flight")
        done = np.zeros(1)
        self.waiter.all([self.comm.Isend([done, MPI.DOUBLE], s, TAG_DONE) for s in range(self.S)],
                        lambda: f"server rank(s) {_ranks(self.S)} to take the end-of-work message")


class OneBitPushPull(PushPull):
    """PushPull with 1-bit messages (protocol.onebit): Delta-w plus the residual of the
    pushes before is quantized per server shard, and the residual keeps what was not
    sent; each reply is the quantized change of the shard since this worker's last reply,
    added to w in place (the server keeps the same copy of it). One buffer per server and
    direction: a push is encoded after the exchange before it completed, and w changes
    only in wait(), after the step that read it."""

    def __init__(self, comm: MPI.Comm, shards: list[tuple[int, int]], w0: np.ndarray, waiter: Waiter,
                 clock: PhaseClock, pushes: list[OneBit], pulls: list[OneBit]):
        S, n = len(shards), len(w0)
        self.comm, self.waiter, self.clock, self.S, self.n = comm, waiter, clock, S, n
        self.shards, self.push_codec, self.pull_codec = shards, pushes, pulls
        self.push_bytes = [c.nbytes for c in pushes]
        self.pull_bytes = [c.nbytes for c in pulls]
        self.out = [c.buffer() for c in pushes]
        self.inbox = [c.buffer() for c in pulls]
        self._w = w0.copy()
        self.dw = np.zeros(n)
        self.residual = np.zeros(n)  # error feedback: what the pushes so far did not say
        self.versions = np.zeros(S)  # each shard's version of w (0: the initial w)
        self.stops = np.zeros(S, bool)
        self.pending: list[MPI.Request] = []
        self.step = 0
        self.stats = WorkerStats()

    @property
    def w(self) -> np.ndarray:
        return self._w

    @property
    def told_to_stop(self) -> bool:
        return bool(self.stops.any())

    def delta(self) -> np.ndarray:
        return self.dw

    def push_pull(self, dw: np.ndarray, loss_sum: float, samples: int, stop: bool = False) -> int:
        if self.pending or dw is not self.dw:
            raise RuntimeError("push_pull: wait for the previous exchange, and push the buffer delta() gave")
        me = self.comm.rank
        for s, (lo, hi) in enumerate(self.shards):
            c, buf = self.push_codec[s], self.out[s]
            c.encode(dw[lo:hi], self.residual[lo:hi], buf)
            if not c.finite(buf):  # NaN or inf: the server refuses this push; start the residual afresh
                self.residual[lo:hi] = 0.0
            c.head(buf)[:] = (self.versions[s], loss_sum, samples, self.step, stop)
            self.pending.append(self.comm.Isend([buf, MPI.BYTE], s, TAG_PUSH))
            self.pending.append(self.comm.Irecv([self.inbox[s], MPI.BYTE], s, TAG_PULL))
            self.clock.message(SEND, s, self.push_bytes[s], flow_id(me, s, self.step, False))
        return self._sent(samples)

    def wait(self, ticket: int) -> None:
        if not self.pending or ticket != self.step - 1:
            raise RuntimeError(f"wait: exchange {ticket} is not the one in flight")
        self.waiter.all(self.pending, lambda: f"server rank(s) {_ranks(self.S)} to answer push {ticket}")
        self.pending = []
        for s, (lo, hi) in enumerate(self.shards):
            c, buf = self.pull_codec[s], self.inbox[s]
            c.decode(buf, self._w[lo:hi], add=True)
            self.versions[s], self.stops[s] = c.head(buf)
            self.clock.message(RECV, s, self.pull_bytes[s], flow_id(self.comm.rank, s, ticket, True))

    def close(self) -> WorkerStats:
        self._say_done()   # no derived datatypes to free: the messages are bytes
        return self.stats


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
               steps_per_epoch: int | None = None, first_epoch: int = 0, progress: bool = True,
               codecs: tuple[list[OneBit], list[OneBit]] | None = None) -> WorkerStats:
    """Train on my share (X, y) against servers 0..len(shards)-1, from weights w0.
    step(w, X, y, lr, dw) -> loss writes Delta-w into dw (see mlp.make_step). seed ([run
    seed, worker index]) and the epoch seed my shuffles: a worker shuffles alike whatever
    its rank, and a resumed run (from first_epoch) repeats none. A stop request (signal)
    ends the loop at a step boundary: at once in async/ssp; in sync when the servers'
    replies say so, after the same round on every worker. progress: the step lets MPI move
    the exchange in flight between its sample blocks (step(..., progress=link.progress));
    off, it is called as step(w, X, y, lr, dw). codecs: (push, pull) 1-bit codecs per
    server (protocol.onebit.codecs), for --compress 1bit; None: float64 messages."""
    link = (PushPull(comm, shards, w0, waiter, clock) if codecs is None
            else OneBitPushPull(comm, shards, w0, waiter, clock, *codecs))
    kw = {"progress": link.progress} if progress else {}
    Xb = np.empty((batch, X.shape[1]))
    yb = np.empty(batch, dtype=np.int64)
    ticket, stop = None, False
    for epoch in range(first_epoch, epochs):
        for idx in batches(len(y), batch, steps_per_epoch, np.random.default_rng([*seed, epoch])):
            stop = stop or (overlap and signals.requested() is not None)
            if stop:
                break
            clock.step = link.step  # the trace window counts steps
            clock.switch("compute")
            m = len(idx)
            dw = link.delta()
            if m:
                np.take(X, idx, axis=0, out=Xb[:m])
                np.take(y, idx, out=yb[:m])
                loss = step(link.w, Xb[:m], yb[:m], lr, dw, **kw)
            else:  # an empty last batch (sync): a zero-weight Delta-w keeps the workers in step
                dw[:] = 0.0
                loss = 0.0
            if ticket is not None:
                clock.switch("comm_wait")
                link.wait(ticket)
            clock.switch("push")
            ticket = link.push_pull(dw, loss * m, m, stop=signals.requested() is not None)
            if not overlap:
                clock.switch("comm_wait")
                link.wait(ticket)
                ticket = None
            stop = link.told_to_stop
        if stop:
            break
    if ticket is not None:
        clock.switch("comm_wait")
        link.wait(ticket)
    link.stats.stopped = stop or link.told_to_stop
    return link.close()


def _ranks(n: int) -> str:
    return "0" if n == 1 else f"0-{n - 1}"
