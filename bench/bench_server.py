"""The server's per-push work for each optimizer, now (asgd: Optimizer.update into the next
version) and before issue 29 (check, update in place, copy into the reply buffer), against
its floor: the update's bytes (sgd 3 x itemsize n, momentum and adagrad 5 x, adam 7 x) at
the best of numpy copy/add/triad over the same footprint, measured in the same run; one
core, float32 and float64 (--precisions) timed interleaved. Details and columns:
docs/bench-suite.md, and COLUMNS below. Writes server.csv, server.json, server.png under --out.

    python bench/bench_server.py                        # 2-10K-2 and 2-100K-2, 1 and 8 workers
    python bench/bench_server.py --hidden 10000 --workers 1 --quick
    python bench/bench_server.py --precisions float64  # only float64 (the figures before float32)
"""

import sys

import common
import micro
from common import int_list

import math

import numpy as np
from numba import njit

from asgd.net import OPTIMIZERS, kernels
from asgd.net.optimizers import BETAS, EPS, MOMENTUM, Optimizer
from asgd.core.wire import PULL_HEADER, PUSH_HEADER, header_slots
from asgd.net.mlp import Layout

UPDATES = {"sgd": (3, 0), "momentum": (5, 1), "adagrad": (5, 1), "adam": (7, 2)}   # (arrays of n moved, state arrays)
PATHS = ("asgd", "before")
COLUMNS = {"precision": "the dtype of w, d, the versions and the optimizer's state",
           "path": "asgd: Optimizer.update into the next version (what the server does); before: "
                   "all_finite, the update in place, the copy into a reply buffer (before issue 29)",
           "bytes_per_op": "bytes the update must move (the floor's), reads + writes, no write-allocate",
           "bytes_moved": "bytes the path moves: the floor's, plus before's check (itemsize n) and copy "
                          "(2 itemsize n)",
           "vs_sgd": "us_per_op / sgd's, same model, workers, precision and path",
           "footprint_bytes": "the path's buffers: w (asgd: W + 1 versions), the state, "
                              "the W workers' d (before: and their reply buffers)",
           "gb_per_s": "bytes_per_op / median time (the floor's bytes: comparable across paths)",
           "bound_gb_per_s": "best of numpy copy/add/triad rotating over the path's footprint",
           "floor_us": "bytes_per_op at bound_gb_per_s", "pct_of_floor": "floor_us / us_per_op",
           "pct_of_memory_bound": "gb_per_s vs the best of copy/add/triad on machine.memory_bandwidth_gbs arrays",
           "max_rel_diff_vs_before": "asgd: max |w' - before's w'| / max |before's w'| "
                                     "after one push from the same w, d, same precision"}


# -- the server's kernels before issue 29 (in place; the check and the reply's copy apart; sgd's: add_into) --

@njit(boundscheck=False, error_model="numpy", cache=True)
def _before_momentum(w, v, d, lr, mu):
    for i in range(w.size):
        vi = mu * v[i] + lr * d[i]
        v[i] = vi
        w[i] += vi


@njit(fastmath={"contract"}, boundscheck=False, error_model="numpy", cache=True)
def _before_adagrad(w, g2, d, lr, eps):
    for i in range(w.size):
        di = d[i]
        s = g2[i] + di * di
        g2[i] = s
        w[i] += lr * di / (math.sqrt(s) + eps)


@njit(fastmath={"contract"}, boundscheck=False, error_model="numpy", cache=True)
def _before_adam(w, m, v, d, lr, b1, b2, eps, t):
    c1 = 1.0 / (1.0 - b1 ** t)
    c2 = 1.0 / (1.0 - b2 ** t)
    for i in range(w.size):
        di = d[i]
        mi = b1 * m[i] + (1.0 - b1) * di
        vi = b2 * v[i] + (1.0 - b2) * di * di
        m[i] = mi
        v[i] = vi
        w[i] += lr * (mi * c1) / (math.sqrt(vi * c2) + eps)


def before_update(name, n, lr=1e-3, w=None, dtype=np.float64):
    """The old per-push work: check, update w in place, copy it into the reply buffer (on
    arrays of `dtype`, w's if given)."""
    w = np.random.default_rng(5).normal(size=n).astype(dtype) if w is None else w
    state = [np.zeros(n, w.dtype) for _ in range(UPDATES[name][1])]
    t = [0]
    move = {"sgd": lambda d: kernels.add_into(w, d),
            "momentum": lambda d: _before_momentum(w, *state, d, lr, MOMENTUM),
            "adagrad": lambda d: _before_adagrad(w, *state, d, lr, EPS),
            "adam": lambda d: _before_adam(w, *state, d, lr, *BETAS, EPS, t[0])}[name]

    def apply(d, reply):
        if kernels.all_finite(d):
            t[0] += 1
            move(d)
            reply[:n] = w
    return apply


