"""The study behind asgd's defaults (issues 14 and 28): held-out accuracy of asgd across data
sets x worker counts x candidate settings (--rules: an lr rule per optimizer, in H and W;
or --variants: any asgd.train options), each against scikit-learn's MLPClassifier() on
bench_data's split, so a default is chosen for robustness (the best worst case); the
summary's columns: docs/bench-suite.md and the JSON's `columns`. Rows are appended to
defaults.csv as they finish (an interrupted study resumes; --fresh starts over); also
defaults.json and defaults.png.

    python bench/bench_defaults.py                               # the whole grid, seed 0 (hours on 2 cores)
    python bench/bench_defaults.py --datasets mnist,digits --workers 1,15,31 \\
        --variants "defaults=;sqrt=--stale-step sqrt"
    python bench/bench_defaults.py --summarize                   # the table from the rows already there
"""

import sys
from pathlib import Path

import common
from common import int_list

import csv
import functools
import math
import os
import statistics
import tempfile

import bench_data
from runs_report import difference, grouped, median

RULES = ("sgd=3/H,10/H,30/H,100/H;momentum=0.3/H,1/H,3/H,10/H;"
         "adagrad=0.003,0.01,0.03,0.1;adam=0.0003,0.001,0.003,0.01")


def named(spec: str | None) -> dict[str, str]:
    """"a=x;b=y" -> {"a": "x", "b": "y"} (the form of --rules and --variants)."""
    parts = (part.partition("=") for part in (spec or "").split(";") if part.strip())
    return {name.strip(): value for name, _, value in parts}


def lr_of(rule: str, hidden: int, workers: int) -> float:
    """A --rules formula of H, W and sqrt, typed by the person running the bench (no builtins)."""
    return float(eval(rule, {"__builtins__": {}}, {"H": hidden, "W": workers, "sqrt": math.sqrt}))


def parse_args(argv=None):
    p = common.parser(__doc__, "defaults")
    p.add_argument("--datasets", type=common.word_list, default=",".join(bench_data.DATASETS),
                   help=f"comma list of {', '.join(bench_data.DATASETS)} (default all)")
    p.add_argument("--workers", type=int_list, default=[1, 3, 15, 31], help="asynchronous workers (default 1,3,15,31)")
    p.add_argument("--seeds", type=int_list, default=[0], help="splits and initializations (default 0)")
    p.add_argument("--rules", default=RULES, help=f"optimizer=lr rule,...;... in H and W (default {RULES!r})")
    p.add_argument("--variants", help="NAME=asgd.train options;... to compare instead of --rules "
                   "(e.g. \"defaults=;sqrt=--stale-step sqrt\")")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="a run fails more than this below sklearn (default 0.03)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    p.add_argument("--summarize", action="store_true", help="run nothing: the summary of the rows in --out")
    p.add_argument("--fresh", action="store_true", help="discard the rows already in --out")
    a = p.parse_args(argv)
    a.variant_opts = {name: opts.split() for name, opts in named(a.variants).items()}
    a.rules = ([("variant", name) for name in a.variant_opts] if a.variants
               else [(opt, r.strip()) for opt, rules in named(a.rules).items() for r in rules.split(",") if r.strip()])
    return a


COLS = ["dataset", "seed", "workers", "ranks", "optimizer", "rule", "lr", "hidden", "epochs", "accuracy",
        "loss", "sklearn", "gap", "chance_loss", "diverged", "refused", "notes", "updates", "job_wall_s",
        "train_s", "failed", "loadavg_1min", "command", "test_loss_by_epoch", "train_loss_by_epoch"]


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("seed", "workers", "ranks", "hidden", "epochs", "refused", "updates"):
            r[k] = int(float(r[k])) if r.get(k) not in (None, "") else None
        for k in ("lr", "accuracy", "loss", "sklearn", "gap", "chance_loss", "job_wall_s", "train_s", "loadavg_1min"):
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
        r["diverged"] = r["diverged"] == "True"
    return rows


