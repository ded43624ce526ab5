"""The server shard's protocol (asgd.core.shard with asgd.core.policy) without MPI: events
in (pushes, end-of-work messages, deaths), the effects it asks of its transport out, in
order (the sans-I/O style: no mpiexec, no simulator)."""

import math

import numpy as np
import pytest

from asgd.core.policy import SSP, Async, Sync, policy
from asgd.core.shard import DIVERGED_AFTER, DivergenceError, Shard
from asgd.core.wire import STOP_ASKED, STOP_DONE


class Recorder:
    """A transport that does nothing but write down what the shard asks of it; the pushes
    of `bad` workers are not finite (their apply and their finite check fail)."""

    def __init__(self, bad=()):
        self.log, self.bad = [], set(bad)

    def reply(self, j, head):
        self.log.append(("reply", j, *head))

    def apply(self, j, share):
        self.log.append(("apply", j, share))
        return j not in self.bad

    def apply_mean(self, weights, share):
        self.log.append(("mean", [(j, round(wt, 6)) for j, wt in weights], share))
        return True

    def finite(self, j):
        return j not in self.bad

    def release(self, j):
        self.log.append(("release", j))

    def save(self, rounds, cut):
        self.log.append(("save", rounds, cut))


def run(events, rule, W=2, **kw):
    """Feed `events` to a W-worker shard: ("push", j, version[, cut[, loss]]),
    ("done", j), ("lost", j); returns the effects asked, in order, and the shard."""
    fx = Recorder(kw.pop("bad", ()))
    versions = []
    shard = Shard(list(range(10, 10 + W)), fx, rule, on_version=lambda r, ls, m: versions.append((r, m)), **kw)
    step = [0] * W
    for kind, j, *rest in events:
        if kind == "push":
            version, cut, loss = (list(rest) + [0, 1.0])[:3] if len(rest) < 3 else rest
            shard.pushed(j, version, step[j], cut, loss, 4.0)
            step[j] += 1
        elif kind == "done":
            shard.done(j)
        else:
            shard.lost(j, when=123.0)
    return fx.log, shard, versions


# (name, policy, W, events, the effects expected in order)
CASES = [
    ("async replies first, then applies: the update is off the round trip", Async(), 1,
     [("push", 0, 0), ("push", 0, 0), ("done", 0)],
     [("reply", 0, 0, 0.0, 0), ("apply", 0, 1.0), ("release", 0),
      ("reply", 0, 1, 0.0, 0), ("apply", 0, 1.0), ("release", 0)]),
    ("async apply-first: a worker reads its own write", Async(reply_first=False), 1,
     [("push", 0, 0), ("push", 0, 1)],
     [("apply", 0, 1.0), ("reply", 0, 1, 0.0, 0), ("release", 0),
      ("apply", 0, 1.0), ("reply", 0, 2, 0.0, 0), ("release", 0)]),
    ("ssp K=1: the fast worker waits for the slow one", SSP(1), 2,
     [("push", 0, 0), ("push", 1, 0)],
     [("apply", 0, 1.0),                                   # steps (1, 0): its next would be 2 ahead: held
      ("apply", 1, 1.0), ("reply", 0, 2, 0.0, 0), ("release", 0), ("reply", 1, 2, 0.0, 0), ("release", 1)]),
    ("ssp K=2: within the bound, answered at once", SSP(2), 2,
     [("push", 0, 0), ("push", 1, 0)],
     [("apply", 0, 1.0), ("reply", 0, 1, 0.0, 0), ("release", 0),
      ("apply", 1, 1.0), ("reply", 1, 2, 0.0, 0), ("release", 1)]),
    ("ssp: a retiring worker releases the held one", SSP(1), 2,
     [("push", 0, 0), ("done", 1), ("push", 0, 1)],
     [("apply", 0, 1.0), ("reply", 0, 1, 0.0, 0), ("release", 0),
      ("apply", 0, 1.0), ("reply", 0, 2, 0.0, 0), ("release", 0)]),
    ("sync: one mean in worker order, whatever the arrival order, everyone answered", Sync(), 3,
     [("push", 2, 0), ("push", 0, 0), ("push", 1, 0)],
     [("mean", [(0, 0.333333), (1, 0.333333), (2, 0.333333)], 1.0),
      ("reply", 0, 1, 0.0, 0), ("release", 0), ("reply", 1, 1, 0.0, 0), ("release", 1),
      ("reply", 2, 1, 0.0, 0), ("release", 2)]),
    ("sync: a round waits for the live workers only", Sync(), 2,
     [("push", 0, 0), ("done", 1)],
     [("mean", [(0, 1.0)], 1.0), ("reply", 0, 1, 0.0, 0), ("release", 0)]),
    ("sync, 1 backup worker: a round of 2 of 3, the straggler's late push dropped and answered", Sync(1), 3,
     [("push", 0, 0), ("push", 1, 0), ("push", 2, 0)],
     [("mean", [(0, 0.5), (1, 0.5)], 1.0),
      ("reply", 0, 1, 0.0, 0), ("release", 0), ("reply", 1, 1, 0.0, 0), ("release", 1),
      ("reply", 2, 1, 0.0, 0), ("release", 2)]),
]


