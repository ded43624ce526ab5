"""Sharded servers, consistency modes and the allreduce baseline, end to end."""

import numpy as np
import pytest

from conftest import load_results, mpiexec


def test_sync_is_deterministic_across_servers_and_allreduce(tmp_path):
    """Four workers in each: 1 server (5 ranks), 3 servers (7 ranks), allreduce (4 ranks)."""
    common = ["--hidden", "300", "--epochs", "2", "--batch", "64", "--seed", "5", "--quiet"]
    runs = {"s1": (5, ["--mode", "sync"]), "s3": (7, ["--mode", "sync", "--servers", "3"]),
            "ar": (4, ["--arch", "allreduce"])}
    w = {}
    for name, (n, args) in runs.items():
        out = tmp_path / name
        p = mpiexec(n, args + common + ["--out", str(out)], timeout=90)
        assert p.returncode == 0, p.stderr
        w[name] = np.load(out / "weights.npy")
        r = load_results(out)
        assert r["config"]["workers"] == 4
    w0_moved = np.abs(w["s1"]).sum()
    assert w0_moved > 0
    np.testing.assert_array_equal(w["s1"], w["s3"])  # same arithmetic, shard by shard
    np.testing.assert_allclose(w["ar"], w["s1"], rtol=1e-9, atol=1e-12)  # allreduce sums in its own order


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


def test_options_that_do_not_fit(tmp_path):
    for n, args, msg in [(3, ["--servers", "3"], "--servers 3 leaves no worker among 3 ranks"),
                         (2, ["--arch", "allreduce", "--servers", "2"], "--servers does not apply"),
                         (2, ["--mode", "ssp", "--staleness", "0"], "--staleness must be >= 1")]:
        p = mpiexec(n, args + ["--out", str(tmp_path)], timeout=30)
        assert p.returncode == 2 and msg in p.stderr, p.stderr
