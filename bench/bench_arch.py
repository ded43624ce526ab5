"""Alqahtani & Demirbas's experiment with asgd's numbers, on the emulated cluster: synchronous
SGD's time per iteration, split into computation and communication, and updates/s, against
workers (2, 4, 8, 12, 16) for five architectures, at 2-10K-2 and 2-100K-2, every point
measured, predicted by the analytical model and simulated, in one run; then Yan et al.'s
optimizer checked against the measurements, at this rate and at a second one.

    python bench/bench_arch.py                       # the sweep below: about 25 minutes on 2 cores
    python bench/bench_arch.py --quick               # workers 2,4; 2-10K-2; 5 iterations; no second rate
    python bench/bench_arch.py --params params.json  # reuse a calibration of this machine
    python bench/bench_arch.py --sweep bench/results/arch/arch.json --second-rate 300mbit \
        --out bench/results/arch-300                 # only the winner check at another rate

Architectures (asgd.train --mode sync --optimizer sgd, every rank on a host of its own):
  1-PS        --arch ps --servers 1
  PS, S=W/4   --arch ps --servers W/4 (Alqahtani's sharded parameter servers; at 2 and 4
              workers W/4 rounds to 1: the 1-PS run, not run twice)
  P2P         --arch p2p (every rank a worker and the owner of 1/W of w)
  RA          --arch allreduce (asgd's ring allreduce, the default --allreduce ring)
  PS, K=2     --arch ps --servers 1 --model-parallel 2 (Yan et al.'s model partitioning: W
              worker ranks in W/2 replicas of 2, each member half of the hidden layer)

The rate (--rate, default 100mbit). The question is which architecture the network favours,
so the network must bind for every architecture at every worker count: its communication
must outweigh the computation, whatever the cores do. Measured on this machine (2 cores
shared by every host), a step of 2-10K-2 at batch 16 takes 0.3-0.7 ms and all W workers'
steps 0.2-0.4 W ms per iteration; the least an iteration moves over the busiest link is
allreduce's and p2p's 2 (W - 1) / W x 428 KB (framed) each way, 0.86 MB at 16 workers. At
100 Mbit/s (12.5 MB/s) that is 34-64 ms against 0.7-6 ms of steps (2-100K-2: 0.34-0.64 s
against 7-60 ms): communication 6-50x the computation, for every architecture, both models.
1-PS at 16 workers moves 16 x 2 x 428 KB through its server's link: 1.1 s an iteration at
2-10K-2, 11 s at 2-100K-2, which sets the sweep's length (--iterations: 20 at 2-10K-2, 6 at
2-100K-2). At 1 Gbit/s the allreduce ring's 2 (W - 1) polled steps (up to 1 ms of sleep each
while 16 ranks share 2 cores) would weigh as much as its bytes.

What each point is:
  measured   `asgd.testbed run [--check-bytes] -- mpiexec -n N python -m asgd.train --mode sync
             --optimizer sgd --data D ...` on a file of replicas x batch x iterations points (and
             16 held out): per iteration = (train_s - rank 0's evaluation) / iterations; its
             computation = the workers' (peers') mean `compute` phase / iterations, its
             communication the rest. The byte proof (--check-bytes) checks every ps and ring
             allreduce run (p2p and model partitioning have no proof yet: their wire/app
             ratio is reported). Each run holds the machine's CPU lock (/tmp/asgd-cpu.lock),
             the 1-minute load average beside it.
  predicted  asgd.perf.analytic.predict (asgd.perf.architectures for lockstep runs) with
             asgd.testbed.model.testbed_params: this machine's calibration, the links' rate,
             burst and TCP/IP framing, and each exchange's link efficiency, measured by
             no-compute probes across the testbed's hosts at rank counts of their own (3, 6,
             10; ps 4, 7, 11: none of the sweep's), before the sweep. Nothing is fitted to
             the sweep.
  simulated  asgd.sim --like RUN --machine testbed with the same params.json: every rank an
             actor computing on the machine's cores, its messages over its own link.
The validation is out of sample: calibrate and the probes never see a sweep run.

Then:
  ordering   at 8 and 16 workers, the measured ordering of 1-PS, PS S=W/4, P2P and RA by time per
             iteration, beside Alqahtani & Demirbas's finding (1PS worst, RA best, P2P between),
             and the predicted and simulated orderings
  optimizer  asgd.perf's optimize over the sweep's configurations at this rate (time to
             --epochs epochs of --points points: init + epochs x iterations per epoch x T_iter);
             its first configuration's measured time against the best measured (pass: <= 1.10)
  rates      the same at --second-rate (default 1gbit; probes again there): the model's winner
             at each rate, and both winners measured at both rates, to show whether the winner
             changes with the rate the way the model says

Writes arch.csv, arch.json (rows, summaries, probes, machine, load) and one figure per
model size, arch-h10000.png and arch-h100000.png (time per iteration split into computation
and communication per architecture and worker count, measured, with the model's and the
simulator's; updates/s), under --out (bench/results/arch). Needs root (asgd.testbed) and
SimGrid for the simulated column (--no-sim without it). Run it without an outer `flock`: it
takes the CPU lock per run itself.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402,I001  (first: pins threads, puts src/ on the path)
from common import int_list  # noqa: E402

import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

ARCHS = ("1-PS", "PS S=W/4", "P2P", "RA", "PS K=2")
ORDERED = ("1-PS", "PS S=W/4", "P2P", "RA")          # the four Alqahtani compared
ALQAHTANI = "1PS worst, RA best, P2P between"
COLUMNS = {"iteration_s": "measured: (train_s - rank 0's evaluate) / iterations",
           "compute_s": "measured: the workers' (peers') mean compute phase / iterations",
           "comm_s": "measured: iteration_s - compute_s",
           "updates_per_s": "versions of w per second: 1 / iteration_s (sync: one per iteration)",
           "samples_per_s": "replicas x batch / iteration_s",
           "pred_*": "asgd.perf.analytic.predict with asgd.testbed.model's params (predicted)",
           "sim_*": "asgd.sim --like RUN --machine testbed (simulated)",
           "*_ape": "|predicted - measured| / measured, % (of iteration_s)",
           "wire_over_app": "bytes every host's link carried / bytes results.json counts, sent"}


def parse_args(argv=None):
    p = common.parser(__doc__, "arch")
    p.add_argument("--workers", type=int_list, default=[2, 4, 8, 12, 16], help="comma list (default 2,4,8,12,16)")
    p.add_argument("--hidden", type=int_list, default=[10000, 100000], help="comma list (default 10000,100000)")
    p.add_argument("--iterations", type=int_list, default=[20, 6],
                   help="iterations per run, one per --hidden (default 20,6)")
    p.add_argument("--batch", type=int, default=16, help="per-worker batch (default 16)")
    p.add_argument("--rate", default="100mbit", help="each link, each direction (default 100mbit; see above)")
    p.add_argument("--second-rate", default="1gbit", help="the optimizer's second rate (default 1gbit; none: skip)")
    p.add_argument("--epochs", type=int, default=10, help="optimize: epochs of --points points (default 10)")
    p.add_argument("--points", type=int, default=16384, help="optimize: training points (default 16384)")
    p.add_argument("--params", type=Path, help="this machine's calibration (default: calibrate now)")
    p.add_argument("--name", default="ba", help="testbed name (default ba)")
    p.add_argument("--no-check-bytes", action="store_true", help="skip the byte proof of ps and ring runs")
    p.add_argument("--no-sim", action="store_true", help="no simulated column (no SimGrid here)")
    p.add_argument("--cpu-lock", default=common.CPU_LOCK, help="the CPU lock each run holds (none: no lock)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds one run may take (default 1200)")
    p.add_argument("--quick", action="store_true", help="workers 2,4; 2-10K-2; 5 iterations; no second rate")
    p.add_argument("--sweep", type=Path, help="an earlier run's arch.json: only the --second-rate check, on that "
                   "sweep (its --rate rows, testbed-params-RATE.json beside it, and its calibration unless "
                   "--params); writes second_rate.json")
    a = p.parse_args(argv)
    if a.quick:
        a.workers, a.hidden, a.iterations, a.second_rate = [2, 4], [10000], [5], "none"
    if len(a.iterations) == 1:
        a.iterations = a.iterations * len(a.hidden)
    if len(a.iterations) != len(a.hidden):
        p.error("--iterations: one per --hidden")
    if a.sweep and not a.sweep.is_file():
        p.error(f"--sweep: no file {a.sweep} (an arch.json that bench_arch wrote)")
    a.cpu_lock = None if a.cpu_lock == "none" else a.cpu_lock
    return a


# -- the configurations ------------------------------------------------------------------

def configuration(label: str, W: int) -> dict | None:
    """asgd.train's architecture options of one label at W workers (None: not runnable)."""
    if label == "1-PS":
        return {"arch": "ps", "servers": 1, "model_parallel": 1}
    if label == "PS S=W/4":
        return {"arch": "ps", "servers": max(1, W // 4), "model_parallel": 1}
    if label == "P2P":
        return {"arch": "p2p", "servers": 0, "model_parallel": 1}
    if label == "RA":
        return {"arch": "allreduce", "servers": 0, "model_parallel": 1}
    if label == "PS K=2":
        return {"arch": "ps", "servers": 1, "model_parallel": 2} if W % 2 == 0 else None
    raise ValueError(label)


def train_args(cfg: dict, hidden: int, batch: int, data: Path, out: Path, timeout: float) -> list[str]:
    args = ["--arch", cfg["arch"], "--mode", "sync", "--optimizer", "sgd", "--hidden", str(hidden), "--batch",
            str(batch), "--epochs", "1", "--data", str(data), "--quiet", "--out", str(out), "--timeout", str(int(timeout))]
    if cfg["arch"] == "ps":
        args += ["--servers", str(cfg["servers"])]
    if cfg["model_parallel"] > 1:
        args += ["--model-parallel", str(cfg["model_parallel"])]
    return args


def data_file(folder: Path, points: int) -> Path:
    """A file of `points` training points (and 16 held out), made once."""
    path = folder / f"d{points}.tsv"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "asgd.data", "generate", "--points", str(points), "--test-points",
                        "16", "--out", str(path)], check=True, capture_output=True, timeout=300)
    return path


