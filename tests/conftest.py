"""Shared helpers: run a whole MPI job in a subprocess, always with a time limit."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from asgd import mpienv
from asgd.doctor.install import unmapped_shm

MPIEXEC = mpienv.find()
REPO = Path(__file__).resolve().parents[1]


def _subprocess_environment(env=os.environ) -> str | None:
    """What every process the suite starts inherits (each mpiexec rank, asgd.perf, the
    benches, the local Slurm's jobs), set once at import, before any test starts one. The
    suite's time is the ranks' start-up: hundreds of jobs, each rank importing numpy, mpi4py
    and numba. Two costs of a start-up that no test is about go:
    - OpenBLAS's thread pool: numpy's OpenBLAS starts a thread per core that spins for
      about 0.1 s of CPU after the import, in every process; asgd calls no BLAS (its kernels
      are numba's), so one thread, as bench/common.py pins every process it starts.
    - compiling asgd's sources: where PYTHONDONTWRITEBYTECODE is set (it is on this project's
      machines) no process caches its bytecode, so each rank compiled every asgd module
      again (0.05 s of CPU a rank). The bytecode goes to a folder of the session's instead
      (PYTHONPYCACHEPREFIX), so the tree still gets no __pycache__ of Python's.
    Returns that folder (None: bytecode is written as usual), removed at the session's end."""
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return None
    del env["PYTHONDONTWRITEBYTECODE"]
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="asgd-tests-pycache-")
    return env["PYTHONPYCACHEPREFIX"]


PYCACHE = _subprocess_environment()


def mpi(n: int, *program: str) -> list[str]:
    """`mpiexec -n n <the flags this MPI needs here> program...` (asgd.mpienv)."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpich]')")
    return mpienv.command(n, *program)


# Open MPI's launcher's own exit status when it could not start the job at all (PRRTE's
# "error already reported", -43 as a byte), after a boxed message that split_launcher_notes
# would hide: a bad option, or a start-up race with the session directory another job's
# launcher is removing (CI saw one such start fail in 20 ms, once).
OPEN_MPI_LAUNCH_FAILED = 213


def mpiexec(n: int, args: list[str], timeout: float = 90, module: str = "asgd.train",
            cwd=None) -> subprocess.CompletedProcess:
    """`mpiexec -n n python -m module args`; a hang fails the test after `timeout` s. If
    Open MPI's launcher could not start the job, it is started once more; a second such
    failure fails the test with the launcher's whole message."""
    cmd = mpi(n, sys.executable, "-m", module, *args)
    for attempt in (1, 2):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s\n"
                        f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}")
        if not launch_failed(p):
            break
        if attempt == 2:
            pytest.fail(f"{' '.join(cmd)}: the launcher could not start the job, twice "
                        f"(exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
        print(f"the launcher could not start the job (exit {p.returncode}); starting it once more:\n"
              f"{p.stderr}", file=sys.stderr)
    p.stderr, p.launcher_notes = split_launcher_notes(p.stderr)
    return p


def launch_failed(p: subprocess.CompletedProcess) -> bool:
    """Open MPI's launcher ended the job before any rank ran: its own exit status, and
    nothing on stdout or stderr but its notices."""
    return (p.returncode == OPEN_MPI_LAUNCH_FAILED and not p.stdout
            and not split_launcher_notes(p.stderr)[0].strip())


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


SLURM_COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "qsub")


