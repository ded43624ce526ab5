"""Helpers every benchmark shares: one core per process (import it before numpy), the
machine's description, the CPU lock (ASGD_CPU_LOCK; none: no lock), the micro-benchmarks'
shape (micro), MPI jobs with a time limit, the command line and the CSV/JSON/PNG/table
outputs (Run). ASGD_BENCH_STREAM_MIB (default 128) sizes the memory-bandwidth arrays."""

from __future__ import annotations

import os

for _v in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")   # one core per process, like one MPI rank; must precede numpy

import argparse
import contextlib
import csv
import fcntl
import functools
import itertools
import json
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PEERS = BENCH / "peers"   # the references run beside asgd: PyTorch DDP and RPC, the per-rank CPU probe
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))   # run from a checkout without installing
RESULTS = BENCH / "results"

from asgd import mpienv as launch

mpiexec_path = launch.find          # the mpiexec beside this Python (None: none)
mpiexec_command = launch.command    # [mpiexec, -n, n, <the flags its MPI needs>, *program]
rank_pids = launch.rank_pids        # a running job's rank -> pid, from its run folder


def int_list(s: str) -> list[int]:
    return [int(v) for v in str(s).split(",") if v]


def word_list(s: str) -> list[str]:
    """A comma list of names ("iris, rings" -> ["iris", "rings"])."""
    return [w.strip() for w in str(s).split(",") if w.strip()]


def choice_list(choices):
    """An argparse type: a non-empty comma list of `choices` (else argparse's usage error)."""
    def parse(s: str) -> list[str]:
        got = word_list(s)
        if not got or set(got) - set(choices):
            raise argparse.ArgumentTypeError(f"a comma list of {', '.join(choices)}; got {s!r}")
        return got
    return parse


# -- the end of a bench's run; asgd's protocol in a bench's own 2-rank MPI job (bench_messaging, bench_overlap) --

def report(run, rows: list[dict], meta: dict, draw, table: list[dict], cols: list, lines=(), title: str | None = None,
           data: tuple | None = None) -> None:
    """The end of a bench's run: <name>.csv/.json, the figure (draw(*data, path), data
    default (rows,); draw None: none), the machine, the table, its closing lines, the files
    written."""
    run.write(rows, meta)
    if draw:
        run.plot(draw, *(data or (rows,)))
    run.print_machine()
    print_table(table, cols, title)
    for line in lines:
        print(line)
    run.wrote()


def two_ranks(what: str, timeout: float):
    """Inside a bench's own MPI job of 2 ranks (rank 0 serves, rank 1 works): (comm, its
    Waiter, whether the ranks outnumber the cores)."""
    from mpi4py import MPI
    from asgd.mpiutil import Waiter, oversubscribed
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit(f"{what} runs on exactly 2 ranks")
    crowded = oversubscribed(comm)
    return comm, Waiter(crowded, time.monotonic() + timeout, f"rank {comm.rank}"), crowded


def exchange(comm, waiter, clock, w, X, y, step, batch: int, lr: float, optimizer=None):
    """One run of asgd's real protocol on those 2 ranks: rank 0 serves w (async; optimizer:
    the server's, default sgd) and returns its stats; rank 1 trains one epoch of X, y in
    batches with step(w, X, y, lr, dw, progress) and returns None."""
    from asgd.core.policy import Async
    from asgd.core.schedule import Schedule
    from asgd.core.wire import shard_bounds
    from asgd.protocol.context import Endpoint
    from asgd.protocol.messages import DenseLink
    from asgd.protocol.server import Server
    from asgd.protocol.worker import PushPull, run_worker
    end = Endpoint(comm, waiter, clock)
    if comm.rank == 0:
        return Server(end, w, 1, optimizer).serve(Async())
    shards = shard_bounds(w.size, 1)
    run_worker(PushPull(end, shards, DenseLink(shards, w)), X, y, step,
               Schedule(batch=batch, epochs=1, seed=(0, 0), lr=lr, adaptive=False))
    return None


# -- the machine -----------------------------------------------------------------------

