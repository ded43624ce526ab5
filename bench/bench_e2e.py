"""End to end: time to held-out accuracy >= 0.95 (from process start and from the start of
training), samples/s and updates/s at 2, 4, 8 and 16 ranks for asgd's parameter server and
allreduce against PyTorch's RPC parameter server and DDP (bench/peers/), in every precision
of --precisions; each implementation warmed by one discarded run, the order rotating per
repetition, medians; --testbed RATE (root): across an emulated cluster. Details:
docs/bench-suite.md. Writes e2e.csv (a row per run), e2e.json and e2e.png.

    python bench/bench_e2e.py                          # ranks 2,4,8,16, 3 repetitions
    python bench/bench_e2e.py --quick                  # 4 ranks, once
    python bench/bench_e2e.py --testbed 8mbit --repeat 1 --epochs 2   # the emulated cluster (root)
"""

import sys

import common
import validate
from common import int_list
from runs_report import median, ratio, rounded

from asgd.core.wire import PRECISIONS

import contextlib

EVERY_EPOCH = ["--eval-every", "epoch"]   # asgd evaluates every epoch's end, as the peers do (default: a 5 % budget)
IMPLS = {"asgd ps": ["-m", "asgd.train", *EVERY_EPOCH],
         "asgd allreduce": ["-m", "asgd.train", "--arch", "allreduce", *EVERY_EPOCH],
         "pytorch rpc ps": [str(common.PEERS / "rpc_peer.py")], "pytorch ddp": [str(common.PEERS / "ddp_peer.py")]}
TORCH = ("pytorch rpc ps", "pytorch ddp")


def parse_args(argv=None):
    p = common.parser(__doc__, "e2e")
    p.add_argument("--ranks", type=int_list, default=[2, 4, 8, 16], help="MPI ranks, comma list (default 2,4,8,16)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions of each configuration (default 3)")
    p.add_argument("--epochs", type=int, default=4, help="epochs per run (default 4; DDP stops at --target)")
    p.add_argument("--target", type=float, default=0.95, help="held-out accuracy (default 0.95)")
    p.add_argument("--impls", type=common.choice_list(IMPLS), default=",".join(IMPLS),
                   help=f"comma list of {', '.join(IMPLS)}")
    p.add_argument("--precisions", type=common.choice_list(PRECISIONS), default=",".join(PRECISIONS),
                   help=f"comma list of {', '.join(PRECISIONS)}: every implementation in each (default both)")
    p.add_argument("--quick", action="store_true", help="4 ranks only, one repetition, 3 epochs")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one run may take (default 300; 900 with --testbed)")
    p.add_argument("--testbed", metavar="RATE", default=None,
                   help="run on an emulated cluster of max(--ranks) hosts whose links are shaped to RATE "
                        "(e.g. 8mbit: bench_testbed's rate; needs root), brought up and taken down by the bench")
    p.add_argument("--testbed-name", default="e2e", help="the testbed's name (default e2e)")
    a = p.parse_args(argv)
    if a.timeout is None:
        a.timeout = 900.0 if a.testbed else 300.0
    if a.quick:
        a.ranks, a.repeat, a.epochs = [4], 1, 3
    for impl in TORCH:
        if impl in a.impls and not common._version("torch"):
            print(f"{impl}: skipped (torch is not installed: pip install torch==2.13.0)", flush=True)
            a.impls.remove(impl)
    return a


# the summary's medians over a configuration's runs, and their rounding
MEDIANS = (("time_to_accuracy_s", 3), ("train_time_to_accuracy_s", 3), ("epochs_to_accuracy", None),
           ("samples_per_s", 1), ("updates_per_s", 3), ("init_s", 3), ("job_wall_s", 3))
# every implementation's sockets on the hosts' shaped data link (eth0), not the control one
TESTBED_ENV = {"GLOO_SOCKET_IFNAME": "eth0", "TP_SOCKET_IFNAME": "eth0"}


def link_ceiling(impl: str, n: int, rate_bit: float, hidden: int, precision: str) -> float:
    """Updates/s at which the architecture's busiest link is full (the module's docstring),
    each value of w `precision`'s bytes."""
    from asgd.core.wire import itemsize
    from asgd.net.mlp import Layout
    model = validate.testbed_model()
    n_w, size = Layout(2, hidden, 2).n_w, itemsize(precision)
    if impl.endswith(" ps"):   # the server's link, or the workers' own (push, then reply: one outstanding each)
        return min(model.link_ceiling(rate_bit, n_w, 1, size), (n - 1) * model.worker_ceiling(rate_bit, n_w, size))
    return rate_bit / 8.0 / (2 * (n - 1) / n * model.wire_bytes(n_w, size))


