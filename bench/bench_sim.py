"""asgd.sim (the SimGrid simulation) checked against this machine, then put beside the paper
(what each part runs and measures: docs/bench-suite.md).

  validate   calibrate (or --params), then asgd.train runs none of calibrate's, each simulated
             from its own run (asgd.sim --like RUN) and predicted by the analytical model:
             validate.{csv,json,png}
  paper      the paper's experiments on Mustang and Blue Waters in two cost models (asgd's
             calibration; cntk's, inferred from four of the paper's numbers), then the fixes
             at 16-1024 workers: paper.{csv,json,png}, paper-fixes.png
  scale      seconds to simulate 1,024 workers for one epoch (target: < 60 s): scale.json

    python bench/bench_sim.py                       # all three: calibrate, 61 runs, simulations
    python bench/bench_sim.py validate --quick      # calibrate --quick, 8 short runs
    python bench/bench_sim.py paper --params params.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # first: pins threads, puts src/ on the path
import validate
from common import LoadSampler, print_table, save_figure, write_outputs

import dataclasses
import json
import math
import os
import subprocess
import time

METRICS = ("train", "init", "total", "updates_per_s")
WHO = ("sim", "simq", "model")   # the simulator with and without the others' load, the analytical model
SRC = {"meas": "measured here", "sim": "simulated (asgd.sim, with the CPU other users took during the run)",
       "model": "analytical model (asgd.perf)", "paper": "stated in the paper"}


def parse_args(argv=None):
    p = common.parser(__doc__, "sim", plot=False, lock=True)
    p.add_argument("part", nargs="?", choices=("all", "validate", "paper", "scale"), default="all")
    p.add_argument("--params", type=Path, help="calibration to use (default: calibrate into OUT/params.json first)")
    p.add_argument("--quick", action="store_true", help="validate: calibrate --quick and 8 short runs; "
                   "paper: fewer node counts")
    p.add_argument("--points", type=int, default=100_000, help="validate: training points of the TSV file")
    p.add_argument("--epochs", type=int, default=2, help="validate: epochs of the embedded-problem runs (default 2)")
    p.add_argument("--timeout", type=float, default=300, help="seconds one run may take (default 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the run order's shuffle (default 0)")
    return p.parse_args(argv)


# -- validate ---------------------------------------------------------------------------------

def plan(a) -> list[dict]:
    """The validation runs: label, ranks and asgd.train options (calibrate ran none of them)."""
    runs = []

    def add(name, ranks, *opts, data=False):   # a run {name}-n{n} at each rank count n
        opts = list(opts) + ([] if "--epochs" in opts or data else ["--epochs", str(a.epochs)])
        runs.extend({"label": f"{name}-n{n}", "ranks": n, "opts": opts, "data": data} for n in ranks)
    if a.quick:
        add("async", (2, 5))
        add("ssp", (5,), "--mode", "ssp")
        add("sync", (5,), "--mode", "sync")
        add("S2", (6,), "--servers", "2")
        add("seq", (3,), "--reader", "sequential", "--epochs", "1", data=True)
        add("par", (5,), "--reader", "parallel", "--epochs", "1", data=True)
        add("allreduce", (4,), "--arch", "allreduce")
        return runs
    add("async", (2, 3, 5, 9, 17))                   # 1-16 workers, async, one server
    for S, ns in ((2, (4, 10)), (3, (7,)), (4, (6, 12, 17))):   # sharded servers
        add(f"S{S}", ns, "--servers", str(S))
    for mode in ("ssp", "sync"):
        add(mode, (3, 5, 9, 17), "--mode", mode)
        add(f"{mode}-S2", (10,), "--mode", mode, "--servers", "2")
    add("b64", (5,), "--batch", "64")
    add("b1024", (9,), "--batch", "1024", "--epochs", str(2 * a.epochs))
    add("h1000", (5,), "--hidden", "1000", "--epochs", str(4 * a.epochs))
    add("seq", (2, 5, 9, 17), "--reader", "sequential", "--epochs", "1", data=True)   # the readers on a TSV file
    add("par", (3, 9, 17), "--reader", "parallel", "--epochs", "1", data=True)
    add("allreduce", (2, 4, 6, 8), "--arch", "allreduce")   # allreduce: asgd's ring (the default) and MPI's
    add("mpi", (2, 4, 6), "--arch", "allreduce", "--allreduce", "mpi")
    add("p2p-sync", (2, 4, 6, 9), "--arch", "p2p", "--mode", "sync")   # p2p, lockstep and asynchronous
    add("p2p", (3, 5, 8), "--arch", "p2p")
    add("mp2-sync", (5, 9), "--model-parallel", "2", "--mode", "sync")   # model partitioning: replicas of 2
    add("mp2", (5, 7), "--model-parallel", "2")
    add("mp2-allreduce", (4,), "--arch", "allreduce", "--model-parallel", "2")
    add("mp2-p2p-sync", (4,), "--arch", "p2p", "--model-parallel", "2", "--mode", "sync")
    # the default optimizer (adagrad) beside the same configurations with sgd, above
    for name, ns, *opts in (("async", (3, 5, 9, 17)), ("S2", (10,), "--servers", "2"), ("S4", (6,), "--servers", "4"),
                            ("sync", (5,), "--mode", "sync"), ("ssp", (9,), "--mode", "ssp"),
                            ("allreduce", (4,), "--arch", "allreduce"),
                            ("p2p-sync", (4,), "--arch", "p2p", "--mode", "sync")):
        add(f"adagrad-{name}", ns, *opts, "--optimizer", "adagrad")
    return runs


def measure(runs: list[dict], data: Path, out: Path, a) -> list[dict]:
    """Each run, with the cores' worth of CPU the other users took meanwhile (an input of the
    simulation, like the machine's cores)."""
    def one(r):
        d = (out / "runs" / r["label"]).resolve()
        opts = r["opts"] if "--optimizer" in r["opts"] else ["--optimizer", "sgd", *r["opts"]]
        job = validate.train_here(r["ranks"], opts + (["--data", str(data)] if r["data"] else []), d, a.timeout)
        return {"run_dir": str(d), "others_cores": job["others_cores"], "launch_s": job["wall_s"]}

    def say(r):
        res = validate.results(r["run_dir"])
        return (f"wall {res['wall_s']:6.2f} s (init {res['init_s']:5.2f}, train {res['train_s']:6.2f})  load "
                f"{r['load_1min']:.1f}, others used {r['others_cores']:.2f} cores  launch {r['launch_s']:.1f} s")
    return validate.sweep(runs, one, lambda r: r["label"], say, seed=a.seed, lock=a.cpu_lock)


