"""Stopping at a target, with no I/O in it: whether a held-out evaluation has reached the
run's target (--target-accuracy, --target-loss), and when the next evaluation is due
(--eval-every). The trainer's rank 0 asks these after each new version of w
(asgd.run.progress); a run that reaches its target ends as a run whose epochs are done
(the servers' replies say STOP_DONE, allreduce's sum its done share), so every rank
finishes cleanly and the results are written. The simulator asks the same questions of
its own clock and counts (an evaluation there costs calibrate's eval_s_per_point times
the held-out points, charged to rank 0), and the analytical model replays them on its
predicted timeline (replay).
"""

from __future__ import annotations

from dataclasses import dataclass

EVAL_BUDGET = 0.05   # --eval-every auto: held-out evaluation takes at most this share of the time
# auto's first evaluation waits for this many times the cost its probe estimated before training
# (asgd.run.roles.evaluation_cost): during training the evaluation shares its core with the workers
PROBE_MARGIN = 2.0


@dataclass(frozen=True)
class Target:
    """A held-out metric to reach: accuracy at least `value`, or loss at most `value`."""
    metric: str    # "accuracy" or "loss"
    value: float

    def reached(self, loss: float | None, accuracy: float | None) -> bool:
        """Whether a held-out evaluation of (loss, accuracy) reaches it (None: not evaluated)."""
        if self.metric == "accuracy":
            return accuracy is not None and accuracy >= self.value
        return loss is not None and loss <= self.value


def target(accuracy: float | None, loss: float | None) -> Target | None:
    """The run's target from --target-accuracy and --target-loss (at most one is given)."""
    if accuracy is not None:
        return Target("accuracy", accuracy)
    return None if loss is None else Target("loss", loss)


@dataclass
class Evaluations:
    """The held-out evaluations made so far, as the cadence weighs them: the last one's
    updates, end (seconds of training) and length, and all of theirs together."""
    updates: int = 0
    end_s: float = 0.0
    took_s: float = 0.0    # the last one's seconds; before any, an estimate (auto's first)
    spent_s: float = 0.0
    count: int = 0

    def add(self, updates: int, start_s: float, end_s: float) -> None:
        """One evaluation, of the w of `updates` updates, from start_s to end_s."""
        self.updates, self.end_s, self.took_s = updates, end_s, end_s - start_s
        self.spent_s += end_s - start_s
        self.count += 1


@dataclass
class AfterExchange:
    """Evaluations owed until the evaluator's copy of w is fresh: a p2p peer's rank 0
    evaluates its worker's w, which only its own exchange refreshes, while the updates
    that make an evaluation due are applied by its owner, polled inside that worker's step
    and waits. An evaluation due there is owed (ask) and made once the worker's exchange
    is done (take), at most one an exchange. Made at once, it evaluated the same stale
    copy again and again and starved the worker whose exchange would refresh it (MNIST,
    --eval-every 1: 362 evaluations and 6.1 s to the target, where allreduce took 1.3 s)."""
    owed: bool = False

    def ask(self) -> None:
        self.owed = True

    def take(self, evaluated: int, versions: int) -> bool:
        """Whether to evaluate now: one is owed, and w has versions the last evaluation (of
        `evaluated`) did not see: an epoch's end may have evaluated since it was asked.
        Owed no longer either way."""
        owed, self.owed = self.owed, False
        return owed and versions > evaluated


@dataclass(frozen=True)
class Cadence:
    """When the next held-out evaluation is due (--eval-every):
      updates  every `every` updates since the last, and at each epoch's end
      seconds  every `every` seconds since the last ended, and at each epoch's end
      epoch    at each epoch's end only, whatever it costs
      auto     whenever the budget allows: the evaluations so far and this one (costing
               what the last took, or their mean if more: one fast under a passing lull
               does not open the budget) within EVAL_BUDGET of the training time so far,
               so the curve is as dense as that share allows on any machine and model.
               Epoch ends come first: where an evaluation per epoch fits the budget, one
               between epochs also leaves the cost of one for the next epoch's end (every
               epoch then has its held-out metrics, the curve between them what is left);
               where it does not fit, evaluations come as soon as the budget allows,
               wherever they fall, and some epochs have none.
    Between epochs a version is never evaluated twice."""
    kind: str
    every: float = 0.0

    def due(self, evals: Evaluations, updates: int, seconds: float, epoch_end: bool = False,
            epoch_s: float | None = None) -> bool:
        """At `updates` versions and `seconds` of training, after `evals`: whether to
        evaluate now; `epoch_end`: an epoch has just ended; `epoch_s`: the last epoch's
        seconds (None before one has ended)."""
        if not epoch_end and evals.count and updates == evals.updates:
            return False
        if self.kind != "auto":
            return epoch_end or (self.kind == "updates" and updates - evals.updates >= self.every
                                 or self.kind == "seconds" and seconds - evals.end_s >= self.every)
        cost = max(evals.took_s, evals.spent_s / evals.count) if evals.count else evals.took_s
        per_epoch_fits = epoch_s is None or cost <= EVAL_BUDGET * epoch_s
        reserve = cost if not epoch_end and per_epoch_fits else 0.0
        return evals.spent_s + cost + reserve <= EVAL_BUDGET * seconds


REPLAYED = 2000   # evaluations replay() finds one by one; past them, the rest at the rate they came


def replay(cadence: Cadence, epochs: int, versions: int, version_s: float, cost_s: float,
           first_cost_s: float, exact: int = REPLAYED) -> Evaluations:
    """The evaluations `cadence` makes in a run of `epochs` epochs of `versions` versions of
    w each, one every version_s seconds of training, each evaluation costing cost_s and
    holding the run up meanwhile (auto's first waits for first_cost_s, its estimate): what
    the model and the simulator charge rank 0 (asgd.run.progress.EpochTracker asks due()
    after every version; between epoch ends due() only turns true as versions go by, so
    each evaluation's version is found by bisection, not by asking at every version).
    A cheap evaluation in a long run comes every few versions, millions of them: past
    `exact` evaluations the rest of the run has them at the rate the replayed ones came
    (per version), as auto's budget, a count or a period keeps it steady."""
    evals = Evaluations(took_s=first_cost_s)
    if epochs < 1 or versions < 1:
        return evals

    def at(k: int) -> float:   # training seconds when version k arrives
        return k * version_s + evals.spent_s

    def evaluate(k: int) -> bool:   # True once the replay has done enough: the rest extrapolated
        start = at(k)
        evals.add(k, start, start + cost_s)
        if evals.count < exact:
            return False
        rest = (epochs * versions - k) / k
        evals.spent_s += evals.spent_s * rest
        evals.count += round(evals.count * rest)
        return True

    epoch_s, began, first = None, 0.0, 1
    for e in range(1, epochs + 1):
        end = e * versions
        while first < end and cadence.due(evals, end - 1, at(end - 1), epoch_s=epoch_s):
            lo, hi = first, end - 1
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if cadence.due(evals, mid, at(mid), epoch_s=epoch_s) else (mid + 1, hi)
            if evaluate(lo):
                return evals
            first = lo + 1
        now = at(end)
        epoch_s, began = now - began, now
        if cadence.due(evals, end, now, epoch_end=True, epoch_s=epoch_s):
            if evaluate(end):
                return evals
            first = end + 1
        else:   # the tracker asks again at this version, as one between epochs
            first = end
    if first == end and cadence.due(evals, end, at(end), epoch_s=epoch_s):
        evaluate(end)
    return evals
