"""python -m asgd.doctor: is this install ready to spend an allocation on? As horovodrun
--check-build or torch's collect_env, it reports the install and the machine (install),
each optional part (parts), and a self-test of a 2-rank job (selftest, whose ranks run
ranks) checked against references and, with --params, against a calibration; cli prints
it, one line per finding, and exits 1 when a part the main job needs is broken.

The doctor's own process never initializes MPI, nor imports mpi4py's MPI module: whether
that module loads at all is one of its findings (install.mpi4py asks a subprocess).
"""

from __future__ import annotations

from dataclasses import dataclass, field

OK, WARN, MISSING, BROKEN, SKIPPED = "ok", "warn", "missing", "BROKEN", "skipped"
STATUSES = (OK, WARN, MISSING, BROKEN, SKIPPED)


@dataclass
class Finding:
    """One line of the report. status: ok; warn (works, but slower or unverified than it
    could be); missing (an optional part absent); BROKEN (the main job cannot run: exit 1);
    skipped (not checked, because a part it needs is broken)."""
    section: str   # "install", "optional" or "self-test"
    part: str      # what was checked: "mpiexec", "numba cache", "Slurm", "push/pull", ...
    status: str
    what: str      # what was found, one line
    fix: str = ""  # the one command or step that fixes it ('' when nothing to fix)
    data: dict = field(default_factory=dict)   # the figures behind the line (--json)
