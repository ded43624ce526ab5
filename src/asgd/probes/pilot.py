"""The measurements behind python -m asgd.perf pilot: short, bounded runs on the user's data that measure what a
configuration's epochs to a target depend on (asgd.perf.statistics):

  optimizer    a sequential reference (one server, one worker) per optimizer at asgd.train's
               default lr, its held-out curve evaluated every few updates: E_min at any
               target it reaches;
  staleness    the same at a few asynchronous worker counts, to a pilot target: their epochs
               over the reference's against their mean staleness (results.json's) fit c,
               and the staleness's growth with the workers;
  batch        the gradient noise scale B_noise (McCandlish et al. 2018, appendix A.1), from
               gradient norms at two batch sizes computed in this process (numpy, no MPI) at
               the initial w and at the reference's last.

The runs are asgd.train jobs under the launcher, as calibrate's probes are, each bounded
by its epochs and a wall-clock limit.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from .. import mpienv
from ..data import formats, problem
from ..net import reference
from ..net.mlp import Layout, init_params
from ..run.files import atomic_write
from ..perf.statistics import (fit_staleness_cost, fit_staleness_growth, mean_sq_norm, mean_staleness,
                              noise_scale, samples_to_target)

EVALS_PER_EPOCH = 16       # the reference's held-out curve: its resolution of the epochs to a target
PILOT_SHARE = 0.9          # without a target: the staleness pilots aim at this share of the reference's gain
ASYNC_EPOCHS = 3           # an asynchronous pilot trains at most this many times the reference's epochs
NOISE_BATCHES = (8, 1024)  # B_small and B_big of the noise scale's gradient norms
NOISE_REPS = (64, 4)       # batches of each drawn at each w
CHUNK = 256                # a big batch's gradient, in pieces (hidden 100K: 200 MB a piece in float64)


class PilotError(RuntimeError):
    pass


def train(launcher: str | None, ranks: int, args: list[str], out: str, timeout: float) -> dict:
    """One asgd.train job under the launcher, into `out`; its results.json."""
    cmd = mpienv.command(ranks, sys.executable, "-m", "asgd.train", *args, "--out", out, "--force", "--quiet",
                         launcher=launcher)
    try:
        p = mpienv.run_bounded(cmd, timeout)
    except FileNotFoundError as e:
        raise PilotError(f"cannot start MPI ({e}); is MPI installed? (or pass --launcher)") from None
    except subprocess.TimeoutExpired:
        raise PilotError(f"{' '.join(cmd)} took over {timeout:.0f} s") from None
    if p.returncode:
        raise PilotError(f"{' '.join(cmd)} failed (exit {p.returncode}): {p.stderr.strip()[-600:]}")
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def epochs_reached(results: dict, metric: str, value: float) -> tuple[float, bool]:
    """(epochs to the target, reached): unreached, the epochs trained (a lower bound)."""
    s = samples_to_target(results["metrics"]["curve"], metric, value)
    points = results["config"]["train_points"]
    return (s / points, True) if s is not None else (results["throughput"]["samples"] / points, False)


def pilot_target(curve: list[dict]) -> float:
    """Without a target: the held-out accuracy PILOT_SHARE of the way from the reference's
    first evaluation to its best, still on the rise (the best itself may be a lucky
    evaluation that slower asynchronous runs never repeat), rounded down to 0.001."""
    first, best = curve[0]["accuracy"], max(p["accuracy"] for p in curve)
    return math.floor((first + PILOT_SHARE * (best - first)) * 1000) / 1000


# -- the gradient noise scale --------------------------------------------------------------

def training_points(results: dict) -> tuple[np.ndarray, np.ndarray]:
    """The reference's training data as it trained on it (X scaled as it was, y as class
    indices): the embedded problem, a delimited text file or a .npy file (its held-out
    rows included: they only add samples to the gradients' statistics)."""
    c = results["config"]
    if not c.get("data"):
        ds = problem.default_problem(c["seed"])[0]
        X, y = ds.X, ds.y
    elif formats.is_npz(c["data"]):
        raise PilotError(f"{c['data']}: the noise scale reads text and .npy files; convert the .npz")
    elif formats.is_binary(c["data"]):
        A = np.load(c["data"])
        label = results["data"]["read_as"].get("label_column", A.shape[1] - 1)
        X, y = np.delete(A, label, axis=1), A[:, label].astype(np.int64)
    else:
        ra = results["data"]["read_as"]
        ds = formats.read_text(c["data"], c["classes"], ra["delimiter"], bool(ra.get("header")),
                               str(ra["label_column"]))
        X, y = ds.X, ds.y
    s = results.get("standardize")
    if s:
        X = (X - np.asarray(s["mean"])) / np.asarray(s["std"])
    return np.ascontiguousarray(X, np.float64), y


def gradient(layout: Layout, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The mean loss's gradient over the rows of X, in pieces of CHUNK rows."""
    g, piece = np.zeros(layout.n_w), np.empty(layout.n_w)
    for i in range(0, len(y), CHUNK):
        reference.step(layout, w, X[i:i + CHUNK], y[i:i + CHUNK], -1.0, piece)   # lr -1: Delta-w = +gradient
        g += piece * len(y[i:i + CHUNK])
    return g / len(y)


def gradient_noise(layout: Layout, ws: list[np.ndarray], X: np.ndarray, y: np.ndarray, seed: int = 0) -> dict:
    """B_noise from mean squared gradient norms at NOISE_BATCHES over NOISE_REPS random batches
    at each w; |G|^2 and tr Sigma averaged over the ws before their ratio (McCandlish et
    al.'s advice: a ratio of means, not a mean of ratios)."""
    rng = np.random.default_rng(seed)
    (b_small, b_big), got = NOISE_BATCHES, []
    b_big = min(b_big, len(y))
    for w in ws:
        w = w.astype(np.float64)
        sq = []
        for b, reps in zip((b_small, b_big), NOISE_REPS):
            idx = [rng.choice(len(y), b, replace=False) for _ in range(reps)]
            sq.append(mean_sq_norm(np.stack([gradient(layout, w, X[i], y[i]) for i in idx])))
        got.append(noise_scale(sq[0], b_small, sq[1], b_big)[1:])
    g2, trace = (float(np.mean(v)) for v in zip(*got))
    return {"b_noise": trace / g2 if g2 > 0 else float("inf"), "gradient_sq": g2, "trace_sigma": trace,
            "batches": [b_small, b_big]}


# -- the whole pilot ---------------------------------------------------------------------

def add_statistics(path: str, stats: dict) -> None:
    """Write stats as `statistics` into the parameters file at path (made if there is none)."""
    got = {}
    if os.path.exists(path):
        with open(path) as f:
            got = json.load(f)
    got["statistics"] = stats
    atomic_write(path, lambda f: json.dump(got, f, indent=1))


def pilot(train_args: list[str], updates_per_epoch: int, optimizers: list[str], workers: list[int],
          target: tuple[str, float] | None, epochs: int, folder: str, launcher: str | None = None,
          timeout: float = 120.0, say=print) -> dict:
    """Every pilot run and the noise scale: params.json's `statistics`. train_args: asgd.train's
    options shared by every run (data, hidden, batch), whose epochs take updates_per_epoch
    steps of one worker; target: (metric, value) or None."""
    t0 = time.perf_counter()
    refs, results = {}, {}
    # held-out evaluations every `every` versions of w, asynchronous pilots too: the same resolution in samples
    every = ["--eval-every", str(max(1, updates_per_epoch // EVALS_PER_EPOCH))]
    for opt in optimizers:
        args = [*train_args, "--optimizer", opt, "--epochs", str(epochs)]
        args += _target_args(target) if target else []
        out = os.path.join(folder, f"reference-{opt}")
        r = train(launcher, 2, [*args, *every], out, timeout)
        results[opt] = r
        c = r["config"]
        curve = [{k: p[k] for k in ("samples", "accuracy", "loss")} for p in r["metrics"]["curve"]]
        refs[opt] = {"batch": c["batch"], "staleness": mean_staleness(r), "points": c["train_points"],
                     "curve": curve}
        best = max(p["accuracy"] for p in curve)
        say(f"  reference {opt}: {len(curve)} held-out points over {curve[-1]['samples'] / c['train_points']:.2f} "
            f"epochs, best accuracy {best:.4f}, mean staleness {refs[opt]['staleness']:.2f}")
    first = optimizers[0]
    ref = results[first]
    metric, value = target or ("accuracy", pilot_target(ref["metrics"]["curve"]))
    e_ref, ok = epochs_reached(ref, metric, value)
    if not ok:
        raise PilotError(f"the {first} reference never reached held-out {metric} {value:g} in {epochs} epochs: "
                         "give more --epochs or an easier target")
    pilots = []
    for W in workers:
        cap = max(1, int(np.ceil(ASYNC_EPOCHS * e_ref)))
        out = os.path.join(folder, f"async-{W}")
        r = train(launcher, W + 1, [*train_args, "--optimizer", first, "--epochs", str(cap), *every,
                                    *_target_args((metric, value))], out, timeout)
        e, reached = epochs_reached(r, metric, value)
        pilots.append({"workers": W, "epochs": e, "reached": reached, "staleness": mean_staleness(r)})
        say(f"  async {W} workers: {e:.2f} epochs to {metric} {value:g}" + ("" if reached else " (not reached)")
            + f", mean staleness {pilots[-1]['staleness']:.2f}")
    c = fit_staleness_cost([p["epochs"] / e_ref for p in pilots], [p["staleness"] for p in pilots],
                           refs[first]["staleness"])
    s1, slope = fit_staleness_growth([1] + [p["workers"] for p in pilots],
                                     [refs[first]["staleness"]] + [p["staleness"] for p in pilots])
    X, y = training_points(ref)
    cf = ref["config"]
    layout = Layout(cf["features"], cf["hidden"], cf["classes"])
    w_last = np.load(os.path.join(folder, f"reference-{first}", "weights.npy"))
    noise = gradient_noise(layout, [init_params(layout, cf["seed"]), w_last], X, y)
    say(f"  gradient noise scale B_noise {noise['b_noise']:.1f} samples (|G|^2 {noise['gradient_sq']:.3g}, "
        f"tr Sigma {noise['trace_sigma']:.3g}); staleness cost c {c:.3f}, mean staleness {s1:.2f} + {slope:.2f} "
        "per worker more")
    data = os.path.abspath(cf["data"]) if cf.get("data") else "embedded"
    return {"b_noise": noise["b_noise"], "staleness_cost": c, "staleness_one": s1, "staleness_per_worker": slope,
            "references": refs, "data": data, "hidden": cf["hidden"],
            "pilot": {"target": {"metric": metric, "value": value}, "reference_epochs": e_ref, "async": pilots,
                      "noise": noise, "seconds": time.perf_counter() - t0}}


def _target_args(target: tuple[str, float]) -> list[str]:
    return [f"--target-{target[0]}", repr(target[1])]