# -- measuring ------------------------------------------------------------------------------

def measured(res: dict, iterations: int) -> dict:
    """Per iteration: its time, the workers' computation, the rest."""
    ranks = res["ranks"]
    workers = [r for r in ranks if r["role"] in ("worker", "peer")]
    evaluate = ranks[0]["phases"].get("evaluate", 0.0)
    it = (res["train_s"] - evaluate) / iterations
    compute = statistics.fmean(r["phases"].get("compute", 0.0) for r in workers) / iterations
    return {"iteration_s": it, "compute_s": compute, "comm_s": max(it - compute, 0.0)}


def one_run(tb, label: str, W: int, hidden: int, iterations: int, a, out: Path, rate: str) -> dict | None:
    cfg = configuration(label, W)
    replicas = W // cfg["model_parallel"]
    data = data_file(out / "data", replicas * a.batch * iterations)
    run_dir = out / "runs" / f"{rate}-h{hidden}-w{W}-{label.replace(' ', '').replace('/', '').replace('=', '')}"
    ranks = W + (cfg["servers"] if cfg["arch"] == "ps" else 0)
    cmd = [common.launch.find(), "-n", str(ranks), sys.executable, "-m", "asgd.train",
           *train_args(cfg, hidden, a.batch, data, run_dir, a.timeout - 60)]
    provable = not a.no_check_bytes and cfg["arch"] in ("ps", "allreduce") and cfg["model_parallel"] == 1
    with common.cpu_lock(a.cpu_lock) as load0:
        try:
            res = tb.run(cmd, check_bytes=provable, timeout=a.timeout, capture=True, say=lambda *x, **k: None)
        except Exception as e:  # noqa: BLE001  (a failed run is reported and skipped)
            print(f"  {label} W={W} h={hidden}: failed: {str(e)[-300:]}", flush=True)
            return None
        load1 = os.getloadavg()[0]
    if res.rc or res.results is None:
        print(f"  {label} W={W} h={hidden}: exit {res.rc}: {(res.stderr or '')[-300:]}", flush=True)
        return None
    r = res.results
    m = measured(r, iterations)
    app_sent = sum(x["bytes_sent"] for x in r["ranks"])
    wire_sent = sum(h["sent"] for h in res.wire) if res.wire else None
    return {"label": label, "rate": rate, "hidden": hidden, "workers": W, "replicas": replicas, "ranks": ranks,
            "batch": a.batch, "iterations": iterations, **cfg, **m,
            "updates_per_s": 1 / m["iteration_s"], "samples_per_s": replicas * a.batch / m["iteration_s"],
            "train_s": r["train_s"], "init_s": r["init_s"], "run_dir": str(run_dir),
            "proof_ok": res.proof["ok"] if res.proof else None,
            "wire_over_app": round(wire_sent / app_sent, 4) if wire_sent and app_sent else None,
            "load_1min": round((load0 + load1) / 2, 2), "wall_s": round(res.wall_s, 1)}