def timings(res: dict) -> dict:
    """A run's METRICS from its results.json (measured or simulated)."""
    return {"train": res["train_s"], "init": res["init_s"], "total": res["wall_s"],
            "updates_per_s": res["throughput"]["updates_per_s"]}


def compare_runs(done: list[dict], params: Path) -> list[dict]:
    """Per run: measured, simulated and analytical-model seconds and APEs."""
    p = validate.load_params(params)
    bare = validate.without_crowding(p)
    calibrated = validate.calibrated_ranks(p)   # rank counts calibrate started jobs at (start-up, cores' worth)
    rows = []
    for d in done:
        res = validate.results(d["run_dir"])
        c = res["config"]
        t = time.perf_counter()
        # the simulator with the other users' load measured during the run (an input about the
        # machine, like its cores), and without it (the analytical model's inputs exactly)
        sim = validate.simulate(params, d["run_dir"], out=d["run_dir"] + "-sim", background=d.get("others_cores", 0.0))
        sim_wall = time.perf_counter() - t
        simq = validate.simulate(params, d["run_dir"], out=d["run_dir"] + "-simq")
        pr = validate.predict(p, res)
        # the model's rate: the run's own update count over its predicted training time
        model = {"train": pr.train_s, "init": pr.init_s, "total": pr.total_s,
                 "updates_per_s": res["throughput"]["updates"] / pr.train_s}
        row = {"label": d["label"], "ranks": c["world_size"], "workers": c["workers"], "servers": c["servers"],
               "arch": c["arch"], "architecture": architecture(c), "optimizer": c["optimizer"],
               "mode": c["mode"], "reader": c["reader"] if c.get("data") else "embedded",
               "batch": c["batch"], "hidden": c["hidden"], "epochs": c["epochs"],
               "oversubscribed": c["oversubscribed"], "load_1min": d["load_1min"],
               "others_cores": d.get("others_cores"), "sim_wall_s": sim_wall,
               "sample": "in" if c["world_size"] in calibrated else "out",
               **validate.judged(timings(res), sim=timings(sim), simq=timings(simq), model=model)}
        row["model_no_crowding_train"] = validate.predict(bare, res).train_s
        row["model_no_crowding_ape_train"] = validate.ape(row["model_no_crowding_train"], row["meas_train"])
        row["sim_startup_check_s"] = sim["simulated"]["startup_check"]["calibrated_job_startup_s"]
        rows.append(row)
        print(f"  {d['label']}: simulated in {sim_wall:.1f} s", flush=True)   # the numbers: the table after
    return rows


