"""How much of a worker's push/pull exchange hides behind its compute, for the Delta-w of
2-10K-2 and 2-100K-2, on shared memory (mpiexec, 2 ranks) and on two testbed hosts (root),
through asgd's real protocol and step, --progress on and off; the headline is the fraction
hidden at compute = 2 x the exchange. The method: docs/bench-suite.md and docs/benchmarks.md.
Writes overlap.csv, overlap.json (machine, load, testbed), overlap.png under --out.

    python bench/bench_overlap.py                        # both sizes, shm and testbed (root), progress on and off
    python bench/bench_overlap.py --where shm --hidden 10000 --ratios 2 --updates 10   # seconds
"""

import sys

import common  # first: pins threads, puts src/ on the path
import validate
from common import int_list
from runs_report import grouped, median

import itertools
import json
import statistics

import numpy as np

from asgd.core.wire import PRECISIONS
from asgd.run.config import Config

COLUMNS = {"E_ms": "the exchange alone: worker ms per step with no compute (median over steps)",
           "c_ms": "the worker's compute per step (real step, batch timed for ratio x E)",
           "exposed_ms": "push + comm_wait per step with that compute",
           "hidden_frac": "(c0 + E - T) / min(E, c0), clipped to [0, 1]; c0: the step's compute with "
                          "progress off (same batch, same run)",
           "hidden_frac_exposed": "(E - exposed) / min(E, c), clipped (phase 1's measure; the same "
                                  "as hidden_frac with progress off)",
           "T_ms": "worker ms per step", "perfect_ms": "max(c, E)", "serial_ms": "c + E"}


def float_list(s: str) -> list[float]:
    return [float(v) for v in str(s).split(",") if v]


def parse_args(argv=None):
    p = common.parser(__doc__, "overlap", mpi_child=True)
    p.add_argument("--hidden", type=int_list, default=[10000, 100000], help="2-H-2 sizes (default 10000,100000)")
    p.add_argument("--where", type=common.choice_list(("shm", "testbed")), default="shm,testbed",
                   help="comma list of shm, testbed (default both; testbed: root)")
    p.add_argument("--bandwidth", default="1gbit", help="the testbed's links, each way (default 1gbit)")
    p.add_argument("--progress", type=common.choice_list(("on", "off")), default="on,off",
                   help="comma list of on, off: the worker's step tests the "
                   "exchange between its sample blocks, or not (default both, alternating)")
    p.add_argument("--name", default="ov", help="testbed name (default ov)")
    p.add_argument("--precision", choices=PRECISIONS, default=Config().precision,
                   help="w, Delta-w and the messages' values (default asgd.train's)")
    p.add_argument("--ratios", type=float_list, default=[0.5, 1.0, 2.0, 4.0],
                   help="compute / exchange ratios r (default 0.5,1,2,4; the headline is r = 2)")
    p.add_argument("--updates", type=int, default=40, help="updates per measurement (default 40)")
    p.add_argument("--repeat", type=int, default=5, help="repetitions, medians (default 5)")
    p.add_argument("--quick", action="store_true", help="ratios 2 only, 10 updates, 1 repetition")
    p.add_argument("--timeout", type=float, default=900, help="seconds per MPI job (default 900)")
    a = p.parse_args(argv)
    if a.quick:
        a.ratios, a.updates, a.repeat = [2.0], 10, 1
    return a


# -- inside the MPI job: rank 0 serves, rank 1 works -----------------------------------------

def per_step(events: dict, modes: list[str]) -> dict:
    """Medians per worker step of its compute, exposed (push + comm_wait) and total time, per
    mode, from a TraceClock's intervals: a step is a `compute` interval and the `comm_wait`
    and `push` that follow it; step i ran in modes[i % len(modes)]. The first two cycles
    (nothing to wait for yet, cold caches) are left out."""
    names = events["phases"]
    steps = []
    for start, end, code in events["intervals"]:
        name = names[code]
        if name == "compute":
            steps.append({"mode": modes[len(steps) % len(modes)], "compute": 0.0, "exposed": 0.0})
        if steps and name in ("compute", "push", "comm_wait"):
            steps[-1]["compute" if name == "compute" else "exposed"] += (int(end) - int(start)) / 1e9
    steps = [{**x, "T": x["compute"] + x["exposed"]} for x in steps[2 * len(modes):]]
    return {m: {**{k: median(xs, k) for k in ("compute", "exposed", "T")}, "steps": len(xs)}
            for (m,), xs in grouped(steps, ("mode",)).items()}


