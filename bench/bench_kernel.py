"""Worker training-step throughput on one core: the numba kernel vs the numpy reference.

Measures samples/s of one SGD step (forward, backward, Delta-w) of the d_in-H-d_out MLP
in float64, for each hidden size and batch size, with asgd.kernels.sgd_step and
asgd.mlp.reference_step side by side in one run: both warmed up, repetitions
interleaved, medians reported. Also measures this core's DGEMM rate (numpy matmul,
one thread) as the hardware bound. Writes kernel.csv, kernel.json and kernel.png.

    python bench/bench_kernel.py                      # 2-10K-2, batch 256
    python bench/bench_kernel.py --batch 16,64,256,1024 --hidden 10000,100000
"""

import os

for _v in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"   # one core, like one MPI rank; must precede the numpy import

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))   # run from a checkout without installing
from asgd import kernels  # noqa: E402
from asgd.mlp import Layout, init_params, reference_step  # noqa: E402


def int_list(s):
    return [int(v) for v in s.split(",") if v]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int_list, default=[10000], help="hidden sizes, comma list (default 10000)")
    p.add_argument("--batch", type=int_list, default=[256], help="batch sizes, comma list (default 256)")
    p.add_argument("--d-in", type=int, default=2, help="input size (default 2)")
    p.add_argument("--d-out", type=int, default=2, help="classes (default 2)")
    p.add_argument("--repeat", type=int, default=21, help="timed repetitions per implementation (default 21)")
    p.add_argument("--min-time", type=float, default=0.05,
                   help="seconds per repetition; short steps are looped to reach it (default 0.05)")
    p.add_argument("--out", type=Path, default=Path("bench/results/kernel"), help="output folder (default bench/results/kernel)")
    p.add_argument("--no-plot", action="store_true", help="skip kernel.png")
    return p.parse_args(argv)


