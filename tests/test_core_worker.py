"""The worker's loop written once (asgd.core.worker), driven with no MPI and no simulator:
a stand-in link, compute and clock record every call in one list, and each test checks
the sequence a schedule, an overlap mode, a stop or an epoch end must give."""

import numpy as np
import pytest

from asgd.core.schedule import Schedule, schedule
from asgd.core.worker import WorkerStats, allreduce_loop, loop


class Link:
    """A link whose exchanges complete when waited for; replies[ticket] says what the
    reply to that push carries (stop: the servers said to stop; asked: a signal's stop;
    version: the servers' round)."""

    def __init__(self, calls, replies=None):
        self.calls, self.replies = calls, replies or {}
        self.step, self.versions = 0, [0.0, 0.0]
        self.told_to_stop = self.asked_to_stop = False
        self.stats = WorkerStats()
        self.buf = np.full(3, np.nan)

    def delta(self):
        self.calls.append("delta")
        return self.buf

    def push_pull(self, dw, loss_sum, samples, stop=False):
        self.calls.append(("push", self.step, samples, loss_sum) + (("stop",) if stop else ()))
        self.pushed = dw.copy()
        self.step += 1
        return self.step - 1

    def wait(self, ticket):
        self.calls.append(("wait", ticket))
        reply = self.replies.get(ticket, {})
        self.told_to_stop = reply.get("stop", False) or reply.get("asked", False)
        self.asked_to_stop = reply.get("asked", False)
        if "version" in reply:
            self.versions = [float(reply["version"]), float(reply["version"] - 1)]

    def close(self):
        self.calls.append("close")
        return self.stats


class Clock:
    """The phase clock (switch, step) and a clock of seconds that a test moves on."""

    def __init__(self, calls):
        self.calls, self.step, self.t = calls, None, 0.0

    def switch(self, phase):
        self.calls.append(phase)

    def now(self):
        return self.t


def run(plan, n, replies=None, phases=False, stop_requested=lambda: False, calls=None, **kw):
    """The loop over n points; returns (calls, stats, link). The compute records the
    batch's size and the clock's step numbering, and returns a loss of 0.5."""
    calls = [] if calls is None else calls
    link, clock = Link(calls, replies), Clock(calls if phases else [])

    def compute(batch, dw):
        calls.append(("compute", len(batch), clock.step))
        dw[:] = 1.0
        return 0.5
    st = loop(link, compute, clock, plan, n, stop_requested, now=clock.now, **kw)
    return calls, st, link


def plan(overlap=True, **kw):
    return Schedule(batch=2, epochs=1, seed=(0, 0), lr=1.0, overlap=overlap, adaptive=False, **kw)


def test_overlap_computes_each_step_beside_the_previous_exchange():
    calls, st, _ = run(plan(), 6)
    assert calls == ["delta", ("compute", 2, 0), ("push", 0, 2, 1.0),
                     "delta", ("compute", 2, 1), ("wait", 0), ("push", 1, 2, 1.0),
                     "delta", ("compute", 2, 2), ("wait", 1), ("push", 2, 2, 1.0),
                     ("wait", 2), "close"]
    assert st.waited == 0 and not st.stopped


def test_the_phases_around_an_overlapped_step():
    calls, _, _ = run(plan(), 4, phases=True)
    assert calls == ["compute", "delta", ("compute", 2, 0), "push", ("push", 0, 2, 1.0),
                     "compute", "delta", ("compute", 2, 1), "comm_wait", ("wait", 0), "push", ("push", 1, 2, 1.0),
                     "comm_wait", ("wait", 1), "close"]


def test_without_overlap_every_push_is_waited_for_before_the_next_step():
    calls, st, _ = run(plan(overlap=False), 4, phases=True)
    assert calls == ["compute", "delta", ("compute", 2, 0), "push", ("push", 0, 2, 1.0), "comm_wait", ("wait", 0),
                     "compute", "delta", ("compute", 2, 1), "push", ("push", 1, 2, 1.0), "comm_wait", ("wait", 1),
                     "close"]
    assert st.waited == 2


