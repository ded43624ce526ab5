"""Validation sweep of the performance model (`python -m asgd.perf`) against measured
asgd.train runs on this machine (the grid and the limits: docs/bench-suite.md; the results:
docs/benchmarks.md). Parameters come from `calibrate` first, or --params; nothing is fitted to
the sweep. A run at a rank count calibrate measured a job at is in sample, any other out of
sample, where the pass/fail limits apply. Then optimize over the measured grid: its top
configuration's measured total against the best measured. Writes model.csv, model.json and
model.png; exits 0 whether or not the model passes.

    python bench/bench_model.py                           # 60 runs, about 15 minutes
    python bench/bench_model.py --params params.json      # reuse a calibration
    python bench/bench_model.py --quick                   # 4 small runs, calibrate --quick: ~40 s
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import common  # first: pins threads, puts src/ on the path
import validate
from common import describe, int_list, print_table

PHASES = ("init", "train", "total")     # validated, pass/fail (asgd.perf's PHASES)
DETAIL = ("compute", "comm")            # reported only (asgd.perf's DETAIL)
LIMITS = {"total": 15.0, "init": 25.0, "train": 25.0}  # median APE, %
BIG_HIDDEN = 100_000                    # from this size on, the reduced grid (batches 64, 1024; one reader)
BIG_BATCHES = (64, 1024)
READERS = ("sequential", "parallel")


def parse_args(argv=None):
    p = common.parser(__doc__, "model", lock=True)
    p.add_argument("--points", type=int, default=100_000, help="training points (default 100,000)")
    p.add_argument("--test-points", type=int, default=2000, help="held-out points (default 2000)")
    p.add_argument("--workers", type=int_list, default=[1, 2, 3, 4, 6, 8], help="comma list (default 1,2,3,4,6,8)")
    p.add_argument("--batches", type=int_list, default=[16, 64, 256, 1024], help="comma list (default 16,64,256,1024)")
    p.add_argument("--hidden", type=int_list, default=[10000, 100000], help="comma list (default 10000,100000)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    p.add_argument("--params", type=Path, default=None,
                   help="parameters from 'python -m asgd.perf calibrate' (default: calibrate now into OUT/params.json)")
    p.add_argument("--seed", type=int, default=0, help="seed of the run order's shuffle (default 0)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--quick", action="store_true",
                   help="hidden 1000, workers 1,2, batch 64,256 (one reader each, alternating), 3 epochs, "
                        "20,000 points, calibrate --quick")
    a = p.parse_args(argv)
    if a.quick:
        a.points, a.workers, a.batches, a.hidden, a.timeout = 20_000, [1, 2], [64, 256], [1000], min(a.timeout, 60)
        # 3 epochs: one worker's single epoch at batch 256 trained 8 ms on a znver5 core, under
        # asgd.train's MIN_TRAIN_S, which compare (and so this bench) skips as too short to time
        a.epochs = 3
    return a


def plan(a) -> list[dict]:
    """The grid (measured in an order shuffled with --seed)."""
    ws, bs = sorted(set(a.workers)), sorted(set(a.batches))
    runs = []
    for h in sorted(set(a.hidden)):
        if a.quick:    # one reader per (workers, batch), alternating: both readers at every workers and batch
            runs += [(h, w, b, READERS[(i + j) % 2]) for i, w in enumerate(ws) for j, b in enumerate(bs)]
        elif h >= BIG_HIDDEN:   # the reduced grid: batches 64 and 1024, readers alternating over the workers
            big = [b for b in bs if b in BIG_BATCHES] or bs
            runs += [(h, w, b, READERS[i % 2]) for i, w in enumerate(ws) for b in big]
        else:
            runs += [(h, w, b, r) for w in ws for b in bs for r in READERS]
    return [dict(hidden=h, workers=w, batch=b, reader=r) for h, w, b, r in runs]


def label(c: dict) -> str:
    return f"h{c['hidden']}-w{c['workers']}-b{c['batch']}-{c['reader']}"


def train_argv(c: dict, data: Path, epochs: int) -> list[str]:
    """asgd.train's options for configuration c (its ranks: workers + 1)."""
    return ["--optimizer", "sgd", "--data", str(data), "--reader", c["reader"], "--batch", str(c["batch"]),
            "--hidden", str(c["hidden"]), "--epochs", str(epochs)]


