"""Per-rank phase accounting: where each rank's time went.

A rank is always in exactly one phase; `switch` closes the current one and opens the
next with a single clock read, so phases add up to the rank's wall time and timing
costs one perf_counter_ns call per phase boundary.
"""

from __future__ import annotations

import time


class PhaseClock:
    def __init__(self, first: str, t0_ns: int | None = None):
        self.totals_ns: dict[str, int] = {}
        self.phase = first
        self.t0_ns = time.perf_counter_ns() if t0_ns is None else t0_ns
        self.since_ns = self.t0_ns

    def switch(self, phase: str) -> int:
        """Enter `phase`; returns the clock reading (ns)."""
        now = time.perf_counter_ns()
        self.totals_ns[self.phase] = self.totals_ns.get(self.phase, 0) + now - self.since_ns
        self.phase, self.since_ns = phase, now
        return now

    def seconds(self) -> dict[str, float]:
        """Phase -> seconds so far (the open phase included up to now)."""
        self.switch(self.phase)
        return {k: v / 1e9 for k, v in self.totals_ns.items()}

    def elapsed(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9
