"""The self-test: a 2-rank job (asgd.doctor.ranks) started as asgd starts jobs
(mpienv.command), time-bounded, its process group ended if it outlives the limit; one
finding per check, the figures compared with a calibration (params.json) when given, and
the job's time against its budget."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

from .. import mpienv
from . import BROKEN, OK, WARN, Finding

SECTION = "self-test"
BUDGET_S = 20.0     # what the self-test should take on a machine ready for a run
TIMEOUT_S = 120.0   # past this the job is ended: a cold cache compiles within it, a hang does not
OFF = 0.2           # a figure this far from the calibration's (either way) is named
# what the job (asgd.doctor.ranks) measures, here so that this process need not import it
PINGPONG_BYTES = (8, 1 << 20)
N_W = 5 * 10000 + 2          # 2-10K-2's weights: a size calibrate measures
TIMED_HIDDEN, TIMED_BATCH = 10000, 256   # --params: the step calibrate measures (step_s)
RECALIBRATE = "recalibrate on this machine: python -m asgd.perf calibrate --out params.json"


def finding(part: str, status: str, what: str, fix: str = "", **data) -> Finding:
    return Finding(SECTION, part, status, what, fix, data)


def launch(launcher: str, timed: bool, timeout: float) -> tuple[dict | None, str, float]:
    """(rank 0's JSON line or None, why not, seconds the job took)."""
    cmd = mpienv.command(2, sys.executable, "-m", "asgd.doctor.ranks", *(["--timed"] if timed else []),
                         launcher=launcher)
    t = time.perf_counter()
    try:
        p = mpienv.run_bounded(cmd, timeout)
    except subprocess.TimeoutExpired:
        return None, f"{shlex.join(cmd)} did not finish within {timeout:g} s", time.perf_counter() - t
    seconds = time.perf_counter() - t
    out, err = p.stdout, p.stderr
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        said = [ln for ln in err.splitlines() if ln.strip()]
        return None, f"the 2-rank job failed (exit {p.returncode}): {said[-1] if said else 'no message'}", seconds
    return json.loads(lines[-1]), "", seconds


def size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} B"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def checks(got: dict) -> list[Finding]:
    pp, push, step = got["pingpong"], got["pushpull"], got["step"]
    one_way = ", ".join(f"{size(int(b))} {us(s)}" for b, s in pp["seconds"].items())
    out = [finding("ping-pong", OK if pp["ok"] else BROKEN,
                   f"{' and '.join(map(size, PINGPONG_BYTES))} came back {'intact' if pp['ok'] else 'CHANGED'}; "
                   f"one way {one_way}", "" if pp["ok"] else "the MPI library corrupts messages: reinstall it",
                   ok=pp["ok"], pingpong_s=pp["seconds"])]
    applied = ("applied by the server's adagrad as numpy computes it, and pulled back" if push["ok"] else
               "NOT applied as numpy's adagrad computes it")
    out.append(finding("push/pull", OK if push["ok"] else BROKEN,
                       f"{push['updates']} pushes of {push['n_w']:,} weights {applied}; "
                       f"round trip {us(push['round_trip_s'])}{'' if push['timed'] else ' (float32)'}",
                       "" if push["ok"] else "asgd's server/worker exchange is broken: run tests/test_mpi_suite.py",
                       ok=push["ok"], round_trip_s=push["round_trip_s"], n_w=push["n_w"]))
    shape = f"2-{step['hidden']}-2 float32 step at batch {step['batch']}"
    out.append(finding("kernel step", OK if step["ok"] else BROKEN,
                       f"{shape} on each rank " + (f"matches the numpy float64 reference ({step['error_of_bound']:.2g}"
                                                   " of its rounding bound)" if step["ok"] else
                                                   "does NOT match the numpy reference"),
                       "" if step["ok"] else "the kernels miscompute here: python -m pytest tests/test_kernels.py",
                       ok=step["ok"], error_of_bound=step["error_of_bound"], timed_s=step.get("timed_s")))
    return out


def against(got: dict, params: dict) -> list[Finding]:
    """Each figure the job measured beside its calibration; one line per figure more than
    OFF away, or one line saying all are within it."""
    p = params.get("params", params)
    # the timed figures are float64's: schema 2 keeps those tables per precision, schema 1 flat
    p = {**p, **p.get("precisions", {}).get("float64", {})}
    pairs = [(f"ping-pong {size(int(b))} one way", s, lookup(p, "pingpong_s", b))
             for b, s in got["pingpong"]["seconds"].items()]
    pairs.append((f"push/pull round trip at {N_W:,} weights", got["pushpull"]["round_trip_s"],
                   lookup(p, "round_trip_s", N_W)))
    pairs.append((f"2-{TIMED_HIDDEN // 1000}K-2 float64 step at batch {TIMED_BATCH}", got["step"].get("timed_s"),
                  lookup(p, "step_s", TIMED_HIDDEN, TIMED_BATCH)))
    figures = {name: {"measured_s": m, "calibrated_s": c} for name, m, c in pairs}
    compared = [(name, m, c) for name, m, c in pairs if m is not None and c]
    off = [(name, m, c) for name, m, c in compared if abs(m / c - 1) > OFF]
    if not compared:
        return [finding("calibration", WARN, "params.json has none of the figures the self-test measures",
                        RECALIBRATE, figures=figures)]
    if not off:
        return [finding("calibration", OK, f"{len(compared)} figures within {OFF:.0%} of params.json",
                        figures=figures)]
    return [finding("calibration", WARN, f"{name}: {us(m)}, {m / c:.2f}x params.json's {us(c)}", RECALIBRATE,
                    figure=name, measured_s=m, calibrated_s=c) for name, m, c in off]


def lookup(params: dict, key: str, *index) -> float | None:
    """params[key][i][j]..., whose keys JSON made strings."""
    got = params.get(key)
    for i in index:
        if not isinstance(got, dict):
            return None
        got = got.get(str(i), got.get(i))
    return got if isinstance(got, (int, float)) else None


def run(launcher: str, params: dict | None = None, timeout: float = TIMEOUT_S) -> list[Finding]:
    got, why, seconds = launch(launcher, params is not None, timeout)
    if got is None:
        return [finding("2-rank job", BROKEN, why, "see the message; Troubleshooting: a job that seems stuck",
                        seconds=round(seconds, 2))]
    out = checks(got) + (against(got, params) if params is not None else [])
    seconds = round(seconds, 2)   # the line says what the data says (0.649 would print 0.6 beside 0.65's 0.7)
    late = seconds > BUDGET_S
    out.append(finding("time", WARN if late else OK,
                       f"the self-test took {seconds:.1f} s ({'over' if late else 'within'} its {BUDGET_S:g} s "
                       "budget)", "a cold numba cache or a busy machine: run it again" if late else "",
                       seconds=seconds, budget_s=BUDGET_S))
    return out
