"""The paper's Figures 2, 3, 4 and 9 (Hashemi et al. 2016) measured on this machine with asgd.train.

Every point is one `mpiexec -n N python -m asgd.train --optimizer sgd --epochs E` run, shared
between the figures and run in a shuffled order; Figure 9 overlays asgd.perf.analytic's
prediction (--params, or a calibrate run first). Writes paper.csv (a row per run),
paper.json and figure{2,3,4,9}.png.

    python bench/paper_figures.py                 # ranks 2,4,8,16; batch 16..1024; 2 epochs
    python bench/paper_figures.py --quick         # ranks 2,8; batch 64,256,1024; 1 epoch
"""

import sys
from pathlib import Path

import common
from common import int_list

import itertools
import json
import operator
import statistics
import textwrap

import validate


def parse_args(argv=None):
    p = common.parser(__doc__, "paper", plot=False)
    p.add_argument("--ranks", type=int_list, default=[2, 4, 8, 16], help="MPI ranks (default 2,4,8,16)")
    p.add_argument("--batches", type=int_list, default=[16, 64, 256, 1024], help="Figure 2's batch sizes")
    p.add_argument("--fig4-batches", type=int_list, default=[8, 16, 32, 64, 128, 256, 512, 1024],
                   help="Figure 4's batch sizes (default 8..1024)")
    p.add_argument("--fig4-ranks", type=int_list, default=[2, 4, 8], help="Figure 4's rank counts (default 2,4,8)")
    p.add_argument("--hidden", type=int_list, default=[10000, 100000], help="Figure 3's hidden sizes")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    p.add_argument("--repeat", type=int, default=1, help="runs per point, medians (default 1)")
    p.add_argument("--quick", action="store_true", help="ranks 2,8, batch 64,256,1024, 1 epoch")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    p.add_argument("--params", type=Path, help="performance-model parameters for Figure 9 "
                   "(default: calibrate into <out>/params.json first)")
    p.add_argument("--replot", action="store_true", help="no runs: redraw the figures from <out>/paper.json")
    a = p.parse_args(argv)
    if a.quick:
        a.ranks, a.batches, a.fig4_batches, a.fig4_ranks, a.epochs = [2, 8], [64, 256, 1024], [64, 256, 1024], [2, 8], 1
    return a


def plan(a) -> list[tuple[int, int, int]]:
    """(ranks, hidden, batch) of every run the four figures need, once each."""
    pts = {(n, 10000, b) for n in a.ranks for b in a.batches}                       # Figure 2 (and 9)
    big = [n for n in a.ranks if not a.quick or n in (min(a.ranks), max(a.ranks))]
    pts |= {(n, h, 256) for n in big for h in a.hidden} | {(n, 10000, 256) for n in a.ranks}   # Figure 3, 9
    pts |= {(n, 10000, b) for n in a.fig4_ranks for b in a.fig4_batches}             # Figure 4
    return sorted(pts)


def run_once(c: dict, a) -> dict:
    n, hidden, batch = c["ranks"], c["hidden"], c["batch"]
    r, job = common.train_job(n, ["-m", "asgd.train", "--optimizer", "sgd", "--hidden", str(hidden), "--batch",
                                  str(batch), "--epochs", str(a.epochs), "--quiet", "--timeout", str(a.timeout - 10)],
                              a.timeout)
    if r["throughput"]["samples_per_s"] is None:   # the figures plot rates: a run too short for one is no point
        raise SystemExit(f"paper_figures: {n} ranks, hidden {hidden}, batch {batch}: no samples/s "
                         f"({r['throughput'].get('no_rate')}); give more --epochs")
    busy = [x.get("busy_pct") for x in r["profile"]["ranks"] if x.get("busy_pct") is not None]
    return {"workers": r["config"]["workers"], "epochs": a.epochs,
            "wall_s": round(r["wall_s"], 3), "init_s": round(r["init_s"], 3), "train_s": round(r["train_s"], 3),
            "train_s_per_epoch": round(r["train_s"] / a.epochs, 3), "job_wall_s": round(job["wall_s"], 3),
            "samples_per_s": round(r["throughput"]["samples_per_s"], 1),
            "updates_per_s": round(r["throughput"]["updates_per_s"], 1),
            "accuracy": round(r["metrics"]["accuracy"], 4), "bound": r["profile"]["bound"],
            "server_busy_pct": max(busy) if busy else None, "oversubscribed": r["config"].get("oversubscribed")}


MEDIANS = ("wall_s", "init_s", "train_s", "train_s_per_epoch", "job_wall_s", "samples_per_s", "updates_per_s")


def median_rows(rows):
    """A row per (ranks, hidden, batch): its first run's, with its runs' median times and rates."""
    point = operator.itemgetter("ranks", "hidden", "batch")
    return [{**rs[0], **{f: statistics.median(r[f] for r in rs) for f in MEDIANS}, "runs": len(rs)}
            for rs in (list(g) for _, g in itertools.groupby(sorted(rows, key=point), point))]


