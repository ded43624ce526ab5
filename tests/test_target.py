"""Stopping at a target, without MPI: the decision (asgd.core.target), the cadence of the
held-out evaluations, the stop's share in a summed stop (asgd.core.wire), and rank 0's
tracker that asks them after each version (asgd.run.progress)."""

import numpy as np
import pytest

from asgd.core.target import EVAL_BUDGET, Cadence, Target, target
from asgd.core.wire import stop_share, summed_stop
from asgd.run.progress import EpochTracker


def test_a_target_is_reached_at_or_past_its_value_and_never_without_an_evaluation():
    acc, loss = Target("accuracy", 0.9), Target("loss", 0.3)
    assert acc.reached(1.0, 0.9) and acc.reached(None, 0.95) and not acc.reached(0.01, 0.899)
    assert loss.reached(0.3, 0.0) and loss.reached(0.1, None) and not loss.reached(0.31, 1.0)
    assert not acc.reached(None, None) and not loss.reached(None, None)
    assert target(0.9, None) == acc and target(None, 0.3) == loss and target(None, None) is None


def test_the_cadence_counts_updates_or_seconds_and_auto_keeps_evaluation_within_its_budget():
    every_10 = Cadence("updates", 10)
    assert not every_10.due(19, 99.0, 10, 1.0, 0.1) and every_10.due(20, 1.0, 10, 1.0, 0.1)
    half_s = Cadence("seconds", 0.5)
    assert not half_s.due(99, 1.49, 0, 1.0, 0.1) and half_s.due(1, 1.5, 0, 1.0, 0.1)
    auto = Cadence("auto")   # the last took 0.1 s: the next waits 0.1 (1/budget - 1) s after it ended
    wait = 0.1 * (1 / EVAL_BUDGET - 1)
    assert not auto.due(99, 1.0 + 0.99 * wait, 0, 1.0, 0.1) and auto.due(1, 1.0 + wait, 0, 1.0, 0.1)
    assert 0.1 / (0.1 + wait) == pytest.approx(EVAL_BUDGET)
    assert auto.due(1, 0.0, 0, 0.0, 0.0)   # none yet: the first version is evaluated


@pytest.mark.parametrize("ranks", [1, 2, 5, 16])
def test_a_summed_stop_tells_asked_from_done_whoever_adds_it(ranks):
    """allreduce's sum and a replica's logits carry one stop value: its sum says whether
    any rank was asked to stop (a signal) or only that the run is done."""
    assert summed_stop(0.0) == (False, False)
    assert summed_stop(ranks * stop_share(False, True, ranks)) == (True, False)   # every rank done
    assert summed_stop(stop_share(True, False, ranks) + (ranks - 1) * stop_share(False, True, ranks)) == (True, True)
    assert stop_share(True, True, ranks) == 1.0


def tracker(evaluations, **kw):
    """A tracker of 1,000 points over 3 epochs whose evaluations return `evaluations` in turn."""
    said, seen = [], iter(evaluations)

    class Clock:
        phase = "aggregate"

        def switch(self, phase):
            self.phase = phase

        def elapsed(self):
            return 0.0
    return EpochTracker(1000, 3, lambda: next(seen), said.append, 60.0, Clock(), **kw), said


def test_the_tracker_evaluates_at_its_cadence_and_says_when_the_target_is_reached():
    t, said = tracker([(0.6, 0.7), (0.4, 0.85), (0.3, 0.91), (0.2, 0.95)], target=Target("accuracy", 0.9),
                      cadence=Cadence("updates", 2))
    done = [t.add(100.0, 100) for _ in range(7)]
    assert done == [False] * 5 + [True] * 2   # reached at update 6: the run is done from there on
    assert [(p["updates"], p["samples"], p["accuracy"]) for p in t.curve] == [(2, 200, 0.7), (4, 400, 0.85),
                                                                                (6, 600, 0.91)]
    assert t.target_record() == {"metric": "accuracy", "value": 0.9, "reached": True, "train_s": t.curve[2]["train_s"],
                                 "epochs": 0.6, "samples": 600, "updates": 6}
    assert any("reached the target 0.9" in line for line in said)


def test_an_unreached_target_records_no_time_and_epoch_ends_are_on_the_curve():
    t, _ = tracker([(0.5, 0.6)] * 4, target=Target("loss", 0.1), cadence=Cadence("updates", 1000))
    assert not any(t.add(100.0, 500) for _ in range(6))
    assert [p["samples"] for p in t.curve] == [1000, 2000, 3000]   # the epochs' ends only
    assert t.target_record() == {"metric": "loss", "value": 0.1, "reached": False, "train_s": None,
                                 "epochs": None, "samples": None, "updates": None}
    assert tracker([])[0].target_record() is None


def test_auto_waits_for_its_share_of_the_estimated_cost_before_the_first_evaluation():
    """--eval-every auto: with no evaluation made yet, the first waits 19 times the cost
    estimated before training (a run whose evaluation would cost more evaluates only at
    the epochs' ends); with none estimated, the first version is evaluated."""
    t, _ = tracker([(0.5, 0.6)], cadence=Cadence("auto"), eval_cost_s=60.0)
    t.add(1.0, 10)
    assert t.curve == []
    t, _ = tracker([(0.5, 0.6)], cadence=Cadence("auto"))
    t.add(1.0, 10)
    assert [p["updates"] for p in t.curve] == [1]


def test_the_final_metrics_reuse_the_last_evaluation_only_when_it_was_of_the_weights_saved():
    """A run that ends at its target saves the w its last evaluation (between epochs) was
    of: its figures are the final ones, not the last epoch's."""
    t, _ = tracker([(0.5, 0.6)] * 4 + [(0.3, 0.95)], target=Target("accuracy", 0.9), cadence=Cadence("updates", 3))
    for _ in range(14):   # evaluations at 3, 6, 9 updates, the epoch's end at 10, and at 13: the target
        t.add(100.0, 100)
    t.evaluated_w = np.ones(3)
    assert t.final_metrics(np.ones(3), lambda: (9.0, 0.0)) == (0.3, 0.95)
    assert t.final_metrics(np.zeros(3), lambda: (9.0, 0.0)) == (9.0, 0.0)
