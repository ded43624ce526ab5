"""The parameter server: one request handler, and a reply policy that says when to answer.

Every push goes through `Server.handle` (account for it, refuse a non-finite one, hand it
to the policy); every end-of-work message retires its worker; the loop ends when every
worker has retired, whatever the policy, so no server waits for pushes that will never
come (a stop that reached the workers through another server's reply included).
The policy decides what is applied and who is answered:
  Async  apply each Delta-w as it arrives and answer at once (the paper's ASGD).
  SSP    the same, but hold a worker's answer while its next push would put it more
         than K steps ahead of the slowest active worker (stale-synchronous parallel).
  Sync   hold the pushes until every active worker has pushed, apply their
         sample-weighted mean once, in worker order (deterministic), answer everyone.
"Apply" is the shard's optimizer (net.optimizers: sgd adds Delta-w; momentum, adagrad and
adam move the shard along the pushed negative gradient, keeping their state per shard).
One persistent receive stays posted per worker; it is re-armed when that worker is
answered, so a held push's buffer stays untouched. Replies go out of the worker's own
send buffer, since the shard keeps changing while a reply is in flight. How the messages
sit in memory (float64, or 1-bit with a copy of the shard per worker) is the message
strategy's (protocol.messages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..net import kernels
from ..net.optimizers import Optimizer
from ..wire import (DONE_BYTES, DOUBLE, P_LOSS, P_SAMPLES, P_STEP, P_STOP, P_VERSION, R_STOP, R_VERSION, RECV, SEND,
                    TAG_DONE, TAG_PULL, TAG_PUSH, TAG_SHARD, flow_id, shard_bounds)
from .context import Endpoint
from .messages import Float64Shard

DIVERGED_AFTER = 10  # refused Delta-w in a row that end the job


class DivergenceError(RuntimeError):
    """Training produced NaN or inf again and again: the learning rate is too high."""


@dataclass
class ServerStats:
    updates: int = 0   # Delta-w received (requests), applied or refused
    rounds: int = 0    # versions of the shard (= updates in async and ssp; one per round in sync)
    bytes_sent: int = 0
    bytes_recv: int = 0
    staleness: list = field(default_factory=list)  # per worker: its Delta-w's staleness when applied
    step_gap: list = field(default_factory=list)   # per worker: steps ahead of the slowest
    refused: int = 0   # Delta-w with NaN or inf, not applied
    stopped: bool = False  # a stop request ended the run early

    def record(self, shard: tuple[int, int]) -> dict:
        """This server's entry of results.json's `ranks` (train.py adds the rest)."""
        return {"role": "server", "stopped": self.stopped, "refused": self.refused,
                "updates": self.updates, "rounds": self.rounds, "bytes_sent": self.bytes_sent,
                "bytes_recv": self.bytes_recv, "shard": list(shard), "requests": self.updates,
                "staleness_hist": [np.bincount(v).tolist() for v in self.staleness],
                "step_gap_hist": [np.bincount(v).tolist() for v in self.step_gap]}


class Server:
    def __init__(self, ep: Endpoint, w: np.ndarray, first_worker: int, optimizer: Optimizer | None = None,
                 messages=None, on_version=None):
        """w: my shard (a live view); workers are ranks first_worker..; optimizer: what an
        update does to w, with its state for my shard (default: sgd, w += Delta-w);
        messages: my side's message strategy (default: float64, protocol.messages);
        on_version(rounds, loss_sum, samples): after each new version of the shard
        (progress, checkpoints)."""
        comm = ep.comm
        self.ep, self.comm, self.w, self.waiter, self.clock = ep, comm, w, ep.waiter, ep.clock
        self.first, self.W = first_worker, comm.size - first_worker
        self.optimizer = optimizer or Optimizer("sgd", 1.0, len(w))
        self.msgs = messages or Float64Shard(w, self.W)
        self.on_version = on_version or (lambda rounds, loss_sum, samples: None)
        self.stopping = False  # a stop request: replies tell the workers to stop
        self.pushes = [comm.Recv_init([self.msgs.recv[j], self.msgs.kind], first_worker + j, TAG_PUSH)
                       for j in range(self.W)]
        self._done = [np.empty(1) for _ in range(self.W)]
        self.dones = [comm.Irecv([self._done[j], MPI.DOUBLE], first_worker + j, TAG_DONE)
                      for j in range(self.W)]
        self.replies = [MPI.REQUEST_NULL] * self.W
        self.active = np.ones(self.W, bool)
        self.steps = np.zeros(self.W, np.int64)  # pushes taken per worker
        self.st = ServerStats(staleness=[[] for _ in range(self.W)], step_gap=[[] for _ in range(self.W)])
        self.refused_in_a_row = 0
        MPI.Prequest.Startall(self.pushes)

    # -- the loop --------------------------------------------------------------------

    def serve(self, policy: Policy) -> ServerStats:
        """Answer pushes as `policy` says until every worker has sent its end-of-work message."""
        requests = self.pushes + self.dones
        while self.active.any():
            self.clock.switch("idle")
            i = self.waiter.any(requests, lambda: "a push from any of the worker ranks "
                                f"{[self.first + j for j in np.flatnonzero(self.active)]}")
            self.clock.switch("aggregate")
            if i >= self.W:  # a done arrives only after its sender took the reply to its last push
                self.active[i - self.W] = False
                self.st.bytes_recv += DONE_BYTES
            else:
                self.handle(i, policy)
            for j in policy.answerable(self):
                self.reply(j)
        self.st.stopped = self.stopping or self.ep.stop_requested()
        return self.finish()

    def handle(self, j: int, policy: Policy) -> None:
        """Worker j's push has arrived: account for it, then the policy applies or holds it."""
        head = self.msgs.header(j)
        version, loss_sum, m, step = head[P_VERSION], head[P_LOSS], head[P_SAMPLES], int(head[P_STEP])
        self.stopping |= bool(head[P_STOP]) or self.ep.stop_requested()
        nbytes = self.msgs.push_nbytes
        self.clock.step = step  # the trace window counts worker steps
        self.clock.message(RECV, self.first + j, nbytes, flow_id(self.first + j, self.comm.rank, step, False))
        self.st.staleness[j].append(self.st.rounds - int(version))
        self.st.updates += 1
        self.st.bytes_recv += nbytes
        self.steps[j] += 1
        dw = self.msgs.delta(j)
        if not self.acceptable(j, dw, loss_sum):
            dw, loss_sum, m = None, 0.0, 0.0  # a refused update adds no samples to the progress
        policy.take(self, j, dw, loss_sum, m)

    def apply(self, d: np.ndarray | None) -> None:
        """The optimizer moves my shard along d (None: a refused update, nothing moves)."""
        if d is not None:
            self.optimizer.step(self.w, d)

    def new_version(self, loss_sum: float, samples: float) -> None:
        """The shard has a new version; count it, report the samples it took in."""
        self.st.rounds += 1
        self.on_version(self.st.rounds, loss_sum, samples)  # a checkpoint's progress then matches its weights

    def acceptable(self, j: int, dw: np.ndarray, loss_sum: float) -> bool:
        """False for a Delta-w or loss with NaN or inf: refused (not applied) and counted;
        DIVERGED_AFTER of them in a row stop the job."""
        if kernels.all_finite(dw) and math.isfinite(loss_sum):
            self.refused_in_a_row = 0
            return True
        self.st.refused += 1
        self.refused_in_a_row += 1
        if self.refused_in_a_row >= DIVERGED_AFTER:
            raise DivergenceError(
                f"server rank {self.comm.rank} refused {self.refused_in_a_row} updates in a row with NaN "
                f"or inf values (the last from worker rank {self.first + j}): training diverged; "
                "lower --lr")
        return False

    def reply(self, j: int) -> None:
        """Send worker j the current shard, then re-arm its receive."""
        if self.replies[j] != MPI.REQUEST_NULL:  # the previous reply: done long ago in practice
            self.waiter.all([self.replies[j]], f"worker rank {self.first + j} to take its previous reply")
        out, head = self.msgs.reply(j, self.w)
        head[R_VERSION], head[R_STOP] = self.st.rounds, self.stopping
        self.replies[j] = self.comm.Isend([out, self.msgs.kind], self.first + j, TAG_PULL)
        step = int(self.msgs.header(j)[P_STEP])
        nbytes = self.msgs.pull_nbytes
        self.clock.message(SEND, self.first + j, nbytes, flow_id(self.first + j, self.comm.rank, step, True))
        self.st.bytes_sent += nbytes
        self.pushes[j].Start()

    def gap(self, j: int) -> int:
        """How many steps worker j is ahead of the slowest active worker."""
        return int(self.steps[j] - self.steps[self.active].min()) if self.active.any() else 0

    def finish(self) -> ServerStats:
        self.clock.switch("idle")
        self.waiter.all(self.dones, "every worker's end-of-work message")
        for p in self.pushes:  # every worker is done: withdraw the receives still posted
            p.Cancel()
            p.Wait()
            p.Free()
        self.waiter.all(self.replies, "workers to take their last replies")
        return self.st