def run_once(impl: str, precision: str, n: int, args, tb=None) -> dict:
    argv = [*IMPLS[impl], "--epochs", str(args.epochs), "--precision", precision]
    argv += ["--stop-at", str(args.target)] if impl in TORCH else ["--quiet", "--timeout", str(args.timeout - 10)]
    if tb is not None and impl == "pytorch rpc ps":
        argv.append("--tcp-only")
    r, job = common.train_job(n, argv, args.timeout, env=TESTBED_ENV if tb else None, tb=tb)
    hist = r["metrics"]["history"]
    tta, train_tta = (common.time_to_accuracy(hist, args.target, clock) for clock in ("wall_s", "time_s"))
    return {"impl": impl, "ranks": n, "precision": r["config"]["precision"],
            "time_to_accuracy_s": rounded(tta, 3), "train_time_to_accuracy_s": rounded(train_tta, 3),
            "epochs_to_accuracy": next((h["epoch"] for h in hist if (h["test_accuracy"] or 0) >= args.target), None),
            "samples_per_s": round(r["throughput"]["samples_per_s"], 1),
            "updates_per_s": rounded(r["throughput"].get("updates_per_s"), 3),
            **{k: round(r[k], 3) for k in ("init_s", "train_s", "wall_s")}, "job_wall_s": round(job["wall_s"], 3),
            "final_accuracy": round(r["metrics"]["accuracy"], 4), "epochs_run": len(hist),
            "accuracy_by_epoch": " ".join(f"{h['test_accuracy']:.3f}" for h in hist),
            "wall_by_epoch": " ".join(f"{h['wall_s']:.2f}" for h in hist), "lr": r["config"]["lr"],
            **({"wire_mb": round(sum(h["sent"] for h in job["wire"]) / 1e6, 2),
                "server_link_mb": round((job["wire"][0]["sent"] + job["wire"][0]["recv"]) / 1e6, 2)} if tb else {}),
            "command": f"mpiexec -n {n} python {' '.join(argv)} --out DIR"}


def summarize(rows, configs, ranks, rate_bit=None):
    """A line per (ranks, implementation, precision): medians over its runs, and ratios to
    DDP's and the RPC server's in the same precision."""
    out = []
    for n in ranks:
        for impl, prec in configs:
            rs = [r for r in rows if r["ranks"] == n and r["impl"] == impl and r["precision"] == prec]
            if not rs:
                continue
            ttas = [r["time_to_accuracy_s"] for r in rs if r["time_to_accuracy_s"] is not None]
            out.append({"ranks": n, "impl": impl, "precision": prec, "runs": len(rs), "reached": len(ttas),
                        "tta_min_s": min(ttas, default=None), "tta_max_s": max(ttas, default=None),
                        **{k: median(rs, k, digits) for k, digits in MEDIANS}})
            if rate_bit:
                from asgd.run.config import EMBEDDED_HIDDEN
                ceiling = link_ceiling(impl, n, rate_bit, EMBEDDED_HIDDEN, prec)
                out[-1].update(link_ceiling_updates_per_s=round(ceiling, 2),
                               link_util=ratio(out[-1]["updates_per_s"], ceiling), wire_mb=median(rs, "wire_mb", 1))
    by = {(s["ranks"], s["impl"], s["precision"]): s for s in out}
    for s in out:
        ddp, rpc = (by.get((s["ranks"], impl, s["precision"]), {}) for impl in TORCH[::-1])
        s["tta_vs_ddp"] = ratio(s["time_to_accuracy_s"], ddp.get("time_to_accuracy_s"))
        s["train_tta_vs_ddp"] = ratio(s["train_time_to_accuracy_s"], ddp.get("train_time_to_accuracy_s"))
        s["updates_vs_rpc"] = ratio(s["updates_per_s"], rpc.get("updates_per_s"), 2)
    return out


