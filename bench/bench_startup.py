"""Start-up, before and after: per-rank start-up CPU by role (`mpiexec -n R python
bench/peers/cpu_of.py asgd.train --hidden 10 --epochs 1`) and the default 16-rank run's
wall, init_s and train_s, of this tree and of a baseline commit (from a git worktree,
<out>/baseline-<rev>, with this tree's Python, MPI and numba), repetitions interleaved.
Writes startup.csv, startup.json and startup.png under bench/results/startup/.

    python bench/bench_startup.py [--baseline 7584051] [--repeat 5] [--ranks 16]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import common  # first: pins threads, puts src/ on the path
from runs_report import median

BASELINE = "7584051"  # the last commit before the redesign (issue 15)


def per_rank_cpu(tree: Path, ranks: int) -> list[dict]:
    """Each rank's process CPU seconds, for a run whose training is negligible."""
    with tempfile.TemporaryDirectory(prefix="asgd-bench-startup-") as tmp:
        env = {"PYTHONPATH": str(tree / "src"), "ASGD_CPU_OUT": tmp}
        common.mpiexec(ranks, [str(common.PEERS / "cpu_of.py"), "asgd.train", "--hidden", "10", "--epochs", "1",
                               "--quiet", "--out", os.path.join(tmp, "run")], timeout=300, env=env)
        got = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("cpu-*.json"))]
        roles = {r["rank"]: r["role"] for r in json.loads((Path(tmp) / "run" / "results.json").read_text())["ranks"]}
    return [{**g, "role": roles[g["rank"]]} for g in got]


def default_run(tree: Path, ranks: int) -> dict:
    r, job = common.train_job(ranks, ["-m", "asgd.train", "--quiet"], 600, env={"PYTHONPATH": str(tree / "src")})
    return {"launcher_wall_s": job["wall_s"], "wall_s": r["wall_s"], "init_s": r["init_s"], "train_s": r["train_s"],
            "accuracy": r["metrics"]["accuracy"]}


def plot(summary: list[dict], ranks: int, path: Path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    by = {s["tree"]: s for s in summary}
    for ax, keys, title in ((axes[0], ("worker_cpu_s", "server_cpu_s"), "per-rank start-up CPU, s"),
                            (axes[1], ("default_init_s", "default_train_s"), f"default {ranks}-rank run, s")):
        common.bars(ax, list(keys), list(by), lambda k, tree: by[tree][k])
        ax.set_title(title)
        ax.legend()
    fig.suptitle("start-up before and after (measured here)")
    common.save_figure(fig, path)


def summarize(rows: list[dict], trees) -> list[dict]:
    """Per tree: the medians of its ranks' start-up CPU (by role) and of its default runs."""
    out = []
    for name in trees:
        cpu = [r for r in rows if r["tree"] == name and r["measure"] == "rank_cpu"]
        runs = [r for r in rows if r["tree"] == name and r["measure"] == "default_run"]
        out.append({"tree": name, **{f"{role}_cpu_s": median([r for r in cpu if r["role"] == role], "cpu_s")
                                     for role in ("worker", "server")},
                    "rank_cpu_s": median(cpu, "cpu_s"),
                    **{f"default_{k}": median(runs, k) for k in ("wall_s", "init_s", "train_s")},
                    "launcher_wall_s": median(runs, "launcher_wall_s"), "accuracy": median(runs, "accuracy")})
    return out


def main(argv=None) -> int:
    p = common.parser(__doc__, "startup", plot=False)
    p.add_argument("--baseline", default=BASELINE, help="the commit to compare with (default %(default)s)")
    p.add_argument("--repeat", type=int, default=5, help="interleaved repetitions (default %(default)s)")
    p.add_argument("--ranks", type=int, default=16, help="ranks of both measurements (default %(default)s)")
    a = p.parse_args(argv)
    run = common.Run("startup", a)
    trees = {f"before ({a.baseline})": common.worktree(a.baseline, run.out), "after (this tree)": common.ROOT}
    for tree in trees.values():  # numba's cache, both trees
        default_run(tree, 2)
    rows = []
    for i in range(a.repeat):
        for name in common.rotated(list(trees), i):
            cpu = per_rank_cpu(trees[name], a.ranks)
            rows += [{"tree": name, "rep": i, "measure": "rank_cpu", **c} for c in cpu]
            job = default_run(trees[name], a.ranks)
            rows.append({"tree": name, "rep": i, "measure": "default_run", **job})
            print(f"  {i + 1}/{a.repeat} {name}: rank CPU median {median(cpu, 'cpu_s'):.3f} s, default run wall "
                  f"{job['wall_s']:.2f} s (init {job['init_s']:.2f} s)", flush=True)
    summary = summarize(rows, trees)
    b, n = summary
    change = {k: 100 * (n[k] / b[k] - 1) for k in b if k != "tree"}
    meta = {**run.head(), "summary": summary, "change_pct": change,
            "columns": {"cpu_s": "a rank's process CPU (user+system) for a 1-epoch 2-10-2 run: start-up and end",
                        "wall_s": "results.json wall_s of the default run", "init_s": "results.json init_s",
                        "launcher_wall_s": "mpiexec's wall time, launch to exit"}}
    common.report(run, rows, meta, plot, summary + [{"tree": "change %", **change}], [
        ("tree", "tree", ""), ("worker CPU s", "worker_cpu_s", ".3f"), ("server CPU s", "server_cpu_s", ".3f"),
        ("default run wall s", "default_wall_s", ".2f"), ("init s", "default_init_s", ".2f"),
        ("train s", "default_train_s", ".2f"), ("mpiexec wall s", "launcher_wall_s", ".2f"),
        ("accuracy", "accuracy", ".4f")],
        title=f"per-rank start-up CPU ({a.ranks} ranks) and the default {a.ranks}-rank run, medians of {a.repeat}",
        data=(summary, a.ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