# -- reply policies: what to apply, and whom to answer --------------------------------

class Policy:
    def take(self, srv: Server, j: int, dw: np.ndarray | None, loss_sum: float, m: float) -> None:
        """Worker j's accounted push (dw None: refused)."""
        raise NotImplementedError

    def answerable(self, srv: Server) -> list[int]:
        """Workers to answer now (each has a push taken and not yet answered)."""
        raise NotImplementedError


class Async(Policy):
    """Apply each Delta-w as it arrives; answer at once."""

    def __init__(self):
        self.ready: list[int] = []

    def take(self, srv, j, dw, loss_sum, m):
        srv.apply(dw)
        srv.new_version(loss_sum, m)
        srv.st.step_gap[j].append(srv.gap(j))
        self.ready.append(j)

    def answerable(self, srv):
        ready, self.ready = self.ready, []
        return ready


class SSP(Async):
    """Async, but a worker's answer waits while its next push would be more than K steps
    ahead of the slowest active worker; a retiring worker can release the others."""

    def __init__(self, K: int):
        super().__init__()
        self.K = K
        self.held: list[int] = []

    def answerable(self, srv):
        self.held += super().answerable(srv)
        slowest = srv.steps[srv.active].min() if srv.active.any() else 0
        go = [j for j in self.held if not srv.active.any() or srv.steps[j] + 1 - slowest <= self.K]
        self.held = [j for j in self.held if j not in go]
        return go


