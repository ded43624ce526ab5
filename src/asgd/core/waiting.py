"""How a rank waits for a message: asgd.mpiutil.Waiter polls by these, and the simulator
(asgd.sim.actors._next_poll) replays the same polls on its clock.

A rank with a core of its own spins SPIN_S before it sleeps: longer than a large exchange,
which MPI moves only inside MPI calls (a 4 MB push and its reply take about 0.6 ms on
shared memory), so that neither end sleeps through one. With 200 us, both did: asgd's 4 MB
float64 round trip took 1.62x (sgd) and 1.31x (adagrad) the bench's busy-waiting
reply-first floor, 0.87x and 0.84x with 1 or 2 ms (2026-11-28, 2 cores, load 1.1-1.2;
200 KB and 2 MB rows unchanged). Then it sleeps, doubling from FIRST_SLEEP_S to
MAX_SLEEP_S.

A rank that shares its core (ranks outnumber cores) polls between os.sched_yield calls for
CROWDED_YIELD_S / (ranks per core): a rank with work to do takes the core, and a core nobody
wants polls again at once, so a reply to a rank on an idle core is seen in microseconds, not
at its next wake-up. Then it sleeps, up to max_sleep_s(ranks per core). Both shrink the
polls' cost as more ranks share a core: each yield and wake-up costs a core its turn, so the
yield window shrinks and the sleep cap grows with the ranks per core, and their share of
the cores stays about the same.

Measured here (2026-11-29, AMD EPYC, 2 cores, MPICH, interleaved, 3 runs each), training s:
5 ranks, a 2,053-weight model, 4 async workers at batch 64: 1.48-1.99 with sleeps alone
up to 1 ms; 1.14-1.61 up to 0.2 ms; 0.51-0.60 with the yields first. With a fixed 1 ms of
yields the 9-rank sync MNIST run and the 32-rank default ran 13-20 % slower; with the
window scaled, they and the 16-rank default ran as with sleeps alone.
"""

SPIN_S = 2e-3
CROWDED_YIELD_S = 1e-3   # over the ranks per core: a crowded rank's polls between yields
FIRST_SLEEP_S = 10e-6
MAX_SLEEP_S = 100e-6
CROWDED_SLEEP_PER_RANK_S = 80e-6   # the cap per rank sharing a core
CROWDED_MAX_SLEEP_S = 1e-3         # and at most this, however crowded


def ranks_per_core(ranks: int, cores: int) -> float:
    """What the Waiter's rules take: the ranks per core of a node whose ranks outnumber its
    cores, else 0.0 (each rank has a core of its own)."""
    return ranks / cores if ranks > cores else 0.0


def spin_s(ranks_per_core: float) -> float:
    """How long a rank polls before it first sleeps: spinning with a core of its own
    (ranks_per_core 0), yielding the core between polls when it shares one."""
    return CROWDED_YIELD_S / ranks_per_core if ranks_per_core else SPIN_S


def max_sleep_s(ranks_per_core: float) -> float:
    """The backoff's longest sleep, for a rank among `ranks_per_core` ranks per core
    (0: it has a core of its own)."""
    if not ranks_per_core:
        return MAX_SLEEP_S
    return min(CROWDED_MAX_SLEEP_S, max(MAX_SLEEP_S, CROWDED_SLEEP_PER_RANK_S * ranks_per_core))