def measure(configs: list[dict], data: Path, out: Path, a, source: str, failed: list, params,
            seed: int | None = None) -> list[dict]:
    """Run each configuration and compare it with the model: asgd.perf compare's row, with
    the source, launcher wall and sample (in: a rank count calibrate measured; out: any other)."""
    calibrated = validate.calibrated_ranks(params)

    def one(c):
        d = (out / "runs" / label(c)).resolve()
        job = validate.train_here(c["workers"] + 1, train_argv(c, data, a.epochs), d, a.timeout)
        res = validate.results(d)
        (row,) = validate.compare([str(d)], params) or [None]
        return row and {**row, "label": label(c), "source": source, "launch_wall_s": job["wall_s"],
                        "others_cores": job["others_cores"], "accuracy": res["metrics"].get("accuracy"),
                        "sample": "in" if c["workers"] + 1 in calibrated else "out"}
    def say(r):
        return (f"wall {r['launch_wall_s']:6.2f} s (job {r['total_meas_s']:.2f}: init {r['init_meas_s']:.2f} "
                f"+ train {r['train_meas_s']:.2f})")
    lost: list[dict] = []
    rows = validate.sweep(configs, one, label, say, seed=seed, lock=a.cpu_lock, failed=lost,
                          tag="[optimizer] " if source == "optimizer" else "")
    failed += [{**f, "source": source} for f in lost]
    return rows


def optimizer_check(rows: list[dict], params, data: Path, out: Path, a, failed: list) -> list[dict]:
    """Per hidden size: asgd.perf's optimize over exactly the grid measured at it (1 server, 1
    node of params.cores cores, at most max(workers) + 1 ranks); its top configuration
    (measured now, and added to `rows`, if the sweep did not) against the best measured."""
    checks = []
    def key(r):
        return (r["workers"], r["batch"], r["reader"])
    for h in sorted({r["hidden"] for r in rows}):
        at = [r for r in rows if r["hidden"] == h]
        ws, bs = sorted({r["workers"] for r in at}), sorted({r["batch"] for r in at})
        rs = [x for x in READERS if any(r["reader"] == x for r in at)]
        base = validate.Run(workers=1, hidden=h, epochs=a.epochs, **validate.data_of(str(data), None, "tsv", params))
        ranked = validate.optimize(params, 1, params.cores, base, ws, [1], bs, rs, max(ws) + 1)
        top = ranked[0]
        added = not any(key(r) == key(top) for r in at)
        if added:
            c = dict(hidden=h, workers=top["workers"], batch=top["batch"], reader=top["reader"])
            print(f"optimizer's top at hidden {h}, {label(c)}, was not measured: running it", flush=True)
            new = measure([c], data, out, a, "optimizer", failed, params)
            rows += new
            at += new
        got = validate.optimizer_check(ranked, at, key, lambda r: r["total_meas_s"])
        t = got["measured"] if got["first"] and key(got["first"]) == key(top) else None   # None: top failed to run
        best = got["best"]
        top_keys = ("workers", "servers", "batch", "reader", "ranks", "init_s", "train_s", "total_s", "bound")
        checks.append({"hidden": h, "grid": {"workers": ws, "batches": bs, "readers": rs, "servers": [1], "nodes": 1,
                                             "cores_per_node": params.cores, "max_ranks": max(ws) + 1},
                       "configurations": len(ranked),
                       "top": {**{k: top[k] for k in top_keys},
                               "label": t and t["label"], "total_meas_s": t and t["total_meas_s"]},
                       "top_added_run": added,
                       "best_measured": {k: best[k] for k in ("label", "workers", "batch", "reader", "total_meas_s",
                                                              "total_pred_s")},
                       "best_measured_predicted_rank": got["best_predicted_rank"], "top5_predicted": got["top5"],
                       "ratio": t and got["ratio"], "pass": bool(t) and got["pass"]})
    return checks


# -- summaries -----------------------------------------------------------------------------

def summarize(rows: list[dict]) -> dict:
    """APE per phase over the out-of-sample runs (pass/fail), the in-sample and all runs' beside."""
    out = [r for r in rows if r["sample"] == "out"]
    s = {}
    for k in PHASES + DETAIL:
        e = validate.score(out, f"{k}_ape")
        if e:
            s[k] = {**e, "in_sample": validate.score([r for r in rows if r["sample"] == "in"], f"{k}_ape"),
                    "all": validate.score(rows, f"{k}_ape"), "limit_median": LIMITS.get(k),
                    "pass": e["median"] <= LIMITS[k] if k in LIMITS else None,
                    "role": "validated (out of sample)" if k in LIMITS else "detail (not pass/fail)"}
    return s


