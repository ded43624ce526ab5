"""Crowded waiting, before and after: the training seconds of jobs whose ranks outnumber the
cores, and one rank's work while all the others wait (bench/peers/imbalance.py: what the
waiters take from it), from this tree and from a baseline commit (a git worktree, as
bench_startup), the repetitions interleaved, each run under the CPU lock. The baseline's Waiter slept from the
start, backing off to 1 ms at any crowding; this tree's yields its core between polls for a
window, then sleeps with a cap, both scaled by the ranks per core (asgd.core.waiting).
Writes waiting.csv, waiting.json (its `columns`) and waiting.png under bench/results/waiting/.

    python bench/bench_waiting.py [--baseline 33ec18d] [--repeat 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

import common  # first: pins threads, puts src/ on the path
from runs_report import grouped, median

import bench_tta

BASELINE = "33ec18d"   # the last commit whose crowded ranks only slept


def cases(data: Path) -> dict[str, tuple[int, list[str] | None]]:
    """name -> (ranks, asgd.train options; None: the imbalance peer): a tiny model whose
    updates are mostly waiting, the default run at 16 and 32 ranks, a lockstep job whose
    workers wait for the slowest, and one rank working while 15 and 31 wait."""
    rings5, mnist = (bench_tta.make_data(name, data, False) for name in ("rings5", "mnist"))
    deferred = ["--eval-every", "epoch", "--eval-deferred"]   # the held-out evaluations out of train_s
    return {"rings5 ps async 4x64, 5 ranks": (5, ["--data", str(rings5), "--hidden", "256", "--epochs", "80",
                                                  "--batch", "64", "--optimizer", "adagrad", *deferred]),
            "default, 16 ranks": (16, []),
            "mnist ps sync 8x256, 9 ranks": (9, ["--data", str(mnist), "--epochs", "15", "--mode", "sync", *deferred]),
            "default, 32 ranks": (32, []),
            "one works, 15 wait": (16, None), "one works, 31 wait": (32, None)}


def run_one(tree: Path, ranks: int, argv: list[str] | None, lock: str | None) -> dict:
    env = {"PYTHONPATH": str(tree / "src")}
    if argv is None:   # the imbalance peer: rank 0's work, its "train" here
        with common.cpu_lock(lock) as load:
            got = common.child_result(common.mpiexec(ranks, [str(common.PEERS / "imbalance.py")], 300, env)["stdout"])
        return {"train_s": got["wall_s"], "cpu_s": got["cpu_s"], "load_1min": load}
    with common.cpu_lock(lock) as load:
        r, _ = common.train_job(ranks, ["-m", "asgd.train", "--quiet", *argv], 600, env=env)
    workers = [x for x in r["ranks"] if x["role"] == "worker"]
    return {"train_s": r["train_s"], "wall_s": r["wall_s"], "updates_per_s": r["throughput"]["updates_per_s"],
            "worker_wait_s": sum(x["phases"].get("comm_wait", 0.0) for x in workers) / len(workers),
            "accuracy": r["metrics"]["accuracy"], "load_1min": load}


def plot(summary: list[dict], path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(dict.fromkeys(s["case"] for s in summary))
    trees = list(dict.fromkeys(s["tree"] for s in summary))
    by = {(s["case"], s["tree"]): s["train_s"] for s in summary}
    common.bars(ax, names, trees, lambda case, tree: by[(case, tree)])
    common.decorate(ax, "crowded waiting: training s, median (measured here)", legend={}, ylabel="train s")
    common.save_figure(fig, path)


def main(argv=None) -> int:
    p = common.parser(__doc__, "waiting", lock=True)
    p.add_argument("--baseline", default=BASELINE, help="the commit to compare with (default %(default)s)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved repetitions (default %(default)s)")
    a = p.parse_args(argv)
    run = common.Run("waiting", a)
    trees = {f"before ({a.baseline})": common.worktree(a.baseline, run.out), "after (this tree)": common.ROOT}
    jobs = cases(run.out / "data")
    for tree in trees.values():   # numba's cache, both trees
        common.train_job(2, ["-m", "asgd.train", "--quiet", "--epochs", "1"], 600,
                         env={"PYTHONPATH": str(tree / "src")})
    rows = []
    for i in range(a.repeat):
        for case, (ranks, args) in jobs.items():
            for name in common.rotated(list(trees), i):
                rows.append({"case": case, "tree": name, "rep": i, **run_one(trees[name], ranks, args, a.cpu_lock)})
                print(f"  {i + 1}/{a.repeat} {case}, {name}: train {rows[-1]['train_s']:.3f} s", flush=True)
    runs = grouped(rows, ("case", "tree"))
    columns = ("train_s", "cpu_s", "wall_s", "updates_per_s", "worker_wait_s", "accuracy")
    summary = [{"case": case, "tree": name, **{k: median(runs[case, name], k) for k in columns}}
               for case in jobs for name in trees]
    before, after = list(trees)
    speedup = {case: median(runs[case, before], "train_s") / median(runs[case, after], "train_s") for case in jobs}
    meta = run.meta(summary=summary, speedup=speedup, columns={
        "train_s": "results.json train_s; one works: rank 0's work, wall s", "cpu_s": "one works: rank 0's CPU s",
        "wall_s": "results.json wall_s (start-up included)",
        "updates_per_s": "results.json throughput.updates_per_s",
        "worker_wait_s": "a worker's comm_wait phase, mean over workers", "load_1min": "once the lock was held"})
    table = [{**s, "speedup": speedup[s["case"]] if s["tree"] == after else None} for s in summary]
    common.report(run, rows, meta, plot, table, [
        ("case", "case", ""), ("tree", "tree", ""), ("train s", "train_s", ".3f"), ("CPU s", "cpu_s", ".3f"),
        ("wall s", "wall_s", ".2f"), ("updates/s", "updates_per_s", ",.0f"), ("worker wait s", "worker_wait_s", ".3f"),
        ("accuracy", "accuracy", ".4f"), ("before / after", "speedup", ".2f")],
        title=f"crowded waiting, medians of {a.repeat} interleaved runs", data=(summary,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
