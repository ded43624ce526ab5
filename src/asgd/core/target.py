"""Stopping at a target, with no I/O in it: whether a held-out evaluation has reached the
run's target (--target-accuracy, --target-loss), and when the next evaluation is due
(--eval-every). The trainer's rank 0 asks these after each new version of w
(asgd.run.progress); a run that reaches its target ends as a run whose epochs are done
(the servers' replies say STOP_DONE, allreduce's sum its done share), so every rank
finishes cleanly and the results are written. The simulator can ask the same questions
of its own clock and counts.
"""

from __future__ import annotations

from dataclasses import dataclass

EVAL_BUDGET = 0.05   # --eval-every auto: held-out evaluation takes at most this share of the time


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


@dataclass(frozen=True)
class Cadence:
    """When the next held-out evaluation is due: every `every` updates (kind "updates"),
    every `every` seconds ("seconds"), or ("auto") once the time since the last one ended
    is (1 / EVAL_BUDGET - 1) times the time it took, so that evaluating costs at most
    EVAL_BUDGET of the run, on any machine and model."""
    kind: str
    every: float = 0.0

    def due(self, updates: int, seconds: float, last_updates: int, last_end_s: float, last_took_s: float) -> bool:
        """At `updates` versions and `seconds` of training: whether to evaluate, the last
        evaluation having been at `last_updates`, ended at `last_end_s` and taken `last_took_s`."""
        if self.kind == "updates":
            return updates - last_updates >= self.every
        if self.kind == "seconds":
            return seconds - last_end_s >= self.every
        return seconds - last_end_s >= last_took_s * (1 / EVAL_BUDGET - 1)
