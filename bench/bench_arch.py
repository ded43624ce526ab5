"""Alqahtani & Demirbas's experiment with asgd's numbers, on the emulated cluster (root):
synchronous SGD's time per iteration and updates/s against workers for 1-PS, PS S=W/4, P2P,
RA and PS K=2, measured, predicted and simulated; then Yan et al.'s optimizer against the
measurements, at --rate and --second-rate (why 100 Mbit/s: docs/benchmarks.md). --no-sim
without SimGrid; run it without an outer `flock`. Writes arch.csv, arch.json, arch-h{H}.png.

    python bench/bench_arch.py                       # about 25 minutes on 2 cores
    python bench/bench_arch.py --quick               # workers 2,4; 2-10K-2; 5 iterations
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # first: pins threads, puts src/ on the path
import validate
from common import int_list

import dataclasses
import json
import math
import statistics
import time

from asgd.core.wire import PRECISIONS
from asgd.run.config import Config

ARCHS = ("1-PS", "PS S=W/4", "P2P", "RA", "PS K=2")
ORDERED = ("1-PS", "PS S=W/4", "P2P", "RA")          # the four Alqahtani compared
ALQAHTANI = "1PS worst, RA best, P2P between"
COLUMNS = {"iteration_s": "measured: (train_s - rank 0's evaluate) / iterations",
           "compute_s": "measured: the workers' (peers') mean compute phase / iterations",
           "comm_s": "measured: iteration_s - compute_s",
           "updates_per_s": "versions of w per second: 1 / iteration_s (sync: one per iteration)",
           "samples_per_s": "replicas x batch / iteration_s",
           "pred_*": "asgd.perf.architectures.predict with asgd.testbed.model's params (predicted)",
           "sim_*": "asgd.sim --like RUN --machine testbed (simulated)",
           "*_ape": "|predicted - measured| / measured, % (of iteration_s)",
           "wire_over_app": "bytes every host's link carried / bytes results.json counts, sent"}


def parse_args(argv=None):
    p = common.parser(__doc__, "arch", lock=True)
    p.add_argument("--workers", type=int_list, default=[2, 4, 8, 12, 16], help="comma list (default 2,4,8,12,16)")
    p.add_argument("--hidden", type=int_list, default=[10000, 100000], help="comma list (default 10000,100000)")
    p.add_argument("--iterations", type=int_list, default=[20, 6],
                   help="iterations per run, one per --hidden (default 20,6)")
    p.add_argument("--batch", type=int, default=16, help="per-worker batch (default 16)")
    p.add_argument("--rate", default="100mbit",
                   help="each link, each direction (default 100mbit; why: docs/benchmarks.md)")
    p.add_argument("--second-rate", default="1gbit", help="the optimizer's second rate (default 1gbit; none: skip)")
    p.add_argument("--epochs", type=int, default=10, help="optimize: epochs of --points points (default 10)")
    p.add_argument("--points", type=int, default=16384, help="optimize: training points (default 16384)")
    p.add_argument("--params", type=Path, help="this machine's calibration (default: calibrate now)")
    p.add_argument("--precision", choices=PRECISIONS, default=Config().precision,
                   help="asgd.train's --precision of every run (default asgd.train's)")
    p.add_argument("--name", default="ba", help="testbed name (default ba)")
    p.add_argument("--no-check-bytes", action="store_true", help="skip the byte proof of ps and ring runs")
    p.add_argument("--no-sim", action="store_true", help="no simulated column (no SimGrid here)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds one run may take (default 1200)")
    p.add_argument("--quick", action="store_true", help="workers 2,4; 2-10K-2; 5 iterations; no second rate")
    a = p.parse_args(argv)
    if a.quick:
        a.workers, a.hidden, a.iterations, a.second_rate = [2, 4], [10000], [5], "none"
    if len(a.iterations) == 1:
        a.iterations = a.iterations * len(a.hidden)
    if len(a.iterations) != len(a.hidden):
        p.error("--iterations: one per --hidden")
    return a


def configuration(label: str, W: int) -> dict | None:
    """asgd.train's options of one label at W workers (None: not runnable)."""
    return {"1-PS": {"arch": "ps", "servers": 1, "model_parallel": 1},
            "PS S=W/4": {"arch": "ps", "servers": max(1, W // 4), "model_parallel": 1},
            "P2P": {"arch": "p2p", "servers": 0, "model_parallel": 1},
            "RA": {"arch": "allreduce", "servers": 0, "model_parallel": 1},
            "PS K=2": {"arch": "ps", "servers": 1, "model_parallel": 2} if W % 2 == 0 else None}[label]


# -- measuring ------------------------------------------------------------------------------

def measured(res: dict, iterations: int) -> dict:
    """Per iteration: its time, the workers' computation, the rest."""
    workers = [r for r in res["ranks"] if r["role"] in ("worker", "peer")]
    it = (res["train_s"] - res["ranks"][0]["phases"].get("evaluate", 0.0)) / iterations
    compute = statistics.fmean(r["phases"].get("compute", 0.0) for r in workers) / iterations
    return {"iteration_s": it, "compute_s": compute, "comm_s": max(it - compute, 0.0)}


def one_run(tb, c: dict, a, out: Path) -> dict:
    """One sweep point c = {label, hidden, workers, iterations, rate} on the testbed."""
    label, W, hidden = c["label"], c["workers"], c["hidden"]
    cfg = configuration(label, W)
    replicas = W // cfg["model_parallel"]
    points = replicas * a.batch * c["iterations"]
    data = validate.generate(out / "data" / f"d{points}.tsv", points, 16)
    run_dir = out / "runs" / f"{c['rate']}-h{hidden}-w{W}-{label.replace(' ', '').replace('/', '').replace('=', '')}"
    ranks = W + (cfg["servers"] if cfg["arch"] == "ps" else 0)
    argv = ["-m", "asgd.train", "--arch", cfg["arch"], "--mode", "sync", "--optimizer", "sgd", "--hidden", str(hidden),
            "--batch", str(a.batch), "--epochs", "1", "--data", str(data), "--precision", a.precision, "--quiet",
            "--out", str(run_dir), "--timeout", str(int(a.timeout - 60))]
    argv += ["--servers", str(cfg["servers"])] if cfg["arch"] == "ps" else []
    argv += ["--model-parallel", str(cfg["model_parallel"])] if cfg["model_parallel"] > 1 else []
    provable = not a.no_check_bytes and cfg["arch"] in ("ps", "allreduce") and cfg["model_parallel"] == 1
    res, load = validate.testbed_job(tb, ranks, argv, a.timeout, provable)
    r = res.results
    m = measured(r, c["iterations"])
    app_sent = sum(x["bytes_sent"] for x in r["ranks"])
    wire_sent = sum(h["sent"] for h in res.wire) if res.wire else None
    return {"replicas": replicas, "ranks": ranks, "batch": a.batch, "precision": a.precision, **cfg, **m,
            "updates_per_s": 1 / m["iteration_s"], "samples_per_s": replicas * a.batch / m["iteration_s"],
            "train_s": r["train_s"], "init_s": r["init_s"], "run_dir": str(run_dir),
            "proof_ok": res.proof["ok"] if res.proof else None,
            "wire_over_app": round(wire_sent / app_sent, 4) if wire_sent and app_sent else None,
            "load_1min": load, "wall_s": round(res.wall_s, 1)}


def sweep(tb, a, out: Path, points: list[dict]) -> list[dict]:
    """Every runnable point; PS S=W/4 where W/4 rounds to 1 server is the 1-PS run, not run twice."""
    same = [c for c in points if c["label"] == "PS S=W/4" and c["workers"] // 4 < 2]
    todo = [c for c in points if c not in same and configuration(c["label"], c["workers"]) is not None]
    def say(r):
        return (f"{1e3 * r['iteration_s']:9.1f} ms/iteration (compute {1e3 * r['compute_s']:7.1f}, comm "
                f"{1e3 * r['comm_s']:8.1f})  proof {r['proof_ok']}  wire/app {r['wire_over_app']}")
    rows = validate.sweep(todo, lambda c: one_run(tb, c, a, out),
                          lambda c: f"[{c['rate']}] 2-{c['hidden']}-2 W={c['workers']:2d} {c['label']}", say,
                          lock=a.cpu_lock)
    for c in same:
        one_ps = next((r for r in rows if (r["hidden"], r["workers"], r["label"]) == (c["hidden"], c["workers"], "1-PS")
                       and r["rate"] == c["rate"]), None)
        if one_ps:
            rows.append({**one_ps, "label": c["label"], "same_as": "1-PS"})
    return rows


def predict_and_simulate(rows: list[dict], params, params_path, simulate: bool) -> None:
    """pred_* on every row and, if `simulate`, sim_* (asgd.sim --like RUN --machine testbed)."""
    for row in rows:
        d = validate.predict(params, validate.results(row["run_dir"])).detail
        row.update(pred_iteration_s=d["iteration_s"], pred_compute_s=d["iteration_compute_s"],
                   pred_comm_s=d["iteration_comm_s"], pred_bound=d["bound"],
                   pred_ape=validate.ape(d["iteration_s"], row["iteration_s"]),
                   pred_terms={k: round(v, 6) if isinstance(v, float) else v for k, v in d["terms"].items()})
        if simulate:
            t = time.perf_counter()
            m = measured(validate.simulate(params_path, row["run_dir"], machine="testbed"), row["iterations"])
            ape = validate.ape(m["iteration_s"], row["iteration_s"])
            row.update({f"sim_{k}": v for k, v in m.items()}, sim_ape=ape, sim_wall_s=round(time.perf_counter() - t, 2))


def testbed_params(tb, base, base_raw: dict, rate_bit: float, hiddens: list[int], workers: list[int], a, out: Path,
                   tag: str) -> tuple[object, Path, dict]:
    """This machine's calibration on the testbed's links: rate, burst, framing, and each
    exchange's efficiency, probed across its hosts (asgd.testbed.model.measure_efficiency)."""
    model = validate.testbed_model()
    sizes = [5 * h + 2 for h in hiddens]                      # 2-H-2's n_w
    hosts = max(workers) + max(1, max(workers) // 4)
    probe_ranks = {k: tuple(P for P in v if P <= hosts) for k, v in model.PROBE_RANKS.items()}
    print(f"[{tag}] link efficiency probes (no compute) at {probe_ranks} ranks, n_w {sizes}:", flush=True)
    with common.cpu_lock(a.cpu_lock):
        eff = model.measure_efficiency(tb, base, rate_bit, sizes, kinds=("ps", "p2p", "ring"), ranks=probe_ranks,
                                       rounds=4 if a.quick else 6)
    grid = sorted({k for n in sizes for k in model._probe_sizes(n, hosts)} | set(base.round_trip_s))
    p = dataclasses.replace(model.testbed_params(base, rate_bit, sizes=grid), link_efficiency=eff)
    return p, validate.with_costs(base_raw, p, out / f"testbed-params-{tag}.json"), eff


# -- the optimizer ------------------------------------------------------------------------------

def epoch_time(row: dict, a) -> float:
    """Time to a.epochs epochs of a.points points at this row's time per iteration, after its init."""
    return row["init_s"] + a.epochs * math.ceil(a.points / (row["replicas"] * a.batch)) * row["iteration_s"]


def ranked_configurations(params, hidden: int, a, hosts: int, workers, servers) -> list[dict]:
    """asgd.perf's optimize over these architectures, workers and servers, best first."""
    base = validate.Run(workers=1, hidden=hidden, batch=a.batch, epochs=a.epochs, points=a.points, test_points=16,
                        mode="sync", optimizer="sgd", precision=a.precision)
    return validate.optimize(params, hosts, params.cores, base, sorted(workers), sorted(servers), [a.batch],
                             ["parallel"], hosts, archs=("ps", "p2p", "allreduce"), Ks=(1, 2), shared_cores=True)


def optimizer_check(params, rows: list[dict], hidden: int, a, hosts: int) -> dict:
    """The optimizer's first configuration among those measured at this hidden size, against the best measured."""
    ranked = ranked_configurations(params, hidden, a, hosts, {r["workers"] for r in rows},
                                   {r["servers"] for r in rows if r["arch"] == "ps"})
    def key(r):
        return (r["arch"], r["servers"] if r["arch"] == "ps" else 0, r["model_parallel"], r["workers"])
    swept = list({key(r): r for r in rows if r["hidden"] == hidden}.values())
    got = validate.optimizer_check(ranked, swept, key, lambda r: epoch_time(r, a))
    first, m, best = got["first"], got["measured"], got["best"]
    return {"hidden": hidden, "optimize_first_overall": {k: ranked[0][k] for k in ("arch", "servers", "model_parallel",
                                                                                  "workers", "bound")},
            "optimize_first_swept": m and {"label": m["label"], "workers": m["workers"],
                                           "predicted_s": first["total_s"],
                                           "measured_s": epoch_time(m, a), "bound": first["bound"]},
            "best_measured": {"label": best["label"], "workers": best["workers"], "measured_s": epoch_time(best, a)},
            "ratio": got["ratio"], "pass": got["pass"],
            "predicted_top5": [{k: r[k] for k in ("arch", "servers", "model_parallel", "workers", "total_s", "bound")}
                               for r in got["top5"]]}


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
        out["agrees_with_alqahtani"] = {"1PS worst": m.index("1-PS") == len(m) - 1, "RA best": m.index("RA") == 0,
                                        "P2P between": m.index("RA") < m.index("P2P") < m.index("1-PS")}
    return out


def ape_summary(rows: list[dict]) -> dict:
    """Median and max APE of the time per iteration, per architecture and over all, of pred and sim."""
    out = {}
    for who in ("pred", "sim"):
        by = {**validate.score(rows, f"{who}_ape", by="label"), "all": validate.score(rows, f"{who}_ape")}
        if by["all"]:
            out[who] = {lab: {"median": round(e["median"], 1), "max": round(e["max"], 1), "runs": e["runs"]}
                        for lab, e in by.items()}
    return out


def plot(rows: list[dict], info: dict, hidden: int, path: Path) -> None:
    """Alqahtani & Demirbas's figure: per worker count a bar per architecture (computation
    dark, communication light), the model's (x) and simulator's (o) over it; right: updates/s."""
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
    common.decorate(ax, f"2-{hidden}-2, batch {rs[0]['batch'] if rs else '?'}, sync SGD, {info['rate']} links: "
                    "measured bars (dark: computation, light: communication)", 9,
                    dict(fontsize=6.5, ncol=2, loc="upper left"), dict(axis="y", which="both"),
                    xlabel="workers (each on a host of its own)", ylabel="seconds per iteration (log)")
    for lab in ARCHS:
        pts = validate.series(rs, "workers", label=lab)
        if pts:
            ax2.plot([x["workers"] for x in pts], [x["updates_per_s"] for x in pts], "-o", color=colors[lab],
                     label=f"{lab}, measured")
            if pts[0].get("pred_iteration_s"):
                ax2.plot([x["workers"] for x in pts], [1 / x["pred_iteration_s"] for x in pts], "--",
                         color=colors[lab], alpha=0.6, label=f"{lab}, predicted")
    common.decorate(ax2, "updates/s: measured (solid), predicted (dashed)", 9, dict(fontsize=6.5, ncol=2),
                    dict(which="both"), xlabel="workers", ylabel="updates/s (one per iteration)", yscale="log")
    fig.suptitle("Measured on the emulated cluster, predicted by the analytical model, simulated by asgd.sim "
                 f"(load 1-min median {info.get('load', {}).get('loadavg_1min_median', '?')})", fontsize=10)
    common.save_figure(fig, path)


def main(argv=None) -> int:
    a = parse_args(argv)
    run = common.Run("arch", a, end_on_signals=True)
    out = run.out
    base_path = validate.params_file(a.params, out, False, a.cpu_lock)[0]
    base, base_raw = validate.load_params(base_path), json.loads(Path(base_path).read_text())
    hosts = max(a.workers) + max(1, max(a.workers) // 4)
    t0 = time.perf_counter()
    info = {"rate": a.rate, "rate_bit": validate.parse_rate(a.rate), "hosts": hosts, "params": str(base_path)}
    with validate.testbed(a.name, hosts, a.rate) as tb:
        params, params_path, info["link_efficiency"] = testbed_params(tb, base, base_raw, info["rate_bit"], a.hidden,
                                                                       a.workers, a, out, a.rate)
        points = [{"label": lab, "rate": a.rate, "hidden": h, "workers": W, "iterations": it}
                  for h, it in zip(a.hidden, a.iterations) for W in a.workers for lab in ARCHS]
        print(f"sweep: {len(points)} points at {a.rate} ...", flush=True)
        rows = sweep(tb, a, out, points)
    info["sweep_s"] = round(time.perf_counter() - t0, 1)
    if not rows:
        raise SystemExit("bench_arch: no run succeeded")
    print("predicting" + ("" if a.no_sim else " and simulating") + " every run ...", flush=True)
    predict_and_simulate(rows, params, params_path, not a.no_sim)
    info["orderings"] = {h: {W: orderings(rows, h, W) for W in (8, 16) if W in a.workers} for h in a.hidden}
    info["ape"] = ape_summary(rows)
    info["optimizer"] = {h: optimizer_check(params, rows, h, a, hosts) for h in a.hidden}
    if a.second_rate != "none":
        info["second_rate"] = second_rate(a, base, base_raw, rows, params, out, hosts)
    info["alqahtani"] = ALQAHTANI
    run.write(rows, run.meta(summary=info, columns=COLUMNS))
    for h in a.hidden:
        run.plot(lambda rs, path, h=h: plot(rs, {**info, "load": run.load}, h, path), rows, name=f"arch-h{h}")
    report(rows, info)
    run.print_machine()
    run.wrote()
    return 0


def second_rate(a, base, base_raw, rows, params, out: Path, hosts: int) -> dict:
    """The model's winner at --rate and at --second-rate (per hidden size), each measured at
    both rates: does the winner change the way the model says?"""
    got = {}
    with validate.testbed(a.name, hosts, a.second_rate) as tb:
        params2, _, eff2 = testbed_params(tb, base, base_raw, validate.parse_rate(a.second_rate), a.hidden, a.workers,
                                          a, out, a.second_rate)
        for h, it in zip(a.hidden, a.iterations):
            labels_of = {}
            for p_, tag in ((params, a.rate), (params2, a.second_rate)):
                ranked = ranked_configurations(p_, h, a, hosts, a.workers,
                                               {1, *(W // 4 for W in a.workers if W // 4 > 1)})
                top = next(r for r in ranked if _label(r) is not None)
                labels_of[tag] = (_label(top), top["workers"], top["total_s"], top["bound"])
            winners = {labels_of[a.rate][:2], labels_of[a.second_rate][:2]}
            new = sweep(tb, a, out, [{"label": lab, "rate": a.second_rate, "hidden": h, "workers": W, "iterations": it}
                                     for lab, W in winners])
            rows += new
            runs = {(r["rate"], r["label"], r["workers"]): r for r in rows if r["hidden"] == h}
            measured = {rate: {f"{lab} W={W}": epoch_time(runs[rate, lab, W], a) if (rate, lab, W) in runs else None
                               for lab, W in winners} for rate in (a.rate, a.second_rate)}
            got[h] = {"model_winner": {k: {"label": v[0], "workers": v[1], "predicted_s": v[2], "bound": v[3]}
                                       for k, v in labels_of.items()},
                      "measured_s": measured, "link_efficiency": eff2}
            print(f"  2-{h}-2: the model's winner at {a.rate}: {labels_of[a.rate][0]} W={labels_of[a.rate][1]}, at "
                  f"{a.second_rate}: {labels_of[a.second_rate][0]} W={labels_of[a.second_rate][1]}; measured "
                  f"{json.dumps(measured)}", flush=True)
    return got


def _label(r: dict) -> str | None:
    """The sweep's label of an optimize row, if the sweep has that architecture."""
    options = {"arch": r["arch"], "servers": r["servers"] if r["arch"] == "ps" else 0,
               "model_parallel": r["model_parallel"]}
    return next((lab for lab in ARCHS if configuration(lab, r["workers"]) == options), None)


def report(rows: list[dict], info: dict) -> None:
    cols = [("rate", "rate", ""), ("hidden", "hidden", "d"), ("W", "workers", "d"), ("arch", "label", ""),
            ("ms/it", "iteration_s", ".4f"), ("compute", "compute_s", ".4f"), ("comm", "comm_s", ".4f"),
            ("model", "pred_iteration_s", ".4f"), ("APE%", "pred_ape", ".1f"), ("sim", "sim_iteration_s", ".4f"),
            ("APE%", "sim_ape", ".1f"), ("bound", "pred_bound", ""), ("proof", "proof_ok", ""),
            ("load", "load_1min", ".1f")]
    common.print_table(rows, cols,
                       title="\nseconds per iteration: measured on the emulated cluster / predicted / simulated")
    for h, by_w in info["orderings"].items():
        for W, o in by_w.items():
            print(f"2-{h}-2, {W} workers: measured order (fastest first) {' < '.join(o['measured'])}; predicted "
                  f"{' < '.join(o['predicted'])}; simulated {' < '.join(o.get('simulated') or [])}; Alqahtani & "
                  f"Demirbas: {ALQAHTANI}; agrees: {o.get('agrees_with_alqahtani')}")
    labels = dict.fromkeys(lab for by in info["ape"].values() for lab in by)
    validate.print_scores({lab: {who: by.get(lab) for who, by in info["ape"].items()} for lab in labels}, "arch",
                          stats=("median", "max", "runs"),
                          title="\nAPE of the time per iteration (pred: the model, sim: the simulator)")
    for h, o in info["optimizer"].items():
        f, b = o["optimize_first_swept"], o["best_measured"]
        print(f"optimize, 2-{h}-2: first {f and f['label']} W={f and f['workers']} ({f and f['bound']}-bound), "
              f"measured {f and round(f['measured_s'], 1)} s; best measured {b['label']} W={b['workers']} "
              f"{round(b['measured_s'], 1)} s: ratio {o['ratio'] and round(o['ratio'], 3)} "
              f"({validate.verdict(o['pass'])}, <= 1.10)")


if __name__ == "__main__":
    sys.exit(main())
