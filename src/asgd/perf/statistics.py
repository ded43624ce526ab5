"""Statistical efficiency: how many epochs a configuration needs to reach a held-out target.

The hardware model (asgd.perf.analytic, architectures) predicts the seconds of an epoch;
this module predicts the epochs, from what `python -m asgd.perf pilot` measured on the
user's data (its `statistics` in params.json), so that time to a target is

    init + epochs_to_target(config) x seconds per epoch.

The form, and its anchors (docs/model.md, "Time to a target"):
  - batch: McCandlish et al. 2018's E = E_min (1 + U / B_noise), U the samples an update
    carries (the batch, or less where a worker's share ends an epoch), B_noise fitted to
    the epochs sequential pilots at several batches took (as Omnivore and Pollux measure
    statistical efficiency with short runs), not read off gradient norms: asgd trains at
    a fixed lr, which McCandlish et al.'s noise scale, tuned lr at every batch, assumes not;
  - staleness: each update's progress divided by (1 + c x mean staleness), as in Zhang et
    al. 2016's staleness-aware SGD and Dutta et al. 2018's error-runtime trade-off, with c
    fitted with B_noise to the same pilots; lockstep runs (sync, allreduce) have staleness
    0 and every replica's samples an update;
  - the optimizer and its learning rate: E_min comes from a sequential reference run with
    that optimizer at asgd.train's default lr, read off its held-out curve at the target.
Pure functions of numbers and of results.json's dicts: no I/O, no MPI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..net.optimizers import default_lr


class NoPilot(ValueError):
    """The statistics cannot answer: no pilot of this optimizer, or a target past its curve."""


# -- epochs to a target ----------------------------------------------------------------------

def update_samples(points: int, replicas: int, batch: int, lockstep: bool, backup: int = 0) -> float:
    """The samples an update carries, over an epoch: each replica's share of the points
    (ceil(points / replicas)) goes in ceil(share / batch) steps, the last one short, so a
    batch past the share is the share; in lockstep an update is every replica's step but
    `backup` workers' (sync with backup workers: a round applies the first W - b pushes)."""
    share = math.ceil(points / replicas)
    return share / math.ceil(share / batch) * (replicas - backup if lockstep else 1)


def pooled_in_lockstep(optimizer: str) -> bool:
    """Whether a lockstep round of W replicas is one update of all their samples (adagrad,
    adam: the default lr is the same at any W) or, as far as w moves, W updates of one
    replica's (sgd, momentum: the default lr is W times, Goyal et al.'s linear scaling,
    so the mean of W gradients steps as far as their sum at one replica's lr)."""
    return default_lr(optimizer, 1, 2) == default_lr(optimizer, 1, 1)


def batch_factor(update: float, b_noise: float) -> float:
    """McCandlish et al.'s E / E_min = 1 + U / B_noise: the samples updates of U samples
    need to reach a target, over the least any batch needs (U -> 0)."""
    return 1.0 + update / b_noise


def staleness_factor(mean_staleness: float, c: float) -> float:
    """The samples an update of mean staleness s needs, over a fresh one's: 1 + c s
    (each stale update makes 1 / (1 + c s) of a fresh one's progress)."""
    return 1.0 + c * max(mean_staleness, 0.0)


PILOT_BATCHES = (32, 1024)                    # the pilot's sequential runs besides its reference: optimize's range
B_NOISE_GRID = np.geomspace(1.0, 1e6, 361)   # samples: from epochs near proportional to U to flat in U
COST_GRID = np.linspace(0.0, 2.0, 401)        # c: staleness never helps


def fit_efficiency(update: list[float], staleness: list[float], epochs: list[float],
                   costs: np.ndarray | list[float] = COST_GRID) -> tuple[float, float]:
    """(B_noise, c) from pilot runs to one target, run i with updates of update[i] samples
    at mean staleness staleness[i] needing epochs[i]: least squares in log epochs of
        log E_i = log E_min + log batch_factor(U_i, B_noise) + log staleness_factor(s_i, c)
    with E_min free (the mean residual). A grid, not a solver: a handful of runs, two
    bounded parameters, and no starting point to get wrong. Needs two update sizes.
    costs: the c to choose from (one: c known, B_noise alone fitted)."""
    u, s, e = (np.asarray(x, float) for x in (update, staleness, epochs))
    if len(set(u)) < 2:
        raise ValueError(f"the batch's effect needs runs at two update sizes, got {sorted(set(u))}")
    costs = np.asarray(costs, float)
    r = (np.log(e) - np.log1p(u / B_NOISE_GRID[:, None, None])
         - np.log1p(costs[None, :, None] * np.maximum(s, 0.0)))
    sse = ((r - r.mean(axis=-1, keepdims=True)) ** 2).sum(axis=-1)
    i, j = np.unravel_index(np.argmin(sse), sse.shape)
    return float(B_NOISE_GRID[i]), float(costs[j])


def fit_staleness_growth(workers: list[int], staleness: list[float]) -> tuple[float, float]:
    """(s_1, slope): an asynchronous run's mean staleness as s_1 + slope (W - 1), least
    squares over the pilots' worker counts (each update sees about the others' since it
    read w, and its own previous one with overlap)."""
    x = np.asarray(workers, float) - 1
    y = np.asarray(staleness, float)
    if len(set(workers)) < 2:
        return float(y.mean()), 0.0
    slope, s1 = np.polyfit(x, y, 1)
    return float(max(s1, 0.0)), float(max(slope, 0.0))


