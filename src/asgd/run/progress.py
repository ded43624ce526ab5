"""Epochs and progress lines from a stream of applied updates, on the rank that sees
them all (server 0, or rank 0 of an allreduce job). The loops only call `add`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .trace import PhaseClock


@dataclass
class EpochTracker:
    n_train: int
    epochs: int
    # held-out (loss, accuracy) of the current w; None where this rank holds only a shard
    evaluate: Callable[[], tuple[float, float]] | None
    report: Callable[[str], None]
    every_s: float
    clock: PhaseClock
    history: list = field(default_factory=list)  # one dict per epoch
    samples: int = 0
    t_start: float = field(default_factory=time.perf_counter)
    epoch: int = 0
    loss_sum: float = 0.0
    loss_n: float = 0.0
    last_line: float = field(default_factory=time.perf_counter)
    step_losses: list | None = None   # lockstep runs (sync, allreduce): each version's mean batch loss

    def __post_init__(self):
        self.first_samples = self.samples  # a resumed run starts past zero: rates count from here
        self.evaluated_at = None  # samples when the last held-out evaluation was made
        self.size = float(self.n_train)                       # samples an epoch brings
        self.ends = (self.epoch + 1) * float(self.n_train)   # the samples at which this epoch ends
        self.lost = 0                                         # workers lost (--fault-tolerant)

    def lose(self, pushed: float, workers: int) -> None:
        """A worker died having pushed `pushed` samples: its share (1/workers of the data)
        is not trained from now on, so this epoch ends that much sooner (less what it had
        done of it) and every later one brings a share less."""
        share = self.n_train / workers
        self.ends -= share - (pushed % share)
        self.size -= share
        self.lost += 1

    def close(self) -> None:
        """Training is over with workers lost: the epoch they cut short ends here."""
        if self.lost and self.epoch < self.epochs and self.samples > self.ends - self.size:
            self._end_epoch(time.perf_counter())

    def final_metrics(self, evaluate: Callable[[], tuple[float, float]]) -> tuple[float, float]:
        """Held-out (loss, accuracy) of the final weights: the last epoch's evaluation if no
        update was applied since (every applied update brings samples), else evaluate()
        now (a run stopped mid-epoch, sharded servers, updates refused at the end)."""
        if self.evaluated_at == self.samples and self.history and self.history[-1]["test_loss"] is not None:
            return self.history[-1]["test_loss"], self.history[-1]["test_accuracy"]
        return evaluate()

    def add(self, loss_sum: float, m: float) -> None:
        """An applied update of m samples whose batch losses sum to loss_sum."""
        if self.step_losses is not None:
            self.step_losses.append(loss_sum / m if m else None)
        self.samples += int(m)
        self.loss_sum += loss_sum
        self.loss_n += m
        now = time.perf_counter()
        while self.epoch < self.epochs and self.samples >= self.ends - 1e-6:
            self._end_epoch(now)
        if now - self.last_line >= self.every_s:
            self.last_line = now
            done = int(self.samples - (self.ends - self.size))
            self.report(f"  epoch {self.epoch + 1}: {done:,}/{int(self.size):,} samples  "
                        f"train loss {self.loss_sum / max(self.loss_n, 1):.4f}  "
                        f"{(self.samples - self.first_samples) / max(now - self.t_start, 1e-9):,.0f} samples/s")

    def _end_epoch(self, now: float) -> None:
        self.epoch += 1
        self.ends += self.size
        test_loss = test_acc = None
        if self.evaluate is not None:
            prev = self.clock.phase
            self.clock.switch("evaluate")
            test_loss, test_acc = self.evaluate()
            self.evaluated_at = self.samples
            self.clock.switch(prev)
        elapsed = now - self.t_start
        h = {"epoch": self.epoch, "samples": self.samples, "time_s": round(elapsed, 4),
             "wall_s": round(self.clock.elapsed(), 4),  # since this rank's process started
             "train_loss": self.loss_sum / max(self.loss_n, 1),
             "test_loss": test_loss, "test_accuracy": test_acc}
        self.history.append(h)
        held_out = f"held-out loss {test_loss:.4f} acc {test_acc:.4f}  " if test_acc is not None else ""
        self.report(f"epoch {self.epoch}/{self.epochs}  samples {self.samples:>9,}  "
                    f"train loss {h['train_loss']:.4f}  {held_out}"
                    f"{(self.samples - self.first_samples) / max(elapsed, 1e-9):>9,.0f} samples/s  "
                    f"{elapsed:6.1f} s")
        self.loss_sum = self.loss_n = 0.0
        self.last_line = now


FALLING_FAST = 0.05  # the loss still falling this much an epoch at the end (and by at least
MATTERS = 0.01       # this many nats an epoch: a loss near 0 falling fast is done): not converged
DONE = 0.05          # a loss below this many nats is done, however fast it still falls
STILL_AHEAD = 0.2    # as many epochs again, at the recent rate, would lower the loss by this share
AHEAD_NATS = 0.05    # (and by this many nats): not converged, however slowly it falls an epoch


def convergence_notes(history: list[dict], refused: int) -> list[str]:
    """One line each for what the end of a run says about its training (from the held-out
    loss, else the training loss where the held-out one was not evaluated each epoch):
      falling fast   the loss fell by FALLING_FAST (and MATTERS nats) or more in each of the
                     last (up to two) epochs;
      falling slowly or else, at the rate it fell over the last fifth of the epochs (at least
                     two; or over their second half, if slower: a loss flattening out), as
                     many epochs again would lower it by STILL_AHEAD of itself and
                     AHEAD_NATS or more: a long run that underfits, 1-2 % an epoch (issue 14's
                     case: digits at the old default lr, held-out loss 1.85 of a chance level of
                     2.30 after 20 epochs, falling 0.02 an epoch, with no note);
    neither when the loss ends below DONE nats; and updates refused as NaN or inf."""
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
    if refused:
        notes.append(f"{refused:,} update(s) were refused for NaN or inf values: training was unstable; "
                     "lower --lr")
    return notes