def cycling(step, modes: list[str]):
    """A step that runs as modes[k % len(modes)] on its k-th call: `alone` returns at once
    (the exchange alone: E), `on` passes run_worker's progress on, `off` does not."""
    k = [0]

    def wrapped(w, X, y, lr, dw, progress=None):
        mode = modes[k[0] % len(modes)]
        k[0] += 1
        if mode == "alone":
            return 0.0
        return step(w, X, y, lr, dw, progress if mode == "on" else None)
    return wrapped


def child(args) -> None:
    from asgd.data import problem
    from asgd.net import mlp
    from asgd.run.trace import PhaseClock, TraceClock

    comm, waiter, crowded = common.two_ranks("bench_overlap's MPI job", args.timeout)
    dt = np.dtype(args.precision)
    mlp.compile_kernels(dtype=dt)
    out = []

    def exchange(layout, step, batch: int, updates: int, modes: list[str]) -> dict | None:
        """One run of the real protocol, `updates` steps per mode cycling; the worker's medians."""
        w = mlp.init_params(layout, 0, dt)
        comm.Barrier()
        if comm.rank == 0:
            common.exchange(comm, waiter, PhaseClock("idle"), w, None, None, None, batch, 1e-9)
            return None
        data = problem.rings(batch * updates * len(modes), 1)
        clock = TraceClock("idle", steps=(0, 1 << 30))
        common.exchange(comm, waiter, clock, w, data.X.astype(dt), data.y,   # X as asgd.train casts it to --precision
                        cycling(step, modes), batch, 1e-9)
        return per_step(clock.events(), modes)

    def batch_for(layout, seconds: float) -> int:
        """The batch whose real step takes about `seconds` here (rescaled thrice: not quite linear)."""
        ds = problem.rings(4096, 2)
        X = ds.X.astype(dt)
        w, dw = mlp.init_params(layout, 0, dt), np.zeros(layout.n_w, dt)
        b = 64
        for _ in range(3):
            b = int(min(max(b, 1), 4096))
            s = mlp.make_step(layout, b, dt)   # one untimed call, then the median of three
            t = common.interleaved({"step": lambda: s(w, X[:b], ds.y[:b], 1e-9, dw)}, 3, min_time=0, warmup=0)
            b = round(b * seconds / t["step"]["median_s"])
        return int(min(max(b, 1), 4096))

    for hidden in args.hidden:
        layout = mlp.Layout(2, hidden, 2)
        exchange(layout, None, 1, 5, ["alone"])   # warm-up: connections, buffers ("alone": no step, no compute)
        for rep in range(args.repeat):
            alone = exchange(layout, None, 1, args.updates, ["alone"])   # sizes the batches
            E0 = comm.bcast(alone["alone"]["T"] if alone else None, root=1)
            for r in args.ratios:
                batch = comm.bcast(batch_for(layout, r * E0) if comm.rank == 1 else None, root=1)
                modes = ["alone", *common.rotated(args.progress, rep)]
                got = exchange(layout, mlp.make_step(layout, batch, dt), batch, args.updates, modes)
                if not got:
                    continue
                E = got["alone"]["T"]   # the exchange alone, in this very run
                for mode in args.progress:
                    g = got[mode]
                    c, exposed = g["compute"], g["exposed"]
                    out.append({"hidden": hidden, "n_w": layout.n_w, "precision": args.precision,
                                "mbytes": dt.itemsize * layout.n_w / 1e6, "rep": rep,
                                "progress": mode, "ratio": r, "batch": batch, "E_ms": 1e3 * E,
                                "E_exposed_ms": 1e3 * got["alone"]["exposed"], "c_ms": 1e3 * c,
                                "exposed_ms": 1e3 * exposed, "T_ms": 1e3 * g["T"],
                                "perfect_ms": 1e3 * max(c, E), "serial_ms": 1e3 * (c + E),
                                "hidden_frac_exposed": (float(np.clip((E - exposed) / min(E, c), 0, 1))
                                                        if c > 0 else None),
                                "steps": g["steps"]})
    if comm.rank == 1:
        print(json.dumps({"oversubscribed": bool(crowded), "rows": out}), flush=True)


