"""The Waiter's backoff (asgd.core.waiting), which the MPI run and the simulator share."""

import pytest

from asgd.core import waiting
from asgd.sim.actors import _next_poll


def test_a_crowded_ranks_longest_sleep_grows_with_the_ranks_per_core():
    """A core of its own: short sleeps after its spin. Sharing one: the cap is 80 us per
    rank per core (5 ranks on 2 cores wake within 0.2 ms), between the uncrowded cap and
    1 ms, which 13 or more ranks per core reach."""
    assert (waiting.spin_s(0.0), waiting.max_sleep_s(0.0)) == (waiting.SPIN_S, waiting.MAX_SLEEP_S)
    assert waiting.spin_s(2.5) == 0.0
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