def no_local_slurm() -> str | None:
    """Why scripts/slurm_local.sh cannot run here (None: it can)."""
    missing = [c for c in SLURM_COMMANDS if shutil.which(c) is None]
    if missing:
        return f"Slurm is not installed (no {', '.join(missing)}): apt-get install slurm-wlm slurm-wlm-torque"
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd)"
    return None


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory):
    """scripts/slurm_local.sh, once for the session: a one-node Slurm that runs the batch
    scripts' jobs (train, sweep, a bad option, calibrate --quick, PBS) and stops. ->
    {"rc", "out", "work", "jobs": {name: {"id", "state", "exit", "stdout"}}}. Its checks
    are tests/test_slurm.py's; its calibration is also the session's quick_params."""
    if why := no_local_slurm():
        pytest.skip(why)
    work = tmp_path_factory.mktemp("slurm_local")
    env = dict(os.environ)
    if (Path(sys.prefix) / "bin" / "activate").exists():
        env["ASGD_VENV"] = sys.prefix  # the jobs run asgd from the venv pytest runs in
    else:
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # The script's own bound on its five jobs (90 s by default) is a hang guard: on a 2-core
    # machine shared with other work the calibrate job alone took over 90 s (CI, load 6-8).
    # 150 s, inside this fixture's 180.
    env.setdefault("SLURM_LOCAL_TIMEOUT", "150")
    # Its own session, so that a hang can be ended: TERM makes the script stop its daemons.
    proc = subprocess.Popen([str(REPO / "scripts" / "slurm_local.sh"), str(work)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        out = f"scripts/slurm_local.sh did not finish within 180 s:\n{out}"   # test_slurm fails on it
    jobs = {}
    tsv = work / "jobs.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        name, jid, state, code, stdout = line.split("\t")
        jobs[name] = {"id": jid, "state": state, "exit": code, "stdout": Path(stdout)}
    return {"rc": proc.returncode, "out": out, "work": work, "jobs": jobs}


@pytest.fixture(scope="session")
def quick_params(request, tmp_path_factory):
    """params.json from one `python -m asgd.perf calibrate --quick`, shared by the tests.
    Where a local Slurm can run (root, slurm-wlm), the one its calibrate job made
    (slurm/calibrate.sbatch --quick, which tests/test_slurm.py checks): the suite then
    calibrates once, not twice. Elsewhere, or if that job failed, a calibration of its own."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpich]')")
    if no_local_slurm() is None:
        slurm = request.getfixturevalue("local_slurm")
        job, path = slurm["jobs"].get("calibrate"), slurm["work"] / "jobs" / "params.json"
        if job and (job["state"], job["exit"]) == ("COMPLETED", "0:0") and path.exists():
            return path
    path = tmp_path_factory.mktemp("calibrate") / "new" / "params.json"   # --out makes its folder
    cmd = [sys.executable, "-m", "asgd.perf", "calibrate", "--quick", "--out", str(path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"calibrate failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return path


SESSION_START = pytest.StashKey[float]()


def pytest_sessionstart(session):
    session.config.stash[SESSION_START] = time.time()


def pytest_sessionfinish(session):
    """The MPICH segments this session's killed jobs left (timeouts, the fault tests) go:
    left in /dev/shm they pile up, and a later job that names the same segment hangs in
    MPI_Init (the local Slurm's srun jobs did)."""
    remove_session_shm("/dev/shm", session.config.stash[SESSION_START])
    stop_cold_cache()
    if PYCACHE:
        shutil.rmtree(PYCACHE, ignore_errors=True)


def remove_session_shm(folder: str, since: float, settle: float = 5.0) -> list[str]:
    """Remove the MPICH segments in `folder` written since `since` that no process maps
    (asgd.doctor's test); returns them. Others' jobs run alongside: a segment younger than
    `settle` s may be one its job created and has not mapped yet, so the youngest is waited
    for until it is that old, and one still younger when removing is kept."""
    stale, _ = unmapped_shm(folder)
    fresh = [st.st_mtime for st in stale.values() if st.st_mtime >= since]
    if not fresh:
        return []
    time.sleep(max(0.0, max(fresh) + settle - time.time()))
    stale, _ = unmapped_shm(folder)   # again: one its job has mapped meanwhile is in use
    removed = []
    for path, st in stale.items():
        if since <= st.st_mtime <= time.time() - settle:
            try:
                os.unlink(path)
            except FileNotFoundError:   # its job attached and unlinked it
                continue
            removed.append(path)
    return removed


def pytest_collection_modifyitems(items):
    """A test that may be the first to ask for quick_params sets it up: the local Slurm's
    five jobs (up to 180 s), then a calibration of its own if that one failed (up to
    180 s). Such tests get 400 s unless they say otherwise (pyproject's default is 120)."""
    for item in items:
        if "quick_params" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(400))


# float64: the exact-arithmetic comparisons read these runs (float32 variants: test_architectures)
LOCKSTEP = ["--mode", "sync", "--hidden", "300", "--epochs", "2", "--batch", "64", "--seed", "5", "--quiet",
            "--precision", "float64"]


@pytest.fixture(scope="session")
def lockstep_run(tmp_path_factory):
    """lockstep_run(n, *args) -> the run folder of `mpiexec -n n python -m asgd.train
    *args *LOCKSTEP`, which must succeed: sync mode (allreduce is lockstep anyway), hidden
    300, batch 64, seed 5, 2 epochs, float64 (args may name another --precision: the
    last one given counts), so that every architecture given the same workers takes the
    same steps. Made once per (n, args) for the session: test_architectures'
    sync-determinism, ring-bytes, model-parallel sync and weight-bytes tests and test_p2p's sync test
    read the same runs (the 4-rank parameter server's twice). Read only: a test that
    changes a run copies it first."""
    made = {}

    def run(n: int, *args: str):
        key = (n, args)
        if key not in made:
            out = tmp_path_factory.mktemp("lockstep") / "run"
            p = mpiexec(n, [*LOCKSTEP, *args, "--out", str(out)])
            assert p.returncode == 0, p.stderr
            made[key] = out
        return made[key]
    return run


@pytest.fixture(scope="session")
def sync_runs(tmp_path_factory):
    """sync_runs(optimizer) -> (common args, an uninterrupted 4-epoch run, a 2-epoch run
    with its checkpoint): sync mode, 2 servers and 2 workers (4 ranks), hidden 300, batch
    64, so the same seed takes the same steps. Made once per optimizer for the session and shared by
    the resume tests (test_reliability: the optimizer's state survives; test_fault_tolerance:
    re-sharded for other servers), each resuming its own copy of the 2-epoch run."""
    made = {}

    def runs(optimizer: str):
        if optimizer not in made:
            common = ["--mode", "sync", "--servers", "2", "--optimizer", optimizer, "--hidden", "300",
                      "--batch", "64", "--quiet", "--precision", "float64"]   # resumes compared bit for bit
            base = tmp_path_factory.mktemp(f"sync-{optimizer}")
            whole, part = base / "whole", base / "part"
            p = mpiexec(4, common + ["--epochs", "4", "--out", str(whole)])
            assert p.returncode == 0, p.stderr
            p = mpiexec(4, common + ["--epochs", "2", "--checkpoint-every", "1000000", "--out", str(part)])
            assert p.returncode == 0, p.stderr
            made[optimizer] = (common, whole, part)
        return made[optimizer]
    return runs


@pytest.fixture(scope="session")
def four_ranks(tmp_path_factory):
    """`mpiexec -n 4 python -m asgd.train --epochs 3`: the default model, 1 server and 3
    workers, uninterrupted; read by test_train_e2e (it learns; results.json's contract)
    and test_reliability (the accuracy a resumed run must reach). -> (the finished
    process, its run folder)."""
    out = tmp_path_factory.mktemp("four-ranks")
    return mpiexec(4, ["--epochs", "3", "--out", str(out)]), out


COLD_CACHE_STEPS = """
import sys
import numpy as np
from asgd.net.mlp import Layout, Sliced, init_params, make_mp_step, make_step
out = {}
for dt, tag in ((np.float64, ""), (np.float32, ".f32")):   # a specialization per precision
    for i, (d_in, d_h, d_out, batch) in enumerate(((3, 700, 4, 50), (2, 1001, 2, 37), (1, 513, 3, 70))):
        layout = Layout(d_in, d_h, d_out)
        w = init_params(layout, d_h, dt)
        rng = np.random.default_rng(batch)
        X, y = rng.normal(size=(batch, d_in)).astype(dt), rng.integers(0, d_out, batch)
        for use in sys.argv[2]:
            step = (make_step(layout, batch, dt) if use == "s"
                    else make_mp_step(Sliced(layout, 1), 0, batch, lambda Z: None, dt))
            dw = np.empty(layout.n_w, dt)
            loss = step(w, X, y, 0.05, dw)
            out[f"{use}{i}{tag}"] = np.append(dw, loss)
np.savez(sys.argv[1], **out)
if len(sys.argv) > 3:   # the compiling session: the float32 step's LLVM IR (code loaded from the cache has none)
    from asgd.net import kernels as K
    sig = next(s for s in K.step_rows.signatures if str(s[0].dtype) == "float32")
    open(sys.argv[3], "w").write(K.step_rows.inspect_llvm(sig))
"""


COLD_CACHE_SESSIONS = (("compiles make_step", "s"), ("loads it, compiles the slice's", "sm"), ("loads both", "ms"))
COLD = {}   # the cold-cache processes, run in a thread of their own: folder, runs, thread, proc, error


def start_cold_cache() -> None:
    """Start cold_cache's three processes (one after the other, in a thread) unless they
    were started: a process that compiles numba's kernels works on one core for seconds
    while the suite's own tests run beside it (pytest_collection_finish starts them when a
    selected test reads them); the tests that read them wait for them."""
    if "thread" in COLD:
        return
    COLD.update(folder=Path(tempfile.mkdtemp(prefix="asgd-cold-cache-")), runs=[])
    COLD["thread"] = threading.Thread(target=_cold_cache_runs, daemon=True)
    COLD["thread"].start()


def _cold_cache_runs() -> None:
    tmp = COLD["folder"]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp / "numba")}
    try:
        for i, (session, uses) in enumerate(COLD_CACHE_SESSIONS):
            ir = [str(tmp / "step_rows.f32.ll")] if i == 0 else []
            proc = COLD["proc"] = subprocess.Popen([sys.executable, "-c", COLD_CACHE_STEPS, str(tmp / f"{i}.npz"), uses,
                                                    *ir], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                   env=env)
            try:
                _, err = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                err = f"did not finish within 300 s\n{proc.communicate()[1]}"
            COLD["runs"].append((session, proc.returncode, err))
            if proc.returncode != 0 or COLD.get("stop"):
                return
    except BaseException as e:   # told to the tests that read the runs
        COLD["error"] = e


