"""The paper's second wall, measured: updates/s against workers on the emulated cluster
(root), links the bottleneck, 1, 2 and 4 servers on hosts of their own, every run's bytes
proven against its veths, the model's prediction beside it, plus two accuracy runs. Why
8 Mbit/s: docs/benchmarks.md. Writes testbed.csv, testbed.json (`columns`: what each is), testbed.png.

    python bench/bench_testbed.py                          # 36 runs + 2 accuracy runs, about 40 minutes
    python bench/bench_testbed.py --quick                  # workers 1,4; servers 1,2; 2 epochs
    python bench/bench_testbed.py --params params.json     # reuse a calibration
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # first: pins threads, puts src/ on the path
import validate
from common import int_list

import json
import math
import os
import statistics
import tempfile
import time

from asgd.core.wire import PRECISIONS

COMPRESSIONS = ("none", "1bit")
TARGET_ACCURACY = 0.95
COLUMNS = {"updates_per_s": "steady state: server 0's receipts between the 10th and 90th percentile",
           "updates_per_s_run": "results.json: updates / train_s",
           "updates_per_s_run_no_eval": "updates / (train_s - rank 0's evaluate phase)",
           "link_util": "updates_per_s / link_ceiling_updates_per_s",
           "link_ceiling_updates_per_s": "link bytes/s / a server's wire bytes per update (TCP/IP "
                                         "framing: asgd.testbed.model.wire_bytes)",
           "pred_updates_per_s": "asgd.perf.architectures.predict with asgd.testbed.model.testbed_params",
           "ape_pct": "|pred - meas| / meas, %",
           "cpu_ms_per_update": "CPU of every rank (init included) / updates",
           "server_bytes_per_update": "server 0's application bytes (sent or received, the larger) per update",
           "wire_bytes_sent": "bytes every host's link carried out (the veths), whole job",
           "time_to_accuracy_s": f"training time (from the server's start) to held-out accuracy >= "
                                 f"{TARGET_ACCURACY} (one server only: it evaluates every epoch)"}


def parse_args(argv=None):
    p = common.parser(__doc__, "testbed", mpi_child=True, lock=True)
    p.add_argument("--workers", type=int_list, default=[1, 2, 4, 8, 12, 16],
                   help="comma list (default 1,2,4,8,12,16)")
    p.add_argument("--servers", type=int_list, default=[1, 2, 4], help="comma list (default 1,2,4)")
    p.add_argument("--compress", type=common.choice_list(COMPRESSIONS), default="none,1bit",
                   help="comma list of none,1bit (default both)")
    p.add_argument("--bandwidth", default="8mbit",
                   help="each link, each direction (default 8mbit; why: docs/benchmarks.md)")
    p.add_argument("--latency", type=float, default=0.0, help="one-way latency, us (netem; default 0)")
    p.add_argument("--hidden", type=int, default=10000, help="2-H-2 model (default 10000: 200 KB Delta-w in float32)")
    p.add_argument("--precision", choices=PRECISIONS, default=PRECISIONS[0],
                   help="asgd.train's --precision of every run (default float32, its default)")
    p.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    p.add_argument("--epochs", type=int, default=4, help="epochs per sweep run: 64 x E updates (default 4)")
    p.add_argument("--accuracy-epochs", type=int, default=5, help="epochs of the two accuracy runs (default 5; "
                   "0: none)")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration, interleaved (default 1)")
    p.add_argument("--params", type=Path, help="params.json from asgd.perf calibrate (default: calibrate --quick now)")
    p.add_argument("--no-cores-check", action="store_true", help="skip the shared-memory run that measures "
                   "the cores' ceiling")
    p.add_argument("--name", default="bt", help="testbed name (default bt)")
    p.add_argument("--quick", action="store_true", help="workers 1,4; servers 1,2; 2 epochs")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take (default 900)")
    a = p.parse_args(argv)
    if a.quick:
        a.workers, a.servers, a.epochs, a.accuracy_epochs = [1, 4], [1, 2], 2, 0
    return a


# -- the two-host probe (inside the MPI job) ----------------------------------------------

def child(args) -> None:
    from mpi4py import MPI

    from asgd.net import mlp
    mlp.compile_kernels()
    got = validate.testbed_model().probe(MPI.COMM_WORLD, mlp.Layout(2, args.hidden, 2).n_w)
    if got:
        print(json.dumps(got), flush=True)


# -- measuring ------------------------------------------------------------------------------

def steady_rate(trace_path: Path) -> tuple[float, int]:
    """(updates/s, updates) from server 0's Delta-w receipts between the 10th and 90th percentile of the run."""
    ev = json.loads(trace_path.read_text())["traceEvents"]
    ts = sorted(e["ts"] for e in ev if e.get("ph") == "i" and e.get("name") == "recv" and e.get("pid") == 0)
    n = len(ts)
    if n < 10:
        return float("nan"), n
    i0, i1 = int(0.1 * n), int(0.9 * n)
    return (i1 - i0) / ((ts[i1] - ts[i0]) / 1e6), n


