"""A server shard's bookkeeping as a state machine with no I/O in it (sans-I/O, as
Python's h11): the transport feeds it events (a push arrived, a worker is done, a worker
was found dead) and it makes the transport act, in order, through a small effects object:

    reply(j, head)         send worker j the current shard with this pull header
                           (asgd.core.wire.PULL_FIELDS' values: version, stop, cut)
    apply(j, share) -> ok  move the shard along worker j's Delta-w, with `share` of the
                           learning rate, into its next version; False: not finite, nothing moved
    apply_mean(weights, share) -> ok
                           a sync round: move it along sum(weight * Delta-w_j) over
                           weights' (j, weight), in that order (worker order: deterministic)
    finite(j) -> ok        whether worker j's Delta-w is finite (sync checks on arrival)
    release(j)             worker j's push is taken (applied and answered): its receive
                           buffer may take the next one
    save(rounds, cut)      save the shard as checkpoint cut `cut`

and the loop's end: `live` (the workers not yet retired) is 0 once every worker said it
was done or was found dead, whatever the policy.

Why effects called in order rather than a list of actions returned: an apply's outcome
(finite or refused) decides what follows it at once (the refused count, the divergence
guard, the samples a version reports, the version number the next reply carries), so
returned actions would need an applied(ok) event fed back between every two of them;
calling the transport keeps each rule a straight line. Tests pass a recorder.

The MPI transport (asgd.protocol.server) and the simulator (asgd.sim.actors) both drive
it; the reply policies (asgd.core.policy) decide over its state.

Checkpoints are consistent cuts (Chandy and Lamport's idea, carried by the workers):
the leader (server 0) starts cut c when its checkpoints say it is due and stamps c on its
replies; a worker stamps each push with the last cut it heard of, and sends the same push
to every server, so every server splits the pushes alike: those stamped below c are in
the cut, the rest are not. A server applies the ones in the cut and holds (received and
counted, not applied nor answered) each worker's first one past it, until every active
worker's has come (a retired worker's pushes all precede the cut); then it saves its
shard as cut c and goes on with the held pushes. Every shard's file of cut c is then the
same pushes applied: one model. A worker is held at most for one push; ssp's bound counts
a held push as taken, so it never waits on a cut.

Lost workers: the transport finds who died (ULFM) and says so (lost()); the shard records
it (rank, time, the pushes it made), retires it as if it had said it was done, and goes
on with the rest: ssp's bound is over the live workers, a sync round waits for the live
ones, a cut counts it as past. What it did not push is lost to training.
"""

from __future__ import annotations

import math

import numpy as np

from .stats import ServerStats
from .wire import PULL_HEADER, R_CUT, R_STOP, R_VERSION, STOP_ASKED, STOP_DONE

DIVERGED_AFTER = 10  # refused Delta-w in a row that end the job


class DivergenceError(RuntimeError):
    """Training produced NaN or inf again and again: the learning rate is too high."""


