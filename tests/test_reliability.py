"""Failures end the job fast and clearly, and no work is lost: divergence, checkpoints,
resume, SIGTERM and a worker killed mid-training. Every job here has a time limit."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import MPIEXEC, load_results, mpiexec


def start(n, args, program=("-m", "asgd.train")):
    """An asgd job in the background (its own process group, so nothing outlives it)."""
    if MPIEXEC is None:
        pytest.skip("no mpiexec")
    return subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, *program, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(path, proc, limit=60):
    t = time.monotonic()
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t < limit, f"no {path} after {limit} s"
        time.sleep(0.05)


def finish(proc, limit):
    try:
        return proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the job did not end within {limit} s")


def test_divergence_is_refused_then_stops_the_job(tmp_path):
    p = mpiexec(3, ["--lr", "1e307", "--out", str(tmp_path)], timeout=60)
    assert p.returncode != 0
    assert "refused 10 updates in a row with NaN or inf" in p.stderr and "lower --lr" in p.stderr


def test_checkpoint_resume_and_a_damaged_checkpoint(tmp_path):
    run = tmp_path / "run"
    p = mpiexec(5, ["--servers", "2", "--epochs", "2", "--checkpoint-every", "25", "--out", str(run), "--quiet"])
    assert p.returncode == 0, p.stderr
    meta = [json.loads(np.load(run / "checkpoint" / f"shard-{s}.npz")["header"].tobytes()) for s in (0, 1)]
    assert meta[0]["meta"]["epoch"] == 2 and len(meta[0]["meta"]["history"]) == 2
    assert meta[0]["meta"]["shard"][1] == meta[1]["meta"]["shard"][0]  # the two shards tile w
    p = mpiexec(5, ["--servers", "2", "--epochs", "3", "--resume", str(run), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(run)
    assert [h["epoch"] for h in r["metrics"]["history"]] == [1, 2, 3]  # continued, not restarted
    assert r["throughput"]["samples"] == 3 * r["config"]["train_points"]
    # flip one byte of a shard: refused with a message naming the file
    f = run / "checkpoint" / "shard-1.npz"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    p = mpiexec(5, ["--servers", "2", "--epochs", "4", "--resume", str(run)], timeout=30)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "shard-1.npz: damaged checkpoint" in p.stderr, p.stderr
    p = mpiexec(3, ["--epochs", "4", "--resume", str(run)], timeout=30)  # 1 server, not 2
    assert p.returncode == 2 and "resume with the run's --hidden and --servers" in p.stderr


def test_sigterm_checkpoints_and_exits_cleanly(tmp_path):
    proc = start(4, ["--epochs", "200", "--checkpoint-every", "20", "--out", str(tmp_path)])
    wait_for(tmp_path / "checkpoint" / "shard-0.npz", proc)
    os.kill(proc.pid, signal.SIGTERM)  # mpiexec passes it to every rank, as Slurm's time limit does
    out, err = finish(proc, 20)
    assert proc.returncode == 0, err
    assert "stopped early by SIGTERM" in out and f"--resume {tmp_path}" in out
    r = load_results(tmp_path)
    assert r["stopped"] == "SIGTERM" and r["throughput"]["samples"] < 200 * r["config"]["train_points"]


def test_a_killed_worker_ends_the_job_and_resume_recovers(tmp_path):
    """SIGKILL one worker mid-training: the job ends within 10 s; --resume from its last
    checkpoint reaches the accuracy of an uninterrupted run."""
    run = tmp_path / "run"
    proc = start(4, ["--epochs", "5", "--checkpoint-every", "20", "--out", str(run), "--quiet"])
    wait_for(run / "checkpoint" / "shard-0.npz", proc)
    victim = subprocess.run(["pgrep", "-f", "--", f"--out {run} "], capture_output=True, text=True).stdout.split()
    pids = [int(x) for x in victim if int(x) != proc.pid]
    assert pids, "no rank found to kill"
    killed_at = time.monotonic()
    os.kill(max(pids), signal.SIGKILL)  # the last started: a worker
    out, err = finish(proc, 30)
    assert time.monotonic() - killed_at < 10
    # whoever notices first says so: the launcher (the killed rank) or a rank whose MPI call failed
    assert proc.returncode != 0
    assert "Killed" in out + err or "MPI communication failed; another rank probably died" in err, out + err
    p = mpiexec(4, ["--epochs", "5", "--resume", str(run), "--quiet"])
    assert p.returncode == 0, p.stderr
    resumed = load_results(run)["metrics"]["accuracy"]
    p = mpiexec(4, ["--epochs", "5", "--out", str(tmp_path / "whole"), "--quiet"])
    whole = load_results(tmp_path / "whole")["metrics"]["accuracy"]
    assert resumed >= 0.95 and whole >= 0.95 and abs(resumed - whole) <= 0.02


BAD_FILES = {  # name: (content, the one error line's text after "asgd.train: error: <file>")
    "missing": (None, ": data file not found"),
    "directory": ("dir", ": cannot read data file: Is a directory"),
    "empty": ("", ": empty data file"),
    "fields": ("0.1\t0.2\t0\n0.3\t1\n", ":2: expected 3 fields like line 1, got 2"),
    "nonnumeric": ("0.1\t0.2\t0\n0.3\toops\t1\n", ":2: feature 'oops' is not a number"),
    "nan": ("0.1\t0.2\t0\n0.3\tnan\t1\n", ":2: feature is NaN or infinite"),
    "inf": ("0.1\t0.2\t0\n-inf\t0.4\t1\n", ":2: feature is NaN or infinite"),
    "negative": ("0.1\t0.2\t0\n0.3\t0.4\t-1\n", ":2: negative label -1"),
    "header": ("x\ty\tlabel\n0.1\t0.2\t0\n", ":1: feature 'x' is not a number"),
    "range": ("0.1\t0.2\t0\n0.3\t0.4\t2\n", ":2: label 2 out of range for --classes 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_data_ends_every_rank_within_10_s(tmp_path, case):
    """Through the whole job (tests/mpi/test_readers.py checks each reader's messages)."""
    content, message = BAD_FILES[case]
    f = tmp_path / "data.tsv"
    if content == "dir":
        f.mkdir()
    elif content is not None:
        f.write_text(content)
    extra = ["--classes", "2"] if case == "range" else []
    t = time.monotonic()
    p = mpiexec(3, ["--data", str(f), "--out", str(tmp_path / "o"), *extra], timeout=30)
    assert time.monotonic() - t < 10
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"asgd.train: error: {f}{message}\n"


def test_crlf_and_trailing_blanks_are_accepted(tmp_path):
    from asgd.data import problem
    d = problem.rings(400, 0)
    f = tmp_path / "d.tsv"
    f.write_bytes(b"".join(b"%r\t%r\t%d \t\r\n" % (float(a), float(b), y) for (a, b), y in zip(d.X, d.y)))
    p = mpiexec(3, ["--data", str(f), "--hidden", "200", "--epochs", "1", "--out", str(tmp_path / "o")])
    assert p.returncode == 0, p.stderr
    assert load_results(tmp_path / "o")["config"]["train_points"] == 350  # 1/8 held out


@pytest.mark.parametrize("n, args, message", [
    (3, ["--batch", "0"], "--batch must be >= 1, got 0"),
    (3, ["--batch", "-5"], "--batch must be >= 1, got -5"),
    (3, ["--hidden", "0"], "--hidden must be >= 1, got 0"),
    (3, ["--lr", "0"], "--lr must be a positive finite number, got 0.0"),
    (3, ["--lr", "nan"], "--lr must be a positive finite number, got nan"),
    (3, ["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (3, ["--servers", "4"], "--servers 4 leaves no worker among 3 ranks"),
    (2, ["--servers", "2"], "--servers 2 leaves no worker among 2 ranks"),
    (3, ["--mode", "fast"], "argument --mode: invalid choice: 'fast'"),
    (3, ["--checkpoint-every", "soon"], "--checkpoint-every must be N (updates) or Ns (seconds)"),
    (3, ["--bogus"], "unrecognized arguments: --bogus"),
    (1, [], "need at least 2 MPI ranks"),
])
def test_bad_options_end_every_rank_within_10_s(tmp_path, n, args, message):
    t = time.monotonic()
    p = mpiexec(n, args + ["--out", str(tmp_path)], timeout=30)
    assert time.monotonic() - t < 10
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = mpiexec(2, ["--out", str(blocker / "sub")], timeout=30)
    assert p.returncode == 2 and p.stderr.startswith("asgd.train: error: cannot write to output folder")


def rank_pids(run) -> dict[int, int]:
    """{MPI rank: pid} of the job writing to `run`, from each process's environment."""
    pids = subprocess.run(["pgrep", "-f", "--", f"--out {run}( |$)"], capture_output=True, text=True).stdout.split()
    ranks = {}
    for pid in map(int, pids):
        try:
            env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
        except OSError:
            continue
        rank = env.get("PMI_RANK", env.get("OMPI_COMM_WORLD_RANK"))
        if rank is not None:
            ranks[int(rank)] = pid
    return ranks


@pytest.mark.parametrize("servers", [2, 3])
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

