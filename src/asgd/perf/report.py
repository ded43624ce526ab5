"""python -m asgd.perf report RUN_DIR [RUN_DIR ...] [--out DIR]: the paper's profiling
figures from results.json files (needs matplotlib: pip install -e '.[plot]').

  profile.png   per-rank stacked bars of the wall time by phase (the paper's Figure 5, IPM)
  timeline.png  per-rank timeline: initialization against training (Figure 6, TAU)
  scaling.png   with several runs: init, training and total time against workers (Figure 9)
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


def _title(r: dict) -> str:
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
    ax.set_title(f"Where each rank's time goes: {_title(r)}\nverdict: {r['profile']['bound']}-bound",
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
    ax.barh([], [], color=COLORS["init"], label="initialization (imports, data, JIT)")
    ax.barh([], [], color=COLORS["compute"], label="training")
    ax.invert_yaxis()
    ax.set_yticks([x["rank"] for x in ranks], [f"{x['role']} {x['rank']}" for x in ranks], fontsize=7)
    ax.set_xlabel("seconds since the first rank started")
    ax.set_title(f"Initialization against training: {_title(r)}", fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (or results.json files)")
    p.add_argument("--out", help="folder for the PNGs (default: the first RUN_DIR)")


def write_figures(run_dirs: list[str], out: str | None = None) -> int:
    """profile.png and timeline.png per run, scaling.png over several; 2 without matplotlib."""
    try:   # matplotlib: optional (the `plot` extra), and slow to import
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("asgd.perf report: error: needs matplotlib: pip install -e '.[plot]'", file=sys.stderr)
        return 2
    runs = [load(d) for d in run_dirs]
    out = out or (run_dirs[0] if os.path.isdir(run_dirs[0]) else os.path.dirname(run_dirs[0]) or ".")
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