def test_an_exchange_lasting_many_steps_is_waited_for_then_overlapped_again_once_short():
    """OverlapRule in the loop: exchange 0, seen beside step 1, lasted 10 steps (over 8):
    push 1 is waited for; once an exchange waited for lasts under 4 steps, overlap again."""
    calls = []
    clock = Clock([])
    link = Link(calls)
    lasts = {0: 9.0, 1: 3.0}   # seconds each exchange takes to wait for, beyond its step

    def wait(ticket):
        Link.wait(link, ticket)
        clock.t += lasts.get(ticket, 0.0)
    link.wait = wait

    def compute(batch, dw):
        calls.append("compute")
        clock.t += 1.0   # a step of 1 s
        return 0.0
    p = Schedule(batch=1, epochs=1, seed=(0, 0), lr=1.0, overlap=True, adaptive=True)
    st = loop(link, compute, clock, p, 4, now=clock.now)
    assert [c for c in calls if c != "delta"] == [
        "compute", ("push", 0, 1, 0.0),
        "compute", ("wait", 0), ("push", 1, 1, 0.0), ("wait", 1),   # 1 + 9 s seen: wait from now on
        "compute", ("push", 2, 1, 0.0),                             # push 1 waited 3 s: under 4 steps
        "compute", ("wait", 2), ("push", 3, 1, 0.0), ("wait", 3), "close"]
    assert st.waited == 1


def test_sync_pads_a_short_share_with_empty_steps_of_zero_weight():
    """Every worker the same number of steps (the largest share's): a share of 3 points
    in batches of 2 over 3 steps is 2, 1, then an empty step that pushes zeros."""
    calls, st, link = run(plan(overlap=False, steps_per_epoch=3), 3)
    assert [c for c in calls if c != "delta" and c[0] != "wait"] == [
        ("compute", 2, 0), ("push", 0, 2, 1.0), ("compute", 1, 1), ("push", 1, 1, 0.5), ("push", 2, 0, 0.0), "close"]
    assert (link.pushed == 0.0).all()
    assert st.waited == 3


def test_schedule_spells_the_run_options_as_the_roles_do():
    sync = schedule("ps", "sync", "auto", 4, 2, points=10, replicas=3, seed=(1, 2), lr=0.1)
    assert (sync.steps_per_epoch, sync.overlap) == (1, False)   # ceil(ceil(10 / 3) / 4)
    assert [len(b) for b in sync.batches(3, 0)] == [3]
    ar = schedule("allreduce", "async", "on", 4, 2, points=40, replicas=3, seed=(1, 2), lr=0.1)
    assert (ar.steps_per_epoch, ar.overlap) == (4, False)
    asy = schedule("ps", "ssp", "auto", 4, 2, points=40, replicas=3, seed=(1, 2), lr=0.1)
    assert (asy.steps_per_epoch, asy.overlap, asy.adaptive) == (None, True, True)
    assert [len(b) for b in asy.batches(13, 0)] == [4, 4, 4, 1]
    assert not schedule("ps", "async", "off", 4, 2, 40, 3, (1, 2), 0.1).overlap
    assert list(Schedule(4, 1, (0, 0), 1.0, shuffle=False).batches(6, 0)) == [range(0, 4), range(4, 6)]


@pytest.mark.parametrize("overlap", [True, False])
def test_a_stop_in_a_reply_ends_the_loop_after_that_step_and_still_sends_done(overlap):
    calls, st, _ = run(plan(overlap=overlap, steps_per_epoch=10), 20, replies={1: {"stop": True}})
    pushes = [c[1] for c in calls if c[0] == "push"]
    # waited at once, the reply to push 1 ends the loop after it; overlapped, it comes in
    # beside step 2, which is pushed, and then completed
    assert pushes == ([0, 1, 2] if overlap else [0, 1])
    assert calls[-2:] == [("wait", pushes[-1]), "close"]
    assert not st.stopped   # the servers said the run is done: not an early stop


def test_a_stop_asked_by_a_signal_is_an_early_stop():
    _, st, _ = run(plan(overlap=False), 20, replies={0: {"asked": True}})
    assert st.stopped


def test_async_stops_at_once_on_its_own_signal_and_completes_the_exchange_in_flight():
    """A signal during step 1: push 1 carries it, step 2 never starts, exchange 1 is
    completed and `done` sent."""
    calls = []
    link, clock = Link(calls), Clock([])

    signal = [False]

    def compute(batch, dw):
        calls.append("compute")
        signal[0] = signal[0] or link.step == 1   # the signal comes during step 1
        return 0.0
    st = loop(link, compute, clock, plan(), 20, lambda: signal[0], now=clock.now)
    assert [c for c in calls if c != "delta"] == [
        "compute", ("push", 0, 2, 0.0), "compute", ("wait", 0), ("push", 1, 2, 0.0, "stop"), ("wait", 1), "close"]
    assert st.stopped


def test_sync_carries_a_signal_in_its_pushes_until_the_servers_answer_stop():
    asked = [False]
    replies = {1: {"asked": True}}
    calls = []
    link, clock = Link(calls, replies), Clock([])

    def compute(batch, dw):
        asked[0] = link.step >= 1   # the signal comes during step 1
        return 0.0
    st = loop(link, compute, clock, plan(overlap=False), 20, lambda: asked[0], now=clock.now)
    assert [c for c in calls if c[0] == "push"] == [("push", 0, 2, 0.0), ("push", 1, 2, 0.0, "stop")]
    assert calls[-1] == "close" and st.stopped


