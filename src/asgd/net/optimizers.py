"""The optimizers a parameter server runs on its shard (and every allreduce rank on all
of w): what to do with an update direction d, and the state kept between updates.

    sgd       w += d                                  d = -lr * mean gradient (the worker applied lr)
    momentum  v = mu v + lr d;  w += v                d = -mean gradient
    adagrad   G += d^2;  w += lr d / (sqrt(G) + eps)
    adam      m, v: moving averages of d and d^2;  w += lr m^ / (sqrt(v^) + eps)

Workers send d: for sgd the Delta-w of their step (lr applied on the worker, the paper's
ASGD), for the others the negative mean gradient (their step with lr 1), and the server
applies lr. Keeping the state on the server, per shard, is how parameter servers in the
field do it (DistBelief's Downpour SGD ran Adagrad there; MXNet's kvstore and ps-lite let
the server own the optimizer): it sees every update, stale ones included.

An update (net.kernels) checks d for NaN and inf and writes the moved w into a buffer the
caller names (a server's next version of its shard): sgd in one pass; the others check
all of d first, then move their state in place in the pass that writes w (one state
buffer each, not a next one to swap in: fewer bytes per update). A refused d changes
nothing, and needs no undo.
"""

from __future__ import annotations

import math

import numpy as np

from . import OPTIMIZERS, kernels
MOMENTUM = 0.9
BETAS = (0.9, 0.999)
EPS = 1e-8


class Optimizer:
    """One optimizer's state for `size` parameters (a server's shard, or all of w), in
    `dtype`, w's (the run's precision)."""

    def __init__(self, name: str, lr: float, size: int, momentum: float = MOMENTUM, dtype=np.float64):
        if name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
        self.name, self.lr, self.mu = name, lr, momentum
        self.dtype = np.dtype(dtype)
        self.t = 0  # updates applied (Adam's bias correction counts them)
        shapes = {"sgd": (), "momentum": ("v",), "adagrad": ("g2",), "adam": ("m", "v")}[name]
        self.state = {k: np.zeros(size, self.dtype) for k in shapes}
        f = self.dtype.type   # the constants in w's dtype, made once: a push's update makes only its own
        self._mu, self._eps, self._betas = f(momentum), f(EPS), (f(BETAS[0]), f(BETAS[1]))
        self._scales = self._scalars = None   # the last update's (lr, scale, lr_scale) and their dtype scalars

    def update(self, w: np.ndarray, d: np.ndarray, out: np.ndarray | None, scale: float = 1.0,
               lr_scale: float = 1.0) -> bool:
        """out = w moved along scale * d with the learning rate times lr_scale (a stale
        update's smaller step: asgd.core.shard; for sgd, whose d carries the worker's lr,
        both scale d), and the state moved with it: False, with w, the state and t as they
        were (out is scratch), if d has NaN or inf. d is never written. out None moves w
        itself, only for a d known to be finite (sgd's one pass, finding a bad block late,
        would leave w partly moved): step()."""
        s, f = self.state, self.dtype.type   # scalars in w's dtype: see net.kernels
        if self._scales != (self.lr, scale, lr_scale):   # made again only when they change: ~0.2 us each
            self._scales = (self.lr, scale, lr_scale)
            self._scalars = f(self.lr * lr_scale), f(scale * lr_scale), f(scale)   # each rounded once
        lr, sgd_scale, scale = self._scalars
        if self.name == "sgd":
            ok = kernels.sgd_update(w, d, out, sgd_scale)
        elif self.name == "momentum":
            ok = kernels.momentum_update(w, s["v"], d, out, lr, self._mu, scale)
        elif self.name == "adagrad":
            ok = kernels.adagrad_update(w, s["g2"], d, out, lr, self._eps, scale)
        else:
            # the bias corrections folded into two scalars, in float64 and then rounded once each
            # (b2^t is 1 - t (1 - b2) early on): lr m^ / (sqrt(v^) + eps) = a m / (sqrt(v) + e),
            # a = lr c1 / sqrt(c2), e = eps / sqrt(c2), so no value pays for them (net.kernels)
            t = self.t + 1
            r2 = math.sqrt(1.0 - BETAS[1] ** t)   # 1 / sqrt(c2)
            a = self.lr * lr_scale / (1.0 - BETAS[0] ** t) * r2
            ok = kernels.adam_update(w, s["m"], s["v"], d, out, f(a), *self._betas, f(EPS * r2), scale)
        if ok:
            self.t += 1
        return ok

    def step(self, w: np.ndarray, d: np.ndarray, scale: float = 1.0, lr_scale: float = 1.0) -> None:
        """Move w in place along scale * d, a d known to be finite (allreduce checks its
        sum first); a non-finite one is an error."""
        if not self.update(w, d, None, scale, lr_scale):
            raise ValueError("Optimizer.step: d has NaN or inf (check it first, or use update())")

    @property
    def nbytes(self) -> int:
        """Bytes of its state."""
        return sum(v.nbytes for v in self.state.values())

    def save(self) -> dict:
        """The state as arrays, for a checkpoint (t as a 0-d array)."""
        return {**{f"opt_{k}": v for k, v in self.state.items()}, "opt_t": np.array(self.t)}

    def load(self, saved: dict) -> None:
        """Restore what save() returned (a checkpoint's arrays, cast to this state's dtype;
        one written before 0.2 has none: sgd, which keeps no state)."""
        for k in self.state:
            self.state[k][:] = saved[f"opt_{k}"]
        self.t = int(saved.get("opt_t", 0))


def worker_lr(name: str, lr: float) -> float:
    """The learning rate of a worker's step: lr for sgd (it pushes Delta-w), else 1 (it
    pushes the negative gradient and the server applies lr)."""
    return lr if name == "sgd" else 1.0


def default_lr(name: str, hidden: int, averaged_workers: int = 1) -> float:
    """The learning rate when --lr is not given, per optimizer.
      sgd       3/hidden: the output layer's curvature grows with the width, and this step
                stays stable under the 15-30 updates of staleness of 15 asynchronous
                workers; where each update averages W workers' (sync, allreduce), W times
                that (the linear scaling rule, Goyal et al. 2017)
      momentum  a tenth of sgd's: the velocity sums about 1/(1 - 0.9) = 10 updates
      adagrad, adam  per-parameter steps of about lr, whatever the gradient's scale"""
    if name == "sgd":
        return 3.0 / hidden * averaged_workers
    if name == "momentum":
        return 0.3 / hidden * averaged_workers
    return {"adagrad": 0.01, "adam": 0.001}[name]


STALE_STEPS = ("off", "inverse", "sqrt")


def stale_step(rule: str):
    """staleness -> the share of the learning rate an update that stale moves w by, or
    None (rule off: every update the whole step).
      inverse  1/staleness (Zhang et al. 2016, staleness-aware async SGD)
      sqrt     1/sqrt(staleness)
    Staleness 0 and 1 take the whole step."""
    if rule == "off":
        return None
    if rule == "inverse":
        return lambda tau: 1.0 / tau if tau > 1 else 1.0
    if rule == "sqrt":
        return lambda tau: 1.0 / np.sqrt(tau) if tau > 1 else 1.0
    raise ValueError(f"stale step must be one of {STALE_STEPS}, got {rule!r}")
