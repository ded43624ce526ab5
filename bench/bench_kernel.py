"""Worker training-step throughput on one core: asgd's numba kernel vs numpy, PyTorch and the FLOP ceiling.

Samples/s of one SGD step per precision (--precisions), hidden and batch size, medians of
interleaved repetitions; the implementations (IMPLS) and the ceiling: docs/bench-suite.md.
Writes kernel.csv, kernel.json and kernel.png under --out.

    python bench/bench_kernel.py                      # 2-10K-2, batch 256
    python bench/bench_kernel.py --batch 16,64,256,1024 --hidden 10000,100000
    python bench/bench_kernel.py --quick              # batch 64,256, 2-10K-2, few repeats
"""

import sys

import common  # pins one thread per process before numpy loads
import micro
from common import int_list

import itertools
import time
import warnings

import numpy as np
from numba import njit

from asgd.core.wire import PRECISIONS
from asgd.net import kernels
from asgd.net.mlp import Layout, init_params, make_step
from asgd.net.reference import step as reference_step

# numpy's float32 reference: exp(-x) overflows to inf below x = -88, the sigmoid's exact 0
warnings.filterwarnings("ignore", "overflow encountered in exp", RuntimeWarning)

IMPLS = ("numba", "numpy", "torch", "torch_manual", "exp_only")
GEMM = {"float32": "sgemm", "float64": "dgemm"}   # the FLOP ceiling of each precision
COLUMNS = {"precision": "the dtype of w, X, Delta-w and every implementation's arithmetic",
           "samples_per_s": "median over repetitions, wall clock (min/max beside it)",
           "samples_per_s_cpu": "batch / median CPU time of the step (the thread's: "
                                "blind to preemption by other processes)",
           "flops_per_sample": "4*d_in*H + 6*H*d_out + 9*H (exp as 1 FLOP)",
           "gflops": "samples_per_s * flops_per_sample",
           "ceiling_samples_per_s": "the precision's GEMM GFLOP/s (ceiling_gemm: SGEMM or DGEMM, 1 thread, "
                                    "best of 2 runs) / flops_per_sample",
           "dgemm_bound_samples_per_s": "DGEMM GFLOP/s / flops_per_sample, every precision (float64's "
                                        "ceiling_samples_per_s)",
           "pct_of_ceiling": "samples_per_s / ceiling", "vs_torch": "samples_per_s / torch's",
           "max_rel_diff_vs_numpy": "max |Delta-w - numpy's| / max |numpy's| after one step, numpy in the "
                                    "same precision",
           "exp_share_pct": "numba: the H exps of a sample alone (exp_only) / its whole step",
           "gflops_without_exp": "numba: the step's FLOPs less the H exps, over its time less the "
                                 "exps' (compare with the precision's gemm_gflops_1thread)"}


@njit(fastmath={"reassoc", "contract", "nsz", "arcp"}, error_model="numpy", boundscheck=False, cache=True)
def exp_rows(a, out, shifts):
    """A pass of asgd's vectorized exp (kernels.vexp: a's dtype's) over one cache-resident
    row of H values per shift."""
    for r in range(shifts.size):
        shift = shifts[r]                # a different input each pass: no pass can be elided
        for i in range(a.size):
            out[i] = kernels.vexp(a[i] - shift)


def parse_args(argv=None):
    p = common.parser(__doc__, "kernel", lock=True)
    p.add_argument("--hidden", type=int_list, default=[10000], help="hidden sizes, comma list (default 10000)")
    p.add_argument("--batch", type=int_list, default=[256], help="batch sizes, comma list (default 256)")
    micro.add_options(p, 21, "batch 64,256 at 2-10K-2, 5 repeats, 0.03 s each")
    p.add_argument("--dgemm-n", type=int, default=2048,
                   help="size of the peak-measuring SGEMM and DGEMM (default 2048)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch peers (skipped anyway without torch)")
    a = p.parse_args(argv)
    if a.quick:
        a.hidden, a.batch, a.repeat, a.min_time = [10000], [64, 256], 5, 0.03
    return a


def gemm_ceilings(n: int) -> dict:
    """{precision: GFLOP/s} of one-thread SGEMM and DGEMM (best of 4, after one untimed): the
    core's practical FLOP peak in each precision, whatever --precisions."""
    rng, got = np.random.default_rng(0), {}
    for p in PRECISIONS:
        a, b = rng.random((2, n, n)).astype(p)
        c = np.empty((n, n), p)
        t = common.interleaved({"gemm": lambda: np.matmul(a, b, out=c)}, 4, min_time=0, warmup=0)["gemm"]
        got[p] = 2 * n**3 / t["min_s"] / 1e9
    return got


