"""Arithmetic the benches that repeat whole runs share (bench_chaos, _data, _defaults, _e2e,
_overlap, _startup, _trace): medians over runs, grouping by configuration, None-safe
rounding, differences and ratios."""

from __future__ import annotations

import statistics


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


def rounded(x, ndigits: int):
    return None if x is None else round(x, ndigits)


def difference(a, b, ndigits: int = 4) -> float | None:
    """a - b, rounded; None where either is missing."""
    return None if a is None or b is None else round(a - b, ndigits)


def ratio(a, b, ndigits: int = 3) -> float | None:
    """a / b, rounded; None where either is missing or zero."""
    return round(a / b, ndigits) if a and b else None