def stop_cold_cache() -> None:
    """At the session's end: a process still running (its readers deselected or failed
    before it ended) is killed, and the folder goes."""
    if "thread" not in COLD:
        return
    COLD["stop"] = True
    if COLD.get("proc") is not None and COLD["proc"].poll() is None:
        COLD["proc"].kill()
    COLD["thread"].join(30)
    shutil.rmtree(COLD["folder"], ignore_errors=True)


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    if any("cold_cache" in getattr(item, "fixturenames", ()) for item in session.items):
        start_cold_cache()


@pytest.fixture(scope="session")
def cold_cache():
    """Three processes sharing a numba cache that starts empty, as a job's ranks do: the
    first compiles make_step, the second loads it from the cache and compiles the
    model-parallel step (a slice of 1), the third loads both. -> ({session: {key: Delta-w
    with the loss appended}}, the float32 step_rows' LLVM IR as the first compiled it):
    keys "s<i>" (make_step) and "m<i>" (the slice's step) for three shapes i, in float64,
    and "s<i>.f32", "m<i>.f32" in float32. One compilation serves the tests below. The
    processes start with the session (start_cold_cache); this waits for them."""
    start_cold_cache()
    COLD["thread"].join()
    if "error" in COLD:
        raise COLD["error"]
    for session, code, err in COLD["runs"]:
        assert code == 0, f"{session}: exit {code}\n{err}"
    assert [r[0] for r in COLD["runs"]] == [s for s, _ in COLD_CACHE_SESSIONS], COLD["runs"]
    tmp = COLD["folder"]
    sessions = {session: dict(np.load(tmp / f"{i}.npz")) for i, (session, _) in enumerate(COLD_CACHE_SESSIONS)}
    return sessions, (tmp / "step_rows.f32.ll").read_text()


@pytest.fixture(scope="session")
def cold_cache_steps(cold_cache):
    """cold_cache's Delta-w by session. Read by test_kernels (make_step compiled or loaded:
    the same bits) and test_model_parallel (the slice's step is make_step's, whichever was
    compiled), which each ran the first two processes themselves."""
    return cold_cache[0]


@pytest.fixture(scope="session")
def float32_step_llvm(cold_cache):
    """The LLVM IR of the float32 step_rows, compiled in cold_cache's first process (a
    fresh cache: code loaded from numba's cache has no IR to inspect): test_kernels reads
    its vector lanes without compiling the step again."""
    return cold_cache[1]


@pytest.fixture(scope="session")
def sixteen_ranks(tmp_path_factory):
    """The README's main command, `mpiexec -n 16 python -m asgd.train`, oversubscribed 8x
    on a 2-core machine, with --trace (which records and changes no step): one 16-rank
    job, the suite's largest, read by test_train_e2e (the run) and test_trace (its
    timeline and figures). -> (the finished process, its run folder)."""
    out = tmp_path_factory.mktemp("sixteen-ranks")
    return mpiexec(16, ["--trace", "--out", str(out)], timeout=150), out