# -- the launcher -------------------------------------------------------------------------------

def summarize(rows: list[dict]) -> list[dict]:
    """Each row's hidden_frac, then medians over repetitions per where x hidden x progress x
    ratio. c0 is the pure compute: the step with progress off at the same batch in the same
    run (progress moves MPI's copying into the step's compute phase); else the row's own c."""
    c0 = {(r["where"], r["hidden"], r["rep"], r["ratio"]): r["c_ms"] for r in rows if r["progress"] == "off"}
    for r in rows:
        c = r["c0_ms"] = c0.get((r["where"], r["hidden"], r["rep"], r["ratio"]), r["c_ms"])
        r["hidden_frac"] = float(np.clip((c + r["E_ms"] - r["T_ms"]) / min(r["E_ms"], c), 0, 1)) if c > 0 else None
    out = []
    for (where, hidden, progress, ratio), rs in sorted(grouped(rows, ("where", "hidden", "progress", "ratio")).items()):
        fracs = [r["hidden_frac"] for r in rs]
        out.append({"where": where, "hidden": hidden, "mbytes": round(rs[0]["mbytes"], 3), "progress": progress,
                    "ratio": ratio, "batch": rs[0]["batch"],
                    **{k: median(rs, k, 3) for k in ("E_ms", "c_ms", "c0_ms", "exposed_ms", "T_ms", "perfect_ms",
                                                   "serial_ms", "hidden_frac", "hidden_frac_exposed")},
                    "c_over_E": round(statistics.median(r["c_ms"] / r["E_ms"] for r in rs), 3),
                    "hidden_frac_min": round(min(fracs), 3), "hidden_frac_max": round(max(fracs), 3),
                    "repeat": len(rs)})
    return out