@functools.lru_cache(maxsize=None)
def chance(name: str, seed: int) -> tuple[float, float]:
    """(loss, accuracy) of predicting from the training split's class frequencies alone:
    the cross-entropy of those frequencies on the held-out split, and the held-out share of
    the training split's most frequent class. A run whose held-out accuracy ends at or
    below the latter learned nothing (or collapsed)."""
    import numpy as np
    _, ytr, _, yte = bench_data.split(name, seed)
    p = np.bincount(ytr, minlength=int(yte.max()) + 1) / len(ytr)
    return float(-np.mean(np.log(np.maximum(p[yte], 1e-12)))), float(np.mean(yte == np.argmax(p)))


def diverged(r: dict) -> bool:
    """Failed (a non-zero exit: diverged, timed out), refused updates, or a held-out accuracy
    no better than the majority class's (a held-out loss above chance with a good accuracy
    is an overconfident model, not a diverged one: counted apart, as overconfident)."""
    return bool(r.get("failed")) or bool(r.get("refused")) or r.get("accuracy") is None or (
        r["accuracy"] <= chance(r["dataset"], r["seed"])[1] + 1e-9)


def summarize(rows: list[dict], tolerance: float) -> dict:
    def stats(rs):
        gaps = [r["gap"] for r in rs if r["gap"] is not None]
        worst = min(rs, key=lambda r: r["gap"] if r["gap"] is not None else -9)
        return {"runs": len(rs), "diverged": sum(diverged(r) for r in rs),
                "overconfident": sum(1 for r in rs if r["loss"] is not None and r["loss"] > r["chance_loss"]),
                "worst_gap": round(min(gaps), 4) if len(gaps) == len(rs) else None,
                "worst_at": f"{worst['dataset']} W={worst['workers']} s{worst['seed']}",
                "median_gap": median(rs, "gap", 4),
                "mean_gap": round(statistics.fmean(gaps), 4) if gaps else None,
                "failing": sum(1 for r in rs if r["gap"] is None or r["gap"] < -tolerance)}
    table = []
    for (opt, rule), rs in grouped(rows, ("optimizer", "rule")).items():
        s = {"optimizer": opt, "rule": rule, **stats(rs)}
        for (name,), theirs in grouped(rs, ("dataset",)).items():
            s[f"worst_{name}"] = stats(theirs)["worst_gap"]
        for (w,), theirs in sorted(grouped(rs, ("workers",)).items()):
            s[f"worst_W{w}"] = stats(theirs)["worst_gap"]
        table.append(s)
    table.sort(key=lambda s: (s["diverged"], -(s["worst_gap"] if s["worst_gap"] is not None else -9)))
    return {"by_rule": table}


TABLE = [("optimizer", "optimizer", ""), ("lr", "rule", ""), ("runs", "runs", "d"), ("diverged", "diverged", "d"),
         ("overconf.", "overconfident", "d"), ("failing", "failing", "d"), ("worst gap", "worst_gap", "+.3f"),
         ("at", "worst_at", ""), ("median", "median_gap", "+.3f")]