def _mpi_library() -> dict:
    """MPI library and version as mpi4py sees them, without initializing MPI."""
    try:
        import mpi4py
        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = False
        from mpi4py import MPI
        return {"mpi_library": " ".join(MPI.Get_library_version().split()),
                "mpi_version": "%d.%d" % MPI.Get_version(), "mpi4py": mpi4py.__version__,
                "mpiexec": mpiexec_path()}
    except Exception as e:   # a description, never a failure
        return {"mpi_library": f"unavailable ({e})"}


def _lscpu() -> dict:
    """lscpu's description of the CPU (sockets, cores, threads, clock, NUMA); {} without lscpu."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    keep = ("Architecture", "Model name", "Socket(s)", "Core(s) per socket", "Thread(s) per core", "CPU max MHz",
            "NUMA node(s)", "Hypervisor vendor", "Virtualization type")
    pairs = (line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs if k.strip() in keep}


def _version(pkg: str) -> str | None:
    """The installed version of `pkg` (None: not installed)."""
    from asgd.doctor.parts import distribution_version
    return distribution_version(pkg) or None


STREAM_BYTES = {"copy": 16, "add": 24, "triad": 40}   # per element: reads + writes, no write-allocate


def stream_kernels(n: int, sets: int = 1) -> dict:
    """numpy's STREAM-like kernels on arrays of n doubles, each call on the next of `sets`
    triples (a, b, c): copy b=a, add c=a+b, triad a=b+s*c as numpy's two passes."""
    triples = itertools.cycle([[np.full(n, v) for v in (1.0, 2.0, 0.5)] for _ in range(sets)])

    def copy():
        a, b, _ = next(triples)
        np.copyto(b, a)

    def add():
        a, b, c = next(triples)
        np.add(a, b, out=c)

    def triad():
        a, b, c = next(triples)
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)
    return {"copy": copy, "add": add, "triad": triad}


STREAM_MIB = int(os.environ.get("ASGD_BENCH_STREAM_MIB", "128"))


@functools.lru_cache(maxsize=None)
def memory_bandwidth() -> dict:
    """STREAM-like bandwidth on ASGD_BENCH_STREAM_MIB arrays, GB/s counting the bytes each
    kernel moves (best of 5, interleaved), measured once per process."""
    n = STREAM_MIB << 17
    got = interleaved(stream_kernels(n), 5, min_time=0, warmup=0)
    return {**{k: round(STREAM_BYTES[k] * n / t["min_s"] / 1e9, 2) for k, t in got.items()},
            "array_mib": STREAM_MIB, "tool": "numpy, 1 thread, best of 5"}


