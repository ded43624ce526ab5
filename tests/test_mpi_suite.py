"""Runs the pytest-mpi tests under mpiexec from a plain `pytest`, with a time bound, so
the README's one test command covers them and a deadlock fails instead of hanging."""

import os
import subprocess
import sys

import pytest

from conftest import MPIEXEC, mpi

HERE = os.path.dirname(__file__)


@pytest.mark.openmpi
def test_pytest_mpi_suite_on_four_ranks():
    assert MPIEXEC, "no mpiexec: install with pip install -e '.[mpich,test]'"
    cmd = [*mpi(4, sys.executable, "-m", "pytest", "--with-mpi", "-q"),
           "-p", "no:cacheprovider", os.path.join(HERE, "mpi")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert " passed" in p.stdout and "skipped" not in p.stdout.splitlines()[-1], p.stdout[-2000:]