def breakdown(rows: list[dict]) -> dict:
    """Median APE of every phase, and the signed median error of init, train and total, by
    each of reader, workers, batch, hidden."""
    def signed_pct(r, k):
        return (r[f"{k}_pred_s"] - r[f"{k}_meas_s"]) / r[f"{k}_meas_s"] * 100 if r[f"{k}_meas_s"] > 0 else None
    out = {}
    for dim in ("reader", "workers", "batch", "hidden"):
        out[dim] = {}
        for v in sorted({r[dim] for r in rows}):
            sub = [r for r in rows if r[dim] == v]
            out[dim][str(v)] = {"runs": len(sub), **{f"{k}_median_ape": validate.score(sub, f"{k}_ape")["median"]
                                                      for k in PHASES + DETAIL},
                                **{f"{k}_median_signed_pct": validate.errors(signed_pct(r, k) for r in sub)["median"]
                                   for k in PHASES}}
    return out


def report(rows, summary, checks, meta) -> None:
    print(f"\n{describe(meta['machine'], meta['load'])}")
    cols = [("hidden", "hidden", "d"), ("w", "workers", "d"), ("batch", "batch", "d"), ("reader", "reader", ""),
            ("sample", "sample", "")]
    for k in PHASES + DETAIL:
        cols += [(f"{k} pred", f"{k}_pred_s", ".3f"), (f"{k} meas", f"{k}_meas_s", ".3f"), ("APE%", f"{k}_ape", ".0f")]
    order = sorted(rows, key=lambda r: (r["hidden"], r["reader"], r["workers"], r["batch"]))
    print_table(order, cols, title=f"\npredicted / measured seconds and APE per run ({len(rows)} runs; "
                                   "compute, comm: a worker's, inside train)")
    n_out = sum(r["sample"] == "out" for r in rows)
    validate.print_scores(
        {k: {"out-of-sample": e, "in-sample": e["in_sample"],
             "extra": {"limit": f"<= {e['limit_median']:.0f}%" if e["limit_median"] else "-",
                       "verdict": validate.verdict(e["pass"]) if e["pass"] is not None else "detail, not pass/fail"}}
         for k, e in summary.items()}, "phase", extra=[("median limit", "limit", ""), ("verdict", "verdict", "")],
        title=f"\nAPE over {n_out} out-of-sample runs (rank counts calibrate never measured) and "
              f"{len(rows) - n_out} in-sample runs (validated: init, train, total; compute and comm are detail)")
    for c in checks:   # the rest of the check (its top 5, the best's predicted rank): model.json's optimizer
        ratio = f"{c['ratio']:.3f}" if c["ratio"] is not None else "-"
        print(f"optimizer, hidden {c['hidden']}: top predicted {c['top']['label'] or 'did not run'}, measured / best "
              f"measured ({c['best_measured']['label']}) = {ratio} (<= {validate.OPTIMIZER_LIMIT:.2f}): "
              f"{validate.verdict(c['pass'])}")


