"""A server shard's counts and its entry of results.json's `ranks` (docs/formats.md):
written once, kept by asgd.core.shard, reported alike by a real run and a simulated one."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ServerStats:
    updates: int = 0   # Delta-w received (requests), applied or refused
    rounds: int = 0    # versions of the shard (= updates in async and ssp; one per round in sync)
    bytes_sent: int = 0
    bytes_recv: int = 0
    staleness: list = field(default_factory=list)  # per worker: its Delta-w's staleness when it arrived
    step_gap: list = field(default_factory=list)   # per worker: steps ahead of the slowest
    refused: int = 0   # Delta-w with NaN or inf, not applied
    stopped: bool = False  # a stop request ended the run early
    cuts: int = 0      # checkpoint cuts completed
    dropped: int = 0   # pushes not applied: sync with backup workers' that came after their round was
                       # applied, and any that came after the target was reached
    lost: list = field(default_factory=list)   # workers found dead: {rank, time, updates}

    @classmethod
    def of(cls, workers: int, cuts: int = 0) -> ServerStats:
        """Empty counts for a shard with `workers` workers (cuts: the cut a run resumed from)."""
        return cls(staleness=[[] for _ in range(workers)], step_gap=[[] for _ in range(workers)], cuts=cuts)

    def record(self, shard: tuple[int, int], ranks: list[int]) -> dict:
        """This server's entry of results.json's `ranks` (the run adds the rest); its
        workers' staleness and step-gap histograms by their rank."""
        return {"role": "server", "stopped": self.stopped, "refused": self.refused,
                "updates": self.updates, "rounds": self.rounds, "bytes_sent": self.bytes_sent,
                "bytes_recv": self.bytes_recv, "shard": list(shard), "requests": self.updates, "cuts": self.cuts,
                "dropped": self.dropped, "lost": self.lost,
                "staleness_hist": {r: np.bincount(v).tolist() for r, v in zip(ranks, self.staleness)},
                "step_gap_hist": {r: np.bincount(v).tolist() for r, v in zip(ranks, self.step_gap)}}


def merge_shards(records: list[dict]) -> dict:
    """One server's entry for the shards it served (with more slices than servers: a few,
    consecutive): their counts added, their bounds joined."""
    if len(records) == 1:
        return records[0]
    out = dict(records[0])
    for k in ("updates", "requests", "bytes_sent", "bytes_recv", "refused", "weight_bytes"):
        if k in out:
            out[k] = sum(r[k] for r in records)
    # rounds stay the first shard's: every step of a replica makes one version of each
    for k in ("staleness_hist", "step_gap_hist"):
        out[k] = {rank: h for r in records for rank, h in r[k].items()}
    out["shard"] = [records[0]["shard"][0], records[-1]["shard"][1]]
    out["stopped"] = any(r["stopped"] for r in records)
    return out
