"""Shared helpers: run a whole MPI job in a subprocess, always with a time limit."""

import json
import os
import shutil
import subprocess
import sys

import pytest

MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def mpiexec(n: int, args: list[str], timeout: float = 90, module: str = "asgd.train",
            cwd=None) -> subprocess.CompletedProcess:
    """`mpiexec -n n python -m module args`; a hang fails the test after `timeout` s."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpich]')")
    cmd = [MPIEXEC, "-n", str(n), sys.executable, "-m", module, *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s\n"
                    f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}")


def load_results(out_dir) -> dict:
    with open(os.path.join(out_dir, "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def quick_params(tmp_path_factory):
    """params.json from one `python -m asgd.perf calibrate --quick`, shared by the tests."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpich]')")
    path = tmp_path_factory.mktemp("calibrate") / "params.json"
    cmd = [sys.executable, "-m", "asgd.perf", "calibrate", "--quick", "--out", str(path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"calibrate failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return path