def mean_staleness(results: dict) -> float:
    """A run's workers' mean staleness, weighted by their updates (results.json's per rank,
    a real run's or asgd.sim's)."""
    ws = [r for r in results["ranks"] if r["role"] in ("worker", "peer") and "staleness" in r]
    n = [sum(r["staleness"]["histogram"]) for r in ws]
    return sum(r["staleness"]["mean"] * k for r, k in zip(ws, n)) / sum(n) if sum(n) else 0.0


def samples_to_target(curve: list[dict], metric: str, value: float) -> float | None:
    """Samples at the first point of a held-out curve (results.json's metrics.curve) that
    reaches the target, linearly interpolated from the point before; None if none does."""
    def reached(p):
        return p[metric] is not None and (p[metric] >= value if metric == "accuracy" else p[metric] <= value)
    before = {"samples": 0, metric: None}
    for p in curve:
        if reached(p):
            a, b = before[metric], p[metric]
            if a is None or a == b:
                return float(p["samples"])
            f = (value - a) / (b - a)
            return before["samples"] + min(max(f, 0.0), 1.0) * (p["samples"] - before["samples"])
        before = p
    return None


@dataclass(frozen=True)
class Reference:
    """A sequential pilot of one optimizer: its batch, mean staleness and held-out curve."""
    batch: int
    staleness: float
    points: int            # training points: samples per epoch
    curve: list

    def epochs_min(self, metric: str, value: float, b_noise: float, c: float) -> float:
        """E_min at this target, in epochs: the reference's epochs divided by its own batch
        and staleness factors."""
        s = samples_to_target(self.curve, metric, value)
        if s is None:
            best = max if metric == "accuracy" else min
            got = best((p[metric] for p in self.curve if p[metric] is not None), default=None)
            raise NoPilot(f"the pilot's reference never reached held-out {metric} {value:g} (best {got}): "
                          "run the pilot with this target (--target-accuracy/--target-loss) or more --epochs")
        own = batch_factor(update_samples(self.points, 1, self.batch, False), b_noise)
        return s / self.points / (own * staleness_factor(self.staleness, c))


@dataclass(frozen=True)
class Statistics:
    """What the pilot measured (params.json's `statistics`)."""
    b_noise: float
    staleness_cost: float              # c
    staleness_one: float               # an asynchronous run's mean staleness at one worker
    staleness_per_worker: float        # and its growth per worker more
    references: dict                   # [optimizer] Reference
    data: str = "embedded"
    hidden: int = 0
    b_noise_by_optimizer: dict = field(default_factory=dict)   # an optimizer piloted at two batches: its own

    @classmethod
    def from_dict(cls, d: dict) -> Statistics:
        refs = {k: Reference(**v) for k, v in d["references"].items()}
        return cls(b_noise=d["b_noise"], staleness_cost=d["staleness_cost"], staleness_one=d["staleness_one"],
                   staleness_per_worker=d["staleness_per_worker"], references=refs,
                   data=d.get("data", "embedded"), hidden=d.get("hidden", 0),
                   b_noise_by_optimizer=d.get("b_noise_by_optimizer", {}))

    def b_noise_of(self, optimizer: str) -> float:
        """The optimizer's B_noise where the pilot ran it at a second batch, else the first
        optimizer's: adam's step is normalized by its gradient's running scale, so more,
        smaller updates gain more than adagrad's (the tta bench's adam runs at batch 64
        needed 0.6-0.7x the epochs predicted with adagrad's B_noise, on digits and MNIST, 2026-11-28)."""
        return self.b_noise_by_optimizer.get(optimizer, self.b_noise)

    def mean_staleness(self, workers: int, mode: str, lockstep: bool, bound: int | None = None) -> float:
        """A configuration's mean staleness, in versions of w: 0 in lockstep; asynchronous:
        the pilots' line in the workers; ssp: one less (it applies a push before it answers,
        so a worker reads its own last update), and at most its bound of steps ahead of the
        slowest worker, which is bound x workers versions."""
        if lockstep:
            return 0.0
        s = self.staleness_one + self.staleness_per_worker * (workers - 1)
        if mode == "ssp":
            s = max(s - 1.0, 0.0)
            return min(s, bound * workers) if bound is not None else s
        return s

    def update_samples(self, optimizer: str, batch: int, replicas: int, lockstep: bool, backup: int = 0) -> float:
        """The samples an update carries as epochs_to_target prices it (update_samples on the
        pilot's data): a lockstep round pools its replicas' only where pooled_in_lockstep."""
        points = self.references[optimizer].points
        return update_samples(points, replicas, batch, lockstep and pooled_in_lockstep(optimizer), backup)

    def epochs_to_target(self, optimizer: str, metric: str, value: float, batch: int, replicas: int,
                         lockstep: bool, mean_staleness: float, backup: int = 0) -> float:
        """E(config) = E_min(target, optimizer) x (1 + U / B_noise) x (1 + c s): U is one
        update's samples (self.update_samples), s its mean staleness. Epochs count the
        samples applied, as the trainer's do (a backup worker's dropped pushes are not)."""
        ref = self.references.get(optimizer)
        if ref is None:
            raise NoPilot(f"no pilot of --optimizer {optimizer} (piloted: {', '.join(self.references)}): "
                          f"python -m asgd.perf pilot --optimizers {optimizer}")
        b_noise = self.b_noise_of(optimizer)
        e_min = ref.epochs_min(metric, value, b_noise, self.staleness_cost)
        update = self.update_samples(optimizer, batch, replicas, lockstep, backup)
        return e_min * batch_factor(update, b_noise) * staleness_factor(mean_staleness, self.staleness_cost)
