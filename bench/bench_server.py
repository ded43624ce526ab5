"""Server aggregation throughput: updates/s and GB/s of the parameter server's per-push work
against a STREAM-like bandwidth bound measured in the same run.

Per push the server reads Delta-w, reads and writes w, and writes w into that worker's
reply buffer. Measured, repetitions interleaved, medians (one core, float64):
  add+copy     asgd.net.kernels.add_into(w, dw); reply[:n] = w           5 x 8n bytes
  server path  + asgd.net.kernels.all_finite(dw) first, as Server does     6 x 8n bytes
  fused        the check, then w += dw and reply = w in one numba pass  5 x 8n bytes
               (this bench only: what fusing add and copy in src/asgd would give)
  versioned    reply = w + dw in one pass, and the reply buffer becomes  3 x 8n bytes
               the server's w (this bench only: a pool of W+1 versions of w,
               none written while in flight, would remove the copy altogether)
With --workers W > 1, each push comes from the next of W workers (its own Delta-w and
reply buffers), as on a server with W workers. The bound: numpy copy (16n), add (24n)
and triad (two numpy passes, 40n) on arrays of the same n, rotating over W sets like the
server's buffers (the same footprint, so the same cache level), and on 128 MiB arrays
(memory); GB/s counts the bytes each kernel moves (no write-allocate).

The optimizers a server runs (--optimizer; asgd.net.optimizers.Optimizer.step, the call
the server makes, on a shard of n_w doubles, d from the next of W workers' buffers), each
one streaming pass, in the same run:
  sgd       w += d                                   reads w, d; writes w          3 x 8n bytes
  momentum  v = mu v + lr d; w += v                  reads w, v, d; writes w, v    5 x 8n
  adagrad   G += d^2; w += lr d / (sqrt(G) + eps)    reads w, G, d; writes w, G    5 x 8n
  adam      m, v moving averages; w += lr m^/(sqrt(v^)+eps)  reads w, m, v, d;
                                                     writes w, m, v                7 x 8n
Each against the best of numpy copy/add/triad at its own footprint (w, its state and the
W workers' d buffers: numpy's arrays of n doubles rotating over enough sets of three to
hold as many bytes, so the same cache level).
Writes server.csv, server.json, server.png under --out.

    python bench/bench_server.py                        # 2-10K-2 and 2-100K-2 Delta-w sizes
    python bench/bench_server.py --hidden 10000 --workers 1,8 --quick
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402,I001
from common import int_list, interleaved  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from asgd.net import OPTIMIZERS, kernels  # noqa: E402
from asgd.net.optimizers import Optimizer  # noqa: E402
from asgd.wire import PULL_HEADER, PUSH_HEADER  # noqa: E402
from asgd.net.mlp import Layout  # noqa: E402


@njit(fastmath={"reassoc"}, boundscheck=False, cache=True)   # reassoc: the finiteness sum vectorizes
def fused_apply(w, dw, out):
    """What the server does in two passes instead of three: check dw (as kernels.all_finite),
    then w += dw and out = w in one pass. False (w untouched) if dw has NaN or inf."""
    s = 0.0
    for i in range(w.size):
        s += dw[i] * 0.0
    if s != 0.0:
        return False
    for i in range(w.size):
        v = w[i] + dw[i]
        w[i] = v
        out[i] = v
    return True


@njit(boundscheck=False, cache=True)
def add_to(w, dw, out):
    """out = w + dw in one pass (out then becomes the server's w: no separate copy)."""
    for i in range(w.size):
        out[i] = w[i] + dw[i]


VARIANTS = {"add+copy": 5, "server path": 6, "fused": 5, "versioned": 3}   # bytes moved, in units of 8n
UPDATES = {"sgd": (3, 0), "momentum": (5, 1), "adagrad": (5, 1), "adam": (7, 2)}   # (bytes in 8n, state arrays)
STREAM_BYTES = {"stream copy": 2, "stream add": 3, "stream triad": 5}
COLUMNS = {"kind": "server: the per-push work and its variants; update: an optimizer's "
                   "Optimizer.step; bound: numpy's STREAM-like kernels",
           "bytes_per_op": "bytes the kernel moves per push (reads + writes, no write-allocate)",
           "footprint_bytes": "update: w, the optimizer's state and the W workers' d buffers",
           "gb_per_s": "bytes_per_op / median time", "ops_per_s": "updates/s (server) or kernel calls/s",
           "bound_same_size_gb_per_s": "best of numpy copy/add/triad on arrays of n_w doubles, "
                                       "rotating over W sets (the server's footprint); update rows: "
                                       "over enough sets to hold footprint_bytes",
           "pct_of_memory_bound": "vs the best of copy/add/triad on machine.memory_bandwidth_gbs.array_mib arrays"}


def parse_args(argv=None):
    p = common.parser(__doc__, "server")
    p.add_argument("--hidden", type=int_list, default=[10000, 100000], help="2-H-2 models, comma list (default 10000,100000)")
    p.add_argument("--workers", type=int_list, default=[1, 8], help="workers the pushes rotate over (default 1,8)")
    p.add_argument("--repeat", type=int, default=15, help="interleaved repetitions (default 15)")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per repetition (default 0.05)")
    p.add_argument("--quick", action="store_true", help="workers 1 only, 5 repeats")
    p.add_argument("--optimizers", type=common.word_list, default=",".join(OPTIMIZERS),
                   help=f"the optimizers' updates to measure, comma list of {', '.join(OPTIMIZERS)} (default all; "
                        "'none' for none)")
    a = p.parse_args(argv)
    a.optimizers = [o for o in a.optimizers if o != "none"]
    if set(a.optimizers) - set(OPTIMIZERS):
        p.error(f"unknown --optimizers {sorted(set(a.optimizers) - set(OPTIMIZERS))}")
    if a.quick:
        a.workers, a.repeat, a.min_time = [1], 5, 0.03
    return a


def bench_size(n, workers, repeat, min_time):
    rng = np.random.default_rng(0)
    w = rng.normal(size=n)
    recv = [rng.normal(scale=1e-9, size=n + PUSH_HEADER) for _ in range(workers)]   # as Server's buffers
    send = [np.empty(n + PULL_HEADER) for _ in range(workers)]
    nxt = [0]

    def pick():
        j = nxt[0] = (nxt[0] + 1) % workers
        return recv[j][:n], send[j]

    def add_copy():
        dw, out = pick()
        kernels.add_into(w, dw)
        out[:n] = w

    def server_path():
        dw, out = pick()
        if kernels.all_finite(dw):
            kernels.add_into(w, dw)
        out[:n] = w

    def fused():
        dw, out = pick()
        fused_apply(w, dw, out)

    vers = [w.copy()] + [np.empty(n) for _ in range(workers)]   # W+1 versions: the current one and W replies
    cur = [0]

    def versioned():
        dw, _ = pick()
        nxt = (cur[0] + 1) % len(vers)
        add_to(vers[cur[0]], dw, vers[nxt])
        cur[0] = nxt

    fns = {"add+copy": add_copy, "server path": server_path, "fused": fused, "versioned": versioned,
           **stream_fns(n, 3 * workers)}   # the same footprint as the workers' buffers
    return interleaved(fns, repeat, min_time, warmup=2)


def stream_fns(n, arrays):
    """numpy copy/add/triad on arrays of n doubles, rotating over enough sets of three to
    hold `arrays` arrays of n (the footprint of the kernel they bound)."""
    sets = [[np.full(n, v) for v in (1.0, 2.0, 0.5)] for _ in range(max(1, -(-arrays // 3)))]
    nxt = [0]

    def abc():
        j = nxt[0] = (nxt[0] + 1) % len(sets)
        return sets[j]

    def copy():
        a, b, _ = abc()
        np.copyto(b, a)

    def add():
        a, b, c = abc()
        np.add(a, b, out=c)

    def triad():
        a, b, c = abc()
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)
    return {"stream copy": copy, "stream add": add, "stream triad": triad}


def bench_updates(n, workers, optimizers, repeat, min_time):
    """Optimizer.step (what the server calls per push) for each optimizer, and the STREAM-like
    bound at each one's footprint (w, its state, W workers' d), interleaved."""
    rng = np.random.default_rng(1)
    fns = {}
    for name in optimizers:
        w = rng.normal(size=n)
        ds = [rng.normal(scale=1e-9, size=n) for _ in range(workers)]
        opt = Optimizer(name, 1e-3, n)
        nxt = [0]

        def update(opt=opt, w=w, ds=ds, nxt=nxt):
            j = nxt[0] = (nxt[0] + 1) % len(ds)
            opt.step(w, ds[j])
        fns[name] = update
        footprint = 1 + UPDATES[name][1] + workers
        fns.update({f"{k} @{name}": f for k, f in stream_fns(n, footprint).items()})
    return interleaved(fns, repeat, min_time, warmup=2)


def plot(rows, bound_mem, path):
    plt = common.pyplot()
    upd = [r for r in rows if r["kind"] == "update"]
    fig, axes = plt.subplots(1, 2 if upd else 1, figsize=(15 if upd else 8, 5), squeeze=False)
    ax = axes[0][0]
    groups = [(r["model"], r["workers"]) for r in rows if r["kind"] == "server" and r["variant"] == "add+copy"]
    x = np.arange(len(groups))
    names = list(VARIANTS) + ["stream copy", "stream add", "stream triad"]
    colors = ["tab:blue", "tab:cyan", "tab:green", "tab:olive", "0.75", "0.6", "0.45"]
    width = 0.8 / len(names)
    for i, (name, color) in enumerate(zip(names, colors)):
        ys = [next(r["gb_per_s"] for r in rows if (r["model"], r["workers"]) == g and r["variant"] == name) for g in groups]
        bars = ax.bar(x - 0.4 + width * (i + 0.5), ys, width, color=color, label=name)
        if name in VARIANTS:   # % of the bound at the same size
            for b, g in zip(bars, groups):
                r = next(r for r in rows if (r["model"], r["workers"]) == g and r["variant"] == name)
                ax.annotate(f"{r['pct_of_bound_same_size']:.0f}%", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=6)
    ax.axhline(bound_mem, color="k", ls="--", lw=1, label=f"memory bound ({common.STREAM_MIB} MiB arrays) {bound_mem:.1f} GB/s")
    ax.set_xticks(x, [f"{m}\n{w} worker{'s' * (w > 1)}" for m, w in groups])
    ax.set_ylabel("GB/s (bytes the kernel moves)")
    ax.set_title("Server per-push work vs STREAM-like bound at the same size, one core\n"
                 "(% over a bar: of the best copy/add/triad at the same footprint)", fontsize=10)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    if upd:
        ax = axes[0][1]
        groups = list(dict.fromkeys((r["model"], r["workers"]) for r in upd))
        names = list(dict.fromkeys(r["variant"] for r in upd))
        x = np.arange(len(groups))
        width = 0.8 / (2 * len(names))
        for i, name in enumerate(names):
            got = [next(r for r in upd if (r["model"], r["workers"]) == g and r["variant"] == name) for g in groups]
            bars = ax.bar(x - 0.4 + width * (2 * i + 0.5), [r["gb_per_s"] for r in got], width,
                          color=f"C{i}", label=f"{name} ({UPDATES[name][0]} x 8n bytes)")
            ax.bar(x - 0.4 + width * (2 * i + 1.5), [r["bound_same_size_gb_per_s"] for r in got], width,
                   color=f"C{i}", alpha=0.35, label=f"bound at {name}'s footprint")
            for b, r in zip(bars, got):
                ax.annotate(f"{r['pct_of_bound_same_size']:.0f}%", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=6)
        ax.set_xticks(x, [f"{m}\n{w} worker{'s' * (w > 1)}" for m, w in groups])
        ax.set_ylabel("GB/s (bytes the update moves)")
        ax.set_title("The server's optimizer updates (Optimizer.step) vs the STREAM-like bound\n"
                     "at each one's footprint (light bars), one core, measured here", fontsize=10)
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    common.save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    run = common.Run("server", args)
    bound_mem = max(run.machine["memory_bandwidth_gbs"][k] for k in ("copy", "add", "triad"))
    stream_bytes = STREAM_BYTES
    rows, table, utable = [], [], []
    for hid in args.hidden:
        n = Layout(2, hid, 2).n_w
        for W in args.workers:
            res = bench_size(n, W, args.repeat, args.min_time)
            for name, r in res.items():
                units = VARIANTS.get(name) or stream_bytes[name]
                rows.append({"model": f"2-{hid}-2", "n_w": n, "workers": W,
                             "kind": "server" if name in VARIANTS else "bound", "variant": name,
                             "bytes_per_op": units * 8 * n, "us_per_op": round(1e6 * r["median_s"], 3),
                             "ops_per_s": round(1 / r["median_s"], 1),
                             "gb_per_s": round(units * 8 * n / r["median_s"] / 1e9, 3),
                             "gb_per_s_cpu": round(units * 8 * n / r["cpu_median_s"] / 1e9, 3),
                             "gb_per_s_best": round(units * 8 * n / r["min_s"] / 1e9, 3)})
            got = {r["variant"]: r for r in rows if r["n_w"] == n and r["workers"] == W}
            bound = max(got[k]["gb_per_s"] for k in stream_bytes)
            for r in got.values():
                r["bound_same_size_gb_per_s"] = bound
                r["pct_of_bound_same_size"] = round(100 * r["gb_per_s"] / bound, 1)
                r["pct_of_memory_bound"] = round(100 * r["gb_per_s"] / bound_mem, 1)
            for v in VARIANTS:
                table.append({"model": f"2-{hid}-2", "W": W, "variant": v, "kb": 8 * n / 1e3,
                              "upd": got[v]["ops_per_s"], "gbs": got[v]["gb_per_s"], "bound": bound,
                              "pct": got[v]["pct_of_bound_same_size"], "mem": bound_mem,
                              "pct_mem": got[v]["pct_of_memory_bound"]})
            print(f"  2-{hid}-2 W={W}: add+copy {got['add+copy']['gb_per_s']:.1f} GB/s, bound at this size "
                  f"{bound:.1f} GB/s", flush=True)
            if not args.optimizers:
                continue
            res = bench_updates(n, W, args.optimizers, args.repeat, args.min_time)
            for name in args.optimizers:
                units, state = UPDATES[name]
                r = res[name]
                bounds = {k: STREAM_BYTES[k] * 8 * n / res[f"{k} @{name}"]["median_s"] / 1e9 for k in STREAM_BYTES}
                bound_u = max(bounds.values())
                row = {"model": f"2-{hid}-2", "n_w": n, "workers": W, "kind": "update", "variant": name,
                       "bytes_per_op": units * 8 * n, "footprint_bytes": (1 + state + W) * 8 * n,
                       "us_per_op": round(1e6 * r["median_s"], 3), "ops_per_s": round(1 / r["median_s"], 1),
                       "gb_per_s": round(units * 8 * n / r["median_s"] / 1e9, 3),
                       "gb_per_s_cpu": round(units * 8 * n / r["cpu_median_s"] / 1e9, 3),
                       "gb_per_s_best": round(units * 8 * n / r["min_s"] / 1e9, 3),
                       "bound_same_size_gb_per_s": round(bound_u, 3),
                       "bound_kernel": max(bounds, key=bounds.get),
                       "pct_of_bound_same_size": round(100 * units * 8 * n / r["median_s"] / 1e9 / bound_u, 1),
                       "pct_of_memory_bound": round(100 * units * 8 * n / r["median_s"] / 1e9 / bound_mem, 1)}
                rows.append(row)
                utable.append({"model": row["model"], "W": W, "variant": name, "units": units,
                               "mb": row["footprint_bytes"] / 1e6, "upd": row["ops_per_s"], "gbs": row["gb_per_s"],
                               "bound": row["bound_same_size_gb_per_s"], "pct": row["pct_of_bound_same_size"],
                               "pct_mem": row["pct_of_memory_bound"]})
            print(f"  2-{hid}-2 W={W}: " + ", ".join(f"{u['variant']} {u['gbs']:.1f} GB/s ({u['pct']:.0f}%)"
                                                     for u in utable if u["model"] == f"2-{hid}-2" and u["W"] == W),
                  flush=True)
    info = run.meta(memory_bound_gb_per_s=bound_mem, columns=COLUMNS)
    run.write(rows, info)
    run.plot(plot, rows, bound_mem)
    run.print_machine()
    common.print_table(table, [("model", "model", ""), ("workers", "W", "d"), ("variant", "variant", ""),
                               ("Δw KB", "kb", ",.0f"), ("updates/s", "upd", ",.0f"), ("GB/s", "gbs", ".1f"),
                               ("bound same size", "bound", ".1f"), ("%", "pct", ".0f"),
                               ("memory bound", "mem", ".1f"), ("% mem", "pct_mem", ".0f")])
    if utable:
        common.print_table(utable, [("model", "model", ""), ("workers", "W", "d"), ("optimizer", "variant", ""),
                                    ("bytes/8n", "units", "d"), ("footprint MB", "mb", ".1f"),
                                    ("updates/s", "upd", ",.0f"), ("GB/s", "gbs", ".1f"),
                                    ("bound same footprint", "bound", ".1f"), ("%", "pct", ".0f"),
                                    ("% mem", "pct_mem", ".0f")],
                           title="the server's optimizer updates (Optimizer.step), one core")
    run.wrote()
    return 0


if __name__ == "__main__":
    sys.exit(main())
