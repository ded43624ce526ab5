"""python -m asgd.launch [-n N] [--max-restarts R] [--shrink-by K] [--launcher CMD] -- [asgd.train options]

A job's supervisor, as torchrun's --max-restarts: it starts `mpiexec -n N python -m
asgd.train ...`, and when the job fails (a server died, a node was lost, a rank ran out
of memory: any exit status but 0, and 2, which is bad input that a restart would only
repeat) it starts it again from the run's last consistent checkpoint (--resume), at
most R times, each time with K ranks fewer if asked (a lost node's ranks gone: the
checkpoint is re-sharded for any number of servers and workers). Each restart is
recorded in RUN/restarts.json and in the final results.json (`restarts`): the exit
status, the checkpoint resumed from, and the training lost since it (seconds). Without
--checkpoint-every in the train options a restart starts over, and the supervisor says so.

SIGINT and SIGTERM to the supervisor go to the job, which then stops cleanly: no restart.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from .run import checkpoint
from .run.config import default_out
from .run.files import atomic_write
from .mpienv import RESTARTS_ENV, command

BAD_INPUT = 2   # asgd.train's status for a bad option or file: the same again on a restart


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m asgd.launch", description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python -m asgd.launch -n 16 --max-restarts 2 -- --checkpoint-every 30s --servers 2")
    p.add_argument("-n", type=int, required=True, metavar="N", help="MPI ranks (as mpiexec -n)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="R",
                   help="restart a failed job from its checkpoint at most R times (default 0: run once)")
    p.add_argument("--shrink-by", type=int, default=0, metavar="K",
                   help="each restart with K ranks fewer (the failed node's), never fewer than the servers "
                        "and one worker (default 0)")
    p.add_argument("--launcher", metavar="CMD",
                   help="the MPI launcher and its options (default: mpiexec beside this Python; e.g. "
                        "'srun --mpi=pmi2' inside a Slurm allocation)")
    p.add_argument("train", nargs=argparse.REMAINDER, metavar="-- OPTIONS",
                   help="asgd.train's options, after --")
    return p


def option(args: list[str], name: str) -> str | None:
    """The value of asgd.train option `name` in args (--name V or --name=V), else None."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def without(args: list[str], name: str) -> list[str]:
    """args without option `name` and its value."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    train = a.train[1:] if a.train[:1] == ["--"] else a.train
    if a.n < 1 or a.max_restarts < 0 or a.shrink_by < 0:
        print("asgd.launch: error: -n must be >= 1, --max-restarts and --shrink-by >= 0", file=sys.stderr)
        return BAD_INPUT
    out = option(train, "--out") or option(train, "--resume")
    if out is None:   # the supervisor must know where the checkpoints go
        out = default_out(a.n)
        train = [*train, "--out", out]
    servers = int(option(train, "--servers") or 1)
    history, n = [], a.n
    ft = "--fault-tolerant" in train
    if a.max_restarts and not option(train, "--checkpoint-every"):
        print("asgd.launch: note: no --checkpoint-every in the train options: a restart starts over",
              file=sys.stderr, flush=True)
    for attempt in range(a.max_restarts + 1):
        cmd = command(n, sys.executable, "-m", "asgd.train", *train, launcher=a.launcher, fault_tolerant=ft)
        env = {**os.environ, RESTARTS_ENV: os.path.join(out, "restarts.json")} if history else None
        status = run(cmd, env)
        failed_at = time.time()
        if status in (0, BAD_INPUT) or status < 0:   # done, bad input, or stopped by a signal we passed on
            return status if status >= 0 else 128 - status
        if attempt == a.max_restarts:
            print(f"asgd.launch: the job failed (exit {status}) and {a.max_restarts} restart(s) are used up",
                  file=sys.stderr, flush=True)
            return status
        cut = checkpoint.newest(out)
        n = max(n - a.shrink_by, servers + 1)
        record = {"attempt": attempt + 1, "exit_status": status, "failed_at": failed_at, "ranks": n,
                  "resumed_from": None if cut is None else
                  {k: cut.get(k) for k in ("cut", "epoch", "samples", "rounds", "time")},
                  "lost_s": None if cut is None else round(failed_at - cut["time"], 3)}
        history.append(record)
        atomic_write(os.path.join(out, "restarts.json"), lambda f: json.dump(history, f, indent=1))
        if cut is None:   # its folder may hold a partial checkpoint: ours to replace, not a run to keep
            train = train if "--force" in train else [*train, "--force"]
            print(f"asgd.launch: the job failed (exit {status}) before any checkpoint; starting it over "
                  f"({attempt + 1} of {a.max_restarts})", file=sys.stderr, flush=True)
            continue
        train = [*without(without(train, "--resume"), "--out"), "--resume", out, "--out", out]
        print(f"asgd.launch: the job failed (exit {status}); restarting from its checkpoint (cut {cut.get('cut')}, "
              f"epoch {cut.get('epoch')}, {record['lost_s']:.1f} s of training lost) with {n} ranks "
              f"({attempt + 1} of {a.max_restarts})", file=sys.stderr, flush=True)
    return 1


def run(cmd: list[str], env: dict | None) -> int:
    """Run the job; a SIGINT or SIGTERM to us goes to the job (which stops cleanly and
    checkpoints) and returns its status as -signal, so that no restart follows."""
    print(f"asgd.launch: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.Popen(cmd, env=env, start_new_session=True)
    asked = []

    def forward(signum, frame):
        asked.append(signum)
        try:
            os.killpg(p.pid, signum)
        except ProcessLookupError:
            pass
    before = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = p.wait()
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    return -asked[0] if asked else status


if __name__ == "__main__":
    sys.exit(main())
