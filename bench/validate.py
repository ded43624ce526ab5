"""The validation harness: a grid of configurations -> measured (mpiexec here, or the emulated
cluster) -> predicted (asgd.perf's analytical model) -> simulated (asgd.sim) -> scored (the
absolute percentage error, medians per group) -> reported. bench_sim validate, bench_model,
bench_arch, bench_testbed and bench_tta are each a grid and its targets on top of it. bench/'s
doors into asgd's model, simulator and testbed are all here: when those modules move, this
file follows them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import common
from common import JobFailed

from asgd import testbed as _testbed
from asgd.perf import analytic
from asgd.perf import cli as perf
from asgd.perf.architectures import predict as model_predict   # one run of any architecture
from asgd.sim import cli as sim_cli, costs as sim_costs, machines as sim_machines
from asgd.sim.probes import corrections
from asgd.sim.run import simulate_isolated
from asgd.testbed import model as _testbed_model
from asgd.testbed.spec import format_rate   # noqa: F401 (bench_overlap, bench_testbed)

Run, Params = analytic.Run, analytic.Params   # a configuration the model predicts; its parameters
optimize, data_of, PerfError = perf.optimize, perf.data_of, perf.PerfError
ape = perf.ape   # absolute percentage error, % of the measured value: asgd.perf's definition
parse_rate, testbed_missing = _testbed.parse_rate, _testbed.missing_requirements
open_testbed = _testbed.Testbed.open   # a running testbed's handle (its spec: hosts, veths)
launcher = common.mpiexec_path
sim_params = sim_costs.load_params     # a params.json as the simulator reads it: (Params, the raw file)
OPTIMIZER_LIMIT = 1.10   # the optimizer's pick, measured, against the best measured


def _stem() -> str:
    return Path(sys.argv[0]).stem


# -- scoring: one error, its medians ------------------------------------------------------

def quantile(xs: list[float], q: float) -> float:
    """The q-quantile by nearest rank (as asgd.perf compare reports it)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]


def errors(xs) -> dict | None:
    """Median, 90th percentile and max of some APEs, and how many (None: none)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "p90": quantile(xs, 0.9), "max": max(xs), "runs": len(xs)}


def score(rows: list[dict], key: str, by: str | None = None) -> dict | None:
    """errors() of every row's `key`, or per value of `by` ({value: errors})."""
    if by is None:
        return errors(r.get(key) for r in rows)
    groups = {}
    for v in sorted({r[by] for r in rows}, key=str):
        got = errors(r.get(key) for r in rows if r[by] == v)
        if got:
            groups[str(v)] = got
    return groups


def scores(rows: list[dict], whos, keys, column: str = "{who}_ape_{k}", name: str = "{who}_{k}") -> dict:
    """{name: score(rows, column)} for every predictor `who` and metric `k` (the templates' fields)."""
    return {name.format(who=who, k=k): score(rows, column.format(who=who, k=k)) for who in whos for k in keys}


def judged(meas: dict, **predicted: dict) -> dict:
    """A row's columns for every metric k of `meas`: meas_k, then per predictor who: who_k
    and who_ape_k (its APE against meas_k)."""
    row = {}
    for k, m in meas.items():
        row[f"meas_{k}"] = m
        for who, values in predicted.items():
            row[f"{who}_{k}"] = values[k]
            row[f"{who}_ape_{k}"] = ape(values[k], m)
    return row


def print_scores(scores: dict, first: str, title: str, stats=("median", "p90"), extra=()) -> None:
    """A table of scores: a row per key of `scores` ({group: errors() or None}), each group's
    `stats` side by side, then `extra` columns ((header, key, format)) read from the group
    "extra" ({key: value}) of that row."""
    groups = [g for g in dict.fromkeys(g for row in scores.values() for g in row) if g != "extra"]
    rows = [{first: name, **row.get("extra", {}), **{f"{g} {q}": (row.get(g) or {}).get(q) for g in groups
                                                     for q in stats}} for name, row in scores.items()]
    cols = [(first, first, "")] + [(f"{g} {q}" + (" APE%" if q == "median" else ""), f"{g} {q}",
                                    "d" if q == "runs" else ".1f") for g in groups for q in stats]
    common.print_table(rows, cols + list(extra), title=title)


def verdict(ok) -> str:
    return "PASS" if ok else "FAIL"


