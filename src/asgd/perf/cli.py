"""python -m asgd.perf calibrate | predict | compare | optimize | report: the performance
lab at the command line (the analytical model is asgd.perf.analytic).

  calibrate   measure this machine's parameters (asgd.perf.calibrate) into params.json
  predict     predicted init, compute, communication and total seconds per configuration
  compare     predicted against measured for asgd.train runs (their results.json)
  optimize    the configurations with the least predicted time, ranked (Yan et al. 2015)

Every command but calibrate reads the parameters from --params (default params.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import asdict, replace

from ..data import formats, problem
from ..data.shares import HOLDOUT
from ..run.files import atomic_write
from . import analytic, report
from .analytic import Params, Run

PHASES = ("init", "train", "total")  # the paper's two phases (Figure 9) and their sum: what runs measure
DETAIL = ("compute", "comm")         # inside train: a worker's compute, and its waits and sends


class PerfError(RuntimeError):
    pass


def load_params(path: str) -> Params:
    try:
        with open(path) as f:
            got = json.load(f)
        return Params.from_dict(got["params"])
    except FileNotFoundError:
        raise PerfError(f"{path}: no such file; measure this machine first: "
                         f"python -m asgd.perf calibrate --out {path}") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise PerfError(f"{path}: not a parameters file from 'asgd.perf calibrate' ({e})") from None


# -- the data a configuration reads ------------------------------------------------------

def data_of(path: str | None, points: int | None, fmt: str, p: Params) -> dict:
    """Run fields for the data: a real file (size, points, held-out companion), a file of
    `points` points in `fmt` that need not exist, or the embedded problem."""
    if path:
        binary = formats.is_binary(path)
        size = os.path.getsize(path)
        n = _points(path, binary)
        test = formats.test_path(path)
        if os.path.exists(test):
            tn = _points(test, binary)
            return dict(points=n, test_points=tn, file_bytes=size, test_bytes=os.path.getsize(test), binary=binary)
        held = n // HOLDOUT  # without a held-out file, the readers hold out 1/HOLDOUT of it
        return dict(points=n - held, test_points=held, file_bytes=size, test_bytes=0, binary=binary)
    if fmt == "embedded":
        return dict(points=points or problem.DEFAULT_POINTS,
                    test_points=points // 4 if points else problem.DEFAULT_TEST_POINTS)
    n = points or 16384
    per = p.bytes_per_point[fmt]
    return dict(points=n, test_points=n // 4, file_bytes=int(n * per), test_bytes=int(n // 4 * per),
                binary=fmt == "npy")


def _points(path: str, binary: bool) -> int:
    """Data points in a file: a .npy header's rows, or a TSV file's lines."""
    return formats.npy_header(path)[1] if binary else _count_lines(path)


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def run_of(results: dict, p: Params) -> Run:
    """The Run a results.json describes (its config), for predicting it."""
    c = results["config"]
    d = c.get("data")
    got = dict(points=c["train_points"], test_points=c["test_points"])  # as the run counted them
    if d:
        binary = d.lower().endswith(".npy")
        test = c.get("test") or formats.test_path(d)
        if os.path.exists(d):  # the sizes only: the points are known
            got.update(binary=binary, file_bytes=os.path.getsize(d),
                       test_bytes=os.path.getsize(test) if os.path.exists(test) else 0)
        else:  # the file is gone: its size from the calibrated bytes per point
            n = c["train_points"] + c["test_points"]
            got.update(binary=binary, file_bytes=int(n * p.bytes_per_point["npy" if binary else "tsv"]))
    return Run(workers=c["workers"], servers=c["servers"], batch=c["batch"], hidden=c["hidden"],
               epochs=c["epochs"], reader=c["reader"], mode=c["mode"], features=c["features"],
               classes=c["classes"], cores=c.get("cores", 0), **got)


def measured(results: dict) -> dict:
    """Measured seconds per phase: init, train, total (job level), and the workers' mean
    compute and communication (push + comm_wait)."""
    workers = [r for r in results["ranks"] if r["role"] == "worker"]
    mean = lambda *keys: statistics.fmean(sum(r["phases"].get(k, 0.0) for k in keys) for r in workers)  # noqa: E731
    return {"init": results["init_s"], "train": results["train_s"], "total": results["wall_s"],
            "compute": mean("compute"), "comm": mean("push", "comm_wait")}


def predicted(pr: analytic.Prediction) -> dict:
    return {"init": pr.init_s, "train": pr.train_s, "total": pr.total_s, "compute": pr.compute_s, "comm": pr.comm_s}


def ape(pred: float, meas: float) -> float:
    """Absolute percentage error of a prediction, % of the measured value."""
    return abs(pred - meas) / meas * 100 if meas > 0 else math.inf


def paper_total(p: Params, run: Run) -> float:
    """The paper's own prediction with these calibrated parameters, for contrast: section
    5.3's T_total_new (eq. 12's reading) for the sequential reader and the embedded
    problem (every rank builds all of it), eq. 9 for the parallel one. It knows no
    start-up, no cores shared and no server queue."""
    t = p.table1(run)
    if run.reader == "parallel" and run.file_bytes:
        return analytic.T_total(t)
    return analytic.T_total_new(t, 0.0)


def compare(paths: list[str], p: Params) -> tuple[list[dict], list[str]]:
    """One row per usable run: its configuration, predicted and measured seconds and the
    APE per phase. Runs the model does not cover (p2p, allreduce, stopped early, resumed) are
    skipped, with the reason."""
    rows, skipped = [], []
    for path in paths:
        f = os.path.join(path, "results.json") if os.path.isdir(path) else path
        try:
            with open(f) as fh:
                res = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            skipped.append(f"{path}: unreadable ({e})")
            continue
        c = res.get("config", {})
        why = (f"{c['arch']} (the model covers parameter servers)" if c.get("arch", "ps") != "ps" else
               "stopped early" if res.get("stopped") else "resumed from a checkpoint" if c.get("resume") else None)
        if why:
            skipped.append(f"{path}: {why}")
            continue
        run = run_of(res, p)
        pr, me = predicted(analytic.predict(p, run)), measured(res)
        row = {"run": path, "workers": run.workers, "servers": run.servers, "batch": run.batch,
               "hidden": run.hidden, "reader": run.reader if run.file_bytes else "embedded",
               "epochs": run.epochs, "mode": run.mode}
        for k in PHASES + DETAIL:
            row.update({f"{k}_pred_s": pr[k], f"{k}_meas_s": me[k], f"{k}_ape": ape(pr[k], me[k])})
        paper = paper_total(p, run)
        row.update(paper_total_pred_s=paper, paper_total_ape=ape(paper, me["total"]))
        rows.append(row)
    return rows, skipped


def error_summary(rows: list[dict], phases=PHASES + DETAIL) -> dict:
    """Median and 90th percentile APE per phase over all rows."""
    out = {}
    for k in phases:
        e = sorted(r[f"{k}_ape"] for r in rows)
        if e:
            out[k] = {"median": statistics.median(e), "p90": e[min(len(e) - 1, math.ceil(0.9 * len(e)) - 1)]}
    return out


def optimize(p: Params, nodes: int, cores_per_node: int, base: Run, workers: list[int], servers: list[int],
             batches: list[int], readers: list[str], max_ranks: int | None = None) -> list[dict]:
    """Every configuration of the grid within max_ranks ranks (default: one per core),
    ranked by predicted total time (init + epochs of training)."""
    cores = nodes * cores_per_node
    limit = max_ranks or cores
    out = []
    for s in servers:
        for w in workers:
            if w + s > limit:
                continue
            for b in batches:
                for r in (readers if base.file_bytes else ["parallel"]):
                    run = replace(base, workers=w, servers=s, batch=b, reader=r, cores=cores)
                    pr = analytic.predict(p, run)
                    out.append({"workers": w, "servers": s, "batch": b, "reader": r if base.file_bytes else "embedded",
                                "ranks": w + s, "init_s": pr.init_s, "train_s": pr.train_s, "total_s": pr.total_s,
                                "per_epoch_s": pr.total_s / run.epochs, "bound": pr.detail["bound"]})
    return sorted(out, key=lambda r: r["total_s"])


# -- command line ---------------------------------------------------------------------------

def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def _data_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("data (default: the embedded problem)")
    g.add_argument("--data", help="a real data file: points, size and held-out companion from it")
    g.add_argument("--points", type=positive_int, help="training points of a file that need not exist")
    g.add_argument("--format", choices=("tsv", "npy", "embedded"), default=None,
                   help="with --points: tsv or npy file, or the embedded problem (default tsv with --points)")
    g.add_argument("--epochs", type=positive_int, default=1, help="passes over the data (default 1)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m asgd.perf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate", help="measure this machine's parameters")
    c.add_argument("--out", default="params.json", help="parameters file to write (default params.json)")
    c.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (seconds, not minutes)")
    c.add_argument("--launcher", default=None, help="MPI launcher command, e.g. 'srun' (default: mpiexec)")
    params = dict(default="params.json", help="parameters from calibrate (default params.json)")

    pp = sub.add_parser("predict", help="predicted phase times per configuration")
    pp.add_argument("--workers", type=int_list, default=[1, 2, 4, 8, 16], help="comma-separated (default 1,2,4,8,16)")
    pp.add_argument("--servers", type=positive_int, default=1, help="parameter servers (default 1)")
    pp.add_argument("--hidden", type=int_list, default=[10000], help="hidden units, comma-separated (default 10000)")
    pp.add_argument("--batch", type=int_list, default=[256], help="batch sizes, comma-separated (default 256)")
    pp.add_argument("--reader", choices=("sequential", "parallel"), default="parallel",
                    help="data reader, as asgd.train's (default parallel; no effect on the embedded problem)")
    pp.add_argument("--mode", choices=("async", "ssp", "sync"), default="async",
                    help="consistency mode, as asgd.train's (default async; ssp is predicted as async)")
    pp.add_argument("--cores", type=positive_int, default=0, help="cores the ranks share (default: the calibrated machine's)")
    pp.add_argument("--params", **params)
    pp.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    _data_args(pp)

    cp = sub.add_parser("compare", help="predicted against measured for asgd.train runs")
    cp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (or their results.json)")
    cp.add_argument("--params", **params)
    cp.add_argument("--csv", help="also write the rows to this CSV file")

    op = sub.add_parser("optimize", help="rank configurations by predicted time")
    op.add_argument("--nodes", type=positive_int, default=1, help="nodes (default 1)")
    op.add_argument("--cores-per-node", type=positive_int, required=True, help="cores per node")
    op.add_argument("--hidden", type=positive_int, default=10000, help="hidden units (default 10000)")
    op.add_argument("--workers", type=int_list, help="worker counts to try (default 1 .. ranks - servers)")
    op.add_argument("--servers", type=int_list, default=[1, 2, 4], help="server counts to try (default 1,2,4)")
    op.add_argument("--batches", type=int_list, default=[16, 64, 256, 1024], help="default 16,64,256,1024")
    op.add_argument("--readers", default="sequential,parallel", help="default sequential,parallel")
    op.add_argument("--max-ranks", type=positive_int,
                    help="most ranks to start (default: one per core; more shares cores)")
    op.add_argument("--top", type=positive_int, default=10, help="configurations to print (default 10)")
    op.add_argument("--params", **params)
    _data_args(op)

    rp = sub.add_parser("report", help="the paper's profiling figures from runs' results.json")
    report.add_arguments(rp)
    return ap


def parse_args(argv):
    return build_parser().parse_args(argv)


def _fmt_s(x: float) -> str:
    return f"{x:9.3f}" if x < 1000 else f"{x:9.0f}"


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        if a.cmd == "calibrate":
            return _calibrate(a)
        if a.cmd == "report":
            return report.write_figures(a.runs, a.out)
        p = load_params(a.params)
        return {"predict": _predict, "compare": _compare, "optimize": _optimize}[a.cmd](a, p)
    except (PerfError, ValueError, OSError) as e:
        print(f"asgd.perf {a.cmd}: error: {e}", file=sys.stderr)
        return 2


def _calibrate(a) -> int:
    from .calibrate import CalibrationError, calibrate
    try:
        got = calibrate(a.launcher, a.quick)
    except CalibrationError as e:
        raise PerfError(str(e)) from None
    atomic_write(a.out, lambda f: json.dump(got, f, indent=1))
    p = Params.from_dict(got["params"])
    t = p.table1(Run(workers=1, hidden=10000, batch=256))
    print(f"Table 1 on this machine (2-10K-2, batch 256), measured in {got['seconds']:.0f} s:")
    for k in ("c_p", "c_b", "c_u", "r_d", "r_m", "r_net", "point_bytes"):
        print(f"  {k:12s} {getattr(t, k):.4g} {analytic.Table1.UNITS[k]}")
    pp = p.pingpong_s
    print(f"  {'MPI':12s} {min(pp.values()) * 1e6:.1f} us latency, {1 / p.r_net() / 1e9:.2f} GB/s "
          f"(ping-pong, {min(pp)} to {max(pp):,} bytes)")
    st = p.startup
    print(f"  {'startup':12s} {sum(v for k, v in st.items() if k.endswith('wall_s')):.3f} s per rank "
          f"(imports {st['imports_wall_s']:.3f}, cache loads {st['parsers_wall_s'] + st['kernels_wall_s']:.3f}); "
          f"{p.cores} cores")
    print(f"parameters: {a.out}")
    return 0


def _base_run(a, p: Params) -> Run:
    fmt = a.format or ("tsv" if a.points else "embedded")
    return Run(workers=1, epochs=a.epochs, **data_of(a.data, a.points, fmt, p))


def _predict(a, p: Params) -> int:
    base = _base_run(a, p)
    cols = ("workers servers  hidden  batch  reader       init_s compute_s    comm_s   train_s   total_s  bound"
            "    step fits in")
    if not a.json:
        what = "embedded problem" if not base.file_bytes else f"{'npy' if base.binary else 'TSV'} file"
        print(f"predicted, {base.points:,} training points ({what}), {a.epochs} epoch(s), "
              f"{a.cores or p.cores} cores, {a.mode}")
        print(cols)
    for h in a.hidden:
        for b in a.batch:
            for w in a.workers:
                run = replace(base, workers=w, servers=a.servers, hidden=h, batch=b, reader=a.reader,
                              mode=a.mode, cores=a.cores)
                pr = analytic.predict(p, run)
                if a.json:
                    print(json.dumps({"run": asdict(run), **pr.as_dict()}))
                    continue
                print(f"{w:7d} {a.servers:7d} {h:7d} {b:6d}  {a.reader if base.file_bytes else 'embedded':10s}"
                      f"{_fmt_s(pr.init_s)} {_fmt_s(pr.compute_s)} {_fmt_s(pr.comm_s)} {_fmt_s(pr.train_s)} "
                      f"{_fmt_s(pr.total_s)}  {pr.detail['bound']:8s} {pr.detail['cache_level']}")
    return 0


def _compare(a, p: Params) -> int:
    rows, skipped = compare(a.runs, p)
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    if not rows:
        raise PerfError("no run to compare")
    print("predicted / measured seconds, and the absolute percentage error (APE)")
    print(f"{'run':28s} {'w':>2s} {'S':>2s} {'hidden':>6s} {'batch':>5s} {'reader':10s}" +
          "".join(f" {k:>22s}" for k in PHASES + DETAIL))
    for r in rows:
        cells = "".join(f" {r[f'{k}_pred_s']:7.2f}/{r[f'{k}_meas_s']:6.2f} {r[f'{k}_ape']:5.0f}%" for k in PHASES + DETAIL)
        print(f"{os.path.basename(os.path.normpath(r['run']))[-28:]:28s} {r['workers']:2d} {r['servers']:2d} "
              f"{r['hidden']:6d} {r['batch']:5d} {r['reader']:10s}{cells}")
    print(f"APE over {len(rows)} runs:  " + "   ".join(
        f"{k} median {e['median']:.1f}% p90 {e['p90']:.1f}%" for k, e in error_summary(rows).items()))
    e = error_summary(rows, ("paper_total",))["paper_total"]
    print(f"the paper's own equations (eq. 9; 5.3's update for the sequential reader), same parameters: "
          f"total median {e['median']:.1f}% p90 {e['p90']:.1f}%")
    if a.csv:
        import csv
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
        print(f"rows: {a.csv}")
    return 0


def _optimize(a, p: Params) -> int:
    base = replace(_base_run(a, p), hidden=a.hidden)
    readers = [r.strip() for r in a.readers.split(",") if r.strip()]
    bad = [r for r in readers if r not in ("sequential", "parallel")]
    if bad:
        raise PerfError(f"unknown reader(s) {bad}: choose from sequential, parallel")
    limit = a.max_ranks or a.nodes * a.cores_per_node
    workers = a.workers or list(range(1, limit))
    ranked = optimize(p, a.nodes, a.cores_per_node, base, workers, a.servers, a.batches, readers, limit)
    if not ranked:
        raise PerfError(f"no configuration fits in {limit} ranks (--max-ranks)")
    print(f"{len(ranked)} configurations on {a.nodes} node(s) x {a.cores_per_node} cores, at most {limit} ranks, "
          f"hidden {a.hidden}, {base.points:,} points, {a.epochs} epoch(s); best first:")
    print(" rank workers servers  batch  reader       init_s   train_s   total_s  s/epoch  bound")
    for i, r in enumerate(ranked[:a.top], 1):
        print(f"{i:5d} {r['workers']:7d} {r['servers']:7d} {r['batch']:6d}  {r['reader']:10s}"
              f"{_fmt_s(r['init_s'])} {_fmt_s(r['train_s'])} {_fmt_s(r['total_s'])} {r['per_epoch_s']:8.3f}  {r['bound']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
