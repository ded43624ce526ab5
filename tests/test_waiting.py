"""The Waiter's backoff (asgd.core.waiting), which the MPI run and the simulator share."""

import pytest

from asgd import mpiutil
from asgd.core import waiting
from asgd.sim.actors import _next_poll


def test_a_crowded_ranks_polls_cost_less_as_more_ranks_share_a_core():
    """A core of its own: a 2 ms spin, then short sleeps. Sharing one: 1 ms of yields over
    the ranks per core (5 ranks on 2 cores: 0.4 ms), then sleeps capped at 80 us per rank
    per core, between the uncrowded cap and 1 ms, which 13 or more ranks per core reach."""
    assert (waiting.spin_s(0.0), waiting.max_sleep_s(0.0)) == (waiting.SPIN_S, waiting.MAX_SLEEP_S)
    assert waiting.spin_s(2.5) == pytest.approx(400e-6)
    assert waiting.spin_s(float("inf")) == 0.0                           # sleeps from the start
    assert (waiting.ranks_per_core(5, 2), waiting.ranks_per_core(2, 2)) == (2.5, 0.0)   # both runs' word for it
    assert waiting.max_sleep_s(2.5) == pytest.approx(200e-6)
    assert waiting.max_sleep_s(8.0) == pytest.approx(640e-6)
    assert waiting.max_sleep_s(1.0) == waiting.MAX_SLEEP_S           # just crowded: never below it
    assert waiting.max_sleep_s(16.0) == waiting.max_sleep_s(float("inf")) == waiting.CROWDED_MAX_SLEEP_S


@pytest.mark.parametrize("per_core", [0.0, 1.5, 2.5, 8.0, 16.0])
def test_the_simulator_polls_where_the_waiter_would(per_core):
    """_next_poll replays the Waiter's loop: spin, then sleeps doubling from FIRST_SLEEP_S
    to the cap, each overshooting by `overhead`; the first poll at or after the wait's end."""
    overhead = 30e-6
    polls, t, s = [], waiting.spin_s(per_core), waiting.FIRST_SLEEP_S
    while t < 0.02:
        t += s + overhead
        polls.append(t)
        s = min(2 * s, waiting.max_sleep_s(per_core))
    for elapsed in (1e-6, 150e-6, 700e-6, 3e-3, 0.0123):
        if elapsed <= waiting.spin_s(per_core):
            assert _next_poll(elapsed, per_core, overhead) == elapsed
        else:
            assert _next_poll(elapsed, per_core, overhead) == pytest.approx(min(p for p in polls if p >= elapsed))


@pytest.mark.parametrize("per_core", [0.0, 2.5])
def test_a_crowded_waiter_yields_its_core_between_polls_and_a_lone_one_spins(monkeypatch, per_core):
    """Within the first poll window a crowded rank hands its core to any rank that wants
    it (sched_yield) and never sleeps; a rank with a core of its own spins (no yields)."""
    calls = []
    monkeypatch.setattr(mpiutil.os, "sched_yield", lambda: calls.append("yield"))
    monkeypatch.setattr(mpiutil.time, "sleep", lambda s: calls.append("sleep"))
    monkeypatch.setattr(mpiutil.time, "perf_counter", lambda: 0.0)   # every poll inside the window
    tries = iter(range(5))
    assert mpiutil.Waiter(per_core)._poll(lambda: "done" if next(tries) == 4 else None, "test") == "done"
    assert calls == (["yield"] * 4 if per_core else [])
