"""How a rank waits for a message: asgd.mpiutil.Waiter polls by these, and the simulator
(asgd.sim.actors._next_poll) replays the same polls on its clock.

A rank with a core of its own spins SPIN_S before it sleeps: longer than a large exchange,
which MPI moves only inside MPI calls (a 4 MB push and its reply take about 0.6 ms on
shared memory), so that neither end sleeps through one. With 200 us, both did: asgd's 4 MB
float64 round trip took 1.62x (sgd) and 1.31x (adagrad) the bench's busy-waiting
reply-first floor, 0.87x and 0.84x with 1 or 2 ms (2026-11-28, 2 cores, load 1.1-1.2;
200 KB and 2 MB rows unchanged). Then it sleeps, doubling from FIRST_SLEEP_S to
MAX_SLEEP_S; a rank that shares its core sleeps from the start, up to max_sleep_s(ranks
per core). Each sleeper's poll costs a core a wake-up, so the cap grows with the ranks that
share a core (the polls' share of the cores stays about the same) and a few crowded ranks
wake sooner: 5 ranks on 2 cores training a 2,053-weight model (4 async workers, batch 64)
took 1.48-1.99 s with the cap at 1 ms and 1.14-1.61 s at 0.2 ms, while the 16-rank
default run (0.64 ms) and 9 ranks' sync MNIST (0.36 ms) did not change (2026-11-29, AMD
EPYC, 2 cores, interleaved, 3 runs each).
"""

SPIN_S = 2e-3
FIRST_SLEEP_S = 10e-6
MAX_SLEEP_S = 100e-6
CROWDED_SLEEP_PER_RANK_S = 80e-6   # the cap per rank sharing a core
CROWDED_MAX_SLEEP_S = 1e-3         # and at most this, however crowded


def spin_s(ranks_per_core: float) -> float:
    """How long a rank polls before it first sleeps: only with a core of its own (0: it has)."""
    return 0.0 if ranks_per_core else SPIN_S


def max_sleep_s(ranks_per_core: float) -> float:
    """The backoff's longest sleep, for a rank among `ranks_per_core` ranks per core
    (0: it has a core of its own)."""
    if not ranks_per_core:
        return MAX_SLEEP_S
    return min(CROWDED_MAX_SLEEP_S, max(MAX_SLEEP_S, CROWDED_SLEEP_PER_RANK_S * ranks_per_core))
