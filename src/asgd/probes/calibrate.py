"""Measure the performance model's machine-dependent parameters, as the paper did with
STREAM, iperf and single-node runs: microbenchmarks of asgd's own parts, never runs of
the configurations to be predicted.

  startup      one rank of asgd.train up to its first data: imports, MPI_Init, numba
               cache loads (wall and CPU seconds)                       mpiexec -n 1
  step         the numba training step with its batch gather, per hidden and batch size
               (c_p, c_b; the batch sizes span the caches: Figure 4), the least of
               two windows, at the start and at the end                  in process
  evaluate     held-out evaluation per point, per hidden size            in process
  shapes       the step of D-H-C MLPs beside 2-H-2's, D + C from 5 to 794: a data
               file's features and classes (the kernels' generic path) scale the
               2-H-2 tables (Params.shaped)                              in process
  job startup  P ranks starting at once, with asgd.train's staged cache loads, no data:
               the start of each cores job                               mpiexec -n P
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
               (asgd.probes.exchanges)                                   mpiexec -n P

What a value's precision changes (the steps, their spread, evaluation, memory, the
optimizers, model-parallel steps, messaging, contention and the exchanges) is measured in
float32 and float64 (wire.PRECISIONS; the MPI probes both in one job), params.json's
params["precisions"][precision] (asgd.perf.analytic.PER_PRECISION); the rest once.

The orchestrating process (this module) never initializes MPI; the MPI probes run under
the launcher (`--launcher`, default mpiexec) as `python -m asgd.probes.ranks PROBE ...`,
each printing one JSON line.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from .. import mpienv
from ..data import formats, problem
from ..mpienv import cores_available
from ..net import OPTIMIZERS, mlp
from ..net.optimizers import Optimizer
from ..core.wire import PRECISIONS
from ..perf.analytic import PER_PRECISION, extrapolate_linear
from ..perf.architectures import STEP, STEP_PROBE
from . import CalibrationError

HIDDEN = (256, 1000, 10000, 100000)   # 256: a data file's default (run.config.FILE_HIDDEN)
BATCHES = (1, 4, 16, 64, 256, 1024, 4096)
STEPPED_WINDOWS = 3   # the KIND+step rounds' windows (not --quick), the least of them kept
QUICK_HIDDEN, QUICK_BATCHES = (256, 1000, 10000), (1, 16, 256, 1024)
# (features, classes) of the shape probe: the paper's 2-2 (the kernels' fused path), then
# the generic path from a few inputs to MNIST's 784 pixels and 10 digits
SHAPES = ((2, 2), (3, 2), (16, 4), (64, 10), (784, 10))
QUICK_SHAPES = ((2, 2), (3, 2), (64, 10), (784, 10))
SHAPE_HIDDEN, SHAPE_BATCHES, QUICK_SHAPE_BATCHES = (256, 1000), (16, 64, 256, 1024), (16, 256)


# -- in-process microbenchmarks ------------------------------------------------------------

def gathered_step(step, ds, rng, b: int, w: np.ndarray, dw: np.ndarray):
    """One timed training step as a run takes it: b random points gathered into the batch
    buffers (in ds.X's dtype: the run's precision), then the step on them (lr 1e-9: w
    barely moves between repetitions)."""
    Xb, yb = np.empty((b, ds.X.shape[1]), ds.X.dtype), np.empty(b, np.int64)

    def one():
        idx = rng.integers(0, len(ds.y), b)
        np.take(ds.X, idx, axis=0, out=Xb)
        np.take(ds.y, idx, out=yb)
        step(w, Xb, yb, 1e-9, dw)
    return one


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


def rings(n: int, seed: int, dtype) -> formats.Dataset:
    """The rings problem with its features in `dtype`, as asgd.train casts a run's data."""
    ds = problem.rings(n, seed)
    ds.X = ds.X.astype(dtype)
    return ds


def measure_steps(hidden: tuple, batches: tuple, min_time: float, cpu_out: dict | None = None,
                  dtype=np.float64) -> dict:
    """Seconds per worker step (batch gather + numba step) in `dtype`, as run_worker does
    it; with cpu_out, its least CPU seconds per step too (cpu_out[hidden][batch])."""
    ds = rings(65536, 0, dtype)
    out = {}
    for h in hidden:
        layout = mlp.Layout(2, h, 2)
        w, dw = mlp.init_params(layout, 0, dtype), np.zeros(layout.n_w, dtype)
        out[h] = {}
        rng = np.random.default_rng(0)
        for b in batches:
            step = mlp.make_step(layout, b, dtype)
            one = gathered_step(step, ds, rng, b, w, dw)
            got: dict = {}
            out[h][b] = _best(one, min_time * (1 if b * h < 2e7 else 0.3), 2000, got)
            if cpu_out is not None:
                cpu_out.setdefault(h, {})[b] = got["s"]
    return out


