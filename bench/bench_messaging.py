"""Messaging: a worker's push/pull round trip through asgd's real protocol against a raw MPI
ping-pong of the same size and the floors between them, 2 ranks, in one MPI job (this
script starts it under mpiexec), in float32 and float64 (--precisions); variants x
precisions interleaved, the order rotating, per-exchange medians on the worker. The
variants (pingpong, +aggregate, +versioned, +reply-first, +reply-first+O, asgd O) and the
columns: docs/bench-suite.md, and COLUMNS below. Writes messaging.csv, messaging.json,
messaging.png under --out.

    python bench/bench_messaging.py                      # 2-10K-2 and 2-100K-2 sizes
    python bench/bench_messaging.py --hidden 100 --repeat 1 --iters 20     # seconds
"""

import sys

import common
import micro
from common import int_list

import itertools
import json
import time

import numpy as np
from numba import njit

PINGPONGS = ("pingpong", "pingpong+aggregate", "pingpong+versioned", "pingpong+reply-first")
COLUMNS = {"precision": "the dtype of every buffer (MPI.FLOAT or MPI.DOUBLE), w and the optimizer's state",
           "rtt_us": "median over repetitions of each repetition's median exchange (µs)",
           "vs_pingpong": "rtt_us / the raw ping-pong's, same size and precision, same run",
           "vs_reply_first": "rtt_us / pingpong+reply-first's (asgd's async server's floor), same size and precision",
           "vs_own_floor": "asgd O: rtt_us / pingpong+reply-first+O's (the floor moving O's bytes; sgd's: "
                           "reply-first's), same size and precision",
           "gb_per_s_both_ways": "2 itemsize n_w bytes / rtt",
           "server_aggregate_us": "asgd only: the server's busy time per push (take, the one-pass check and "
                                  "update, Isend)"}


STATE_ARRAYS = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2}   # net.optimizers' state, arrays of n_w


@njit(boundscheck=False, cache=True)
def add_to(w, dw, out):
    """out = w + dw in one pass (the ping-pong variants' server work without a copy)."""
    for i in range(w.size):
        out[i] = w[i] + dw[i]


@njit(boundscheck=False, cache=True)
def add_to_moving(w, dw, out, s):
    """add_to that also reads and writes a state array: a one-state optimizer's bytes (5 n)."""
    for i in range(w.size):
        s[i] += dw[i]
        out[i] = w[i] + s[i]


@njit(boundscheck=False, cache=True)
def add_to_moving2(w, dw, out, s, t):
    """add_to moving two state arrays: adam's bytes (7 n)."""
    for i in range(w.size):
        s[i] += dw[i]
        t[i] += dw[i]
        out[i] = w[i] + s[i] + t[i]


def floor_of(optimizer: str) -> str:
    """The ping-pong variant an `asgd optimizer` row is judged against."""
    return "pingpong+reply-first" + (f"+{optimizer}" if STATE_ARRAYS[optimizer] else "")


def parse_args(argv=None):
    p = common.parser(__doc__, "messaging", mpi_child=True)
    p.add_argument("--hidden", type=int_list, default=[10000, 100000],
                   help="2-H-2 models whose n_w sets the message size, comma list (default 10000,100000)")
    micro.add_options(p, 9, "3 repetitions of about 0.05 s", min_time=None)
    p.add_argument("--iters", type=int, default=0,
                   help="exchanges per repetition (default 0: enough for about 0.15 s)")
    p.add_argument("--optimizers", type=common.choice_list(STATE_ARRAYS), default="sgd,adagrad,adam",
                   help="the asgd server's optimizers, one variant each (default sgd,adagrad,adam)")
    p.add_argument("--timeout", type=float, default=300, help="seconds before the MPI job is killed (default 300)")
    a = p.parse_args(argv)
    if a.quick:
        a.repeat = min(a.repeat, 3)
    a.floors = tuple(floor_of(o) for o in a.optimizers if STATE_ARRAYS[o])
    a.variants = PINGPONGS + a.floors + tuple(f"asgd {o}" for o in a.optimizers)
    return a


# -- inside the MPI job ------------------------------------------------------------------