def bench_case(layout, batch: int, prec: str, args, with_torch: bool) -> list[dict]:
    """One (layout, batch, precision)'s rows in common.micro's shape, an implementation each
    (the same weights and data in both precisions: float32's are float64's, rounded); numba's
    row also says how much of its step the exps take."""
    dtype = np.dtype(prec)
    w = init_params(layout, 0, dtype)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(batch, layout.d_in)).astype(dtype)
    y = rng.integers(0, layout.d_out, batch)
    lr = 3.0 / layout.d_hidden
    dw, dw_ref = np.empty(layout.n_w, dtype), np.empty(layout.n_w, dtype)
    step = make_step(layout, batch, dtype)
    t0 = time.perf_counter()
    step(w, X, y, lr, dw)             # compiles, or loads the numba cache
    first_call_s = time.perf_counter() - t0
    reference_step(layout, w, X, y, lr, dw_ref)
    check = {"numba": common.rel_diff(dw, dw_ref)}
    a = np.random.default_rng(2).normal(size=layout.d_hidden).astype(dtype)
    # each pass's input moved by more than the dtype's rounding (float32: sqrt(eps) ~ 3.5e-4)
    shift = 1e-9 if dtype == np.float64 else float(np.finfo(dtype).eps) ** 0.5
    e, shifts = np.empty_like(a), (np.arange(batch) * shift).astype(dtype)
    fns = {"numba": lambda: step(w, X, y, lr, dw),
           "numpy": lambda: reference_step(layout, w, X, y, lr, dw_ref),
           "exp_only": lambda: exp_rows(a, e, shifts)}
    if with_torch:
        from peers.torch_mlp import torch_steps
        typical, manual, delta_typical = torch_steps(layout, w, X, y, lr)
        check["torch"] = common.rel_diff(delta_typical(), dw_ref)
        fns["torch"], fns["torch_manual"] = typical, manual
    res = common.micro(fns, args.repeat, args.min_time, checks=check, lock=args.cpu_lock)
    sps = {name: batch / r["median_s"] for name, r in res.items()}
    # forward and weight gradients (2 + 2 per weight), dh = dz W2^T (2 per W2 weight), 9 elementwise
    # per hidden unit (bias, sigmoid with exp as 1, its derivative, db1); no dx
    flops = 4 * layout.d_in * layout.d_hidden + 6 * layout.d_hidden * layout.d_out + 9 * layout.d_hidden
    rows = []
    for impl, r in ((i, res[i]) for i in IMPLS if i in res):
        t = {"samples_per_s": sps[impl], "samples_per_s_min": batch / r["max_s"],
             "samples_per_s_max": batch / r["min_s"], "samples_per_s_cpu": batch / r["cpu_median_s"],
             "step_ms": 1e3 * r["median_s"],
             "steps_per_repeat": r["loops"], "max_rel_diff_vs_numpy": r["max_rel_diff"],
             **({"first_call_s": first_call_s} if impl == "numba" else {})}
        rows.append({"precision": prec, "d_in": layout.d_in, "hidden": layout.d_hidden, "d_out": layout.d_out,
                     "batch": batch, "impl": impl,
                     **{k: float(f"{v:.7g}") if isinstance(v, float) else v for k, v in t.items()},
                     "flops_per_sample": flops, "gflops": round(sps[impl] * flops / 1e9, 3),
                     "speedup_vs_numpy": round(sps[impl] / sps["numpy"], 3),
                     "vs_torch": round(sps[impl] / sps["torch"], 3) if "torch" in sps else None})
    t_step, t_exp = 1 / sps["numba"], 1 / sps["exp_only"]
    rows[0]["exp_share_pct"] = round(100 * t_exp / t_step, 1)
    rows[0]["gflops_without_exp"] = (round((flops - layout.d_hidden) / (t_step - t_exp) / 1e9, 2)
                                     if t_step > t_exp else None)
    return rows


