"""Run the whole benchmark suite, then print and write one summary with the targets.

    python bench/run_all.py            # the five benchmarks below (about 20 minutes on 2 cores)
    python bench/run_all.py --quick    # smaller sweeps (about 1.5 minutes on 2 cores), into bench/results/quick/
    python bench/run_all.py --only kernel,server
    python bench/run_all.py --everything   # also bench_trace, bench_readers, bench_model, bench_startup,
                                           # bench_waiting, bench_data, bench_tta

Each benchmark runs as its own process with a time limit, into bench/results/<name>/
(--quick: bench/results/quick/<name>/); then summary.json and summary.md beside them (what
they hold: docs/bench-suite.md).
"""

import sys
from pathlib import Path

import common

import json
import os
import subprocess
import time

# name: (script, full-suite arguments, --quick arguments)
SUITE = {
    "kernel": ("bench_kernel.py", ["--batch", "16,64,256,1024", "--hidden", "10000,100000", "--repeat", "7"],
               ["--quick"]),
    "server": ("bench_server.py", [], ["--quick"]),
    "messaging": ("bench_messaging.py", [], ["--quick"]),
    "e2e": ("bench_e2e.py", [], ["--quick"]),
    "paper": ("paper_figures.py", [], ["--quick"]),
}
# the other benchmarks in bench/: run only when named in --only, or with --everything
# (bench_arch.py and bench_testbed.py need root and the emulated cluster: they run alone)
OTHERS = {
    "trace": ("bench_trace.py", [], ["--repeat", "1"]),
    "readers": ("bench_readers.py", [], ["--quick"]),
    "model": ("bench_model.py", [], ["--quick"]),
    "startup": ("bench_startup.py", [], ["--repeat", "1"]),
    "waiting": ("bench_waiting.py", [], ["--repeat", "1"]),
    "data": ("bench_data.py", [], ["--quick"]),
    "tta": ("bench_tta.py", [], ["--quick"]),
}


def parse_args(argv=None):
    p = common.parser(__doc__)   # its own --out: the root of every benchmark's folder
    p.add_argument("--quick", action="store_true", help="each benchmark's --quick: smaller sweeps, fewer repetitions")
    p.add_argument("--only", type=common.word_list, default=",".join(SUITE),
                   help=f"comma list of {', '.join(SUITE)} (default all of these) or {', '.join(OTHERS)}")
    p.add_argument("--everything", action="store_true", help=f"also {', '.join(OTHERS)} (bench/'s other scripts)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one benchmark may take (default 1800)")
    p.add_argument("--out", type=Path, default=None,
                   help="results root (default bench/results, with --quick bench/results/quick: a quick run "
                        "never overwrites the full suite's results)")
    a = p.parse_args(argv)
    a.out = a.out or (common.RESULTS / "quick" if a.quick else common.RESULTS)
    a.only += list(OTHERS) if a.everything else []
    bad = set(a.only) - set(SUITE) - set(OTHERS)
    if bad:
        p.error(f"unknown benchmark(s) {sorted(bad)}; choose from {', '.join([*SUITE, *OTHERS])}")
    return a


def load_json(out: Path, name: str) -> dict | None:
    f = out / name / f"{name}.json"
    return json.loads(f.read_text()) if f.exists() else None


def rows_of(out: Path, name: str, keep=lambda r: True) -> list[dict]:
    """The rows a benchmark wrote that keep(row) takes ([]: it wrote none)."""
    return [r for r in (load_json(out, name) or {}).get("rows", []) if keep(r)]


def targets(out: Path) -> list[dict]:
    """Each target: what was measured against what, and met/missed (None: not measured)."""
    res = []
    kernel = rows_of(out, "kernel")
    at = {(r["precision"], r["impl"]): r for r in kernel if (r["hidden"], r["batch"]) == (10000, 256)}
    for prec in dict.fromkeys(r["precision"] for r in kernel):   # each precision measured
        nb, pt = at.get((prec, "numba")), at.get((prec, "torch"))
        if nb and pt:
            x, xc = nb["samples_per_s"] / pt["samples_per_s"], nb["samples_per_s_cpu"] / pt["samples_per_s_cpu"]
            res.append({"target": f"worker kernel >= 5x PyTorch, 2-10K-2, batch 256, {prec}, 1 core",
                        "measured": f"{nb['samples_per_s']:,.0f} vs {pt['samples_per_s']:,.0f} samples/s: "
                                    f"{x:.1f}x (CPU-time ratio {xc:.1f}x); {nb['pct_of_ceiling']:.0f}% of the "
                                    f"FLOP ceiling {nb['ceiling_samples_per_s']:,}", "met": x >= 5})
        else:
            res.append({"target": f"worker kernel >= 5x PyTorch, {prec}", "measured": "PyTorch not measured",
                        "met": None})
    for r in rows_of(out, "server", lambda r: r["path"] == "asgd"):
        res.append({"target": f"server >= 50% of its floor, {r['model']}, {r['workers']} worker(s), {r['optimizer']}, "
                              f"{r['precision']}",
                    "measured": f"{r['us_per_op']:,.0f} µs a push, {r['pct_of_floor']:.0f}% of the floor "
                                f"{r['floor_us']:,.0f} µs ({r['gb_per_s']:.1f} GB/s)", "met": r["pct_of_floor"] >= 50})
    messaging = rows_of(out, "messaging")
    rtt = {(r["model"], r["precision"], r["variant"]): r["rtt_us"] for r in messaging}
    for r in (r for r in messaging if r["variant"].startswith("asgd ")):
        res.append({"target": f"push/pull round trip <= 1.5x ping-pong, {r['model']}, {r['precision']}, "
                              f"{r['variant']}, 2 ranks",
                    "measured": f"{r['rtt_us']:,.0f} vs {rtt[r['model'], r['precision'], 'pingpong']:,.0f} µs "
                                f"median: {r['vs_pingpong']:.2f}x", "met": r["vs_pingpong"] <= 1.5})
    e = load_json(out, "e2e")
    for n in sorted({x["ranks"] for x in (e or {}).get("summary", [])}):
        got = {x["impl"]: x for x in e["summary"] if x["ranks"] == n}
        ddp = got.get("pytorch ddp", {}).get("time_to_accuracy_s")
        for impl in ("asgd ps", "asgd allreduce"):
            t = got.get(impl, {}).get("time_to_accuracy_s")
            res.append({"target": f"time to {e['target_accuracy']} below PyTorch DDP's, {impl}, {n} ranks",
                        "measured": f"{common.fmt(t, '.2f')} s vs DDP {common.fmt(ddp, '.2f')} s",
                        "met": None if t is None or ddp is None else t < ddp})
    return res


