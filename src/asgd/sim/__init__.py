"""asgd.sim: asgd's protocol as SimGrid actors, to predict runs past this machine.

The same protocol as asgd.train (servers per shard, workers, async / ssp / sync,
allreduce, the readers' init and every rank's start-up) runs as SimGrid actors on a
simulated platform whose costs come from `python -m asgd.perf calibrate` (params.json):
a step's time and its measured spread, the server's work per update, messaging, start-up,
reading and parsing. The platform is this machine (one node of its cores, CPU shared
among the ranks by SimGrid's CPU model) or a described cluster (a star of nodes behind
one switch, a torus, a fat-tree) such as the paper's Mustang and Blue Waters.

Modules, one job each:
  costs      params.json -> the seconds of every simulated operation (no SimGrid)
  machines   the platforms to simulate: this machine, Mustang, Blue Waters (no SimGrid)
  platform   a machine -> SimGrid hosts, links and routes
  clock      per-rank phase accounting and trace events, in simulated time
  actors     the protocol: start-up, readers, worker, servers, allreduce
  run        one simulation: engine, platform, actors, results.json / trace.json
  probes     calibrate's KIND+step probes simulated: the corrections Costs is given
  cli        python -m asgd.sim

SimGrid is optional (the `sim` extra and scripts/install_simgrid.sh): nothing else in
asgd imports this package, and this package imports SimGrid only when a simulation runs.
"""

from __future__ import annotations

import contextlib
import os
import sys

INSTALL_HINT = ("SimGrid's Python bindings are not installed: run scripts/install_simgrid.sh "
                "(Debian's python3-simgrid, linked into this venv; --pypi builds it from source)")


class SimgridMissing(ImportError):
    """SimGrid's Python module cannot be imported here."""


def simgrid():
    """The simgrid module, or SimgridMissing with how to install it."""
    try:
        with quiet_stderr():  # its C++ side logs a configuration line on import
            import simgrid as sg   # here: optional (the `sim` extra), needed only when a simulation runs
    except ImportError as e:
        raise SimgridMissing(f"{INSTALL_HINT} ({e})") from None
    return sg


@contextlib.contextmanager
def quiet_stderr():
    """Hide what C++ code writes to fd 2 inside the block (SimGrid's configuration log)."""
    try:
        fd = os.dup(2)
    except OSError:
        yield
        return
    try:
        sys.stderr.flush()
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)


def available() -> bool:
    try:
        simgrid()
        return True
    except SimgridMissing:
        return False