def architecture(c: dict) -> str:
    """ps, p2p, allreduce (ring), mpi (allreduce --allreduce mpi), model-parallel (any, with --model-parallel)."""
    if c.get("model_parallel", 1) > 1:
        return "model-parallel"
    if c["arch"] == "allreduce":
        return "allreduce" if c.get("allreduce", "ring") == "ring" else "mpi"
    return c["arch"]


def summarize(rows: list[dict]) -> dict:
    """APE medians and p90s per metric and predictor; train's per architecture and optimizer
    (the targets: <= 15 % per architecture, model and simulator; adagrad's <= 10 %, like sgd's);
    and at the rank counts calibrate never started a job at (bench_model's out of sample)."""
    ps = [r for r in rows if r["model_train"] is not None]   # runs both predict
    ar = [r for r in rows if r["model_train"] is None]
    out = {"runs": len(rows), "runs_both": len(ps), "allreduce_runs": len(ar),
           **validate.scores(ps, WHO, METRICS), **validate.scores(ar, ["sim_allreduce"], METRICS, "sim_ape_{k}"),
           **validate.scores(rows, WHO, ["train"], name="{who}_all_train")}
    for key, field in (("by_architecture", "architecture"), ("by_optimizer", "optimizer")):
        out[key] = {v: validate.scores([r for r in rows if r[field] == v], ("sim", "model", "model_no_crowding"),
                                       ["train"], name="{who}") for v in sorted({r[field] for r in rows})}
    out.update(validate.scores([r for r in ps if r["sample"] == "out"], ("sim", "model"), ("train", "init"),
                               name="{who}_{k}_rank_count_out"))
    out = {k: v for k, v in out.items() if v is not None}
    out["target"] = {"sim_train_median_ape_le_10": out["sim_all_train"]["median"] <= 10.0,
                     "every_architecture_le_15": all(v[w]["median"] <= 15 for v in out["by_architecture"].values()
                                                     for w in ("sim", "model")),
                     "adagrad_le_10": all(out["by_optimizer"].get("adagrad", {}).get(w, {}).get("median", 0) <= 10
                                          for w in ("sim", "model"))}
    return out


# the predictors as validate.png draws them: (column prefix, name, scatter's style, bar's colour)
PREDICTORS = (("sim", SRC["sim"], dict(s=28, color="tab:blue", edgecolor="k", lw=0.3), "tab:blue"),
              ("simq", "simulated without the others' load",
               dict(s=22, marker="^", facecolor="none", edgecolor="tab:blue", lw=0.8), "lightsteelblue"),
              ("model", SRC["model"], dict(s=28, marker="s", color="tab:orange", edgecolor="k", lw=0.3), "tab:orange"))