def plot(rows: list[dict], title: str, path: Path) -> None:
    plt = common.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.8), gridspec_kw={"width_ratios": [1, 1.15]})
    colors = {"init": "tab:blue", "train": "tab:orange", "total": "tab:green"}
    markers = {"sequential": "o", "parallel": "s"}
    meds = ", ".join(f"{k} {statistics.median(r[f'{k}_ape'] for r in rows):.0f}%" for k in PHASES)
    validate.pred_vs_meas(ax, [([r[f"{k}_meas_s"] for r in sub], [r[f"{k}_pred_s"] for r in sub],
                                dict(marker=mk, s=30, color=colors[k], alpha=0.75, edgecolor="k", linewidth=0.3,
                                     label=f"{k}, {rd}"))
                               for k in PHASES for rd, mk in markers.items()
                               if (sub := [r for r in rows if r["reader"] == rd])],
                          0.15, 1.5, "measured seconds", "predicted seconds",
                          f"predicted against measured, per phase and reader\n(median APE: {meds})")
    ax.set_aspect("equal")
    ax.legend(fontsize=7.5, loc="upper left", ncol=2)

    cmap = plt.get_cmap("viridis")
    bs = sorted({r["batch"] for r in rows})
    bcol = {b: cmap(i / max(len(bs) - 1, 1)) for i, b in enumerate(bs)}
    hs = sorted({r["hidden"] for r in rows})
    hmark = {h: m for h, m in zip(hs, ("o", "^", "D", "v", "P"))}
    ws = sorted({r["workers"] for r in rows})
    for r in rows:   # spread the batch sizes apart around each worker count
        dx = 2 ** ((bs.index(r["batch"]) - (len(bs) - 1) / 2) * 0.08)
        face = bcol[r["batch"]] if r["reader"] == "parallel" else "none"
        ax2.scatter(r["workers"] * dx, r["total_ape"], marker=hmark[r["hidden"]], s=42, facecolor=face,
                    edgecolor=bcol[r["batch"]], linewidth=1.3)
    ax2.axhline(LIMITS["total"], color="tab:red", ls="--", lw=1)
    med = statistics.median(r["total_ape"] for r in rows)
    ax2.axhline(med, color="k", ls=":", lw=1)
    h_ = [plt.Line2D([], [], color=bcol[b], marker="s", ls="", label=f"batch {b}") for b in bs]
    h_ += [plt.Line2D([], [], color="0.3", marker=hmark[h], ls="", mfc="0.3", label=f"hidden {h:,}") for h in hs]
    h_ += [plt.Line2D([], [], color="0.3", marker="o", ls="", mfc="0.3", label="filled: parallel reader"),
           plt.Line2D([], [], color="0.3", marker="o", ls="", mfc="none", label="hollow: sequential reader"),
           plt.Line2D([], [], color="tab:red", ls="--", label=f"{LIMITS['total']:.0f}% (limit on the median)"),
           plt.Line2D([], [], color="k", ls=":", label=f"median {med:.1f}%")]
    ax2.legend(handles=h_, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)  # off the points
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(ws, [str(w) for w in ws])
    common.decorate(ax2, "where the error of the total sits", 10, xlim=(min(ws) / 1.4, max(ws) * 1.4),
                    ylim=(0, max(max(r["total_ape"] for r in rows) * 1.15, LIMITS["total"] * 1.5)),
                    xlabel="workers (ranks = workers + 1)", ylabel="APE of total, % of measured")
    fig.suptitle(title, fontsize=11)
    common.save_figure(fig, path, bbox_inches="tight")


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    run = common.Run("model", a, load_every_s=None)   # the load: sampled during the sweep only
    out = run.out
    meta = {**run.head(), "points": a.points,
            "test_points": a.test_points, "epochs": a.epochs, "quick": a.quick, "seed": a.seed, "timeout_s": a.timeout,
            "limits": {"median_ape_pct": LIMITS, "optimizer_ratio": validate.OPTIMIZER_LIMIT},
            "run_command": "mpiexec -n W+1 python -m asgd.train --optimizer sgd --data D --reader R --batch B "
                           f"--hidden H --epochs {a.epochs} --quiet --out OUT/runs/hH-wW-bB-R"}
    configs = plan(a)
    if not configs:
        sys.exit("bench_model: nothing to run")
    data = validate.generate(out / "data" / "d.tsv", a.points, a.test_points)
    params_path, meta["calibrate_s"] = validate.params_file(a.params, out, a.quick, a.cpu_lock)
    params = validate.load_params(params_path)
    meta.update(params_file=str(params_path), params_calibrated_here=a.params is None)

    warm = dict(hidden=min(c["hidden"] for c in configs), workers=1, batch=max(c["batch"] for c in configs),
                reader="parallel")
    validate.warm_up(out, a.timeout, *train_argv(warm, data, a.epochs), lock=a.cpu_lock)

    run.sample_load()
    failed: list[dict] = []
    t_sweep = time.perf_counter()
    print(f"{len(configs)} runs, in an order shuffled with seed {a.seed}:", flush=True)
    rows = measure(configs, data, out, a, "sweep", failed, params, seed=a.seed)
    if not rows:
        sys.exit("bench_model: no run finished")
    checks = optimizer_check(rows, params, data, out, a, failed)
    meta.update(sweep_s=time.perf_counter() - t_sweep, load=run.load)
    summary = summarize(rows)
    parts = breakdown(rows)
    paper = validate.score(rows, "paper_total_ape")
    meta.update(paper_equations_total_ape=paper, summary=summary, breakdown=parts, optimizer=checks, failed=failed,
                runs=len(rows),
                passed={"median_ape": {k: summary[k]["pass"] for k in PHASES},
                        "optimizer": {str(c["hidden"]): c["pass"] for c in checks}})
    meta["passed"]["all"] = (all(meta["passed"]["median_ape"].values())
                             and all(meta["passed"]["optimizer"].values()))
    report(rows, summary, checks, meta)
    if failed:
        print(f"\n{len(failed)} run(s) failed and were skipped: " + ", ".join(label(f) for f in failed))
    meta["wall_s"] = time.perf_counter() - t_start
    run.write(rows, meta)
    run.plot(plot, rows, f"performance model vs {len(rows)} asgd.train runs, {a.points:,} points, {a.epochs} epoch(s); "
                         f"{meta['machine']['cores']} cores; parameters from calibrate only")
    print(f"\nsweep {meta['sweep_s']:.0f} s, all {meta['wall_s']:.0f} s")
    run.wrote()
    return 0


if __name__ == "__main__":
    sys.exit(main())
