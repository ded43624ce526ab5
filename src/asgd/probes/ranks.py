"""The calibration probes that run as MPI jobs (asgd.probes.calibrate starts them):
`mpiexec -n N python -m asgd.probes.ranks PROBE [--option value ...] [FILE ...]`, each
printing one JSON line from rank 0 (`python -m asgd.perf.calibrate PROBE ...` too). This
module initializes MPI on import; the orchestrating process never imports it.

  startup      one rank of asgd.train up to its first data: imports, MPI_Init, numba
               cache loads (wall and CPU seconds)                       mpiexec -n 1
  cores        P ranks starting at once, with asgd.train's staged cache loads, no data
               (the job's start-up), then stepping at once: how many cores' worth of
               work they get done (one job for both: a launch costs seconds)
  messaging    raw ping-pong; asgd's push/pull round trip, server CPU per update, the
               worker's time per update beyond a stand-in step          mpiexec -n 2
  contention   1 server and P-1 no-compute workers on the node's cores
(messaging, contention and exchange run once per value precision of --precisions, in one job)
  readers      both readers on one rank, TSV and .npy                   mpiexec -n 1
  exchange     one synchronous round per architecture (asgd.probes.exchanges)
"""

from __future__ import annotations

import time

T0_NS = time.perf_counter_ns()  # the startup probe times from here, as asgd.train does

import importlib
import json
import math
import os
import resource
import sys

import numpy as np
from mpi4py import MPI

from ..core.wire import shard_bounds
from ..data import problem, readers, shares
from ..mpiutil import Waiter, oversubscribed
from ..net import mlp
from ..core.schedule import Schedule
from ..protocol.context import Endpoint
from ..protocol.messages import DenseLink
from ..core.policy import Async
from ..protocol.server import Server
from ..protocol.worker import PushPull, run_worker
from ..run import startup
from ..run.trace import PhaseClock
from . import CalibrationError

PINGPONG_BYTES = (8, 1 << 16, 1 << 20, 1 << 22)


def probe_startup() -> dict:
    """What a worker rank of asgd.train does before its data, in three stages: imports
    (numpy, mpi4py with MPI_Init, numba, the modules a rank runs: startup.RANK_MODULES),
    then numba's cache loads of the readers' parsers, then of its training kernel (the
    first load also pays numba's one-time set-up). Wall and CPU seconds of each, and the
    embedded problem's generation."""
    def cpu():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime
    out, t = {}, T0_NS / 1e9
    for name in startup.RANK_MODULES:
        importlib.import_module(name)
    oversubscribed(MPI.COMM_WORLD)
    stages = (("imports", lambda: None),
              ("parsers", lambda: startup.load(("parsers",))),
              ("kernels", lambda: startup.load(startup.loads("worker", 1, True))))
    for name, f in stages:
        c = cpu() if name != "imports" else 0.0
        f()
        now = time.perf_counter()
        out[f"{name}_wall_s"], out[f"{name}_cpu_s"] = now - t, cpu() - c
        t = now
    t = time.perf_counter()
    problem.default_problem(0)
    out["embedded_s"] = time.perf_counter() - t
    return out


def job_startup() -> float | None:
    """A whole job's start with this many ranks, as asgd.train's with a data file up to
    its first read: every rank's imports at once, then the staged numba cache loads of
    its role (startup.warm_up: the node's first rank, then the others). The slowest
    rank's seconds since its start, as init_s counts them (on rank 0; None elsewhere)."""
    for name in startup.RANK_MODULES:
        importlib.import_module(name)
    comm = MPI.COMM_WORLD
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 300, f"calibrate rank {comm.rank}")
    role = "server" if comm.rank == 0 else "worker"
    error = startup.warm_up(comm, waiter, startup.loads(role, comm.rank, True), startup.node_loads(True))
    if error:
        raise error
    return comm.reduce((time.perf_counter_ns() - T0_NS) / 1e9, op=MPI.MAX)


