"""Protocol invariants, run inside one MPI job: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
Every wait has a deadline, and assertions come after the last collective, so a
failure cannot leave the other ranks hanging."""

import ctypes
import sys
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

from asgd.net import mlp
from asgd.data import problem
from asgd.mpiutil import TIMER_SLACK_NS, StallError, Waiter, oversubscribed
from asgd.core.wire import shard_bounds
from asgd.run.progress import EpochTracker
from asgd.net.optimizers import Optimizer, worker_lr
from asgd.core.schedule import Schedule
from asgd.protocol.context import Endpoint
from asgd.protocol.messages import DenseLink, link_messages, shard_messages
from asgd.core.policy import policy
from asgd.protocol.server import Server
from asgd.run.trace import PhaseClock
from asgd.protocol.worker import PushPull, run_worker
from oracles import optimizer_steps as reference

pytestmark = pytest.mark.mpi(min_size=3)


class Recording(Optimizer):
    """An optimizer that also keeps every direction it applied, in order."""

    def __init__(self, *args):
        super().__init__(*args)
        self.applied = []

    def update(self, w, d, out, scale=1.0, lr_scale=1.0):
        ok = super().update(w, d, out, scale, lr_scale)
        if ok:
            self.applied.append((d.copy(), scale))
        return ok