def predict_rows(rows: list[dict], params, a) -> None:
    """pred_* on every row: the analytical model, from the run's own configuration."""
    from asgd.perf import analytic
    from asgd.perf.cli import run_of
    for row in rows:
        res = json.loads((Path(row["run_dir"]) / "results.json").read_text())
        run = run_of(res, params)
        pr = analytic.predict(params, run)
        d = pr.detail
        row.update(pred_iteration_s=d["iteration_s"], pred_compute_s=d["iteration_compute_s"],
                   pred_comm_s=d["iteration_comm_s"], pred_bound=d["bound"],
                   pred_ape=100 * abs(d["iteration_s"] - row["iteration_s"]) / row["iteration_s"],
                   pred_terms={k: round(v, 6) if isinstance(v, float) else v for k, v in d["terms"].items()})


def simulate_rows(rows: list[dict], params_path: Path) -> None:
    """sim_* on every row: asgd.sim --like RUN --machine testbed, each in a forked process."""
    from asgd.sim import cli
    from asgd.sim.costs import Costs, load_params
    from asgd.sim.run import simulate_isolated
    p, raw = load_params(str(params_path))
    for row in rows:
        args = cli.parse_args(["--like", row["run_dir"], "--params", str(params_path), "--machine", "testbed"])
        spec, data_path = cli.spec_from_args(args, p)
        t = time.perf_counter()
        res = simulate_isolated(spec, Costs(p, spec, raw), None, False, (0, 200), raw.get("sleep_overhead_s"),
                                data_path, str(params_path))
        m = measured(res, row["iterations"])
        row.update(sim_iteration_s=m["iteration_s"], sim_compute_s=m["compute_s"], sim_comm_s=m["comm_s"],
                   sim_ape=100 * abs(m["iteration_s"] - row["iteration_s"]) / row["iteration_s"],
                   sim_wall_s=round(time.perf_counter() - t, 2))