def child(args) -> None:
    from mpi4py import MPI
    from mpi4py.util.dtlib import from_numpy_dtype

    from asgd.net import kernels
    from asgd.net.optimizers import Optimizer
    from asgd.net.mlp import Layout
    from asgd.run.trace import PhaseClock

    comm, waiter, crowded = common.two_ranks("bench_messaging", args.timeout)
    me = comm.rank
    block_s = 0.05 if args.quick else 0.15
    raw = []

    def pingpong(n, iters, variant="pingpong", dtype=np.float64):
        out, back = np.ones(n, dtype), np.empty(n, dtype)
        w, reply = np.zeros(n, dtype), np.empty(n, dtype)
        vers = [np.zeros(n, dtype), np.zeros(n, dtype)]
        state = [np.zeros(n, dtype) for _ in range(STATE_ARRAYS.get(variant.split("+")[-1], 0))]   # +O's arrays
        move = {0: add_to, 1: add_to_moving, 2: add_to_moving2}[len(state)]
        kind = from_numpy_dtype(out.dtype)   # MPI.FLOAT or MPI.DOUBLE
        rtt = np.empty(iters)
        if me == 1:
            for i in range(iters):
                t0 = time.perf_counter()
                MPI.Request.Waitall([comm.Isend([out, kind], 0, 1), comm.Irecv([back, kind], 0, 2)])
                rtt[i] = time.perf_counter() - t0
            return rtt
        recv = comm.Irecv([back, kind], 1, 1)   # always posted before the push arrives, as Server's
        for i in range(iters):
            recv.Wait()
            send = out
            if variant == "pingpong+aggregate":
                kernels.add_into(w, back)
                reply[:] = w
                send = reply
            elif variant == "pingpong+versioned":
                add_to(vers[i % 2], back, vers[(i + 1) % 2])
                send = vers[(i + 1) % 2]
            elif variant.startswith("pingpong+reply-first"):
                send = vers[i % 2]
            req = comm.Isend([send, kind], 1, 2)
            if variant.startswith("pingpong+reply-first"):   # the next version while this one is on its way
                move(vers[i % 2], back, vers[(i + 1) % 2], *state)
            if i + 1 < iters:
                recv = comm.Irecv([back, kind], 1, 1)
            req.Wait()
        return rtt

    def protocol(n_w, iters, optimizer, dtype=np.float64):
        """Returns the worker's per-exchange times (rank 1) or the server's aggregate s/push (rank 0)."""
        stamps, k, clock = np.empty(iters + 1), [0], PhaseClock("init")

        def stub_step(w, X, y, lr, dw, progress=None):   # no compute: the round trip alone
            stamps[k[0]] = time.perf_counter()
            k[0] += 1
            return 0.0
        opt = Optimizer(optimizer, 1e-3, n_w, dtype=dtype) if me == 0 else None
        st = common.exchange(comm, waiter, clock, np.zeros(n_w, dtype), np.zeros((iters, 2), dtype),
                             np.zeros(iters, np.int64), stub_step, 1, 0.0, opt)
        if me == 0:
            return clock.seconds().get("aggregate", 0.0) / max(st.updates, 1)
        stamps[iters] = time.perf_counter()
        return np.diff(stamps[:k[0] + 1])

    widest = max(args.precisions, key=lambda p: np.dtype(p).itemsize)
    for hid in args.hidden:
        n_w = Layout(2, hid, 2).n_w
        for prec in args.precisions:
            for v in PINGPONGS[1:] + args.floors:
                pingpong(n_w, 3, v, prec)                   # warm up (and JIT the kernels)
            for o in args.optimizers:
                protocol(n_w, 5, o, prec)                   # warm up the protocol path
        rtt, iters = pingpong(n_w, 10, dtype=widest), None  # rank 1's times size the repetitions
        if me == 1:
            iters = args.iters or int(min(5000, max(60, block_s / max(float(np.median(rtt)), 1e-7))))
        iters = comm.bcast(iters, root=1)
        cases = [(prec, v) for prec in args.precisions for v in args.variants]
        for rep in range(args.repeat):
            for prec, v in common.rotated(cases, rep):   # no variant or precision always first
                comm.Barrier()
                got = (protocol(n_w, iters, v.split()[1], prec) if v.startswith("asgd ")
                       else pingpong(n_w, iters, v, prec))
                agg = comm.bcast(got if me == 0 and v.startswith("asgd ") else None, root=0)
                if me == 1:
                    raw.append({"hidden": hid, "n_w": n_w, "precision": prec, "variant": v, "rep": rep,
                                "iters": iters,
                                "rtt_median_s": float(np.median(got[1:])), "rtt_min_s": float(np.min(got[1:])),
                                "rtt_mean_s": float(np.mean(got[1:])),
                                "server_aggregate_s_per_push": agg if v.startswith("asgd ") else None})
    if me == 1:
        print(json.dumps({"oversubscribed": crowded, "ranks": comm.size, "rows": raw}), flush=True)


# -- the launcher ------------------------------------------------------------------------

