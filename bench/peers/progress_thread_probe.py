"""Probe: progress for an exchange in flight behind numba compute, three ways, on 2 ranks:
  off     no MPI call during the compute (before --mpi-progress step)
  block   MPI_Testall between chunks of about 0.5 ms of compute (what asgd's step does)
  thread  a Python thread calls MPI_Testall every 0.5 ms while the main thread runs one
          nogil numba call (MPI_THREAD_MULTIPLE: mpi4py asks for it, MPICH grants it)
Rank 0 echoes n doubles; rank 1 pushes n, pulls n, computes c = 2 E (E: the exchange
alone, measured first), then waits; per mode the median step period T over `steps`
steps and hidden = (c + E - T) / min(c, E). The compute is a stand-in numba loop, timed
once, so on a loaded machine c is only nominal: compare the modes within a repetition.

    mpiexec -n 2 python bench/peers/progress_thread_probe.py 500002 30          # shared memory
    python -m asgd.testbed up --hosts 2 --bandwidth 1gbit --name pt
    python -m asgd.testbed run --name pt --servers 1 -- \\
        mpiexec -n 2 python bench/peers/progress_thread_probe.py 500002 30
    python -m asgd.testbed down --name pt

Measured (shared memory and a 1 Gbit/s testbed, 400 KB and 4 MB; the numbers are in this
file's git history): the thread was never clearly better and often worse (its wake-ups
compete for the cores); block is deterministic and needs no thread level: asgd uses it
(mlp.make_step, PushPull.progress).
"""
import argparse
import json
import math
import threading
import time

_p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
_p.add_argument("n", nargs="?", type=int, default=500_002, help="doubles per message (default 500002)")
_p.add_argument("steps", nargs="?", type=int, default=30, help="steps per mode and repetition (default 30)")
_a = _p.parse_args()   # before MPI starts: --help needs no MPI
import numpy as np
from mpi4py import MPI
from numba import njit

@njit(nogil=True, cache=True)
def spin(n):
    s = 0.0
    for i in range(n):
        s += math.sqrt(i + s * 1e-12)
    return s

comm = MPI.COMM_WORLD
n, steps = _a.n, _a.steps
buf_a, buf_b = np.zeros(n), np.zeros(n)

def poll(reqs, sleep=50e-6):
    while not MPI.Request.Testall(reqs):
        time.sleep(sleep)

spin(10)
t = time.perf_counter()
spin(2_000_000)
per_iter = (time.perf_counter() - t) / 2_000_000

def server(total):
    for _ in range(total):
        poll([comm.Irecv(buf_a, 1, 1)])
        poll([comm.Isend(buf_a, 1, 2)])

def worker(mode, c_s):
    T = []
    iters = int(c_s / per_iter)
    chunk = max(1, int(0.5e-3 / per_iter))
    for k in range(steps):
        t0 = time.perf_counter()
        reqs = [comm.Isend(buf_b, 0, 1), comm.Irecv(buf_a, 0, 2)]
        if mode == "off":
            spin(iters)
        elif mode == "block":
            done, left = False, iters
            while left > 0:
                if not done:
                    done = MPI.Request.Testall(reqs)
                m = left if done else min(chunk, left)
                spin(m)
                left -= m
        elif mode == "thread":
            stop = threading.Event()
            def prog():
                while not stop.is_set():
                    if MPI.Request.Testall(reqs):
                        return
                    time.sleep(0.5e-3)
            th = threading.Thread(target=prog)
            th.start()
            spin(iters)
            stop.set()
            th.join()
        poll(reqs)
        T.append(time.perf_counter() - t0)
    return float(np.median(T[3:]))

modes = ["off", "block", "thread"]
plan = []
for rep in range(3):   # E, then the modes, alternately forwards and backwards; c = 2 E
    plan += [("E", 0.0)] + [(m, 2.0) for m in (modes if rep % 2 == 0 else modes[::-1])]
res = {"thread_level": MPI.Query_thread(), "n": n, "rows": []}
E = None
for mode, ratio in plan:
    comm.Barrier()
    if comm.rank == 0:
        server(steps)
        continue
    if mode == "E":
        E = worker("off", 0.0)
        res["rows"].append({"mode": "E", "T_ms": 1e3 * E})
    else:
        c = ratio * E
        T = worker(mode, c)
        res["rows"].append({"mode": mode, "ratio": ratio, "E_ms": 1e3 * E, "c_ms": 1e3 * c, "T_ms": 1e3 * T,
                            "hidden": max(0.0, min(1.0, (c + E - T) / min(c, E)))})
if comm.rank == 1:
    print(json.dumps(res), flush=True)
