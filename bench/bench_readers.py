"""Initialization against workers for the two readers: the paper's finding (sec. 5.2.2, 5.3:
every rank reads the whole file in turn, eq. 12) and its fix (`--reader parallel`).

Per workers w and reader: `mpiexec -n w+1 python -m asgd.train --data FILE --reader R
--epochs 1 --hidden 100`, its init_s and the slowest rank's read + parse + shuffle, beside
eq. 12 (r_d calibrated on the 1-worker sequential run). Writes readers.csv, readers.json,
readers.png; prints the sequential reader's slope and R^2, and parallel / sequential at 8.
--baseline REV runs every job again from a checkout of REV, interleaved.

    python bench/bench_readers.py                 # 1,000,000 points, workers 1,2,4,8,16
    python bench/bench_readers.py --quick         # 100,000 points, workers 1,2,4,8
    python bench/bench_readers.py --workers 1 --repeat 3 --baseline 7e950d0   # the parser before/after
"""

from __future__ import annotations

import sys
from pathlib import Path

import common  # first: pins threads, puts src/ on the path
import validate
from common import int_list

import itertools

import numpy as np

TEST_POINTS = 4096  # a small held-out file: the bench is about the training file


def parse_args(argv=None):
    p = common.parser(__doc__, "readers")
    p.add_argument("--points", type=int, default=1_000_000, help="training points in the file (default 1,000,000)")
    p.add_argument("--workers", type=int_list, default=[1, 2, 4, 8, 16], help="comma list (default 1,2,4,8,16)")
    p.add_argument("--format", type=common.choice_list(("tsv", "npy")), default="tsv",
                   help="tsv, npy or tsv,npy (default tsv)")
    p.add_argument("--repeat", type=int, default=1, help="runs per (format, reader, workers); the median counts")
    p.add_argument("--quick", action="store_true", help="100,000 points, workers 1,2,4,8")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--baseline", metavar="REV", help="also run a checkout of this commit, interleaved")
    a = p.parse_args(argv)
    if a.quick:
        a.points, a.workers = 100_000, [1, 2, 4, 8]
    return a


def run_once(path: Path, reader: str, workers: int, timeout: float, tree: str = "this",
             src: Path | None = None) -> dict:
    """One job, of this tree or (src: its src/ folder) a baseline's."""
    res, _ = common.train_job(workers + 1,
                              ["-m", "asgd.train", "--data", str(path), "--reader", reader, "--epochs", "1",
                               "--hidden", "100", "--batch", "1024", "--quiet", "--timeout", str(timeout)],
                              timeout + 30, env={"PYTHONPATH": str(src)} if src else None)
    ranks = res["ranks"]
    def sub(r):
        return sum(r["phases"].get(k, 0.0) for k in ("read", "parse", "shuffle"))
    slowest = max(ranks, key=lambda r: r["phases"]["init"])
    return {"tree": tree, "format": path.suffix[1:], "reader": reader, "workers": workers, "ranks": len(ranks),
            "points": res["config"]["train_points"], "features": res["config"]["features"],
            "init_s": res["init_s"], "data_s": max(sub(r) for r in ranks),
            **{f"{k}_s": max(r["phases"][k] for r in ranks) for k in ("read", "parse", "shuffle")},
            "rest_s": slowest["phases"]["init"] - sub(slowest),  # imports, JIT, model: not the reader
            "wall_s": res["wall_s"], "accuracy": res["metrics"]["accuracy"]}


def fit(x, y) -> dict:
    b, a, r2 = common.linear_fit(x, y)
    return {"slope_s_per_worker": b, "intercept_s": a, "r2": r2}


