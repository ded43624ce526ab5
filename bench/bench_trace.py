"""Cost of --trace: the same run with tracing off and on, interleaved, medians.

    python bench/bench_trace.py [--ranks 16] [--repeat 5] [--out bench/results/trace]

Writes trace.csv and trace.json and prints median wall and training time per mode."""

import sys

import common  # first: one core per process, src on the path
from runs_report import median

TIMES = ("wall_s", "train_s")


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
    run(a.ranks, False, a.train_args)  # warm numba's cache
    rows = [run(a.ranks, trace, a.train_args) for i in range(a.repeat) for trace in common.rotated([False, True], i)]
    med = {m: {k: median([r for r in rows if r["trace"] == m], k) for k in TIMES} for m in (False, True)}
    over = {k: 100 * (med[True][k] / med[False][k] - 1) for k in TIMES}
    common.write_csv(out / "trace.csv", rows)
    common.write_json(out / "trace.json", {"ranks": a.ranks, "repeat": a.repeat,
                                           "median": {str(k): v for k, v in med.items()},
                                           "overhead_pct": over, "runs": rows})
    common.print_table([*({"tracing": "on" if m else "off", **med[m]} for m in (False, True)),
                        {"tracing": "overhead %", **over}],
                       [("tracing", "tracing", ""), ("median wall s", "wall_s", ".2f"),
                        ("median train s", "train_s", ".2f")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
