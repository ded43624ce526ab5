"""The worker over MPI: its link to the servers (PushPull), which drives the worker's loop
written once in asgd.core.worker (run_worker: the loop with MPI's link and numba's step).

PushPull is the worker's side of the protocol, in the spirit of ps-lite's KVWorker: write
Delta-w into `delta()`, `push_pull(...)` sends it to every server and posts the receive of
w' (a ticket), `wait(ticket)` completes the exchange and w' becomes `w`. How the messages
sit in memory (dense without copies, or 1-bit) is its strategy's (protocol.messages);
what is sent when, the versions staleness is counted from, stops and byte counts are
the link's, once for both.

With `overlap` (async and ssp) the core loop computes batch k+1 while batch k's exchange is in
flight; without it (sync) each step waits for its reply, so every step starts from the
same w on every worker. Overlap hides an exchange about as long as a step; one that lasts
many steps (a slow link, a crowded server) it barely shortens, and the step it runs is
computed on w one exchange staler: measured on 8 Mbit/s links, 8 workers' first epoch
reached 0.71-0.79 held-out accuracy with it, where a trainer that waited reached 1.000.
So the loop overlaps while the exchange lasts under OverlapRule.RATIO steps, and waits
for w' first beyond that (asgd.core.schedule.OverlapRule; --overlap auto, the default: on always overlaps,
off never).

Progress while computing: MPI moves a large (rendezvous-sized) message only inside MPI
calls, and a numba step makes none. So the step calls `progress()` between its sample
blocks (about a millisecond each; mlp.make_step), which tests the exchange in flight once
(MPI_Testall: it returns at once, it never waits, spins or sleeps) until it is complete;
then the rest of the batch runs in one call. Nothing in flight: the step is one call.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..core.wire import (DONE_BYTES, P_CUT, P_LOSS, P_SAMPLES, P_STEP, P_STOP, P_VERSION, PUSH_HEADER, R_CUT, R_STOP,
                    R_VERSION, RECV, SEND, STOP_ASKED, TAG_DONE, TAG_PULL, TAG_PUSH, flow_id)
from ..core import worker
from ..core.schedule import Schedule
from ..core.worker import WorkerStats
from .context import Endpoint


class PushPull:
    """A worker's link to servers 0..S-1 that own `shards` of w, its messages laid out by
    `messages` (protocol.messages.DenseLink or OneBitLink): one exchange in flight at
    most. Counts what it sends and receives in `stats`."""

    def __init__(self, ep: Endpoint, shards: list[tuple[int, int]], messages, background=None,
                 servers: list[int] | None = None):
        """shards: the parts of my w that servers[s] (default: rank s) own, in my w's
        coordinates; background(): another duty of this rank, run while the step computes
        and while the link waits (a p2p owner serving its shard: protocol.p2p); it returns
        whether it did anything."""
        self.ep, self.S, self.msgs = ep, len(shards), messages
        self.servers = list(range(self.S)) if servers is None else list(servers)
        self.background = background
        self.remote = [r != ep.rank for r in self.servers]   # a p2p rank's own shard needs no wire
        self.routes = [ep.route(r) for r in self.servers]    # (communicator, rank) per server
        self.cut_source = None   # model-parallel: the cut its replica agreed on this step (protocol.replica)
        self.stop_source = None  # model-parallel: whether its replica agreed to stop
        self.exchanged = None    # p2p's rank 0: its owed evaluation, after each wait (core.target.AfterExchange)
        # per server, Python floats (read every step: no numpy scalars on the hot path)
        self.versions = [0.0] * self.S     # each shard's version of `w` (0: the initial w)
        self.stamp = [0.0] * self.S        # the versions of the w the Delta-w being written comes from
        self.stops = [0.0] * self.S        # each server's last reply's stop (wire.STOP_ASKED, STOP_DONE)
        self.cut = 0             # the last checkpoint cut server 0 said it started (wire: a push's cut)
        self.pending: list[MPI.Request] = []
        self.step = 0            # the number of the next push (names it in traces; core.worker may move it on)
        self.stats = WorkerStats()
        self.traced = getattr(ep.clock, "traces", True)   # whether clock.message records (off: skip its arguments)
        # what one exchange moves over the wire (a p2p rank's own shard: nothing), counted per push
        self.wire_sent = sum(b for b, far in zip(messages.push_bytes, self.remote) if far)
        self.wire_recv = sum(b for b, far in zip(messages.pull_bytes, self.remote) if far)

    @property
    def w(self) -> np.ndarray:
        """The weights to compute the next Delta-w from (the last w' pulled)."""
        return self.msgs.w

    @property
    def heard_stop(self) -> bool:
        """A server's last reply said to stop: a stop was asked, or the run's epochs are done."""
        return any(self.stops)

    @property
    def asked_to_stop(self) -> bool:
        """A server's last reply carried a stop request (a signal): the run ends early."""
        return STOP_ASKED in self.stops

    @property
    def told_to_stop(self) -> bool:
        """Whether to stop after this exchange: a server said so, or (model-parallel) the
        replica agreed to, so that its members stop after the same step."""
        return self.heard_stop if self.stop_source is None else self.stop_source()

    def delta(self) -> np.ndarray:
        """The buffer to write the Delta-w computed from `w` into. Stamps the push with the
        versions of `w` now, which its staleness is counted from (w changes in wait(),
        which may come between the step and the push)."""
        self.stamp = self.versions.copy()
        return self.msgs.delta()

    def push_pull(self, dw: np.ndarray, loss_sum: float, samples: int, stop: bool = False) -> int:
        """Send dw (delta()'s buffer) to every server, each its slice, and post the receive
        of w'; returns the ticket to wait on. The previous exchange must be complete."""
        mine = self.msgs.delta()
        if self.pending or (dw is not mine and not np.may_share_memory(dw, mine)):   # the common case: no 0.5 us test
            raise RuntimeError("push_pull: wait for the previous exchange, and push the buffer delta() gave")
        cut = self.cut if self.cut_source is None else self.cut_source()
        for s, rank in enumerate(self.servers):
            fields = [0.0] * PUSH_HEADER
            fields[P_VERSION], fields[P_LOSS], fields[P_SAMPLES], fields[P_STEP], fields[P_STOP], fields[P_CUT] = (
                self.stamp[s], loss_sum, samples, self.step, stop, cut)
            self.msgs.write_push_header(s, fields)   # one call, not one per field
            c, r = self.routes[s]
            self.pending.append(c.Isend(self.msgs.push(s, dw), r, TAG_PUSH))
            self.pending.append(c.Irecv(self.msgs.pull(s), r, TAG_PULL))
            if self.traced:
                self.ep.clock.message(SEND, rank, self.msgs.push_bytes[s],
                                      flow_id(self.ep.rank, rank, self.step, False))
        self.msgs.pushed()
        st = self.stats
        st.updates += 1
        st.samples += samples
        st.bytes_sent += self.wire_sent
        st.bytes_recv += self.wire_recv
        self.step += 1
        return self.step - 1

    def progress(self) -> bool:
        """Let MPI move the exchange in flight: one MPI_Testall, which returns at once.
        True when nothing is in flight any more (then wait() returns at once). With a
        background duty it runs it too, and says False: the step keeps calling."""
        done = not self.pending or MPI.Request.Testall(self.pending)
        if self.background is None:
            return done
        self.background()
        return False

    def wait(self, ticket: int) -> None:
        """Complete exchange `ticket` (the last one pushed); w' becomes `w`."""
        if not self.pending or ticket != self.step - 1:
            raise RuntimeError(f"wait: exchange {ticket} is not the one in flight")
        self.ep.waiter.all(self.pending, lambda: f"server rank(s) {_ranks(self.servers)} to answer push {ticket}",
                           self.background)
        self.pending = []
        for s, rank in enumerate(self.servers):
            head = self.msgs.pulled(s).tolist()
            self.versions[s], self.stops[s] = head[R_VERSION], head[R_STOP]
            if s == 0:   # the leader's shard comes first: the others learn of its cuts from my pushes
                self.cut = int(head[R_CUT])
            if self.traced:
                self.ep.clock.message(RECV, rank, self.msgs.pull_bytes[s], flow_id(self.ep.rank, rank, ticket, True))
        self.msgs.all_pulled()
        if self.exchanged is not None:
            self.exchanged()

    def close(self) -> WorkerStats:
        """Tell every server this worker is done (after its last exchange completed)."""
        if self.pending:
            raise RuntimeError("close: an exchange is still in flight")
        done = np.zeros(1)
        self.ep.waiter.all([c.Isend([done, MPI.DOUBLE], r, TAG_DONE) for c, r in self.routes],
                           lambda: f"server rank(s) {_ranks(self.servers)} to take the end-of-work message",
                           self.background)
        self.stats.bytes_sent += DONE_BYTES * sum(self.remote)
        self.msgs.close()
        return self.stats


def run_worker(link: PushPull, X: np.ndarray, y: np.ndarray, step, plan: Schedule) -> WorkerStats:
    """Train on my share (X, y) through `link`, from the link's w, as `plan` says: the
    worker's loop (asgd.core.worker.loop) over MPI. step(w, X, y, lr, dw[, progress]) ->
    mean loss writes Delta-w into dw (mlp.make_step); with plan.progress it lets MPI move
    the exchange in flight between its sample blocks (step(..., progress=link.progress))."""
    kw = {"progress": link.progress} if plan.progress else {}
    Xb = np.empty((plan.batch, X.shape[1]), X.dtype)
    yb = np.empty(plan.batch, dtype=np.int64)

    def compute(idx: np.ndarray, dw: np.ndarray) -> float:
        m = len(idx)
        xs, ys = Xb[:m], yb[:m]
        X.take(idx, axis=0, out=xs)   # the methods: np.take's wrappers cost a step about a µs
        y.take(idx, out=ys)
        return step(link.w, xs, ys, plan.lr, dw, **kw)
    return worker.loop(link, compute, link.ep.clock, plan, len(y), link.ep.stop_requested)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
