"""Per-rank phase accounting and, with --trace, an event recorder.

A rank is always in exactly one phase; `switch` closes the current one and opens the
next with a single clock read, so phases add up to the rank's wall time. PhaseClock
keeps only the totals: with tracing off that is all the hot path pays. TraceClock also
stores every phase interval and message event, inside a window of steps, into
preallocated int64 arrays (no Python object per event); `export` turns them into the
Chrome Trace Event format that Perfetto and chrome://tracing open.
"""

from __future__ import annotations

import json
import time

import numpy as np

from ..core.wire import SEND, flow_is_reply, flow_step

PHASES = ("init", "read", "parse", "shuffle", "compute", "replica_sum", "push", "comm_wait", "aggregate",
          "evaluate", "idle")   # replica_sum: a model-parallel replica's members summing their logits
INIT_PHASES = ("init", "read", "parse", "shuffle")  # always recorded, whatever the window


class PhaseClock:
    traces = False   # message() records nothing: callers may skip building its arguments

    def __init__(self, first: str, t0_ns: int | None = None):
        self.totals_ns: dict[str, int] = {}
        self.phase = first
        self.t0_ns = time.perf_counter_ns() if t0_ns is None else t0_ns
        self.since_ns = self.t0_ns
        self.first_end_ns: int | None = None   # when the first phase (asgd.train's init) was left
        self.step = 0  # the loops set it; TraceClock records only a window of steps

    def switch(self, phase: str) -> int:
        """Enter `phase`; returns the clock reading (ns)."""
        now = time.perf_counter_ns()
        self.totals_ns[self.phase] = self.totals_ns.get(self.phase, 0) + now - self.since_ns
        if self.first_end_ns is None and phase != self.phase:
            self.first_end_ns = now
        self.phase, self.since_ns = phase, now
        return now

    def message(self, kind: int, peer: int, nbytes: int, flow: int) -> None:
        """A message (wire.SEND or RECV) with `peer`, `flow` = wire.flow_id(...) of the
        current step (tracing off: nothing)."""

    def seconds(self) -> dict[str, float]:
        """Phase -> seconds so far (the open phase included up to now)."""
        self.switch(self.phase)
        return {k: v / 1e9 for k, v in self.totals_ns.items()}

    def elapsed(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9


class TraceClock(PhaseClock):
    """PhaseClock that also records intervals and messages for steps in [first, last)."""
    traces = True

    def __init__(self, first: str, t0_ns: int | None = None, steps: tuple[int, int] = (0, 200),
                 capacity: int = 200_000):
        super().__init__(first, t0_ns)
        self.first, self.last = steps
        self.intervals = np.empty((capacity, 3), np.int64)  # start ns, end ns, phase code
        self.messages = np.empty((capacity, 5), np.int64)   # t ns, kind, peer, bytes, flow id
        self.n_iv = self.n_msg = 0
        self.dropped = 0  # events past capacity: counted, never a reallocation
        self._code = {p: i for i, p in enumerate(PHASES)}

    def switch(self, phase: str) -> int:
        since, prev = self.since_ns, self.phase
        now = super().switch(phase)
        if prev != phase and (self.first <= self.step < self.last or prev in INIT_PHASES):
            if self.n_iv < len(self.intervals):
                self.intervals[self.n_iv] = (since, now, self._code.setdefault(prev, len(self._code)))
                self.n_iv += 1
            else:
                self.dropped += 1
        return now

    def message(self, kind: int, peer: int, nbytes: int, flow: int) -> None:
        if self.first <= flow_step(flow) < self.last:  # the message's step: both ends agree on the window
            if self.n_msg < len(self.messages):
                self.messages[self.n_msg] = (time.perf_counter_ns(), kind, peer, nbytes, flow)
                self.n_msg += 1
            else:
                self.dropped += 1

    def events(self) -> dict:
        """What rank 0 gathers: the filled part of the arrays and the phase names."""
        names = sorted(self._code, key=self._code.get)
        return {"intervals": self.intervals[:self.n_iv].copy(), "messages": self.messages[:self.n_msg].copy(),
                "phases": names, "dropped": self.dropped}


def export(path: str, per_rank: list[dict], names: list[str], offsets_ns: list[int], t0_ns: int) -> dict:
    """Write a Chrome Trace Event file: one process per rank named by role, a slice per
    phase interval, and a flow arrow from each message's send to its receive.
    offsets_ns[r] is added to rank r's clock to put it on rank 0's; t0_ns is time zero."""
    ev: list[dict] = []
    sends: dict[int, tuple[int, float]] = {}
    recvs: dict[int, tuple[int, float]] = {}
    for r, (rec, name) in enumerate(zip(per_rank, names)):
        ev.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": name}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        def us(t):
            return (int(t) + offsets_ns[r] - t0_ns) / 1e3
        for start, end, code in rec["intervals"]:
            ev.append({"ph": "X", "name": rec["phases"][code], "cat": "phase", "pid": r, "tid": 0,
                       "ts": us(start), "dur": max((int(end) - int(start)) / 1e3, 0.001)})
        for t, kind, peer, nbytes, flow in rec["messages"]:
            ts = us(t)
            what = "send" if kind == SEND else "recv"
            ev.append({"ph": "i", "s": "t", "name": what, "cat": "mpi", "pid": r, "tid": 0, "ts": ts,
                       "args": {"peer": int(peer), "bytes": int(nbytes)}})
            (sends if kind == SEND else recvs)[int(flow)] = (r, ts)
    flows = 0
    for fid, (src, ts) in sends.items():
        if fid in recvs:
            dst, tr = recvs[fid]
            name = "w'" if flow_is_reply(fid) else "Δw"
            ev.append({"ph": "s", "id": fid, "name": name, "cat": "msg", "pid": src, "tid": 0, "ts": ts})
            ev.append({"ph": "f", "bp": "e", "id": fid, "name": name, "cat": "msg", "pid": dst, "tid": 0,
                       "ts": max(tr, ts)})
            flows += 1
    with open(path, "w") as f:
        json.dump({"traceEvents": ev, "displayTimeUnit": "ms"}, f, separators=(",", ":"))
    return {"events": len(ev), "flows": flows, "dropped": sum(r["dropped"] for r in per_rank)}
