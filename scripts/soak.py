#!/usr/bin/env python3
"""Soak: many short asgd jobs back to back, each checked for its exit code, its held-out
accuracy and leftover processes. Cases cycle through seeds, rank counts (2-16), readers,
modes and architectures, plus failing cases that must end fast with one clear line.

    python scripts/soak.py [--runs 100] [--timeout 120] [--log soak.csv]

Exit status 0 when every run behaved; the log has one row per run (case, rc, seconds,
accuracy, last stderr line, leftovers)."""

import argparse
import csv
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from asgd import mpienv

GOOD = [  # (ranks, options): expected to exit 0 with accuracy >= 0.95
    (2, []), (4, ["--mode", "ssp", "--staleness", "2"]), (16, []), (5, ["--servers", "2"]),
    (3, ["--mode", "sync"]), (4, ["--arch", "allreduce"]), (8, ["--reader", "sequential"]),
    (6, ["--servers", "3", "--mode", "sync"]), (12, ["--mode", "ssp"]), (9, ["--reader", "parallel"]),
]
BAD = [  # (ranks, options, text the one error line must hold): expected exit 2
    (4, ["--batch", "0"], "--batch must be >= 1"),
    (3, ["--data", "/no/such.tsv"], "data file not found"),
    (2, ["--servers", "2"], "leaves no worker"),
]


def leftovers(out: str) -> list[str]:
    """This run's processes still alive (found by its unique run folder)."""
    p = subprocess.run(["pgrep", "-af", "--", f"--out {out} "], capture_output=True, text=True)
    return [line for line in p.stdout.splitlines() if "pgrep" not in line]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--timeout", type=float, default=120, help="seconds per run (default %(default)s)")
    p.add_argument("--epochs", type=int, default=5, help="per run (default %(default)s, as asgd.train)")
    p.add_argument("--log", default="soak.csv")
    a = p.parse_args(argv)
    cases = itertools.cycle([("good", c) for c in GOOD] + [("bad", c) for c in BAD])
    rows, failures = [], 0
    for i in range(a.runs):
        kind, case = next(cases)
        n, opts = case[0], case[1]
        out = tempfile.mkdtemp(prefix="asgd-soak-")
        cmd = mpienv.command(n, sys.executable, "-m", "asgd.train", *opts, "--seed", str(i),
                             "--epochs", str(a.epochs), "--quiet", "--out", out, "--timeout", str(a.timeout - 10))
        t = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            rc, err = r.returncode, r.stderr.strip().splitlines()
        except subprocess.TimeoutExpired:
            rc, err = "hang", ["no exit within the time limit"]
        secs = time.monotonic() - t
        acc = None
        if os.path.exists(os.path.join(out, "results.json")):
            with open(os.path.join(out, "results.json")) as f:
                acc = json.load(f)["metrics"]["accuracy"]
        shutil.rmtree(out, ignore_errors=True)
        left = leftovers(out)
        if kind == "good":
            ok = rc == 0 and acc is not None and acc >= 0.95
        else:
            ok = rc == 2 and len(err) == 1 and case[2] in err[0] and secs < 10
        ok = ok and not left
        failures += not ok
        rows.append({"run": i + 1, "ranks": n, "options": " ".join(opts), "expect": kind, "rc": rc,
                     "seconds": round(secs, 2), "accuracy": acc, "last_stderr": err[-1] if err else "",
                     "leftovers": len(left), "ok": ok})
        print(f"{i + 1:>4} {'ok ' if ok else 'BAD'} n={n:<2} {' '.join(opts):<34} rc={rc} "
              f"{secs:5.1f}s acc={acc if acc is None else round(acc, 4)} "
              f"{err[-1][:70] if kind == 'bad' and err else ''}",
              flush=True)
    with open(a.log, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{a.runs - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