def measure_shapes(shapes: tuple, hidden: tuple, batches: tuple, min_time: float, dtype=np.float64) -> dict:
    """Seconds per step of features-hidden-classes MLPs, [hidden][batch][features +
    classes], as measure_steps times them (random data: a step's time does not depend on
    the values). 2-H-2 (4) is the kernels' fused path, every other shape their generic one."""
    rng = np.random.default_rng(0)
    out = {h: {b: {} for b in batches} for h in hidden}
    for d, c in shapes:
        ds = formats.Dataset(rng.standard_normal((4096, d)).astype(dtype), rng.integers(0, c, 4096), c)
        for h in hidden:
            layout = mlp.Layout(d, h, c)
            w, dw = mlp.init_params(layout, 0, dtype), np.zeros(layout.n_w, dtype)
            for b in batches:
                one = gathered_step(mlp.make_step(layout, b, dtype), ds, rng, b, w, dw)
                out[h][b][d + c] = _best(one, min_time * (1 if b * h * (d + c) < 1e8 else 0.3), 500)
    return out


def _least(a: dict, b: dict) -> dict:
    """[hidden][batch] -> the lesser of a's and b's seconds."""
    return {h: {k: min(a[h][k], b[h][k]) for k in a[h]} for h in a}


SPREAD_P = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def measure_step_spread(hidden: tuple, batches: tuple, best: dict, budget_s: float, dtype=np.float64) -> dict:
    """How single steps spread around the best (step_s is the least time per step over
    repetitions): [hidden][batch] -> {"p": probabilities, "ratio": quantiles of one step's
    time over the least}, from individually timed steps (asgd.sim draws step times from
    it). Each step's CPU time (the thread's clock), not its wall time: the spread of the
    work itself, not of other processes taking the core (a simulator shares the cores
    itself). Only where a step takes under 0.1 s; about budget_s per (hidden, batch)."""
    ds = rings(65536, 0, dtype)
    out = {}
    for h in hidden:
        layout = mlp.Layout(2, h, 2)
        w, dw = mlp.init_params(layout, 0, dtype), np.zeros(layout.n_w, dtype)
        rng = np.random.default_rng(1)
        for b in batches:
            t_best = best[h][b]
            if t_best >= 0.1:
                continue
            step = mlp.make_step(layout, b, dtype)
            Xb, yb = np.empty((b, 2), dtype), np.empty(b, np.int64)
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


def measure_evaluate(hidden: tuple, min_time: float, dtype=np.float64) -> dict:
    test = rings(2048, 1, dtype)
    out = {}
    for h in hidden:
        layout = mlp.Layout(2, h, 2)
        ev = mlp.make_evaluate(layout, mlp.init_params(layout, 0, dtype), test)
        out[h] = _best(ev, min_time, 50) / len(test.y)
    return out


