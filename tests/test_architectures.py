"""Sharded servers, consistency modes and the allreduce baseline, end to end."""

import numpy as np
import pytest

from asgd.core import wire
from asgd.run import config
from conftest import LOCKSTEP, load_results, mpiexec
from oracles import held_out_metrics


def test_sync_is_deterministic_across_servers_and_allreduce(lockstep_run):
    """Three workers in each: 1 server (4 ranks), 3 servers (6 ranks), allreduce (3 ranks,
    so the ring passes each chunk on through a rank that did not make it). The 1-server run
    is the one test_p2p compares p2p with (lockstep_run makes it once)."""
    runs = {"s1": (4, ()), "s3": (6, ("--servers", "3")),
            "ar": (3, ("--arch", "allreduce")), "mpi": (3, ("--arch", "allreduce", "--allreduce", "mpi"))}
    w = {}
    for name, (n, args) in runs.items():
        out = lockstep_run(n, *args)
        w[name] = np.load(out / "weights.npy")
        r = load_results(out)
        assert r["config"]["workers"] == 3
    w0_moved = np.abs(w["s1"]).sum()
    assert w0_moved > 0
    np.testing.assert_array_equal(w["s1"], w["s3"])  # same arithmetic, shard by shard
    np.testing.assert_allclose(w["ar"], w["s1"], rtol=1e-9, atol=1e-12)  # allreduce sums in its own order
    np.testing.assert_allclose(w["mpi"], w["s1"], rtol=1e-9, atol=1e-12)


def test_sync_in_float32_is_deterministic_across_servers_and_close_to_allreduce(lockstep_run):
    """The float32 twin of the test above. 1 and 3 servers do the same float32 arithmetic
    element by element (the sync mean in worker order, then the optimizer), so their
    weights agree bit for bit. allreduce rounds the round's sum in another order: a
    perturbation of one float32 rounding (u = 2^-24) of the sum per step, which the
    training dynamics then carry along. Rounding every operation of the run to float32
    instead of float64 perturbs it in the same way at every rounding, that sum's
    included, so allreduce's distance from the 1-server run is bounded by the float32
    run's distance from the float64 run (the same dynamics carrying a subset of the same
    perturbations); twice that, for the chance of the reordering landing where the
    dynamics amplify more. Both distances are in units of how far training moved w."""
    f32 = ("--precision", "float32")
    w = {name: np.load(lockstep_run(n, *args, *f32) / "weights.npy")
         for name, (n, args) in {"s1": (4, ()), "s3": (6, ("--servers", "3")),
                                 "ar": (3, ("--arch", "allreduce"))}.items()}
    assert all(v.dtype == np.float32 for v in w.values())
    np.testing.assert_array_equal(w["s1"], w["s3"])  # same arithmetic, shard by shard
    w64 = np.load(lockstep_run(4) / "weights.npy")
    r = load_results(lockstep_run(4))
    from asgd.net.mlp import Layout, init_params
    w0 = init_params(Layout(2, r["config"]["hidden"], 2), r["config"]["seed"])
    moved = np.linalg.norm(w64 - w0)
    rounding = np.linalg.norm(w["s1"] - w64) / moved
    reordering = np.linalg.norm(w["ar"].astype(np.float64) - w["s1"]) / moved
    assert 0 < rounding < 1e-2, rounding   # float32 trained the same model, to its precision
    assert reordering <= 2 * rounding, (reordering, rounding)


@pytest.mark.parametrize("n, args", [
    (4, ()),                                   # 1 server, 3 workers
    (3, ("--arch", "p2p")),                    # 3 owners, each a worker
    (3, ("--arch", "allreduce")),
    (5, ("--model-parallel", "2")),            # 1 server, 2 replicas of 2
], ids=["ps", "p2p", "allreduce", "model-parallel"])
def test_final_metrics_are_those_of_the_saved_weights(lockstep_run, n, args):
    """Every architecture's results.json reports the held-out loss and accuracy of the
    weights.npy it wrote (issue 39: p2p's were its rank 0 worker's copy of w, one
    exchange behind the owners' shards that weights.npy gathers). The runs are the sync
    determinism tests'."""
    out = lockstep_run(n, *args)
    r = load_results(out)
    seed, hidden = (int(LOCKSTEP[LOCKSTEP.index(flag) + 1]) for flag in ("--seed", "--hidden"))
    loss, accuracy = held_out_metrics(np.load(out / "weights.npy"), hidden=hidden, seed=seed)
    assert r["metrics"]["loss"] == pytest.approx(loss, rel=1e-9)
    assert r["metrics"]["accuracy"] == accuracy