def plot(summary, headline_ratio, path):
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    colors = dict(zip(sorted({(s["where"], s["hidden"]) for s in summary}),
                      ["tab:blue", "tab:orange", "tab:green", "tab:red"]))
    for (where, hidden, progress), ss in itertools.groupby(summary, lambda s: (s["where"], s["hidden"], s["progress"])):
        ss, col = list(ss), colors[(where, hidden)]   # summary is sorted: by ratio within a line
        ax.plot([s["ratio"] for s in ss], [s["hidden_frac"] for s in ss], "-" if progress == "on" else ":",
                marker="o" if progress == "on" else "x", color=col,
                label=f"{where}, {ss[0]['mbytes']:.1f} MB, progress {progress}")
        ax.fill_between([s["ratio"] for s in ss], [s["hidden_frac_min"] for s in ss],
                        [s["hidden_frac_max"] for s in ss], color=col, alpha=0.1)
    ax.set_xscale("log", base=2)
    common.decorate(ax, "", legend={"fontsize": 8}, ylim=(-0.05, 1.05), xlabel="compute / exchange alone (c / E)",
                    ylabel="fraction of the exchange hidden")
    ax = axes[1]
    heads = {f"{s['where'].replace(' ', chr(10))}\n{s['mbytes']:.1f} MB\nprogress\n{s['progress']}": s
             for s in summary if s["ratio"] == headline_ratio}
    common.bars(ax, list(heads), ["serial_ms", "T_ms", "perfect_ms"], lambda name, k: heads[name][k],
                {"serial_ms": "0.7", "T_ms": "tab:blue", "perfect_ms": "tab:green"},
                labels={"serial_ms": "c + E (no overlap)", "T_ms": "measured T", "perfect_ms": "max(c, E) (perfect)"})
    ax.tick_params(axis="x", labelsize=7)
    ax.set(yscale="log", ylabel=f"ms per step at c = {headline_ratio:g} E (medians)")
    ax.legend(fontsize=8)
    fig.suptitle("The exchange hidden behind the worker's compute: shm measured here (shared memory, one "
                 "machine); testbed measured on the emulated cluster (two hosts, TCP over shaped links)", fontsize=9)
    common.save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    if common.as_mpi_child(args, child):
        return 0
    run = common.Run("overlap", args, end_on_signals=True)   # timeout/kill -TERM: the testbed goes down too
    rows, testbed = [], None
    if "shm" in args.where:
        print("shared memory: mpiexec -n 2 (one machine) ...", flush=True)
        job = common.mpiexec(2, common.mpi_child_argv(__file__, argv), timeout=args.timeout)
        rows += [{"where": "shm", **r} for r in common.child_result(job["stdout"])["rows"]]
    reason = "testbed" in args.where and validate.testbed_missing()
    if reason:
        print(f"testbed skipped: {reason}", flush=True)
    elif "testbed" in args.where:
        rate = validate.format_rate(validate.parse_rate(args.bandwidth))
        testbed = {"hosts": 2, "rate": rate, "rate_bit": validate.parse_rate(args.bandwidth),
                   "placement": "server h0, worker h1"}
        with validate.testbed(args.name, 2, args.bandwidth) as tb:
            print(f"testbed: server and worker on two hosts, {rate} links ...", flush=True)
            res = tb.run([validate.launcher(), "-n", "2", sys.executable, *common.mpi_child_argv(__file__, argv)],
                         servers=1, capture=True, timeout=args.timeout, say=lambda *a, **k: None)
            if res.rc:
                raise RuntimeError(f"testbed job failed (exit {res.rc}): {(res.stderr or '')[-1500:]}")
            testbed["wire_bytes"] = res.wire
            rows += [{"where": f"testbed {rate}", **r} for r in common.child_result(res.stdout)["rows"]]
    summary = summarize(rows)
    headline = 2.0 if 2.0 in args.ratios else args.ratios[-1]
    heads = {}   # per where x size at the headline ratio: progress off and on
    for s in summary:
        if s["ratio"] == headline:
            heads.setdefault(f"{s['where']} {s['mbytes']:.1f} MB", {})[s["progress"]] = {
                k: s[k] for k in ("hidden_frac", "c_ms", "T_ms")}
    info = run.meta(testbed=testbed, summary=summary, headline_ratio=headline, columns=COLUMNS, headline=heads)
    common.report(run, rows, info, plot, summary, [
        ("where", "where", ""), ("MB", "mbytes", ".1f"), ("progress", "progress", ""), ("c/E", "ratio", "g"),
        ("batch", "batch", "d"), ("c/E got", "c_over_E", ".2f"), ("E ms", "E_ms", ".2f"), ("c ms", "c_ms", ".2f"),
        ("exposed ms", "exposed_ms", ".2f"), ("T ms", "T_ms", ".2f"), ("max(c,E)", "perfect_ms", ".2f"),
        ("c+E", "serial_ms", ".2f"), ("hidden", "hidden_frac", ".2f"), ("min", "hidden_frac_min", ".2f"),
        ("max", "hidden_frac_max", ".2f"), ("by exposed", "hidden_frac_exposed", ".2f")],
        [f"headline (c = {headline:g} E), the exchange hidden, progress off -> on (step T ms off -> on): " + "; ".join(
            f"{name}: " + " -> ".join(f"{100 * v['hidden_frac']:.0f} %" for _, v in sorted(h.items()))
            + " (" + " -> ".join(f"{v['T_ms']:.1f}" for _, v in sorted(h.items())) + ")"
            for name, h in heads.items())], data=(summary, headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