class Shard:
    def __init__(self, ranks: list[int], effects, policy=None, due=None, stale_step=None,
                 on_version=None, on_lost=None, cuts_done: int = 0):
        """ranks: the workers' ranks (j indexes them); effects: the transport (above);
        policy: asgd.core.policy's (may be set later); due(rounds): whether a cut is due
        (the leader's checkpoints; None: this shard starts none); stale_step(staleness):
        the share of the learning rate a push of that staleness moves w by (None: all);
        on_version(rounds, loss_sum, samples): after each new version (progress); it
        returns True once the run is done (a target reached): replies then say so;
        on_lost(rank, samples it pushed); cuts_done: the cut the run resumed from."""
        W = len(ranks)
        self.ranks, self.W, self.fx, self.policy = list(ranks), W, effects, policy
        self.due, self.stale_step = due, stale_step
        self.on_version, self.on_lost = on_version, on_lost
        self.st = ServerStats.of(W, cuts_done)
        self.active = np.ones(W, bool)
        self.live = W                            # active workers (the loop's test, without numpy)
        self.steps = np.zeros(W, np.int64)       # pushes taken per worker
        self.slowest = 0                         # the fewest an active worker took (gap(): no numpy min a push)
        self.levels = {0: W}                     # active workers per count of pushes taken
        # per worker, Python numbers: read and written every push (a numpy scalar's += costs ~0.2 us)
        self.samples = [0.0] * W                 # samples their pushes brought
        self.pushed_step = [0] * W               # each worker's last push's step
        self.lr_scale = [1.0] * W                # each worker's last push: the share of lr its staleness earns
        self.step_share = 1.0                    # the share of lr every update takes (halve_step)
        self.refused_in_a_row = 0
        self.stopping = False   # a stop request: replies tell the workers to stop
        self.finished = False   # the run is done (its target reached, or sync with backup workers its
                                # epochs trained): so say the replies
        self.goal = None        # goal(): whether they are (the shard that keeps the progress)
        self.at_target = False  # on_version said the target is reached: later pushes are not applied,
                                # so the shard saved is the one that reached it
        self.collecting = 0                      # the cut being collected (0: none)
        self.past = np.zeros(W, bool)            # whose push past it has come
        self.held: list[tuple] = []              # (j, cut, loss_sum, m) past it, not yet taken

    # -- events ------------------------------------------------------------------------

    def pushed(self, j: int, version: float, step: int, cut: int, loss_sum: float, samples: float,
               stop: bool = False) -> None:
        """Worker j's push has arrived, its header's values (stop: it carries a stop request)."""
        self.stopping |= stop
        staleness = self.st.rounds - int(version)
        self.st.staleness[j].append(staleness)
        if self.stale_step is not None:   # a held push keeps it: its worker pushes no more until answered
            self.lr_scale[j] = self.stale_step(staleness)
        self.st.updates += 1
        taken = self.steps[j] = int(self.steps[j]) + 1   # one numpy read, not two
        if self.active[j]:
            self.count_step(taken)
        self.samples[j] += samples
        self.pushed_step[j] = step
        if self.at_target:   # computed before its worker heard: answered (done), not applied
            self.st.dropped += 1
            self.reply(j)
            self.release(j)
            return
        self.route(j, cut, loss_sum, samples)
        self.answer_due()

    def done(self, j: int) -> None:
        """Worker j's end-of-work message (it comes after j took its last reply)."""
        self.retire(j)
        self.maybe_cut()
        self.answer_due()

    def lost(self, j: int, when: float) -> None:
        """Worker j was found dead at time `when`."""
        self.st.lost.append({"rank": self.ranks[j], "time": when, "updates": int(self.steps[j])})
        self.retire(j)
        if self.on_lost:
            self.on_lost(self.ranks[j], float(self.samples[j]))
        self.maybe_cut()
        self.answer_due()

    def halve_step(self) -> float:
        """Every later update takes half the step it would have (a guard against a
        climbing loss: asgd.run.progress); returns the share of lr they now take."""
        self.step_share *= 0.5
        return self.step_share

    # -- what policies use -------------------------------------------------------------

    def head(self) -> list[float]:
        """A reply's header: the current version, the stop flag, the last cut started."""
        head = [0.0] * PULL_HEADER
        head[R_VERSION] = self.st.rounds
        head[R_STOP] = STOP_ASKED if self.stopping else STOP_DONE if self.finished else 0.0
        head[R_CUT] = self.collecting or self.st.cuts
        return head

    def reply(self, j: int) -> None:
        self.fx.reply(j, self.head())

    def release(self, j: int) -> None:
        self.fx.release(j)

    def apply(self, j: int, loss_sum: float) -> bool:
        """Worker j's push applied with its staleness's share of the step; False: refused."""
        ok = math.isfinite(loss_sum) and self.fx.apply(j, self.step_share * self.lr_scale[j])
        return self.accept(ok, j)

    def acceptable(self, j: int, loss_sum: float) -> bool:
        """Worker j's push is finite, loss and Delta-w (else refused, counted)."""
        return self.accept(math.isfinite(loss_sum) and self.fx.finite(j), j)

    def apply_mean(self, weights: list[tuple[int, float]]) -> bool:
        """A sync round's sample-weighted mean applied; False: it overflowed (refused)."""
        return self.accept(self.fx.apply_mean(weights, self.step_share), None)

    def accept(self, ok: bool, j: int | None) -> bool:
        """Count a refused Delta-w (j None: a round's mean); DIVERGED_AFTER in a row end the job."""
        if ok:
            self.refused_in_a_row = 0
            return True
        self.st.refused += 1
        self.refused_in_a_row += 1
        if self.refused_in_a_row >= DIVERGED_AFTER:
            whose = "a round's mean" if j is None else f"from worker rank {self.ranks[j]}"
            raise DivergenceError(f"refused {self.refused_in_a_row} updates in a row with NaN or inf values "
                                  f"(the last {whose}): training diverged; lower --lr")
        return False

    def new_version(self, loss_sum: float, samples: float) -> None:
        """The shard has a new version; count it, report the samples it took in."""
        self.st.rounds += 1
        if self.on_version and self.on_version(self.st.rounds, loss_sum, samples):
            self.finished = self.at_target = True   # the replies tell the workers the run is done
        if self.due is not None and not self.collecting and self.due(self.st.rounds):
            self.start_cut()   # before this version's replies go out: they carry it

    def gap(self, j: int) -> int:
        """How many steps worker j is ahead of the slowest active worker (0 with none active)."""
        return max(int(self.steps[j]) - self.slowest, 0) if self.live else 0

    def count_step(self, now: int) -> None:
        """An active worker's pushes went from now - 1 to now: the levels move, and the
        slowest with them once no active worker is left at its level (then all are past it,
        and the one that moved is at the next)."""
        levels = self.levels
        levels[now] = levels.get(now, 0) + 1
        left = levels.pop(now - 1) - 1
        if left:
            levels[now - 1] = left
        elif now - 1 == self.slowest:
            self.slowest = now

    # -- retiring, answering, cuts ------------------------------------------------------

    def retire(self, j: int) -> None:
        if self.active[j]:
            self.active[j] = False
            self.live -= 1
            at = int(self.steps[j])
            left = self.levels.pop(at) - 1
            if left:
                self.levels[at] = left
            elif at == self.slowest and self.levels:
                self.slowest = min(self.levels)

    def answer_due(self) -> None:
        """Answer every worker the policy says is due, then free its push."""
        for j in self.policy.answerable(self):
            self.reply(j)
            self.release(j)

    def route(self, j: int, cut: int, loss_sum: float, m: float) -> None:
        """Worker j's accounted push, stamped `cut`: to the policy, or held past a cut."""
        if not self.collecting and cut > self.st.cuts:   # a cut server 0 started: collect it too
            self.start_cut()
        if self.collecting and cut >= self.collecting:
            self.past[j] = True
            self.held.append((j, cut, loss_sum, m))
            self.maybe_cut()
        else:
            self.policy.take(self, j, loss_sum, m)

    def start_cut(self) -> None:
        self.collecting = self.st.cuts + 1
        self.past[:] = False

    def maybe_cut(self) -> None:
        """Every active worker's push past the cut has come (or, sync with backup workers,
        a round's worth: the round before is complete on every server, and what a
        straggler still sends for it is late, dropped): save my shard as the cut, then go
        on with the held pushes (which may start the next cut)."""
        if not self.collecting:
            return
        quorum = self.policy.cut_quorum(self)
        if not ((self.past | ~self.active).all() or (quorum is not None and self.past.sum() >= quorum)):
            return
        if self.past.any():
            self.fx.save(self.st.rounds, self.collecting)
            self.st.cuts = self.collecting
        # else every worker retired and none pushed past it: server 0's own cut, started
        # at the end and never announced, which no other server saves; the final one will
        self.collecting = 0
        held, self.held = self.held, []
        for j, cut, loss_sum, m in held:
            self.route(j, cut, loss_sum, m)
