"""Measure the performance model's machine-dependent parameters, as the paper did with
STREAM, iperf and single-node runs: microbenchmarks of asgd's own parts, never runs of
the configurations to be predicted.

  startup      one rank of asgd.train up to its first data: imports, MPI_Init, numba
               cache loads (wall and CPU seconds)                       mpiexec -n 1
  step         the numba training step with its batch gather, per hidden and batch size
               (c_p, c_b; the batch sizes span the caches: Figure 4), the least of
               two windows, at the start and at the end                  in process
  evaluate     held-out evaluation per point, per hidden size            in process
  job startup  P ranks starting at once, with asgd.train's staged cache loads, no data
                                                                         mpiexec -n P
  cores        P ranks stepping at once (2-10K-2 and 2-100K-2): how many cores' worth of
               work they get done                                        mpiexec -n P
  messaging    raw ping-pong (r_net); asgd's push/pull: the round trip (no compute), the
               server's CPU per update (c_u), the worker's time per update beyond a
               stand-in step (its share of c_b)                          mpiexec -n 2
  contention   1 server and P-1 no-compute workers on the node's cores: CPU per update of
               the push/pull when ranks outnumber cores                 mpiexec -n P
  readers      both readers on one rank, TSV and .npy: read + parse per byte (r_d), keep
               or shuffle per point                                      mpiexec -n 1
  memory       STREAM-like copy (r_m), and the cache sizes from sysfs    in process
  optimizers   each server-side optimizer's update per size (sgd, momentum, adagrad,
               adam: what a server's or allreduce rank's update costs)   in process
  mp steps     a member's step of a model split K = 2, 4 ways            in process
  exchanges    one synchronous round with no compute, per architecture: the parameter
               server's, p2p's, the ring allreduce's, MPI_Iallreduce's (whatever
               algorithm this MPI picks: measured, not assumed), a replica's logit sum
               (asgd.perf.exchanges)                                     mpiexec -n P

The orchestrating process never initializes MPI; the MPI probes run under the launcher
(`--launcher`, default mpiexec) as `python -m asgd.perf.calibrate PROBE ...`, each printing
one JSON line.
"""

from __future__ import annotations

import time

T0_NS = time.perf_counter_ns()  # the startup probe times from here, as asgd.train does

import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from .. import launch  # noqa: E402

HIDDEN = (1000, 10000, 100000)
BATCHES = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_HIDDEN, QUICK_BATCHES = (1000, 10000), (1, 16, 256, 1024)
PINGPONG_BYTES = (8, 1 << 16, 1 << 20, 1 << 22)


class CalibrationError(RuntimeError):
    pass


# -- probes that run under MPI -----------------------------------------------------------

def probe_startup() -> dict:
    """What a worker rank of asgd.train does before its data, in three stages: imports
    (numpy, mpi4py with MPI_Init, numba, the modules a rank runs: startup.RANK_MODULES),
    then numba's cache loads of the readers' parsers, then of its training kernel (the
    first load also pays numba's one-time set-up). Wall and CPU seconds of each, and the
    embedded problem's generation."""
    import importlib
    import resource

    from ..run import startup

    def cpu():
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime
    out, t = {}, T0_NS / 1e9
    for name in startup.RANK_MODULES:
        importlib.import_module(name)
    from mpi4py import MPI

    from ..data import problem
    from ..mpiutil import oversubscribed
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


def probe_job_startup() -> dict | None:
    """A whole job's start with this many ranks, as asgd.train's with a data file up to
    its first read: every rank's imports at once, then the staged numba cache loads of
    its role (startup.warm_up: the node's first rank, then the others). The slowest
    rank's seconds since its start, as init_s counts them."""
    import importlib

    from ..run import startup
    for name in startup.RANK_MODULES:
        importlib.import_module(name)
    from mpi4py import MPI

    from ..mpiutil import Waiter, oversubscribed
    comm = MPI.COMM_WORLD
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 300, f"calibrate rank {comm.rank}")
    role = "server" if comm.rank == 0 else "worker"
    error = startup.warm_up(comm, waiter, startup.loads(role, comm.rank, True), startup.node_loads(True))
    if error:
        raise error
    slowest = comm.reduce((time.perf_counter_ns() - T0_NS) / 1e9, op=MPI.MAX)
    return {"startup_s": slowest} if comm.rank == 0 else None


