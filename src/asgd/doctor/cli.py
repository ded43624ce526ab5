"""python -m asgd.doctor [--ranks N] [--params params.json] [--no-self-test] [--json]

Checks an install before you spend an allocation on it, as horovodrun --check-build does:
the install and the machine (Python, numpy, numba, mpi4py and its MPI library, the mpiexec
asgd would use and whether they match, ULFM, cores and memory, the CPU features the kernels
use, numba's cache), each optional part (Slurm, PBS, SimGrid, netns and tc, the bench
extra) with the command that installs it, and a self-test: a 2-rank job running a
ping-pong, a push/pull and a kernel step, each checked against a reference (--params: its
figures against a calibration too). One line per finding; exit 1 when a part the main job
needs is broken.
"""

from __future__ import annotations

import argparse
import json

from . import BROKEN, MISSING, OK, SKIPPED, Finding, install, parts, selftest

WIDTH = max(len(s) for s in (OK, "warn", MISSING, BROKEN, SKIPPED))
TITLES = {"install": "the install and the machine", "optional": "optional parts",
          "self-test": "self-test (2 ranks under mpiexec)"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asgd.doctor", description=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example: python -m asgd.doctor --ranks 16 --params params.json")
    p.add_argument("--ranks", type=int, metavar="N",
                   help="the ranks you mean to run on this machine: a warning when they outnumber its cores")
    p.add_argument("--params", metavar="PARAMS",
                   help="a params.json (python -m asgd.perf calibrate): the self-test's figures against it, "
                        f"each more than {100 * selftest.OFF:.0f}%% away named")
    p.add_argument("--no-self-test", action="store_true", help="the install and the parts only: no MPI job")
    p.add_argument("--timeout", type=float, default=selftest.TIMEOUT_S, metavar="SECONDS",
                   help="end the self-test's job after this long (default %(default)g)")
    p.add_argument("--json", action="store_true", help="the same findings as JSON (docs: formats, doctor)")
    return p


def read_params(p: argparse.ArgumentParser, path: str | None) -> dict | None:
    if path is None:
        return None
    try:
        with open(path) as f:
            got = json.load(f)
    except (OSError, ValueError) as e:
        p.error(f"--params {path}: {e}")
    if not isinstance(got, dict) or not isinstance(got.get("params"), dict):
        p.error(f"--params {path}: not a params.json (python -m asgd.perf calibrate writes one)")
    return got


def self_test(ready: dict, params: dict | None, timeout: float) -> list[Finding]:
    needs = [what for what, ok in (("mpiexec", ready["launcher"]), ("mpi4py's MPI", ready["mpi"]),
                                   ("numba", ready["numba"])) if not ok]
    if needs:
        return [Finding(selftest.SECTION, "2-rank job", SKIPPED, f"needs {' and '.join(needs)} (above)")]
    return selftest.run(ready["launcher"], params, timeout)


def verdict(findings: list[Finding]) -> str:
    broken = [f.part for f in findings if f.status == BROKEN]
    missing = [f.part for f in findings if f.section == "optional" and f.status == MISSING]
    if broken:
        return f"broken: {', '.join(broken)}: the main job (mpiexec -n N python -m asgd.train) cannot run here"
    tail = f"; optional parts missing: {', '.join(missing)}" if missing else "; every optional part is here"
    return "the main job (mpiexec -n N python -m asgd.train) has all it needs" + tail


def show(findings: list[Finding]) -> None:
    section = None
    for f in findings:
        if f.section != section:
            section = f.section
            print(TITLES[section])
        fix = f"  → {f.fix}" if f.fix else ""
        print(f"  {f.status:<{WIDTH}}  {f.part:<12}  {f.what}{fix}")


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.ranks is not None and a.ranks < 1:
        p.error("--ranks must be >= 1")
    params = read_params(p, a.params)
    findings, ready = install.check(a.ranks)
    findings += parts.check()
    if not a.no_self_test:
        findings += self_test(ready, params, a.timeout)
    code = 1 if any(f.status == BROKEN for f in findings) else 0
    if a.json:
        print(json.dumps({"ok": code == 0, "exit": code, "verdict": verdict(findings),
                          "findings": [vars(f) for f in findings]}, indent=1))
    else:
        show(findings)
        print(f"asgd.doctor: {verdict(findings)}")
    return code
