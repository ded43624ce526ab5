"""The parameter server loop: apply each worker's Delta-w as it arrives, answer with w'.

One persistent receive stays posted per worker; whichever completes first is applied
(asynchronous: no barrier between workers) and answered from that worker's own send
buffer, since w keeps changing while the reply is in flight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from mpi4py import MPI

from .comm import PULL_HEADER, PUSH_HEADER, TAG_DONE, TAG_PULL, TAG_PUSH, Waiter
from .trace import RECV, SEND, PhaseClock


@dataclass
class ServerStats:
    updates: int = 0
    samples: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    history: list = field(default_factory=list)  # one dict per epoch
    # per worker (index = worker rank - 1)
    worker_updates: np.ndarray = None
    stale_sum: np.ndarray = None
    stale_max: np.ndarray = None


@dataclass
class EpochTracker:
    """Turns the stream of applied updates into epochs (n_train samples each) and
    progress lines; the server loop only calls `add`."""
    n_train: int
    epochs: int
    evaluate: Callable[[], tuple[float, float]]  # held-out (loss, accuracy) of the current w
    report: Callable[[str], None]
    every_s: float
    clock: PhaseClock
    t_start: float = field(default_factory=time.perf_counter)
    epoch: int = 0
    loss_sum: float = 0.0
    loss_n: float = 0.0
    last_line: float = field(default_factory=time.perf_counter)

    def add(self, samples_total: int, loss_sum: float, m: float, history: list) -> None:
        self.loss_sum += loss_sum
        self.loss_n += m
        now = time.perf_counter()
        while self.epoch < self.epochs and samples_total >= (self.epoch + 1) * self.n_train:
            self.epoch += 1
            prev = self.clock.phase
            self.clock.switch("evaluate")
            test_loss, test_acc = self.evaluate()
            self.clock.switch(prev)
            elapsed = now - self.t_start
            h = {"epoch": self.epoch, "samples": samples_total, "time_s": round(elapsed, 4),
                 "train_loss": self.loss_sum / max(self.loss_n, 1),
                 "test_loss": test_loss, "test_accuracy": test_acc}
            history.append(h)
            self.report(f"epoch {self.epoch}/{self.epochs}  samples {samples_total:>9,}  "
                        f"train loss {h['train_loss']:.4f}  held-out loss {test_loss:.4f} "
                        f"acc {test_acc:.4f}  {samples_total / max(elapsed, 1e-9):>9,.0f} samples/s  "
                        f"{elapsed:6.1f} s")
            self.loss_sum = self.loss_n = 0.0
            self.last_line = now
        if now - self.last_line >= self.every_s:
            self.last_line = now
            done = samples_total - self.epoch * self.n_train
            self.report(f"  epoch {self.epoch + 1}: {done:,}/{self.n_train:,} samples  "
                        f"train loss {self.loss_sum / max(self.loss_n, 1):.4f}  "
                        f"{samples_total / max(now - self.t_start, 1e-9):,.0f} samples/s")


def run_server(comm: MPI.Comm, w: np.ndarray, add_into, tracker: EpochTracker,
               waiter: Waiter, clock: PhaseClock) -> ServerStats:
    """Serve until every worker has said it is done; w is updated in place."""
    n_w, n_workers = len(w), comm.size - 1
    st = ServerStats(worker_updates=np.zeros(n_workers, np.int64),
                     stale_sum=np.zeros(n_workers, np.int64), stale_max=np.zeros(n_workers, np.int64))
    recv = [np.empty(n_w + PUSH_HEADER) for _ in range(n_workers)]
    send = [np.empty(n_w + PULL_HEADER) for _ in range(n_workers)]
    done = [np.empty(1) for _ in range(n_workers)]
    pushes = [comm.Recv_init([recv[i], MPI.DOUBLE], i + 1, TAG_PUSH) for i in range(n_workers)]
    MPI.Prequest.Startall(pushes)
    dones = [comm.Irecv([done[i], MPI.DOUBLE], i + 1, TAG_DONE) for i in range(n_workers)]
    # A done arrives only after its sender got the reply to its last push: none is lost.
    requests = pushes + dones
    replies = [MPI.REQUEST_NULL] * n_workers
    version = finished = 0
    while finished < n_workers:
        clock.switch("idle")
        i = waiter.any(requests, "a push from any worker")
        clock.switch("aggregate")
        if i >= n_workers:
            finished += 1
            continue
        buf = recv[i]
        v_push, loss_sum, m, wstep = buf[n_w], buf[n_w + 1], buf[n_w + 2], int(buf[n_w + 3])
        clock.step = wstep  # the trace window counts worker steps
        clock.message(RECV, i + 1, buf.nbytes, i + 1, wstep, False)
        add_into(w, buf[:n_w])
        stale = version - int(v_push)
        version += 1
        if replies[i] != MPI.REQUEST_NULL:  # the previous reply to i: done long ago in practice
            waiter.all([replies[i]], f"worker rank {i + 1} to take its previous reply")
        out = send[i]
        out[:n_w] = w
        out[n_w] = version
        replies[i] = comm.Isend([out, MPI.DOUBLE], i + 1, TAG_PULL)
        clock.message(SEND, i + 1, out.nbytes, i + 1, wstep, True)
        pushes[i].Start()
        st.updates += 1
        st.samples += int(m)
        st.bytes_recv += buf.nbytes
        st.bytes_sent += out.nbytes
        st.worker_updates[i] += 1
        st.stale_sum[i] += stale
        st.stale_max[i] = max(st.stale_max[i], stale)
        tracker.add(st.samples, loss_sum, m, st.history)
    clock.switch("idle")
    for p in pushes:  # every worker is done: withdraw the receives still posted
        p.Cancel()
        p.Wait()
        p.Free()
    waiter.all(replies, "workers to take their last replies")
    return st