# -- the measurements --------------------------------------------------------------------

def parse_args(argv=None):
    p = common.parser(__doc__, "server", lock=True)
    p.add_argument("--hidden", type=int_list, default=[10000, 100000],
                   help="2-H-2 models, comma list (default 10000,100000)")
    p.add_argument("--workers", type=int_list, default=[1, 8], help="workers the pushes rotate over (default 1,8)")
    micro.add_options(p, 15, "workers 1 only, 5 repeats")
    p.add_argument("--optimizers", type=common.choice_list(OPTIMIZERS), default=",".join(OPTIMIZERS),
                   help=f"comma list of {', '.join(OPTIMIZERS)} (default all)")
    a = p.parse_args(argv)
    if a.quick:
        a.workers, a.repeat, a.min_time = [1], 5, 0.03
    return a


def footprint(name, path, W):
    """The arrays of n values a path's buffers hold (see COLUMNS)."""
    state = UPDATES[name][1]
    return (W + 1) + state + W if path == "asgd" else 1 + state + 2 * W


def same_update(name, n, dtype=np.float64) -> float:
    """The check: one push from the same w and d, asgd's next version against before's w."""
    rng = np.random.default_rng(2)
    w, d, out = rng.normal(size=n).astype(dtype), rng.normal(scale=1e-3, size=n).astype(dtype), np.empty(n, dtype)
    Optimizer(name, 1e-3, n, dtype=dtype).update(w, d, out)
    before_update(name, n, w=w)(d, np.empty(n, dtype))   # moves w in place
    return common.rel_diff(out, w)