def run_precision(results: dict) -> str:
    """A run's --precision, from its results.json config (float64 before --precision existed)."""
    return results["config"].get("precision", "float64")


def bytes_per_weight(compress: str, hidden: int, S: int, precision: str) -> float:
    """Payload bytes per weight of a push in `precision`: its item size, or 1-bit's bits and scales."""
    from asgd.core.wire import itemsize
    from asgd.net.mlp import Layout
    from asgd.protocol import onebit
    size = itemsize(precision)
    return float(size) if compress == "none" else onebit.bytes_per_weight(Layout(2, hidden, 2), S, size)


def train_argv(S: int, compress: str, args, out: Path, epochs: int | None = None) -> list[str]:
    """python's argv of one run (W + S ranks) with S servers."""
    cmd = ["-m", "asgd.train", "--optimizer", "sgd", "--servers", str(S), "--hidden", str(args.hidden), "--batch",
           str(args.batch), "--epochs", str(epochs or args.epochs), "--quiet", "--precision", args.precision,
           "--trace", "--trace-steps", "0:1000000", "--timeout", str(int(args.timeout - 30)), "--out", str(out)]
    accuracy_run = ["--eval-every", "epoch"] if epochs else []   # its time to accuracy is by epoch
    return cmd + accuracy_run + (["--compress", compress] if compress != "none" else [])


def one_run(tb, S, W, compress, args, tmp: Path, rate_bit: int, epochs: int | None = None) -> dict:
    model = validate.testbed_model()
    out = tmp / f"s{S}-w{W}-{compress}-{time.monotonic_ns()}"
    res, load = validate.testbed_job(tb, W + S, train_argv(S, compress, args, out, epochs), args.timeout, True)
    r = res.results
    rate, n = steady_rate(out / "trace.json")
    ev = r["ranks"][0]["phases"].get("evaluate", 0.0)
    n_w, precision = r["config"]["n_w"], run_precision(r)
    per_update_server = max(r["ranks"][0]["bytes"]["train"][d] for d in ("sent", "recv")) / r["throughput"]["updates"]
    p = res.proof
    return {"compress": compress, "precision": precision, "servers": S, "workers": W, "ranks": W + S,
            "updates_per_s": round(rate, 3), "updates_steady": n,
            "updates_per_s_run": round(r["throughput"]["updates_per_s"], 3),
            "updates_per_s_run_no_eval": round(r["throughput"]["updates"] / max(r["train_s"] - ev, 1e-9), 3),
            "train_s": round(r["train_s"], 2), "init_s": round(r["init_s"], 2), "evaluate_s": round(ev, 2),
            "accuracy": r["metrics"]["accuracy"],
            "link_util": round(rate / (ceiling := model.link_ceiling(rate_bit, n_w, S,
                                                                      bytes_per_weight(compress, args.hidden, S,
                                                                                       precision))), 3),
            "link_ceiling_updates_per_s": round(ceiling, 2),
            "server_bytes_per_update": round(per_update_server, 1),
            "wire_bytes_sent": sum(h["wire_sent"] for h in p["hosts"]),
            "app_bytes_sent": sum(h["app_sent"] for h in p["hosts"]),
            "proof_ok": p["ok"], "wire_over_app_sent": round(p["ratio_sent"], 4),
            "wire_over_app_recv": round(p["ratio_recv"], 4),
            "qdisc_drops": sum(q["dropped"] for q in res.qdisc),
            "job_cpu_s": round(res.cpu_s, 1),
            "cpu_ms_per_update": round(1e3 * res.cpu_s / r["throughput"]["updates"], 2),
            "hosts": len({x["host"] for x in r["ranks"]}),
            "load_1min": load, "n_w": n_w,
            "history": [{"epoch": h["epoch"], "time_s": round(h["time_s"], 2), "test_accuracy": h.get("test_accuracy")}
                        for h in r["metrics"]["history"]],
            "time_to_accuracy_s": next((round(h["time_s"], 2) for h in r["metrics"]["history"]
                                        if (h.get("test_accuracy") or 0) >= TARGET_ACCURACY), None)}