def plot(rows, path):
    plt = common.pyplot()
    opts = list(dict.fromkeys(r["optimizer"] for r in rows))
    names = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(opts), figsize=(4.2 * len(opts), 4), sharey=True, squeeze=False)
    for ax, opt in zip(axes[0], opts):
        rules = list(dict.fromkeys(r["rule"] for r in rows if r["optimizer"] == opt))
        for name in names:   # a failed run's gap drawn at -1
            ax.plot(range(len(rules)), [min((r["gap"] if r["gap"] is not None else -1 for r in rows if
                                             (r["optimizer"], r["rule"], r["dataset"]) == (opt, rule, name)),
                                            default=float("nan")) for rule in rules], "o-", label=name)
        ax.axhline(-0.03, color="k", ls="--", lw=1)
        ax.set_xticks(range(len(rules)), rules, rotation=30, fontsize=8)
        ax.set(title=opt, ylim=(-0.6, 0.1))
    axes[0][0].set_ylabel("worst gap to sklearn over workers and seeds")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("asgd held-out accuracy minus sklearn's, async, 1 server (measured here)", fontsize=10)
    common.save_figure(fig, path, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    run = common.Run("defaults", args, bandwidth=False)
    path = run.out / "defaults.csv"   # one row per run, appended as each ends: an interrupted sweep resumes
    if args.fresh and path.exists():
        path.unlink()
    if not args.summarize:
        done = {(r["dataset"], r["seed"], r["workers"], r["optimizer"], r["rule"]) for r in read_rows(path)}
        with tempfile.TemporaryDirectory(prefix="asgd-bench-defaults-") as folder:
            for seed in args.seeds:
                for name in args.datasets:
                    todo = [(w, o, r) for w in args.workers for o, r in args.rules
                            if (name, seed, w, o, r) not in done]
                    if not todo:
                        continue
                    data = bench_data.write_split(name, seed, Path(folder))
                    sk = bench_data.run_sklearn(name, seed)["accuracy"]
                    chance_l = chance(name, seed)[0]
                    p = bench_data.protocol(name)
                    for w, opt, rule in todo:
                        if opt == "variant":
                            lr, extra = None, args.variant_opts[rule]
                        else:
                            lr = lr_of(rule, p.hidden, w)
                            extra = ["--optimizer", opt, "--lr", repr(lr)]
                        r = bench_data.run_asgd(name, seed, w + 1, data, args.timeout, extra)
                        acc = r.get("accuracy")
                        row = {**r, "optimizer": opt, "rule": rule, "lr": r.get("lr") if lr is None else lr,
                               "hidden": r.get("hidden", p.hidden), "epochs": r.get("epochs", p.epochs),
                               "sklearn": sk, "gap": difference(acc, sk),
                               "chance_loss": round(chance_l, 4), "diverged": diverged(r),
                               "loadavg_1min": round(os.getloadavg()[0], 2)}
                        # defaults.csv rewritten with the row added, in today's COLS (an older file's rows too)
                        common.write_csv(path, [{k: r.get(k) for k in COLS} for r in [*read_rows(path), row]])
                        print(f"  s{seed} {name:<13} W={w:<2} {opt:<8} {rule:<8} lr {row['lr'] or 0:<9.3g} gap "
                              f"{common.fmt(row['gap'], '+.3f')}{' DIVERGED' if row['diverged'] else ''} "
                              f"{r.get('failed') or ''}", flush=True)
    rows = [r for r in read_rows(path) if r["dataset"] in args.datasets]
    summary = summarize(rows, args.tolerance)
    by_h = {str(h): summarize([r for r in rows if r["hidden"] == h], args.tolerance)["by_rule"]
            for h in sorted({r["hidden"] for r in rows})}
    info = run.meta(
        protocol={n: bench_data.protocol(n)._asdict() for n in args.datasets}, tolerance=args.tolerance,
        columns={"gap": "asgd accuracy - sklearn MLPClassifier's on the same split and seed",
                 "diverged": "non-zero exit, refused updates, or held-out accuracy <= the majority class's share",
                 "overconfident": "held-out loss above chance_loss (predicting the class frequencies)",
                 "worst_gap": "min gap over data sets, workers and seeds",
                 "failing": f"runs with gap < -{args.tolerance}"},
        **summary, by_hidden=by_h)
    run.paths += [path, common.write_json(run.out / "defaults.json", info)]
    if rows:
        run.plot(plot, rows)
    names = list(dict.fromkeys(r["dataset"] for r in rows))
    head, worst = TABLE[:4], TABLE[-3:]   # the per-hidden tables: without overconfident and failing
    common.print_table(summary["by_rule"], TABLE + [(n, f"worst_{n}", "+.3f") for n in names],
                       title=f"gap to sklearn (asgd - sklearn), async, 1 server; failing: < -{args.tolerance}")
    for h, table in by_h.items():
        common.print_table(table, head + worst, title=f"hidden {h} only")
    run.print_machine()
    run.wrote()
    return 0


if __name__ == "__main__":
    sys.exit(main())
