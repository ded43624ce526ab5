"""--arch p2p: every rank a worker and the owner of 1/N of w, end to end."""

import json

import numpy as np
import pytest

from asgd.core import wire
from asgd.net.mlp import Layout, init_params
from conftest import LOCKSTEP, load_results, mpiexec


@pytest.mark.openmpi
def test_p2p_learns_and_every_owner_applies_every_push(tmp_path):
    p = mpiexec(4, ["--arch", "p2p", "--epochs", "3", "--out", str(tmp_path), "--quiet"], timeout=120)
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    assert r["metrics"]["accuracy"] >= 0.95
    ranks = r["ranks"]
    assert [x["role"] for x in ranks] == ["peer"] * 4 and r["config"]["servers"] == 4
    sizes = [hi - lo for lo, hi in (x["shard"] for x in ranks)]
    assert sum(sizes) == r["config"]["n_w"] and max(sizes) - min(sizes) <= 1
    pushes = sum(x["updates"] for x in ranks)
    assert all(x["requests"] == pushes for x in ranks)   # every owner saw every worker's every push
    # bytes: a worker's pushes to the 3 other owners (its own shard needs no wire), and so on
    size = wire.itemsize(r["config"]["precision"])
    for x in ranks:
        others = [hi - lo for k, (lo, hi) in enumerate(y["shard"] for y in ranks) if k != x["rank"]]
        assert x["bytes"]["train"]["sent"] == (
            x["updates"] * sum(wire.push_bytes(k, itemsize=size) for k in others)        # my pushes
            + (pushes - x["updates"]) * wire.pull_bytes(x["shard"][1] - x["shard"][0], itemsize=size)   # my replies
            + 3 * wire.DONE_BYTES)
    assert sum(x["bytes_sent"] for x in ranks) == sum(x["bytes_recv"] for x in ranks)


def test_p2p_sync_takes_the_same_steps_as_a_parameter_server(lockstep_run):
    """Three workers, sync, the same seed: the p2p owners' per-step losses and final
    weights are those of one parameter server's (same data order, same sums in worker
    order). The parameter server's run is test_architectures' sync determinism's too."""
    got = {}
    for name, n, args in (("ps", 4, ()), ("p2p", 3, ("--arch", "p2p"))):
        out = lockstep_run(n, *args)
        r = load_results(out)
        assert r["config"]["workers"] == 3
        got[name] = (np.array(r["metrics"]["step_loss"]), np.load(out / "weights.npy"))
    assert len(got["ps"][0]) == len(got["p2p"][0]) == 2 * np.ceil(np.ceil(16384 / 3) / 64)
    np.testing.assert_allclose(got["p2p"][0], got["ps"][0], rtol=1e-9, atol=0)
    np.testing.assert_allclose(got["p2p"][1], got["ps"][1], rtol=1e-9, atol=1e-12)


def test_p2p_sync_in_float32_stays_within_float32s_rounding_of_a_parameter_server(lockstep_run):
    """The float32 twin of the test above: the same steps, sums in worker order, in float32.
    Whatever p2p's owners round otherwise than the one server, its distance from the
    1-server run is bounded by the float32 run's distance from the float64 run (every
    rounding of the run perturbed at once: test_architectures' float32 sync test), and
    the per-step losses agree to float32's precision of a mean of logs: the first step's,
    from the same w and batches, to a few u."""
    f32 = ("--precision", "float32")
    got = {}
    for name, n, args in (("ps", 4, f32), ("p2p", 3, ("--arch", "p2p", *f32)), ("ps64", 4, ())):
        out = lockstep_run(n, *args)
        got[name] = (np.array(load_results(out)["metrics"]["step_loss"]), np.load(out / "weights.npy"))
    seed, hidden = (int(LOCKSTEP[LOCKSTEP.index(flag) + 1]) for flag in ("--seed", "--hidden"))
    w0 = init_params(Layout(2, hidden, 2), seed)
    moved = np.linalg.norm(got["ps64"][1] - w0)
    rounding = np.linalg.norm(got["ps"][1] - got["ps64"][1]) / moved
    owners = np.linalg.norm(got["p2p"][1].astype(np.float64) - got["ps"][1]) / moved
    assert owners <= 2 * rounding, (owners, rounding)
    assert got["p2p"][0][0] == pytest.approx(got["ps"][0][0], rel=8 * 2.0 ** -24)