def plot_validate(rows: list[dict], summary: dict, path: Path, title: str) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.4))
    for ax, k, name in ((axes[0], "train", "training time (train_s)"), (axes[1], "init", "initialization (init_s)")):
        series = []
        for who, what, style, _ in PREDICTORS:
            have = [r for r in rows if r[f"{who}_{k}"] is not None]
            series.append(([r[f"meas_{k}"] for r in have], [r[f"{who}_{k}"] for r in have],
                           {**style, "label": f"{what}: median APE {summary[f'{who}_{k}']['median']:.1f}%"}))
        validate.pred_vs_meas(ax, series, 0.10, 1.3, f"{SRC['meas']}, s", "predicted, s", name)
        ax.legend(fontsize=7.5, loc="upper left")
    ax = axes[2]
    order = sorted(rows, key=lambda r: (r["arch"], r["mode"], r["servers"], r["ranks"]))
    x = range(len(order))
    for dx, (who, what, _, color) in zip((-0.27, 0, 0.27), PREDICTORS):
        ax.bar([i + dx for i in x], [r[f"{who}_ape_train"] or 0 for r in order], 0.27, color=color,
               label=f"{what} (none for allreduce)" if who == "model" else what)
    ax.axhline(10, color="tab:red", ls="--", lw=1, label="10% (target: median)")
    ax.set_xticks(list(x), [r["label"] for r in order], rotation=90, fontsize=7)
    common.decorate(ax, "per run", 10, dict(fontsize=7.5), dict(axis="y"), ylabel="APE of train_s, % of measured")
    fig.suptitle(title, fontsize=11)
    save_figure(fig, path)


