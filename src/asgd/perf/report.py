"""python -m asgd.perf report RUN_DIR [RUN_DIR ...] [--out DIR]: the paper's profiling
figures from results.json files (needs matplotlib: pip install -e '.[plot]'). A RUN_DIR
may be a sweep's folder (slurm/sweep.sbatch's: n<K>/results.json per run).

  profile.png   per-rank stacked bars of the wall time by phase (the paper's Figure 5, IPM)
  timeline.png  per-rank timeline: initialization against training (Figure 6, TAU)
  scaling.png   with several runs: init, training and total time against workers (Figure 9)

The figures the HTML page adds (asgd.perf.html, --html) are drawn here too: the held-out
curve, the staleness histogram, the servers' busy share, the bytes, predicted against measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

COLORS = {"init": "#4c72b0", "read": "#64b5cd", "parse": "#8172b2", "shuffle": "#ccb974",
          "compute": "#dd8452", "push": "#937860", "comm_wait": "#55a868", "aggregate": "#c44e52",
          "evaluate": "#da8bc3", "idle": "#bbbbbb"}
STACK = ["init", "compute", "push", "comm_wait", "aggregate", "evaluate", "idle"]  # they add up to wall


def load(run_dir: str) -> dict:
    path = run_dir if run_dir.endswith(".json") else os.path.join(run_dir, "results.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"asgd.perf report: error: cannot read {path}: {e}")


def expand(run_args: list[str]) -> list[str]:
    """The runs the arguments name: a run folder or results.json as given, a sweep's folder
    (no results.json of its own) as the runs in its subfolders, in name order."""
    runs = []
    for arg in run_args:
        inner = sorted(os.path.join(arg, d) for d in os.listdir(arg)
                       if os.path.isfile(os.path.join(arg, d, "results.json"))) \
            if os.path.isdir(arg) and not os.path.exists(os.path.join(arg, "results.json")) else []
        runs += inner or [arg]   # none inside: load() names the missing results.json
    return runs


def default_out(run_args: list[str]) -> str:
    """Where the report goes without --out: the first RUN_DIR (a file's folder)."""
    first = run_args[0]
    return first if os.path.isdir(first) else os.path.dirname(first) or "."


def describe(r: dict) -> str:
    """A run's shape in one line: ranks, workers, the MLP, batch, reader."""
    c = r["config"]
    return (f"{c['world_size']} ranks ({c['workers']} workers), {c['features']}-{c['hidden']}-{c['classes']}, "
            f"batch {c['batch']}, {c.get('reader', 'simple')} reader")


def profile_png(r: dict, path: str, plt) -> None:
    ranks = r["ranks"]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(ranks) + 2), 4))
    bottom = [0.0] * len(ranks)
    for ph in STACK:
        vals = [100 * x["phases"].get(ph, 0.0) / max(sum(x["phases"].get(p, 0) for p in STACK), 1e-9)
                for x in ranks]
        if any(vals):
            ax.bar(range(len(ranks)), vals, bottom=bottom, color=COLORS[ph], label=ph, width=0.8)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(ranks)), [f"{x['rank']}\n{x['role'][0]}" for x in ranks], fontsize=8)
    ax.set_xlabel("rank (s: server, w: worker)")
    ax.set_ylabel("% of the rank's wall time")
    ax.set_ylim(0, 100)
    ax.set_title(f"Where each rank's time goes: {describe(r)}\nverdict: {r['profile']['bound']}-bound",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.13), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def timeline_png(r: dict, path: str, plt) -> None:
    ranks = r["ranks"]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.3 * len(ranks) + 1.2)))
    for x in ranks:
        t = x["timeline"]
        ax.barh(x["rank"], t["init_end"] - t["start"], left=t["start"], color=COLORS["init"], height=0.7)
        ax.barh(x["rank"], t["end"] - t["init_end"], left=t["init_end"], color=COLORS["compute"], height=0.7)
    ax.invert_yaxis()
    ax.set_yticks([x["rank"] for x in ranks], [f"{x['role']} {x['rank']}" for x in ranks], fontsize=7)
    ax.set_xlabel("seconds since the first rank started")
    ax.set_title(f"Initialization against training: {describe(r)}", fontsize=9)
    # below the axis label, in a strip tight_layout keeps free (an axes legend overlapped the
    # label); patches of the bars' colours (an empty barh's legend entry took the default colour)
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("init", "compute")],
               ["initialization (imports, data, JIT)", "training"], fontsize=8, loc="lower center", ncol=2,
               frameon=False)
    fig.tight_layout(rect=(0, 0.3 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scaling_png(runs: list[dict], path: str, plt) -> None:
    runs = sorted(runs, key=lambda r: r["config"]["workers"])
    w = [r["config"]["workers"] for r in runs]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, color in (("init_s", "initialization", COLORS["init"]),
                              ("train_s", "training", COLORS["compute"]),
                              ("wall_s", "total", "black")):
        ax.plot(w, [r[key] for r in runs], "o-", label=label, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(w, [str(x) for x in w])
    ax.set_xlabel("workers")
    ax.set_ylabel("seconds")
    ax.set_title("Phase-by-phase scalability", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def owners_staleness(r: dict) -> list[tuple[int, str]]:
    """(index in `ranks`, key) of the staleness of the Δw the shard owners took: a server's
    `staleness`, a peer's `staleness_applied`; allreduce has no owner, its ranks' own (0)."""
    ranks = r["ranks"]
    owners = [(i, "staleness_applied" if x["role"] == "peer" else "staleness")
              for i, x in enumerate(ranks) if x["role"] in ("server", "peer")]
    return owners or [(i, "staleness") for i, x in enumerate(ranks) if "staleness" in x]


def busy_ranks(r: dict) -> list[int]:
    """Indices in profile.ranks of the ranks with a busy share: servers and peers."""
    return [i for i, x in enumerate(r["profile"]["ranks"]) if "busy_pct" in x]


def curve_png(r: dict, path, plt) -> None:
    curve = r["metrics"]["curve"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    t = [c["train_s"] for c in curve]
    ax.plot(t, [c["accuracy"] for c in curve], "o-", ms=3, color=COLORS["init"], label="accuracy")
    ax.set_xlabel("training seconds (since the server started serving)")
    ax.set_ylabel("held-out accuracy")
    loss = ax.twinx()
    loss.plot(t, [c["loss"] for c in curve], "s--", ms=3, color=COLORS["compute"], label="loss")
    loss.set_ylabel("held-out loss")
    ax.set_title(f"Held-out accuracy and loss against time: {describe(r)}", fontsize=9)
    fig.legend(fontsize=8, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def staleness_png(r: dict, path, plt) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.4))
    owners = owners_staleness(r)
    width = 0.8 / len(owners)
    for j, (i, key) in enumerate(owners):
        hist = r["ranks"][i][key]["histogram"]
        ax.bar([s + (j - (len(owners) - 1) / 2) * width for s in range(len(hist))], hist, width=width,
               label=f"{r['ranks'][i]['role']} {r['ranks'][i]['rank']}")
    ax.set_xlabel("staleness (updates of the shard between a Δw's w and its arrival)")
    ax.set_ylabel("Δw")
    ax.set_title(f"Staleness of the updates the shards took: {describe(r)}", fontsize=9)
    ax.legend(fontsize=7, ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def busy_png(r: dict, path, plt) -> None:
    prof = r["profile"]["ranks"]
    idx = busy_ranks(r)
    fig, ax = plt.subplots(figsize=(max(4, 0.5 * len(idx) + 2), 3.2))
    ax.bar(range(len(idx)), [prof[i]["busy_pct"] for i in idx], color=COLORS["aggregate"], width=0.6)
    ax.axhline(80, color="black", lw=0.8, ls=":")   # asgd.run.results.verdict's server-bound line
    ax.set_xticks(range(len(idx)), [f"{prof[i]['role']} {prof[i]['rank']}" for i in idx], fontsize=8)
    ax.set_xlim(-1, max(len(idx), 2))   # a lone server's bar not stretched across the axes
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of training time busy")
    ax.set_title("The servers' busy share (80 %: server-bound)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


BYTE_PARTS = ("init", "train", "finish")


def bytes_png(r: dict, path, plt) -> None:
    ranks = r["ranks"]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ranks) + 2), 3.6))
    x = range(len(ranks))
    for side, offset, hatch in (("sent", -0.2, ""), ("recv", 0.2, "//")):
        bottom = [0] * len(ranks)
        for part, color in zip(BYTE_PARTS, (COLORS["init"], COLORS["compute"], COLORS["idle"])):
            vals = [x_["bytes"][part][side] / 1e6 for x_ in ranks]
            ax.bar([i + offset for i in x], vals, bottom=bottom, width=0.38, color=color, hatch=hatch,
                   label=f"{part} {side}")
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(list(x), [f"{x_['role']} {x_['rank']}" for x_ in ranks], fontsize=8)
    ax.set_ylabel("MB (10^6 bytes)")
    ax.set_title("Bytes each rank sent (left) and received (right, hatched), by part of the run", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare_png(rows: list[dict], labels: list[str], phases, path, plt) -> None:
    """Predicted against measured seconds (asgd.perf.cli.compare's rows), per run and phase."""
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows) * len(phases) + 2), 3.6))
    groups = [(label, k) for label, row in zip(labels, rows) for k in phases]
    x = range(len(groups))
    ax.bar([i - 0.2 for i in x], [row[f"{k}_pred_s"] for row in rows for k in phases], width=0.4,
           color=COLORS["idle"], label="predicted")
    ax.bar([i + 0.2 for i in x], [row[f"{k}_meas_s"] for row in rows for k in phases], width=0.4,
           color=COLORS["init"], label="measured")
    ax.set_xticks(list(x), [f"{k}\n{label}" if len(rows) > 1 else k for label, k in groups], fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title("Predicted (asgd.perf's model) against measured", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None without matplotlib (the `plot` extra)."""
    try:   # optional, and slow to import
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("asgd.perf report: error: needs matplotlib: pip install -e '.[plot]'", file=sys.stderr)
        return None
    return plt


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (or results.json files)")
    p.add_argument("--out", help="folder for the PNGs or the page (default: the first RUN_DIR)")
    p.add_argument("--html", action="store_true", help="one self-contained page, OUT/report.html, instead "
                   "of the PNGs: configuration, verdict and every figure, inline (a sweep: its scaling "
                   "and a table of its runs too)")
    p.add_argument("--params", help="with --html: predicted against measured, from this params.json "
                   "(python -m asgd.perf calibrate)")


def write_figures(run_dirs: list[str], out: str | None = None) -> int:
    """profile.png and timeline.png per run, scaling.png over several; 2 without matplotlib."""
    if (plt := pyplot()) is None:
        return 2
    runs = [load(d) for d in expand(run_dirs)]
    out = out or default_out(run_dirs)
    os.makedirs(out, exist_ok=True)
    written = []
    for i, r in enumerate(runs):
        suffix = "" if len(runs) == 1 else f"-{i}-w{r['config']['workers']}"
        for name, fn in (("profile", profile_png), ("timeline", timeline_png)):
            path = os.path.join(out, f"{name}{suffix}.png")
            fn(r, path, plt)
            written.append(path)
    if len(runs) > 1:
        path = os.path.join(out, "scaling.png")
        scaling_png(runs, path, plt)
        written.append(path)
    print("\n".join(f"wrote {w}" for w in written))
    return 0