@pytest.mark.parametrize("name, rule, W, events, expected", CASES, ids=[c[0] for c in CASES])
def test_policy_effects_in_order(name, rule, W, events, expected):
    log, _, _ = run(events, rule, W)
    assert log == expected


def test_backup_workers_count_the_dropped_push():
    _, shard, _ = run([("push", 0, 0), ("push", 1, 0), ("push", 2, 0)], Sync(1), 3)
    assert shard.st.dropped == 1 and shard.st.rounds == 1 and shard.st.updates == 3


def test_backup_workers_tell_the_workers_when_the_epochs_are_trained():
    fx = Recorder()
    shard = Shard([1, 2], fx, Sync(1))
    shard.goal = lambda: True
    shard.pushed(0, 0, 0, 0, 1.0, 4.0)
    assert fx.log[1] == ("reply", 0, 1, STOP_DONE, 0)


def test_staleness_and_step_gaps_are_recorded_per_worker():
    """A lone async worker, reply-first: each push after the first is one version stale
    (it was answered before its own Delta-w was applied)."""
    _, shard, versions = run([("push", 0, 0), ("push", 0, 0), ("push", 0, 1), ("done", 0)], Async(), 1)
    assert shard.st.staleness == [[0, 1, 1]] and shard.st.step_gap == [[0, 0, 0]]
    assert versions == [(1, 4.0), (2, 4.0), (3, 4.0)]
    rec = shard.st.record((0, 8), shard.ranks)
    assert rec["staleness_hist"] == {10: [1, 2]} and rec["rounds"] == 3 and rec["requests"] == 3


def test_step_gaps_follow_the_slowest_active_worker_through_retirements():
    """gap() keeps the slowest active worker's count as pushes come (no min over the
    workers a push): random pushes, done and lost workers, each gap recorded equal to
    its definition, worker j's pushes less the fewest of any active worker's (0 with none)."""
    rng = np.random.default_rng(4)
    for trial in range(30):
        W = int(rng.integers(1, 6))
        shard = Shard(list(range(W)), Recorder(), Async())
        for _ in range(60):
            live = np.flatnonzero(shard.active)
            if not live.size:
                break
            j = int(rng.choice(live))
            if rng.random() < 0.05:
                shard.done(j) if rng.random() < 0.5 else shard.lost(j, when=0.0)
                continue
            shard.pushed(j, shard.st.rounds, int(shard.steps[j]), 0, 1.0, 1.0)
            active = shard.steps[shard.active]
            expected = int(shard.steps[j] - active.min()) if active.size else 0
            assert shard.st.step_gap[j][-1] == max(expected, 0), (trial, W, j)


@pytest.mark.parametrize("rule", [Async(), Async(reply_first=False), SSP(2)], ids=["async", "apply-first", "ssp"])
def test_a_target_reached_tells_every_later_reply_the_run_is_done_and_applies_no_more(rule):
    """on_version says True once rank 0's held-out evaluation reached the target: every
    later reply says STOP_DONE (done, not stopped early), and a push computed before its
    worker heard is answered but not applied: the shard stays the one that reached it."""
    fx = Recorder()
    shard = Shard([1, 2], fx, rule, on_version=lambda rounds, ls, m: rounds >= 2)
    for j in (0, 1, 0, 1):
        shard.pushed(j, 0, 0, 0, 1.0, 4.0)
    replies = [e for e in fx.log if e[0] == "reply"]
    assert [e[1] for e in replies] == [0, 1, 0, 1] and replies[-1][3] == replies[-2][3] == STOP_DONE
    assert [e for e in fx.log if e[0] == "apply"] == [("apply", 0, 1.0), ("apply", 1, 1.0)]
    assert shard.st.rounds == 2 and shard.st.dropped == 2 and not shard.stopping


def test_a_stop_request_reaches_every_later_reply():
    fx = Recorder()
    shard = Shard([1], fx, Async())
    shard.pushed(0, 0, 0, 0, 1.0, 4.0, stop=True)
    assert fx.log[0] == ("reply", 0, 0, STOP_ASKED, 0)


# -- checkpoint cuts ---------------------------------------------------------------------

def test_the_leader_starts_a_cut_its_replies_carry_and_saves_once_every_worker_passed_it():
    """Cut 1 due at round 2: the replies after it carry cut 1; each worker's first push
    stamped 1 is held (received, not applied nor answered) until both have come; then the
    shard is saved as cut 1 (2 versions in it) and the held pushes go on."""
    events = [("push", 0, 0), ("push", 1, 0),            # round 2: cut 1 due, replies carry it
              ("push", 0, 1, 1), ("push", 1, 2, 1)]      # both past it: saved, then taken
    log, shard, _ = run(events, Async(reply_first=False), 2, due=lambda rounds: rounds == 2)
    assert log == [("apply", 0, 1.0), ("reply", 0, 1, 0.0, 0), ("release", 0),
                   ("apply", 1, 1.0), ("reply", 1, 2, 0.0, 1), ("release", 1),
                   ("save", 2, 1),                          # then the held pushes, in arrival order
                   ("apply", 0, 1.0), ("apply", 1, 1.0),
                   ("reply", 0, 4, 0.0, 1), ("release", 0), ("reply", 1, 4, 0.0, 1), ("release", 1)]
    assert shard.st.cuts == 1 and not shard.collecting


