"""Failures end the job fast and clearly, and no work is lost: divergence, checkpoints,
resume, SIGTERM and a worker killed mid-training. Every job here has a time limit."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from asgd import mpienv
from asgd.mpienv import rank_pids
from asgd.run import checkpoint
import conftest
from conftest import MPIEXEC, load_results, mpi, mpiexec, split_launcher_notes
from oracles import held_out_metrics


def start(n, args, program=("-m", "asgd.train")):
    """An asgd job in the background (its own process group, so nothing outlives it)."""
    return subprocess.Popen(mpi(n, sys.executable, *program, *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(path, proc, limit=60):
    t = time.monotonic()
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t < limit, f"no {path} after {limit} s"
        time.sleep(0.05)


def finish(proc, limit, notes=False):
    """(stdout, the ranks' stderr[, the launcher's notices]) of a started job, which must
    end within `limit` s."""
    try:
        out, err = proc.communicate(timeout=limit)
        own, launcher = split_launcher_notes(err)
        return (out, own, launcher) if notes else (out, own)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the job did not end within {limit} s")


def test_divergence_is_refused_then_stops_the_job(tmp_path):
    p = mpiexec(2, ["--lr", "1e307", "--out", str(tmp_path)], timeout=60)
    assert p.returncode != 0
    assert "refused 10 updates in a row with NaN or inf" in p.stderr and "lower --lr" in p.stderr


def test_checkpoint_resume_and_a_damaged_checkpoint(tmp_path):
    """2 servers, 1 worker, hidden 1000: the checkpoint's two shards, a resume with nothing
    left to train, a resume that continues, a damaged shard and a wrong --hidden refused.
    (Resumes with several workers: the optimizer-state and re-sharding tests, on the
    session's 2-worker sync runs, and the killed-worker test, 3 workers.)"""
    run = tmp_path / "run"
    job = ["--servers", "2", "--hidden", "1000"]
    p = mpiexec(3, job + ["--epochs", "2", "--checkpoint-every", "25", "--out", str(run), "--quiet"])
    assert p.returncode == 0, p.stderr
    meta = [json.loads(np.load(run / "checkpoint" / f"shard-{s}.npz")["header"].tobytes()) for s in (0, 1)]
    assert meta[0]["meta"]["epoch"] == 2 and len(meta[0]["meta"]["history"]) == 2
    assert meta[0]["meta"]["shard"][1] == meta[1]["meta"]["shard"][0]  # the two shards tile w
    # a resume with nothing left to train (a job that failed while finishing, restarted by
    # asgd.launch) ends with the checkpoint's results, not an error
    first = load_results(run)
    p = mpiexec(3, job + ["--epochs", "2", "--resume", str(run), "--quiet"])
    assert p.returncode == 0 and "nothing left to train" in p.stderr, p.stderr
    again = load_results(run)
    assert again["metrics"]["accuracy"] == first["metrics"]["accuracy"]
    assert again["metrics"]["history"] == first["metrics"]["history"]
    # 8 more epochs: one (a few ms on a fast core, under a loaded machine's start-up skew)
    # can leave too short a training time to give a rate at all (results.why_no_rate)
    p = mpiexec(3, job + ["--epochs", "10", "--resume", str(run), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(run)
    assert [h["epoch"] for h in r["metrics"]["history"]] == list(range(1, 11))  # continued, not restarted
    assert r["throughput"]["samples"] == 10 * r["config"]["train_points"]
    # the rate is this run's: its 8 epochs' samples over its train_s (it counted all ten)
    assert r["throughput"]["no_rate"] is None, r["throughput"]
    assert r["throughput"]["samples_per_s"] * r["train_s"] == pytest.approx(8 * r["config"]["train_points"])
    # flip one byte of a shard's w: refused with a message naming the file. A quarter in is
    # inside w's data whatever optimizer state follows it (the middle of an adagrad shard is
    # the size field of the next zip member's local header, which zipfile never reads back)
    f = run / "checkpoint" / "shard-1.npz"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 4] ^= 0xFF
    f.write_bytes(bytes(raw))
    p = mpiexec(3, job + ["--epochs", "11", "--resume", str(run)], timeout=30)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "shard-1.npz: damaged checkpoint" in p.stderr, p.stderr
    p = mpiexec(2, ["--hidden", "500", "--epochs", "11", "--resume", str(run)], timeout=30)   # on 1 server too
    assert p.returncode == 2 and "resume with the run's --hidden" in p.stderr


@pytest.mark.openmpi
def request_stop(proc, run) -> None:
    """SIGTERM, as a batch system's time limit delivers it: MPICH's mpiexec passes it to
    every rank; Open MPI's mpiexec ends the job itself on SIGTERM, so there the ranks get
    it directly (as Slurm signals every process of a job step)."""
    if mpienv.flavour(MPIEXEC) == "openmpi":
        for pid in rank_pids(run).values():
            os.kill(pid, signal.SIGTERM)
    else:
        os.kill(proc.pid, signal.SIGTERM)


@pytest.mark.parametrize("optimizer", ["adam"])
def test_the_optimizers_state_survives_checkpoint_and_resume(tmp_path, sync_runs, optimizer):
    """Sync mode is deterministic: 2 epochs, then a resume to 4, ends with the weights of
    an uninterrupted 4-epoch run only if each server's optimizer state (Adam's moments and
    step count, per shard) came back with its shard."""
    common, whole, made = sync_runs(optimizer)
    part = tmp_path / "part"
    shutil.copytree(made, part)   # the session's 2-epoch run, resumed here in a copy of its own
    p = mpiexec(4, common + ["--epochs", "4", "--resume", str(part)])
    assert p.returncode == 0, p.stderr
    np.testing.assert_array_equal(np.load(part / "weights.npy"), np.load(whole / "weights.npy"))
    r = load_results(part)
    assert r["config"]["optimizer"] == optimizer and [h["epoch"] for h in r["metrics"]["history"]] == [1, 2, 3, 4]
    # refused whatever the servers (the resume of 2 servers' cut on 1 is re-sharding, allowed)
    p = mpiexec(2, [*common[:2], "--optimizer", "sgd", *common[6:], "--epochs", "5", "--resume", str(part)], timeout=30)
    assert p.returncode == 2 and "resume with the run's --optimizer" in p.stderr


def test_a_float32_checkpoint_resumed_in_float64_is_converted_with_one_line(tmp_path):
    """A checkpoint records its precision; resuming it in the other converts w and the
    optimizer's state (float32 to float64: exactly) and says so in one line."""
    run = tmp_path / "run"
    job = ["--hidden", "50", "--quiet", "--out", str(run)]
    p = mpiexec(2, job + ["--epochs", "1", "--checkpoint-every", "1000000"], timeout=60)
    assert p.returncode == 0, p.stderr
    meta, arrays = checkpoint.read_file(checkpoint.path_of(str(run), 0))
    assert meta["precision"] == "float32" and arrays["w"].dtype == np.float32
    p = mpiexec(2, job + ["--epochs", "2", "--precision", "float64", "--resume", str(run)], timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(f"asgd.train: note: {run}: its checkpoint is float32, this run --precision float64: "
                          "w and the optimizer's state converted to float64 (exactly)") == 1, p.stderr
    r = load_results(run)
    assert r["config"]["precision"] == "float64" and np.load(run / "weights.npy").dtype == np.float64
    assert [h["epoch"] for h in r["metrics"]["history"]] == [1, 2]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """One job of 200 epochs (4 ranks, a checkpoint every 20 updates) sent SIGTERM half a
    second after its first checkpoint, well into an epoch, as a batch system's time limit
    would: -> (exit status, stdout, the ranks' stderr, its run folder). The SIGTERM test
    and the final-metrics test read it; float64, for the final metrics' exact comparison
    with the float64 oracle's forward pass."""
    run = tmp_path_factory.mktemp("stopped")
    proc = start(4, ["--epochs", "200", "--checkpoint-every", "20", "--precision", "float64", "--out", str(run)])
    wait_for(run / "checkpoint" / "shard-0.npz", proc)
    time.sleep(0.5)  # well into an epoch
    request_stop(proc, run)
    out, err = finish(proc, 20)
    return proc.returncode, out, err, run


def test_sigterm_checkpoints_and_exits_cleanly(stopped_run):
    code, out, err, run = stopped_run
    assert code == 0, err
    assert "stopped early by SIGTERM" in out and f"--resume {run}" in out
    r = load_results(run)
    assert r["stopped"] == "SIGTERM" and r["throughput"]["samples"] < 200 * r["config"]["train_points"]


def test_a_killed_worker_ends_the_job_and_resume_recovers(tmp_path, four_ranks):
    """SIGKILL one worker mid-training: the job ends within 10 s; --resume from its last
    checkpoint reaches the accuracy of an uninterrupted run (the session's 4-rank run of
    the same 3 epochs, conftest.four_ranks)."""
    run = tmp_path / "run"
    proc = start(4, ["--epochs", "3", "--checkpoint-every", "20", "--out", str(run), "--quiet"])
    wait_for(run / "checkpoint" / "shard-0.npz", proc)
    ranks = rank_pids(run)
    assert set(ranks) == {0, 1, 2, 3}, ranks
    killed_at = time.monotonic()
    os.kill(ranks[3], signal.SIGKILL)  # a worker
    out, err, launcher = finish(proc, 30, notes=True)
    assert time.monotonic() - killed_at < 10
    # whoever notices first says so: the launcher (the killed rank: MPICH prints "Killed",
    # Open MPI "signal 9 (Killed)") or a rank whose MPI call failed
    assert proc.returncode != 0
    assert ("Killed" in out + err + launcher or "MPI communication failed; another rank probably died" in err), \
        out + err + launcher
    p = mpiexec(4, ["--epochs", "3", "--resume", str(run), "--quiet"])
    assert p.returncode == 0, p.stderr
    resumed = load_results(run)["metrics"]["accuracy"]
    p, whole_run = four_ranks
    assert p.returncode == 0, p.stderr
    whole = load_results(whole_run)["metrics"]["accuracy"]
    assert resumed >= 0.95 and whole >= 0.95 and abs(resumed - whole) <= 0.02


def test_a_job_killed_with_several_async_servers_resumes_from_one_consistent_cut(tmp_path):
    """Three servers checkpoint every 0.2 s while 3 workers train asynchronously; the whole
    job is SIGKILLed. The newest cut every shard holds is the same pushes on every shard,
    so (all of them finite) the same number of versions; --resume continues from it. Each
    server saving on its own clock would leave shards of different versions."""
    from asgd.net.mlp import Layout
    from asgd.run import checkpoint
    run = tmp_path / "run"
    proc = start(6, ["--servers", "3", "--hidden", "1000", "--epochs", "500", "--checkpoint-every", "0.2s",
                     "--out", str(run), "--quiet"])
    try:
        wait_for(run / "checkpoint" / "shard-2.prev.npz", proc)
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    metas = {}
    for s in range(3):
        for f in (checkpoint.path_of(str(run), s), checkpoint.path_of(str(run), s, previous=True)):
            if os.path.exists(f):
                meta = json.loads(np.load(f)["header"].tobytes())["meta"]
                metas.setdefault(meta["cut"], {})[s] = meta["rounds"]
    common = [c for c, by_shard in metas.items() if len(by_shard) == 3]
    assert common, metas
    for c in common:
        assert len(set(metas[c].values())) == 1, (c, metas[c])   # one cut: the same versions on every shard
    w, meta, _ = checkpoint.load(str(run), Layout(2, 1000, 2).n_w, "adagrad")
    assert meta["cut"] == max(common)
    # resumed by the 3 servers and one worker (the workers a run resumes with are its own)
    p = mpiexec(4, ["--servers", "3", "--hidden", "1000", "--epochs", str(meta["epoch"] + 1), "--resume", str(run),
                    "--quiet"])
    assert p.returncode == 0, p.stderr


BAD_FILES = {  # name: (content, the one error line's text after "asgd.train: error: <file>")
    "missing": (None, ": data file not found"),
    "directory": ("dir", ": cannot read data file: Is a directory"),
    "nonnumeric": ("0.1\t0.2\t0\n0.3\toops\t1\n", ":2: column 2: 'oops' is not a number; features must be "
                   "numbers: if this column is the label, use --label-column 1, else drop or encode it"),
    "range": ("0.1\t0.2\t0\n0.3\t0.4\t1\n" * 10 + "0.5\t0.6\t2\n", ":21: label 2 out of range for --classes 2"),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.openmpi) if c == "nonnumeric" else c
                                  for c in sorted(BAD_FILES)])
def test_bad_data_ends_every_rank_within_10_s(tmp_path, case):
    """Through the whole job: a file that cannot be opened, one that is not a file, a
    bad line, a label beyond --classes. Every defect's message, for both readers, on
    every rank: tests/mpi/test_readers.py; the parser's: tests/test_parse.py."""
    content, message = BAD_FILES[case]
    f = tmp_path / "data.tsv"
    if content == "dir":
        f.mkdir()
    elif content is not None:
        f.write_text(content)
    extra = ["--classes", "2"] if case == "range" else []
    t = time.monotonic()
    p = mpiexec(2, ["--data", str(f), "--out", str(tmp_path / "o"), *extra], timeout=30)
    assert time.monotonic() - t < 10
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"asgd.train: error: {f}{message}\n"


def test_crlf_and_trailing_blanks_are_accepted(tmp_path):
    from asgd.data import problem
    d = problem.rings(400, 0)
    f = tmp_path / "d.tsv"
    f.write_bytes(b"".join(b"%r\t%r\t%d \t\r\n" % (float(a), float(b), y) for (a, b), y in zip(d.X, d.y)))
    p = mpiexec(2, ["--data", str(f), "--hidden", "200", "--epochs", "1", "--out", str(tmp_path / "o")])
    assert p.returncode == 0, p.stderr
    assert load_results(tmp_path / "o")["config"]["train_points"] == 350  # 1/8 held out


@pytest.mark.parametrize("n, args, message", [  # each message: tests/test_config.py
    pytest.param(2, ["--batch", "0"], "--batch must be >= 1, got 0", marks=pytest.mark.openmpi),  # our validation
    (2, ["--bogus"], "unrecognized arguments: --bogus"),          # argparse's
    (2, ["--servers", "2"], "--servers 2 leaves no worker among 2 ranks"),  # the job's size
    (1, [], "need at least 2 MPI ranks"),
])
def test_bad_options_end_every_rank_within_10_s(tmp_path, n, args, message):
    t = time.monotonic()
    p = mpiexec(n, args + ["--out", str(tmp_path)], timeout=30)
    assert time.monotonic() - t < 10
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in p.stderr, p.stderr


@pytest.mark.openmpi
def test_a_job_the_launcher_could_not_start_is_told_from_the_ranks_failing():
    """conftest.mpiexec starts such a job once more, and fails the test with the launcher's
    message, which split_launcher_notes would hide: so Open MPI's exit status and form
    must be what launch_failed looks for."""
    if mpienv.flavour(MPIEXEC) != "openmpi":
        pytest.skip("Open MPI's launcher (CI's second venv)")
    cmd = mpi(2, "--no-such-launcher-option", sys.executable, "-c", "pass")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert conftest.launch_failed(p), (p.returncode, p.stderr)
    assert "--no-such-launcher-option" in split_launcher_notes(p.stderr)[1]
    p = subprocess.run(mpi(2, sys.executable, "-c", "import sys; sys.exit(3)"), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 3 and not conftest.launch_failed(p), (p.returncode, p.stderr)


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = mpiexec(2, ["--out", str(blocker / "sub")], timeout=30)
    assert p.returncode == 2 and p.stderr.startswith("asgd.train: error: cannot write to output folder")


@pytest.mark.parametrize("servers", [pytest.param(2, marks=pytest.mark.openmpi), 3])
def test_sync_with_several_servers_stops_when_one_server_is_signalled(tmp_path, servers):
    """The worst skew of a signal's arrival: only server rank 0 gets SIGTERM. It tells the
    workers to stop; the other servers, which never got the signal, must stop with them
    rather than wait forever for the next round's pushes."""
    run = tmp_path / "run"
    proc = start(servers + 3, ["--mode", "sync", "--servers", str(servers), "--epochs", "200",
                               "--checkpoint-every", "20", "--out", str(run)])
    wait_for(run / "checkpoint" / "shard-0.npz", proc)
    os.kill(rank_pids(run)[0], signal.SIGTERM)
    out, err = finish(proc, 20)
    assert proc.returncode == 0, err
    assert "stopped early by SIGTERM" in out
    r = load_results(run)
    rounds = {x["rounds"] for x in r["ranks"] if x["role"] == "server"}
    assert len(rounds) == 1  # every shard stopped after the same round: one consistent model



def test_final_metrics_describe_the_saved_weights(stopped_run):
    """A run stopped mid-epoch: results.json's final loss and accuracy are those of the
    weights it saved, not of the last completed epoch's."""
    code, out, err, run = stopped_run
    assert code == 0, err
    r = load_results(run)
    loss, accuracy = held_out_metrics(np.load(run / "weights.npy"))
    assert r["metrics"]["accuracy"] == accuracy
    assert r["metrics"]["loss"] == pytest.approx(loss, rel=1e-9)


@pytest.mark.parametrize("where", [pytest.param("asgd.data.readers:_bulk_wait", marks=pytest.mark.openmpi),
                                   "asgd.data.readers:_finish"])
def test_a_rank_failing_inside_the_readers_collectives_ends_the_job(tmp_path, where):
    """One rank fails (out of memory) after an agreement and before the next collective
    completes: without --timeout the others must not wait for it forever; the job ends
    with one line naming the rank and the cause."""
    from asgd.data import formats, problem
    f = tmp_path / "d.tsv"
    formats.write(str(f), problem.rings(2000, 0))
    t = time.monotonic()
    proc = start(3, ["1", where, "--data", str(f), "--out", str(tmp_path / "o")],
                 program=[os.path.join(os.path.dirname(__file__), "fault_injection.py")])
    out, err = finish(proc, 30)
    assert time.monotonic() - t < 20
    assert proc.returncode != 0
    assert "rank 1" in err and "MemoryError" in err, err