def test_open_ended_epochs_run_until_told_and_follow_the_servers_rounds():
    """Sync with backup workers: epochs go on past plan.epochs until a reply says stop,
    and a reply's round renumbers my next push (a late worker catches up)."""
    p = plan(overlap=False, steps_per_epoch=1, open_ended=True)
    calls, _, link = run(p, 2, replies={0: {"version": 5}, 6: {"stop": True}})
    assert [c[1] for c in calls if c[0] == "push"] == [0, 5, 6]   # 3 epochs of one step: more than plan.epochs
    assert link.step == 7


def test_a_closed_schedule_does_not_follow_the_rounds():
    calls, _, _ = run(plan(overlap=False, steps_per_epoch=2), 4, replies={0: {"version": 5}})
    assert [c[1] for c in calls if c[0] == "push"] == [0, 1]


def test_the_epoch_end_meets_with_no_exchange_in_flight():
    calls = []
    p = Schedule(batch=2, epochs=2, seed=(0, 0), lr=1.0, overlap=True, adaptive=False)
    run(p, 4, calls=calls, epoch_end=lambda e: calls.append(("meet", e)))
    assert [c for c in calls if c != "delta" and c[0] != "compute"] == [
        ("push", 0, 2, 1.0), ("wait", 0), ("push", 1, 2, 1.0), ("wait", 1), ("meet", 0),
        ("push", 2, 2, 1.0), ("wait", 2), ("push", 3, 2, 1.0), ("wait", 3), ("meet", 1), "close"]


# -- the allreduce rank's loop ------------------------------------------------------------

class Reducer:
    """Sums nothing: records the calls; refuses the sums of steps in `refuse`, and says
    stop after the step `stop_at`: asked (a signal), or with done=True the run done (a
    target reached)."""

    def __init__(self, calls, refuse=(), stop_at=None, done=False):
        self.calls, self.refuse, self.stop_at, self.done = calls, set(refuse), stop_at, done
        self.stats, self.told_to_stop, self.asked_to_stop, self.k = WorkerStats(), False, False, 0
        self.buf = np.full(2, np.nan)

    def delta(self):
        return self.buf

    def sum(self, dw, loss_sum, m, stop):
        self.calls.append(("sum", m, loss_sum, stop, dw.tolist()))

    def apply(self, m):
        k, self.k = self.k, self.k + 1
        if k in self.refuse:
            self.calls.append(("refuse", k))
            return False
        self.calls.append(("apply", k))
        self.stats.updates += 1
        self.told_to_stop = k == self.stop_at
        self.asked_to_stop = self.told_to_stop and not self.done
        return True


def allreduce(reducer, calls, n, steps):
    clock = Clock(calls)

    def compute(batch, dw):
        calls.append(("compute", len(batch), clock.step))
        dw[:] = 2.0
        return 0.25
    p = Schedule(batch=2, epochs=1, seed=(0, 0), lr=1.0, overlap=False, steps_per_epoch=steps)
    return allreduce_loop(reducer, compute, clock, p, n)


def test_allreduce_computes_sums_then_applies_every_step_and_pads_like_sync():
    calls = []
    st = allreduce(Reducer(calls), calls, 3, 3)
    assert calls == ["compute", ("compute", 2, 0), "comm_wait", ("sum", 2, 0.5, False, [2.0, 2.0]), "aggregate",
                     ("apply", 0),
                     "compute", ("compute", 1, 1), "comm_wait", ("sum", 1, 0.25, False, [2.0, 2.0]), "aggregate",
                     ("apply", 1),
                     "compute", "comm_wait", ("sum", 0, 0.0, False, [0.0, 0.0]), "aggregate", ("apply", 2)]
    assert st.updates == 3 and not st.stopped


def test_allreduce_stops_after_the_step_whose_sum_says_stop_but_not_on_a_refused_one():
    calls = []
    st = allreduce(Reducer(calls, refuse=[0], stop_at=1), calls, 10, 5)
    assert [c for c in calls if c[0] in ("apply", "refuse")] == [("refuse", 0), ("apply", 1)]
    assert st.stopped and st.updates == 1


def test_allreduce_ends_after_the_step_whose_sum_says_done_and_is_not_stopped_early():
    """A run done (rank 0's target reached) ends every rank after the same step, as a stop
    does, but it was not stopped early: no checkpoint to resume from, no `stopped`."""
    calls = []
    st = allreduce(Reducer(calls, stop_at=2, done=True), calls, 10, 5)
    assert [c for c in calls if c[0] == "apply"] == [("apply", 0), ("apply", 1), ("apply", 2)]
    assert not st.stopped and st.updates == 3
