"""Epochs and progress lines from a stream of applied updates, on the rank that sees
them all (server 0, or rank 0 of an allreduce job). The loops only call `add`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.target import AfterExchange, Cadence, Evaluations, Target
from .trace import PhaseClock


@dataclass
class EpochTracker:
    n_train: int
    epochs: int
    # held-out (loss, accuracy) of the current w; None where this rank holds only a shard.
    # It may leave a copy of the w it evaluated in `evaluated_w` (final_metrics uses it).
    evaluate: Callable[[], tuple[float, float]] | None
    report: Callable[[str], None]
    every_s: float
    clock: PhaseClock
    history: list = field(default_factory=list)  # one dict per epoch
    samples: int = 0
    epoch: int = 0
    loss_sum: float = 0.0
    loss_n: float = 0.0
    step_losses: list | None = None   # lockstep runs (sync, allreduce): each version's mean batch loss
    guard: Callable[[], float] | None = None   # --lr-guard: halves the step, returns its share of lr now
    target: Target | None = None     # --target-accuracy, --target-loss: the run ends once an evaluation reaches it
    cadence: Cadence | None = None   # --eval-every (None: at every epoch's end, nothing between)
    eval_cost_s: float = 0.0         # an evaluation's seconds, estimated before any was made (auto's first wait)
    after_exchange: AfterExchange | None = None   # p2p's rank 0: --eval-every's evaluations wait for exchanged()
    # --eval-deferred: a copy of w now, as the evaluation of it that settle() calls after training
    deferred: Callable[[], Callable[[], tuple[float, float]]] | None = None
    now: Callable[[], float] = time.perf_counter   # the clock (a test's fake one)

    def __post_init__(self):
        self.t_start = self.last_line = self.epoch_began = self.now()
        self.epoch_s: float | None = None   # the last epoch's seconds (none ended yet in this run)
        self.first_samples = self.samples  # a resumed run starts past zero: rates count from here
        self.first_epoch = self.epoch      # ... and its servers count each worker's pushes from here
        self.evaluated_w = None   # a copy of the w the last held-out evaluation was of
        self.size = self.n_train                      # samples an epoch brings
        self.ends = (self.epoch + 1) * self.n_train   # the samples at which this epoch ends
        self.lost = 0                                 # workers lost (--fault-tolerant)
        self.guard_cuts = 0       # times the guard halved the step
        self.cut_at = 0           # the epoch of the last cut
        self.updates = 0          # versions of w this run has made
        self.curve: list[dict] = []   # every held-out evaluation during training (metrics.curve)
        self.reached: dict | None = None   # the evaluation that reached the target (results.json's target)
        self.evals = Evaluations(took_s=self.eval_cost_s)   # during training (results.json's eval_s)
        # --eval-deferred: (curve point, its copy of w's evaluation, the epoch's history entry or None)
        self.pending: list[tuple[dict, Callable, dict | None]] = []
        self.settled_s = 0.0   # ... and the seconds settle() took to evaluate them (results.json's eval_after_s)

    def lose(self, pushed: float, share: int) -> None:
        """A worker whose share was `share` points (asgd.data.shares.worker_points) died
        having pushed `pushed` samples in this run (since its resume, if resumed). Its
        epochs need not be this one (its pushes interleave with the others'): what it owed
        up to this epoch's end, a share per epoch of this run less what it pushed, will not
        come, so this epoch ends that much sooner (later, if it had pushed past it), maybe
        at once, and every later one brings a share less. The last epoch then ends with
        the last sample."""
        self.ends -= (self.epoch + 1 - self.first_epoch) * share - int(pushed)
        self.size -= share
        self.lost += 1
        self._end_reached(self.now())

    def close(self) -> None:
        """Training is over with workers lost: an epoch still open ends here. lose() prices
        what they owed exactly; a push counted but not applied (refused as NaN or inf,
        dropped as late by --backup-workers) can still leave one open."""
        if self.lost and self.epoch < self.epochs and self.samples > self.ends - self.size:
            self._end_epoch(self.now())

    def final_metrics(self, w: np.ndarray, evaluate: Callable[[], tuple[float, float]]) -> tuple[float, float]:
        """Held-out (loss, accuracy) of the final weights w (those saved): the last
        evaluation (an epoch's end's, or --eval-every's) if it was of exactly these
        weights, else evaluate() now. Counting samples cannot tell: p2p's rank 0
        evaluates its worker's copy of w, one exchange behind the owners' shards, and a
        model-parallel server's later slices take a round's pushes after the first
        slice's version ends the epoch."""
        if self.evaluated_w is not None and self.curve and np.array_equal(self.evaluated_w, w):
            return self.curve[-1]["loss"], self.curve[-1]["accuracy"]
        return evaluate()

    def add(self, loss_sum: float, m: float) -> bool:
        """An applied update of m samples whose batch losses sum to loss_sum. True once
        the target is reached: the run is done (its epochs need not end)."""
        if self.step_losses is not None:
            self.step_losses.append(loss_sum / m if m else None)
        self.samples += int(m)
        self.updates += 1
        self.loss_sum += loss_sum
        self.loss_n += m
        now = self.now()
        self._end_reached(now)
        if (self.cadence is not None and self.evaluate is not None and self.reached is None
                and self.cadence.due(self.evals, self.updates, now - self.t_start, epoch_s=self.epoch_s)):
            if self.after_exchange is None:
                self._held_out()
            else:
                self.after_exchange.ask()
        if now - self.last_line >= self.every_s:
            self.last_line = now
            done = int(self.samples - (self.ends - self.size))
            self.report(f"  epoch {self.epoch + 1}: {done:,}/{int(self.size):,} samples  "
                        f"train loss {self.loss_sum / max(self.loss_n, 1):.4f}  "
                        f"{(self.samples - self.first_samples) / max(now - self.t_start, 1e-9):,.0f} samples/s")
        return self.reached is not None

    def _end_reached(self, now: float) -> None:
        """End every epoch the applied samples have reached."""
        while self.epoch < self.epochs and self.samples >= self.ends:
            self._end_epoch(now)

    def exchanged(self) -> None:
        """This rank's worker has its exchange's fresh w: the evaluation owed, if any
        (AfterExchange)."""
        if self.after_exchange.take(self.evals.updates, self.updates) and self.reached is None:
            self._held_out()

    def _held_out(self, epoch: dict | None = None) -> tuple[float | None, float | None]:
        """Evaluate the current w on the held-out set: a point of the curve, and whether it
        reaches the target. Its time is when it started: the weights are of then. Deferred
        (--eval-deferred): a copy of w instead, its figures (and `epoch`'s, an epoch's end's
        history entry) None until settle()."""
        prev = self.clock.phase
        start = self.now()
        self.clock.switch("evaluate")
        if self.deferred is None:
            loss, accuracy = self.evaluate()
        else:
            loss = accuracy = None
            later = self.deferred()
        self.clock.switch(prev)
        end = self.now()
        point = {"train_s": round(start - self.t_start, 4), "samples": self.samples, "updates": self.updates,
                 "loss": loss, "accuracy": accuracy, "eval_s": round(end - start, 6)}
        self.curve.append(point)
        self.evals.add(self.updates, start - self.t_start, end - self.t_start)
        if self.deferred is None:
            self._check(point, "finishing")
        else:
            self.pending.append((point, later, epoch))
        return loss, accuracy

    def _check(self, point: dict, then: str) -> None:
        """Whether the evaluation at `point` reaches the target (the first one that does)."""
        if self.reached is None and self.target is not None and self.target.reached(point["loss"], point["accuracy"]):
            self.reached = point
            got = point["accuracy"] if self.target.metric == "accuracy" else point["loss"]
            self.report(f"held-out {self.target.metric} {got:.4f} reached the target {self.target.value:g} after "
                        f"{point['train_s']:.2f} s, {point['samples'] / self.n_train:.2f} epochs: {then}")

    def settle(self) -> None:
        """--eval-deferred, after training: evaluate the copies of w taken during it, in
        order: the curve's held-out figures, the epochs' ends' and the target's (the first
        evaluation to reach it; the run trained on past it)."""
        start = self.now()
        for point, evaluate, epoch in self.pending:
            point["loss"], point["accuracy"] = evaluate()
            if epoch is not None:
                epoch["test_loss"], epoch["test_accuracy"] = point["loss"], point["accuracy"]
            self._check(point, "found after training (--eval-deferred)")
        self.settled_s += self.now() - start
        self.pending = []

    def target_record(self) -> dict | None:
        """results.json's `target`: what was asked and when an evaluation reached it (null
        figures when none did); None without a target."""
        if self.target is None:
            return None
        at = self.reached or {}
        return {"metric": self.target.metric, "value": self.target.value, "reached": self.reached is not None,
                "train_s": at.get("train_s"), "epochs": round(at["samples"] / self.n_train, 4) if at else None,
                "samples": at.get("samples"), "updates": at.get("updates")}

    def _end_epoch(self, now: float) -> None:
        self.epoch += 1
        self.ends += self.size
        self.epoch_s, self.epoch_began = now - self.epoch_began, now
        elapsed = now - self.t_start
        h = {"epoch": self.epoch, "samples": self.samples, "time_s": round(elapsed, 4), "wall_s": None,
             "train_loss": self.loss_sum / max(self.loss_n, 1), "test_loss": None, "test_accuracy": None}
        if self.evaluate is not None and (self.cadence is None or self.cadence.due(
                self.evals, self.updates, elapsed, epoch_end=True, epoch_s=self.epoch_s)):
            h["test_loss"], h["test_accuracy"] = self._held_out(h)
        h["wall_s"] = round(self.clock.elapsed(), 4)   # since this rank's process started
        test_loss, test_acc = h["test_loss"], h["test_accuracy"]
        self.history.append(h)
        held_out = f"held-out loss {test_loss:.4f} acc {test_acc:.4f}  " if test_acc is not None else ""
        guarded = self._guard(test_loss)
        if guarded:
            h["lr_scale"] = guarded[1]
        self.report(f"epoch {self.epoch}/{self.epochs}  samples {self.samples:>9,}  "
                    f"train loss {h['train_loss']:.4f}  {held_out}"
                    f"{(self.samples - self.first_samples) / max(elapsed, 1e-9):>9,.0f} samples/s  "
                    f"{elapsed:6.1f} s" + (f"  {guarded[0]}" if guarded else ""))
        self.loss_sum = self.loss_n = 0.0
        self.last_line = now

    def _guard(self, test_loss: float | None) -> tuple[str, float] | None:
        """--lr-guard: the held-out loss GUARD_RISE above its best and still climbing (above
        the epoch before's), GUARD_WAIT epochs or more after the last cut: halve the step.
        A loss falling back after a spike is left alone: with many stale workers the early
        epochs spike and recover, and a cut on each epoch above the best starves the run.
        Not in the first GUARD_FROM of the epochs either: there the loss of many stale
        workers swings while it falls, and an early cut slows the whole run.
        (The said line, the step's share of lr.)"""
        if self.guard is None or test_loss is None or self.epoch - self.cut_at < GUARD_WAIT:
            return None
        if self.epoch < max(GUARD_WAIT + 1, math.ceil(self.epochs * GUARD_FROM)):
            return None
        before = [h["test_loss"] for h in self.history[:-1] if h.get("test_loss") is not None]
        if not before or not test_loss > min(before) * (1 + GUARD_RISE) or not test_loss > before[-1]:
            return None
        share = self.guard()
        self.guard_cuts += 1
        self.cut_at = self.epoch
        rise = test_loss / min(before) - 1
        return (f"held-out loss {rise:.0%} above its best ({min(before):.4f}): step halved, now {share:g} of lr",
                share)


GUARD_RISE = 0.10   # --lr-guard halves the step when the held-out loss is this far above its best
GUARD_WAIT = 2      # ... and this many epochs have passed since it last did
GUARD_FROM = 0.1    # ... and this share of the epochs is done (the early epochs swing)

FALLING_FAST = 0.05  # the loss still falling this much an epoch at the end (and by at least
MATTERS = 0.01       # this many nats an epoch: a loss near 0 falling fast is done): not converged
DONE = 0.05          # a loss below this many nats is done, however fast it still falls
STILL_AHEAD = 0.2    # as many epochs again, at the recent rate, would lower the loss by this share
AHEAD_NATS = 0.05    # (and by this many nats): not converged, however slowly it falls an epoch


CHANCE_MARGIN = 0.02   # held-out accuracy within this of the most common class's share: chance level
ROSE = 1.25            # a loss ending this many times above its best (and ROSE_NATS above): it rose
ROSE_NATS = 0.05
MANY_WORKERS = 8       # asynchronous workers from which staleness is the likely cause of a climb
UNSCALED = 10.0        # a feature beyond +-this, or stds this many times apart: unscaled features


@dataclass
class RunFacts:
    """What the notes need to know about a run besides its history."""
    accuracy: float | None = None   # the final held-out accuracy
    chance: float | None = None     # the held-out share of the training data's most common class
    workers: int = 1                # asynchronous workers (1 where updates are lockstep)
    standardized: bool = True
    feature_max: float = 0.0        # the largest |value| of a feature, as read
    std_ratio: float = 1.0          # the largest feature's std over the smallest non-zero one's
    guard_cuts: int = 0             # times --lr-guard halved the step
    stale_step: str = "off"
    target_reached: bool = False    # it ended at its target: stopped on purpose before converging


def convergence_notes(history: list[dict], refused: int, facts: RunFacts | None = None) -> list[str]:
    """One line each for what the end of a run says about its training, naming the
    likely cause and the option that fixes it:
      chance level   a held-out accuracy within CHANCE_MARGIN of the most common class's
                     share: learned nothing (cause: unscaled features, a climbing loss, or
                     too little training);
      a climb        the training loss ending above its first epoch's (with MANY_WORKERS or
                     more asynchronous workers: stale updates overshooting), or the held-out
                     (else training) loss ending ROSE times and ROSE_NATS above its best
                     (with the training loss falling: overfitting);
      unscaled       features not standardized that reach beyond +-UNSCALED or whose spreads
                     differ UNSCALED times or more;
      not converged  (below; not said of a run that ended at its target); and updates
                     refused as NaN or inf."""
    facts = facts or RunFacts()
    notes = []
    unscaled = (not facts.standardized and (facts.feature_max > UNSCALED or facts.std_ratio > UNSCALED))
    scale_cause = (f"the features are not scaled (values up to {facts.feature_max:.3g}, spreads "
                   f"{facts.std_ratio:.3g} times apart): use --standardize")
    train = [h["train_loss"] for h in history if h.get("train_loss") is not None]
    many = facts.workers >= MANY_WORKERS
    stale_fix = ("--stale-step sqrt, a smaller --lr, or fewer workers" if facts.stale_step == "off"
                 else "a smaller --lr, or fewer workers")
    climbed = len(train) >= 2 and train[-1] > train[0] * 1.05 and train[-1] - train[0] > ROSE_NATS
    if climbed:
        cause = (f"with {facts.workers} asynchronous workers, stale updates overshoot: use {stale_fix}" if many
                 else "the step is too large: use a smaller --lr")
        notes.append(f"the training loss climbed from {train[0]:.3g} to {train[-1]:.3g}: training diverged; {cause}")
    else:
        # the held-out loss where rank 0 evaluated at least twice (--eval-every auto leaves most
        # epochs without one), else the training loss: an epoch's mean over a few mini-batches,
        # whose noise alone "rose" 4x on the README's own 301-row example at accuracy 1.0
        held = [(i, h["test_loss"]) for i, h in enumerate(history) if h.get("test_loss") is not None]
        which, losses = (("held-out", held) if len(held) >= 2 else
                         ("training", [(i, h["train_loss"]) for i, h in enumerate(history)
                                       if h.get("train_loss") is not None]))
        if len(losses) >= 2:
            (b, low), last = min(losses, key=lambda x: x[1]), losses[-1][1]
            if last > ROSE * low and last - low > ROSE_NATS:
                guarded = f" (--lr-guard halved the step {facts.guard_cuts} time(s))" if facts.guard_cuts else ""
                overfit = (which == "held-out" and history[b].get("train_loss") is not None
                           and train and train[-1] < history[b]["train_loss"])
                cause = ("the model overfits the training data: use fewer --epochs" if overfit
                         else f"with {facts.workers} asynchronous workers, stale updates overshoot: use {stale_fix}"
                         if many else "the step is too large late in training: use a smaller --lr")
                notes.append(f"the {which} loss rose from its best, {low:.3g} after epoch {b + 1}, to "
                             f"{last:.3g}{guarded}: {cause}")
    if facts.accuracy is not None and facts.chance is not None and facts.accuracy <= facts.chance + CHANCE_MARGIN:
        cause = (scale_cause if unscaled else "the loss climbed: see the note above" if climbed or notes
                 else "too little training: use more --epochs or a larger --lr")
        notes.append(f"held-out accuracy {facts.accuracy:.3f} is chance level (the most common class alone "
                     f"scores {facts.chance:.3f}): the model learned nothing; likely cause: {cause}")
        if unscaled:
            unscaled = False   # said
    if unscaled:
        notes.append(f"{scale_cause} (the model's first layer expects values of about +-1)")
    if not climbed and not facts.target_reached:
        notes += _still_falling(history)
    if refused:
        notes.append(f"{refused:,} update(s) were refused for NaN or inf values: training was unstable; "
                     + (f"use {stale_fix}" if many else "lower --lr"))
    return notes


def _still_falling(history: list[dict]) -> list[str]:
    """Not converged: the loss still falling fast, or slowly with far to go (see below)."""
    notes = []
    key = "test_loss" if history and all(h.get("test_loss") is not None for h in history[-3:]) else "train_loss"
    which = "held-out" if key == "test_loss" else "training"
    tail = [h[key] for h in history[-3:]]
    falls = [(a - b, (a - b) / a) for a, b in zip(tail, tail[1:]) if a > 0]
    last = tail[-1] if tail else 0.0
    k = max(2, len(history) // 5)
    if last < DONE:
        pass
    elif falls and all(rel > FALLING_FAST and nats > MATTERS for nats, rel in falls):
        notes.append(f"training had not converged: the {which} loss was still falling "
                     f"{min(rel for _, rel in falls):.0%} or more an epoch over the last {len(falls)} epoch(s); "
                     "try more --epochs or a larger --lr")
    elif len(history) > k and all(h.get(key) is not None for h in history[-1 - k:]):
        before, half = history[-1 - k][key], history[-1 - k // 2][key]
        rate = min((before - last) / k, (half - last) / (k // 2))   # a loss flattening out: its recent rate
        ahead = rate * len(history)   # as many epochs again, at that rate
        if ahead >= STILL_AHEAD * last and ahead >= AHEAD_NATS:
            notes.append(f"training had not converged: the {which} loss was still falling, from {before:.3g} to "
                         f"{last:.3g} over the last {k} epochs; as many epochs again at that rate would lower it "
                         f"by {min(ahead / last, 1):.0%}; try more --epochs or a larger --lr")
    return notes