def series(rows: list[dict], by: str, **match) -> list[dict]:
    """The rows whose fields equal `match`, sorted by field `by`: one curve of a figure."""
    return sorted((r for r in rows if all(r[k] == v for k, v in match.items())), key=lambda r: r[by])


def pred_vs_meas(ax, series: list[tuple], band: float, margin: float, xlabel: str, ylabel: str, title: str) -> None:
    """The validation figure: predicted against measured on log axes, the diagonal and a
    +-band share around it; series: (measured, predicted, scatter's keywords)."""
    vals = [v for xs, ys, _ in series for v in (*xs, *ys) if v]
    lo, hi = min(vals) / margin, max(vals) * margin
    ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)], color="0.87",
                    label=f"±{100 * band:.0f}%")
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    for xs, ys, kw in series:
        ax.scatter(xs, ys, **kw)
    common.decorate(ax, title, 10, grid=dict(which="both"), xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
                    xlabel=xlabel, ylabel=ylabel)


# -- measuring ---------------------------------------------------------------------------------

def _procs() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, CPU ticks used so far: utime + stime) of every process, from /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rindex(")") + 2:].split()   # fields from the 3rd: state, ppid, ...
            out[int(d)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
    return out


class OthersCPU:
    """Cores' worth of CPU that processes other than this one and its descendants (our job)
    used while it was entered, from their CPU counters sampled every `every_s` (counting
    runnable processes would overstate it: on a crowded machine a task waits long in the run queue)."""

    def __init__(self, every_s: float = 0.2):
        self.every_s, self.me = every_s, os.getpid()
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}

    def __enter__(self):
        self.t0, self._stop = time.perf_counter(), threading.Event()
        self.sample(initial=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
        ticks = sum(self.last[p] - self.first[p] for p in self.last)
        self.cores = ticks / os.sysconf("SC_CLK_TCK") / max(time.perf_counter() - self.t0, 1e-9)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self, initial: bool = False) -> None:
        procs = _procs()
        for pid, (_, ticks) in procs.items():
            if not self._ours(pid, procs):
                self.first.setdefault(pid, ticks if initial else 0)   # one born meanwhile counts from 0
                self.last[pid] = ticks

    def _ours(self, pid: int, procs) -> bool:
        for _ in range(64):
            if pid == self.me:
                return True
            if pid not in procs or pid <= 1:
                return False
            pid = procs[pid][0]
        return False


def train_here(ranks: int, opts: list[str], run_dir: Path, timeout: float) -> dict:
    """`asgd.train OPTS` on `ranks` ranks here into run_dir made fresh, bounded by asgd.train's
    own --timeout first; {wall_s: the launcher's, others_cores: the other users' CPU meanwhile}."""
    d = common.fresh_dir(Path(run_dir).resolve())
    with OthersCPU() as others:
        job = common.mpiexec(ranks, ["-m", "asgd.train", *opts, "--quiet", "--out", str(d), "--timeout", str(timeout)],
                             timeout + 30)
    return {"wall_s": job["wall_s"], "others_cores": others.cores}