def test_p2p_with_one_bit_ssp_checkpoints_and_resume(tmp_path):
    """Everything that works with servers works with owners: 1-bit messages, ssp's bound,
    consistent checkpoints and --resume."""
    run = tmp_path / "run"
    args = ["--arch", "p2p", "--compress", "1bit", "--mode", "ssp", "--staleness", "2", "--checkpoint-every", "20",
            "--quiet"]
    p = mpiexec(3, args + ["--epochs", "2", "--out", str(run)], timeout=120)
    assert p.returncode == 0, p.stderr
    r = load_results(run)
    for x in r["ranks"]:
        assert x["step_gap"]["max"] <= 2
    lo, hi = r["ranks"][1]["shard"]
    cols = Layout(2, 10000, 2).columns(lo, hi)
    size = wire.itemsize(r["config"]["precision"])   # the scales' bytes
    assert r["ranks"][0]["bytes"]["train"]["sent"] >= r["ranks"][0]["updates"] * wire.push_bytes(hi - lo, cols, size)
    p = mpiexec(3, args + ["--epochs", "3", "--resume", str(run)], timeout=120)
    assert p.returncode == 0, p.stderr
    r = load_results(run)
    assert [h["epoch"] for h in r["metrics"]["history"]] == [1, 2, 3]
    assert r["metrics"]["accuracy"] >= 0.95


def test_p2p_trace_has_an_arrow_per_shard(tmp_path):
    p = mpiexec(3, ["--arch", "p2p", "--epochs", "1", "--hidden", "1000", "--trace", "--trace-steps", "2:7",
                    "--out", str(tmp_path), "--quiet"])
    assert p.returncode == 0, p.stderr
    ev = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"peer {r}" for r in range(3)}
    starts = [e for e in ev if e["ph"] == "s"]
    # steps 2..6 of 3 workers, each a push to and a reply from each of the 3 owners
    assert len(starts) == 3 * 5 * 3 * 2
    for owner in range(3):
        assert sum(e["pid"] == owner for e in starts if e["name"] == "w'") == 3 * 5


def test_a_ranks_messages_to_itself_go_over_a_communicator_of_its_own():
    """A p2p owner's own worker: its push, reply and end-of-work go over a duplicate of
    MPI_COMM_SELF, the same one for every endpoint of a communicator (so the worker and
    its owner meet), and an exchange of a rank with itself completes through it. Over
    COMM_WORLD MPICH moved 200 KB to self in about 28 progress steps: a 2-rank p2p sync
    step waited 2.4 ms for it between the Waiter's sleeps."""
    import time

    from mpi4py import MPI

    from asgd.core.policy import Async
    from asgd.mpiutil import Waiter
    from asgd.protocol.context import Endpoint
    from asgd.protocol.messages import DenseLink
    from asgd.protocol.server import Server
    from asgd.protocol.worker import PushPull
    from asgd.run.trace import PhaseClock

    comm = MPI.COMM_WORLD
    me = comm.rank
    ep = Endpoint(comm, Waiter(False, time.monotonic() + 30, "test"), PhaseClock("idle"))
    own, at = ep.route(me)
    assert own.size == 1 and at == 0 and MPI.Comm.Compare(own, comm) != MPI.IDENT
    assert Endpoint(comm, ep.waiter, PhaseClock("idle")).route(me)[0] is own
    assert ep.route(me + 1) == (comm, me + 1)

    n = 1000
    owner = Server(ep, np.zeros(n), [me])
    assert owner.routes == [(own, 0)]
    link = PushPull(ep, [(0, n)], DenseLink([(0, n)], np.zeros(n)), servers=[me])
    assert link.routes == [(own, 0)]
    policy = Async(reply_first=False)   # apply, then answer: w' holds this push
    dw = link.delta()
    dw[:] = 0.5
    ticket = link.push_pull(dw, 0.0, 1)
    for _ in range(100_000):
        if owner.poll(policy):
            break
    link.wait(ticket)
    assert np.all(link.w == 0.5) and owner.st.updates == 1 and owner.st.bytes_recv == 0
    link.close()
    for _ in range(100_000):
        if not owner.shard.live:
            break
        owner.poll(policy)
    assert owner.finish().updates == 1
