"""What the benches that repeat whole runs share (bench_e2e, _overlap, _readers, _startup,
_trace, _tta, _data): repetitions in rotating order, medians per configuration, ratios,
the optional emulated cluster."""

from __future__ import annotations

import contextlib
import statistics

import common
import validate


def interleaved(names: list, repeat: int, run_one) -> list[dict]:
    """run_one(name, rep) -> row (None: no row) for every name, `repeat` times, the order
    rotated per repetition so that a change in the load hits every name alike."""
    rows = []
    for rep in range(repeat):
        for name in common.rotated(list(names), rep):
            if (row := run_one(name, rep)) is not None:
                rows.append(row)
    return rows


def median(rows: list[dict], key: str, ndigits: int | None = None):
    """The median of rows' `key` over the rows that have one (None: none has)."""
    xs = [r[key] for r in rows if r.get(key) is not None]
    if not xs:
        return None
    m = statistics.median(xs)
    return m if ndigits is None else round(m, ndigits)


def grouped(rows: list[dict], by: tuple) -> dict[tuple, list[dict]]:
    """rows by their values of the columns `by`, in first-seen order."""
    out = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in by), []).append(r)
    return out


def medians(rows: list[dict], by: tuple, keys: tuple, ndigits: int | None = 3) -> list[dict]:
    """A row per configuration (its columns `by`): the medians of `keys` over its runs."""
    return [{**dict(zip(by, case)), **{k: median(rs, k, ndigits) for k in keys}, "runs": len(rs)}
            for case, rs in grouped(rows, by).items()]


def rounded(x, ndigits: int):
    return None if x is None else round(x, ndigits)


def difference(a, b, ndigits: int = 4) -> float | None:
    """a - b, rounded; None where either is missing."""
    return None if a is None or b is None else round(a - b, ndigits)


def ratio(a, b, ndigits: int = 3) -> float | None:
    """a / b, rounded; None where either is missing or zero."""
    return round(a / b, ndigits) if a and b else None


def testbed_options(p, name: str, rate_help: str) -> None:
    """--testbed RATE and --testbed-name: a bench that can also run on the emulated cluster."""
    p.add_argument("--testbed", metavar="RATE", help=rate_help)
    p.add_argument("--testbed-name", default=name, help=f"the testbed's name (default {name})")


def maybe_testbed(args, hosts: int):
    """The emulated cluster of `hosts` with --testbed's links, up for the with-block; else None."""
    if not args.testbed:
        return contextlib.nullcontext()
    return validate.testbed(args.testbed_name, hosts, args.testbed)