def machine(bandwidth: bool = True) -> dict:
    """What the numbers were measured on: CPU, cores, caches, memory (and its bandwidth on
    ASGD_BENCH_STREAM_MIB arrays), MPI library, package versions, load average."""
    from asgd.doctor.install import cpu_model, meminfo
    from asgd.probes.calibrate import caches
    try:
        import llvmlite.binding as llvm
        llvm_cpu = llvm.get_host_cpu_name()
    except Exception:   # llvmlite absent or unable to name this CPU: the description goes without it
        llvm_cpu = None
    mem = meminfo("MemTotal")
    m = {"cpu": cpu_model(),
         "llvm_cpu": llvm_cpu, "cores": os.cpu_count(), "cores_usable": launch.cores_available(),
         "caches": {name: f"{size >> 10}K" for name, size in caches().items()}, "lscpu": _lscpu(),
         "memory_gib": round(mem / 2**30, 1) if mem else None, "host": platform.node(),
         "platform": platform.platform(), "python": platform.python_version(),
         "numpy": np.__version__, **_mpi_library(),
         **{pkg: _version(pkg) for pkg in ("numba", "torch", "matplotlib")},
         "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
         "date": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    if bandwidth:
        m["memory_bandwidth_gbs"] = memory_bandwidth()
    return m


class LoadSampler:
    """The 1-minute load average every `every_s` in a thread, and at the start and end (.summary())."""

    def __init__(self, every_s: float = 2.0):
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(every_s,), daemon=True).start()

    def _run(self, every_s):
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        self._stop.set()
        self.samples.append(os.getloadavg()[0])
        s = self.samples
        return {"loadavg_1min_min": round(min(s), 2), "loadavg_1min_median": round(statistics.median(s), 2),
                "loadavg_1min_max": round(max(s), 2), "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                "cores": os.cpu_count(), "samples": len(s)}


# -- timing ----------------------------------------------------------------------------

def interleaved(fns: dict, repeat: int, min_time: float = 0.05, warmup: int = 1) -> dict:
    """Seconds per call of each callable in `fns`, repetitions interleaved (A B C A B C ...) so a
    change in the load hits all alike, each looped to last about min_time: wall median/min/max,
    and the median of the thread's CPU time (blind to preemption)."""
    loops = {}
    for name, f in fns.items():
        for _ in range(warmup):
            f()
        t0 = time.perf_counter()
        f()
        loops[name] = max(1, int(min_time / max(time.perf_counter() - t0, 1e-9)))
    times = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(repeat):
        for name, f in fns.items():
            n = loops[name]
            c0, t0 = time.thread_time(), time.perf_counter()
            for _ in range(n):
                f()
            t1, c1 = time.perf_counter(), time.thread_time()
            times[name].append((t1 - t0) / n)
            cpu[name].append((c1 - c0) / n)
    return {name: {"median_s": float(np.median(ts)), "min_s": float(np.min(ts)), "max_s": float(np.max(ts)),
                   "cpu_median_s": float(np.median(cpu[name])), "loops": loops[name], "repeat": repeat}
            for name, ts in times.items()}


# -- the machine's CPU lock, and the shape of a micro-benchmark ------------------------------

CPU_LOCK = os.environ.get("ASGD_CPU_LOCK", "/tmp/asgd-cpu.lock")


@contextlib.contextmanager
def cpu_lock(path: str | None = CPU_LOCK):
    """Hold the machine's CPU lock (flock on `path`, as `flock -o /tmp/asgd-cpu.lock CMD`;
    None or "none": no lock) for one timed measurement, never a whole sweep; yields the
    1-minute load average once held. Its descriptor is not inherited by children."""
    if not path or path == "none":
        yield os.getloadavg()[0]
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield os.getloadavg()[0]
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def rel_diff(got, ref) -> float:
    """max |got - ref| / max |ref|: how far a variant's result is from the reference's."""
    got, ref = np.asarray(got, dtype=float), np.asarray(ref, dtype=float)
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-300))


def rotated(names: list, rep: int) -> list:
    """names rotated by rep: no variant always first (or last) in a repetition."""
    k = rep % len(names) if names else 0
    return list(names[k:]) + list(names[:k])


def micro(variants: dict, repeat: int, min_time: float = 0.05, *, checks: dict | None = None, warmup: int = 1,
          lock: str | None = CPU_LOCK) -> dict:
    """Every micro-benchmark's shape: the variants (name -> callable, the reference among
    them), their correctness computed before any timing (checks: name -> rel_diff from the
    reference's result), timed interleaved() under the CPU lock.
    {name: {median_s, min_s, max_s, cpu_median_s, loops, repeat, max_rel_diff}}."""
    with cpu_lock(lock):
        got = interleaved(variants, repeat, min_time, warmup)
    return {name: {**t, "max_rel_diff": (checks or {}).get(name)} for name, t in got.items()}


# -- MPI jobs --------------------------------------------------------------------------

class JobFailed(RuntimeError):
    pass


def worktree(rev: str, out: Path) -> Path:
    """A checkout of `rev` (made once), whose src/ a baseline runs from with this tree's Python and MPI."""
    path = out / f"baseline-{rev}"
    if not (path / "src" / "asgd").exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(path), rev],
                       check=True, capture_output=True, timeout=120)
    return path


