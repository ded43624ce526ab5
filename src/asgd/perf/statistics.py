"""Statistical efficiency: how many epochs a configuration needs to reach a held-out target.

The hardware model (asgd.perf.analytic, architectures) predicts the seconds of an epoch;
this module predicts the epochs, from what `python -m asgd.perf pilot` measured on the
user's data (its `statistics` in params.json), so that time to a target is

    init + epochs_to_target(config) x seconds per epoch.

The form, and its anchors (docs/model.md, "Time to a target"):
  - batch: McCandlish et al. 2018's E = E_min (1 + B / B_noise), in samples, with the
    simple noise scale B_noise = tr(Sigma) / |G|^2 estimated from gradient norms at two
    batch sizes (their appendix A.1);
  - staleness: each update's progress divided by (1 + c x mean staleness), as in Zhang et
    al. 2016's staleness-aware SGD and Dutta et al. 2018's error-runtime trade-off, with c
    fitted to short asynchronous pilots; lockstep runs (sync, allreduce) have staleness 0
    and a batch of every replica's samples;
  - the optimizer and its learning rate: E_min comes from a sequential reference run with
    that optimizer at asgd.train's default lr, read off its held-out curve at the target.
Pure functions of numbers and of results.json's dicts: no I/O, no MPI.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class NoPilot(ValueError):
    """The statistics cannot answer: no pilot of this optimizer, or a target past its curve."""


# -- the gradient noise scale (McCandlish et al. 2018, appendix A.1) ------------------------

def noise_scale(g2_small: float, b_small: float, g2_big: float, b_big: float) -> tuple[float, float, float]:
    """(B_noise, |G|^2, tr Sigma) from the mean squared norms of gradients averaged over
    batches of b_small and of b_big samples, since E|G_B|^2 = |G|^2 + tr(Sigma) / B:
        |G|^2    = (b_big |G_big|^2 - b_small |G_small|^2) / (b_big - b_small)
        tr Sigma = (|G_small|^2 - |G_big|^2) / (1 / b_small - 1 / b_big)
    Each is unbiased; their ratio is B_simple, which McCandlish et al. find close to the
    noise scale that sets E(B) (B_noise: inf where the mean gradient is lost in the noise)."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small}, {b_big}")
    g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    trace = (g2_small - g2_big) / (1 / b_small - 1 / b_big)
    return (trace / g2 if g2 > 0 else math.inf), g2, trace


def mean_sq_norm(gradients: np.ndarray) -> float:
    """Mean of |g|^2 over the rows of `gradients` (one gradient per row)."""
    return float(np.mean(np.einsum("ij,ij->i", gradients, gradients)))


# -- epochs to a target ----------------------------------------------------------------------

def batch_factor(batch: float, b_noise: float) -> float:
    """McCandlish et al.'s E / E_min = 1 + B / B_noise: the samples a batch of B needs
    to reach a target, over the least any batch needs (B -> 0)."""
    return 1.0 + batch / b_noise


def staleness_factor(mean_staleness: float, c: float) -> float:
    """The samples an update of mean staleness s needs, over a fresh one's: 1 + c s
    (each stale update makes 1 / (1 + c s) of a fresh one's progress)."""
    return 1.0 + c * max(mean_staleness, 0.0)


def fit_staleness_cost(ratios: list[float], staleness: list[float], reference_staleness: float) -> float:
    """c of staleness_factor, least squares, from pilots at the reference's batch: run i
    needed ratios[i] times the reference's samples at mean staleness staleness[i], where
    the model says ratio = (1 + c s_i) / (1 + c s_ref). The residual r_i (1 + c s_ref) -
    (1 + c s_i) is linear in c. Never negative: staleness does not help."""
    num = sum((r - 1) * (s - r * reference_staleness) for r, s in zip(ratios, staleness))
    den = sum((s - r * reference_staleness) ** 2 for r, s in zip(ratios, staleness))
    return max(num / den, 0.0) if den > 0 else 0.0


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
        return s / self.points / (batch_factor(self.batch, b_noise) * staleness_factor(self.staleness, c))


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

    @classmethod
    def from_dict(cls, d: dict) -> Statistics:
        refs = {k: Reference(**v) for k, v in d["references"].items()}
        return cls(b_noise=d["b_noise"], staleness_cost=d["staleness_cost"], staleness_one=d["staleness_one"],
                   staleness_per_worker=d["staleness_per_worker"], references=refs,
                   data=d.get("data", "embedded"), hidden=d.get("hidden", 0))

    def mean_staleness(self, workers: int, mode: str, lockstep: bool, bound: int | None = None) -> float:
        """A configuration's mean staleness: 0 in lockstep; asynchronous: the pilots' line in
        the workers; ssp: at most its bound."""
        if lockstep:
            return 0.0
        s = self.staleness_one + self.staleness_per_worker * (workers - 1)
        return min(s, bound) if mode == "ssp" and bound is not None else s

    def epochs_to_target(self, optimizer: str, metric: str, value: float, batch: int, replicas: int,
                         lockstep: bool, mean_staleness: float) -> float:
        """E(config) = E_min(target, optimizer) x (1 + B / B_noise) x (1 + c s): B is one
        update's samples (every replica's in lockstep), s its mean staleness."""
        ref = self.references.get(optimizer)
        if ref is None:
            raise NoPilot(f"no pilot of --optimizer {optimizer} (piloted: {', '.join(self.references)}): "
                          f"python -m asgd.perf pilot --optimizers {optimizer}")
        e_min = ref.epochs_min(metric, value, self.b_noise, self.staleness_cost)
        update = batch * replicas if lockstep else batch
        return e_min * batch_factor(update, self.b_noise) * staleness_factor(mean_staleness, self.staleness_cost)