def python(argv: list[str], timeout: float, what: str) -> float:
    """`python argv` from the repository root, its output to ours, its process group killed
    after `timeout` s (calibrate starts mpiexec jobs of its own); its wall. Exits on failure."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, *argv], cwd=common.ROOT, start_new_session=True)
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        sys.exit(f"{_stem()}: {what} did not finish within {timeout:.0f} s")
    if rc:
        sys.exit(f"{_stem()}: {what} failed (exit {rc}): python {' '.join(argv)}")
    return time.perf_counter() - t0


def calibrate(out: Path, quick: bool, lock: str | None = None) -> tuple[Path, float]:
    """`python -m asgd.perf calibrate` (microbenchmarks only, never a sweep's run) into
    out/params.json, holding the CPU lock; (its path, its wall)."""
    path = (out / "params.json").resolve()
    print(f"calibrating the model's parameters ({'--quick' if quick else 'full'}), before any run ...", flush=True)
    with common.cpu_lock(lock):
        wall = python(["-m", "asgd.perf", "calibrate", "--out", str(path), *(["--quick"] if quick else [])],
                      900 if quick else 3600, "asgd.perf calibrate")
    return path, wall


def params_file(given: Path | None, out: Path, quick: bool, lock: str | None = None) -> tuple[Path, float | None]:
    """--params, or calibrate() now, before any run of the sweep: (its path, calibrate's wall or None)."""
    return (given.resolve(), None) if given else calibrate(out, quick, lock)


def with_costs(raw: dict, hw: Params, path: Path) -> Path:
    """A copy of the params.json `raw` whose costs are hw's (e.g. the testbed's links), written
    to `path` for the simulator, which reads a file."""
    raw = {**raw, "params": {**raw["params"], **json.loads(json.dumps(dataclasses.asdict(hw)))}}
    path.write_text(json.dumps(raw, indent=1))
    return path


def warm_up(out: Path, timeout: float, *opts: str, lock: str | None = None) -> None:
    """One discarded 2-rank `asgd.train OPTS` into out/warmup: numba's caches warm before any timed run."""
    print("warm-up run (numba's caches; discarded) ...", flush=True)
    try:
        with common.cpu_lock(lock):
            common.mpiexec(2, ["-m", "asgd.train", *opts, "--quiet", "--out", str(common.fresh_dir(out / "warmup"))],
                           timeout)
    except JobFailed as e:
        print(f"warm-up failed (going on): {str(e)[:200]}")


def generate(path: Path, points: int, test_points: int) -> Path:
    """A file of the rings problem (`python -m asgd.data generate`), written once."""
    path = path.resolve()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ({points:,} + {test_points:,} points) ...", flush=True)
        python(["-m", "asgd.data", "generate", "--points", str(points), "--test-points", str(test_points),
                "--out", str(path)], 600, "asgd.data generate")
    return path


def sweep(configs: list[dict], one, label, say=None, *, seed: int | None = None, lock: str | None = None,
          failed: list | None = None, tag: str = "") -> list[dict]:
    """Measure every configuration with one(c) -> dict (None: skipped), in an order shuffled
    with `seed` (None: as given), each holding the CPU lock (the 1-minute load beside it).
    A run that fails is printed, added to `failed` and left out; say(row): its line."""
    order = list(configs)
    if seed is not None:
        random.Random(seed).shuffle(order)
    rows = []
    for i, c in enumerate(order, 1):
        head = f"{tag}[{i:2d}/{len(order)}] {label(c):30s}"
        try:
            with common.cpu_lock(lock) as load:
                got = one(c)
        except (JobFailed, OSError, ValueError, KeyError) as e:
            print(f"{head} FAILED: {(str(e).strip().splitlines() or [repr(e)])[0]}", flush=True)
            if failed is not None:
                failed.append({**c, "error": str(e)[-2000:]})
            continue
        if got is None:
            continue
        rows.append({**c, "order": i, "load_1min": round(load, 2), **got})
        print(f"{head} {say(rows[-1]) if say else ''}", flush=True)
    return rows


# -- the model and the simulator -----------------------------------------------------------------

def load_params(path) -> Params:
    try:
        return perf.load_params(str(path))
    except PerfError as e:
        sys.exit(f"{_stem()}: {e}")


def results(run_dir) -> dict:
    return json.loads((Path(run_dir) / "results.json").read_text())


def predict(params: Params, res: dict):
    """The analytical model's prediction of a run, from its results.json's configuration."""
    return model_predict(params, perf.run_of(res, params))


def compare(run_dirs: list[str], params: Params) -> list[dict]:
    """asgd.perf compare's rows ({phase}_pred_s, _meas_s, _ape, and paper_total_*)."""
    rows, skipped = perf.compare(run_dirs, params)
    for s in skipped:
        print(f"compare skipped {s}", flush=True)
    return rows


def calibrated_ranks(params: Params) -> set[int]:
    """The rank counts calibrate measured a job at (start-up, cores' worth, no-compute rounds):
    a run at any other count is out of sample in the strict sense."""
    keys = set(params.startup_by_ranks) | set(params.contended_update_s)
    for table in params.exchange_s.values():
        keys |= set(table)
    worth = params.effective_cores
    for table in (worth.values() if worth and isinstance(next(iter(worth.values())), dict) else [worth]):
        keys |= set(table)
    return {int(k) for k in keys}


def without_crowding(params: Params) -> Params:
    """The same calibration without its KIND+step probes (in every precision): the model
    without its crowding term."""
    return params.each_precision(lambda p: dataclasses.replace(
        p, exchange_s={k: t for k, t in p.exchange_s.items() if not k.endswith("+step")}))


def need_simulator() -> None:
    from asgd.sim import INSTALL_HINT, available
    if not available():
        sys.exit(f"{_stem()}: {INSTALL_HINT}")


def sim_spec():
    """asgd.sim's Spec (a simulated run on a machine) and its machines module."""
    return sim_costs.Spec, sim_machines


def simulate(params_path, run_dir=None, spec=None, *, params: tuple | None = None, out=None, machine=None,
             background: float = 0.0, data_name: str | None = None) -> dict:
    """asgd.sim in a forked child: a run like `run_dir` (python -m asgd.sim --like RUN_DIR
    [--machine M] [--background CORES]) or `spec`, with params_path's costs or `params`
    ((Params, raw): inferred ones); its results."""
    p, raw = params or sim_params(params_path)
    data_path = data_name
    if spec is None:
        argv = ["--like", str(run_dir), "--params", str(params_path), "--background", f"{background:.3f}"]
        argv += ["--machine", machine] if machine else []
        spec, data_path = sim_cli.spec_from_args(sim_cli.parse_args(argv + (["--out", str(out)] if out else [])), p)
    return simulate_isolated(spec, sim_costs.Costs(p, spec, raw, corrections=corrections), str(out) if out else None,
                             False, (0, 200), raw.get("sleep_overhead_s"), data_path, str(params_path))


def optimizer_check(ranked: list[dict], measured: list[dict], key, cost, limit: float = OPTIMIZER_LIMIT) -> dict:
    """Yan et al.'s optimizer against the measurements: the first of its ranked configurations
    that was measured (key(row) names a configuration in both lists), its measured cost
    against the best measured; pass if the ratio <= limit."""
    by = {key(r): r for r in measured}
    first = next((r for r in ranked if key(r) in by), None)
    best = min(measured, key=cost)
    got = by[key(first)] if first else None
    ratio = cost(got) / cost(best) if got else None
    keys = [key(r) for r in ranked]
    return {"configurations": len(ranked), "first": first, "measured": got, "best": best, "ratio": ratio,
            "pass": ratio is not None and ratio <= limit,
            "best_predicted_rank": keys.index(key(best)) + 1 if key(best) in keys else None, "top5": ranked[:5]}


# -- the emulated cluster ------------------------------------------------------------------------

def testbed_model():
    """asgd.testbed.model: the links' ceilings, wire bytes, testbed_params, the probes."""
    return _testbed_model


@contextlib.contextmanager
def testbed(name: str, hosts: int, rate: str, latency_us: float = 0.0):
    """An emulated cluster of `hosts` hosts, links shaped to `rate` each way (one left over by
    a killed run is taken down first); taken down on the way out. Exits without root."""
    from asgd.testbed import TestbedError, lifecycle
    reason = testbed_missing()
    if reason:
        raise SystemExit(f"{_stem()}: no testbed here: {reason}")
    try:
        if lifecycle.exists(name):
            lifecycle.down(name, say=lambda *a, **k: None)
        tb = lifecycle.up(name, hosts, parse_rate(rate), latency_us, say=lambda *a, **k: None)
    except TestbedError as e:
        raise SystemExit(f"{_stem()}: {e}") from None
    try:
        yield tb
    except TestbedError as e:
        raise SystemExit(f"{_stem()}: {e}") from None
    finally:
        tb.down()


def testbed_job(tb, ranks: int, argv: list[str], timeout: float, check_bytes: bool):
    """`mpiexec -n ranks python argv` on the testbed `tb`, its output captured; (its result,
    the 1-minute load averaged over its start and end). A run that fails raises JobFailed."""
    load0 = os.getloadavg()[0]
    try:
        res = tb.run([launcher(), "-n", str(ranks), sys.executable, *argv], check_bytes=check_bytes,
                     timeout=timeout, capture=True, say=lambda *a, **k: None)
    except Exception as e:   # any failure of the run: reported, and the sweep goes on
        raise JobFailed(f"failed: {str(e)[-400:]}") from None
    if res.rc or res.results is None:
        raise JobFailed(f"exit {res.rc}: {(res.stderr or '')[-400:]}")
    return res, round((load0 + os.getloadavg()[0]) / 2, 2)