def pick(rows, **kw):
    return sorted((r for r in rows if all(r[k] == v for k, v in kw.items())), key=lambda r: (r["ranks"], r["batch"]))


def perf_model(a):
    """(params file, Params) for the Figure 9 overlay: --params, or a fresh calibration
    into <out>/params.json (--quick: a quick one), or (None, why not)."""
    path = a.params or a.out / "params.json"
    try:
        if not a.params and not (a.replot and path.exists()):
            path = validate.calibrate(a.out, a.quick)[0]
        return str(path), validate.load_params(path)
    except SystemExit as e:   # the figures without the model's overlay, and why
        return None, str(e)


def predict(params, row) -> dict:
    """asgd.perf.analytic's init/train/total seconds for one row (the embedded problem)."""
    pr = validate.model_predict(params, validate.Run(workers=row["workers"], servers=1, hidden=row["hidden"],
                                                        batch=row["batch"], epochs=row["epochs"],
                                                        **validate.data_of(None, None, "embedded", params)))
    return {"init_s": pr.init_s, "train_s": pr.train_s, "wall_s": pr.total_s}


RANKS = "MPI ranks (1 server + N-1 workers)"


def finish(fig, ax, xs, xlabel, ylabel, title, path, grid="major", note=None, width=110):
    """What every figure ends with: a log-2 x axis (ticks 2, 4, 8, not 2^1, 2^2, 2^3), labels,
    grid and legend, a note in small print under the plot if there is one, and the file."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(xs), [str(v) for v in sorted(xs)])
    ax.minorticks_off()
    common.decorate(ax, title, 10, legend={"fontsize": 8}, grid={"which": grid}, xlabel=xlabel, ylabel=ylabel)
    rect = None
    if note:
        text = textwrap.fill(note, width)
        fig.text(0.01, 0.01, text, fontsize=7, va="bottom")
        rect = (0, 0.025 * (text.count("\n") + 2), 1, 1)   # room for the note's lines
    common.save_figure(fig, path, rect=rect)


def figure2(rows, batches, path):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    for b in sorted(batches):
        rs = pick(rows, hidden=10000, batch=b)
        if len({r["ranks"] for r in rs}) > 1:   # a line, not a point
            ax.plot([r["ranks"] for r in rs], [r["wall_s"] for r in rs], marker="o", label=f"batch {b}")
    finish(fig, ax, {r["ranks"] for r in rows}, RANKS, "total time, s (results.json wall_s)",
           "Figure 2 on this machine: scalability by batch size, 2-10K-2", path)


def figure3(rows, path):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    for h, mk in zip(sorted({r["hidden"] for r in rows}), "os^"):
        rs = pick(rows, hidden=h, batch=256)
        ax.plot([r["ranks"] for r in rs], [r["wall_s"] for r in rs], marker=mk, label=f"2-{h // 1000}K-2 total")
        ax.plot([r["ranks"] for r in rs], [r["train_s"] for r in rs], marker=mk, ls=":", alpha=0.7,
                label=f"2-{h // 1000}K-2 training only")
    finish(fig, ax, {r["ranks"] for r in rows}, RANKS, "time, s",
           "Figure 3 on this machine: 10K vs 100K hidden units, batch 256", path)


def cache_jump(rows, fig4_ranks) -> tuple[list[str], bool]:
    """The paper's cache jump: training time per epoch falls with the batch size, then jumps up
    (there about 100x). Here: a rise of > 50% from one batch size to the next larger, at the same
    step for at least two rank counts (one if only one was measured); a rise at one rank count
    alone is reported as isolated (a single run on a loaded machine can vary that much)."""
    rises = {}
    for n in fig4_ranks:
        per = [(r["batch"], r["train_s_per_epoch"]) for r in pick(rows, hidden=10000, ranks=n)]
        rises[n] = {(b0, b1): t1 / t0 for (b0, t0), (b1, t1) in zip(per, per[1:]) if t1 > 1.5 * t0}
    steps = {step: [n for n in fig4_ranks if step in rises[n]] for step in set().union(*rises.values())}
    need = min(2, len(fig4_ranks))
    jumps = {step: ns for step, ns in steps.items() if len(ns) >= need}
    lines = [f"batch {b0} -> {b1}: time per epoch x{', x'.join(f'{rises[n][(b0, b1)]:.2f}' for n in ns)} "
             f"at {', '.join(map(str, ns))} ranks" + ("" if (b0, b1) in jumps else " (isolated: likely noise)")
             for (b0, b1), ns in sorted(steps.items())]
    return lines or ["time per epoch never rises > 50% from one batch size to the next larger"], bool(jumps)


def figure4(rows, fig4_ranks, verdict, path):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.6))
    for n in fig4_ranks:
        rs = pick(rows, hidden=10000, ranks=n)
        ax.plot([r["batch"] for r in rs], [r["train_s_per_epoch"] for r in rs], marker="o", label=f"{n} ranks")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(plt.matplotlib.ticker.FormatStrFormatter("%g"))
    finish(fig, ax, {r["batch"] for r in rows if r["ranks"] in fig4_ranks}, "batch size",
           "training time per epoch, s (log)", "Figure 4 on this machine: effect of batch size, 2-10K-2", path,
           grid="both", note=verdict, width=120)


def figure9(rows, model, path):
    plt = common.pyplot()
    name, params = model  # (params file, Params), or (None, why there is no model)
    rs = pick(rows, hidden=10000, batch=256)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    x = [r["ranks"] for r in rs]
    series = [(rs, {"marker": "o"}, "measured")]
    if name:
        series.append(([predict(params, r) for r in rs], {"ls": "--"}, "asgd.perf.analytic"))
    for points, style, source in series:
        for key, label, color in (("init_s", "initialization", "tab:blue"), ("train_s", "training", "tab:red"),
                                  ("wall_s", "total", "k")):
            ax.plot(x, [p[key] for p in points], color=color, label=f"{label} ({source})", **style)
    note = None if name else f"no model overlay: {params}"
    finish(fig, ax, x, RANKS, "seconds", "Figure 9 on this machine: phase by phase, 2-10K-2, batch 256", path,
           note=note)
    return note


def measure(a) -> list[dict]:
    validate.warm_up(a.out, a.timeout, "--epochs", "1")
    common.fresh_dir(a.out / "warmup")   # no run of it left among the figures' runs
    return validate.sweep([{"ranks": n, "hidden": h, "batch": b} for n, h, b in plan(a) * a.repeat],
                          lambda c: run_once(c, a),
                          lambda c: f"n={c['ranks']:>2} 2-{c['hidden']}-2 batch {c['batch']:>4}",
                          lambda r: f"wall {r['wall_s']:6.2f} s (init {r['init_s']:.2f}, train {r['train_s']:.2f}), "
                                    f"{r['samples_per_s']:,.0f} samples/s, bound: {r['bound']}", seed=0)


def main(argv=None):
    a = parse_args(argv)
    run = common.Run("paper", a, measure=not a.replot)
    if a.replot:   # the runs, machine, load and options of the run that measured them
        old = json.loads((run.out / "paper.json").read_text())
        raw = old["runs"]
        for k in ("epochs", "repeat", "batches", "fig4_ranks"):
            setattr(a, k, old["args"][k])
    else:
        raw = measure(a)
    rows = median_rows(raw)
    jump_lines, jump = cache_jump(rows, a.fig4_ranks)
    verdict = ("Cache jump: " + ("yes. " if jump else "no. ") + "; ".join(jump_lines)
               + f" ({a.repeat} run(s) per point, {a.epochs} epoch(s) each; load average in paper.json)")
    model = perf_model(a)
    run.plot(figure2, rows, a.batches, name="figure2")
    run.plot(figure3, rows, name="figure3")
    run.plot(figure4, rows, a.fig4_ranks, verdict, name="figure4")
    note9 = run.plot(figure9, rows, model, name="figure9")
    info = run.meta(
        **({k: old[k] for k in ("machine", "load", "command", "args")} if a.replot else {}),
        figure4_cache_jump={"jump": jump, "by_ranks": jump_lines,
                            "why": "" if jump else "asgd's kernel works in sample blocks of <= 32 rows whose hidden "
                                   "activations stay in L2 whatever the batch, so the working set does "
                                   "not grow with the batch size (the paper's CNTK step did)"},
        figure9_model=note9 or f"asgd.perf.analytic with parameters from {model[0]}",
        columns={"wall_s": "results.json wall_s (rank 0, process start to end of training)",
                 "init_s": "slowest rank's init phase",
                 "train_s": "results.json train_s (last init end to last training end)",
                 "train_s_per_epoch": "train_s / epochs", "job_wall_s": "mpiexec start to exit",
                 "runs": "runs whose median this row is"},
        runs=raw)
    run.write(rows, info)
    print(common.describe(info["machine"], info["load"]))
    common.print_table(rows, [("ranks", "ranks", "d"), ("hidden", "hidden", "d"), ("batch", "batch", "d"),
                              ("wall s", "wall_s", ".2f"), ("init s", "init_s", ".2f"), ("train s", "train_s", ".2f"),
                              ("samples/s", "samples_per_s", ",.0f"), ("server busy %", "server_busy_pct", ".0f"),
                              ("bound", "bound", "")])
    print(f"Figure 4: {verdict}")
    print(f"Figure 9: {note9 or 'asgd.perf.analytic overlaid, parameters from ' + model[0]}")
    run.wrote()
    return 0


if __name__ == "__main__":
    sys.exit(main())