# -- the testbed's params ----------------------------------------------------------------------

def testbed_params(tb, base, base_raw: dict, rate_bit: float, hiddens: list[int], workers: list[int], a, out: Path,
                   tag: str) -> tuple[object, Path, dict]:
    """This machine's calibration on the testbed's links: rate, burst, framing, and each
    exchange's efficiency, probed across its hosts (asgd.testbed.model.measure_efficiency)."""
    from asgd.testbed import model
    sizes = [5 * h + 2 for h in hiddens]                      # 2-H-2's n_w
    hosts = max(workers) + max(1, max(workers) // 4)
    probe_ranks = {k: tuple(P for P in v if P <= hosts) for k, v in model.PROBE_RANKS.items()}
    print(f"[{tag}] link efficiency probes (no compute) at {probe_ranks} ranks, n_w {sizes}:", flush=True)
    with common.cpu_lock(a.cpu_lock):
        eff = model.measure_efficiency(tb, base, rate_bit, sizes, kinds=("ps", "p2p", "ring"), ranks=probe_ranks,
                                       rounds=4 if a.quick else 6)
    grid = sorted({k for n in sizes for k in model._probe_sizes(n, hosts)} | set(base.round_trip_s))
    p = dataclasses.replace(model.testbed_params(base, rate_bit, sizes=grid), link_efficiency=eff)
    raw = {**base_raw, "params": {**base_raw["params"], **json.loads(json.dumps(dataclasses.asdict(p)))}}
    path = out / f"testbed-params-{tag}.json"
    path.write_text(json.dumps(raw, indent=1))
    return p, path, eff


# -- the optimizer ------------------------------------------------------------------------------

def epoch_time(row: dict, a, prefix: str = "") -> float:
    """Time to a.epochs epochs of a.points points at this row's time per iteration, after its init."""
    iters = math.ceil(a.points / (row["replicas"] * a.batch))
    return row["init_s"] + a.epochs * iters * row[f"{prefix}iteration_s"]


def optimizer_check(params, rows: list[dict], hidden: int, a, hosts: int) -> dict:
    """asgd.perf's optimize over the sweep's grid at this hidden size: its first
    configuration among those measured, against the best measured."""
    from asgd.perf import cli
    from asgd.perf.analytic import Run
    base = Run(workers=1, hidden=hidden, batch=a.batch, epochs=a.epochs, points=a.points, test_points=16,
               mode="sync", optimizer="sgd")
    ranked = cli.optimize(params, hosts, params.cores, base, sorted({r["workers"] for r in rows}),
                          sorted({r["servers"] for r in rows if r["arch"] == "ps"}), [a.batch], ["parallel"], hosts,
                          archs=("ps", "p2p", "allreduce"), Ks=(1, 2), shared_cores=True)
    key = lambda r: (r["arch"], r["servers"] if r["arch"] == "ps" else 0, r["model_parallel"], r["workers"])  # noqa: E731
    swept = {key(r): r for r in rows if r["hidden"] == hidden}
    first = next((r for r in ranked if key(r) in swept), None)
    best = min(swept.values(), key=lambda r: epoch_time(r, a))
    got = swept[key(first)] if first else None
    return {"hidden": hidden, "optimize_first_overall": {k: ranked[0][k] for k in ("arch", "servers", "model_parallel",
                                                                                  "workers", "bound")},
            "optimize_first_swept": got and {"label": got["label"], "workers": got["workers"],
                                             "predicted_s": first["total_s"], "measured_s": epoch_time(got, a),
                                             "bound": first["bound"]},
            "best_measured": {"label": best["label"], "workers": best["workers"], "measured_s": epoch_time(best, a)},
            "ratio": epoch_time(got, a) / epoch_time(best, a) if got else None,
            "pass": bool(got) and epoch_time(got, a) / epoch_time(best, a) <= 1.10,
            "predicted_top5": [{k: r[k] for k in ("arch", "servers", "model_parallel", "workers", "total_s", "bound")}
                               for r in ranked[:5]]}


# -- summaries -------------------------------------------------------------------------------------

def orderings(rows: list[dict], hidden: int, W: int) -> dict:
    rs = {r["label"]: r for r in rows if r["hidden"] == hidden and r["workers"] == W and r["label"] in ORDERED}
    out = {}
    for who, key in (("measured", "iteration_s"), ("predicted", "pred_iteration_s"), ("simulated", "sim_iteration_s")):
        have = [lab for lab in ORDERED if lab in rs and rs[lab].get(key) is not None]
        out[who] = sorted(have, key=lambda lab: rs[lab][key])   # best (fastest) first
        out[f"{who}_s"] = {lab: round(rs[lab][key], 4) for lab in have}
    m = out["measured"]
    if {"1-PS", "P2P", "RA"} <= set(m):
        worst_1ps = m.index("1-PS") == len(m) - 1
        ra_best = m.index("RA") == 0
        between = m.index("RA") < m.index("P2P") < m.index("1-PS")
        out["agrees_with_alqahtani"] = {"1PS worst": worst_1ps, "RA best": ra_best, "P2P between": between}
    return out


def ape_summary(rows: list[dict]) -> dict:
    out = {}
    for who in ("pred", "sim"):
        for lab in ARCHS:
            e = [r[f"{who}_ape"] for r in rows if r["label"] == lab and r.get(f"{who}_ape") is not None]
            if e:
                out.setdefault(who, {})[lab] = {"median": round(statistics.median(e), 1), "max": round(max(e), 1),
                                                "runs": len(e)}
        e = [r[f"{who}_ape"] for r in rows if r.get(f"{who}_ape") is not None]
        if e:
            out.setdefault(who, {})["all"] = {"median": round(statistics.median(e), 1), "max": round(max(e), 1),
                                              "runs": len(e)}
    return out


# -- the figure -------------------------------------------------------------------------------------

def plot(rows: list[dict], info: dict, hidden: int, path: Path) -> None:
    """Alqahtani & Demirbas's figure with asgd's numbers: per worker count, one bar per
    architecture, its computation (dark) and communication (light) per iteration, measured;
    the model's (x) and the simulator's (o) time per iteration over it; right: updates/s."""
    plt = common.pyplot()
    rs = [r for r in rows if r["hidden"] == hidden and r["rate"] == info["rate"]]
    workers = sorted({r["workers"] for r in rs})
    colors = dict(zip(ARCHS, ("tab:red", "tab:orange", "tab:blue", "tab:green", "tab:purple")))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(15, 5.6), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(ARCHS)
    for i, lab in enumerate(ARCHS):
        for j, W in enumerate(workers):
            r = next((x for x in rs if x["label"] == lab and x["workers"] == W), None)
            if r is None:
                continue
            x = j + (i - (len(ARCHS) - 1) / 2) * width
            ax.bar(x, r["compute_s"], width, color=colors[lab], label=f"{lab}: computation" if j == 0 else None)
            ax.bar(x, r["comm_s"], width, bottom=r["compute_s"], color=colors[lab], alpha=0.35,
                   label=f"{lab}: communication" if j == 0 else None)
            if r.get("pred_iteration_s"):
                ax.plot(x, r["pred_iteration_s"], "kx", ms=6, label="predicted (model)" if i == j == 0 else None)
            if r.get("sim_iteration_s"):
                ax.plot(x, r["sim_iteration_s"], "o", mfc="none", mec="k", ms=5,
                        label="simulated (asgd.sim)" if i == j == 0 else None)
    ax.set_xticks(range(len(workers)), [str(w) for w in workers])
    ax.set_yscale("log")
    ax.set_xlabel("workers (each on a host of its own)")
    ax.set_ylabel("seconds per iteration (log)")
    ax.set_title(f"2-{hidden}-2, batch {rs[0]['batch'] if rs else '?'}, sync SGD, {info['rate']} links: measured "
                 "bars (dark: computation, light: communication)", fontsize=9)
    ax.legend(fontsize=6.5, ncol=2, loc="upper left")
    ax.grid(alpha=0.3, axis="y", which="both")
    for lab in ARCHS:
        pts = sorted((x for x in rs if x["label"] == lab), key=lambda x: x["workers"])
        if pts:
            ax2.plot([x["workers"] for x in pts], [x["updates_per_s"] for x in pts], "-o", color=colors[lab],
                     label=f"{lab}, measured")
            if pts[0].get("pred_iteration_s"):
                ax2.plot([x["workers"] for x in pts], [1 / x["pred_iteration_s"] for x in pts], "--",
                         color=colors[lab], alpha=0.6, label=f"{lab}, predicted")
    ax2.set_xlabel("workers")
    ax2.set_ylabel("updates/s (one per iteration)")
    ax2.set_yscale("log")
    ax2.set_title("updates/s: measured (solid), predicted (dashed)", fontsize=9)
    ax2.grid(alpha=0.3, which="both")
    ax2.legend(fontsize=6.5, ncol=2)
    fig.suptitle("Measured on the emulated cluster, predicted by the analytical model, simulated by asgd.sim "
                 f"(load 1-min median {info.get('load', {}).get('loadavg_1min_median', '?')})", fontsize=10)
    common.save_figure(fig, path)


# -- main ------------------------------------------------------------------------------------------

def sweep(tb, a, out: Path, rate: str, configs) -> list[dict]:
    rows = []
    for hidden, iterations, W, label in configs:
        if label == "PS S=W/4" and W // 4 < 2:   # W/4 rounds to 1 server: the 1-PS run is this one
            same = next((r for r in rows if r["hidden"] == hidden and r["workers"] == W and r["label"] == "1-PS"), None)
            if same:
                rows.append({**same, "label": label, "same_as": "1-PS"})
            continue
        if configuration(label, W) is None:
            continue
        row = one_run(tb, label, W, hidden, iterations, a, out, rate)
        if row:
            rows.append(row)
            print(f"  [{rate}] 2-{hidden}-2 W={W:2d} {label:9s} {1e3 * row['iteration_s']:9.1f} ms/iteration "
                  f"(compute {1e3 * row['compute_s']:7.1f}, comm {1e3 * row['comm_s']:8.1f})  "
                  f"proof {row['proof_ok']}  wire/app {row['wire_over_app']}  load {row['load_1min']}", flush=True)
    return rows


def main(argv=None) -> int:
    a = parse_args(argv)
    from asgd.testbed import TestbedError, missing_requirements, parse_rate
    from asgd.testbed import lifecycle
    reason = missing_requirements()
    if reason:
        raise SystemExit(f"bench_arch: no testbed here: {reason}")
    run = common.Run("arch", a, end_on_signals=True)
    out = run.out
    if a.sweep:
        try:
            earlier = json.loads(a.sweep.read_text())
            sweep_rows, sweep_params = earlier["rows"], earlier["summary"]["params"]
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"bench_arch: --sweep {a.sweep}: not an arch.json that bench_arch wrote") from None
        a.params = a.params or Path(sweep_params)   # the calibration that sweep was predicted from
    if a.params:
        base_path = a.params
    else:
        print("calibrating this machine (python -m asgd.perf calibrate), holding the CPU lock ...", flush=True)
        base_path = out / "params.json"
        with common.cpu_lock(a.cpu_lock):
            subprocess.run([sys.executable, "-m", "asgd.perf", "calibrate", "--out", str(base_path)], check=True,
                           timeout=3600)
    from asgd.perf.cli import PerfError, load_params
    base = load_params(str(base_path))
    base_raw = json.loads(Path(base_path).read_text())
    rate_bit = parse_rate(a.rate)
    hosts = max(a.workers) + max(1, max(a.workers) // 4)
    if a.sweep:   # the winner at another rate, against a sweep measured before
        rows = [r for r in sweep_rows if r["rate"] == a.rate]
        if not rows or a.second_rate == "none":
            raise SystemExit(f"bench_arch: --sweep needs rows at --rate {a.rate} in {a.sweep} and a --second-rate")
        try:
            params = load_params(str(a.sweep.parent / f"testbed-params-{a.rate}.json"))
        except PerfError as e:
            raise SystemExit(f"bench_arch: --sweep: {e}") from None
        got = second_rate(a, base, base_raw, rows, params, out, hosts)
        (out / "second_rate.json").write_text(json.dumps(got, indent=1))
        print(f"wrote {out / 'second_rate.json'}")
        return 0
    if lifecycle.exists(a.name):
        lifecycle.down(a.name, say=lambda *x, **k: None)
    tb = lifecycle.up(a.name, hosts, rate_bit)
    t0 = time.perf_counter()
    info = {"rate": a.rate, "rate_bit": rate_bit, "hosts": hosts, "params": str(base_path)}
    try:
        params, params_path, eff = testbed_params(tb, base, base_raw, rate_bit, a.hidden, a.workers, a, out, a.rate)
        info["link_efficiency"] = eff
        configs = [(h, it, W, lab) for h, it in zip(a.hidden, a.iterations) for W in a.workers for lab in ARCHS]
        print(f"sweep: {len(configs)} points at {a.rate} ...", flush=True)
        rows = sweep(tb, a, out, a.rate, configs)
    except TestbedError as e:
        raise SystemExit(f"bench_arch: {e}")
    finally:
        tb.down()
    info["sweep_s"] = round(time.perf_counter() - t0, 1)
    if not rows:
        raise SystemExit("bench_arch: no run succeeded")
    predict_rows(rows, params, a)
    if not a.no_sim:
        print("simulating every run ...", flush=True)
        simulate_rows(rows, params_path)
    info["orderings"] = {h: {W: orderings(rows, h, W) for W in (8, 16) if W in a.workers} for h in a.hidden}
    info["ape"] = ape_summary(rows)
    info["optimizer"] = {h: optimizer_check(params, rows, h, a, hosts) for h in a.hidden}
    if a.second_rate != "none":
        info["second_rate"] = second_rate(a, base, base_raw, rows, params, out, hosts)
    info["alqahtani"] = ALQAHTANI
    meta = run.meta(summary=info, columns=COLUMNS)
    run.write(rows, meta)
    for h in a.hidden:
        run.plot(lambda rs, path, h=h: plot(rs, {**info, "load": run.load}, h, path), rows, name=f"arch-h{h}")
    report(rows, info, a)
    run.print_machine()
    run.wrote()
    return 0


def second_rate(a, base, base_raw, rows, params, out: Path, hosts: int) -> dict:
    """The model's winner at --rate and at --second-rate (per hidden size), each measured at
    both rates: does the winner change the way the model says?"""
    from asgd.perf import cli
    from asgd.perf.analytic import Run
    from asgd.testbed import lifecycle, parse_rate
    rate2 = parse_rate(a.second_rate)
    tb = lifecycle.up(a.name, hosts, rate2)
    got = {}
    try:
        params2, _, eff2 = testbed_params(tb, base, base_raw, rate2, a.hidden, a.workers, a, out, a.second_rate)
        for h, it in zip(a.hidden, a.iterations):
            labels_of = {}
            for p_, tag in ((params, a.rate), (params2, a.second_rate)):
                base_run = Run(workers=1, hidden=h, batch=a.batch, epochs=a.epochs, points=a.points, test_points=16,
                               mode="sync", optimizer="sgd")
                ranked = cli.optimize(p_, hosts, p_.cores, base_run, a.workers, sorted({1, *(W // 4 for W in a.workers
                                                                                          if W // 4 > 1)}),
                                      [a.batch], ["parallel"], hosts, archs=("ps", "p2p", "allreduce"), Ks=(1, 2),
                                      shared_cores=True)
                swept = [r for r in ranked if _label(r) is not None]
                labels_of[tag] = (_label(swept[0]), swept[0]["workers"], swept[0]["total_s"], swept[0]["bound"])
            winners = {labels_of[a.rate][:2], labels_of[a.second_rate][:2]}
            measured = {a.rate: {}, a.second_rate: {}}
            for lab, W in winners:
                r1 = next((r for r in rows if r["hidden"] == h and r["label"] == lab and r["workers"] == W), None)
                measured[a.rate][f"{lab} W={W}"] = epoch_time(r1, a) if r1 else None
                r2 = one_run(tb, lab, W, h, it, a, out, a.second_rate)
                measured[a.second_rate][f"{lab} W={W}"] = epoch_time(r2, a) if r2 else None
                if r2:
                    rows.append(r2)
            got[h] = {"model_winner": {k: {"label": v[0], "workers": v[1], "predicted_s": v[2], "bound": v[3]}
                                       for k, v in labels_of.items()},
                      "measured_s": measured, "link_efficiency": eff2}
            print(f"  2-{h}-2: the model's winner at {a.rate}: {labels_of[a.rate][0]} W={labels_of[a.rate][1]}, at "
                  f"{a.second_rate}: {labels_of[a.second_rate][0]} W={labels_of[a.second_rate][1]}; measured "
                  f"{json.dumps(measured)}", flush=True)
    finally:
        tb.down()
    return got


def _label(r: dict) -> str | None:
    """The sweep's label of an optimize row, if the sweep has that architecture."""
    if r["arch"] == "p2p" and r["model_parallel"] == 1:
        return "P2P"
    if r["arch"] == "allreduce" and r["model_parallel"] == 1:
        return "RA"
    if r["arch"] == "ps" and r["model_parallel"] == 2 and r["servers"] == 1:
        return "PS K=2"
    if r["arch"] == "ps" and r["model_parallel"] == 1:
        if r["servers"] == 1:
            return "1-PS"
        if r["servers"] == r["workers"] // 4:
            return "PS S=W/4"
    return None


def report(rows: list[dict], info: dict, a) -> None:
    common.print_table(rows, [("rate", "rate", ""), ("hidden", "hidden", "d"), ("W", "workers", "d"),
                              ("arch", "label", ""), ("ms/it", "iteration_s", ".4f"), ("compute", "compute_s", ".4f"),
                              ("comm", "comm_s", ".4f"), ("model", "pred_iteration_s", ".4f"),
                              ("APE%", "pred_ape", ".1f"), ("sim", "sim_iteration_s", ".4f"), ("APE%", "sim_ape", ".1f"),
                              ("bound", "pred_bound", ""), ("proof", "proof_ok", ""), ("load", "load_1min", ".1f")],
                       title="\nseconds per iteration: measured on the emulated cluster / predicted / simulated")
    for h, by_w in info["orderings"].items():
        for W, o in by_w.items():
            print(f"2-{h}-2, {W} workers: measured order (fastest first) {' < '.join(o['measured'])}; predicted "
                  f"{' < '.join(o['predicted'])}; simulated {' < '.join(o.get('simulated') or [])}; Alqahtani & "
                  f"Demirbas: {ALQAHTANI}; agrees: {o.get('agrees_with_alqahtani')}")
    for who, by in info["ape"].items():
        print(f"{'model' if who == 'pred' else 'simulator'} median APE of the time per iteration: "
              + ", ".join(f"{lab} {v['median']}% (max {v['max']}%, {v['runs']} runs)" for lab, v in by.items()))
    for h, o in info["optimizer"].items():
        f, b = o["optimize_first_swept"], o["best_measured"]
        print(f"optimize, 2-{h}-2: first {f and f['label']} W={f and f['workers']} ({f and f['bound']}-bound), measured "
              f"{f and round(f['measured_s'], 1)} s; best measured {b['label']} W={b['workers']} "
              f"{round(b['measured_s'], 1)} s: ratio {o['ratio'] and round(o['ratio'], 3)} "
              f"({'PASS' if o['pass'] else 'FAIL'}, <= 1.10)")


if __name__ == "__main__":
    sys.exit(main())
