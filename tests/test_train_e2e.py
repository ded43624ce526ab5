"""The trainer as a user runs it: mpiexec in a subprocess, always with a time limit."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asgd.data import __main__ as data_cli
from asgd.core import wire
from conftest import load_results, mpi, mpiexec

PENGUINS = Path(__file__).resolve().parent.parent / "examples" / "penguins.csv"

WORKER_PHASES = {"init", "compute", "comm_wait"}
SERVER_PHASES = {"init", "aggregate", "idle"}


def check_schema(r: dict, world: int) -> None:
    """The results.json contract docs/formats.md documents (other tools read only this)."""
    c = r["config"]
    for key in ("hidden", "batch", "lr", "epochs", "seed", "world_size", "workers", "servers",
                "mpi_library", "host", "cores", "n_w", "precision"):
        assert key in c, key
    assert c["world_size"] == world and c["servers"] == 1 and c["workers"] == world - 1
    assert c["mpi_library"]  # e.g. "MPICH Version: 5.0.2"
    assert r["wall_s"] > 0 and 0 <= r["init_s"] < r["wall_s"]
    tl = [x["timeline"] for x in r["ranks"]]
    assert r["train_s"] == pytest.approx(max(t["end"] for t in tl) - max(t["init_end"] for t in tl))
    assert 0 < r["train_s"] <= r["wall_s"]
    assert r["init_s"] + r["train_s"] <= r["wall_s"] + 1e-4   # one clock (the offsets' error: microseconds)
    m, t = r["metrics"], r["throughput"]
    assert 0 <= m["accuracy"] <= 1 and np.isfinite(m["loss"])
    assert len(m["history"]) == c["epochs"]
    assert 0 <= m["eval_s"] <= r["train_s"]   # rank 0's held-out evaluations during training
    assert [h["epoch"] for h in m["history"]] == list(range(1, c["epochs"] + 1))
    assert t["samples_per_s"] > 0 and t["updates_per_s"] > 0
    assert t["samples"] == c["epochs"] * c["train_points"]
    ranks = r["ranks"]
    assert [x["rank"] for x in ranks] == list(range(world))
    assert [x["role"] for x in ranks] == ["server"] + ["worker"] * (world - 1)
    assert SERVER_PHASES <= set(ranks[0]["phases"])
    for x in ranks:
        assert x["bytes_sent"] == sum(b["sent"] for b in x["bytes"].values()) > 0
        assert x["bytes_recv"] == sum(b["recv"] for b in x["bytes"].values()) > 0
        assert x["staleness"]["max"] >= x["staleness"]["mean"] >= 0
    for x in ranks[1:]:
        assert WORKER_PHASES <= set(x["phases"])
    # every Delta-w a worker sent was applied by the server, once
    assert ranks[0]["updates"] == sum(x["updates"] for x in ranks[1:]) == t["updates"]
    # every byte one side counted, the other counted too: training (pushes, replies, done),
    # and the end of the run (records and clock pings to rank 0)
    for part in ("train", "finish"):
        assert ranks[0]["bytes"][part]["recv"] == sum(x["bytes"][part]["sent"] for x in ranks[1:]) > 0
        assert ranks[0]["bytes"][part]["sent"] == sum(x["bytes"][part]["recv"] for x in ranks[1:]) > 0
    size = wire.itemsize(c["precision"])   # the payload's values: 4 bytes in float32, 8 in float64
    push, pull = wire.push_bytes(c["n_w"], itemsize=size), wire.pull_bytes(c["n_w"], itemsize=size)
    for x in ranks[1:]:
        assert x["bytes"]["train"] == {"sent": push * x["updates"] + wire.DONE_BYTES, "recv": pull * x["updates"]}


def test_the_summary_adds_up_when_rank_0_starts_last(tmp_path):
    """A short run printed `wall 1.16 s (init 1.15 s, train 0.05 s)` and a verdict of 99 %
    beside a table's 95.6 %: wall_s was rank 0's own, init_s the slowest rank's from its
    own, earlier, start, and the timeline's init ended before the init phase did. Rank 0
    starts 0.5 s late here (the launcher's skew, made certain): the wall counts from the
    first rank's start on the job's one clock, so init + train <= wall on the printed
    line, and the verdict's % is init / wall, as it says; the table's are each rank's own."""
    late = 'if [ "${PMI_RANK:-$OMPI_COMM_WORLD_RANK}" = 0 ]; then sleep 0.5; fi; exec "$0" -m asgd.train "$@"'
    cmd = mpi(2, "sh", "-c", late, sys.executable, "--data", str(PENGUINS), "--label-column", "species",
              "--epochs", "2", "--out", str(tmp_path))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    line = next(x for x in out if x.startswith("wall "))
    wall, init, train = map(float, re.match(r"wall ([\d.]+) s \(init ([\d.]+) s, train ([\d.]+) s\)", line).groups())
    assert init + train <= wall + 0.01, line   # each printed to 0.01 s
    r = load_results(tmp_path)
    assert r["init_s"] + r["train_s"] <= r["wall_s"] + 1e-4, (r["init_s"], r["train_s"], r["wall_s"])
    assert r["wall_s"] >= max(x["timeline"]["end"] for x in r["ranks"]) - 1e-4
    for x in r["ranks"]:   # the timeline's init is the phase's
        assert x["timeline"]["init_end"] - x["timeline"]["start"] == pytest.approx(x["phases"]["init"], abs=1e-6)
    verdict = next(x for x in out if x.startswith("verdict: "))
    pct = int(re.search(r"init is (\d+)% of the wall time", verdict).group(1))
    assert pct == round(100 * r["init_s"] / r["wall_s"]) <= 100, verdict
    assert pct == pytest.approx(100 * init / wall, abs=1.5), (line, verdict)   # the printed line's, rounded
    assert any("% of its own wall time" in x for x in out), p.stdout


@pytest.mark.openmpi
def test_two_ranks_small_model(tmp_path):
    p = mpiexec(2, ["--hidden", "500", "--epochs", "4", "--out", str(tmp_path), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    check_schema(r, 2)
    assert r["metrics"]["accuracy"] >= 0.95
    assert "held-out loss" in p.stdout and "results:" in p.stdout


@pytest.mark.openmpi
def test_four_ranks_default_model_learns(four_ranks):
    """The session's 4-rank run (also test_reliability's uninterrupted reference)."""
    p, out = four_ranks
    assert p.returncode == 0, p.stderr
    r = load_results(out)
    check_schema(r, 4)
    assert r["config"]["hidden"] == 10000 and r["config"]["n_w"] == 2 * 10000 + 10000 + 10000 * 2 + 2
    assert r["metrics"]["accuracy"] >= 0.95
    assert p.stdout.count("epoch ") >= 3  # progress lines from rank 0 only
    assert r["config"]["precision"] == "float32" and np.load(out / "weights.npy").dtype == np.float32   # the default


@pytest.mark.openmpi
def test_float32_trains_to_float64s_accuracy_band(tmp_path, four_ranks):
    """The session's default 4-rank run (float32) against the same run in float64: the
    same seed, so the same data, initial w (float32's is float64's, rounded) and batches.
    Asynchronous pushes arrive in an order the machine's timing decides, so two runs of
    either precision differ by more than float32's rounding ever moves w (some 1e-7 of it
    per step); the band is issue 40's for every data set, 0.005 of held-out accuracy."""
    p, out = four_ranks
    assert p.returncode == 0, p.stderr
    q = mpiexec(4, ["--epochs", "3", "--precision", "float64", "--out", str(tmp_path), "--quiet"])
    assert q.returncode == 0, q.stderr
    r32, r64 = load_results(out), load_results(tmp_path)
    assert r64["config"]["precision"] == "float64" and np.load(tmp_path / "weights.npy").dtype == np.float64
    assert abs(r32["metrics"]["accuracy"] - r64["metrics"]["accuracy"]) <= 0.005
    # every exchange moves half the payload bytes: a push's and a reply's values are 4 bytes, not 8
    per_update = {k: (x["bytes"]["train"]["sent"] - wire.DONE_BYTES) / x["updates"]
                  for k, x in (("32", r32["ranks"][1]), ("64", r64["ranks"][1]))}
    n_w = r32["config"]["n_w"]
    assert per_update["32"] - wire.HEADER_VALUE * wire.PUSH_HEADER == 4 * n_w
    assert per_update["64"] - wire.HEADER_VALUE * wire.PUSH_HEADER == 8 * n_w


def test_default_run_sixteen_ranks(sixteen_ranks):
    """The README's main command, oversubscribed 8x on a 2-core machine (with --trace:
    the session's one 16-rank job, whose trace tests/test_trace.py reads)."""
    p, out = sixteen_ranks
    assert p.returncode == 0, p.stderr
    r = load_results(out)
    check_schema(r, 16)
    assert r["metrics"]["accuracy"] >= 0.95
    assert r["config"]["oversubscribed"] is True


def test_one_bit_compression_learns_and_sends_sixty_times_fewer_bytes(tmp_path):
    """--compress 1bit on the default problem: the held-out accuracy, and the bytes each
    rank counted (what the testbed's byte proof checks against the wire) are the 1-bit
    messages': 6,395 bytes a push and 6,371 a reply for 2-10K-2 on one server in float64;
    in float32, the default, the 12 scales of its 6 columns take 4 bytes each, not 8."""
    p = mpiexec(4, ["--compress", "1bit", "--epochs", "4", "--out", str(tmp_path), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    assert r["config"]["compress"] == "1bit"
    assert r["metrics"]["accuracy"] >= 0.95
    server, workers = r["ranks"][0], r["ranks"][1:]
    assert server["updates"] == sum(x["updates"] for x in workers) == r["throughput"]["updates"]
    for x in workers:   # pushes and replies, and the end-of-work message
        assert x["bytes"]["train"] == {"sent": (6395 - 48) * x["updates"] + 8, "recv": (6371 - 48) * x["updates"]}
    assert server["bytes_recv"] == sum(x["bytes_sent"] for x in workers)
    assert server["bytes_sent"] == sum(x["bytes_recv"] for x in workers)


@pytest.mark.parametrize("compress", ["none", "1bit"])
def test_staleness_is_counted_from_the_w_a_push_was_computed_from(tmp_path, compress):
    """One async worker computes step k+1 while exchange k is in flight, and the server
    answers push k before it applies it (version k, without the push), so every push from
    the third on comes from the w two versions behind the server's (staleness 2; the
    first 0, the second 1), whatever the messages, with --overlap on (auto would stop
    overlapping: this step is far shorter than its exchange). (1-bit pushes were stamped
    after the wait that advanced w: one less.)"""
    p = mpiexec(2, ["--compress", compress, "--hidden", "50", "--epochs", "1", "--overlap", "on", "--out",
                    str(tmp_path), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    pushes = r["ranks"][1]["updates"]
    assert pushes == 64
    assert r["ranks"][1]["staleness"]["histogram"] == [1, 1, pushes - 2]


def test_progress_during_the_step_changes_no_bit(tmp_path):
    """One worker against one server is deterministic even asynchronously with --overlap on
    (step k+1 always starts from the reply to k-1): the step split by --mpi-progress step
    gives the very weights of the unsplit step."""
    weights = []
    for mode in ("step", "off"):
        out = tmp_path / mode
        p = mpiexec(2, ["--hidden", "2000", "--epochs", "1", "--mpi-progress", mode, "--overlap", "on", "--out",
                        str(out), "--quiet"])
        assert p.returncode == 0, p.stderr
        assert load_results(out)["config"]["mpi_progress"] == mode
        weights.append(np.load(out / "weights.npy"))
    np.testing.assert_array_equal(weights[0], weights[1])


def test_trains_on_a_tsv_file_with_its_test_file(tmp_path):
    f = tmp_path / "d.tsv"
    assert data_cli.main(["generate", "--points", "3000", "--classes", "3", "--out", str(f)]) == 0
    out = tmp_path / "run"
    p = mpiexec(2, ["--data", str(f), "--hidden", "300", "--epochs", "2", "--out", str(out), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(out)
    assert (r["config"]["features"], r["config"]["classes"]) == (2, 3)
    assert (r["config"]["train_points"], r["config"]["test_points"]) == (3000, 750)
