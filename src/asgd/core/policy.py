"""The reply policies: what a server shard applies, and whom it answers, when.

  Async  answer each push at once with the current shard, then apply its Delta-w (the
         paper's ASGD; the reply goes out before the update, so the server's work is
         off the worker's round trip, and a worker sees its own Delta-w one exchange
         later: one more version of staleness). reply_first=False: apply, then answer.
  SSP    apply each Delta-w, then answer, but hold a worker's answer while its next push
         would put it more than K steps ahead of the slowest active worker
         (stale-synchronous parallel; applied first, so a worker reads its own writes).
  Sync   hold the pushes until every active worker has pushed, apply their
         sample-weighted mean once, in worker order (deterministic), answer everyone.
         With `backup` workers (TensorFlow's SyncReplicasOptimizer) a round is applied
         once all but `backup` of the active workers have pushed; a push that comes after
         its round was applied is dropped, counted and answered at once.

A policy decides over the shard's state (asgd.core.shard.Shard: its steps, active
workers, rounds) and asks the shard to apply and to answer; it does no I/O itself.
"""

from __future__ import annotations


class Policy:
    def take(self, shard, j: int, loss_sum: float, m: float) -> None:
        """Worker j's accounted push, with its loss sum and samples: apply it or hold it."""
        raise NotImplementedError

    def cut_quorum(self, shard) -> int | None:
        """How many workers' pushes past a checkpoint cut complete it; None: every active one's."""
        return None

    def answerable(self, shard) -> list[int]:
        """Workers to answer now (each has a push taken and not yet answered)."""
        raise NotImplementedError


class Async(Policy):
    def __init__(self, reply_first: bool = True):
        self.reply_first = reply_first
        self.ready: list[int] = []

    def take(self, shard, j, loss_sum, m):
        if self.reply_first:
            shard.reply(j)
        if not shard.apply(j, loss_sum):
            loss_sum, m = 0.0, 0.0   # a refused update adds no samples to the progress
        shard.new_version(loss_sum, m)
        shard.st.step_gap[j].append(shard.gap(j))
        if self.reply_first:
            shard.release(j)
        else:
            self.ready.append(j)

    def answerable(self, shard):
        ready, self.ready = self.ready, []
        return ready


class SSP(Async):
    """Async, apply first, but a worker's answer waits while its next push would be more
    than K steps ahead of the slowest active worker; a retiring worker can release the others."""

    def __init__(self, K: int):
        super().__init__(reply_first=False)   # its bound is on what a worker has read: its own writes too
        self.K = K
        self.held: list[int] = []

    def answerable(self, shard):
        self.held += super().answerable(shard)
        anyone = shard.active.any()
        slowest = shard.steps[shard.active].min() if anyone else 0
        go = [j for j in self.held if not anyone or shard.steps[j] + 1 - slowest <= self.K]
        self.held = [j for j in self.held if j not in go]
        return go


class Sync(Policy):
    def __init__(self, backup: int = 0):
        self.backup = backup
        self.pending: dict[int, tuple] = {}   # j -> (loss_sum, samples) of the round in progress
        self.late: list[int] = []

    def quorum(self, shard) -> int:
        return max(1, int(shard.active.sum()) - self.backup)

    def cut_quorum(self, shard):
        return self.quorum(shard) if self.backup else None

    def take(self, shard, j, loss_sum, m):
        if self.backup and shard.pushed_step[j] < shard.st.rounds:
            shard.st.dropped += 1
            self.late.append(j)
            return
        if not shard.acceptable(j, loss_sum):   # checked on arrival: a round's weights need it
            loss_sum, m = 0.0, 0.0
        self.pending[j] = (loss_sum, m)

    def answerable(self, shard):
        late, self.late = self.late, []
        everyone = not any(shard.active[j] and j not in self.pending for j in range(shard.W))
        enough = self.backup and len(self.pending) >= self.quorum(shard)
        if not self.pending or not (everyone or enough):
            return late
        order = sorted(self.pending)
        total = sum(m for _, m in self.pending.values())
        for j in order:
            shard.st.step_gap[j].append(0)
        if total and not shard.apply_mean([(j, self.pending[j][1] / total) for j in order]):
            total = 0.0   # a mean that overflowed: refused too
        shard.new_version(sum(ls for ls, _ in self.pending.values()) if total else 0.0, total)
        if self.backup and shard.goal is not None and shard.goal():
            shard.finished = True   # workers train until told: rounds drop late pushes, so no fixed step count
        self.pending = {}
        return order + late


def policy(mode: str, staleness: int, backup: int = 0) -> Policy:
    """The reply policy of asgd.train's --mode (sync: with `backup` workers)."""
    return {"async": Async, "ssp": lambda: SSP(staleness), "sync": lambda: Sync(backup)}[mode]()