class Sync(Policy):
    """Rounds: every active worker's push, their sample-weighted mean (summed in worker
    order, whatever the arrival order: deterministic) applied once, every worker answered."""

    def __init__(self):
        self.pending: dict[int, tuple] = {}
        self.mean: np.ndarray | None = None

    def take(self, srv, j, dw, loss_sum, m):
        self.pending[j] = (dw, loss_sum, m)

    def answerable(self, srv):
        if not self.pending or any(srv.active[j] and j not in self.pending for j in range(srv.W)):
            return []
        total = sum(m for _, _, m in self.pending.values())
        if self.mean is None:
            self.mean = np.empty_like(srv.w)
        self.mean[:] = 0.0
        for j in sorted(self.pending):
            dw, _, m = self.pending[j]
            if m:
                kernels.add_scaled(self.mean, dw, m / total)
            srv.st.step_gap[j].append(0)
        if total:
            srv.apply(self.mean)
        srv.new_version(sum(ls for _, ls, _ in self.pending.values()), total)
        ready, self.pending = sorted(self.pending), {}
        return ready


def policy(mode: str, staleness: int) -> Policy:
    """The reply policy of asgd.train's --mode."""
    return {"async": Async, "ssp": lambda: SSP(staleness), "sync": Sync}[mode]()


def gather_shards(ep: Endpoint, w: np.ndarray, servers: int) -> tuple[int, int]:
    """After serving: the other servers send their shards of w to rank 0, which then
    holds all of w (to evaluate and save it). Returns this rank's (sent, received) bytes."""
    if servers < 2:
        return 0, 0
    comm = ep.comm
    shards = shard_bounds(len(w), servers)
    if comm.rank == 0:
        reqs = [comm.Irecv(w[a:b], s, TAG_SHARD) for s, (a, b) in enumerate(shards) if s]
        moved = (0, DOUBLE * sum(b - a for a, b in shards[1:]))
    else:
        lo, hi = shards[comm.rank]
        reqs = [comm.Isend(w[lo:hi], 0, TAG_SHARD)]
        moved = (DOUBLE * (hi - lo), 0)
    ep.waiter.all(reqs, "the servers' final shards")
    return moved