def test_a_follower_collects_the_cut_the_pushes_are_stamped_with():
    """A server that starts no cut sees one in a push's stamp and collects it too; a
    retired worker's pushes all precede it."""
    events = [("push", 0, 0, 1), ("done", 1)]
    log, shard, _ = run(events, Async(), 2)
    assert log == [("save", 0, 1), ("reply", 0, 0, 0.0, 1), ("apply", 0, 1.0), ("release", 0)]
    assert shard.st.cuts == 1


def test_a_cut_with_backup_workers_needs_a_rounds_worth():
    log, shard, _ = run([("push", 0, 0, 1), ("push", 1, 0, 1)], Sync(1), 3)
    assert log[0] == ("save", 0, 1) and shard.st.cuts == 1


# -- lost workers, the divergence guard, stale steps ----------------------------------------

def test_a_lost_worker_is_recorded_retired_and_no_longer_awaited():
    lost = []
    fx = Recorder()
    shard = Shard([5, 6], fx, Sync(), on_lost=lambda rank, samples: lost.append((rank, samples)))
    shard.pushed(0, 0, 0, 0, 1.0, 4.0)
    shard.pushed(1, 0, 0, 0, 1.0, 4.0)          # round 1
    shard.pushed(0, 1, 1, 0, 1.0, 4.0)          # waits for worker 1 ...
    assert fx.log[-1] == ("release", 1)
    shard.lost(1, when=7.0)                     # ... which died: the round is worker 0's alone
    assert fx.log[-3:] == [("mean", [(0, 1.0)], 1.0), ("reply", 0, 2, 0.0, 0), ("release", 0)]
    assert shard.st.lost == [{"rank": 6, "time": 7.0, "updates": 1}] and lost == [(6, 4.0)]
    assert shard.live == 1


def test_a_refused_push_moves_nothing_and_the_tenth_in_a_row_ends_the_job():
    fx = Recorder(bad={0})
    shard = Shard([3], fx, Async(reply_first=False))
    for k in range(DIVERGED_AFTER - 1):
        shard.pushed(0, k, k, 0, 1.0, 4.0)
    assert shard.st.refused == DIVERGED_AFTER - 1 and shard.st.rounds == DIVERGED_AFTER - 1
    with pytest.raises(DivergenceError, match="refused 10 updates in a row .* from worker rank 3.*lower --lr"):
        shard.pushed(0, 9, 9, 0, 1.0, 4.0)


def test_a_non_finite_loss_is_refused_without_asking_the_transport():
    log, shard, versions = run([("push", 0, 0, 0, math.nan)], Async(reply_first=False), 1)
    assert ("apply", 0, 1.0) not in log and shard.st.refused == 1 and versions == [(1, 0.0)]
    assert shard.refused_in_a_row == 1


def test_a_finite_push_resets_the_guard():
    fx = Recorder(bad={0})
    shard = Shard([3, 4], fx, Async())
    for k in range(DIVERGED_AFTER - 1):
        shard.pushed(0, k, k, 0, 1.0, 4.0)
    shard.pushed(1, 0, 0, 0, 1.0, 4.0)
    assert shard.refused_in_a_row == 0
    shard.pushed(0, 0, 0, 0, 1.0, 4.0)   # one refused: not the tenth in a row


def test_sync_refuses_a_bad_push_on_arrival_and_weighs_the_rest():
    log, shard, versions = run([("push", 0, 0), ("push", 1, 0)], Sync(), 2, bad={1})
    assert log[0] == ("mean", [(0, 1.0), (1, 0.0)], 1.0) and shard.st.refused == 1 and versions == [(1, 4.0)]


def test_stale_pushes_take_their_share_of_the_step_and_halve_step_every_one():
    """stale_step's share per push (its staleness when it arrived), times halve_step's."""
    fx = Recorder()
    shard = Shard([1], fx, Async(), stale_step=lambda s: 1.0 / (1 + s))
    shard.pushed(0, 0, 0, 0, 1.0, 4.0)     # staleness 0: all of it
    assert shard.halve_step() == 0.5
    shard.pushed(0, 0, 1, 0, 1.0, 4.0)     # staleness 1: half, halved
    assert [e for e in fx.log if e[0] == "apply"] == [("apply", 0, 1.0), ("apply", 0, 0.25)]


def test_sync_rounds_take_the_halved_step_too():
    fx = Recorder()
    shard = Shard([1], fx, Sync())
    shard.halve_step()
    shard.pushed(0, 0, 0, 0, 1.0, 4.0)
    assert fx.log[0] == ("mean", [(0, 1.0)], 0.5)


def test_the_policy_factory():
    assert isinstance(policy("async", 0), Async) and policy("async", 0).reply_first
    assert policy("ssp", 3).K == 3 and not policy("ssp", 3).reply_first
    assert policy("sync", 0, 2).backup == 2
