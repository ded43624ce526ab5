"""Losing a host mid-job, and getting it back (`python -m asgd.testbed fail | heal`).

  fail --how link   both of the host's links down (their root-side ends: the host sees
                    its carrier go): nothing it sends arrives, nothing reaches it, and no
                    connection is reset: as a pulled cable, or a switch port gone, looks
  fail --how kill   SIGKILL every process inside the host (its slurmd, slurmstepd, the
                    job's ranks): as a node that crashed, seen from its peers as reset
                    connections
  heal              the links up again, and the host's slurmd started again if it is gone
                    (with ReturnToService=2 Slurm takes the node back once it registers)
"""

from __future__ import annotations

import os

from . import procs, slurm, state
from .sh import TestbedError, run
from .spec import Spec

HOW = ("link", "kill")


def _host(spec: Spec, k: int) -> str:
    if not 0 <= k < spec.hosts:
        raise TestbedError(f"no host {k} in testbed {spec.name} (hosts 0..{spec.hosts - 1})")
    return spec.host(k)


def host_processes(spec: Spec, k: int) -> list[int]:
    """PIDs inside host k's network namespace."""
    return procs.inside({"net": {os.stat(f"/run/netns/{_host(spec, k)}").st_ino}})


def fail(spec: Spec, k: int, how: str) -> dict:
    """Take host k away by `how` (HOW); returns what was done."""
    _host(spec, k)
    if how == "link":
        for dev in (spec.veth(k), spec.control_veth(k)):
            run(["ip", "link", "set", dev, "down"])
        return {"host": spec.host(k), "links_down": [spec.veth(k), spec.control_veth(k)]}
    if how == "kill":
        pids = host_processes(spec, k)
        left = procs.kill(pids)
        if left:
            raise TestbedError(f"processes {left} in {spec.host(k)} did not end")
        return {"host": spec.host(k), "killed": pids}
    raise ValueError(f"--how must be one of {', '.join(HOW)}, not {how!r}")


def heal(spec: Spec, k: int) -> dict:
    """Host k's links up; its slurmd started again if the testbed has a Slurm and the
    host's is gone."""
    _host(spec, k)
    for dev in (spec.veth(k), spec.control_veth(k)):
        run(["ip", "link", "set", dev, "up"])
    restarted = False
    if (state.read(spec.name) or {}).get("slurm") and not any(
            is_slurmd(p) for p in host_processes(spec, k)):
        slurm.start_slurmd(spec, k)
        # nsenter execs slurmd a moment later: heal returns once it runs (the test saw it not yet)
        slurm.wait_until(lambda: any(is_slurmd(p) for p in host_processes(spec, k)), 10,
                    f"{spec.host(k)}'s slurmd did not start", slurm.directory(spec))
        restarted = True
    return {"host": spec.host(k), "links_up": [spec.veth(k), spec.control_veth(k)], "slurmd_started": restarted}


def is_slurmd(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "slurmd"
    except OSError:
        return False