def probe_messaging(sizes: list[int], updates: int) -> dict | None:
    """Rank 0 and 1: raw ping-pong one way at each size; then asgd's real Server and
    worker loop (with a stand-in step) at each n_w, in the three passes below."""
    import numpy as np
    from mpi4py import MPI

    from ..net import mlp
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise CalibrationError("the messaging probe needs exactly 2 ranks")
    me, peer = comm.rank, 1 - comm.rank
    mlp.compile_kernels()  # the server's add and check: loaded now, not in the timed loop
    out = {"pingpong_s": {}, "round_trip_s": {}, "server_update_s": {}, "worker_msg_s": {}}
    for nbytes in sorted(set(PINGPONG_BYTES) | {8 * n for n in sizes}):  # and Delta-w's own sizes
        buf = np.zeros(max(nbytes // 8, 1))
        reps = max(20, min(2000, int(2e8 // max(nbytes, 1))))
        best = []
        for _ in range(3):
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(reps):
                if me == 0:
                    comm.Send(buf, peer, 1)
                    comm.Recv(buf, peer, 1)
                else:
                    comm.Recv(buf, peer, 1)
                    comm.Send(buf, peer, 1)
            best.append((time.perf_counter() - t) / reps / 2)
        out["pingpong_s"][buf.nbytes] = min(best)
    for n_w in sizes:
        # 1: no compute, polling waits: the bare round trip. 2: no compute, sleeping waits
        # (as when ranks share cores): the server is kept busy, its CPU per update is c_u.
        # 3: polling waits (each rank has a core) and a step that computes for twice the
        # round trip, as in async training: the worker's time per update beyond its step
        # (the push/pull's share of c_b). MPI moves a large message only inside MPI calls,
        # so part of the exchange still waits for the step to end: that is counted.
        think = 0.0
        for phase in ("round trip", "server", "worker"):
            t, c = time.perf_counter(), time.process_time()
            exchange(comm, n_w, updates, phase == "server", spin_step(think if phase == "worker" else 0.0))
            wall, cpu = (time.perf_counter() - t) / updates, (time.process_time() - c) / updates
            got = comm.bcast(comm.gather((wall, cpu)))
            if phase == "round trip":
                out["round_trip_s"][n_w] = got[1][0]
                think = 2 * got[1][0]
            elif phase == "server":
                out["server_update_s"][n_w] = got[0][1]
            else:
                out["worker_msg_s"][n_w] = max(got[1][0] - think, 0.0)
    return out if me == 0 else None


def exchange(comm, n_w: int, updates: int, crowded: bool, step) -> None:
    """asgd's real protocol, after a barrier: rank 0 serves (Server.serve, async), every
    other rank is a worker pushing `updates` Delta-w of n_w weights, computing with
    `step`; waits sleep (crowded) or poll first, as mpiutil.Waiter does. (Also
    asgd.testbed.model's probe.)"""
    import numpy as np

    from ..mpiutil import Waiter
    from ..protocol.context import Endpoint, Schedule
    from ..protocol.messages import Float64Link
    from ..core.policy import Async
    from ..protocol.server import Server
    from ..protocol.worker import PushPull, run_worker
    from ..run.trace import PhaseClock
    from ..core.wire import shard_bounds
    w = np.zeros(n_w)
    X, y = np.zeros((updates, 2)), np.zeros(updates, np.int64)
    waiter = Waiter(crowded, time.monotonic() + 120, f"calibrate rank {comm.rank}")
    comm.Barrier()
    if comm.rank == 0:
        Server(Endpoint(comm, waiter, PhaseClock("idle")), w, 1).serve(Async())
    else:
        shards = shard_bounds(n_w, 1)
        link = PushPull(Endpoint(comm, waiter, PhaseClock("compute")), shards, Float64Link(shards, w))
        run_worker(link, X, y, step, Schedule(batch=1, epochs=1, seed=(0, comm.rank), lr=0.0, adaptive=False))


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
    """Every rank runs training steps for `seconds` at once; rank 0 reports the steps per
    second of all of them together. Against one rank's, this is how many cores' worth of
    work P ranks get done on this node (hyperthreads, sharing, context switches)."""
    import numpy as np
    from mpi4py import MPI

    from ..data import problem
    from ..net import mlp
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
    return {"steps_per_s": sum(rates)} if comm.rank == 0 else None


def probe_contention(sizes: list[int], updates: int) -> dict | None:
    """Rank 0 serves, every other rank is a no-compute worker pushing `updates` Delta-w:
    the updates/s the whole job gets through at each n_w when its ranks share the cores
    (message copies, wake-ups, caches shared), which 2 ranks alone do not show."""
    from mpi4py import MPI

    from ..net import mlp
    from ..mpiutil import oversubscribed
    comm = MPI.COMM_WORLD
    mlp.compile_kernels()
    crowded = oversubscribed(comm)
    out = {}
    for n_w in sizes:
        t = time.perf_counter()
        exchange(comm, n_w, updates, crowded, spin_step(0.0))
        out[n_w] = (comm.size - 1) * updates / (time.perf_counter() - t)
    return {"updates_per_s": out} if comm.rank == 0 else None


def probe_readers(files: list[str]) -> dict:
    """One rank, both readers, each file: read+parse seconds per byte ([reader][format]),
    and the keep (sequential) or shuffle (parallel) seconds per point."""
    from mpi4py import MPI

    from ..data import readers, shares
    from ..mpiutil import Waiter
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


# -- in-process microbenchmarks ------------------------------------------------------------

def _best(f, min_time: float, max_reps: int = 1000, cpu: dict | None = None) -> float:
    """Least seconds per call of f, over repetitions totalling about min_time. With
    `cpu` (a dict), also the least CPU seconds per call of this thread, in cpu["s"]:
    what the call costs its core, whatever other processes took from it meanwhile."""
    f()
    t0, c0 = time.perf_counter(), time.thread_time()
    f()
    one, one_cpu = time.perf_counter() - t0, time.thread_time() - c0
    reps = max(3, min(max_reps, int(min_time / max(one, 1e-7))))
    best, best_cpu = one, one_cpu
    for _ in range(3):
        k = max(1, reps // 3)
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(k):
            f()
        best = min(best, (time.perf_counter() - t) / k)
        best_cpu = min(best_cpu, (time.thread_time() - c) / k)
    if cpu is not None:
        cpu["s"] = best_cpu
    return best


def measure_steps(hidden: tuple, batches: tuple, min_time: float, cpu_out: dict | None = None) -> dict:
    """Seconds per worker step (batch gather + numba step), as run_worker does it; with
    cpu_out, its least CPU seconds per step too (cpu_out[hidden][batch])."""
    import numpy as np

    from ..data import problem
    from ..net import mlp
    ds = problem.rings(65536, 0)
    out = {}
    for h in hidden:
        layout = mlp.Layout(2, h, 2)
        w, dw = mlp.init_params(layout, 0), np.zeros(layout.n_w)
        out[h] = {}
        rng = np.random.default_rng(0)
        for b in batches:
            step = mlp.make_step(layout, b)
            Xb, yb = np.empty((b, 2)), np.empty(b, np.int64)

            def one():
                idx = rng.integers(0, len(ds.y), b)
                np.take(ds.X, idx, axis=0, out=Xb)
                np.take(ds.y, idx, out=yb)
                step(w, Xb, yb, 1e-9, dw)
            got: dict = {}
            out[h][b] = _best(one, min_time * (1 if b * h < 2e7 else 0.3), 2000, got)
            if cpu_out is not None:
                cpu_out.setdefault(h, {})[b] = got["s"]
    return out


def _least(a: dict, b: dict) -> dict:
    """[hidden][batch] -> the lesser of a's and b's seconds."""
    return {h: {k: min(a[h][k], b[h][k]) for k in a[h]} for h in a}


SPREAD_P = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def measure_step_spread(hidden: tuple, batches: tuple, best: dict, budget_s: float) -> dict:
    """How single steps spread around the best (step_s is the least time per step over
    repetitions): [hidden][batch] -> {"p": probabilities, "ratio": quantiles of one step's
    time over the least}, from individually timed steps (asgd.sim draws step times from
    it). Each step's CPU time (the thread's clock), not its wall time: the spread of the
    work itself, not of other processes taking the core (a simulator shares the cores
    itself). Only where a step takes under 0.1 s; about budget_s per (hidden, batch)."""
    import numpy as np

    from ..data import problem
    from ..net import mlp
    ds = problem.rings(65536, 0)
    out = {}
    for h in hidden:
        layout = mlp.Layout(2, h, 2)
        w, dw = mlp.init_params(layout, 0), np.zeros(layout.n_w)
        rng = np.random.default_rng(1)
        for b in batches:
            t_best = best[h][b]
            if t_best >= 0.1:
                continue
            step = mlp.make_step(layout, b)
            Xb, yb = np.empty((b, 2)), np.empty(b, np.int64)
            times = []
            for _ in range(max(10, min(300, int(budget_s / t_best)))):
                idx = rng.integers(0, len(ds.y), b)
                t = time.thread_time()
                np.take(ds.X, idx, axis=0, out=Xb)
                np.take(ds.y, idx, out=yb)
                step(w, Xb, yb, 1e-9, dw)
                times.append(time.thread_time() - t)
            q = np.quantile(np.array(times) / max(min(times), 1e-9), SPREAD_P)
            out.setdefault(h, {})[b] = {"p": list(SPREAD_P), "ratio": [round(float(x), 4) for x in q]}
    return out


def measure_sleep_overhead(reps: int = 200) -> float:
    """How much longer than asked time.sleep(10 us) takes (the Waiter's backoff sleeps;
    on this machine it does not go below about 60-100 us): the median overshoot."""
    over = []
    for _ in range(reps):
        t = time.perf_counter()
        time.sleep(10e-6)
        over.append(time.perf_counter() - t - 10e-6)
    return statistics.median(over)


def measure_evaluate(hidden: tuple, min_time: float) -> dict:
    from ..data import problem
    from ..net import mlp
    test = problem.rings(2048, 1)
    out = {}
    for h in hidden:
        layout = mlp.Layout(2, h, 2)
        ev = mlp.make_evaluate(layout, mlp.init_params(layout, 0), test)
        out[h] = _best(ev, min_time, 50) / len(test.y)
    return out


def measure_memory(mib: int = 128) -> float:
    """r_m: seconds per byte moved by a large numpy copy (read + write counted)."""
    import numpy as np
    a = np.ones(mib << 17)
    b = np.empty_like(a)
    t = _best(lambda: np.copyto(b, a), 0.3, 10)
    return t / (2 * a.nbytes)


def caches() -> dict[str, int]:
    """Cache sizes of cpu0 in bytes, from sysfs."""
    out = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for d in sorted(base.glob("index*")):
        try:
            level, kind = (d / "level").read_text().strip(), (d / "type").read_text().strip()
            size = (d / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
        out[f"L{level}{'d' if kind == 'Data' else ''}"] = int(size.rstrip("KMG")) * mult
    return out


# -- the orchestrator ------------------------------------------------------------------------

def _launch(launcher: str | None, n: int, args: list[str], timeout: float) -> dict:
    try:
        cmd = launch.command(n, sys.executable, "-m", "asgd.perf.calibrate", *args, launcher=launcher)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise CalibrationError(f"cannot start MPI ({e}); is MPI installed? (or pass --launcher)") from None
    except subprocess.TimeoutExpired:
        raise CalibrationError(f"{' '.join(cmd)} took over {timeout:.0f} s") from None
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        raise CalibrationError(f"{' '.join(cmd)} failed (exit {p.returncode}): {p.stderr.strip()[-600:]}")
    return json.loads(lines[-1])


def calibrate(launcher: str | None = None, quick: bool = False, say=print) -> dict:
    """Every parameter, with units and the machine description: params.json's content."""
    from ..data import formats, problem
    from ..launch import cores_available
    from .analytic import extrapolate_linear
    t_all = time.perf_counter()
    hidden, batches = (QUICK_HIDDEN, QUICK_BATCHES) if quick else (HIDDEN, BATCHES)
    min_time = 0.05 if quick else 0.25
    say("calibrate: startup of one rank (imports, MPI_Init, numba cache loads)")
    _launch(launcher, 1, ["startup"], 300)  # fills numba's cache if it is cold
    starts = [_launch(launcher, 1, ["startup"], 300) for _ in range(1 if quick else 5)]
    start = {k: statistics.median(s[k] for s in starts) for k in starts[0]}
    say("  " + ", ".join(f"{k[:-2]} {v:.3f} s" for k, v in start.items()))
    say(f"calibrate: training step, hidden {hidden} x batch {batches}")
    steps_cpu: dict = {}
    steps = measure_steps(hidden, batches, min_time, steps_cpu)
    say("calibrate: the spread of single steps around the best")
    spread = measure_step_spread(hidden, batches, steps, 0.1 if quick else 0.4)
    say("calibrate: held-out evaluation")
    evaluate = measure_evaluate(hidden, min_time)
    nws = sorted({h * 3 + 2 * (h + 1) for h in hidden})  # Delta-w of each calibrated hidden size
    say(f"calibrate: messaging, ping-pong and push/pull at n_w {nws}")
    msg = _launch(launcher, 2, ["messaging", "--nw", ",".join(map(str, nws)),
                                "--updates", "200" if quick else "1000"], 600)
    C = cores_available()
    counts = sorted({1, C, 2 * C + 1} if quick else {1, C, C + 1, 2 * C + 1, 4 * C + 1, 8 * C + 1})
    say(f"calibrate: cores' worth of training steps done by {counts} ranks at once, batch 256")
    worth = {}  # [hidden][ranks]: cores' worth of steps, against one rank's
    for h in [x for x in hidden if x >= 10000]:
        rates = {n: [] for n in counts}
        for _ in range(1 if quick else 2):  # interleaved repetitions, medians: the machine drifts
            for n in counts:
                rates[n].append(_launch(launcher, n, ["cores", "--hidden", str(h), "--batch", "256",
                                                      "--seconds", "0.5" if quick else "1.0"], 300)["steps_per_s"])
        worth[h] = {n: statistics.median(r) / statistics.median(rates[1]) for n, r in rates.items()}
        say(f"  hidden {h}: " + ", ".join(f"{n}: {v:.2f}" for n, v in worth[h].items()))
    say(f"calibrate: a job's start-up (no data) with {counts} ranks")
    job_start = {n: [] for n in counts}
    for _ in range(1 if quick else 3):
        for n in counts:
            job_start[n].append(_launch(launcher, n, ["job-startup"], 300)["startup_s"])
    job_start = {n: statistics.median(v) for n, v in job_start.items()}
    say("  " + ", ".join(f"{n}: {v:.2f} s" for n, v in job_start.items()))
    crowd = sorted({2 * C + 1} if quick else {C + 1, 2 * C + 1, 4 * C + 1})
    say(f"calibrate: push/pull CPU per update with {crowd} ranks sharing the cores (no-compute workers)")
    contended = {}
    for n in crowd:
        got = _launch(launcher, n, ["contention", "--nw", ",".join(map(str, nws)),
                                    "--updates", str(max(50, (400 if quick else 2000) // (n - 1)))], 600)
        c_eff = extrapolate_linear(worth[min(worth)], n)  # cores' worth the n ranks get
        contended[n] = {int(k): c_eff / v for k, v in got["updates_per_s"].items()}
    say("calibrate: the server-side optimizers' updates, and model-parallel members' steps")
    ex = _exchanges()
    sizes = sorted({n // d for n in nws for d in (1, 4)})  # whole Delta-w and a quarter shard
    optimizer_s = ex.measure_optimizers(sizes, lambda f: _best(f, min_time / 4, 2000))
    mp_steps = ex.measure_mp_steps(hidden, batches, (2, 4), lambda f: _best(f, min_time / 2, 2000))
    say("  " + ", ".join(f"{o} {1e6 * t[max(t)]:.0f} us" for o, t in optimizer_s.items()) + f" at n={max(sizes):,}")
    exchange_s = measure_exchanges(launcher, C, nws, quick, say)
    say("calibrate: readers (TSV, .npy; sequential, parallel)")
    with tempfile.TemporaryDirectory(prefix="asgd-calibrate-") as tmp:
        ds = problem.rings(50_000 if quick else 400_000, 0)
        files = [os.path.join(tmp, "cal.tsv"), os.path.join(tmp, "cal.npy")]
        for f in files:
            formats.write(f, ds)
        rd = _launch(launcher, 1, ["readers", *files], 600)
    # The step once more, minutes after the first: a VM's core can run 40-70 % slower for a
    # minute (CPU seconds and wall alike: three calibrations of one quiet machine measured
    # 7.9, 9.8 and 11.1 ms for the 2-10K-2 batch-256 step while the runs beside them took
    # 8.0-9.1 ms), and step_s is the least time per step, so the least of both windows.
    say("calibrate: the training step again (the least of the two windows)")
    again_cpu: dict = {}
    again = measure_steps(hidden, batches, min_time, again_cpu)
    drift = statistics.median(steps[h][b] / again[h][b] for h in hidden for b in batches)
    say(f"  the first window's steps took {drift:.2f}x the second's (median)")
    steps = _least(steps, again)
    steps_cpu = _least(steps_cpu, again_cpu)
    if not quick:   # the crowded rounds hold a step each: the least of two windows too
        say("calibrate: the rounds after a training step again (the least of the two windows)")
        for kind, by_p in measure_exchanges(launcher, C, nws, quick, say, stepped_only=True).items():
            exchange_s[kind] = _least(exchange_s[kind], by_p)
    say("calibrate: memory bandwidth, caches")
    params = {
        "cores": C, "effective_cores": worth,
        "startup": {k: v for k, v in start.items() if k != "embedded_s"}, "embedded_s": start["embedded_s"],
        "startup_by_ranks": job_start,
        "step_s": steps, "eval_s_per_point": evaluate,
        "worker_msg_s": msg["worker_msg_s"], "server_update_s": msg["server_update_s"],
        "round_trip_s": msg["round_trip_s"], "pingpong_s": msg["pingpong_s"], "contended_update_s": contended,
        "read_s_per_byte": rd["read_s_per_byte"], "select_s_per_point": rd["select_s_per_point"],
        "bytes_per_point": rd["bytes_per_point"],
        "memory_s_per_byte": measure_memory(32 if quick else 128), "caches": caches(),
        "step_spread": spread, "step_cpu_s": steps_cpu, "sleep_overhead_s": measure_sleep_overhead(),
        "optimizer_s": optimizer_s, "mp_step_s": mp_steps, "exchange_s": exchange_s,
    }
    return {"schema": 1, "params": params, "units": UNITS, "machine": describe(launcher),
            "quick": quick, "seconds": round(time.perf_counter() - t_all, 1)}


UNITS = {
    "cores": "cores this process may run on",
    "effective_cores": "cores' worth of training steps done by P ranks at once, [hidden][P]",
    "startup": "s (wall) and CPU s of one rank's imports, parser and kernel cache loads",
    "embedded_s": "s per rank to generate the embedded problem",
    "startup_by_ranks": "s, a job's start-up with P ranks and no data (slowest rank), [P]",
    "step_s": "s per training step (the least of two windows), [hidden][batch]", "eval_s_per_point": "s per held-out point, [hidden]",
    "worker_msg_s": "s a worker spends per push/pull beyond its step, 2 ranks, [n_w]",
    "server_update_s": "c_u: server CPU s per update, [n_w]",
    "round_trip_s": "s per push/pull round trip without compute, [n_w]",
    "pingpong_s": "s one way, [bytes]",
    "contended_update_s": "CPU s per push/pull, all ranks together, with P ranks sharing the cores, [P][n_w]",
    "read_s_per_byte": "r_d: s/byte read + parsed by one rank, [reader][format]",
    "select_s_per_point": "s per point of the file, [reader]", "bytes_per_point": "bytes/point, [format]",
    "memory_s_per_byte": "r_m: s/byte (copy)", "caches": "bytes",
    "step_spread": "one step's CPU time over the least, quantiles p -> ratio, [hidden][batch] (asgd.sim)",
    "step_cpu_s": "least CPU s per training step (the thread's clock), [hidden][batch] (asgd.sim)",
    "sleep_overhead_s": "s time.sleep(10 us) overshoots, median (the Waiter's backoff; asgd.sim)",
    "optimizer_s": "s per server-side optimizer update of n values, [optimizer][n]",
    "mp_step_s": "s per step of a model-parallel member (logits' sum excluded), [K][hidden][batch]",
    "exchange_s": "s per synchronous round with no compute, [ps|p2p|ring|mpi][ranks][n_w]; "
                  "[replica][K][batch]; [KIND+step][ranks][n_w or batch]: the round after a training "
                  "step (async+step: s per update of one worker; replica+step: s per member step of "
                  "model partitioning, the logit sum inside it, with a server on an odd rank 0), ranks > cores "
                  "only (asgd.perf.exchanges)",
}


EXCHANGE_KINDS = ("ps", "p2p", "ring", "mpi")


def measure_exchanges(launcher: str | None, C: int, nws: list[int], quick: bool, say=print, run=None,
                      stepped_only: bool = False) -> dict:
    """exchange_s: each architecture's synchronous round with no compute (asgd.perf.exchanges),
    at P = 2, C + 1, 2C + 1, 4C + 1 ranks (quick: 2, 2C + 1) and every calibrated n_w, and a
    replica's logit sum (K = P) at a few batch sizes: one job per rank count. `run(n, args,
    timeout)` starts a probe (default: under `launcher` on this machine). stepped_only: the
    KIND+step rounds alone (calibrate's second window of them)."""
    run = run or (lambda n, args, timeout: _launch(launcher, n, args, timeout))
    counts = sorted({2, 2 * C + 1} if quick else {2, C + 1, 2 * C + 1, 4 * C + 1})
    kinds = (*EXCHANGE_KINDS, "replica")
    out: dict = {}
    for P in [P for P in counts if P > C] if stepped_only else counts:
        # with more ranks than cores, each round once more after a training step (KIND+step)
        stepped = tuple(k + _exchanges().STEP for k in (*kinds, "async")) if P > C else ()
        got = run(P, ["exchange", "--kinds", ",".join((() if stepped_only else kinds) + stepped),
                      "--nw", ",".join(map(str, nws)),
                      "--batches", "16,256,1024", "--rounds", "8" if quick else "20"], 900)
        for kind, t in got["seconds"].items():
            out.setdefault(kind, {})[P] = {int(k): v for k, v in t.items()}
    H, B = _exchanges().STEP_PROBE
    for kind, by_p in out.items():
        unit, scale = ("us", 1e6) if kind == "replica" else ("ms", 1e3)
        say(f"  {kind}: " + "; ".join(f"P={P} " + ", ".join(f"{scale * v:.2f} {unit}" for v in t.values())
                                     for P, t in by_p.items())
            + ((f" (half a 2-{H}-2 step at batch {B} each, the sum inside it)" if kind.startswith("replica")
                else f" (a 2-{H}-2 step at batch {B} before each)")
               if kind.endswith(_exchanges().STEP)
               else " (batch 16, 256, 1024)" if kind == "replica" else f" (n_w {nws})"))
    return out


def describe(launcher: str | None = None) -> dict:
    """The machine, and the MPI the costs were measured with (its launcher's word)."""
    import numba
    import numpy as np
    words = (launcher or launch.find() or "").split()
    cpu = "unknown"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"host": platform.node(), "cpu": cpu, "python": platform.python_version(), "numpy": np.__version__,
            "numba": numba.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "launcher": " ".join(words), "mpi": launch.flavour(words[0]) if words else None}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


# probe name -> its function of the options (--name value pairs) and positional arguments
PROBES = {
    "startup": lambda o, rest: probe_startup(),
    "job-startup": lambda o, rest: probe_job_startup(),
    "messaging": lambda o, rest: probe_messaging(_ints(o["--nw"]), int(o["--updates"])),
    "cores": lambda o, rest: probe_cores(int(o["--hidden"]), int(o["--batch"]), float(o["--seconds"])),
    "contention": lambda o, rest: probe_contention(_ints(o["--nw"]), int(o["--updates"])),
    "readers": lambda o, rest: probe_readers(rest),
    "exchange": lambda o, rest: _exchanges().probe_exchange(o["--kinds"].split(","), _ints(o.get("--nw", "")),
                                                           int(o["--rounds"]), _ints(o.get("--batches", "")),
                                                           int(o.get("--servers", "1"))),
}


def _exchanges():
    from . import exchanges
    return exchanges


def _probe_main(argv: list[str]) -> int:
    """mpiexec -n N python -m asgd.perf.calibrate PROBE [--option value ...] [FILE ...]: one JSON
    line from rank 0 (internal: `python -m asgd.perf calibrate` runs these)."""
    if not argv or argv[0] not in PROBES:
        print(f"usage: mpiexec -n N python -m asgd.perf.calibrate {{{','.join(PROBES)}}} ...  (internal: "
              "use python -m asgd.perf calibrate)", file=sys.stderr)
        return 2
    args = argv[1:]
    options = dict(zip(args[0::2], args[1::2])) if args and args[0].startswith("--") else {}
    got = PROBES[argv[0]](options, args)
    if got:  # MPI probes answer on rank 0 only
        print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