def machine():
    """What the numbers were measured on."""
    import llvmlite.binding as llvm
    import numba
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or cpu
    return {"cpu": cpu, "llvm_cpu": llvm.get_host_cpu_name(), "cores": os.cpu_count(),
            "loadavg_at_start": os.getloadavg(), "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__, "platform": platform.platform()}


def dgemm_gflops(n=2048, reps=4):
    """One-thread float64 matmul rate: the core's practical FLOP peak."""
    a, b = np.random.default_rng(0).random((2, n, n))
    a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n**3 / min(ts) / 1e9


def step_flops(layout):
    """Multiply-add FLOPs of one sample's step: 2 forward + 4 backward per weight (the H exps not counted)."""
    return 6 * (layout.d_in * layout.d_hidden + layout.d_hidden * layout.d_out)


def bench_case(layout, batch, repeat, min_time):
    """Median/min/max samples/s of both implementations for one (layout, batch), interleaved."""
    w = init_params(layout, seed=0)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(batch, layout.d_in))
    y = rng.integers(0, layout.d_out, batch)
    dw = np.empty(layout.n_w)
    views, dviews = layout.views(w), layout.views(dw)
    scratch = kernels.make_scratch(batch, layout.d_hidden, layout.d_out)
    steps = {"numba": lambda: kernels.sgd_step(*views, X, y, 0.01, *dviews, scratch),
             "numpy": lambda: reference_step(layout, w, X, y, 0.01, dw)}
    t0 = time.perf_counter()
    steps["numba"]()                  # compiles, or loads the numba cache
    first_call_s = time.perf_counter() - t0
    loops = {}
    for name, f in steps.items():     # warm up and size the loop so one repetition lasts ~min_time
        f()
        t0 = time.perf_counter()
        f()
        loops[name] = max(1, int(min_time / (time.perf_counter() - t0)))
    times = {name: [] for name in steps}
    for _ in range(repeat):
        for name, f in steps.items():
            t0 = time.perf_counter()
            for _ in range(loops[name]):
                f()
            times[name].append((time.perf_counter() - t0) / loops[name])
    out = {}
    for name, ts in times.items():
        ts = np.array(ts)
        out[name] = {"samples_per_s": batch / np.median(ts), "samples_per_s_min": batch / ts.max(),
                     "samples_per_s_max": batch / ts.min(), "step_ms": 1e3 * np.median(ts),
                     "steps_per_repeat": loops[name]}
    out["numba"]["first_call_s"] = first_call_s
    return out


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    hiddens = sorted({r["hidden"] for r in rows})
    fig, axes = plt.subplots(1, len(hiddens), figsize=(5 + 2.5 * len(hiddens), 4.2), squeeze=False)
    for ax, hid in zip(axes[0], hiddens):
        sub = [r for r in rows if r["hidden"] == hid]
        batches = sorted({r["batch"] for r in sub})
        x = np.arange(len(batches))
        for off, impl, color in ((-0.2, "numba", "tab:blue"), (0.2, "numpy", "tab:gray")):
            rs = [next(r for r in sub if r["batch"] == b and r["impl"] == impl) for b in batches]
            med = np.array([r["samples_per_s"] for r in rs])
            err = [med - [r["samples_per_s_min"] for r in rs], [r["samples_per_s_max"] for r in rs] - med]
            ax.bar(x + off, med, 0.4, yerr=err, capsize=3, color=color, label=f"{impl} (median, min-max)")
            for xi, m, r in zip(x + off, med, rs):
                label = f"{m:,.0f}" + (f"\n{r['speedup_vs_numpy']:.1f}x" if impl == "numba" else "")  # above the error bar
                ax.annotate(label, (xi, r["samples_per_s_max"]), ha="center", va="bottom", fontsize=7, xytext=(0, 3),
                            textcoords="offset points")
        ax.set_xticks(x, [str(b) for b in batches])
        ax.set_xlabel("batch size")
        ax.set_ylabel("samples/s, one core")
        ax.set_title(f"{sub[0]['d_in']}-{hid}-{sub[0]['d_out']} MLP, float64 training step\n"
                     f"(DGEMM bound {sub[0]['dgemm_bound_samples_per_s']:,} samples/s)", fontsize=10)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
        ax.set_ylim(0, 1.2 * max(r["samples_per_s_max"] for r in sub))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    info = {"machine": machine(), "dgemm_gflops_1thread": dgemm_gflops(), "args": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    rows = []
    for hid in args.hidden:
        layout = Layout(args.d_in, hid, args.d_out)
        flops = step_flops(layout)
        for batch in args.batch:
            res = bench_case(layout, batch, args.repeat, args.min_time)
            for impl, r in res.items():
                rows.append({"d_in": args.d_in, "hidden": hid, "d_out": args.d_out, "batch": batch, "impl": impl,
                             **{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()},
                             "gflops": round(r["samples_per_s"] * flops / 1e9, 3),
                             "speedup_vs_numpy": round(r["samples_per_s"] / res["numpy"]["samples_per_s"], 3),
                             "flops_per_sample": flops,
                             "dgemm_bound_samples_per_s": round(info["dgemm_gflops_1thread"] * 1e9 / flops)})
    info["results"] = rows
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(args.out / "kernel.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    (args.out / "kernel.json").write_text(json.dumps(info, indent=2))
    if not args.no_plot:
        plot(rows, args.out / "kernel.png")

    m = info["machine"]
    print(f"{m['cpu']} ({m['llvm_cpu']}), {m['cores']} cores, load {m['loadavg_at_start'][0]:.2f}; "
          f"numpy {m['numpy']}, numba {m['numba']}; DGEMM 1 thread {info['dgemm_gflops_1thread']:.1f} GFLOP/s")
    print(f"{'model':>12} {'batch':>6} {'numba s/s':>11} {'numpy s/s':>10} {'speedup':>8} {'numba GFLOP/s':>14} {'DGEMM bound s/s':>16}")
    for hid in args.hidden:
        for batch in args.batch:
            nb, npy = (next(r for r in rows if r["hidden"] == hid and r["batch"] == batch and r["impl"] == i)
                       for i in ("numba", "numpy"))
            print(f"{f'{args.d_in}-{hid}-{args.d_out}':>12} {batch:>6} {nb['samples_per_s']:>11,.0f} "
                  f"{npy['samples_per_s']:>10,.0f} {nb['speedup_vs_numpy']:>7.1f}x {nb['gflops']:>14.1f} "
                  f"{nb['dgemm_bound_samples_per_s']:>16,}")
    print(f"wrote {args.out}/kernel.csv, kernel.json" + ("" if args.no_plot else ", kernel.png"))


if __name__ == "__main__":
    main()