# name: (title, the rows' key in its JSON, columns: (header, key, format))
HEADLINES = {
    "kernel": ("Worker kernel, samples/s on one core (median wall clock)", "rows",
               [("precision", "precision", ""), ("model", "hidden", "d"), ("batch", "batch", "d"),
                ("implementation", "impl", ""),
                ("samples/s", "samples_per_s", ",.0f"), ("ceiling", "ceiling_samples_per_s", ",.0f"),
                ("% of ceiling", "pct_of_ceiling", ".1f"), ("x PyTorch", "vs_torch", ".1f")]),
    "server": ("Server per-push work against its floor (the update's bytes at its footprint's bandwidth)", "rows",
               [("model", "model", ""), ("workers", "workers", "d"), ("precision", "precision", ""),
                ("optimizer", "optimizer", ""), ("path", "path", ""),
                ("µs/push", "us_per_op", ",.1f"), ("GB/s", "gb_per_s", ".1f"), ("% of floor", "pct_of_floor", ".0f")]),
    "messaging": ("Push/pull round trip, 2 ranks, µs", "rows",
                  [("model", "model", ""), ("precision", "precision", ""), ("variant", "variant", ""),
                   ("median", "rtt_us", ",.1f"),
                   ("min", "rtt_us_min", ",.1f"), ("x ping-pong", "vs_pingpong", ".2f")]),
    "e2e": ("Time to held-out accuracy, s (median of runs; from process start)", "summary",
            [("ranks", "ranks", "d"), ("implementation", "impl", ""), ("time to accuracy", "time_to_accuracy_s", ".2f"),
             ("epochs", "epochs_to_accuracy", ".0f"), ("samples/s", "samples_per_s", ",.0f"),
             ("init s", "init_s", ".2f"),
             ("runs", "runs", "d")]),
}


def headlines(out: Path) -> list[str]:
    """The main numbers of each benchmark as markdown tables (medians)."""
    lines = []
    for name, (title, key, cols) in HEADLINES.items():
        j = load_json(out, name)
        if j:
            lines += [f"{title}:", "", "| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(common.fmt(r.get(k), f) for _, k, f in cols) + " |" for r in j[key]] + [""]
    p = load_json(out, "paper")
    if p:
        lines += ["Paper figures: bench/results/paper/figure{2,3,4,9}.png. Figure 4: "
                  + ("cache jump seen: " if p["figure4_cache_jump"]["jump"] else "no cache jump: ")
                  + "; ".join(p["figure4_cache_jump"]["by_ranks"]) + f". Figure 9: {p['figure9_model']}.", ""]
    return lines


def main(argv=None):
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    load = common.LoadSampler()
    t_start = time.perf_counter()
    ran = []
    for name in a.only:
        script, full, quick = {**SUITE, **OTHERS}[name]
        args = quick if a.quick else full
        cmd = [sys.executable, str(common.BENCH / script), *args, "--out", str(a.out / name)]
        shown = " ".join(["python", f"bench/{script}", *args])
        print(f"\n=== {name}: {shown}", flush=True)
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, timeout=a.timeout, cwd=common.ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        ran.append({"benchmark": name, "command": shown, "rc": rc, "seconds": round(time.perf_counter() - t0, 1)})
        print(f"=== {name}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {ran[-1]['seconds']:.0f} s", flush=True)
    checks = targets(a.out)
    summary = {"suite": "quick" if a.quick else "full", "machine": common.machine(bandwidth=False),
               "load": load.summary(), "seconds": round(time.perf_counter() - t_start, 1), "benchmarks": ran,
               "targets": checks}
    common.write_json(a.out / "summary.json", summary)
    lines = [f"# asgd benchmarks ({summary['suite']} suite, {summary['seconds']:.0f} s)", "",
             common.describe(summary["machine"], summary["load"]), "",
             "| benchmark | command | status | seconds |", "|---|---|---|---|"]
    lines += [f"| {r['benchmark']} | `{r['command']}` | {'ok' if r['rc'] == 0 else r['rc']} | {r['seconds']} |"
              for r in ran]
    lines += ["", "Load average (1 min) during each benchmark: " + "; ".join(
        f"{r['benchmark']} {j['load']['loadavg_1min_median']} (max {j['load']['loadavg_1min_max']})"
        for r in ran if (j := load_json(a.out, r["benchmark"])) and j.get("load")) + f" on {os.cpu_count()} cores."]
    lines += [""] + headlines(a.out)
    lines += ["| target | measured | |", "|---|---|---|"]
    lines += [f"| {c['target']} | {c['measured']} | {'met' if c['met'] else 'n/a' if c['met'] is None else 'MISSED'} |"
              for c in checks]
    (a.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    print(f"\nwrote {a.out / 'summary.json'}, {a.out / 'summary.md'}")
    return 0 if all(r["rc"] == 0 for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
