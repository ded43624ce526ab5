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

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import kernels
from .comm import PULL_HEADER, PUSH_HEADER, TAG_DONE, TAG_PULL, TAG_PUSH, Waiter
from .progress import EpochTracker
from .trace import RECV, SEND, PhaseClock


@dataclass
class ServerStats:
    updates: int = 0   # Delta-w received and applied (requests)
    rounds: int = 0    # versions of the shard (= updates, except in sync)
    bytes_sent: int = 0
    bytes_recv: int = 0
    staleness: list = field(default_factory=list)  # per worker: applied Delta-w's staleness
    step_gap: list = field(default_factory=list)   # per worker: steps ahead of the slowest


class Server:
    def __init__(self, comm: MPI.Comm, w: np.ndarray, first_worker: int, waiter: Waiter,
                 clock: PhaseClock, tracker: EpochTracker | None):
        self.comm, self.w, self.waiter, self.clock, self.tracker = comm, w, waiter, clock, tracker
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
        MPI.Prequest.Startall(self.pushes)

    def take(self, j: int) -> tuple[np.ndarray, float, float]:
        """Account for worker j's completed push; returns (Delta-w, loss_sum, samples)."""
        buf, n = self.recv[j], len(self.w)
        version, loss_sum, m, step = buf[n], buf[n + 1], buf[n + 2], int(buf[n + 3])
        self.clock.step = step  # the trace window counts worker steps
        self.clock.message(RECV, self.first + j, buf.nbytes, self.first + j, step, False)
        self.st.staleness[j].append(self.st.rounds - int(version))
        self.st.updates += 1
        self.st.bytes_recv += buf.nbytes
        return buf[:n], loss_sum, m

    def reply(self, j: int) -> None:
        """Send worker j the current shard, then re-arm its receive."""
        if self.replies[j] != MPI.REQUEST_NULL:  # the previous reply: done long ago in practice
            self.waiter.all([self.replies[j]], f"worker rank {self.first + j} to take its previous reply")
        out, n = self.send[j], len(self.w)
        out[:n] = self.w
        out[n] = self.st.rounds
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
            i = self.waiter.any(requests, "a push from any worker")
            self.clock.switch("aggregate")
            if i >= W:  # a done arrives only after its sender got the reply to its last push
                active[i - W] = False
            else:
                dw, loss_sum, m = self.take(i)
                kernels.add_into(self.w, dw)
                self.st.rounds += 1
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
            self.waiter.all(self.pushes, f"every worker's push of round {r}")
            self.clock.switch("aggregate")
            taken = [self.take(j) for j in range(self.W)]
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
        return self.finish()
