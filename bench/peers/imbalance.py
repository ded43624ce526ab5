"""mpiexec -n N python bench/peers/imbalance.py [REPS]: one rank works while the others wait,
the case that decides how a crowded rank may wait (asgd.core.waiting). Rank 0 runs REPS
single-threaded 256x256 matrix products (default 1500, about a second here) while ranks
1..N-1 wait for it in asgd's Waiter (a barrier); prints one JSON line: rank 0's wall and
CPU seconds for them (wall over CPU: how much the waiters took from it). Imports asgd
from $PYTHONPATH, so a baseline tree's Waiter is measured the same way."""

import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # before numpy: one core's work
import numpy as np  # noqa: E402  (after the thread pin)
from mpi4py import MPI  # noqa: E402

from asgd.mpiutil import Waiter, oversubscribed  # noqa: E402


def main() -> None:
    comm = MPI.COMM_WORLD
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 300, f"rank {comm.rank}")
    a = np.random.default_rng(0).random((256, 256))
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
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
