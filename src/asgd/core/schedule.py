"""When a worker steps: the schedule of its mini-batches (Schedule) and when it computes
beside its exchange in flight (OverlapRule). The worker's loop (core.worker), its MPI
and simulated transports and the model's queue (asgd.perf.analytic) all read these."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Schedule:
    """Which mini-batches a worker trains and how: epochs first_epoch..epochs-1, each a
    fresh permutation of its share seeded by (run seed, worker index, epoch), so a worker
    shuffles alike whatever its rank and a resumed run repeats none."""
    batch: int
    epochs: int
    seed: tuple[int, int]               # (run seed, worker index)
    lr: float                           # the step's: sgd's lr (it pushes Delta-w), else 1 (the gradient)
    first_epoch: int = 0
    steps_per_epoch: int | None = None  # sync and allreduce: the same number of steps on every worker
    overlap: bool = True                # async, ssp: compute batch k+1 while exchange k is in flight
    adaptive: bool = True               # ... only while exchanges are short against steps (OverlapRule)
    progress: bool = True               # the step tests the exchange in flight between its sample blocks
    open_ended: bool = False            # sync with backup workers: epochs on until the servers say the run's
    #                                     are done, each push numbered by the servers' round (core.worker)
    shuffle: bool = True                # False: batches in order (the simulator needs only their sizes)

    def epoch_numbers(self):
        """The epochs to train: first_epoch..epochs-1, or (open_ended) on until told to stop."""
        return itertools.count(self.first_epoch) if self.open_ended else range(self.first_epoch, self.epochs)

    def batches(self, n: int, epoch: int):
        """One epoch of index arrays into a share of n points. With steps_per_epoch,
        exactly that many, the last ones possibly short or empty, so every worker takes
        the same number of steps whatever the size of its share."""
        order = np.random.default_rng([*self.seed, epoch]).permutation(n) if self.shuffle else range(n)
        steps = self.steps_per_epoch if self.steps_per_epoch is not None else -(-n // self.batch)
        for k in range(steps):
            yield order[k * self.batch:(k + 1) * self.batch]


def lockstep(arch: str, mode: str) -> bool:
    """Every worker takes each step with the others: --mode sync, or an allreduce (which
    sums every replica's step, whatever --mode says)."""
    return mode == "sync" or arch == "allreduce"


def effective_mode(arch: str, mode: str) -> str:
    """The mode a run follows, as its reports name it: an allreduce's is sync."""
    return "sync" if arch == "allreduce" else mode


def schedule(arch: str, mode: str, overlap: str, batch: int, epochs: int, points: int, replicas: int,
             seed: tuple[int, int], lr: float, **rest) -> Schedule:
    """A worker's schedule as its run's options say (asgd.run.roles for a real run, the
    simulator for its own): sync and allreduce in lockstep, every worker as many steps
    as the largest share (of `points` among `replicas`) needs; async and ssp their own
    share's, computing beside the exchange unless --overlap off (only while it is
    short with auto). `rest`: Schedule's other fields."""
    together = lockstep(arch, mode)
    steps = math.ceil(math.ceil(points / replicas) / batch)
    return Schedule(batch, epochs, seed, lr, steps_per_epoch=steps if together else None,
                    overlap=not together and overlap != "off", adaptive=overlap == "auto", **rest)


class OverlapRule:
    """Whether the next step computes while this exchange is in flight (plan.overlap's
    modes only): yes while an exchange lasts under RATIO steps; no once one lasts more
    (then the step would hide at most 1/RATIO of the period, and cost a version of
    staleness); yes again once an exchange, waited for, lasts under RATIO / 2 steps (the
    gap keeps a rate near the limit from flipping the loop every step)."""
    RATIO = 8.0

    def __init__(self, allowed: bool, adaptive: bool = True):
        self.allowed = self.on = allowed
        self.adaptive = adaptive

    def saw(self, step_s: float, exchange_s: float) -> bool:
        """After a step of step_s, the exchange's length as seen (overlapping: the step it
        ran beside plus the wait after it; else the wait); returns `on` for the next step."""
        if self.allowed and self.adaptive:
            if self.on and exchange_s > self.RATIO * step_s:
                self.on = False
            elif not self.on and exchange_s < self.RATIO / 2 * step_s:
                self.on = True
        return self.on
