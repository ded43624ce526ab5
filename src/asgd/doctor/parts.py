"""The optional parts, each present or missing with the one command that installs it: the
batch systems (Slurm, PBS's qsub), SimGrid's bindings (asgd.sim), network namespaces and
tc (asgd.testbed, as its own preflight decides) and the bench extra. None is needed to
train: a missing part is never a failure."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil

from ..testbed import sh
from ..testbed import slurm as testbed_slurm
from . import MISSING, OK, Finding

SECTION = "optional"
BENCH = ("torch", "sklearn", "mlxtend", "matplotlib")   # the bench extra's modules (pyproject.toml)


def part(name: str, present: bool, what: str, fix: str, **data) -> Finding:
    """A part's line; the fix said once (the testbed's reasons carry their own)."""
    what = what.replace(f" ({fix})", "").replace(f": {fix}", "")
    return Finding(SECTION, name, OK if present else MISSING, what, "" if present else fix, data)


def slurm() -> Finding:
    """Submitting (slurm/'s scripts) needs sbatch and srun; a Slurm of one's own (the
    testbed's, tests/test_slurm.py's) its daemons too: testbed.slurm's list."""
    absent = [t for t in ("sbatch", "srun") if shutil.which(t) is None]
    daemons = testbed_slurm.missing_requirements() is None
    return part("Slurm", not absent, f"no {', '.join(absent)} on PATH" if absent else
                f"sbatch and srun ({shutil.which('sbatch')}); "
                + ("the daemons too (a local Slurm: the testbed's)" if daemons else "no daemons here (a login node)"),
                "apt-get install slurm-wlm slurm-wlm-torque munge, or your site's Slurm module", daemons=daemons)


def pbs() -> Finding:
    qsub = shutil.which("qsub")
    return part("PBS", qsub is not None, f"qsub ({qsub})" if qsub else "no qsub on PATH",
                "apt-get install slurm-wlm-torque (qsub over Slurm), or your site's PBS")


def simgrid() -> Finding:
    found = importlib.util.find_spec("simgrid") is not None   # found, not imported: it logs on import
    version = distribution_version("simgrid") if found else ""
    return part("SimGrid", found, f"SimGrid's Python bindings {version}".rstrip() if found
                else "no SimGrid Python bindings (asgd.sim)", "scripts/install_simgrid.sh")


def testbed() -> Finding:
    why = sh.missing_requirements()
    tools = "apt-get install iproute2 util-linux"
    return part("netns and tc", why is None, why or "network namespaces, bridges, veths and tc (asgd.testbed)",
                tools if why and tools in why else "run it as root, on Linux (asgd.testbed makes namespaces)")


def bench() -> Finding:
    absent = [m for m in BENCH if importlib.util.find_spec(m) is None]
    return part("bench extra", not absent, f"missing {', '.join(absent)}" if absent else ", ".join(BENCH),
                "pip install -e '.[bench]'", missing=absent)


def distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def check() -> list[Finding]:
    return [slurm(), pbs(), simgrid(), testbed(), bench()]
