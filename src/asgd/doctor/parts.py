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
    return Finding(SECTION, name, OK if present else MISSING, what, "" if present else fix, data)


def slurm() -> Finding:
    why = testbed_slurm.missing_requirements()
    return part("Slurm", why is None, why or f"sbatch, srun and the daemons ({shutil.which('sbatch')})",
                "apt-get install slurm-wlm slurm-wlm-torque munge")


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
    return part("netns and tc", why is None, why or "network namespaces, bridges, veths and tc (asgd.testbed)",
                "run as root on Linux with iproute2 and util-linux (apt-get install iproute2 util-linux)")


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
