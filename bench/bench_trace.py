"""Cost of --trace: the same run with tracing off and on, interleaved, medians.

    python bench/bench_trace.py [--ranks 16] [--repeat 5] [--out bench/results/trace]

Writes trace.csv and trace.json and prints median wall and training time per mode."""

import statistics
import sys

import common  # first: one core per process, src on the path


def run(ranks: int, trace: bool, extra: list[str]) -> dict:
    r, _ = common.train_job(ranks, ["-m", "asgd.train", "--quiet", *extra, *(["--trace"] if trace else [])], 300)
    return {"trace": trace, "wall_s": r["wall_s"], "train_s": r["train_s"], "accuracy": r["metrics"]["accuracy"]}


def main(argv=None) -> int:
    p = common.parser(__doc__, "trace", plot=False)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("train_args", nargs="*", help="extra asgd.train options (after --)")
    a = p.parse_args(argv)
    out = common.Run("trace", a, measure=False).out
    rows = []
    run(a.ranks, False, a.train_args)  # warm numba's cache
    for i in range(a.repeat):
        for trace in common.rotated([False, True], i):
            rows.append(run(a.ranks, trace, a.train_args))
            print(f"  {i + 1}/{a.repeat} trace={'on ' if trace else 'off'} wall {rows[-1]['wall_s']:.2f} s "
                  f"train {rows[-1]['train_s']:.2f} s", flush=True)
    med = {m: {k: statistics.median(r[k] for r in rows if r["trace"] == m) for k in ("wall_s", "train_s")}
           for m in (False, True)}
    over = {k: 100 * (med[True][k] / med[False][k] - 1) for k in ("wall_s", "train_s")}
    common.write_csv(out / "trace.csv", rows)
    common.write_json(out / "trace.json", {"ranks": a.ranks, "repeat": a.repeat,
                                           "median": {str(k): v for k, v in med.items()},
                                           "overhead_pct": over, "runs": rows})
    print(f"{'tracing':8} {'median wall s':>14} {'median train s':>15}")
    for m in (False, True):
        print(f"{'on' if m else 'off':8} {med[m]['wall_s']:>14.2f} {med[m]['train_s']:>15.2f}")
    print(f"overhead {over['wall_s']:>+13.1f}% {over['train_s']:>+14.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