def run_job(servers=1, mode="async", K=None, epochs=2, batch=32, n=600, hidden=20, slow_rank=None,
            optimizer="sgd", lr=0.05):
    """A small job on COMM_WORLD; returns what rank 0 gathered (None elsewhere)."""
    comm = MPI.COMM_WORLD
    layout = mlp.Layout(2, hidden, 2)
    w0 = mlp.init_params(layout, 0)
    w = w0.copy()
    train = problem.rings(n, 0)
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 60, f"rank {comm.rank}")
    clock = PhaseClock("init")
    W = comm.size - servers
    sent = np.zeros(layout.n_w)  # sum of every Delta-w this rank sent
    shards = shard_bounds(layout.n_w, servers)
    if comm.rank < servers:
        lo, hi = shards[comm.rank]
        tracker = EpochTracker(n, epochs, None, lambda s: None, 1e9, clock) if comm.rank == 0 else None
        opt = Recording(optimizer, lr, hi - lo)
        on_version = (lambda rounds, loss_sum, m: tracker.add(loss_sum, m)) if tracker else None
        srv = Server(Endpoint(comm, waiter, clock), w[lo:hi], servers, opt, on_version=on_version)
        st = srv.serve(policy(mode, K))
        mine = {"updates": st.updates, "gap_max": max((max(g, default=0) for g in st.step_gap), default=0),
                "stale_min": min((min(s, default=0) for s in st.staleness), default=0),
                "samples": tracker.samples if tracker else None, "shard": (lo, hi), "applied": opt.applied}
    else:
        step = mlp.make_step(layout, batch)

        def counting_step(w_, X, y, lr, dw, progress=None):
            if comm.rank == slow_rank:
                time.sleep(0.01)  # a straggler: ssp must hold the others back
            loss = step(w_, X, y, lr, dw, progress)
            sent[:] += dw
            return loss
        idx = np.arange(comm.rank - servers, n, W)
        link = PushPull(Endpoint(comm, waiter, clock), shards, DenseLink(shards, w))
        plan = Schedule(batch, epochs, (0, comm.rank - servers), worker_lr(optimizer, lr), overlap=mode != "sync",
                        steps_per_epoch=-(-(-(-n // W)) // batch) if mode == "sync" else None)
        st = run_worker(link, train.X[idx], train.y[idx], counting_step, plan)
        mine = {"updates": st.updates, "samples": st.samples}
    total_sent = np.zeros_like(sent)
    comm.Reduce(sent, total_sent, op=MPI.SUM, root=0)
    final = np.zeros_like(w)
    for s, (lo, hi) in enumerate(shards):  # each server's shard of the final w
        part = np.ascontiguousarray(w[lo:hi]) if comm.rank == s else np.empty(hi - lo)
        comm.Bcast(part, root=s)
        final[lo:hi] = part
    counts = comm.gather(mine, root=0)
    return (w0, final, total_sent, counts) if comm.rank == 0 else None


def test_async_server_applies_every_update_once():
    got = run_job()
    if got:
        w0, w, total_sent, counts = got
        server, workers = counts[0], counts[1:]
        assert server["updates"] == sum(c["updates"] for c in workers) > 0
        assert server["samples"] == sum(c["samples"] for c in workers) == 2 * 600
        # the server's w is the initial w plus every Delta-w sent, each exactly once
        np.testing.assert_allclose(w, w0 + total_sent, rtol=0, atol=1e-10)
        assert server["stale_min"] >= 0


def test_uneven_shares_and_partial_batches():
    got = run_job(epochs=1, batch=64, n=601)
    if got:
        w0, w, total_sent, counts = got
        assert counts[0]["samples"] == 601
        np.testing.assert_allclose(w, w0 + total_sent, rtol=0, atol=1e-10)


def test_async_with_two_servers_loses_no_update():
    got = run_job(servers=2)
    if got:
        w0, w, total_sent, counts = got
        servers, workers = counts[:2], counts[2:]
        assert servers[0]["shard"][0] == 0 and servers[0]["shard"][1] == servers[1]["shard"][0]
        sizes = [hi - lo for lo, hi in (s["shard"] for s in servers)]
        assert max(sizes) - min(sizes) <= 1
        for s in servers:  # every server applied every push to its shard
            assert s["updates"] == sum(c["updates"] for c in workers)
        np.testing.assert_allclose(w, w0 + total_sent, rtol=0, atol=1e-10)


def test_ssp_never_applies_an_update_more_than_k_steps_ahead():
    K = 1
    got = run_job(mode="ssp", K=K, epochs=3, slow_rank=1)
    if got:
        w0, w, total_sent, counts = got
        gap = counts[0]["gap_max"]
        assert gap <= K          # the bound holds ...
        assert gap == K          # ... and was reached: the straggler really held the others
        np.testing.assert_allclose(w, w0 + total_sent, rtol=0, atol=1e-10)


def test_async_without_bound_runs_ahead_of_a_straggler():
    got = run_job(mode="async", epochs=3, slow_rank=1)
    if got:  # the contrast that makes the ssp test meaningful
        counts = got[3]
        assert counts[0]["gap_max"] > 1


def test_oversubscribed_is_the_nodes_count_unless_the_environment_says(monkeypatch):
    """Ranks per core where the node's ranks outnumber its cores, else 0. asgd.testbed's
    hosts each look like a node of their own; ASGD_OVERSUBSCRIBED=1 tells their ranks that
    the whole job shares the machine's cores."""
    from asgd.mpienv import cores_available
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    on_node = node.Get_size()
    node.Free()
    got = {}
    for told in (None, "1", "0", "yes"):
        if told is None:
            monkeypatch.delenv("ASGD_OVERSUBSCRIBED", raising=False)
        else:
            monkeypatch.setenv("ASGD_OVERSUBSCRIBED", told)
        got[told] = oversubscribed(comm)
    per_core = on_node / cores_available() if on_node > cores_available() else 0.0
    job = max(comm.size / cores_available(), 1.0)
    assert got == {None: per_core, "1": job, "0": 0.0, "yes": per_core}


def test_a_stalled_wait_ends_with_who_waited_on_whom():
    comm = MPI.COMM_WORLD
    peer = (comm.rank + 1) % comm.size
    waiter = Waiter(True, 0.0, f"rank {comm.rank} (worker)", stall_s=0.3)
    buf = np.empty(1)
    req = comm.Irecv(buf, source=peer, tag=99)  # nobody sends it
    t = time.monotonic()
    with pytest.raises(StallError) as e:
        waiter.all([req], lambda: f"rank {peer}'s message")
    waited = time.monotonic() - t
    req.Cancel()
    req.Wait()
    comm.Barrier()  # after the assertion-free part: every rank gets here
    assert str(e.value) == (f"rank {comm.rank} (worker) waited 0.3 s for rank {peer}'s message: "
                            "stalled (--stall-timeout)")
    assert 0.3 <= waited < 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's (prctl)")
def test_a_waiter_lets_its_threads_sleeps_end_on_time():
    """Its thread's timer slack is cut from Linux's default (50 us, which made each backoff
    sleep that much late) to TIMER_SLACK_NS; another thread's is left alone."""
    prctl = ctypes.CDLL(None).prctl
    get, put = 30, 29   # PR_GET_TIMERSLACK, PR_SET_TIMERSLACK
    got = []

    def make_one():
        prctl(put, 50_000, 0, 0, 0)
        got.append(prctl(get, 0, 0, 0, 0))
        Waiter(False, 0.0, "test")
        got.append(prctl(get, 0, 0, 0, 0))
    mine = prctl(get, 0, 0, 0, 0)
    t = threading.Thread(target=make_one)
    t.start()
    t.join()
    assert got == [50_000, TIMER_SLACK_NS]
    assert prctl(get, 0, 0, 0, 0) == mine


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_each_server_applies_its_optimizer_to_every_push_in_arrival_order(optimizer):
    """Two servers, async: each shard ends where the optimizer's numpy reference, replayed
    over the pushes that shard received in the order it applied them, ends; and those
    pushes are every worker's negative gradient, each exactly once."""
    got = run_job(servers=2, optimizer=optimizer, lr=0.01)
    if got:
        w0, w, total_sent, counts = got
        for s in counts[:2]:
            lo, hi = s["shard"]
            ds, scales = zip(*s["applied"])
            np.testing.assert_allclose(w[lo:hi], reference(optimizer, 0.01, w0[lo:hi], ds, scales),
                                       rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(sum(ds), total_sent[lo:hi], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("servers", [1, 2])
def test_one_bit_exchanges_lose_nothing_and_keep_the_copies_equal(servers):
    """--compress 1bit through the real Server and OneBitPushPull, async: each server's
    shard ends at w0 plus every push it decoded, once; what a worker pushed plus its
    residual is every Delta-w it computed (error feedback loses nothing); and each worker's
    w is, bit for bit, the copy its servers keep of it."""
    from asgd.core.policy import Async
    comm = MPI.COMM_WORLD
    layout = mlp.Layout(2, 30, 2)
    w0 = mlp.init_params(layout, 0)
    shards = shard_bounds(layout.n_w, servers)
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 60, f"rank {comm.rank}")
    clock = PhaseClock("init")
    if comm.rank < servers:
        lo, hi = shards[comm.rank]
        w = w0[lo:hi].copy()
        msgs = shard_messages("1bit", layout, (lo, hi), w, comm.size - servers)
        srv = Server(Endpoint(comm, waiter, clock), w, servers, messages=msgs)
        srv.serve(Async())
        mine = {"shard": (lo, hi), "w": w, "views": [v.copy() for v in msgs.views]}
    else:
        rng = np.random.default_rng(comm.rank)
        msgs = link_messages("1bit", layout, shards, w0)
        link = PushPull(Endpoint(comm, waiter, clock), shards, msgs)
        computed, pushed, out = np.zeros(layout.n_w), np.zeros(layout.n_w), np.empty(layout.n_w)
        ticket = None
        for k in range(12):
            dw = link.delta()
            dw[:] = rng.normal(size=layout.n_w) * 0.01 * (1 + k % 3)
            computed += dw
            if ticket is not None:
                link.wait(ticket)
            ticket = link.push_pull(dw, 1.0, 1)
            for s, (lo, hi) in enumerate(shards):
                msgs.push_codec[s].decode(msgs.out[s], out[lo:hi])
            pushed += out
        link.wait(ticket)
        link.close()
        mine = {"computed": computed, "pushed": pushed, "residual": msgs.residual.copy(), "w": link.w.copy()}
    got = comm.gather(mine, root=0)
    if comm.rank == 0:
        srvs, workers = got[:servers], got[servers:]
        total = sum(x["pushed"] for x in workers)
        for s in srvs:
            lo, hi = s["shard"]
            np.testing.assert_allclose(s["w"], w0[lo:hi] + total[lo:hi], rtol=0, atol=1e-12)
            for j, x in enumerate(workers):
                np.testing.assert_array_equal(x["w"][lo:hi], s["views"][j])
        for x in workers:
            np.testing.assert_allclose(x["pushed"] + x["residual"], x["computed"], rtol=0, atol=1e-12)


class CutRecorder:
    """A server's checkpoints: a cut every `every` seconds (asked on server 0 only, as
    --checkpoint-every Ns), and at each save the set of pushes this shard has applied
    (their ids, from on_version). `slow`: seconds each update takes, so pushes queue up
    and this server takes them in another order than a fast one."""

    def __init__(self, every, slow=0.0):
        self.every, self.slow, self.last, self.applied, self.saved = every, slow, time.monotonic(), [], {}

    def on_version(self, rounds, loss_sum, samples):
        self.applied.append(int(loss_sum))   # the test's step makes loss * m a push's id
        time.sleep(self.slow)

    def due(self, rounds):
        return time.monotonic() - self.last >= self.every

    def save(self, rounds, cut):
        self.last = time.monotonic()
        self.saved[cut] = (rounds, sorted(self.applied))


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_every_servers_checkpoint_of_a_cut_holds_the_same_pushes(mode):
    """Two servers, one worker slowed: cut c's file on every shard is the same set of
    pushes applied (one consistent model), whatever order they arrived in; ssp's bound
    holds through the cuts, and no push is lost or applied twice."""
    comm = MPI.COMM_WORLD
    servers, K = 2, 1
    layout = mlp.Layout(2, 20, 2)
    w0 = mlp.init_params(layout, 0)
    shards = shard_bounds(layout.n_w, servers)
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 60, f"rank {comm.rank}")
    clock = PhaseClock("init")
    if comm.rank < servers:
        lo, hi = shards[comm.rank]
        rec = CutRecorder(every=0.02, slow=0.003 * comm.rank)
        srv = Server(Endpoint(comm, waiter, clock), w0[lo:hi].copy(), servers,
                     on_version=rec.on_version, checkpoints=rec)
        st = srv.serve(policy(mode, K))
        mine = {"saved": rec.saved, "applied": sorted(rec.applied), "cuts": st.cuts,
                "gap": max((max(g, default=0) for g in st.step_gap), default=0)}
    else:
        train = problem.rings(240, comm.rank)
        pushes = [0]

        def step(w, X, y, lr, dw, progress=None):
            time.sleep(0.001 * (comm.rank - servers))   # workers of different speeds: pushes interleave
            dw[:] = 1e-6
            pushes[0] += 1
            return float(comm.rank * 1000 + pushes[0]) / len(y)   # loss * m = this push's id
        link = PushPull(Endpoint(comm, waiter, clock), shards, DenseLink(shards, w0))
        run_worker(link, train.X, train.y, step, Schedule(8, 1, (0, comm.rank), 1.0))
        mine = {"ids": [comm.rank * 1000 + k for k in range(1, pushes[0] + 1)]}
    got = comm.gather(mine, root=0)
    if comm.rank == 0:
        srvs, workers = got[:servers], got[servers:]
        every_push = sorted(i for x in workers for i in x["ids"])
        assert srvs[0]["cuts"] >= 3 and srvs[0]["cuts"] == srvs[1]["cuts"]
        for s in srvs:
            assert s["applied"] == every_push
        for cut in srvs[0]["saved"]:
            assert srvs[0]["saved"][cut][1] == srvs[1]["saved"][cut][1], cut
        if mode == "ssp":
            assert max(s["gap"] for s in srvs) <= K


@pytest.mark.parametrize("mode", ["async", "ssp", "sync"])
def test_each_reply_is_exactly_the_version_its_header_names(mode):
    """Replies go out of the server's versions of its shard, not copies: whatever a
    worker pulled is, bit for bit, the initial shard plus the first v updates the server
    applied, v the version in the reply's header (no torn read of a version being
    written, no reply from a buffer reused under it), in every mode."""
    comm = MPI.COMM_WORLD
    layout = mlp.Layout(2, 2000, 2)   # 80 KB replies: MPICH moves them only once received, not at Isend
    w0 = mlp.init_params(layout, 0)
    shards = shard_bounds(layout.n_w, 1)
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 60, f"rank {comm.rank}")
    clock = PhaseClock("init")
    W, n, batch = comm.size - 1, 96, 8
    if comm.rank == 0:
        opt = Recording("sgd", 1.0, layout.n_w)
        Server(Endpoint(comm, waiter, clock), w0.copy(), 1, opt).serve(policy(mode, 1))
        mine = opt.applied
    else:
        rng = np.random.default_rng(comm.rank)
        link = PushPull(Endpoint(comm, waiter, clock), shards, DenseLink(shards, w0))
        seen = []

        def step(w, X, y, lr, dw, progress=None):
            seen.append((int(link.versions[0]), w.copy()))
            dw[:] = rng.normal(scale=1e-3, size=len(dw))
            time.sleep(0.0005 * rng.integers(3))   # pushes interleave differently every step
            return 0.1
        plan = Schedule(batch, 1, (0, comm.rank), 1.0, overlap=mode != "sync",
                        steps_per_epoch=n // batch if mode == "sync" else None)
        run_worker(link, np.zeros((n, 2)), np.zeros(n, np.int64), step, plan)
        mine = seen
    got = comm.gather(mine, root=0)
    if comm.rank == 0:
        versions = [w0]
        for d, scale in got[0]:
            versions.append(versions[-1] + scale * d)
        pulled = [x for seen in got[1:] for x in seen]
        assert len(pulled) == W * (n // batch) and max(v for v, _ in pulled) > 0
        for v, w in pulled:
            np.testing.assert_array_equal(w, versions[v])


@pytest.mark.parametrize("reply_first", [True, False])
def test_async_answers_before_it_applies_so_a_worker_sees_its_own_update_one_exchange_later(reply_first):
    """One worker, no overlap: answered before its push is applied (the default), each
    push after the first comes from a w one version behind the server's (staleness 1);
    answered after (reply_first=False), from the current one (staleness 0)."""
    from asgd.core.policy import Async
    world = MPI.COMM_WORLD
    comm = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
    if comm != MPI.COMM_NULL:
        layout = mlp.Layout(2, 10, 2)
        w0 = mlp.init_params(layout, 0)
        shards = shard_bounds(layout.n_w, 1)
        waiter = Waiter(False, time.monotonic() + 60, f"rank {comm.rank}")
        clock = PhaseClock("init")
        if comm.rank == 0:
            st = Server(Endpoint(comm, waiter, clock), w0.copy(), 1).serve(Async(reply_first=reply_first))
            hist = st.staleness[0]
        else:
            def step(w, X, y, lr, dw, progress=None):
                dw[:] = 1e-3
                return 0.1
            link = PushPull(Endpoint(comm, waiter, clock), shards, DenseLink(shards, w0))
            run_worker(link, np.zeros((64, 2)), np.zeros(64, np.int64), step,
                       Schedule(8, 1, (0, 0), 1.0, overlap=False))
        comm.Free()
    world.Barrier()
    if world.rank == 0:
        assert hist == ([0] + [1] * 7 if reply_first else [0] * 8)
