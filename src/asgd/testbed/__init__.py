"""An emulated cluster on one machine: hosts as Linux namespaces, links shaped with tc.

    python -m asgd.testbed up --hosts 4 --bandwidth 100mbit     # root
    python -m asgd.testbed run --check-bytes -- mpiexec -n 4 python -m asgd.train --epochs 1
    python -m asgd.testbed status
    python -m asgd.testbed down

Each host is a network namespace with its own UTS (hostname) and IPC namespaces, one
veth into the data bridge, its link shaped with tc `tbf` on both ends (egress of the
host's eth0: what it sends; egress of the root-side veth: what it receives), latency
with `netem` where the kernel has it, and one veth into the control bridge, whose
address in the root namespace is the MPI launcher's: its connections to the hosts stay
off the shaped links. `run` places ranks on hosts through the launcher's own remote-start
mechanism (an ssh stand-in that enters the host's namespaces), so traffic between hosts
is TCP through the shaped links, and `run --check-bytes` proves it from the byte counters
on each veth (asgd.testbed.proof).

Modules, one job each, each importing only those listed above it:
  spec       names, addresses and rates of a testbed (pure: no system calls)
  placement  which rank runs on which host (pure)
  sh         running ip/tc/nsenter with time limits; what this machine lacks
  hostns     a host's persistent UTS and IPC namespaces (bind-mounted, no holder process)
  links      bridge, namespaces and veth pairs
  shaping    tc tbf (and netem where available) on both ends of a link
  state      the state directory under /run that up writes and down/status/run read
  procs      processes inside a testbed's namespaces, and ending them (for run and down)
  proof      veth byte counters against results.json's per-rank bytes
  model      the performance model's network terms on a testbed's links
  launch     rewriting an mpiexec command (MPICH hydra, Open MPI) to run on the hosts
  lifecycle  up, down, status, and the Testbed handle (whose run is launch's)
  cli        python -m asgd.testbed
"""

from .lifecycle import Testbed, down, status, up
from .sh import TestbedError, missing_requirements
from .spec import Spec, parse_rate

__all__ = ["Testbed", "down", "status", "up", "TestbedError", "missing_requirements", "Spec", "parse_rate"]