def stream_values(n: int, dtype) -> int:
    """The float64 values of common.stream_kernels' arrays that hold n values of `dtype`:
    the bound is measured over the same bytes."""
    return -(-n * np.dtype(dtype).itemsize // 8)


def bench_updates(n, W, optimizers, precisions, repeat, min_time, lock=None):
    """Each optimizer's per-push work on both paths in each precision, and the bound at each
    one's footprint, common.micro's shape: keys "{path} {optimizer} {precision}"."""
    rng = np.random.default_rng(1)
    fns, checks = {}, {}
    for prec in precisions:
        dt = np.dtype(prec)
        push, pull = header_slots(PUSH_HEADER, dt.itemsize), header_slots(PULL_HEADER, dt.itemsize)
        recv = [rng.normal(scale=1e-9, size=n + push).astype(dt) for _ in range(W)]   # as the server's receive buffers
        for name in optimizers:
            opt = Optimizer(name, 1e-3, n, dtype=dt)
            versions = [np.empty(n + pull, dt) for _ in range(W + 1)]
            versions[0][:n] = rng.normal(size=n)
            at = [0, 0]   # the push's worker, the current version

            def asgd(opt=opt, versions=versions, at=at, recv=recv):
                j = at[0] = (at[0] + 1) % W
                nxt = (at[1] + 1) % len(versions)
                opt.update(versions[at[1]][:n], recv[j][:n], versions[nxt][:n])
                at[1] = nxt
            old = before_update(name, n, dtype=dt)
            replies = [np.empty(n + pull, dt) for _ in range(W)]
            turn = [0]

            def before(old=old, replies=replies, turn=turn, recv=recv):
                j = turn[0] = (turn[0] + 1) % W
                old(recv[j][:n], replies[j])
            fns[f"asgd {name} {prec}"], fns[f"before {name} {prec}"] = asgd, before
            for path in PATHS:   # the bound: copy/add/triad rotating over the path's footprint
                sets = max(1, -(-footprint(name, path, W) // 3))
                fns.update({f"stream {k} @{path} {name} {prec}": f
                            for k, f in common.stream_kernels(stream_values(n, dt), sets).items()})
            checks[f"asgd {name} {prec}"] = same_update(name, n, dt)
    return common.micro(fns, repeat, min_time, checks=checks, warmup=2, lock=lock)


def plot(rows, path):
    plt = common.pyplot()
    groups = list(dict.fromkeys((r["model"], r["workers"], r["precision"]) for r in rows))
    names = list(dict.fromkeys(r["optimizer"] for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups) + 1, 4.5), squeeze=False)
    for ax, g in zip(axes[0], groups):
        by = {(r["optimizer"], r["path"]): r for r in rows if (r["model"], r["workers"], r["precision"]) == g}
        at = common.bars(ax, names, PATHS, lambda o, p: by[o, p]["us_per_op"], {"asgd": "tab:blue", "before": "0.6"},
                         lambda o, p, y: f"{by[o, p]['pct_of_floor']:.0f}%", fontsize=7)
        ax.scatter(at["asgd"], [by[o, "asgd"]["floor_us"] for o in names], marker="_", s=300, color="k", zorder=3,
                   label="floor (its bytes at the bound of its footprint)")
        ax.set_ylabel("µs per push (median)")
        ax.set_title(f"{g[0]}, {g[1]} worker{'s' * (g[1] > 1)}, {g[2]}", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle("The server's per-push work per optimizer, before and now (% over a bar: of the floor), "
                 "one core, measured here", fontsize=10)
    common.save_figure(fig, path)


def row(res, name, path, prec, hid, n, W, bound_mem) -> dict:
    """One (optimizer, path, precision)'s figures against the floor at its footprint."""
    r, size, units = res[f"{path} {name} {prec}"], np.dtype(prec).itemsize, UPDATES[name][0]
    m = stream_values(n, prec)   # the bound's arrays: the same bytes, in float64 values
    bounds = {f"stream {k}": nbytes * m / res[f"stream {k} @{path} {name} {prec}"]["median_s"] / 1e9
              for k, nbytes in common.STREAM_BYTES.items()}
    bound = max(bounds.values())
    floor_s = units * size * n / bound / 1e9
    gbs = units * size * n / r["median_s"] / 1e9
    return {"model": f"2-{hid}-2", "n_w": n, "workers": W, "precision": prec, "optimizer": name, "path": path,
            "units": units, "bytes_per_op": units * size * n,
            "bytes_moved": (units + (3 if path == "before" else 0)) * size * n,
            "footprint_bytes": footprint(name, path, W) * size * n,
            "us_per_op": round(1e6 * r["median_s"], 2), "ops_per_s": round(1 / r["median_s"], 1),
            "us_per_op_min": round(1e6 * r["min_s"], 2),
            "gb_per_s": round(gbs, 3),
            "gb_per_s_cpu": round(units * size * n / r["cpu_median_s"] / 1e9, 3),
            "bound_gb_per_s": round(bound, 3), "bound_kernel": max(bounds, key=bounds.get),
            "floor_us": round(1e6 * floor_s, 2),
            "pct_of_floor": round(100 * floor_s / r["median_s"], 1),
            "pct_of_memory_bound": round(100 * gbs / bound_mem, 1),
            "max_rel_diff_vs_before": r["max_rel_diff"]}


def main(argv=None):
    args = parse_args(argv)
    run = common.Run("server", args)
    bound_mem = max(run.machine["memory_bandwidth_gbs"][k] for k in ("copy", "add", "triad"))
    rows = []
    for hid in args.hidden:
        n = Layout(2, hid, 2).n_w
        for W in args.workers:
            res = bench_updates(n, W, args.optimizers, args.precisions, args.repeat, args.min_time, args.cpu_lock)
            for prec in args.precisions:
                group = []
                for name in args.optimizers:
                    now, before = (row(res, name, path, prec, hid, n, W, bound_mem) for path in PATHS)
                    now["speedup_vs_before"] = round(before["us_per_op"] / now["us_per_op"], 2)
                    group += [now, before]
                sgd = {r["path"]: r["us_per_op"] for r in group if r["optimizer"] == "sgd"}
                for r in group:
                    r["vs_sgd"] = round(r["us_per_op"] / sgd[r["path"]], 2) if sgd else None
                rows += group
    ratios = common.precision_ratios([r for r in rows if r["path"] == "asgd"], ("model", "workers", "optimizer"),
                                     {"float32_over_float64": "us_per_op"})
    info = run.meta(memory_bound_gb_per_s=bound_mem, float32_over_float64=ratios, columns=COLUMNS)
    common.report(run, rows, info, plot, rows, [
        ("model", "model", ""), ("workers", "workers", "d"), ("precision", "precision", ""),
        ("optimizer", "optimizer", ""), ("path", "path", ""), ("floor bytes/(itemsize n)", "units", "d"),
        ("µs/push", "us_per_op", ",.1f"), ("updates/s", "ops_per_s", ",.0f"), ("GB/s", "gb_per_s", ".1f"),
        ("bound GB/s", "bound_gb_per_s", ".1f"), ("floor µs", "floor_us", ",.1f"),
        ("% of floor", "pct_of_floor", ".0f"), ("x before", "speedup_vs_before", ".2f"), ("x sgd", "vs_sgd", ".2f")],
        ["how far from the floor (asgd): " + "; ".join(
            f"{r['model']} W={r['workers']} {r['precision']} {r['optimizer']} {r['pct_of_floor']:.0f}%"
            for r in rows if r["path"] == "asgd"),
         *micro.ratio_line("µs per push (asgd)", ratios, lambda r: f"{r['model']} W={r['workers']} {r['optimizer']}")],
        title="the server's per-push work, one core (floor: the update's bytes at the bound of its footprint)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