def test_the_ring_allreduce_counts_every_byte_it_moves(lockstep_run):
    """asgd's ring: each rank passes on 2 (P - 1) chunks an update, counted exactly
    (asgd.core.wire.ring_bytes); with MPI's allreduce the least any algorithm moves. The runs
    are the sync determinism test's (3 ranks; hidden 300: 1,505 values, chunks of
    unequal sizes)."""
    from asgd.core.wire import ring_bytes
    for algorithm in ("ring", "mpi"):
        r = load_results(lockstep_run(3, "--arch", "allreduce",
                                      *(("--allreduce", "mpi") if algorithm == "mpi" else ())))
        assert r["config"]["allreduce"] == algorithm
        n = r["config"]["n_w"] + 3   # [m * Delta-w | m, loss_sum, stop]
        size = wire.itemsize(r["config"]["precision"])
        assert n % 3
        for x in r["ranks"]:
            want = ring_bytes(n, 3, x["rank"], size) if algorithm == "ring" else (int(size * 2 * 2 * n / 3),) * 2
            assert (x["bytes"]["train"]["sent"], x["bytes"]["train"]["recv"]) == \
                (want[0] * x["updates"], want[1] * x["updates"])
            assert x["updates"] == r["throughput"]["updates"] > 0


def test_a_dry_run_starts_up_checks_and_trains_nothing(tmp_path):
    """--dry-run: kernels, data, model and output folder as a run would, then results.json
    with dry_run true, no update, no weights; the bytes of the end-of-run messages still
    counted. (A bad file still stops a dry run with the one line: test_user_data's
    bad-file cases run with --dry-run.)"""
    p = mpiexec(3, ["--dry-run", "--servers", "2", "--out", str(tmp_path)])
    assert p.returncode == 0, p.stderr
    assert "dry run: 3 ranks started" in p.stdout and "nothing trained" in p.stdout
    r = load_results(tmp_path)
    assert r["dry_run"] is True and r["throughput"]["updates"] == 0 and r["metrics"]["accuracy"] is None
    assert all(x["bytes"]["train"] == {"sent": 0, "recv": 0} for x in r["ranks"])
    assert r["ranks"][0]["bytes"]["finish"]["recv"] == sum(x["bytes"]["finish"]["sent"] for x in r["ranks"][1:]) > 0
    assert not (tmp_path / "weights.npy").exists()

@pytest.mark.openmpi
@pytest.mark.parametrize("n, args", [
    (5, ["--servers", "2"]),
    (5, ["--servers", "2", "--mode", "sync"]),
    (4, ["--mode", "ssp", "--staleness", "2"]),
    (4, ["--arch", "allreduce"]),
])
def test_every_mode_learns_the_default_problem(tmp_path, n, args):
    p = mpiexec(n, args + ["--epochs", "3", "--out", str(tmp_path), "--quiet"], timeout=90)
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    assert r["metrics"]["accuracy"] >= 0.95
    c = r["config"]
    servers = [x for x in r["ranks"] if x["role"] == "server"]
    assert len(servers) == c["servers"]
    if servers:  # load balance: shards within one element, every server saw every push
        sizes = [hi - lo for lo, hi in (s["shard"] for s in servers)]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == c["n_w"]
        pushes = sum(x["updates"] for x in r["ranks"] if x["role"] == "worker")
        assert all(s["requests"] == pushes for s in servers)
    for x in r["ranks"]:
        if x["role"] == "worker" and servers:
            assert sum(x["staleness"]["histogram"]) == x["updates"] * len(servers)
            if c["mode"] == "ssp":
                assert x["step_gap"]["max"] <= c["staleness"]
            if c["mode"] == "sync":
                assert x["staleness"]["max"] == 0


BAD_COMBINATIONS = [
    (3, ["--servers", "3"], "--servers 3 leaves no worker among 3 ranks"),
    (2, ["--arch", "allreduce", "--servers", "2"], "--servers does not apply"),
    (3, ["--arch", "p2p", "--servers", "2"], "--servers does not apply to --arch p2p"),
    (2, ["--mode", "ssp", "--staleness", "0"], "--staleness must be >= 1"),
    (5, ["--model-parallel", "3"], "--model-parallel 3 does not divide --hidden 10000"),
    (3, ["--model-parallel", "4", "--hidden", "100"], "--model-parallel 4 needs at least 4 workers"),
    (4, ["--model-parallel", "2", "--servers", "1"], "--model-parallel 2 does not divide the 3 workers"),
    (4, ["--arch", "allreduce", "--model-parallel", "2", "--checkpoint-every", "5s"],
     "checkpoints every N updates, not every N seconds"),
    (3, ["--allreduce", "mpi"], "--allreduce chooses --arch allreduce's algorithm; with --arch ps it does not apply")]


@pytest.mark.parametrize("n, args, msg", BAD_COMBINATIONS)
def test_options_that_do_not_fit(n, args, msg):
    """Each bad combination is refused with its reason (config.validate, on every rank)."""
    with pytest.raises(config.ConfigError) as e:
        config.parse(args, n)
    assert msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.openmpi
