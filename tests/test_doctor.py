"""python -m asgd.doctor: each check run for real with a part missing or broken (no
mpiexec, mpi4py unable to load its MPI, a cold numba cache, more ranks than cores), each
one clear line and the exit code, never a traceback; and the whole doctor with its
self-test once, which passes on a working install."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asgd import mpienv
from asgd.doctor import BROKEN, OK, SKIPPED, WARN, cli, selftest
from asgd.mpienv import cores_available

SRC = str(Path(__file__).resolve().parents[1] / "src")


def doctor(*args: str, env: dict | None = None, python: str = sys.executable, timeout: float = 60):
    """Run python -m asgd.doctor in a subprocess: (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    p = subprocess.run([python, "-m", "asgd.doctor", *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def lines(out: str, status: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.split()[:1] == [status]]


def assert_one_clear_failure(code: int, out: str, err: str, *words: str) -> None:
    assert code == 1, (out, err)
    broken = lines(out, BROKEN)
    assert len(broken) == 1 and all(w in broken[0] for w in words), out
    assert "→" in broken[0], broken   # and how to fix it
    assert "Traceback" not in out + err, err


@pytest.fixture(scope="module")
def full_run():
    """The whole doctor, self-test included, once for this file (its 2-rank job takes seconds)."""
    return doctor("--json", timeout=selftest.TIMEOUT_S + 60)


@pytest.mark.timeout(selftest.TIMEOUT_S + 90)   # its fixture's job may compile the kernels on a cold cache
def test_a_working_install_passes_the_self_test_within_its_time(full_run):
    code, out, err = full_run
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["ok"] and report["exit"] == 0 and "has all it needs" in report["verdict"]
    found = {f["part"]: f for f in report["findings"]}
    for part in ("mpi4py", "mpiexec", "ping-pong", "push/pull", "kernel step"):
        assert found[part]["status"] == OK, found[part]
    assert found["push/pull"]["data"]["ok"] and found["kernel step"]["data"]["error_of_bound"] < 1
    seconds = found["time"]["data"]["seconds"]
    assert 0 < seconds < selftest.TIMEOUT_S and found["time"]["data"]["budget_s"] == 20
    assert f"{seconds:.1f} s" in found["time"]["what"]
    for part in ("Slurm", "PBS", "SimGrid", "netns and tc", "bench extra"):   # present or missing, never broken
        assert found[part]["status"] in (OK, "missing") and found[part]["section"] == "optional"


def venv_without_mpiexec(tmp_path: Path) -> str:
    """This venv's Python and packages in a venv whose bin/ holds only python: an install
    without the mpich extra. Returns its python."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs the tests to run in a virtual environment")
    root = tmp_path / "venv"
    (root / "bin").mkdir(parents=True)
    for entry in Path(sys.prefix).iterdir():
        if entry.name != "bin":
            (root / entry.name).symlink_to(entry)
    (root / "bin" / "python").symlink_to(sys.executable)
    return str(root / "bin" / "python")


def test_no_mpiexec_is_one_line_and_exit_1(tmp_path):
    python = venv_without_mpiexec(tmp_path)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    code, out, err = doctor(python=python, env={"PATH": str(empty)})
    assert_one_clear_failure(code, out, err, "mpiexec", "no mpiexec beside this Python or on PATH")
    assert any(ln.split()[1] == "mpi4py" for ln in lines(out, OK)), out   # the venv's own MPI still loads
    assert any("2-rank job" in ln and "needs mpiexec" in ln for ln in lines(out, SKIPPED)), out


def test_mpi4py_unable_to_load_its_mpi_is_one_line_and_exit_1():
    code, out, err = doctor(env={"MPI4PY_LIBMPI": "/nonexistent/libmpi.so.12"})
    assert_one_clear_failure(code, out, err, "mpi4py", "cannot load its MPI library", "/nonexistent/libmpi.so.12")
    assert "MPI4PY_LIBMPI=/nonexistent/libmpi.so.12 is set" in lines(out, BROKEN)[0]
    assert any("needs mpi4py's MPI" in ln for ln in lines(out, SKIPPED)), out


def test_a_cold_cache_warns_without_mpi_in_the_doctors_process(tmp_path):
    """NUMBA_CACHE_DIR on an empty folder: cold, said with how to warm it; and the doctor's
    own process never imported mpi4py's MPI (whether it loads is asked of a subprocess)."""
    script = ("import sys; from asgd.doctor.cli import main; code = main(['--no-self-test']); "
              "print('MPI imported' if 'mpi4py.MPI' in sys.modules else 'no MPI here'); sys.exit(code)")
    env = {**os.environ, "PYTHONPATH": SRC, "NUMBA_CACHE_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    cold = [ln for ln in lines(p.stdout, WARN) if "numba cache" in ln]
    assert len(cold) == 1 and "cold" in cold[0] and str(tmp_path) in cold[0] and "--dry-run" in cold[0], p.stdout
    assert p.stdout.splitlines()[-1] == "no MPI here"


def test_ranks_over_cores_warn_and_do_not_fail(capsys):
    ranks = 4 * cores_available() + 1
    assert cli.main(["--ranks", str(ranks), "--no-self-test"]) == 0
    out = capsys.readouterr().out
    over = [ln for ln in lines(out, WARN) if "ranks" in ln.split()[1]]
    assert len(over) == 1 and f"{ranks} ranks on {cores_available()} cores" in over[0], out
    assert cli.main(["--ranks", "1", "--no-self-test"]) == 0
    assert f"1 rank on {cores_available()} cores: one core each" in capsys.readouterr().out


def test_a_job_that_fails_or_hangs_is_one_broken_line():
    failed = selftest.run("false")
    assert [(f.status, f.part) for f in failed] == [(BROKEN, "2-rank job")]
    assert "failed (exit 1)" in failed[0].what
    hung = selftest.run("sh -c 'sleep 30' --", timeout=1)
    assert [f.status for f in hung] == [BROKEN] and "did not finish within 1 s" in hung[0].what


def measured(pingpong_8=2e-6, round_trip=1e-4, step=8e-3) -> dict:
    """What the 2-rank job reports (asgd.doctor.ranks), with these figures."""
    return {"pingpong": {"ok": True, "seconds": {"8": pingpong_8, "1048576": 1e-4}},
            "pushpull": {"ok": True, "n_w": 50002, "updates": 20, "round_trip_s": round_trip, "timed": True},
            "step": {"ok": True, "hidden": 1000, "batch": 64, "error_of_bound": 0.01, "timed_s": step}}


CALIBRATED = {"params": {"pingpong_s": {"8": 2e-6, "1048576": 1e-4}, "round_trip_s": {"50002": 1e-4},
                         "step_s": {"10000": {"256": 8e-3}}}}


def test_figures_within_20_percent_of_the_calibration_are_one_ok_line():
    got = selftest.against(measured(pingpong_8=2.3e-6, step=6.8e-3), CALIBRATED)
    assert [(f.status, f.part) for f in got] == [(OK, "calibration")] and "4 figures" in got[0].what


# calibrate's schema 2: the round trip and the step per precision (the self-test times float64's)
CALIBRATED_BY_PRECISION = {"params": {"pingpong_s": {"8": 2e-6, "1048576": 1e-4}, "precisions": {
    "float32": {"round_trip_s": {"50002": 5e-5}, "step_s": {"10000": {"256": 4e-3}}},
    "float64": {"round_trip_s": {"50002": 1e-4}, "step_s": {"10000": {"256": 8e-3}}}}}}


@pytest.mark.parametrize("params", [CALIBRATED, CALIBRATED_BY_PRECISION], ids=["schema 1", "schema 2"])
def test_each_figure_more_than_20_percent_off_is_named(params):
    got = selftest.against(measured(round_trip=1.5e-4, step=5e-3), params)
    assert [f.status for f in got] == [WARN, WARN]
    assert "round trip" in got[0].what and "1.50x params.json's" in got[0].what
    assert "float64 step" in got[1].what and "0.62x" in got[1].what
    assert all("python -m asgd.perf calibrate" in f.fix for f in got)


def test_a_file_that_is_not_a_params_json_is_refused(tmp_path, capsys):
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps({"config": {}}))
    with pytest.raises(SystemExit) as e:
        cli.main(["--params", str(bad)])
    assert e.value.code == 2 and "not a params.json" in capsys.readouterr().err


def test_a_job_past_its_time_is_killed_with_everything_it_started(tmp_path):
    """mpienv.run_bounded (the doctor's self-test, calibrate's and the pilot's jobs): past
    the timeout the whole session goes, so no rank outlives a killed mpiexec."""
    pid_file = tmp_path / "child"
    script = f"sleep 60 & echo $! > {pid_file}; wait"   # the launcher's stand-in, and a rank it started
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        mpienv.run_bounded(["bash", "-c", script], timeout=1.0)
    assert time.monotonic() - t < 30
    child = int(pid_file.read_text())
    for _ in range(50):   # reaped by init shortly after the kill
        if not os.path.exists(f"/proc/{child}") or "Z" in open(f"/proc/{child}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the job's child {child} outlived the timeout")


def test_stale_mpich_segments_are_named_with_their_fix_and_a_mapped_one_is_not(tmp_path):
    """Segments of killed MPICH jobs (no process maps them) warn with the rm that clears
    them; a segment some process maps (here this one) is in use, not stale."""
    import mmap
    from asgd.doctor.install import stale_shm
    assert stale_shm(str(tmp_path)).status == OK   # none at all
    (tmp_path / "mpich_shm_dead_0").write_bytes(b"\0" * 4096)
    live = tmp_path / "mpich_shm_live_0"
    live.write_bytes(b"\0" * 4096)
    with open(live, "r+b") as f, mmap.mmap(f.fileno(), 4096):
        got = stale_shm(str(tmp_path))
        assert got.status == WARN and got.data["stale"] == 1 and got.data["stale_bytes"] == 4096, got
        assert f"rm {tmp_path}/mpich_shm_*" in got.fix and "1 MPICH shared-memory segments" in got.what
    assert stale_shm(str(tmp_path)).data["stale"] == 2   # unmapped: both left behind