def run_validate(a, out: Path, params: Path, meta: dict) -> None:
    data = validate.generate(out / "data" / "d.tsv", a.points, a.points // 20)
    runs = plan(a)
    validate.warm_up(out, a.timeout, "--epochs", "1")
    load = LoadSampler()
    t0 = time.perf_counter()
    print(f"{len(runs)} validation runs (none used to calibrate), shuffled with seed {a.seed}:", flush=True)
    done = measure(runs, data, out, a)
    meta.update(sweep_s=time.perf_counter() - t0, load_during_runs=load.summary())
    print("simulating each run from its configuration, and the analytical model's prediction:", flush=True)
    t1 = time.perf_counter()
    rows = compare_runs(done, params)
    meta["simulate_s"] = time.perf_counter() - t1
    summary = summarize(rows)
    cols = [("run", "label", ""), ("ranks", "ranks", "d"), ("calib. P", "sample", ""), ("S", "servers", "d"),
            ("mode", "mode", ""), ("reader", "reader", "")]
    for k in ("train", "init"):
        cols += [(f"{k} meas", f"meas_{k}", ".2f"), ("sim", f"sim_{k}", ".2f"), ("APE%", f"sim_ape_{k}", ".0f"),
                 ("model", f"model_{k}", ".2f"), ("APE%", f"model_ape_{k}", ".0f")]
    print_table(sorted(rows, key=lambda r: (r["arch"], r["mode"], r["reader"], r["servers"], r["ranks"])), cols,
                title=f"\nmeasured here / simulated / analytical model, seconds and APE ({len(rows)} runs)")
    validate.print_scores({k: {w: summary.get(f"{w}_{k}") for w in WHO} for k in METRICS},
                          "metric", title=f"\nout-of-sample APE over the {summary['runs']} runs (every architecture; "
                                          "both predict each; simq: the simulator without the others' load)")
    # the APEs by optimizer and at the rank counts calibrate never started a job at: validate.json's summary
    by_arch = summary["by_architecture"]
    validate.print_scores({v: {**e, "extra": {"runs": e["sim"]["runs"]}} for v, e in by_arch.items()}, "architecture",
                          extra=[("runs", "runs", "d")],
                          title="\ntrain APE by architecture (model_no_crowding: the model without its crowding term)")
    t = summary["target"]
    print(f"{validate.verdict(t['every_architecture_le_15'])}: every architecture's median train APE <= 15% "
          f"(model and simulator); {validate.verdict(t['adagrad_le_10'])}: adagrad's <= 10%")
    e, q = summary["sim_all_train"], summary["simq_all_train"]
    print(f"{validate.verdict(e['median'] <= 10)}: simulator's median APE of train_s over all {len(rows)} runs "
          f"{e['median']:.1f}% (target <= 10%); without the measured load {q['median']:.1f}%")
    write_outputs(out, "validate", rows, {**meta, "summary": summary, "sources": SRC})
    plot_validate(rows, summary, out / "validate.png",
                  f"asgd.sim and the analytical model against {len(rows)} asgd.train runs on this machine "
                  f"({meta['machine']['cores']} cores), out of sample; load avg 1 min median "
                  f"{meta['load_during_runs']['loadavg_1min_median']}")


# -- paper ---------------------------------------------------------------------------------------

PAPER = {  # what the paper states in its text (section 5.2.1, 5.4 and 6), Blue Waters, 2-10K-2, batch 256
    "total_s": {2: 16.0, 64: 50.0},
    "init_share": {2: 0.25, 64: 0.90},     # "from 25% (2 nodes) to > 90% (64 nodes)"
    "train_min_nodes": 16,                 # "decreases almost linearly ... up to some point, 16 nodes"
}
PAPER_POINTS = 16384                       # section 4.2.2: 16384 points, 2 features, TSV
NODES = (1, 2, 4, 8, 16, 32, 64)


def cntk_params(p_raw: dict, file_bytes: int) -> tuple[dict, dict]:
    """A parameters file 'as CNTK on Blue Waters would calibrate', inferred from four of
    the paper's numbers, and the derivation. The simulation has one server rank beside N
    workers (CNTK's server lives in rank 0's process) and reads with the sequential
    reader, so init(N) = s0 + (N + 1) t. Training: N workers share the 64 steps of batch
    256 of an epoch (step time A each), the server spends B per update; while the workers
    are the bottleneck an epoch takes about (64 / N) A, and the server saturates at MVA's
    knee N = (A + B) / B.
      init(2) = 25% of 16 s = 4 s; init(64) = 90% of 50 s = 45 s   ->  t, s0
      training lowest from 16 nodes on: (A + B) / B = 16           ->  A = 15 B
      total(2) - init(2) = 12 s = 32 A + B (each worker's 32 steps, then the last update)
    The epochs are not stated; with CNTK's end-of-epoch barrier every epoch is alike, so
    only one epoch's worth is identifiable: the simulation runs one epoch whose A and B
    stand for all of them."""
    i2, i64 = PAPER["total_s"][2] * PAPER["init_share"][2], PAPER["total_s"][64] * PAPER["init_share"][64]
    t = (i64 - i2) / (65 - 3)
    s0 = i2 - 3 * t
    ratio = PAPER["train_min_nodes"] - 1                                # A / B
    train2 = PAPER["total_s"][2] - i2
    B = train2 / (32 * ratio + 1)
    A = ratio * B
    # a copy at float64 (the paper's precision, its runs' here), the tables flat: the measured
    # ones give the shapes, scaled
    flat = dataclasses.asdict(validate.Params.from_dict(p_raw).at("float64"))
    raw = json.loads(json.dumps({**p_raw, **flat, "precisions": {}}))
    n_w = 50002
    f = A / validate.Params.from_dict(raw).step(10000, 256)
    raw["step_s"] = {h: {b: v * f for b, v in t_.items()} for h, t_ in raw["step_s"].items()}
    raw["step_spread"] = {}
    raw.pop("step_cpu_s", None)   # else asgd.sim times steps by this machine's CPU table, not by A
    raw["server_update_s"] = {str(n_w): B, "5002": B / 10}
    raw["worker_msg_s"] = {str(n_w): 0.0, "5002": 0.0}
    raw["contended_update_s"] = {}
    raw["read_s_per_byte"] = {r: {"tsv": t / file_bytes, "npy": t / file_bytes} for r in ("sequential", "parallel")}
    raw["select_s_per_point"] = {"sequential": 0.0, "parallel": 0.0}
    raw["startup"] = {"imports_wall_s": s0, "imports_cpu_s": s0, "parsers_wall_s": 0.0, "parsers_cpu_s": 0.0,
                      "kernels_wall_s": 0.0, "kernels_cpu_s": 0.0}
    raw["startup_by_ranks"] = {}
    raw["embedded_s"] = 0.0
    raw["eval_s_per_point"] = {h: 1e-12 for h in raw["eval_s_per_point"]}   # no held-out evaluation timed
    derivation = {"inputs_from_the_paper": {"init_2_nodes_s": i2, "init_64_nodes_s": i64,
                                            "train_2_nodes_s": train2, "train_lowest_at_nodes": 16},
                  "per_rank_read_turn_s": t, "startup_s": s0, "step_s_batch256": A, "server_update_s": B,
                  "epochs": "not stated: one simulated epoch stands for all (they are alike with CNTK's barrier)",
                  "checked_against_the_paper": ["total at 64 nodes about 50 s", "init over 90% at 64 nodes",
                                                "init linear in nodes", "training falls until 16 nodes, then rises"]}
    return raw, derivation


def paper_specs(p, cost: str, a) -> list[tuple[str, object, dict]]:
    """(experiment, Spec, what the row is) of the paper's scaling study and of the fixes."""
    Spec, machines = validate.sim_spec()
    BLUE_WATERS, MUSTANG = machines.BLUE_WATERS, machines.MUSTANG
    per = p.bytes_per_point["tsv"]
    fb, tb = int(PAPER_POINTS * per), int(PAPER_POINTS // 4 * per)
    base = validate.Run(workers=1, servers=1, batch=256, hidden=10000, epochs=1, reader="sequential",
                        points=PAPER_POINTS, test_points=PAPER_POINTS // 4, file_bytes=fb, test_bytes=tb, cores=16)
    # the cntk costs are Blue Waters' own (inferred from its runs): its cores run at 1.0 there, Mustang's faster
    cntk = cost == "cntk"
    bw = dataclasses.replace(BLUE_WATERS, core_speed=1.0) if cntk else BLUE_WATERS
    mustang = dataclasses.replace(MUSTANG, core_speed=MUSTANG.core_speed / BLUE_WATERS.core_speed) if cntk else MUSTANG

    def spec(machine, nodes: int, placement: str, compress: str = "none", **run):
        return Spec(run=dataclasses.replace(base, **run), machine=machine, nodes=nodes, placement=placement,
                    compress=compress, epoch_barrier=cntk)
    # Figure 6 / 9: one worker per node, the server on node 0, the sequential reader; Mustang's rack (Figure 2)
    out = [("bluewaters-scaling", spec(bw, N, "spread", workers=N), {"nodes": N})
           for N in ((2, 8, 64) if a.quick else NODES)]
    out += [("mustang-scaling", spec(mustang, N, "spread", workers=N), {"nodes": N})
            for N in ((1, 2, 7) if a.quick else range(1, 8))]
    fixes = [("sequential, 1 server", "sequential", 1, "none"), ("parallel, 1 server", "parallel", 1, "none"),
             ("parallel, 2 servers", "parallel", 2, "none"), ("parallel, 4 servers", "parallel", 4, "none"),
             ("parallel, 8 servers", "parallel", 8, "none"), ("parallel, 8 servers, 1-bit", "parallel", 8, "1bit")]
    if a.quick:
        fixes = [fixes[0], fixes[1], fixes[4], fixes[5]]
    # the fixes on Blue Waters, 16 ranks per node
    out += [("bluewaters-fixes", spec(bw, math.ceil((W + S) / 16), "block", comp, workers=W, servers=S, reader=reader),
             {"workers": W, "fix": name})
            for W in ((16, 1024) if a.quick else (16, 64, 256, 1024)) for name, reader, S, comp in fixes]
    return out


def run_paper(a, out: Path, params: Path, meta: dict) -> None:
    p, raw = validate.sim_params(params)
    fb = int(PAPER_POINTS * p.bytes_per_point["tsv"])
    cntk_raw, derivation = cntk_params(raw, fb)
    (out / "paper-cntk-params.json").write_text(json.dumps({"schema": 1, "params": cntk_raw,
                                                             "derivation": derivation}, indent=1))
    models = {"asgd": (p, raw), "cntk": (validate.Params.from_dict(cntk_raw), cntk_raw)}
    rows = []
    for cost, (pp, rr) in models.items():
        for exp, spec, what in paper_specs(pp, cost, a):
            t = time.perf_counter()
            res = validate.simulate(params, spec=spec, params=(pp, rr), data_name=f"paper-{PAPER_POINTS}.tsv")
            row = {"experiment": exp, "costs": cost, **what, "machine": spec.machine.name, "nodes_sim": spec.nodes,
                   "workers": spec.run.workers, "servers": spec.servers, "reader": spec.run.reader,
                   "compression": spec.compress, "init_s": res["init_s"], "train_s": res["train_s"],
                   "total_s": res["wall_s"], "init_share": res["init_s"] / res["wall_s"],
                   "updates_per_s": res["throughput"]["updates_per_s"], "bound": res["profile"]["bound"],
                   "sim_wall_s": time.perf_counter() - t}
            rows.append(row)
            print(f"  {cost:4s} {exp:18s} {json.dumps(what):42s} init {row['init_s']:7.2f}  train "
                  f"{row['train_s']:7.2f}  total {row['total_s']:7.2f}  ({row['sim_wall_s']:.1f} s)", flush=True)
    verdicts = paper_verdicts(rows)
    for v in verdicts:
        print(f"  [{v['costs']}] {v['claim']}: paper {v['paper']}; simulated {v['simulated']} -> {v['agrees']}"
              f" ({v['role']})")
    print("  (cntk: init(64 nodes) = 45 s and training lowest at 16 nodes were inputs too; what is checked there "
          "is the total at 64 nodes and whether training rises after 16)")
    meta.update(cntk_derivation=derivation, paper_stated=PAPER, verdicts=verdicts)
    write_outputs(out, "paper", rows, {**meta, "sources": SRC})
    plot_paper(rows, out / "paper.png", out / "paper-fixes.png")


def paper_verdicts(rows: list[dict]) -> list[dict]:
    out = []
    for cost in ("asgd", "cntk"):
        sc = {r["nodes"]: r for r in rows if r["experiment"] == "bluewaters-scaling" and r["costs"] == cost}
        if 2 not in sc or 64 not in sc:
            continue
        ns = sorted(sc)
        inits = [sc[n]["init_s"] for n in ns]
        slope, _, r2 = common.linear_fit(ns, inits)
        train_min = min(ns, key=lambda n: sc[n]["train_s"])
        rises = sc[64]["train_s"] > sc[train_min]["train_s"] * 1.05
        share2, share64 = sc[2]["init_share"], sc[64]["init_share"]
        claims = (
            ("init share at 2 nodes", "25%", f"{100 * share2:.0f}%", _near(share2, 0.25, 0.1)),
            ("init share at 64 nodes", "> 90%", f"{100 * share64:.0f}%", share64 > 0.85),
            ("total at 2 nodes", "16 s", f"{sc[2]['total_s']:.1f} s", _near(sc[2]["total_s"], 16, 0.15)),
            ("total at 64 nodes", "50 s", f"{sc[64]['total_s']:.1f} s", _near(sc[64]["total_s"], 50, 0.15)),
            ("init grows linearly with nodes", "linear (Fig. 9)", f"{slope:.3f} s/node, R^2 {r2:.4f}",
             r2 > 0.99 and slope > 0),
            ("training lowest at", "16 nodes, rising after",
             f"{train_min} nodes, {'rising' if rises else 'flat'} to 64", train_min in (8, 16, 32) and rises))
        out += [{"costs": cost, "claim": c, "paper": said, "simulated": got, "agrees": ok}
                for c, said, got, ok in claims]
    # the cntk costs were fitted to four of these numbers: agreeing there shows only that the
    # fit took; the other claims are the checks
    fitted = {"init share at 2 nodes", "total at 2 nodes"}
    for v in out:
        v["agrees"] = "agrees" if v["agrees"] else "differs"
        v["role"] = "fitted (an input)" if v["costs"] == "cntk" and v["claim"] in fitted else "check"
    return out


def _near(x: float, target: float, rel: float) -> bool:
    return abs(x - target) <= rel * target


def plot_paper(rows: list[dict], path: Path, path_fixes: Path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    colors = {"init_s": "tab:blue", "train_s": "tab:orange", "total_s": "k"}
    for ax, cost in zip(axes[:2], ("cntk", "asgd")):
        sc = validate.series(rows, "nodes", experiment="bluewaters-scaling", costs=cost)
        if not sc:
            continue
        ns = [r["nodes"] for r in sc]
        for k, lab in (("init_s", "initialization"), ("train_s", "training"), ("total_s", "total")):
            ax.plot(ns, [r[k] for r in sc], "o-", color=colors[k], label=f"{lab}, {SRC['sim']}")
        ax.plot([2, 64], [PAPER["total_s"][2], PAPER["total_s"][64]], "k*", ms=14, ls="none",
                label=f"total, {SRC['paper']} (16 s, 50 s)")
        ax.plot([2, 64], [PAPER["total_s"][2] * 0.25, PAPER["total_s"][64] * 0.9], "b*", ms=14, ls="none",
                label=f"init, {SRC['paper']} (25%, > 90%)")
        ax.axvline(16, color="tab:orange", ls=":", lw=1, label=f"training lowest, {SRC['paper']} (16 nodes)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        what = ("costs inferred from 4 of the paper's numbers (CNTK)" if cost == "cntk"
                else "asgd's costs: this machine's calibration, cores scaled")
        common.decorate(ax, f"Figure 9 on a simulated Blue Waters: {what}", 9, dict(fontsize=7), ylabel="seconds",
                        xlabel="Blue Waters nodes (one worker each, server on node 0, sequential reader)")
    ax = axes[2]
    for cost, style in (("cntk", "o-"), ("asgd", "s--")):
        ms = validate.series(rows, "nodes", experiment="mustang-scaling", costs=cost)
        if ms:
            ax.plot([r["nodes"] for r in ms], [r["total_s"] for r in ms], style,
                    label=f"total, {SRC['sim']}, {cost} costs")
    common.decorate(ax, "Mustang, batch 256 (paper: scales from 1 to 2 nodes, not beyond)", 9, dict(fontsize=7),
                    xlabel="Mustang nodes (a 7-node rack, one switch)", ylabel="seconds")
    save_figure(fig, path)

    fixes = [r for r in rows if r["experiment"] == "bluewaters-fixes"]
    if not fixes:
        return
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for ax, cost in zip(axes, ("cntk", "asgd")):
        sub = [r for r in fixes if r["costs"] == cost]
        for name in dict.fromkeys(r["fix"] for r in sub):
            pts = validate.series(sub, "workers", fix=name)
            ax.plot([r["workers"] for r in pts], [r["total_s"] for r in pts], "o-", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ws = sorted({r["workers"] for r in sub})
        ax.set_xticks(ws, [str(w) for w in ws])
        common.decorate(ax, f"the fixes, {'CNTK-like costs (from the paper)' if cost == 'cntk' else 'asgd costs'}",
                        10, dict(fontsize=7.5), dict(which="both"), xlabel="workers (16 ranks per Blue Waters node)",
                        ylabel=f"total seconds, {SRC['sim']}")
    save_figure(fig, path_fixes)


# -- scale -------------------------------------------------------------------------------------

def run_scale(out: Path, params: Path, meta: dict) -> None:
    """1,024 workers, one epoch of the default problem: how long the simulation takes."""
    rows = []
    for label, extra in (("here (one 2-core node)", []),
                         ("bluewaters (64 nodes, torus)", ["--machine", "bluewaters", "--nodes", "65"])):
        cmd = [sys.executable, "-m", "asgd.sim", "--params", str(params), "-n", "1025", "--epochs", "1", "--json",
               *extra]
        load = os.getloadavg()[0]
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=common.ROOT)
        wall = time.perf_counter() - t
        if p.returncode:
            print(f"  {label}: FAILED {p.stderr[-500:]}")
            continue
        got = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append({"platform": label, "workers": 1024, "process_wall_s": wall, "sim_wall_s": got["sim_wall_s"],
                     "simulated_wall_s": got["wall_s"], "load_1min_before": load,
                     "under_60_s": wall < 60, "command": " ".join(cmd[1:])})
        print(f"  {label}: {wall:.1f} s for the whole command ({got['sim_wall_s']:.1f} s in the engine), "
              f"load {load:.1f}: {validate.verdict(wall < 60)} (< 60 s)", flush=True)
    write_outputs(out, "scale", rows, meta)


def main(argv=None) -> int:
    a = parse_args(argv)
    run = common.Run("sim", a, load_every_s=None)   # validate samples the load during its runs
    out = run.out
    meta = {**run.head(), "quick": a.quick}   # machine, command, commit, args: what headline.py reads
    params, meta["calibrate_s"] = validate.params_file(a.params, out, a.quick, a.cpu_lock)
    meta["params_file"] = str(params)
    validate.need_simulator()
    if a.part in ("all", "validate"):
        run_validate(a, out, params, dict(meta))
    if a.part in ("all", "paper"):
        print("the paper's experiments, simulated:", flush=True)
        run_paper(a, out, params, dict(meta))
    if a.part in ("all", "scale"):
        print("1,024 workers, one epoch of the default problem:", flush=True)
        run_scale(out, params, dict(meta))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