def probe_messaging(sizes: list[int], updates: int, precisions=("float64",)) -> dict | None:
    """Rank 0 and 1: raw ping-pong one way at each size (bytes: any precision's); then
    asgd's real Server and worker loop (with a stand-in step) at each n_w, in the three
    passes below, once per precision: {"pingpong_s", "precisions": {precision: tables}}."""
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise CalibrationError("the messaging probe needs exactly 2 ranks")
    me = comm.rank
    mlp.compile_kernels()  # the server's add and check: loaded now, not in the timed loop
    out = {"pingpong_s": {}, "precisions": {}}
    for nbytes in sorted(set(PINGPONG_BYTES) | {8 * n for n in sizes}):  # and Delta-w's own sizes
        buf = np.zeros(max(nbytes // 8, 1))
        out["pingpong_s"][buf.nbytes] = pingpong(comm, buf, buf)
    for precision in precisions:
        mlp.compile_kernels(dtype=precision)
    for n_w in sizes:   # the precisions side by side at each size: the machine's drift shared alike
        for precision in precisions:
            got = push_pull(comm, n_w, updates, precision)
            for k, v in got.items():
                out["precisions"].setdefault(precision, {}).setdefault(k, {})[n_w] = v
    return out if me == 0 else None


def pingpong(comm, out: np.ndarray, back: np.ndarray, windows: int = 3, volume: float = 2e8) -> float:
    """Ranks 0 and 1: rank 0 sends `out` and receives into `back`, rank 1 receives into
    `back` and sends it back, over and over: the least seconds one way over `windows`
    windows of repetitions (about `volume` bytes each way, 20 to 2000). One buffer may be
    both (the calibration's); apart, rank 0's `back` ends as what came back (asgd.doctor's
    check)."""
    me, peer = comm.rank, 1 - comm.rank
    reps = max(20, min(2000, int(volume // max(out.nbytes, 1))))
    best = []
    for _ in range(windows):
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(reps):
            if me == 0:
                comm.Send(out, peer, 1)
                comm.Recv(back, peer, 1)
            else:
                comm.Recv(back, peer, 1)
                comm.Send(back, peer, 1)
        best.append((time.perf_counter() - t) / reps / 2)
    return min(best)


def push_pull(comm, n_w: int, updates: int, precision: str) -> dict:
    """asgd's push/pull of n_w values of `precision` between rank 0 (serving) and rank 1:
    round_trip_s, server_update_s, worker_msg_s."""
    # 1: no compute, polling waits: the bare round trip. 2: no compute, sleeping waits
    # (as when ranks share cores): the server is kept busy, its CPU per update is c_u.
    # 3: polling waits (each rank has a core) and a step that computes for twice the
    # round trip, as in async training: the worker's time per update beyond its step
    # (the push/pull's share of c_b). MPI moves a large message only inside MPI calls,
    # so part of the exchange still waits for the step to end: that is counted.
    out, think = {}, 0.0
    for phase in ("round trip", "server", "worker"):
        t, c = time.perf_counter(), time.process_time()
        sleeping = math.inf if phase == "server" else 0.0   # the most crowded ranks' waits (1 ms cap)
        exchange(comm, n_w, updates, sleeping, spin_step(think if phase == "worker" else 0.0), precision)
        wall, cpu = (time.perf_counter() - t) / updates, (time.process_time() - c) / updates
        got = comm.bcast(comm.gather((wall, cpu)))
        if phase == "round trip":
            out["round_trip_s"] = got[1][0]
            think = 2 * got[1][0]
        elif phase == "server":
            out["server_update_s"] = got[0][1]
        else:
            out["worker_msg_s"] = max(got[1][0] - think, 0.0)
    return out


def exchange(comm, n_w: int, updates: int, crowded: float, step, precision: str = "float64",
             optimizer=None) -> np.ndarray:
    """asgd's real protocol, after a barrier: rank 0 serves (Server.serve, async), every
    other rank is a worker pushing `updates` Delta-w of n_w weights of `precision`,
    computing with `step`; waits sleep (crowded) or poll first, as mpiutil.Waiter does;
    the server's `optimizer` (net.optimizers.Optimizer; default sgd, w += Delta-w).
    Returns this rank's w at the end: the server's, or the worker's last pull. (Also
    asgd.testbed.model's probe, and asgd.doctor's self-test.)"""
    w = np.zeros(n_w, precision)
    X, y = np.zeros((updates, 2), precision), np.zeros(updates, np.int64)
    waiter = Waiter(crowded, time.monotonic() + 120, f"calibrate rank {comm.rank}")
    comm.Barrier()
    if comm.rank == 0:
        Server(Endpoint(comm, waiter, PhaseClock("idle")), w, 1, optimizer).serve(Async())
        return w
    shards = shard_bounds(n_w, 1)
    link = PushPull(Endpoint(comm, waiter, PhaseClock("compute")), shards, DenseLink(shards, w))
    run_worker(link, X, y, step, Schedule(batch=1, epochs=1, seed=(0, comm.rank), lr=0.0, adaptive=False))
    return link.w


def spin_step(seconds: float):
    """A stand-in training step that keeps the core busy for `seconds` (0: returns at once),
    calling `progress` about every millisecond until it returns True, as the real step
    calls it between its sample blocks (mlp.make_step)."""
    def step(w, X, y, lr, dw, progress=None):
        now = time.perf_counter()
        end, tick = now + seconds, now + 1e-3
        while now < end:
            if progress is not None and now >= tick:
                progress = None if progress() else progress
                tick = now + 1e-3
            now = time.perf_counter()
        return 0.0
    return step


def probe_cores(hidden: int, batch: int, seconds: float) -> dict | None:
    """The job's start-up first (job_startup: startup_s), then every rank runs training
    steps for `seconds` at once; rank 0 reports the steps per second of all of them
    together. Against one rank's, this is how many cores' worth of work P ranks get done
    on this node (hyperthreads, sharing, context switches)."""
    startup_s = job_startup()
    comm = MPI.COMM_WORLD
    layout = mlp.Layout(2, hidden, 2)
    w, dw, ds = mlp.init_params(layout, 0), np.zeros(layout.n_w), problem.rings(batch, comm.rank)
    step = mlp.make_step(layout, batch)
    step(w, ds.X, ds.y, 1e-9, dw)
    comm.Barrier()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        step(w, ds.X, ds.y, 1e-9, dw)
        n += 1
    rates = comm.gather(n / (time.perf_counter() - t0))
    return {"steps_per_s": sum(rates), "startup_s": startup_s} if comm.rank == 0 else None


def probe_contention(sizes: list[int], updates: int, precision: str = "float64") -> dict | None:
    """Rank 0 serves, every other rank is a no-compute worker pushing `updates` Delta-w
    of `precision`: the updates/s the whole job gets through at each n_w when its ranks
    share the cores (message copies, wake-ups, caches shared), which 2 ranks alone do not show."""
    comm = MPI.COMM_WORLD
    mlp.compile_kernels(dtype=precision)
    crowded = oversubscribed(comm)
    out = {}
    for n_w in sizes:
        t = time.perf_counter()
        exchange(comm, n_w, updates, crowded, spin_step(0.0), precision)
        out[n_w] = (comm.size - 1) * updates / (time.perf_counter() - t)
    return {"updates_per_s": out} if comm.rank == 0 else None


def probe_readers(files: list[str]) -> dict:
    """One rank, both readers, each file: read+parse seconds per byte ([reader][format]),
    and the keep (sequential) or shuffle (parallel) seconds per point."""
    comm, out = MPI.COMM_WORLD, {"read_s_per_byte": {}, "select_s_per_point": {}, "bytes_per_point": {}}
    for path in files:
        fmt = "npy" if path.endswith(".npy") else "tsv"
        size = os.path.getsize(path)
        for reader in ("sequential", "parallel"):
            best = None
            for _ in range(3):
                got = readers.load(comm, Waiter(False, time.monotonic() + 120), path, None, reader, shares.Job(0))
                t = got.times
                n = got.train_points + len(got.test.y)
                cost = (t.get("read", 0) + t.get("parse", 0), t.get("shuffle", 0))
                best = cost if best is None or sum(cost) < sum(best) else best
            out["read_s_per_byte"].setdefault(reader, {})[fmt] = best[0] / size
            out["bytes_per_point"][fmt] = size / n
            out["select_s_per_point"].setdefault(reader, []).append(best[1] / n)
    out["select_s_per_point"] = {k: min(v) for k, v in out["select_s_per_point"].items()}
    return out


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _precisions(o: dict) -> list[str]:
    """--precisions float32,float64 (default float64): the values' dtypes a probe runs in."""
    return o.get("--precisions", "float64").split(",")


def each_precision(probe):
    """A probe run once per --precisions in one job (a launch costs seconds): rank 0's
    {"precisions": {precision: its answer}}, None on the other ranks; without the
    option, its float64 answer as it is (asgd.testbed.model's)."""
    def run(o, rest):
        if "--precisions" not in o:
            return probe(o, rest, "float64")
        got = {prec: probe(o, rest, prec) for prec in _precisions(o)}
        return {"precisions": got} if MPI.COMM_WORLD.rank == 0 else None
    return run


# probe name -> its function of the options (--name value pairs) and positional arguments
PROBES = {
    "startup": lambda o, rest: probe_startup(),
    "messaging": lambda o, rest: probe_messaging(_ints(o["--nw"]), int(o["--updates"]), _precisions(o)),
    "cores": lambda o, rest: probe_cores(int(o["--hidden"]), int(o["--batch"]), float(o["--seconds"])),
    "contention": each_precision(lambda o, rest, prec: probe_contention(_ints(o["--nw"]), int(o["--updates"]), prec)),
    "readers": lambda o, rest: probe_readers(rest),
    "exchange": each_precision(lambda o, rest, prec: probe_exchange(
        o["--kinds"].split(","), _ints(o.get("--nw", "")), int(o["--rounds"]), _ints(o.get("--batches", "")),
        int(o.get("--servers", "1")), prec)),
}


def probe_exchange(*args):
    """asgd.probes.exchanges.probe_exchange, imported by its probe alone: its modules are
    not a training rank's, and the startup probes time this module's imports."""
    from .exchanges import probe_exchange as probe
    return probe(*args)


def main(argv: list[str]) -> int:
    """mpiexec -n N python -m asgd.probes.ranks PROBE [--option value ...] [FILE ...]: one JSON
    line from rank 0 (internal: `python -m asgd.perf calibrate` runs these)."""
    if not argv or argv[0] not in PROBES:
        print(f"usage: mpiexec -n N python -m asgd.probes.ranks {{{','.join(PROBES)}}} ...  (internal: "
              "use python -m asgd.perf calibrate)", file=sys.stderr)
        return 2
    args = argv[1:]
    options = dict(zip(args[0::2], args[1::2])) if args and args[0].startswith("--") else {}
    got = PROBES[argv[0]](options, args)
    if got:  # MPI probes answer on rank 0 only
        print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