def plot(rows, path):
    """Samples/s per implementation and batch: a panel per precision (rows) and hidden size
    (columns), each with its precision's GEMM ceiling."""
    plt = common.pyplot()
    hiddens = sorted({r["hidden"] for r in rows})
    precisions = [p for p in PRECISIONS if any(r["precision"] == p for r in rows)]
    impls = [i for i in ("numba", "numpy", "torch", "torch_manual") if any(r["impl"] == i for r in rows)]
    colors = {"numba": "tab:blue", "numpy": "tab:gray", "torch": "tab:orange", "torch_manual": "tab:red"}
    fig, axes = plt.subplots(len(precisions), len(hiddens), figsize=(4 + 3.5 * len(hiddens), 4.6 * len(precisions)),
                             squeeze=False)
    for ax_row, prec in zip(axes, precisions):
        for ax, hid in zip(ax_row, hiddens):
            sub = [r for r in rows if r["hidden"] == hid and r["precision"] == prec]
            by = {(r["batch"], r["impl"]): r for r in sub}
            common.bars(ax, sorted({r["batch"] for r in sub}), impls, lambda b, i: by[b, i]["samples_per_s"], colors,
                        lambda b, i, m: f"{m / 1e3:,.1f}K" if m < 1e5 else f"{m / 1e3:,.0f}K", rotation=90,
                        capsize=2, span=lambda b, i: (by[b, i]["samples_per_s_min"], by[b, i]["samples_per_s_max"]))
            ceil = sub[0]["ceiling_samples_per_s"]
            ax.axhline(ceil, color="k", ls="--", lw=1,
                       label=f"FLOP ceiling {ceil / 1e3:,.0f}K ({sub[0]['ceiling_gemm'].upper()} peak)")
            ax.set(yscale="log", xlabel="batch size", ylabel="samples/s, one core (log)",
                   ylim=(None, max(ceil, max(r["samples_per_s_max"] for r in sub)) * 4))
            ax.set_title(f"{sub[0]['d_in']}-{hid}-{sub[0]['d_out']} MLP, {prec} training step", fontsize=10)
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    common.save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    run = common.Run("kernel", args)
    with_torch = not args.no_torch and common._version("torch") is not None
    gflops, rows = gemm_ceilings(args.dgemm_n), []
    for hid, batch, prec in itertools.product(args.hidden, args.batch, args.precisions):   # a case's precisions
        case = bench_case(Layout(2, hid, 2), batch, prec, args, with_torch)                # back to back
        rows += case
        print(f"  {prec} 2-{hid}-2 batch {batch}: " + ", ".join(f"{r['impl']} {r['samples_per_s']:,.0f}" for r in case),
              flush=True)
    again = gemm_ceilings(args.dgemm_n)   # again at the end: best of both
    gflops = {p: max(v, again[p]) for p, v in gflops.items()}
    for r in rows:
        r["ceiling_gemm"] = GEMM[r["precision"]]
        r["ceiling_samples_per_s"] = round(gflops[r["precision"]] * 1e9 / r["flops_per_sample"])
        r["pct_of_ceiling"] = round(100 * r["samples_per_s"] / r["ceiling_samples_per_s"], 2)
        r["dgemm_bound_samples_per_s"] = round(gflops["float64"] * 1e9 / r["flops_per_sample"])   # the old column
    ratios = common.precision_ratios(rows, ("hidden", "batch", "impl"),   # samples/s, wall clock and CPU time
                                     {"float32_over_float64": "samples_per_s",
                                      "float32_over_float64_cpu": "samples_per_s_cpu"})
    info = run.meta(dgemm_gflops_1thread=gflops["float64"], sgemm_gflops_1thread=gflops["float32"],
                    float32_over_float64=ratios,
                    torch=with_torch or "not measured (not installed, or --no-torch)", columns=COLUMNS)
    table = []   # a line per case: numba's row, every impl's samples/s
    for _, case in itertools.groupby(rows, lambda r: (r["hidden"], r["batch"], r["precision"])):
        by = {r["impl"]: r for r in case}
        table.append({**by["numba"], "model": f"2-{by['numba']['hidden']}-2",
                      **{i: r["samples_per_s"] for i, r in by.items()},
                      "x_torch_cpu": (by["numba"]["samples_per_s_cpu"] / by["torch"]["samples_per_s_cpu"]
                                      if "torch" in by else None)})
    print(f"SGEMM 1 thread {gflops['float32']:.1f} GFLOP/s, DGEMM {gflops['float64']:.1f}; torch: {info['torch']}")
    common.report(run, rows, info, plot, table, [
        ("precision", "precision", ""), ("model", "model", ""), ("batch", "batch", "d"), ("numba s/s", "numba", ",.0f"),
        ("numpy", "numpy", ",.0f"), ("torch", "torch", ",.0f"), ("torch manual", "torch_manual", ",.0f"),
        ("exp only", "exp_only", ",.0f"), ("ceiling", "ceiling_samples_per_s", ",.0f"),
        ("numba % ceil", "pct_of_ceiling", ".1f"), ("x numpy", "speedup_vs_numpy", ".1f"),
        ("x torch", "vs_torch", ".1f"), ("x torch (cpu time)", "x_torch_cpu", ".1f"),
        ("exp % of step", "exp_share_pct", ".0f"), ("GFLOP/s w/o exp", "gflops_without_exp", ".1f")],
        ["s/s: samples/s, median wall clock; 'cpu time': the same ratio from the steps' CPU time (load-proof)",
         *micro.ratio_line("samples/s (wall; cpu time)", ratios,
                           lambda r: f"{r['impl']} 2-{r['hidden']}-2 b{r['batch']}", cpu=True)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