@pytest.mark.parametrize("case", [6])
def test_a_bad_combination_ends_every_rank_with_one_line(tmp_path, case):
    """Under mpiexec: one line from rank 0, exit status 2 from every rank (one job per
    MPI: the path is the same for every ConfigError)."""
    n, args, msg = BAD_COMBINATIONS[case]
    p = mpiexec(n, args + ["--out", str(tmp_path)], timeout=30)
    assert p.returncode == 2 and msg in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr


@pytest.mark.parametrize("n, args", [
    (5, ["--model-parallel", "2"]),                                   # 1 server, 2 replicas of 2
    (4, ["--arch", "allreduce", "--model-parallel", "2"]),
    (4, ["--arch", "p2p", "--model-parallel", "2", "--compress", "1bit"]),
])
def test_model_parallel_learns(tmp_path, n, args):
    p = mpiexec(n, args + ["--epochs", "3", "--out", str(tmp_path), "--quiet"], timeout=120)
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    assert r["metrics"]["accuracy"] >= 0.95
    assert r["config"]["model_parallel"] == 2 and r["config"]["replicas"] == 2
    trainers = [x for x in r["ranks"] if x["role"] != "server"]
    for x in trainers:   # the replica's members sum their logits each step, counted
        assert x["phases"]["replica_sum"] > 0 and x["bytes"]["train"]["sent"] > 0
    weights = np.load(tmp_path / "weights.npy")
    assert weights.shape == (r["config"]["n_w"],) and np.isfinite(weights).all()


@pytest.mark.parametrize("arch", ["ps", "allreduce"])
def test_model_parallel_sync_takes_the_same_steps(lockstep_run, arch):
    """Sync, the same seed: two replicas of 2 ranks take the steps two workers take,
    their losses equal but for the order of sums (1e-6), their weights too."""
    arch_args = () if arch == "ps" else ("--arch", arch)
    S = 1 if arch == "ps" else 0
    got = {}
    for K in (1, 2):   # K = 1: the default, two plain workers
        out = lockstep_run(S + 2 * K, *arch_args, *(("--model-parallel", str(K)) if K > 1 else ()))
        r = load_results(out)
        assert r["config"]["model_parallel"] == K
        got[K] = (np.array(r["metrics"]["step_loss"]), np.load(out / "weights.npy"))
    assert len(got[1][0]) == len(got[2][0]) > 0
    np.testing.assert_allclose(got[2][0], got[1][0], rtol=1e-6, atol=0)
    np.testing.assert_allclose(got[2][1], got[1][1], rtol=1e-6, atol=1e-9)


def test_model_parallel_divides_each_ranks_weights(lockstep_run):
    """results.json's weight_bytes: a worker of a replica of 4 holds about a quarter of the
    parameter-sized buffers a worker holds alone. The plain workers' run is the one the
    model-parallel sync test compares with (lockstep_run makes it once): a worker's buffers
    are w-sized whatever the workers, the batch or the mode."""
    got = {}
    for K, out in ((1, lockstep_run(3)), (4, lockstep_run(5, "--model-parallel", "4"))):
        r = load_results(out)
        assert r["config"]["model_parallel"] == K
        got[K] = [x["weight_bytes"] for x in r["ranks"] if x["role"] == "worker"]
    assert min(got[1]) > 0 and len(got[4]) == 4
    assert all(0.2 < k4 / max(got[1]) < 0.3 for k4 in got[4]), got


def test_model_parallel_checkpoints_and_resumes(tmp_path):
    run = tmp_path / "run"
    # 2 servers (a cut of two shards of the sliced vector) and one replica of 2
    args = ["--model-parallel", "2", "--servers", "2", "--hidden", "2000", "--checkpoint-every", "0.3s", "--quiet"]
    p = mpiexec(4, args + ["--epochs", "1", "--out", str(run)], timeout=120)
    assert p.returncode == 0, p.stderr
    p = mpiexec(4, args + ["--epochs", "2", "--resume", str(run)], timeout=120)
    assert p.returncode == 0, p.stderr
    r = load_results(run)
    assert [h["epoch"] for h in r["metrics"]["history"]] == [1, 2]
    assert r["metrics"]["accuracy"] >= 0.95
    p = mpiexec(3, ["--servers", "2", "--hidden", "2000", "--epochs", "3", "--resume", str(run)], timeout=60)
    assert p.returncode == 2 and "resume with the run's --model-parallel" in p.stderr, p.stderr


def test_the_header_says_an_allreduce_is_lockstep_and_has_no_servers(tmp_path):
    """asgd.train's first line said '0 server(s), 2 workers (allreduce, async)': --mode's
    default, which an allreduce never follows (optimize calls it sync)."""
    p = mpiexec(2, ["--arch", "allreduce", "--dry-run", "--out", str(tmp_path)], timeout=60)
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    assert "every rank a worker holding all of w (allreduce, sync)" in first, first
