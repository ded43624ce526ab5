"""Shared helpers: run a whole MPI job in a subprocess, always with a time limit."""

import json
import os
import re
import subprocess
import sys

import pytest

from asgd import launch

MPIEXEC = launch.find()


def mpi(n: int, *program: str) -> list[str]:
    """`mpiexec -n n <the flags this MPI needs here> program...` (asgd.launch)."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpich]')")
    return launch.command(n, *program)


def mpiexec(n: int, args: list[str], timeout: float = 90, module: str = "asgd.train",
            cwd=None) -> subprocess.CompletedProcess:
    """`mpiexec -n n python -m module args`; a hang fails the test after `timeout` s."""
    cmd = mpi(n, sys.executable, "-m", module, *args)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        p.stderr, p.launcher_notes = split_launcher_notes(p.stderr)
        return p
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s\n"
                    f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}")


OPEN_MPI_RUNTIME = re.compile(r"\[[^\]\s]+:\d+\] PMIX ERROR: ")   # prterun's PMIx server, "[host:pid] ..."


def split_launcher_notes(stderr: str) -> tuple[str, str]:
    """(the ranks' own stderr, the launcher's notices). Open MPI's mpiexec adds a boxed
    notice (between lines of dashes) when a rank exits with a non-zero status, and while
    the job ends its event library may warn of a socket closed under it ("[warn] Epoll
    MOD(4) on fd 24 failed ... Bad file descriptor") and its PMIx server of a rank already
    gone ("[vm:10679] PMIX ERROR: PMIX_ERR_UNREACH in file .../pmix_server.c"); asgd's own
    report is the rest. MPICH adds none."""
    own, notes, inside = [], [], False
    for line in stderr.splitlines(keepends=True):
        rule = len(line.strip()) >= 20 and set(line.strip()) == {"-"}
        if rule or inside or line.startswith("[warn] Epoll ") or OPEN_MPI_RUNTIME.match(line):
            notes.append(line)
            inside = inside != rule
        else:
            own.append(line)
    return "".join(own), "".join(notes)


def load_results(out_dir) -> dict:
    with open(os.path.join(out_dir, "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def quick_params(tmp_path_factory):
    """params.json from one `python -m asgd.perf calibrate --quick`, shared by the tests."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpich]')")
    path = tmp_path_factory.mktemp("calibrate") / "new" / "params.json"   # --out makes its folder
    cmd = [sys.executable, "-m", "asgd.perf", "calibrate", "--quick", "--out", str(path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"calibrate failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return path


LOCKSTEP = ["--mode", "sync", "--hidden", "300", "--epochs", "2", "--batch", "64", "--seed", "5", "--quiet"]


@pytest.fixture(scope="session")
def lockstep_run(tmp_path_factory):
    """lockstep_run(n, *args) -> the run folder of `mpiexec -n n python -m asgd.train
    *LOCKSTEP *args`, which must succeed: sync mode (allreduce is lockstep anyway), hidden
    300, batch 64, seed 5, 2 epochs, so that every architecture given the same workers
    takes the same steps. Made once per (n, args) for the session: the determinism tests
    of test_architectures and test_p2p compare several architectures against the same
    parameter-server runs. Read only: a test that changes a run copies it first."""
    made = {}

    def run(n: int, *args: str):
        key = (n, args)
        if key not in made:
            out = tmp_path_factory.mktemp("lockstep") / "run"
            p = mpiexec(n, [*args, *LOCKSTEP, "--out", str(out)])
            assert p.returncode == 0, p.stderr
            made[key] = out
        return made[key]
    return run


@pytest.fixture(scope="session")
def sync_runs(tmp_path_factory):
    """sync_runs(optimizer) -> (common args, an uninterrupted 4-epoch run, a 2-epoch run
    with its checkpoint): sync mode, 2 servers and 3 workers, hidden 300, batch 64, so the
    same seed takes the same steps. Made once per optimizer for the session and shared by
    the resume tests (test_reliability: the optimizer's state survives; test_fault_tolerance:
    re-sharded for other servers), each resuming its own copy of the 2-epoch run."""
    made = {}

    def runs(optimizer: str):
        if optimizer not in made:
            common = ["--mode", "sync", "--servers", "2", "--optimizer", optimizer, "--hidden", "300",
                      "--batch", "64", "--quiet"]
            base = tmp_path_factory.mktemp(f"sync-{optimizer}")
            whole, part = base / "whole", base / "part"
            p = mpiexec(5, common + ["--epochs", "4", "--out", str(whole)])
            assert p.returncode == 0, p.stderr
            p = mpiexec(5, common + ["--epochs", "2", "--checkpoint-every", "1000000", "--out", str(part)])
            assert p.returncode == 0, p.stderr
            made[optimizer] = (common, whole, part)
        return made[optimizer]
    return runs


@pytest.fixture(scope="session")
def sixteen_ranks(tmp_path_factory):
    """The README's main command, `mpiexec -n 16 python -m asgd.train`, oversubscribed 8x
    on a 2-core machine, with --trace (which records and changes no step): one 16-rank
    job, the suite's largest, read by test_train_e2e (the run) and test_trace (its
    timeline and figures). -> (the finished process, its run folder)."""
    out = tmp_path_factory.mktemp("sixteen-ranks")
    return mpiexec(16, ["--trace", "--out", str(out)], timeout=150), out
