"""The worker's side of the protocol, written once and with no I/O in it: the loop of a
parameter-server (or p2p) worker and of an allreduce rank, over pieces its transport
injects (protocol.worker and protocol.allreduce over MPI; sim.links in the simulator):

  link     the exchange with the servers: delta() the buffer to write Delta-w into
           (stamping it with the versions of w it comes from); push_pull(dw, loss_sum,
           samples, stop) sends it and returns a ticket; wait(ticket) completes that
           exchange; close() sends the end-of-work message and returns the `stats`
           (WorkerStats). It says `step` (the next push's number), `versions` (each
           server's last reply's), told_to_stop and asked_to_stop (what the replies said).
  compute  compute(batch, dw) -> mean loss: one step on the batch's m > 0 points, its
           Delta-w written into dw; empty(dw) for a batch of none (zero_delta).
  clock    switch(phase) and `step` (the trace window counts steps); now() the seconds
           the overlap rule compares.
  plan     the Schedule (core.schedule): the batches, the overlap, open-ended epochs.

With overlap (async and ssp) batch k+1 is computed while batch k's exchange is in
flight, one exchange outstanding at most, as long as OverlapRule allows; without it
(sync) each push is waited for, so every step starts from the same w on every worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .schedule import OverlapRule, Schedule


@dataclass
class WorkerStats:
    updates: int = 0
    samples: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    stopped: bool = False  # ended early on a stop request
    refused: int = 0       # allreduce: summed updates with NaN or inf, not applied
    waited: int = 0        # exchanges waited for before the next step (sync: all; OverlapRule)

    def record(self) -> dict:
        """This worker's entry of results.json's `ranks` (train.py adds the rest)."""
        return {"role": "worker", "updates": self.updates, "bytes_sent": self.bytes_sent,
                "bytes_recv": self.bytes_recv, "stopped": self.stopped, "refused": self.refused,
                "waited": self.waited}


def _never() -> bool:
    return False


def zero_delta(dw: np.ndarray) -> float:
    """An empty batch (sync's last ones, on a short share): a zero Delta-w of weight 0,
    pushed all the same, keeps the workers in step. Its loss: 0."""
    dw[:] = 0.0
    return 0.0


def loop(link, compute, clock, plan: Schedule, n: int, stop_requested=_never, now=time.perf_counter,
         empty=zero_delta, epoch_end=None) -> WorkerStats:
    """Train a share of n points through `link` as `plan` says. A stop ends the loop at a
    step boundary, the exchange in flight completed and `done` sent all the same: at once
    in async/ssp when stop_requested() (this rank's signal); after the exchange whose
    reply says so in every mode (in sync, the same round on every worker). The stop
    request also rides in every push. epoch_end(epoch): after each epoch, with no
    exchange in flight (the simulator's CNTK: every worker meets the others)."""
    ticket, stop = None, False
    rule = OverlapRule(plan.overlap, plan.adaptive)
    for epoch in plan.epoch_numbers():
        for batch in plan.batches(n, epoch):
            stop = stop or (plan.overlap and stop_requested())
            if stop:
                break
            clock.step = link.step   # the trace window counts steps
            clock.switch("compute")
            t0 = now()
            m = len(batch)
            dw = link.delta()
            loss = compute(batch, dw) if m else empty(dw)
            t1 = now()
            if ticket is not None:   # the exchange ran beside this step
                clock.switch("comm_wait")
                _complete(link, ticket, plan)
                rule.saw(t1 - t0, now() - t0)
            clock.switch("push")
            ticket = link.push_pull(dw, loss * m, m, stop=stop_requested())
            if not rule.on:
                clock.switch("comm_wait")
                t2 = now()
                _complete(link, ticket, plan)
                ticket = None
                link.stats.waited += 1
                rule.saw(t1 - t0, now() - t2)
            stop = link.told_to_stop
        if stop:
            break
        if epoch_end is not None:
            if ticket is not None:
                clock.switch("comm_wait")
                _complete(link, ticket, plan)
                ticket = None
            clock.switch("comm_wait")
            epoch_end(epoch)
    if ticket is not None:
        clock.switch("comm_wait")
        _complete(link, ticket, plan)
    link.stats.stopped = stop_requested() or link.asked_to_stop   # early, not because the epochs are done
    return link.close()


def _complete(link, ticket: int, plan: Schedule) -> None:
    """Wait for exchange `ticket`. Open-ended (sync with backup workers), my next push is
    numbered by the servers' round, so a worker whose push came too late catches up."""
    link.wait(ticket)
    if plan.open_ended:
        link.step = max([link.step, *map(int, link.versions)])


def allreduce_loop(reducer, compute, clock, plan: Schedule, n: int, stop_requested=_never,
                   empty=zero_delta) -> WorkerStats:
    """An allreduce rank's loop: each step compute Delta-w on m points, sum
    [m * Delta-w | m, loss_sum, stop] with the other ranks (reducer.sum(dw, loss_sum, m,
    stop)), then reducer.apply(m) applies the sample-weighted mean (and counts it in
    reducer.stats), or refuses a sum with NaN or inf (False). A stop asked on any rank
    rides in the sum (reducer.told_to_stop), and so does a run done early (a target
    reached: told, not asked_to_stop): every rank stops after the same step."""
    st = reducer.stats
    for epoch in plan.epoch_numbers():
        for batch in plan.batches(n, epoch):
            clock.step = st.updates
            clock.switch("compute")
            m = len(batch)
            dw = reducer.delta()
            loss = compute(batch, dw) if m else empty(dw)
            clock.switch("comm_wait")
            reducer.sum(dw, loss * m, m, stop_requested())
            clock.switch("aggregate")
            if reducer.apply(m) and reducer.told_to_stop:
                st.stopped = reducer.asked_to_stop   # early, not because the run is done
                return st
    return st
