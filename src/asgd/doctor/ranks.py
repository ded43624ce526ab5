"""The self-test's 2-rank job (asgd.doctor.selftest starts it: `mpiexec -n 2 python -m
asgd.doctor.ranks [--timed]`), through the parts a run uses, each checked against a
reference; rank 0 prints one JSON line.

  ping-pong   8 B and 1 MiB there and back (probes.ranks.pingpong): what comes back is
              what was sent; the least seconds one way
  push/pull   asgd's Server and worker loop (probes.ranks.exchange) at 2-10K-2's n_w,
              as a default run has them (float32, adagrad on the server): Delta-w of a
              known pattern pushed CHECKED_UPDATES times, the server's w against
              adagrad's in numpy, the worker's last pull one of its versions; with
              --timed the round trip again as calibrate times it
  step        the float32 training step (the run's default precision: the kernels a run
              compiled) on each rank against net.reference's float64 step, within the
              roundings of its sums (tests/test_kernels.py's bound); with --timed also the
              float64 2-10K-2 step at batch 256 timed as calibrate does (probes.calibrate)

This module initializes MPI on import; the doctor's own process never imports it.
"""

from __future__ import annotations

import json
import math
import sys
import time

import numpy as np
from mpi4py import MPI

from ..mpiutil import Waiter
from ..net import mlp, reference
from ..net.optimizers import EPS, Optimizer
from ..probes.ranks import exchange, pingpong, spin_step
from .selftest import N_W, PINGPONG_BYTES, TIMED_BATCH, TIMED_HIDDEN

PINGPONG_VOLUME = 2e7    # bytes each way per window: a tenth of calibrate's
CHECKED_UPDATES, TIMED_UPDATES = 20, 200
ADAGRAD_LR = 0.01
CHECK_HIDDEN, CHECK_BATCH = 1000, 64
U32 = 2.0 ** -24             # float32's unit roundoff


def everyone(comm, ok: bool) -> bool:
    return all(comm.allgather(bool(ok)))


def check_pingpong(comm) -> dict:
    seconds, intact = {}, True
    for nbytes in PINGPONG_BYTES:
        sent = np.random.default_rng(nbytes).random(nbytes // 8)   # the same on both ranks
        back = np.zeros_like(sent)
        seconds[nbytes] = pingpong(comm, sent, back, volume=PINGPONG_VOLUME)
        intact &= np.array_equal(back, sent)   # rank 0: what came back; rank 1: what arrived
    return {"ok": everyone(comm, intact), "seconds": seconds}


def check_pushpull(comm, timed: bool) -> dict:
    """As a default run exchanges (float32, the server's adagrad: the kernels the README's
    first run compiled), a known Delta-w pushed CHECKED_UPDATES times: the server's w must
    be adagrad's from numpy (float64, within float32's roundings), the worker's last pull
    one of its versions (async replies before it applies: one push fewer). Timed: the round
    trip again as calibrate measures it (float64, the server's sgd)."""
    pattern = 0.25 * (np.arange(N_W) % 7)

    def step(w, X, y, lr, dw, progress=None):
        dw[:] = pattern
        return 0.0
    mlp.compile_kernels("aggregate", "update:adagrad", dtype=np.float32)   # the server's: loaded before the clock
    adagrad = Optimizer("adagrad", ADAGRAD_LR, N_W, dtype=np.float32)
    t = time.perf_counter()
    w = exchange(comm, N_W, CHECKED_UPDATES, False, step, np.float32, adagrad)
    round_trip = (time.perf_counter() - t) / CHECKED_UPDATES
    versions = (CHECKED_UPDATES,) if comm.rank == 0 else (CHECKED_UPDATES - 1, CHECKED_UPDATES)
    matches = any(np.allclose(w, adagrad_reference(pattern, k), rtol=1e-5, atol=0) for k in versions)
    if timed:
        mlp.compile_kernels("aggregate", "update:sgd")
        t = time.perf_counter()
        exchange(comm, N_W, TIMED_UPDATES, False, spin_step(0.0))
        round_trip = (time.perf_counter() - t) / TIMED_UPDATES
    return {"ok": everyone(comm, matches), "n_w": N_W, "updates": CHECKED_UPDATES,
            "round_trip_s": comm.bcast(round_trip, root=1), "timed": timed}   # the worker's, as calibrate's


def adagrad_reference(d: np.ndarray, pushes: int) -> np.ndarray:
    """w from zeros after `pushes` pushes of d, as net.optimizers states adagrad, in float64."""
    w, g2 = np.zeros_like(d), np.zeros_like(d)
    for _ in range(pushes):
        g2 += d * d
        w += ADAGRAD_LR * d / (np.sqrt(g2) + EPS)
    return w


def check_step(comm) -> dict:
    layout = mlp.Layout(2, CHECK_HIDDEN, 2)
    rng = np.random.default_rng(comm.rank)
    X, y = rng.normal(size=(CHECK_BATCH, 2)).astype(np.float32), rng.integers(0, 2, CHECK_BATCH)
    w = mlp.init_params(layout, comm.rank, np.float32)
    dw = np.full(layout.n_w, np.nan, np.float32)
    loss = mlp.make_step(layout, CHECK_BATCH, np.float32)(w, X, y, 0.05, dw)
    dw_ref = np.empty(layout.n_w)
    loss_ref = reference.step(layout, w.astype(np.float64), X.astype(np.float64), y, 0.05, dw_ref)
    bound = (CHECK_HIDDEN + CHECK_BATCH) * U32 * np.abs(dw_ref).max()
    error = float(np.abs(dw - dw_ref).max()) if np.isfinite(dw).all() else float("inf")
    ok = error <= bound and abs(loss - loss_ref) <= (CHECK_HIDDEN + 2) * U32 * abs(loss_ref)
    errors = comm.gather(error / bound)
    return {"ok": everyone(comm, ok), "hidden": CHECK_HIDDEN, "batch": CHECK_BATCH,
            "error_of_bound": max(errors) if comm.rank == 0 else None}


def time_step(comm) -> float | None:
    """Rank 0: the float64 2-10K-2 step at batch 256 as calibrate measures it, while rank
    1 waits asleep (so the step has a core)."""
    if comm.rank == 0:
        from ..probes.calibrate import measure_steps   # the orchestrator's module: loaded only when asked
        seconds = measure_steps((TIMED_HIDDEN,), (TIMED_BATCH,), 0.25)[TIMED_HIDDEN][TIMED_BATCH]
    # waits as the most crowded rank does (sleeping up to 1 ms), so the step keeps its core
    Waiter(math.inf, time.monotonic() + 120, f"doctor rank {comm.rank}").barrier(comm, "rank 0's timed step")
    return seconds if comm.rank == 0 else None


def main(argv: list[str]) -> int:
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        print("usage: mpiexec -n 2 python -m asgd.doctor.ranks [--timed]  (internal: python -m asgd.doctor "
              "runs it)", file=sys.stderr)
        return 2
    try:
        timed = "--timed" in argv
        got = {"pingpong": check_pingpong(comm), "pushpull": check_pushpull(comm, timed), "step": check_step(comm)}
        if timed:
            got["step"]["timed_s"] = time_step(comm)
    except Exception as e:   # one line, and the whole job ends now: the other rank may wait on this one
        print(f"asgd.doctor.ranks: rank {comm.rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        comm.Abort(1)
    if comm.rank == 0:
        print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
