"""The measurements behind python -m asgd.perf pilot: short, bounded runs on the user's data that measure what a
configuration's epochs to a target depend on (asgd.perf.statistics):

  optimizer    a sequential reference (one server, one worker) per optimizer at asgd.train's
               default lr, its held-out curve evaluated every few updates: E_min at any
               target it reaches;
  batch        sequential runs of the first optimizer at a few other batches, to a pilot
               target; each other optimizer at the smallest of those too (its own B_noise,
               fitted with the shared staleness cost c);
  staleness    the same at a few asynchronous worker counts, at the reference's batch, and
               the staleness's growth with the workers (results.json's mean staleness); and
               two workers in lockstep (--mode sync) at half the batch: the reference's
               update size at staleness 0.
B_noise and c are fitted together to every run's epochs to the pilot target (their update
sizes and mean staleness): measured statistical efficiency, as Omnivore and Pollux measure it.

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
from ..run.files import atomic_write
from ..perf.statistics import (PILOT_BATCHES, fit_efficiency, fit_staleness_growth, mean_staleness,
                              pooled_in_lockstep, samples_to_target, update_samples)

EVALS_PER_EPOCH = 16       # every run's held-out curve: its resolution of the epochs to a target
PILOT_SHARE = 0.9          # without a target: the pilots aim at this share of the reference's gain
PILOT_EPOCHS = 3           # a pilot trains at most this many times the reference's epochs (x its update's size)


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


# -- the whole pilot ---------------------------------------------------------------------

def add_statistics(path: str, stats: dict) -> None:
    """Write stats as `statistics` into the parameters file at path (made if there is none)."""
    got = {}
    if os.path.exists(path):
        with open(path) as f:
            got = json.load(f)
    got["statistics"] = stats
    atomic_write(path, lambda f: json.dump(got, f, indent=1))


def pilot(train_args: list[str], points: int, batch: int, optimizers: list[str], workers: list[int],
          target: tuple[str, float] | None, epochs: int, folder: str, launcher: str | None = None,
          timeout: float = 120.0, batches: tuple[int, ...] = PILOT_BATCHES, say=print) -> dict:
    """Every pilot run and the fit: params.json's `statistics`. train_args: asgd.train's
    options shared by every run (data, hidden), of `points` training points; batch: the
    reference's and the asynchronous pilots'; target: (metric, value) or None."""
    t0 = time.perf_counter()
    refs, results, every_run = {}, {}, []
    args = [*train_args, "--batch", str(batch)]

    def train_one(ranks: int, argv: list[str], out: str) -> dict:
        every_run.append(train(launcher, ranks, argv, out, timeout))
        return every_run[-1]
    for opt in optimizers:
        out = os.path.join(folder, f"reference-{opt}")
        r = train_one(2, [*args, "--optimizer", opt, "--epochs", str(epochs), *_every(points, batch),
                          *(_target_args(target) if target else [])], out)
        results[opt] = r
        c = r["config"]
        curve = [{k: p[k] for k in ("samples", "accuracy", "loss")} for p in r["metrics"]["curve"]]
        refs[opt] = {"batch": c["batch"], "staleness": mean_staleness(r), "points": c["train_points"],
                     "curve": curve}
        best = max(p["accuracy"] for p in curve)
        say(f"  reference {opt}: {len(curve)} held-out evaluations over {curve[-1]['samples'] / c['train_points']:.2f} "
            f"epochs, best accuracy {best:.4f}, mean staleness {refs[opt]['staleness']:.2f}")
    first = optimizers[0]
    ref = results[first]
    metric, value = target or ("accuracy", pilot_target(ref["metrics"]["curve"]))
    e_ref, ok = epochs_reached(ref, metric, value)
    if not ok:
        raise PilotError(f"the {first} reference never reached held-out {metric} {value:g} in {epochs} epochs: "
                         "give more --epochs or an easier target")
    points = ref["config"]["train_points"]   # as the runs count them
    u_ref = update_samples(points, 1, batch, False)
    reference = {"workers": 1, "batch": batch, "mode": "async", "update_samples": u_ref, "epochs": e_ref,
                 "reached": True, "staleness": refs[first]["staleness"]}

    def to_pilot_target(name: str, W: int, b: int, mode: str = "async", opt: str = first, e0: float = e_ref
                        ) -> dict:
        """A run of opt to the pilot target, its epochs capped at PILOT_EPOCHS x its
        reference's (e0), more for a larger update."""
        lockstep = mode == "sync"
        u = update_samples(points, W, b, lockstep and pooled_in_lockstep(opt))
        cap = max(1, int(np.ceil(PILOT_EPOCHS * e0 * max(1.0, u / u_ref))))
        r = train_one(W + 1, [*train_args, "--batch", str(b), "--optimizer", opt, "--mode", mode,
                              "--epochs", str(cap), *_every(points, b * (W if lockstep else 1)),
                              *_target_args((metric, value))], os.path.join(folder, name))
        e, reached = epochs_reached(r, metric, value)
        run = {"workers": W, "batch": b, "mode": mode, "update_samples": u, "epochs": e, "reached": reached,
               "staleness": mean_staleness(r)}
        say(f"  {'' if opt == first else opt + ' '}{mode} {W} worker(s) x batch {b}: {e:.2f} epochs to {metric} "
            f"{value:g}" + ("" if reached else " (not reached)") + f", mean staleness {run['staleness']:.2f}")
        return run
    by_batch = [to_pilot_target(f"batch-{b}", 1, b) for b in batches if b != batch]
    asyn = [to_pilot_target(f"async-{W}", W, batch) for W in workers]
    # staleness 0 at the reference's update size: what lockstep saves against the reference's overlap
    lockstep = [to_pilot_target("sync-2", 2, max(1, batch // 2), "sync")]
    fit = [r for r in (reference, *by_batch, *asyn, *lockstep) if r["reached"]]
    try:
        b_noise, c = fit_efficiency(*([r[k] for r in fit] for k in ("update_samples", "staleness", "epochs")))
    except ValueError as e:
        raise PilotError(f"{e}: the batch pilots never reached {metric} {value:g}; give an easier target") from None
    by_optimizer, optimizer_batches = {}, []
    others = [b for b in batches if b != batch]
    for opt in optimizers[1:]:   # each other optimizer at the smallest batch pilot's too: its own B_noise, c shared
        e_opt, ok = epochs_reached(results[opt], metric, value)
        if not ok or not others:
            continue
        small = min(others)
        own = {"update_samples": u_ref, "staleness": refs[opt]["staleness"], "epochs": e_opt}
        run = to_pilot_target(f"batch-{small}-{opt}", 1, small, opt=opt, e0=e_opt)
        optimizer_batches.append({**run, "optimizer": opt})
        if run["reached"]:
            by_optimizer[opt] = fit_efficiency(*([r[k] for r in (own, run)]
                                                 for k in ("update_samples", "staleness", "epochs")), costs=[c])[0]
    s1, slope = fit_staleness_growth(*zip(*((r["workers"], r["staleness"]) for r in (reference, *asyn))))
    say(f"  fitted to the epochs of {len(fit)} runs: B_noise {b_noise:.1f} samples, staleness cost c {c:.3f}; "
        f"mean staleness {s1:.2f} + {slope:.2f} per worker more"
        + "".join(f"; {opt}'s B_noise {b:.1f}" for opt, b in by_optimizer.items()))
    cf = ref["config"]
    data = os.path.abspath(cf["data"]) if cf.get("data") else "embedded"
    evaluation = measured_evaluation(every_run)
    if evaluation:
        say(f"  held-out evaluation: {evaluation['s_per_point'] * 1e6:.3g} us a point "
            f"({evaluation['evaluations']} evaluations of {cf['test_points']} points)")
    return {"b_noise": b_noise, "b_noise_by_optimizer": by_optimizer, "staleness_cost": c,
            "staleness_one": s1, "staleness_per_worker": slope,
            "references": refs, "data": data, "hidden": cf["hidden"], "evaluation": evaluation,
            "pilot": {"target": {"metric": metric, "value": value}, "reference_epochs": e_ref, "async": asyn,
                      "batches": by_batch, "lockstep": lockstep,
                      "optimizer_batches": optimizer_batches, "seconds": time.perf_counter() - t0}}


def measured_evaluation(runs: list[dict]) -> dict | None:
    """The held-out evaluation's cost on this data, from the pilot's own runs (the seconds
    their curves' evaluations took, spent_evaluating, one point each): seconds per held-out
    point, pooled over every run that evaluated, and the shape, hidden size and precision
    it was measured at (what asgd.perf.analytic.Params.shaped prices an evaluation at, for
    the model and the simulator). The pilot's runs defer theirs (_every): evaluated on rank
    0 after training, alone, so a run's evaluation during training, sharing its core, can
    take a third longer. None if no run evaluated (rank 0 holding only a shard)."""
    timed = [r for r in runs if spent_evaluating(r) and r["metrics"]["curve"]]
    if not timed:
        return None
    c = timed[0]["config"]
    spent = sum(spent_evaluating(r) for r in timed)
    evaluations = sum(len(r["metrics"]["curve"]) for r in timed)
    return {"s_per_point": spent / sum(len(r["metrics"]["curve"]) * r["config"]["test_points"] for r in timed),
            "evaluations": evaluations, "features": c["features"], "classes": c["classes"], "hidden": c["hidden"],
            "precision": c["precision"]}


def spent_evaluating(results: dict) -> float | None:
    """The seconds a run's held-out evaluations of its curve took: during training
    (metrics.eval_s), or with --eval-deferred after it (eval_after_s: rank 0 alone, the
    workers done; in a run it shares its core with them: on MNIST an evaluation took 16 ms
    in an async run's server, 22 ms in a sync one's, 2026-11-29)."""
    m = results["metrics"]
    return m.get("eval_after_s") if results["config"].get("eval_deferred") else m.get("eval_s")


def _every(points: int, batch: int) -> list[str]:
    """Held-out evaluations every 1/EVALS_PER_EPOCH of an epoch's samples, at any batch: the
    same resolution of the epochs to a target for every run. Deferred (copies of w,
    evaluated after training): evaluated in the run, they were 60-97 % of its time on the
    tta bench's data (MNIST: 16-22 ms each, every 1-3 updates), and the server they held
    up fed its workers in bursts, which an asynchronous run at --eval-every auto never
    sees: its staleness was not the one these runs measure."""
    return ["--eval-every", str(max(1, -(-points // batch) // EVALS_PER_EPOCH)), "--eval-deferred"]


def _target_args(target: tuple[str, float]) -> list[str]:
    return [f"--target-{target[0]}", repr(target[1])]