def fresh_dir(path: Path) -> Path:
    """`path` removed (asgd.train refuses to write over a run; a stale results.json misleads)."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def mpiexec(n: int, argv: list[str], timeout: float, env: dict | None = None, check: bool = True) -> dict:
    """`mpiexec -n n python <argv>`, its process group killed at the time limit.
    {rc, wall_s, stdout, stderr, cmd}; check: raise on rc != 0."""
    try:
        cmd = mpiexec_command(n, sys.executable, *argv)
    except FileNotFoundError as e:
        raise JobFailed(str(e)) from None
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)   # our own child's group: mpiexec and its ranks
        out, err = p.communicate()
        raise JobFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd)}\n{err[-2000:]}") from None
    res = {"rc": p.returncode, "wall_s": time.perf_counter() - t0, "stdout": out, "stderr": err,
           "cmd": " ".join(cmd)}
    if check and p.returncode:
        raise JobFailed(f"exit {p.returncode}: {' '.join(cmd)}\n{err[-2000:]}")
    return res


def train_job(n: int, argv: list[str], timeout: float, env: dict | None = None, check: bool = True,
              tb=None) -> tuple[dict | None, dict]:
    """`mpiexec -n n python argv --out TMPDIR`, on the testbed `tb` (a rank per host) if given:
    (its results.json, or None when the job failed and not check; the job: rc, wall_s, ...)."""
    out = Path(tempfile.mkdtemp(prefix="asgd-bench-"))
    try:
        if tb is None:
            job = mpiexec(n, [*argv, "--out", str(out)], timeout, env, check)
        else:
            res = tb.run([mpiexec_path(), "-n", str(n), sys.executable, *argv, "--out", str(out)], servers=0,
                         ranks_per_host=1, timeout=timeout, capture=True, env=env, say=lambda *a, **k: None)
            if res.rc and check:
                raise JobFailed(f"exit {res.rc} on the testbed: {' '.join(res.cmd)}\n{(res.stderr or '')[-2000:]}")
            job = {"rc": res.rc, "wall_s": res.wall_s, "stderr": res.stderr or "", "wire": res.wire}
        path = out / "results.json"
        if check and not path.exists():
            raise JobFailed(f"no results.json from: mpiexec -n {n} python {' '.join(argv)}")
        return (json.loads(path.read_text()) if path.exists() else None), job
    finally:
        shutil.rmtree(out, ignore_errors=True)


def time_to_accuracy(history: list[dict], target: float, clock: str = "wall_s") -> float | None:
    """`clock` (wall_s: since the process started; time_s: since training started) of the
    first epoch whose held-out accuracy reaches target (None: never)."""
    for h in history:
        if h.get("test_accuracy") is not None and h["test_accuracy"] >= target:
            return h[clock]
    return None


def precision_ratios(rows: list[dict], keys: tuple, ratios: dict) -> list[dict]:
    """Per case (its `keys`) measured in both precisions: {keys..., out: float32's row[col] /
    float64's, for out, col in ratios}."""
    by = {(*(r[k] for k in keys), r["precision"]): r for r in rows}
    return [{**dict(zip(keys, case)), **{out: round(r[col] / by[(*case, "float64")][col], 3)
                                         for out, col in ratios.items()}}
            for (*case, prec), r in by.items() if prec == "float32" and (*case, "float64") in by]


def linear_fit(x, y) -> tuple[float, float, float]:
    """Least-squares line y = a + b x: (b, a, R^2)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    b, a = np.polyfit(x, y, 1)
    ss = float(np.sum((y - y.mean()) ** 2))
    return float(b), float(a), 1 - float(np.sum((y - (a + b * x)) ** 2)) / ss if ss else 1.0


# -- outputs ---------------------------------------------------------------------------

def write_csv(path: Path, rows: list[dict]) -> Path:
    """One row per measurement; the columns are every key of any row, in first-seen order."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return path


def write_json(path: Path, obj: dict) -> Path:
    path.write_text(json.dumps(obj, indent=1, default=str))
    return path


def write_outputs(out: Path, name: str, rows: list[dict], meta: dict) -> list[Path]:
    """<out>/<name>.csv (one row per measurement) and <out>/<name>.json ({**meta, rows})."""
    return [write_csv(out / f"{name}.csv", rows), write_json(out / f"{name}.json", {**meta, "rows": rows})]


def commit() -> str:
    """The checkout's commit ("+dirty" with uncommitted changes; "unknown" outside git)."""
    try:
        got = subprocess.run(["git", "describe", "--always", "--dirty=+dirty", "--abbrev=7"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return got.stdout.strip() or "unknown"


def command_line() -> str:
    """How this process was started, as one would type it from the repository root."""
    def rel(a):
        try:
            return str(Path(a).resolve().relative_to(ROOT)) if os.path.exists(a) else a
        except ValueError:
            return a
    return " ".join(["python", *(rel(a) for a in sys.argv)])


def fmt(v, spec: str = ",.0f") -> str:
    """A table cell: "-" for None, a string as it is, a number in `spec`."""
    return "-" if v is None else v if isinstance(v, str) else format(v, spec)


def print_table(rows: list[dict], cols: list[tuple[str, str, str]], title: str | None = None) -> str:
    """cols: (header, key, format spec). Returns the text it printed."""
    cells = [[h for h, _, _ in cols]] + [[fmt(r.get(k), spec) for _, k, spec in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ([title] if title else []) + ["  ".join(c.rjust(wd) for c, wd in zip(row, widths)) for row in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def describe(m: dict, load: dict | None = None) -> str:
    """One line about the machine for the printed tables."""
    bw = m.get("memory_bandwidth_gbs") or {}
    line = (f"{m['cpu']} ({m.get('llvm_cpu')}), {m['cores']} cores, {m.get('memory_gib')} GiB"
            + (f", STREAM copy/add/triad {bw['copy']}/{bw['add']}/{bw['triad']} GB/s" if bw else "")
            + f"; {m.get('mpi_library', '').split(' MPICH Release')[0].split(',')[0][:60]}")
    if load:
        line += (f"; load avg 1 min {load['loadavg_1min_min']}-{load['loadavg_1min_max']}"
                 f" (median {load['loadavg_1min_median']}) on {load['cores']} cores")
    return line


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bars(ax, groups: list, series: list, height, colors: dict | None = None, note=None, labels=None,
         fontsize: float = 6, rotation: float = 0, span=None, **bar) -> dict:
    """One bar per series in each group along x: height(group, series) (None: no bar), note(group,
    series, height) -> its text, labels: the legend's names, span(group, series) -> (low, high):
    an error bar, the note above it. Returns each series' bar positions."""
    x, wd, at = np.arange(len(groups)), 0.8 / max(len(series), 1), {}
    for i, s in enumerate(series):
        at[s] = pos = x - 0.4 + wd * (i + 0.5)
        ys = [height(g, s) for g in groups]
        lows, tops = zip(*[span(g, s) for g in groups]) if span else (None, [y or 0 for y in ys])
        err = [[y - lo for y, lo in zip(ys, lows)], [hi - y for y, hi in zip(ys, tops)]] if span else None
        ax.bar(pos, [y or 0 for y in ys], wd, yerr=err, color=(colors or {}).get(s),
               label=(labels or {}).get(s, str(s)), **bar)
        for xi, g, y, top in zip(pos, groups, ys, tops):
            text = note(g, s, y) if note else None
            if text:
                ax.annotate(text, (xi, top), xytext=(0, 2 if span else 0), textcoords="offset points", ha="center",
                            va="bottom", fontsize=fontsize, rotation=rotation)
    ax.set_xticks(x, [str(g) for g in groups])
    return at


def decorate(ax, title: str, size: float = 9, legend: dict | None = None, grid: dict | None = None, **axes) -> None:
    """ax.set(**axes), the title in font size `size`, a legend (its keywords; None: none) and a light grid."""
    ax.set(**axes)
    ax.set_title(title, fontsize=size)
    if legend is not None:
        ax.legend(**legend)
    ax.grid(alpha=0.3, **(grid or {}))


def save_figure(fig, path: Path, dpi: int = 120, rect: tuple | None = None, **savefig) -> None:
    """Lay the figure out (inside `rect`: room for text below it), write it and close it."""
    fig.tight_layout(**({"rect": rect} if rect else {}))
    fig.savefig(path, dpi=dpi, **savefig)
    pyplot().close(fig)


# -- a bench's command line and run ------------------------------------------------------

def parser(doc: str, name: str | None = None, plot: bool = True, mpi_child: bool = False,
           lock: bool = False) -> argparse.ArgumentParser:
    """A bench's command line, its docstring as --help; with `name`, --out and --no-plot;
    mpi_child: the hidden --mpi-child of a bench that starts itself under mpiexec; lock: --cpu-lock."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if name:
        p.add_argument("--out", type=Path, default=RESULTS / name, help=f"output folder (default bench/results/{name})")
        if plot:
            p.add_argument("--no-plot", action="store_true", help=f"skip {name}.png")
    if lock:
        p.add_argument("--cpu-lock", default=CPU_LOCK, help=f"the CPU lock each timed run holds (none: none; "
                       f"default {CPU_LOCK}, or $ASGD_CPU_LOCK)")
    if mpi_child:
        p.add_argument("--mpi-child", action="store_true", help=argparse.SUPPRESS)
    return p


def as_mpi_child(args: argparse.Namespace, child) -> bool:
    """Inside the MPI job a bench starts of itself (--mpi-child): run child(args) and say so."""
    if args.mpi_child:
        child(args)
    return args.mpi_child


def mpi_child_argv(script: str, argv: list[str] | None) -> list[str]:
    """The MPI job a bench starts of itself: its script and its own options again, --mpi-child."""
    return [str(Path(script).resolve()), *(sys.argv[1:] if argv is None else argv), "--mpi-child"]


def child_result(stdout: str) -> dict:
    """The JSON line an MPI child printed last: its results."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise JobFailed(f"no result from the MPI job:\n{stdout[-1500:]}")
    return json.loads(lines[-1])


def _ended(signum, _frame):
    raise SystemExit(f"{Path(sys.argv[0]).name}: ended by signal {signal.Signals(signum).name}")


class Run:
    """What every bench run shares: its output folder, the machine, the load while it
    measures, the head of its JSON, and the files it wrote. load_every_s: the load's sampling
    period (None: from sample_load() on, e.g. after a warm-up); measure=False: no machine and no
    load (a redraw); end_on_signals: SIGTERM and SIGHUP end the bench as SystemExit, so its
    `finally` blocks run (a testbed bench takes its testbed down), which Python's default skips."""

    def __init__(self, name: str, args: argparse.Namespace, *, load_every_s: float | None = 2.0,
                 bandwidth: bool = True, measure: bool = True, end_on_signals: bool = False):
        if end_on_signals:
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, _ended)
        self.name, self.args = name, args
        self.commit = commit()   # now: the code this process imported, not the checkout at its end
        self.out = Path(args.out or RESULTS / name)
        self.out.mkdir(parents=True, exist_ok=True)
        self.paths: list[Path] = []
        self._sampler, self._load = None, None
        if measure and load_every_s:
            self.sample_load(load_every_s)
        self.machine = machine(bandwidth) if measure else None

    def sample_load(self, every_s: float = 2.0) -> None:
        self._sampler, self._load = LoadSampler(every_s), None

    @property
    def load(self) -> dict | None:
        """The load since sampling began (None: never sampled); sampling stops at the first call."""
        if self._load is None and self._sampler is not None:
            self._load = self._sampler.summary()
        return self._load

    def head(self) -> dict:
        """Where and how the numbers were measured: machine, load, command line, options."""
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()}
        return {"machine": self.machine, "load": self.load, "command": command_line(), "commit": self.commit,
                "args": options}

    def meta(self, **own) -> dict:
        return {"benchmark": self.name, **self.head(), **own}

    def write(self, rows: list[dict], meta: dict, name: str | None = None) -> None:
        self.paths += write_outputs(self.out, name or self.name, rows, meta)

    def plot(self, draw, *data, name: str | None = None):
        """draw(*data, path) into <out>/<name>.png (name: the bench's), unless --no-plot."""
        if getattr(self.args, "no_plot", False):
            return None
        path = self.out / f"{name or self.name}.png"
        got = draw(*data, path)
        self.paths.append(path)
        return got

    def print_machine(self) -> None:
        print(describe(self.machine, self.load))

    def wrote(self) -> None:
        print("wrote " + ", ".join(str(p) for p in self.paths))
