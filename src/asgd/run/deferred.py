"""--eval-deferred's copies of w: taken on rank 0 during training at --eval-every's times,
evaluated after it (asgd.run.progress.EpochTracker.settle).

A copy into fresh memory costs its page faults as well as its bytes: 0.8 MB of MNIST's
784-256-10 took 50-70 us while freed memory was reused and 350-450 us after (2026-11-29),
an eighth of an epoch's training at 16 copies an epoch. So the copies the cadence will
take are allocated and touched before training, in init, and a copy during training is
a memcpy; past them (a cadence in seconds, or more versions than expected) a copy
allocates as it comes."""

from __future__ import annotations

import math

import numpy as np

from ..core.target import Cadence

PREALLOCATED_BYTES = 1 << 30   # at most this much memory touched ahead for the copies


def expected_copies(cadence: Cadence, epochs: int, n_train: int, update_samples: int) -> int:
    """How many copies a run takes: one at each epoch's end, and with a cadence of updates
    one every `every` versions of w (each of update_samples samples); a cadence in seconds
    is not known ahead (none counted beyond the epochs' ends)."""
    per_epoch = 1
    if cadence.kind == "updates":
        per_epoch += math.ceil(n_train / max(update_samples, 1)) // max(int(cadence.every), 1)
    return epochs * per_epoch


class Copies:
    """Storage for `count` copies of an n-value w, touched now (its pages faulted in),
    at most PREALLOCATED_BYTES of it; take(w) copies into the next free one."""

    def __init__(self, count: int, n: int, dtype):
        rows = max(0, min(count, PREALLOCATED_BYTES // max(n * np.dtype(dtype).itemsize, 1)))
        self.store = np.ones((rows, n), dtype)   # ones, not zeros: calloc's pages would fault in on first use
        self.used = 0

    def take(self, w: np.ndarray) -> np.ndarray:
        if self.used == len(self.store):
            return w.copy()
        out = self.store[self.used]
        np.copyto(out, w)
        self.used += 1
        return out