def plot(rows, path):
    """A group of bars per model and precision (its own buffers' bytes), a bar per variant."""
    plt = common.pyplot()
    models = list(dict.fromkeys(f"{r['model']} {r['precision']}" for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    by = {(f"{r['model']} {r['precision']}", r["variant"]): r for r in rows}
    colors = {"pingpong": "0.6", "pingpong+aggregate": "tab:green", "pingpong+versioned": "tab:olive",
              "pingpong+reply-first": "tab:purple", "pingpong+reply-first+momentum": "plum",
              "pingpong+reply-first+adagrad": "thistle", "pingpong+reply-first+adam": "violet",
              "asgd sgd": "tab:blue", "asgd momentum": "tab:pink", "asgd adagrad": "tab:cyan", "asgd adam": "tab:red"}
    fig, ax = plt.subplots(figsize=(4 + 2 * len(models), 4.5))
    at = common.bars(ax, models, variants, lambda m, v: by[m, v]["rtt_us"], colors,
                     lambda m, v, y: f"{y:,.0f}\n{by[m, v]['vs_pingpong']:.2f}x")
    for i, v in enumerate(variants):
        ax.scatter(at[v], [by[m, v]["rtt_us_min"] for m in models], marker="_", s=120, color="k", zorder=3,
                   label="fastest exchange" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xticklabels([f"{m}\n{by[m, variants[0]]['kb']:,.0f} KB each way" for m in models])
    ax.set_ylabel("round trip, µs (bar: median; dash: fastest; log)")
    ax.set_title("Push/pull round trip vs raw MPI ping-pong, 2 ranks", fontsize=10)
    ax.legend(fontsize=8)
    common.save_figure(fig, path)


def main(argv=None):
    args = parse_args(argv)
    if common.as_mpi_child(args, child):
        return 0
    run = common.Run("messaging", args, load_every_s=1.0)
    job = common.mpiexec(2, common.mpi_child_argv(__file__, argv), timeout=args.timeout + 30)
    raw = common.child_result(job["stdout"])
    rows = []
    for hid, prec, v in itertools.product(args.hidden, args.precisions, args.variants):
        rs = [r for r in raw["rows"] if (r["hidden"], r["precision"], r["variant"]) == (hid, prec, v)]
        med = float(np.median([r["rtt_median_s"] for r in rs]))
        agg = [r["server_aggregate_s_per_push"] for r in rs if r["server_aggregate_s_per_push"] is not None]
        size, n_w = np.dtype(prec).itemsize, rs[0]["n_w"]
        rows.append({"model": f"2-{hid}-2", "n_w": n_w, "precision": prec, "kb": size * n_w / 1e3, "variant": v,
                     "rtt_us": round(1e6 * med, 2), "rtt_us_min": round(1e6 * min(r["rtt_min_s"] for r in rs), 2),
                     "exchanges_per_s": round(1 / med, 1), "gb_per_s_both_ways": round(2 * size * n_w / med / 1e9, 3),
                     "server_aggregate_us": round(1e6 * float(np.median(agg)), 2) if agg else None,
                     "repeat": len(rs), "iters": rs[0]["iters"]})
    rtt = {(r["model"], r["precision"], r["variant"]): r["rtt_us"] for r in rows}
    for r in rows:   # against the ping-pong and the floors of the same size and precision (all measured)
        m = (r["model"], r["precision"])
        r["vs_pingpong"] = round(r["rtt_us"] / rtt[(*m, "pingpong")], 3)
        r["vs_reply_first"] = round(r["rtt_us"] / rtt[(*m, "pingpong+reply-first")], 3)
        own = r["variant"].startswith("asgd ") and rtt[(*m, floor_of(r["variant"].split()[1]))]
        r["vs_own_floor"] = round(r["rtt_us"] / own, 3) if own else None
    ratios = common.precision_ratios(rows, ("model", "variant"), {"float32_over_float64": "rtt_us"})
    info = run.meta(ranks=raw["ranks"], oversubscribed=raw["oversubscribed"], mpiexec=job["cmd"],
                    job_wall_s=round(job["wall_s"], 2), float32_over_float64=ratios, columns=COLUMNS,
                    raw=raw["rows"])
    print(f"2 ranks ({'oversubscribed' if raw['oversubscribed'] else 'ranks <= cores'}), {job['cmd'].split()[0]}")
    common.report(run, rows, info, plot, rows, [
        ("model", "model", ""), ("precision", "precision", ""), ("KB each way", "kb", ",.0f"),
        ("variant", "variant", ""), ("round trip µs", "rtt_us", ",.1f"), ("min µs", "rtt_us_min", ",.1f"),
        ("x ping-pong", "vs_pingpong", ".2f"), ("x reply-first", "vs_reply_first", ".2f"),
        ("x own floor", "vs_own_floor", ".2f"),
        ("GB/s both ways", "gb_per_s_both_ways", ".2f"), ("server busy µs/push", "server_aggregate_us", ",.1f")],
        ["how far from the floor (the ping-pong of the same bytes; in brackets, its own: reply-first moving the "
         "optimizer's bytes): " + "; ".join(f"{r['model']} {r['precision']} {r['variant']} {r['vs_pingpong']:.2f}x "
                                           f"({r['vs_own_floor']:.2f}x)" for r in rows if r["vs_own_floor"]),
         *micro.ratio_line("round trip", ratios, lambda r: f"{r['model']} {r['variant']}")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
