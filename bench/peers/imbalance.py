"""mpiexec -n N python bench/peers/imbalance.py [REPS]: one rank works while the others wait,
the case that decides how a crowded rank may wait (asgd.core.waiting). Rank 0 runs REPS
single-threaded 256x256 matrix products (default 1500, about a second here) while ranks
1..N-1 wait for it in asgd's Waiter (a barrier); prints one JSON line: rank 0's wall and
CPU seconds for them (wall over CPU: how much the waiters took from it). Imports asgd
from $PYTHONPATH, so a baseline tree's Waiter is measured the same way."""

import argparse
import json
import os
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("reps", type=int, nargs="?", default=1500, help="rank 0's matrix products (default 1500)")
    reps = p.parse_args().reps
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy: one core's work
    import numpy as np
    from mpi4py import MPI   # here: MPI starts only once the options are understood

    from asgd.mpiutil import Waiter, oversubscribed

    comm = MPI.COMM_WORLD
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 300, f"rank {comm.rank}")
    a = np.random.default_rng(0).random((256, 256))
    waiter.barrier(comm, "the others at the start")
    if comm.rank == 0:
        t, c = time.perf_counter(), time.process_time()
        for _ in range(reps):
            a @ a
        wall, cpu = time.perf_counter() - t, time.process_time() - c
    waiter.barrier(comm, "rank 0's work")
    if comm.rank == 0:
        print(json.dumps({"wall_s": wall, "cpu_s": cpu, "reps": reps, "ranks": comm.size}), flush=True)


if __name__ == "__main__":
    main()
