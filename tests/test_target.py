"""Stopping at a target, without MPI: the decision (asgd.core.target), the cadence of the
held-out evaluations, the stop's share in a summed stop (asgd.core.wire), and rank 0's
tracker that asks them after each version (asgd.run.progress)."""

import numpy as np
import pytest
from pytest import approx

from asgd.core.target import EVAL_BUDGET, REPLAYED, AfterExchange, Cadence, Evaluations, Target, replay, target
from asgd.core.wire import stop_share, summed_stop
from asgd.run import config
from asgd.run.progress import EpochTracker


def test_a_target_is_reached_at_or_past_its_value_and_never_without_an_evaluation():
    acc, loss = Target("accuracy", 0.9), Target("loss", 0.3)
    assert acc.reached(1.0, 0.9) and acc.reached(None, 0.95) and not acc.reached(0.01, 0.899)
    assert loss.reached(0.3, 0.0) and loss.reached(0.1, None) and not loss.reached(0.31, 1.0)
    assert not acc.reached(None, None) and not loss.reached(None, None)
    assert target(0.9, None) == acc and target(None, 0.3) == loss and target(None, None) is None


def test_the_cadence_counts_updates_or_seconds_and_always_evaluates_an_epochs_end_when_asked():
    last = Evaluations(updates=10, end_s=1.0, took_s=0.1, spent_s=0.1, count=1)
    every_10 = Cadence("updates", 10)
    assert not every_10.due(last, 19, 99.0) and every_10.due(last, 20, 1.0)
    half_s = Cadence("seconds", 0.5)
    assert not half_s.due(last, 99, 1.49) and half_s.due(last, 11, 1.5)
    assert not half_s.due(last, 10, 9.0)   # the version just evaluated, not again
    epoch = Cadence("epoch")
    assert not epoch.due(last, 99, 99.0)
    for cadence in (every_10, half_s, epoch):
        assert cadence.due(last, 11, 1.01, epoch_end=True)


def test_auto_evaluates_when_the_budget_allows_and_between_epochs_leaves_one_for_the_next_end():
    """auto: the evaluations so far and this one (costing what the last took) within
    EVAL_BUDGET of the training time; between epochs, while one an epoch fits the budget,
    also the cost of one for the next epoch's end."""
    auto, spent = Cadence("auto"), Evaluations(updates=1, took_s=0.1, spent_s=0.3, count=3)
    enough = (0.3 + 0.1) / EVAL_BUDGET   # training seconds that pay for the fourth
    assert not auto.due(spent, 9, 0.99 * enough, epoch_end=True) and auto.due(spent, 9, enough, epoch_end=True)
    fits = 0.1 / EVAL_BUDGET   # an epoch this long pays for its evaluation
    assert not auto.due(spent, 9, enough, epoch_s=fits) and auto.due(spent, 9, enough + fits, epoch_s=fits)
    assert not auto.due(spent, 9, enough, epoch_s=None)   # no epoch timed yet: as if one fits
    assert auto.due(spent, 9, enough, epoch_s=0.99 * fits)   # one an epoch does not fit: no reserve
    assert auto.due(Evaluations(), 1, 0.0)   # none made and none estimated: the first version
    fast_last = Evaluations(updates=1, took_s=0.01, spent_s=0.3, count=3)   # costs the mean, 0.1, not 0.01
    assert not auto.due(fast_last, 9, 0.99 * enough, epoch_end=True) and auto.due(fast_last, 9, enough, epoch_end=True)


class FakeRun:
    """A training run on a fake clock: an update every `update_s` seconds, `per_epoch`
    updates an epoch, each held-out evaluation `eval_s` seconds (the server's: training
    waits for it). Its tracker is rank 0's, with the trainer's default cadence (or
    `cadence`) and the cost estimated before training `first_s` (none: eval_s)."""

    def __init__(self, update_s: float, per_epoch: int, eval_s: float, epochs: int, cadence: Cadence | None = None,
                 first_s: float | None = None):
        self.t, self.eval_s, self.update_s, self.per_epoch = 0.0, eval_s, update_s, per_epoch
        self.shares = []   # the evaluations' share of the training time after each one
        said, cadence = [], cadence or config.eval_cadence(config.parse([], 3).eval_every)
        self.tracker = EpochTracker(per_epoch * 10, epochs, self.evaluate, said.append, 60.0, _Clock(),
                                    cadence=cadence, eval_cost_s=eval_s if first_s is None else first_s,
                                    now=lambda: self.t)

    def evaluate(self):
        self.t += self.eval_s
        self.shares.append((self.tracker.evals.spent_s + self.eval_s) / self.t)
        return 0.5, 0.5

    def train(self) -> "FakeRun":
        for _ in range(self.tracker.epochs * self.per_epoch):
            self.t += self.update_s
            self.tracker.add(5.0, 10)
        return self