def measure_memory(mib: int = 128, dtype=np.float64) -> float:
    """r_m: seconds per byte moved by a large numpy copy of `dtype` values (read + write counted)."""
    a = np.ones((mib << 20) // np.dtype(dtype).itemsize, dtype)
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


def measure_optimizers(sizes: list[int], best, dtype=np.float64) -> dict:
    """[optimizer][n]: seconds per update of n values of `dtype` (Optimizer.update into
    another buffer, scale 1: a server's update; allreduce's in place costs a little more),
    each the least over repetitions (best: _best(f, min_time))."""
    mlp.compile_kernels(*(f"update:{o}" for o in OPTIMIZERS), dtype=dtype)
    out: dict = {}
    for name in OPTIMIZERS:
        for n in sizes:
            w, d, out_buf = np.zeros(n, dtype), np.full(n, 1e-3, dtype), np.empty(n, dtype)
            opt = Optimizer(name, 1e-3, n, dtype=dtype)
            out.setdefault(name, {})[n] = best(lambda: opt.update(w, d, out_buf))
    return out


def measure_mp_steps(hidden: tuple, batches: tuple, Ks: tuple, best, dtype=np.float64) -> dict:
    """[K][hidden][batch]: seconds per step of member 0 of a replica of K in `dtype` (its
    slice's forward and backward, the batch's gather; the logits' sum left out)."""
    ds = rings(65536, 0, dtype)
    rng = np.random.default_rng(0)
    out: dict = {}
    for K in Ks:
        for h in hidden:
            if h % K:
                continue
            sliced = mlp.Sliced(mlp.Layout(2, h, 2), K)
            w = sliced.from_standard(mlp.init_params(sliced.layout, 0, dtype))
            a, b_ = sliced.bounds[0]
            w0, dw = w[a:b_].copy(), np.zeros(b_ - a, dtype)
            for b in batches:
                step = mlp.make_mp_step(sliced, 0, b, lambda Z: None, dtype)
                one = gathered_step(step, ds, rng, b, w0, dw)
                out.setdefault(K, {}).setdefault(h, {})[b] = best(one)
    return out


# -- the orchestrator ------------------------------------------------------------------------

def _launch(launcher: str | None, n: int, args: list[str], timeout: float) -> dict:
    try:
        cmd = mpienv.command(n, sys.executable, "-m", "asgd.probes.ranks", *args, launcher=launcher)
        p = mpienv.run_bounded(cmd, timeout)
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
    t_all = time.perf_counter()
    hidden, batches = (QUICK_HIDDEN, QUICK_BATCHES) if quick else (HIDDEN, BATCHES)
    # --quick's MPI probes take half their repetitions in each precision: as many as they
    # took in float64 alone, so the quick calibration (the tests') costs about what it did
    min_time = 0.05 if quick else 0.25
    say("calibrate: startup of one rank (imports, MPI_Init, numba cache loads)")
    _launch(launcher, 1, ["startup"], 300)  # fills numba's cache if it is cold
    starts = [_launch(launcher, 1, ["startup"], 300) for _ in range(1 if quick else 5)]
    start = {k: statistics.median(s[k] for s in starts) for k in starts[0]}
    say("  " + ", ".join(f"{k[:-2]} {v:.3f} s" for k, v in start.items()))
    # what calibrate measures per precision (PER_PRECISION): [precision][table]
    by_prec: dict = {prec: {} for prec in PRECISIONS}
    precisions = ["--precisions", ",".join(PRECISIONS)]
    for prec, t in by_prec.items():
        say(f"calibrate: training step in {prec}, hidden {hidden} x batch {batches}")
        t["step_cpu_s"] = {}
        t["step_s"] = measure_steps(hidden, batches, min_time, t["step_cpu_s"], prec)
        say(f"calibrate: the spread of single steps around the best, held-out evaluation ({prec})")
        t["step_spread"] = measure_step_spread(hidden, batches, t["step_s"], 0.1 if quick else 0.4, prec)
        t["eval_s_per_point"] = measure_evaluate(hidden, min_time, prec)
        say(f"calibrate: steps of other shapes than 2-H-2 (a data file's features and classes, {prec})")
        t["shape_s"] = measure_shapes(QUICK_SHAPES if quick else SHAPES, SHAPE_HIDDEN,
                                      QUICK_SHAPE_BATCHES if quick else SHAPE_BATCHES, min_time, prec)
    nws = sorted({h * 3 + 2 * (h + 1) for h in hidden})  # Delta-w of each calibrated hidden size
    say(f"calibrate: messaging, ping-pong and push/pull at n_w {nws}")
    msg = _launch(launcher, 2, ["messaging", "--nw", ",".join(map(str, nws)),
                                "--updates", "100" if quick else "1000", *precisions], 600)
    for prec, t in by_prec.items():
        t.update(msg["precisions"][prec])
    C = cores_available()
    counts = sorted({1, C, 2 * C + 1} if quick else {1, C, C + 1, 2 * C + 1, 4 * C + 1, 8 * C + 1})
    say(f"calibrate: a job's start-up (no data), then cores' worth of training steps done by {counts} "
        "ranks at once, batch 256")
    worth = {}  # [hidden][ranks]: cores' worth of steps, against one rank's
    job_start = {n: [] for n in counts}   # every cores job's start-up, its ranks' count's samples
    for h in [x for x in hidden if x >= 10000]:
        rates = {n: [] for n in counts}
        for _ in range(1 if quick else 2):  # interleaved repetitions, medians: the machine drifts
            for n in counts:
                got = _launch(launcher, n, ["cores", "--hidden", str(h), "--batch", "256",
                                            "--seconds", "0.5" if quick else "1.0"], 300)
                rates[n].append(got["steps_per_s"])
                job_start[n].append(got["startup_s"])
        worth[h] = {n: statistics.median(r) / statistics.median(rates[1]) for n, r in rates.items()}
        say(f"  hidden {h}: " + ", ".join(f"{n}: {v:.2f}" for n, v in worth[h].items()))
    job_start = {n: statistics.median(v) for n, v in job_start.items()}
    say("  start-up: " + ", ".join(f"{n}: {v:.2f} s" for n, v in job_start.items()))
    crowd = sorted({2 * C + 1} if quick else {C + 1, 2 * C + 1, 4 * C + 1})
    say(f"calibrate: push/pull CPU per update with {crowd} ranks sharing the cores (no-compute workers)")
    for n in crowd:
        got = _launch(launcher, n, ["contention", "--nw", ",".join(map(str, nws)),
                                    "--updates", str(max(50, (200 if quick else 2000) // (n - 1))), *precisions],
                      600)
        c_eff = extrapolate_linear(worth[min(worth)], n)  # cores' worth the n ranks get
        for prec, t in by_prec.items():
            t.setdefault("contended_update_s", {})[n] = {
                int(k): c_eff / v for k, v in got["precisions"][prec]["updates_per_s"].items()}
    sizes = sorted({n // d for n in nws for d in (1, 4)})  # whole Delta-w and a quarter shard
    for prec, t in by_prec.items():
        say(f"calibrate: the server-side optimizers' updates, and model-parallel members' steps ({prec})")
        t["optimizer_s"] = measure_optimizers(sizes, lambda f: _best(f, min_time / 4, 2000), prec)
        t["mp_step_s"] = measure_mp_steps(hidden, batches, (2, 4), lambda f: _best(f, min_time / 2, 2000), prec)
        say("  " + ", ".join(f"{o} {1e6 * v[max(v)]:.0f} us" for o, v in t["optimizer_s"].items())
            + f" at n={max(sizes):,}")
    for prec, t in measure_exchanges(launcher, C, nws, quick, say).items():
        by_prec[prec]["exchange_s"] = t
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
    for prec, t in by_prec.items():
        say(f"calibrate: the training step again in {prec} (the least of the two windows)")
        again_cpu: dict = {}
        again = measure_steps(hidden, batches, min_time, again_cpu, prec)
        drift = statistics.median(t["step_s"][h][b] / again[h][b] for h in hidden for b in batches)
        say(f"  the first window's steps took {drift:.2f}x the second's (median)")
        t["step_s"] = _least(t["step_s"], again)
        t["step_cpu_s"] = _least(t["step_cpu_s"], again_cpu)
    if not quick:
        crowded_again(by_prec, launcher, C, nws, say)
    say("calibrate: memory bandwidth, caches")
    for prec, t in by_prec.items():
        t["memory_s_per_byte"] = measure_memory(32 if quick else 128, prec)
    assert all(set(t) == set(PER_PRECISION) for t in by_prec.values())
    params = {
        "cores": C, "effective_cores": worth,
        "startup": {k: v for k, v in start.items() if k != "embedded_s"}, "embedded_s": start["embedded_s"],
        "startup_by_ranks": job_start, "pingpong_s": msg["pingpong_s"],
        "read_s_per_byte": rd["read_s_per_byte"], "select_s_per_point": rd["select_s_per_point"],
        "bytes_per_point": rd["bytes_per_point"], "caches": caches(),
        "sleep_overhead_s": measure_sleep_overhead(), "precisions": by_prec,
    }
    return {"schema": 2, "params": params, "units": UNITS, "machine": describe(launcher),
            "quick": quick, "seconds": round(time.perf_counter() - t_all, 1)}


UNITS = {
    "cores": "cores this process may run on",
    "effective_cores": "cores' worth of training steps done by P ranks at once, [hidden][P]",
    "startup": "s (wall) and CPU s of one rank's imports, parser and kernel cache loads",
    "embedded_s": "s per rank to generate the embedded problem",
    "startup_by_ranks": "s, a job's start-up with P ranks and no data (slowest rank), [P]",
    "step_s": "s per training step (the least of two windows), [hidden][batch]",
    "eval_s_per_point": "s per held-out point, [hidden]",
    "shape_s": "s per training step of a D-H-C MLP, [hidden][batch][D + C] (4: 2-H-2)",
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
                  f"only, the least of {STEPPED_WINDOWS} windows (asgd.probes.exchanges)",
    "precisions": "[float32|float64]: the tables measured in that precision of w's values, the batches' and "
                  "the messages' (" + ", ".join(PER_PRECISION) + "), as their own units say",
}


EXCHANGE_KINDS = ("ps", "p2p", "ring", "mpi")


def measure_exchanges(launcher: str | None, C: int, nws: list[int], quick: bool, say=print, run=None,
                      stepped_only: bool = False) -> dict:
    """[precision] exchange_s: each architecture's synchronous round with no compute
    (asgd.probes.exchanges), at P = 2, C + 1, 2C + 1, 4C + 1 ranks (quick: 2, 2C + 1) and
    every calibrated n_w, and a replica's logit sum (K = P) at a few batch sizes, in every
    precision: one job per rank count. `run(n, args, timeout)` starts a probe (default:
    under `launcher` on this machine). stepped_only: the KIND+step rounds alone
    (calibrate's later windows of them)."""
    run = run or (lambda n, args, timeout: _launch(launcher, n, args, timeout))
    counts = sorted({2, 2 * C + 1} if quick else {2, C + 1, 2 * C + 1, 4 * C + 1})
    kinds = (*EXCHANGE_KINDS, "replica")
    out: dict = {}
    for P in [P for P in counts if P > C] if stepped_only else counts:
        # with more ranks than cores, each round once more after a training step (KIND+step)
        stepped = tuple(k + STEP for k in (*kinds, "async")) if P > C else ()
        got = run(P, ["exchange", "--kinds", ",".join((() if stepped_only else kinds) + stepped),
                      "--nw", ",".join(map(str, nws)),
                      "--batches", "16,256,1024", "--rounds", "4" if quick else "20",
                      "--precisions", ",".join(PRECISIONS)], 900)
        for prec, answer in got["precisions"].items():
            for kind, t in answer["seconds"].items():
                out.setdefault(prec, {}).setdefault(kind, {})[P] = {int(k): v for k, v in t.items()}
    H, B = STEP_PROBE
    for kind, by_p in out[PRECISIONS[0]].items():   # float32's (asgd.train's default), as an example
        unit, scale = ("us", 1e6) if kind == "replica" else ("ms", 1e3)
        say(f"  {kind}: " + "; ".join(f"P={P} " + ", ".join(f"{scale * v:.2f} {unit}" for v in t.values())
                                     for P, t in by_p.items())
            + ((f" (half a 2-{H}-2 step at batch {B} each, the sum inside it)" if kind.startswith("replica")
                else f" (a 2-{H}-2 step at batch {B} before each)")
               if kind.endswith(STEP)
               else " (batch 16, 256, 1024)" if kind == "replica" else f" (n_w {nws})") + f" in {PRECISIONS[0]}")
    return out


def crowded_again(by_prec: dict, launcher: str | None, C: int, nws: list[int], say=print, run=None) -> None:
    """The crowded rounds (KIND+step) in windows 2..STEPPED_WINDOWS, minutes after the
    first, each table's least kept in by_prec[precision]["exchange_s"]. They hold a step
    each and swing more than it: two windows differed by up to 22 % (ps+step at 3 ranks,
    3.61 and 4.41 ms), and the least of two moved 10-20 % between calibrations, which alone
    took the model's median error on the same 61 runs from 10.0 % to 14.3 %."""
    for window in range(2, STEPPED_WINDOWS + 1):
        say(f"calibrate: the rounds after a training step again, window {window} of {STEPPED_WINDOWS} "
            "(the least kept)")
        for prec, tables in measure_exchanges(launcher, C, nws, False, say, run, stepped_only=True).items():
            for kind, by_p in tables.items():
                by_prec[prec]["exchange_s"][kind] = _least(by_prec[prec]["exchange_s"][kind], by_p)


def describe(launcher: str | None = None) -> dict:
    """The machine, and the MPI the costs were measured with (its launcher's word)."""
    words = (launcher or mpienv.find() or "").split()
    cpu = "unknown"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"host": platform.node(), "cpu": cpu, "python": platform.python_version(), "numpy": np.__version__,
            "numba": version("numba"), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "launcher": " ".join(words), "mpi": mpienv.flavour(words[0]) if words else None}