def model(rows: list[dict], fmt: str) -> dict | None:
    """Eq. 12 for asgd's sequential reader, r_d from the 1-worker run (2 ranks read)."""
    one = next((r for r in rows if r["format"] == fmt and r["reader"] == "sequential" and r["workers"] == 1), None)
    if one is None:
        return None
    t_disk = one["data_s"] / one["ranks"]  # one rank's turn: read + parse the whole file
    r_d = t_disk / (8 * one["features"] * one["points"])
    return {"T_disk_s": t_disk, "r_d_s_per_byte": r_d, "calibrated_on": "sequential, 1 worker",
            "predict": "data(w) = (w + 1) * r_d * 8 * n_f * d;  init(w) = init(1) + (w - 1) * T_disk"}


def summarize(rows: list[dict], formats: list[str]) -> dict:
    out = {}
    for fmt in formats:
        seq = sorted((r for r in rows if r["format"] == fmt and r["reader"] == "sequential"),
                     key=lambda r: r["workers"])
        par = {r["workers"]: r for r in rows if r["format"] == fmt and r["reader"] == "parallel"}
        s = {"model": model(rows, fmt)}
        if len(seq) >= 2:
            s["sequential_init_fit"] = fit([r["workers"] for r in seq], [r["init_s"] for r in seq])
            s["sequential_data_fit"] = fit([r["workers"] for r in seq], [r["data_s"] for r in seq])
        at8 = next((r for r in seq if r["workers"] == 8), None)
        if at8 and 8 in par:
            s["ratio_at_8_workers"] = {"init": par[8]["init_s"] / at8["init_s"],
                                       "data": par[8]["data_s"] / at8["data_s"]}
        out[fmt] = s
    return out


def plot(rows, summary, points, path):
    plt = common.pyplot()
    formats = list(summary)
    fig, axes = plt.subplots(len(formats), 2, figsize=(11, 4.2 * len(formats)), squeeze=False)
    colors = {"sequential": "tab:red", "parallel": "tab:blue"}
    for (ax_init, ax_data), fmt in zip(axes, formats):
        m = summary[fmt]["model"]
        for reader in ("sequential", "parallel"):
            rs = sorted((r for r in rows if r["format"] == fmt and r["reader"] == reader), key=lambda r: r["workers"])
            if not rs:
                continue
            w = [r["workers"] for r in rs]
            ax_init.plot(w, [r["init_s"] for r in rs], "o-", color=colors[reader], label=f"{reader}: init_s")
            ax_init.plot(w, [r["rest_s"] for r in rs], ":", color=colors[reader], alpha=0.6,
                         label=f"{reader}: init less the reader")
            ax_data.plot(w, [r["data_s"] for r in rs], "o-", color=colors[reader], label=reader)
        if m:
            seq1 = next(r for r in rows if r["format"] == fmt and r["reader"] == "sequential" and r["workers"] == 1)
            ws = np.array(sorted({r["workers"] for r in rows if r["format"] == fmt}))
            ax_data.plot(ws, (ws + 1) * m["T_disk_s"], "--", color="k",
                         label=f"eq. 12: (w+1) x T_disk(d), r_d = {m['r_d_s_per_byte'] * 1e9:.2f} ns/B")
            ax_init.plot(ws, seq1["init_s"] + (ws - 1) * m["T_disk_s"], "--", color="k",
                         label="eq. 12 from the 1-worker init")
        for ax, title in ((ax_init, "job init (init_s)"), (ax_data, "reader: read + parse + shuffle")):
            common.decorate(ax, f"{title}, {points:,} points, {fmt}", 10, legend={"fontsize": 8},
                            xlabel="workers (ranks = workers + 1)", ylabel="seconds")
    common.save_figure(fig, path)


