"""SIGTERM and SIGINT (a Slurm time limit, Ctrl-C) ask the job to stop: the handler only
records the request; the loops check it at step boundaries, finish their exchanges,
and the servers write a checkpoint before the job exits. SIGUSR2 prints every thread's
stack to stderr (faulthandler: it works while the rank waits inside MPI), for a job that
seems stuck: `kill -USR2 <rank's pid>`."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

_requested: str | None = None


def install() -> None:
    def handler(signum, frame):
        global _requested
        _requested = signal.Signals(signum).name
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, handler)
    faulthandler.register(signal.SIGUSR2, all_threads=True)


def requested() -> str | None:
    """The name of the signal that asked to stop, or None."""
    return _requested


def reader_left() -> int:
    """A command's stdout reader went away (`| head`): end as quietly as a tool that SIGPIPE
    ended, as the Python docs advise. stdout goes to /dev/null so that the exit's flush has
    nowhere to fail. Returns the exit status (128 + SIGPIPE, as the shell shows such a tool's)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