def plot(summary, target, where, path):
    plt = common.pyplot()
    ranks = sorted({s["ranks"] for s in summary})
    configs = list(dict.fromkeys((s["impl"], s["precision"]) for s in summary))
    colors = {c: plt.cm.tab20(2 * list(IMPLS).index(c[0]) + PRECISIONS.index(c[1])) for c in configs}   # hue, shade
    by = {(s["ranks"], s["impl"], s["precision"]): s for s in summary}
    fig, axes = plt.subplots(1, 2, figsize=(11 + len(configs) // 2, 4.3))
    for ax, key, fmt, ylabel, title in (
            (axes[0], "time_to_accuracy_s", "{:.1f} s", f"seconds from start to held-out accuracy ≥ {target} (median)",
             "Time to accuracy, 2-10K-2, batch 256/rank"),
            (axes[1], "samples_per_s", "{:,.0f}", "training samples/s (median)", "Throughput during training")):
        common.bars(ax, ranks, configs, lambda n, c, key=key: by.get((n, *c), {}).get(key), colors,
                    lambda n, c, y, fmt=fmt: fmt.format(y) if y else "not\nreached", fontsize=7,
                    labels={c: " ".join(c) for c in configs})
        ax.set(xlabel="MPI ranks (asgd ps: 1 server + N-1 workers)", ylabel=ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle(where[0].upper() + where[1:], fontsize=10)
    common.save_figure(fig, path)


def measure(args, configs, tb) -> list[dict]:
    """Every (repetition, ranks, implementation, precision), in rotating order."""
    rows = []
    for rep in range(args.repeat):
        for n in args.ranks:
            for impl, prec in common.rotated(configs, rep + n):
                try:
                    r = run_once(impl, prec, n, args, tb)
                except common.JobFailed as e:
                    print(f"  {impl} {prec} n={n}: FAILED {str(e)[:400]}", flush=True)
                    continue
                rows.append({"rep": rep, **r})
                print(f"  rep {rep + 1}/{args.repeat} n={n} {impl:<15} {prec} time to {args.target}: "
                      f"{common.fmt(r['time_to_accuracy_s'], '.2f')} s, {r['samples_per_s']:,.0f} samples/s, "
                      f"acc by epoch {r['accuracy_by_epoch']}", flush=True)
    return rows


def main(argv=None):
    args = parse_args(argv)
    run = common.Run("e2e", args, end_on_signals=bool(args.testbed))   # a killed bench takes its testbed down
    configs = [(impl, prec) for impl in args.impls for prec in args.precisions]   # each in every precision
    for impl, prec in configs:   # every side warmed alike: one discarded run each (shared memory)
        run_once(impl, prec, min(args.ranks), args)
    with (validate.testbed(args.testbed_name, max(args.ranks), args.testbed) if args.testbed
          else contextlib.nullcontext()) as tb:
        rows = measure(args, configs, tb)
    rate_bit = validate.parse_rate(args.testbed) if args.testbed else None
    summary = summarize(rows, configs, args.ranks, rate_bit)
    from asgd.net import optimizers
    from asgd.run.config import Config
    _opt = Config().optimizer
    info = run.meta(
        target_accuracy=args.target,
        problem="asgd.data.problem.default_problem(): 16384 train / 4096 held-out rings; 2-10000-2, every "
                f"implementation in {' and '.join(args.precisions)} (asgd's default: {Config().precision}), "
                f"batch 256 per worker rank; optimizer {_opt} (asgd's default) everywhere, lr "
                f"{optimizers.default_lr(_opt, 10000):g} (asgd ps, async), allreduce and DDP at N ranks "
                f"{', '.join(f'{optimizers.default_lr(_opt, 10000, n):g} (N={n})' for n in args.ranks)}",
        target_uses="time_to_accuracy_s (whole process)",
        columns={"time_to_accuracy_s": "history wall_s (since rank 0's process start) of the first "
                                       "epoch with test_accuracy >= target",
                 "train_time_to_accuracy_s": "history time_s (since training started) of that epoch",
                 "samples_per_s": "training samples / train_s", "job_wall_s": "mpiexec start to exit",
                 "updates_per_s": "updates of w / train_s (a parameter server's: pushes applied; allreduce's "
                                  "and DDP's: synchronous steps)",
                 "updates_vs_rpc": "updates_per_s / the PyTorch RPC parameter server's at the same ranks and precision",
                 "tta_vs_ddp": "time_to_accuracy_s / DDP's at the same ranks and precision",
                 **({"wire_mb": "bytes every host sent on its shaped link, MB (veth counters)",
                     "link_ceiling_updates_per_s": "updates/s at which the architecture's busiest link is full",
                     "link_util": "updates_per_s / link_ceiling_updates_per_s"} if tb else {})},
        where=(f"measured on the emulated cluster: {max(args.ranks)} hosts, links {args.testbed} each way, "
               "one rank per host" if tb else "measured here, shared memory"),
        summary=summary)
    common.report(run, rows, info, plot if summary else None, summary, [
        ("ranks", "ranks", "d"), ("implementation", "impl", ""), ("precision", "precision", ""),
        (f"time to {args.target}: whole process s", "time_to_accuracy_s", ".2f"), ("min", "tta_min_s", ".2f"),
        ("max", "tta_max_s", ".2f"), ("x DDP", "tta_vs_ddp", ".2f"),
        ("training only s", "train_time_to_accuracy_s", ".2f"), ("x DDP", "train_tta_vs_ddp", ".2f"),
        ("epochs", "epochs_to_accuracy", ".0f"),
        ("samples/s", "samples_per_s", ",.0f"), ("updates/s", "updates_per_s", ",.1f"),
        ("x RPC PS", "updates_vs_rpc", ".2f"), ("init s", "init_s", ".2f"),
        *([("link ceiling/s", "link_ceiling_updates_per_s", ".2f"), ("x ceiling", "link_util", ".2f"),
           ("MB sent", "wire_mb", ",.0f")] if tb else []), ("runs", "runs", "d"), ("reached", "reached", "d")],
        [info["where"],
         "the target (asgd before DDP) is judged on the whole-process time; the training-only time is beside it"],
        data=(summary, args.target, info["where"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
