"""How a rank waits for a message: asgd.mpiutil.Waiter polls by these, and the simulator
(asgd.sim.actors._next_poll) replays the same polls on its clock.

A rank with a core of its own spins SPIN_S before it sleeps: longer than a large exchange,
which MPI moves only inside MPI calls (a 4 MB push and its reply take about 0.6 ms on
shared memory), so that neither end sleeps through one. With 200 us, both did: asgd's 4 MB
float64 round trip took 1.62x (sgd) and 1.31x (adagrad) the bench's busy-waiting
reply-first floor, 0.87x and 0.84x with 1 or 2 ms (2026-11-28, 2 cores, load 1.1-1.2;
200 KB and 2 MB rows unchanged). Then it sleeps, doubling from FIRST_SLEEP_S to
MAX_SLEEP_S; a rank that shares its core sleeps from the start, up to CROWDED_MAX_SLEEP_S.
"""

SPIN_S = 2e-3
FIRST_SLEEP_S = 10e-6
MAX_SLEEP_S = 100e-6
CROWDED_MAX_SLEEP_S = 1e-3