@pytest.mark.parametrize("eval_epochs", [0.25, 0.01], ids=["the default run's 25 %", "1 % an epoch"])
def test_the_default_cadence_keeps_evaluation_within_its_budget_and_the_curve_as_dense_as_it_allows(eval_epochs):
    """The default run (2-10K-2, 16 ranks on 2 cores: 64 updates an epoch, an evaluation
    a quarter of an epoch) and a cheap evaluation: at every evaluation's end, the
    evaluations so far take at most EVAL_BUDGET of the training time; there are as many
    as that budget pays for (less one: they come at versions, and some wait for an
    epoch's end); and where one an epoch fits, every epoch has its held-out metrics."""
    per_epoch, epochs = 64, 40
    run = FakeRun(0.001, per_epoch, eval_epochs * per_epoch * 0.001, epochs).train()
    t = run.tracker
    assert run.shares and max(run.shares) <= EVAL_BUDGET + 1e-9
    assert t.evals.spent_s <= EVAL_BUDGET * run.t
    affordable = int(EVAL_BUDGET * run.t / run.eval_s)
    assert affordable - 1 <= len(t.curve) <= affordable
    assert [p["eval_s"] for p in t.curve] == [approx(run.eval_s)] * len(t.curve)   # each point its own seconds
    evaluated_ends = [h["test_loss"] is not None for h in t.history]
    if eval_epochs <= EVAL_BUDGET:
        assert all(evaluated_ends) and len(t.curve) > epochs   # every epoch's end, and the rest between
    else:
        assert 0 < sum(evaluated_ends) < epochs


@pytest.mark.parametrize("cadence", [Cadence("auto"), Cadence("epoch"), Cadence("updates", 7),
                                     Cadence("seconds", 1 / 32)], ids=["auto", "epoch", "7 updates", "1/32 s"])
@pytest.mark.parametrize("eval_epochs, first", [(1 / 4, 1), (1 / 64, 1), (1 / 64, 3), (1 / 2, 2)],
                         ids=["a quarter epoch", "1/64 epoch", "1/64 epoch, estimated 3x", "half an epoch, 2x"])
def test_replay_makes_the_trackers_evaluations_without_asking_at_every_version(cadence, eval_epochs, first):
    """What the model and the simulator charge rank 0 (core.target.replay) is what the
    tracker does on the same timeline: as many evaluations, at the same versions, as
    long. Float32's default run (2-10K-2, 8 epochs of 0.06 s, an evaluation 8 ms, its
    estimate 16 ms) has none: one an epoch (0.063 s, 14 %) was the model's 15 % median."""
    per_epoch, epochs, update_s = 64, 48, 1 / 1024   # binary fractions: both clocks add exactly
    eval_s = eval_epochs * per_epoch * update_s
    run = FakeRun(update_s, per_epoch, eval_s, epochs, cadence, first * eval_s).train()
    got = replay(cadence, epochs, per_epoch, update_s, eval_s, first * eval_s)
    t = run.tracker
    assert (got.count, got.updates, got.spent_s) == (len(t.curve), t.evals.updates, approx(t.evals.spent_s))
    assert got.count > 0
    float32 = replay(Cadence("auto"), 8, 64, 0.45 / 512, 0.0079, 2 * 0.0079)
    assert float32.spent_s <= EVAL_BUDGET * 0.45 and float32.count < 8


@pytest.mark.parametrize("cadence", [Cadence("auto"), Cadence("updates", 3), Cadence("seconds", 0.01)],
                         ids=["auto", "3 updates", "0.01 s"])
def test_a_long_replay_extrapolates_its_steady_rate(cadence):
    """A cheap evaluation in a long run (400,000 versions: auto evaluates every other one)
    costs replay() a few thousand bisections, not one per evaluation, and charges within
    1 % of the evaluations found one by one."""
    exact = replay(cadence, 10, 40_000, 1e-3, 1e-4, 2e-4, exact=10**9)
    quick = replay(cadence, 10, 40_000, 1e-3, 1e-4, 2e-4)
    assert exact.count > 10 * REPLAYED   # past what is replayed one by one
    assert quick.spent_s == approx(exact.spent_s, rel=0.01) and quick.count == approx(exact.count, rel=0.01)


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
    return EpochTracker(1000, 3, lambda: next(seen), said.append, 60.0, _Clock(), **kw), said


class _Clock:
    """The phase clock a tracker switches to "evaluate" and back."""
    phase = "aggregate"

    def switch(self, phase):
        self.phase = phase

    def elapsed(self):
        return 0.0


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
    """--eval-every auto: with no evaluation made yet, the first waits until the training
    time pays for the cost estimated before training; with none estimated, the first
    version is evaluated."""
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


