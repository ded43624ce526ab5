"""The worker loop overlaps a step with the exchange in flight only while the exchange is
short against the step (asgd.core.schedule.OverlapRule): the rule's thresholds, and
run_worker driven through a stand-in link whose exchanges take as long as a test says,
recording for each step whether its w had the previous exchange's reply."""

import time

import numpy as np

from asgd.core.schedule import OverlapRule, Schedule
from asgd.core.worker import WorkerStats
from asgd.protocol.worker import run_worker


def test_the_rule_stops_overlapping_past_ratio_steps_and_resumes_under_half():
    rule = OverlapRule(True)
    assert rule.saw(0.01, 0.079) is True          # under 8 steps: go on overlapping
    assert rule.saw(0.01, 0.081) is False         # over 8: wait for w' first
    assert rule.saw(0.01, 0.05) is False          # between 4 and 8: stay (no flipping near the limit)
    assert rule.saw(0.01, 0.039) is True          # under 4: overlap again


def test_overlap_on_overlaps_whatever_it_sees():
    rule = OverlapRule(True, adaptive=False)
    assert rule.saw(0.001, 10.0) is True


def test_sync_never_overlaps_whatever_it_sees():
    rule = OverlapRule(False)
    assert rule.saw(1.0, 0.0) is False
    assert rule.on is False


class Clock:
    step = 0

    def switch(self, phase):
        pass


class Endpoint:
    clock = Clock()

    def stop_requested(self):
        return False


class Link:
    """A worker's link whose exchange completes exchange_s after its push; `w` is the
    number of the last exchange whose reply the worker has (0: none)."""

    def __init__(self, exchange_s):
        self.exchange_s, self.ep, self.stats = exchange_s, Endpoint(), WorkerStats()
        self.step = 0
        self.w = np.zeros(1)
        self.pushed_at, self.told_to_stop, self.asked_to_stop, self.progress = {}, False, False, None

    def delta(self):
        return np.zeros(1)

    def push_pull(self, dw, loss_sum, samples, stop=False):
        self.step += 1
        self.pushed_at[self.step] = time.perf_counter()
        return self.step

    def wait(self, ticket):
        left = self.pushed_at[ticket] + self.exchange_s - time.perf_counter()
        if left > 0:
            time.sleep(left)
        self.w = np.array([float(ticket)])

    def close(self):
        return self.stats


def replies_seen(exchange_s, step_s, steps=12, overlap=True):
    """For each step after the first, the exchanges its w missed: 0 when the reply of the
    push before it was in (it waited), 1 when it ran beside that exchange."""
    link = Link(exchange_s)
    seen = []

    def step(w, X, y, lr, dw):
        seen.append(link.step - int(w[0]))     # pushes made so far - the exchange this w came from
        time.sleep(step_s)
        return 0.0

    plan = Schedule(batch=1, epochs=1, seed=(0, 0), lr=1.0, overlap=overlap, progress=False)
    st = run_worker(link, np.zeros((steps, 2)), np.zeros(steps, np.int64), step, plan)
    return seen[1:], st


def test_a_short_exchange_runs_beside_every_step():
    seen, st = replies_seen(exchange_s=0.0, step_s=0.004)
    assert seen == [1] * 11
    assert st.waited == 0


def test_an_exchange_of_many_steps_is_waited_for():
    seen, st = replies_seen(exchange_s=0.2, step_s=0.002, steps=6)
    # one overlapped step shows the exchange is some 100 steps long (a loaded machine's
    # late wake-ups would need a 25 ms step to bring it under 8); from then on each step
    # starts from the reply of the push before it
    assert seen == [1] + [0] * 4
    assert st.waited == 5       # every push but the first


def test_sync_waits_every_exchange():
    seen, st = replies_seen(exchange_s=0.0, step_s=0.001, overlap=False)
    assert seen == [0] * 11
    assert st.waited == 12


def test_the_model_stops_hiding_an_exchange_the_rule_would_wait_for():
    """analytic.mva: one worker, a 1 s step and a 10 s exchange: overlapping, a cycle is the
    exchange; under --overlap auto's ratio (8) the worker waits, so step + exchange."""
    from asgd.perf.analytic import mva
    X_on, _ = mva(1, 1.0, [10.0], overlap=True)
    X_auto, _ = mva(1, 1.0, [10.0], overlap=True, overlap_within=OverlapRule.RATIO)
    X_short, _ = mva(1, 1.0, [5.0], overlap=True, overlap_within=OverlapRule.RATIO)
    assert (X_on, X_auto, X_short) == (1 / 10.0, 1 / 11.0, 1 / 5.0)
