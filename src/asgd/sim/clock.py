"""Per-rank phase accounting and trace events in simulated time: asgd.run.trace's
PhaseClock and TraceClock, but reading SimGrid's clock instead of perf_counter, so a
simulated rank's phases, timeline and trace have the same names and meaning as a real
rank's (and asgd.run.trace.export writes the trace)."""

from __future__ import annotations

import numpy as np

from ..run.trace import INIT_PHASES, PHASES


class SimClock:
    def __init__(self, now, first: str = "init", trace: bool = False, window: tuple[int, int] = (0, 200)):
        """now(): simulated seconds."""
        self.now = now
        self.phase = first
        self.totals: dict[str, float] = {}
        self.since = now()
        self.step = 0
        self.trace = trace
        self.first, self.last = window
        self.intervals: list[tuple[int, int, int]] = []
        self.messages: list[tuple[int, int, int, int, int]] = []
        self._code = {p: i for i, p in enumerate(PHASES)}
        self.sub: dict[str, float] = {}   # init's read / parse / shuffle, not added to the total again

    def switch(self, phase: str) -> float:
        t = self.now()
        prev, since = self.phase, self.since
        self.totals[prev] = self.totals.get(prev, 0.0) + t - since
        if self.trace and prev != phase and (self.first <= self.step < self.last or prev in INIT_PHASES) \
                and t > since:
            self.intervals.append((_ns(since), _ns(t), self._code.setdefault(prev, len(self._code))))
        self.phase, self.since = phase, t
        return t

    def add_sub(self, name: str, seconds: float) -> None:
        """A part of init (read, parse, shuffle): reported beside init, inside it."""
        self.sub[name] = self.sub.get(name, 0.0) + seconds

    def message(self, kind: int, peer: int, nbytes: int, flow: int) -> None:
        """As asgd.run.trace.TraceClock.message: flow = flow_id(worker, server, step, reply)."""
        if self.trace and self.first <= (flow & 0xFFFFFFFF) >> 1 < self.last:
            self.messages.append((_ns(self.now()), kind, peer, nbytes, flow))

    def seconds(self) -> dict[str, float]:
        self.switch(self.phase)
        return {**dict(self.totals), **self.sub}

    def events(self) -> dict:
        """asgd.run.trace.export's per-rank record."""
        names = sorted(self._code, key=self._code.get)
        return {"intervals": np.array(self.intervals, np.int64).reshape(-1, 3),
                "messages": np.array(self.messages, np.int64).reshape(-1, 5), "phases": names, "dropped": 0}


def _ns(t: float) -> int:
    return int(round(t * 1e9))