def test_a_p2p_rank_0_owes_its_evaluations_until_its_worker_has_exchanged():
    """p2p's rank 0 evaluates its worker's w, which only that worker's exchange refreshes
    (core.target.AfterExchange): versions applied by its owner in between make an
    evaluation due but do not make it; the exchange makes one, however many came due."""
    t, _ = tracker([(0.5, 0.6), (0.4, 0.95)], target=Target("accuracy", 0.9), cadence=Cadence("updates", 1),
                   after_exchange=AfterExchange())
    assert not any(t.add(100.0, 10) for _ in range(5)) and t.curve == []   # due at each, none made
    t.exchanged()
    t.exchanged()   # nothing new came due: nothing owed
    assert [p["updates"] for p in t.curve] == [5]
    t.add(100.0, 10)
    t.exchanged()   # reaches the target: the owner's next version ends the run
    assert [p["updates"] for p in t.curve] == [5, 6] and t.reached is not None and t.add(100.0, 10)
    # one owed, then an epoch's end evaluates (inside the owner's polling): nothing newer is
    # left for the exchange to evaluate, so the curve has no second point of the same version
    t, _ = tracker([(0.5, 0.6)] * 2, cadence=Cadence("updates", 1), after_exchange=AfterExchange())
    t.add(100.0, 500)
    t.add(100.0, 500)   # the epoch's end, at 1,000 samples
    t.exchanged()
    assert [p["updates"] for p in t.curve] == [2]
    # everywhere else an evaluation due is made at once
    t, _ = tracker([(0.5, 0.6)] * 3, cadence=Cadence("updates", 1))
    for _ in range(3):
        t.add(100.0, 10)
    assert [p["updates"] for p in t.curve] == [1, 2, 3]


def test_deferred_evaluations_copy_w_in_training_and_settle_finds_the_target_after_it():
    """--eval-deferred: the same cadence, the same points, but during training each is a
    copy of w (nothing evaluated, the run never stopped); settle() evaluates the copies in
    order after training: the curve's figures, the epochs' ends' and the target, the
    first that reached it, as the online tracker would have found it."""
    figures = [(0.6, 0.7), (0.4, 0.85), (0.3, 0.91), (0.2, 0.95), (0.25, 0.93), (0.2, 0.96)] * 3
    online, _ = tracker(list(figures), target=Target("accuracy", 0.9), cadence=Cadence("updates", 4), now=lambda: 0.0)
    copied, evaluated = [], []

    def deferred():   # a copy of "w" (its version) now; its figures when evaluated
        version = t.updates
        copied.append(version)
        return lambda: evaluated.append(version) or figures[len(evaluated) - 1]
    t, said = tracker([], target=Target("accuracy", 0.9), cadence=Cadence("updates", 4), deferred=deferred,
                      now=lambda: 0.0)
    assert not any(t.add(100.0, 100) for _ in range(30))   # all 3 epochs trained: found later, never stopped
    assert evaluated == [] and all(p["loss"] is None for p in t.curve) and t.reached is None
    assert [h["test_accuracy"] for h in t.history] == [None] * 3
    t.settle()
    assert evaluated == copied == [p["updates"] for p in t.curve]   # each copy evaluated once, in order
    for _ in range(30):
        if online.add(100.0, 100):
            break
    assert t.target_record() == online.target_record() and t.target_record()["updates"] == 10
    n = len(online.curve)
    assert [(p["updates"], p["accuracy"]) for p in t.curve[:n]] == [(p["updates"], p["accuracy"]) for p in online.curve]
    ends = {p["updates"]: p["accuracy"] for p in t.curve}
    assert [h["test_accuracy"] for h in t.history] == [ends[10], ends[20], ends[30]]   # the epochs' ends filled
    assert any("found after training (--eval-deferred)" in line for line in said)
    t.settle()
    assert len(evaluated) == len(copied)   # settled once: nothing evaluated twice


def test_the_copies_a_deferred_run_takes_are_counted_and_touched_ahead(monkeypatch):
    """expected_copies: an epoch's end each, and a cadence of updates' copies between
    (versions of update_samples samples); Copies: that many rows touched before training,
    a copy into the next, past them a copy allocated as it comes; at most
    PREALLOCATED_BYTES touched."""
    from asgd.run.deferred import PREALLOCATED_BYTES, Copies, expected_copies
    assert expected_copies(Cadence("updates", 2), 3, 1000, 100) == 3 * (1 + 10 // 2)
    assert expected_copies(Cadence("updates", 1), 2, 3500, 256 * 4) == 2 * (1 + 4)   # lockstep: W batches a version
    assert expected_copies(Cadence("epoch"), 5, 1000, 100) == 5
    assert expected_copies(Cadence("seconds", 0.1), 5, 1000, 100) == 5   # not known ahead: the epochs' ends
    store = Copies(2, 4, np.float32)
    w = np.arange(4, dtype=np.float32)
    first = store.take(w)
    w += 1
    second, third = store.take(w), store.take(w)
    assert np.shares_memory(first, store.store) and np.shares_memory(second, store.store)
    assert not np.shares_memory(third, store.store) and not np.shares_memory(third, w)
    assert first.tolist() == [0, 1, 2, 3] and second.tolist() == third.tolist() == [1, 2, 3, 4]
    assert len(Copies(3, 1000, np.float64).store) == 3 and PREALLOCATED_BYTES == 1 << 30
    monkeypatch.setattr("asgd.run.deferred.PREALLOCATED_BYTES", 20_000)
    assert len(Copies(10**9, 1000, np.float64).store) == 2   # 2 x 8,000 bytes within 20,000
