"""The paper's second wall, measured: updates/s against workers on an emulated cluster
(asgd.testbed) whose links, not the cores, are the bottleneck; 1, 2 and 4 servers, each on
a host of its own, and the performance model's prediction drawn over the measurements.

Why a testbed: on this 2-core machine every multi-worker run is bound by the cores, so a
single server's saturation could only be predicted. Here every rank gets a host (network
namespace) of its own and every host's link is shaped to --bandwidth each way (tc tbf),
so a server's link fills long before the cores do.

Choosing the bandwidth (default 32mbit). A 2-10K-2 update moves Delta-w (400,056 B) in
and w' (400,032 B) out of the server; on the wire about 1.5 % more (the byte proof).
At R bytes/s per direction a server's link is full at R / 405 KB updates/s, S servers
(each carrying 1/S of every message) at S times that, and one worker (push, then reply,
one exchange outstanding) at R / 810 KB. The cores must stay out of the way at every
ceiling to be measured: this bench also measures the cores' ceiling (S = 4, W = 12 on
shared memory, no links: `cores_ceiling`); on this machine, shared with other jobs, it
was about 90-180 updates/s. So:
  * 4 servers' ceiling at most a third of the cores' ceiling: 4 R / 405 KB <= ~45/s;
  * and room for phase 2's 1-bit compression (>= 10x a single server's ceiling, <= the
    cores' ceiling): R / 405 KB <= ~12/s;
  * but not so low that a sweep takes an hour: each run has 64 x epochs updates.
32 Mbit/s (4 MB/s) gives ceilings of 9.9 (S=1), 19.8 (S=2) and 39.5 (S=4) updates/s and
4.9 per worker: the knees should fall at about 2, 4 and 8 workers, and W = 12 is past
every knee. --bandwidth changes it (the table says where the ceilings then are).

Measured per run (`asgd.testbed run --check-bytes -- mpiexec -n W+S python -m asgd.train
--servers S --epochs E --trace ...`):
  updates_per_s   steady state: server 0 receives one message per update; its receipts
                  (from trace.json) between the 10th and the 90th percentile of the run,
                  over the time between them (no start-up ramp, no end-of-run tail)
  updates_per_s_run  results.json's updates / train_s (with ramp, tail and, for S = 1,
                  the held-out evaluation the server does after every epoch)
  link_util       updates_per_s x the server's wire bytes per update / (R / 8): 1.0 is a
                  full link
  proof           each host's veth bytes against results.json (asgd.testbed.proof)
  pred_updates_per_s, ape_pct   asgd.perf.analytic.predict with asgd.testbed.model's
                  testbed_params (this machine's calibration + R + latency + the measured
                  wire overhead), APE = |pred - meas| / meas
The model's network terms are derived, not fitted; a two-host probe (raw ping-pong of one
Delta-w and asgd's push/pull round trip) is measured first and printed beside the derived
values, as a check.

--compress none,1bit is the axis for phase 2; for now only `none` runs (1bit: asgd.train
has no --compress yet).

Writes testbed.csv, testbed.json (rows, summary: ceilings, ratios, median APE; the probe,
the testbed, the machine, the load), testbed.png under --out (bench/results/testbed).

    python bench/bench_testbed.py                          # 15 runs, about 15 minutes
    python bench/bench_testbed.py --quick                  # workers 1,4; servers 1,2; 2 epochs
    python bench/bench_testbed.py --params params.json     # reuse a calibration
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402,I001  (first: pins threads, puts src/ on the path)
from common import int_list  # noqa: E402

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

COMPRESSIONS = ("none", "1bit")
IMPLEMENTED = ("none",)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int_list, default=[1, 2, 4, 8, 12], help="comma list (default 1,2,4,8,12)")
    p.add_argument("--servers", type=int_list, default=[1, 2, 4], help="comma list (default 1,2,4)")
    p.add_argument("--compress", default="none", help="comma list of none,1bit (default none; 1bit: phase 2)")
    p.add_argument("--bandwidth", default="32mbit", help="each link, each direction (default 32mbit; see above)")
    p.add_argument("--latency", type=float, default=0.0, help="one-way latency, us (netem; default 0)")
    p.add_argument("--hidden", type=int, default=10000, help="2-H-2 model (default 10000: 400 KB Delta-w)")
    p.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    p.add_argument("--epochs", type=int, default=6, help="epochs per run: 64 x E updates (default 6)")
    p.add_argument("--repeat", type=int, default=1, help="runs per configuration, interleaved (default 1)")
    p.add_argument("--params", type=Path, help="params.json from asgd.perf calibrate (default: calibrate --quick now)")
    p.add_argument("--no-cores-check", action="store_true", help="skip the shared-memory run that measures "
                   "the cores' ceiling")
    p.add_argument("--name", default="bt", help="testbed name (default bt)")
    p.add_argument("--quick", action="store_true", help="workers 1,4; servers 1,2; 2 epochs")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take (default 900)")
    p.add_argument("--out", type=Path, default=common.RESULTS / "testbed", help="default bench/results/testbed")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--mpi-child", action="store_true", help=argparse.SUPPRESS)   # the two-host probe
    a = p.parse_args(argv)
    if a.quick:
        a.workers, a.servers, a.epochs = [1, 4], [1, 2], 2
    a.compress = [c.strip() for c in a.compress.split(",") if c.strip()]
    bad = [c for c in a.compress if c not in COMPRESSIONS]
    if bad:
        p.error(f"--compress: unknown {bad}; choose from {COMPRESSIONS}")
    todo = [c for c in a.compress if c not in IMPLEMENTED]
    if todo:
        p.error(f"--compress {','.join(todo)}: not implemented yet (asgd.train has no --compress; phase 2 of "
                "issue #16); use --compress none")
    return a


# -- the two-host probe (inside the MPI job) ----------------------------------------------

def child(args) -> None:
    from mpi4py import MPI

    from asgd.net import mlp
    from asgd.net.mlp import Layout
    from asgd.testbed import model
    mlp.compile_kernels()
    got = model.probe(MPI.COMM_WORLD, Layout(2, args.hidden, 2).n_w)
    if got:
        print(json.dumps(got), flush=True)


# -- measuring ------------------------------------------------------------------------------

def steady_rate(trace_path: Path) -> tuple[float, int]:
    """(updates/s, updates) from server 0's Delta-w receipts between the 10th and 90th
    percentile of the run (see the docstring)."""
    ev = json.loads(trace_path.read_text())["traceEvents"]
    ts = sorted(e["ts"] for e in ev if e.get("ph") == "i" and e.get("name") == "recv" and e.get("pid") == 0)
    n = len(ts)
    if n < 10:
        return float("nan"), n
    i0, i1 = int(0.1 * n), int(0.9 * n)
    return (i1 - i0) / ((ts[i1] - ts[i0]) / 1e6), n


def train_cmd(mpiexec: str, S: int, W: int, compress: str, args, out: Path) -> list[str]:
    cmd = [mpiexec, "-n", str(W + S), sys.executable, "-m", "asgd.train", "--servers", str(S),
           "--hidden", str(args.hidden), "--batch", str(args.batch), "--epochs", str(args.epochs), "--quiet",
           "--trace", "--trace-steps", "0:1000000", "--timeout", str(int(args.timeout - 30)), "--out", str(out)]
    return cmd + (["--compress", compress] if compress != "none" else [])


def one_run(tb, S, W, compress, args, tmp: Path, rate_bit: int) -> dict | None:
    from asgd.testbed import model, proof
    out = tmp / f"s{S}-w{W}-{compress}-{time.monotonic_ns()}"
    load0 = os.getloadavg()[0]
    try:
        res = tb.run(train_cmd(common.launch.find(), S, W, compress, args, out), check_bytes=True,
                     timeout=args.timeout, capture=True, say=lambda *a, **k: None)
    except Exception as e:  # noqa: BLE001  (a failed run is reported and skipped)
        print(f"  S={S} W={W} {compress}: failed: {str(e)[-400:]}", flush=True)
        return None
    if res.rc or res.results is None:
        print(f"  S={S} W={W} {compress}: exit {res.rc}: {(res.stderr or '')[-400:]}", flush=True)
        return None
    r = res.results
    rate, n = steady_rate(out / "trace.json")
    ev = r["ranks"][0]["phases"].get("evaluate", 0.0)
    n_w = r["config"]["n_w"]
    per_update_server = max(proof.app(r, tb.spec, [])[0][d] for d in ("sent", "recv")) / r["throughput"]["updates"]
    p = res.proof
    return {"compress": compress, "servers": S, "workers": W, "ranks": W + S,
            "updates_per_s": round(rate, 3), "updates_steady": n,
            "updates_per_s_run": round(r["throughput"]["updates_per_s"], 3),
            "updates_per_s_run_no_eval": round(r["throughput"]["updates"] / max(r["train_s"] - ev, 1e-9), 3),
            "train_s": round(r["train_s"], 2), "init_s": round(r["init_s"], 2), "evaluate_s": round(ev, 2),
            "accuracy": r["metrics"]["accuracy"],
            "link_util": round(rate * per_update_server * max(p["ratio_sent"], p["ratio_recv"]) / (rate_bit / 8), 3),
            "link_ceiling_updates_per_s": round(model.link_ceiling(rate_bit, n_w, S, max(p["ratio_sent"], p["ratio_recv"])), 2),
            "proof_ok": p["ok"], "wire_over_app_sent": round(p["ratio_sent"], 4),
            "wire_over_app_recv": round(p["ratio_recv"], 4),
            "qdisc_drops": sum(q["dropped"] for q in res.qdisc),
            "job_cpu_s": round(res.cpu_s, 1), "cpu_ms_per_update": round(1e3 * res.cpu_s / r["throughput"]["updates"], 2),
            "hosts": sorted(set(x["host"] for x in r["ranks"])).__len__(),
            "load_1min": round((load0 + os.getloadavg()[0]) / 2, 2), "n_w": n_w}


def cores_ceiling(S: int, W: int, args, tmp: Path) -> dict | None:
    """The same job on shared memory (plain mpiexec, no links): what the cores allow."""
    out = tmp / "cores"
    cmd = train_cmd(common.launch.find(), S, W, "none", args, out)
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"  cores check failed: {e}", flush=True)
        return None
    rate, n = steady_rate(out / "trace.json")
    r = json.loads((out / "results.json").read_text())
    return {"servers": S, "workers": W, "updates_per_s": round(rate, 2),
            "updates_per_s_run": round(r["throughput"]["updates_per_s"], 2), "load_1min": round(os.getloadavg()[0], 2)}


def calibration(args, out: Path) -> tuple[Path, str]:
    if args.params:
        return args.params, f"given: {args.params}"
    path = out / "params.json"
    print("calibrating this machine (python -m asgd.perf calibrate --quick) ...", flush=True)
    p = subprocess.run([sys.executable, "-m", "asgd.perf", "calibrate", "--quick", "--out", str(path)],
                       capture_output=True, text=True, timeout=900)
    if p.returncode:
        raise SystemExit(f"calibrate failed:\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    return path, "python -m asgd.perf calibrate --quick (this run)"


def predict(base, rows, args, rate_bit, f) -> None:
    """pred_updates_per_s and ape_pct on every row (the model never sees the measurements)."""
    from asgd.perf.analytic import Run, predict as model_predict
    from asgd.testbed.model import testbed_params
    for r in rows:
        S, W = r["servers"], r["workers"]
        n_w = r["n_w"]
        prm = testbed_params(base, rate_bit, args.latency * 1e-6, S, f, sizes=[-(-n_w // S), n_w])
        pred = model_predict(prm, Run(workers=W, servers=S, batch=args.batch, hidden=args.hidden,
                                      epochs=args.epochs))
        X = pred.detail["updates_per_s"]
        r["pred_updates_per_s"] = round(X, 3)
        r["pred_bound"] = pred.detail["bound"]
        r["ape_pct"] = round(100 * abs(X - r["updates_per_s"]) / r["updates_per_s"], 1)


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
        one = sorted((r for r in rows if r["servers"] == 1 and r["compress"] == c), key=lambda r: r["workers"])
        if len(one) >= 3:   # does one server stop rising? the last points against the ceiling
            flat = {"workers": [r["workers"] for r in one], "updates_per_s": [r["updates_per_s"] for r in one],
                    "gain_from_2_to_max_workers": round(one[-1]["updates_per_s"] /
                                                        next(r for r in one if r["workers"] >= 2)["updates_per_s"], 3)}
        out[c] = {"ceilings": ceil, "one_server": flat}
    apes = [r["ape_pct"] for r in rows if r.get("ape_pct") is not None]
    out["model_median_ape_pct"] = round(statistics.median(apes), 1) if apes else None
    out["model_max_ape_pct"] = max(apes) if apes else None
    return out


def plot(rows, info, path):
    plt = common.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    colors = {1: "tab:red", 2: "tab:blue", 4: "tab:green", 8: "tab:purple"}
    for c in dict.fromkeys(r["compress"] for r in rows):
        for S in sorted({r["servers"] for r in rows}):
            rs = sorted((r for r in rows if r["servers"] == S and r["compress"] == c), key=lambda r: r["workers"])
            if not rs:
                continue
            col = colors.get(S, "k")
            ls = "-" if c == "none" else ":"
            x = [r["workers"] for r in rs]
            ax.plot(x, [r["updates_per_s"] for r in rs], ls, marker="o", color=col,
                    label=f"{S} server{'s' * (S > 1)}, measured" + (f" ({c})" if c != "none" else ""))
            if "pred_updates_per_s" in rs[0]:
                ax.plot(x, [r["pred_updates_per_s"] for r in rs], "--", color=col, alpha=0.7,
                        label=f"{S} server{'s' * (S > 1)}, model")
                ax2.plot(x, [r["ape_pct"] for r in rs], marker="o", color=col, label=f"S={S}")
            ax.axhline(rs[0]["link_ceiling_updates_per_s"], color=col, lw=0.8, ls=":", alpha=0.6)
    cc = info.get("cores_ceiling")
    if cc:
        ax.axhline(cc["updates_per_s"], color="0.4", lw=1, ls="-.",
                   label=f"cores' ceiling (S={cc['servers']}, W={cc['workers']}, shared memory)")
    ax.set_xlabel("workers (each on a host of its own)")
    ax.set_ylabel("updates/s (steady state)")
    tb = info["testbed"]
    ax.set_title(f"2-{info['args']['hidden']}-2, batch {info['args']['batch']}: {tb['rate']} links; "
                 f"dotted: link ceilings", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax2.set_xlabel("workers")
    ax2.set_ylabel("model APE, %")
    ax2.set_title(f"median APE {info['summary']['model_median_ape_pct']} %", fontsize=9)
    ax2.axhline(15, color="0.5", ls=":", lw=0.8)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if args.mpi_child:
        child(args)
        return 0
    from asgd.testbed import Testbed, TestbedError, missing_requirements, parse_rate
    from asgd.testbed import lifecycle
    from asgd.testbed.spec import format_rate
    from asgd.perf.cli import load_params
    reason = missing_requirements()
    if reason:
        raise SystemExit(f"bench_testbed: no testbed here: {reason}")
    args.out.mkdir(parents=True, exist_ok=True)
    load = common.LoadSampler(2.0)
    m = common.machine()
    rate_bit = parse_rate(args.bandwidth)
    params_path, params_src = calibration(args, args.out)
    base = load_params(str(params_path))
    hosts = max(args.servers) + max(args.workers)
    if lifecycle.exists(args.name):
        lifecycle.down(args.name, say=lambda *a, **k: None)
    tb = lifecycle.up(args.name, hosts, rate_bit, args.latency)
    rows, probe = [], None
    t_all = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="asgd-bench-testbed-") as tmp:
            tmp = Path(tmp)
            # the two-host probe: raw ping-pong and asgd's round trip over one link pair
            res = tb.run([common.launch.find(), "-n", "2", sys.executable, str(Path(__file__).resolve()),
                          "--mpi-child", "--hidden", str(args.hidden)], servers=0, capture=True, timeout=300,
                         say=lambda *a, **k: None)
            lines = [ln for ln in (res.stdout or "").splitlines() if ln.startswith("{")]
            probe = json.loads(lines[-1]) if res.rc == 0 and lines else {"error": (res.stderr or "")[-500:]}
            print(f"probe over two hosts: {probe}", flush=True)
            cores = None if args.no_cores_check else cores_ceiling(max(args.servers), max(args.workers), args, tmp)
            if cores:
                print(f"cores' ceiling (shared memory, S={cores['servers']} W={cores['workers']}): "
                      f"{cores['updates_per_s']} updates/s", flush=True)
            configs = [(c, S, W) for c in args.compress for W in args.workers for S in args.servers]
            for rep in range(args.repeat):
                for c, S, W in (configs if rep % 2 == 0 else configs[::-1]):
                    row = one_run(tb, S, W, c, args, tmp, rate_bit)
                    if row:
                        row["rep"] = rep
                        rows.append(row)
                        print(f"  {c:<5} S={S} W={W:>2}: {row['updates_per_s']:7.2f} updates/s steady "
                              f"({row['updates_per_s_run']:.2f} whole run), link {row['link_util']:.2f} full, "
                              f"proof {'ok' if row['proof_ok'] else 'FAILED'} ({row['wire_over_app_sent']:.3f}), "
                              f"acc {row['accuracy']:.3f}, load {row['load_1min']}", flush=True)
    except TestbedError as e:
        raise SystemExit(f"bench_testbed: {e}")
    finally:
        tb.down()
    if not rows:
        raise SystemExit("bench_testbed: no run succeeded")
    f = statistics.median(max(r["wire_over_app_sent"], r["wire_over_app_recv"]) for r in rows)
    predict(base, rows, args, rate_bit, f)
    n_w = rows[0]["n_w"]
    from asgd.testbed.model import testbed_params, worker_ceiling
    derived = testbed_params(base, rate_bit, args.latency * 1e-6, 1, f, sizes=[n_w])
    info = {"benchmark": "testbed", "machine": m, "load": load.summary(), "command": common.command_line(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "testbed": {"hosts": hosts, "rate_bit": rate_bit, "rate": format_rate(rate_bit),
                        "latency_us": args.latency, "netem": tb.info.get("netem"), "wire_overhead": f,
                        "worker_ceiling_updates_per_s": round(worker_ceiling(rate_bit, n_w, f), 2)},
            "params": params_src, "probe": probe,
            "probe_vs_derived": {"pingpong_s": [probe.get("pingpong_s"), derived.per_nw(
                                     {b // 8: v for b, v in derived.pingpong_s.items()}, n_w)],
                                 "round_trip_s": [probe.get("round_trip_s"), derived.per_nw(derived.round_trip_s, n_w)]}
            if probe and "error" not in probe else None,
            "cores_ceiling": cores, "sweep_s": round(time.perf_counter() - t_all, 1),
            "columns": {"updates_per_s": "steady state: server 0's receipts between the 10th and 90th percentile",
                        "updates_per_s_run": "results.json: updates / train_s",
                        "updates_per_s_run_no_eval": "updates / (train_s - rank 0's evaluate phase)",
                        "link_util": "updates_per_s x server 0's wire bytes per update / link bytes/s",
                        "link_ceiling_updates_per_s": "link bytes/s / server's wire bytes per update",
                        "pred_updates_per_s": "asgd.perf.analytic.predict with asgd.testbed.model.testbed_params",
                        "ape_pct": "|pred - meas| / meas, %",
                        "cpu_ms_per_update": "CPU of every rank (init included) / updates"}}
    info["summary"] = summarize(rows, args)
    paths = common.write_outputs(args.out, "testbed", rows, info)
    if not args.no_plot:
        plot(rows, info, args.out / "testbed.png")
        paths.append(args.out / "testbed.png")
    print(common.describe(m, info["load"]))
    print(f"testbed: {hosts} hosts, {format_rate(rate_bit)} each way per link, latency "
          f"{'%g us' % args.latency if args.latency and tb.info.get('netem') else 'none added'}; "
          f"wire/app {f:.4f}; calibration: {params_src}")
    if info["probe_vs_derived"]:
        pv = info["probe_vs_derived"]
        print(f"two-host probe (measured vs derived): ping-pong one way {1e3 * pv['pingpong_s'][0]:.1f} vs "
              f"{1e3 * pv['pingpong_s'][1]:.1f} ms; push/pull round trip {1e3 * pv['round_trip_s'][0]:.1f} vs "
              f"{1e3 * pv['round_trip_s'][1]:.1f} ms")
    common.print_table(rows, [("compress", "compress", ""), ("S", "servers", "d"), ("W", "workers", "d"),
                              ("updates/s", "updates_per_s", ".2f"), ("whole run", "updates_per_s_run", ".2f"),
                              ("model", "pred_updates_per_s", ".2f"), ("APE %", "ape_pct", ".1f"),
                              ("link full", "link_util", ".2f"), ("link ceiling", "link_ceiling_updates_per_s", ".1f"),
                              ("wire/app", "wire_over_app_sent", ".3f"), ("proof", "proof_ok", ""),
                              ("acc", "accuracy", ".3f"), ("load", "load_1min", ".1f")])
    s = info["summary"]
    for c in args.compress:
        for S, v in s[c]["ceilings"].items():
            print(f"{c}: {S} server(s): ceiling {v['ceiling_updates_per_s']:.2f} updates/s at {v['at_workers']} workers"
                  f" (link ceiling {v['link_ceiling_updates_per_s']:.1f}), {v['vs_one_server']}x one server's")
    print(f"model: median APE {s['model_median_ape_pct']} %, max {s['model_max_ape_pct']} %")
    if cores:
        print(f"cores' ceiling: {cores['updates_per_s']} updates/s (S={cores['servers']}, W={cores['workers']}, "
              f"shared memory)")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