def main(argv=None) -> int:
    a = parse_args(argv)
    run = common.Run("readers", a, load_every_s=None, bandwidth=False)   # the load: sampled after the warm-up
    files = {fmt: validate.generate(run.out / f"rings-{a.points}.{fmt}", a.points, TEST_POINTS) for fmt in a.format}
    trees = {"this": None, **({f"baseline {a.baseline}": common.worktree(a.baseline, run.out) / "src"}
                              if a.baseline else {})}
    print("warming numba's caches (not timed) ...", flush=True)
    for tree, src in trees.items():
        run_once(files[a.format[0]], "parallel", 1, a.timeout, tree, src)
    run.sample_load()
    all_rows = []
    for w, fmt in itertools.product(a.workers, a.format):
        runs = {(tree, reader): [] for tree in trees for reader in ("sequential", "parallel")}
        for i in range(a.repeat):
            for tree, reader in common.rotated(list(runs), i):   # load changes hit all alike
                runs[tree, reader].append(run_once(files[fmt], reader, w, a.timeout, tree, trees[tree]))
        for (tree, reader), rs in runs.items():   # the median run, by init_s
            all_rows.append(r := {**sorted(rs, key=lambda r: r["init_s"])[len(rs) // 2], "repeats": len(rs)})
            print(f"  {tree:18} {fmt} {reader:10} w={w:2}: init {r['init_s']:6.2f} s, reader "
                  f"{r['data_s']:6.2f} s, parse {r['parse_s']:6.3f} s", flush=True)
    meta = {"machine": run.machine, "points": a.points, "test_points": TEST_POINTS, "workers": a.workers,
            "formats": a.format, "repeat": a.repeat, "load": run.load,
            "command": "mpiexec -n w+1 python -m asgd.train --data FILE --reader R --epochs 1 --hidden 100 "
                       "--batch 1024"}
    rows = [r for r in all_rows if r["tree"] == "this"]
    if a.baseline:
        base = {(r["format"], r["reader"], r["workers"]): r["parse_s"] for r in all_rows if r["tree"] != "this"}
        meta["parse_vs_baseline"] = {f"{r['format']} {r['reader']} w={r['workers']}": {
            "this_parse_s": r["parse_s"], "baseline_parse_s": (b := base[r["format"], r["reader"], r["workers"]]),
            "ratio": r["parse_s"] / b} for r in rows}
    meta["summary"] = summary = summarize(rows, a.format)
    lines = []
    for fmt, s in summary.items():
        if "sequential_init_fit" in s:
            f, g = s["sequential_init_fit"], s["sequential_data_fit"]
            lines.append(f"{fmt}: sequential init vs workers: slope {f['slope_s_per_worker']:.3f} s/worker, R^2 "
                         f"{f['r2']:.4f} (reader part: {g['slope_s_per_worker']:.3f} s/worker, R^2 {g['r2']:.4f})")
        if s.get("model"):
            lines.append(f"{fmt}: eq. 12 calibration: T_disk(d) = {s['model']['T_disk_s']:.3f} s, "
                         f"r_d = {s['model']['r_d_s_per_byte'] * 1e9:.3f} ns per byte of doubles")
        if "ratio_at_8_workers" in s:
            q = s["ratio_at_8_workers"]
            lines.append(f"{fmt}: parallel / sequential at 8 workers: init {q['init']:.3f}, "
                         f"reader part {q['data']:.3f}")
    lines += [f"{k}: parse {v['this_parse_s']:.3f} s against {v['baseline_parse_s']:.3f} s at {a.baseline}: "
              f"{v['ratio']:.3f}x" for k, v in meta.get("parse_vs_baseline", {}).items()]
    print()
    common.report(run, all_rows, meta, plot, all_rows, [
        ("tree", "tree", ""), ("format", "format", ""), ("reader", "reader", ""), ("workers", "workers", "d"),
        ("init_s", "init_s", ".2f"), ("reader_s", "data_s", ".2f"), ("read", "read_s", ".2f"),
        ("parse", "parse_s", ".2f"), ("shuffle", "shuffle_s", ".2f"), ("rest", "rest_s", ".2f"),
        ("accuracy", "accuracy", ".3f")], lines, f"init (s) by reader and workers, {a.points:,} points (reader_s: "
        "slowest rank's read+parse+shuffle; rest: the slowest rank's init less that)", data=(rows, summary, a.points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