def cores_ceiling(S: int, W: int, args, tmp: Path, compress: str = "none") -> dict | None:
    """The same job on shared memory (plain mpiexec, no links): what the cores allow."""
    out = tmp / f"cores-{compress}"
    try:
        common.mpiexec(W + S, train_argv(S, compress, args, out), args.timeout)
    except (common.JobFailed, OSError) as e:
        print(f"  cores check failed: {e}", flush=True)
        return None
    rate, n = steady_rate(out / "trace.json")
    r = validate.results(out)
    return {"compress": compress, "servers": S, "workers": W, "updates_per_s": round(rate, 2),
            "updates_per_s_run": round(r["throughput"]["updates_per_s"], 2), "load_1min": round(os.getloadavg()[0], 2)}


def predict(base, rows, args, rate_bit) -> None:
    """pred_updates_per_s and ape_pct on every row (the model never sees the measurements:
    the network terms are the link's rate and burst and TCP/IP framing, not the runs' bytes)."""
    from asgd.core.wire import DOUBLE
    for r in rows:
        S, n_w = r["servers"], r["n_w"]
        run = validate.Run(workers=r["workers"], servers=S, batch=args.batch, hidden=args.hidden, epochs=args.epochs,
                           precision=r["precision"])
        # the model's link table is keyed by float64 values (Run.wire_values): a message of k
        # weights is read at k * itemsize / 8, so its bytes per key are bpw * 8 / itemsize
        per_key = bytes_per_weight(r["compress"], args.hidden, S, r["precision"]) * DOUBLE / run.value_bytes
        keys = [math.ceil(run.wire_values(k)) for k in (-(-n_w // S), n_w)]
        prm = validate.testbed_model().testbed_params(base, rate_bit, args.latency * 1e-6, bytes_per_weight=per_key,
                                                      sizes=keys)
        got = validate.model_predict(prm, run).detail
        r.update(pred_updates_per_s=round(got["updates_per_s"], 3), pred_bound=got["bound"],
                 ape_pct=round(validate.ape(got["updates_per_s"], r["updates_per_s"]), 1))


# -- reporting --------------------------------------------------------------------------------

def summarize(rows, args) -> dict:
    out = {}
    for c in args.compress:
        ceil = {}
        for S in args.servers:
            rs = [r for r in rows if r["servers"] == S and r["compress"] == c]
            if rs:
                best = max(rs, key=lambda r: r["updates_per_s"])
                ceil[S] = {"ceiling_updates_per_s": best["updates_per_s"], "at_workers": best["workers"],
                           "link_ceiling_updates_per_s": best["link_ceiling_updates_per_s"]}
        base = ceil.get(1, {}).get("ceiling_updates_per_s")
        for S, v in ceil.items():
            v["vs_one_server"] = round(v["ceiling_updates_per_s"] / base, 2) if base else None
        flat = None
        one = validate.series(rows, "workers", servers=1, compress=c)
        if len(one) >= 3:   # does one server stop rising? the last points against the ceiling
            flat = {"workers": [r["workers"] for r in one], "updates_per_s": [r["updates_per_s"] for r in one],
                    "gain_from_2_to_max_workers": round(one[-1]["updates_per_s"] /
                                                        next(r for r in one if r["workers"] >= 2)["updates_per_s"], 3)}
        out[c] = {"ceilings": ceil, "one_server": flat}
    if "none" in out and "1bit" in out:   # 1-bit against plain messages, one server's ceilings
        a, b = (out[c]["ceilings"].get(1, {}).get("ceiling_updates_per_s") for c in ("1bit", "none"))
        out["onebit_vs_none_one_server"] = round(a / b, 2) if a and b else None
    e = validate.score(rows, "ape_pct")
    out["model_median_ape_pct"], out["model_max_ape_pct"] = (round(e["median"], 1), e["max"]) if e else (None, None)
    by = validate.score(rows, "ape_pct", by="compress")
    for c in args.compress:
        out[c]["model_median_ape_pct"] = round(by[c]["median"], 1) if c in by else None
    return out


def plot(rows, info, path):
    """Updates/s against workers, measured (solid) and predicted (dashed), per server count:
    plain messages (left) and 1-bit (middle), linear scales apart (they sit 30-60x apart), the
    links' ceilings (dotted), the cores' on shared memory (dash-dot); right: the model's APE."""
    plt = common.pyplot()
    kinds = list(dict.fromkeys(r["compress"] for r in rows))
    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(5.2 * len(kinds) + 4.2, 5),
                             gridspec_kw={"width_ratios": [5] * len(kinds) + [4]})
    colors = {1: "tab:red", 2: "tab:blue", 4: "tab:green", 8: "tab:purple"}
    ape_ax = axes[-1]
    for ax, c in zip(axes, kinds):
        name = rows[0]["precision"] if c == "none" else c
        for S in sorted({r["servers"] for r in rows}):
            rs = validate.series(rows, "workers", servers=S, compress=c)
            if not rs:
                continue
            col, mk = colors.get(S, "k"), "o" if c == "none" else "s"
            x = [r["workers"] for r in rs]
            label = f"{S} server{'s' * (S > 1)}"
            ax.plot(x, [r["updates_per_s"] for r in rs], "-", marker=mk, color=col, label=f"{label}: measured")
            if "pred_updates_per_s" in rs[0]:
                ax.plot(x, [r["pred_updates_per_s"] for r in rs], "--", color=col, alpha=0.6, lw=1.2,
                        label=f"{label}: model")
                ape_ax.plot(x, [r["ape_pct"] for r in rs], "-" if c == "none" else ":", marker=mk, color=col,
                            label=f"S={S} {name}")
            ax.axhline(rs[0]["link_ceiling_updates_per_s"], color=col, lw=0.8, ls=(0, (1, 3)), alpha=0.8)
        title = f"{name} messages; dotted: the links' ceilings"
        top = 1.1 * max(max(r["updates_per_s"], r.get("pred_updates_per_s", 0), r["link_ceiling_updates_per_s"])
                        for r in rows if r["compress"] == c)
        for cc in info.get("cores_ceilings") or []:
            if cc["compress"] != c:
                continue
            what = f"cores' ceiling (S={cc['servers']}, W={cc['workers']}, shared memory)"
            if cc["updates_per_s"] < top:
                ax.axhline(cc["updates_per_s"], color="0.3", lw=1, ls="-.", label=what)
            else:   # far above: a line there would flatten the curves
                title += f"\n{what}: {cc['updates_per_s']:.0f}/s, off the scale"
        common.decorate(ax, title, 9, dict(fontsize=6.5, loc="upper left"), ylim=(0, top),
                        xlabel="workers (each on a host of its own)", ylabel="updates/s (steady state)")
    ape_ax.axhline(15, color="0.5", ls=":", lw=0.8)
    common.decorate(ape_ax, f"model against measured: median APE {info['summary']['model_median_ape_pct']} %", 9,
                    dict(fontsize=6.5), xlabel="workers", ylabel="model APE, %")
    fig.suptitle(f"Measured on the emulated cluster (2-{info['args']['hidden']}-2, batch {info['args']['batch']}, "
                 f"{info['testbed']['rate']} links each way); dashed: predicted by the analytical model", fontsize=10)
    common.save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    if common.as_mpi_child(args, child):
        return 0
    run = common.Run("testbed", args, end_on_signals=True)   # timeout/kill -TERM: the testbed goes down too
    rate_bit, format_rate = validate.parse_rate(args.bandwidth), validate.format_rate
    params_src = f"given: {args.params}" if args.params else "python -m asgd.perf calibrate --quick (this run)"
    base = validate.load_params(validate.params_file(args.params, run.out, True, args.cpu_lock)[0])
    hosts = max(args.servers) + max(args.workers)
    accuracy, t_all = [], time.perf_counter()
    with validate.testbed(args.name, hosts, args.bandwidth, args.latency) as tb, \
            tempfile.TemporaryDirectory(prefix="asgd-bench-testbed-") as tmp:
        tmp = Path(tmp)
        # the two-host probe: raw ping-pong and asgd's round trip over one link pair
        res = tb.run([validate.launcher(), "-n", "2", sys.executable,
                      *common.mpi_child_argv(__file__, ["--hidden", str(args.hidden)])],
                     servers=0, capture=True, timeout=300, say=lambda *a, **k: None)
        lines = [ln for ln in (res.stdout or "").splitlines() if ln.startswith("{")]
        probe = json.loads(lines[-1]) if res.rc == 0 and lines else {"error": (res.stderr or "")[-500:]}
        print(f"probe over two hosts: {probe}", flush=True)
        cores = []   # plain messages: the most servers and workers; 1-bit: one server, the most workers
        for c in ([] if args.no_cores_check else args.compress):
            got = cores_ceiling(max(args.servers) if c == "none" else 1, max(args.workers), args, tmp, c)
            if got:
                cores.append(got)
                print(f"cores' ceiling, {c} (shared memory, S={got['servers']} W={got['workers']}): "
                      f"{got['updates_per_s']} updates/s, load {got['load_1min']}", flush=True)
        # each (workers, servers) point with every compression in a row: they see the same load
        configs = [{"compress": c, "servers": S, "workers": W} for W in args.workers for S in args.servers
                   for c in args.compress]
        def name(c):
            return f"{c['compress']:<5} S={c['servers']} W={c['workers']:>2}"
        def say(r):
            return (f"{r['updates_per_s']:7.2f} updates/s steady ({r['updates_per_s_run']:.2f} whole run), "
                    f"link {r['link_util']:.2f} full, proof {'ok' if r['proof_ok'] else 'FAILED'} "
                    f"({r['wire_over_app_sent']:.3f}), acc {r['accuracy']:.3f}, load {r['load_1min']}")
        rows = []
        for rep in range(args.repeat):
            rows += validate.sweep([{**c, "rep": rep} for c in (configs if rep % 2 == 0 else configs[::-1])],
                                   lambda c: one_run(tb, c["servers"], c["workers"], c["compress"], args, tmp,
                                                     rate_bit),
                                   name, say, lock=args.cpu_lock)
        if args.accuracy_epochs:   # the default problem, to accuracy
            def say(r):
                return (f"accuracy {r['accuracy']:.4f} after {args.accuracy_epochs} epochs, >= {TARGET_ACCURACY} "
                        f"after {r['time_to_accuracy_s']} s of training, {r['updates_per_s']:.2f} updates/s, "
                        f"{r['wire_bytes_sent'] / 1e6:.1f} MB on the wire, proof "
                        f"{'ok' if r['proof_ok'] else 'FAILED'}, load {r['load_1min']}")
            accuracy = validate.sweep([{"compress": c, "servers": 1,
                                        "workers": max(args.workers)} for c in args.compress],
                                      lambda c: one_run(tb, 1, c["workers"], c["compress"], args, tmp, rate_bit,
                                                        epochs=args.accuracy_epochs), name, say, lock=args.cpu_lock,
                                      tag="accuracy run ")
        netem = tb.info.get("netem")
    if not rows:
        raise SystemExit("bench_testbed: no run succeeded")
    # measured wire/app per compression, whole runs (reported; the model derives its own)
    f = {c: statistics.median(max(r["wire_over_app_sent"], r["wire_over_app_recv"]) for r in rows if r["compress"] == c)
         for c in dict.fromkeys(r["compress"] for r in rows)}
    predict(base, rows, args, rate_bit)
    n_w, precision = rows[0]["n_w"], rows[0]["precision"]   # every run's: asgd.train's default
    model = validate.testbed_model()
    derived = model.testbed_params(base, rate_bit, args.latency * 1e-6, sizes=[n_w])
    info = run.meta(
        testbed={"hosts": hosts, "rate_bit": rate_bit, "rate": format_rate(rate_bit),
                 "latency_us": args.latency, "netem": netem, "wire_overhead": f,
                 "precision": precision,
                 "worker_ceiling_updates_per_s": {c: round(model.worker_ceiling(rate_bit, n_w, bytes_per_weight(
                     c, args.hidden, 1, precision)), 2) for c in f}},
        params=params_src, probe=probe,
        probe_vs_derived={"pingpong_s": [probe.get("pingpong_s"), derived.per_nw(
                              {b // 8: v for b, v in derived.pingpong_s.items()}, n_w)],
                          "round_trip_s": [probe.get("round_trip_s"), derived.per_nw(derived.round_trip_s, n_w)
                                           + 2 * derived.link_transit(derived.per_nw(derived.link_s, n_w))]}
        if probe and "error" not in probe else None,
        cores_ceilings=cores, accuracy_runs=accuracy, target_accuracy=TARGET_ACCURACY,
        sweep_s=round(time.perf_counter() - t_all, 1), columns=COLUMNS)
    info["summary"] = summarize(rows, args)
    run.write(rows, info)
    run.plot(plot, rows, info)
    run.print_machine()
    print(f"testbed: {hosts} hosts, {format_rate(rate_bit)} each way per link, latency "
          f"{'%g us' % args.latency if args.latency and netem else 'none added'}; "
          "wire/app " + ", ".join(f"{c} {v:.4f}" for c, v in f.items()) + f"; calibration: {params_src}")
    common.print_table(rows, [("compress", "compress", ""), ("S", "servers", "d"), ("W", "workers", "d"),
                              ("updates/s", "updates_per_s", ".2f"), ("whole run", "updates_per_s_run", ".2f"),
                              ("model", "pred_updates_per_s", ".2f"), ("APE %", "ape_pct", ".1f"),
                              ("link full", "link_util", ".2f"), ("link ceiling", "link_ceiling_updates_per_s", ".1f"),
                              ("wire/app", "wire_over_app_sent", ".3f"), ("proof", "proof_ok", ""),
                              ("acc", "accuracy", ".3f"), ("load", "load_1min", ".1f")])
    s = info["summary"]   # the ceilings per server count, the probe against the derived costs: testbed.json
    print(f"model: median APE {s['model_median_ape_pct']} % ("
          + ", ".join(f"{c} {s[c]['model_median_ape_pct']} %" for c in args.compress)
          + f"), max {s['model_max_ape_pct']} %")
    run.wrote()
    return 0


if __name__ == "__main__":
    sys.exit(main())
