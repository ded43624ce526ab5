"""The parameter server loop: apply workers' Delta-w to my shard, answer with w'.

One persistent receive stays posted per worker. Replies go out of that worker's own
send buffer, since the shard keeps changing while a reply is in flight.
  async  apply each Delta-w as it arrives and answer at once (the paper's ASGD).
  ssp    the same, but hold the answer while the worker's next push would put it more
         than K steps ahead of the slowest active worker (stale-synchronous parallel).
  sync   rounds: wait for every worker's push, apply their sample-weighted mean once,
         in worker order (deterministic), then answer everyone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..net import kernels
from ..run import signals
from ..run.progress import EpochTracker
from ..run.trace import RECV, SEND, PhaseClock
from .comm import PULL_HEADER, PUSH_HEADER, TAG_DONE, TAG_PULL, TAG_PUSH, Waiter


@dataclass
class ServerStats:
    updates: int = 0   # Delta-w received and applied (requests)
    rounds: int = 0    # versions of the shard (= updates, except in sync)
    bytes_sent: int = 0
    bytes_recv: int = 0
    staleness: list = field(default_factory=list)  # per worker: applied Delta-w's staleness
    step_gap: list = field(default_factory=list)   # per worker: steps ahead of the slowest
    refused: int = 0   # Delta-w with NaN or inf, not applied


DIVERGED_AFTER = 10  # refused Delta-w in a row that end the job


class DivergenceError(RuntimeError):
    """Training produced NaN or inf again and again: the learning rate is too high."""


class Server:
    def __init__(self, comm: MPI.Comm, w: np.ndarray, first_worker: int, waiter: Waiter,
                 clock: PhaseClock, tracker: EpochTracker | None, on_update=None):
        """on_update(rounds): called after each new version of the shard (checkpoints)."""
        self.comm, self.w, self.waiter, self.clock, self.tracker = comm, w, waiter, clock, tracker
        self.on_update = on_update or (lambda rounds: None)
        self.stopping = False  # a stop request: replies tell the workers to stop
        self.first, self.W, n = first_worker, comm.size - first_worker, len(w)
        self.recv = [np.empty(n + PUSH_HEADER) for _ in range(self.W)]
        self.send = [np.empty(n + PULL_HEADER) for _ in range(self.W)]
        self.pushes = [comm.Recv_init([self.recv[j], MPI.DOUBLE], first_worker + j, TAG_PUSH)
                       for j in range(self.W)]
        self._done = [np.empty(1) for _ in range(self.W)]
        self.dones = [comm.Irecv([self._done[j], MPI.DOUBLE], first_worker + j, TAG_DONE)
                      for j in range(self.W)]
        self.replies = [MPI.REQUEST_NULL] * self.W
        self.st = ServerStats(staleness=[[] for _ in range(self.W)], step_gap=[[] for _ in range(self.W)])
        self.refused_in_a_row = 0
        MPI.Prequest.Startall(self.pushes)

    def take(self, j: int) -> tuple[np.ndarray, float, float]:
        """Account for worker j's completed push; returns (Delta-w, loss_sum, samples)."""
        buf, n = self.recv[j], len(self.w)
        version, loss_sum, m, step = buf[n], buf[n + 1], buf[n + 2], int(buf[n + 3])
        self.stopping |= bool(buf[n + 4]) or signals.requested() is not None
        self.clock.step = step  # the trace window counts worker steps
        self.clock.message(RECV, self.first + j, buf.nbytes, self.first + j, step, False)
        self.st.staleness[j].append(self.st.rounds - int(version))
        self.st.updates += 1
        self.st.bytes_recv += buf.nbytes
        return buf[:n], loss_sum, m

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
        out, n = self.send[j], len(self.w)
        out[:n] = self.w
        out[n] = self.st.rounds
        out[n + 1] = self.stopping
        self.replies[j] = self.comm.Isend([out, MPI.DOUBLE], self.first + j, TAG_PULL)
        self.clock.message(SEND, self.first + j, out.nbytes, self.first + j,
                           int(self.recv[j][n + 3]), True)
        self.st.bytes_sent += out.nbytes
        self.pushes[j].Start()

    def finish(self) -> ServerStats:
        self.clock.switch("idle")
        self.waiter.all(self.dones, "every worker's end-of-work message")
        for p in self.pushes:  # every worker is done: withdraw the receives still posted
            p.Cancel()
            p.Wait()
            p.Free()
        self.waiter.all(self.replies, "workers to take their last replies")
        return self.st

    def serve_async(self, staleness_bound: int | None = None) -> ServerStats:
        """async (no bound) or ssp (staleness_bound = K)."""
        W, K = self.W, staleness_bound
        requests = self.pushes + self.dones
        active = np.ones(W, bool)
        steps = np.zeros(W, np.int64)  # pushes applied per worker
        held: set[int] = set()

        def may_reply(j: int) -> bool:  # j's next push would be at most K ahead of the slowest
            return K is None or steps[j] + 1 - steps[active].min() <= K
        while active.any():
            self.clock.switch("idle")
            i = self.waiter.any(requests, lambda: "a push from any of the worker ranks "
                                f"{[self.first + j for j in np.flatnonzero(active)]}")
            self.clock.switch("aggregate")
            if i >= W:  # a done arrives only after its sender got the reply to its last push
                active[i - W] = False
            else:
                dw, loss_sum, m = self.take(i)
                if self.acceptable(i, dw, loss_sum):
                    kernels.add_into(self.w, dw)
                else:
                    loss_sum = m = 0  # a refused update adds no samples to the progress
                self.st.rounds += 1
                self.on_update(self.st.rounds)
                steps[i] += 1
                self.st.step_gap[i].append(int(steps[i] - steps[active].min()))
                if may_reply(i):
                    self.reply(i)
                else:
                    held.add(i)
                if self.tracker:
                    self.tracker.add(loss_sum, m)
            for j in [j for j in held if not active.any() or may_reply(j)]:
                held.discard(j)
                self.reply(j)
        return self.finish()

    def serve_sync(self, rounds: int) -> ServerStats:
        """`rounds` rounds of: every worker's push, one averaged update, every reply."""
        for r in range(rounds):
            self.clock.switch("idle")
            self.waiter.all(self.pushes, lambda: f"the pushes of round {r} from worker ranks "
                            f"{[self.first + j for j, p in enumerate(self.pushes) if not p.Test()]}")
            self.clock.switch("aggregate")
            taken = [self.take(j) for j in range(self.W)]
            taken = [t if self.acceptable(j, t[0], t[1]) else (t[0], 0.0, 0.0) for j, t in enumerate(taken)]
            total = sum(m for _, _, m in taken)
            for dw, _, m in taken:  # in worker order, whatever the arrival order: deterministic
                if m:
                    kernels.add_scaled(self.w, dw, m / total)
            self.st.rounds += 1
            for j in range(self.W):
                self.st.step_gap[j].append(0)
                self.reply(j)
            if self.tracker:
                self.tracker.add(sum(ls for _, ls, _ in taken), total)
            self.on_update(self.st.rounds)
            if self.stopping:  # every worker was told in this round's reply
                break
        return self.finish()
