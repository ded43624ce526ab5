"""MPI microbenchmarks of what each architecture pays per step besides its training step,
through asgd's own protocol code (calibrate runs them; asgd.testbed.model runs them
across a testbed's hosts too). The probes' names and their step (KINDS, STEP,
STEP_PROBE) are the model's vocabulary: asgd.perf.architectures.

  `mpiexec -n N python -m asgd.probes.ranks exchange --kinds K,K ...`: one
  synchronous round after another with no compute (a step that returns at once), the
  seconds per round of the slowest rank, after a warm-up pass (MPI connects its pairs on
  first use, over TCP a handshake each):
    ps       ranks 0..S-1 serve (the Sync policy), the others push and pull: the
             parameter server's exchange, the server's work per round included
    async    the same under the Async policy, each worker's next step overlapping its
             exchange (asgd.train's default): measured only as async+step
    p2p      every rank a peer (protocol.p2p), owning 1/N of w: pushes to every owner,
             the owner's sync round and its replies
    ring     protocol.allreduce.Ring.sum of n_w + 3 values (asgd's ring allreduce)
    mpi      protocol.allreduce.MPIAllreduce.sum: MPI_Iallreduce, whatever algorithm
             this MPI picks at this size and rank count (measured, not assumed)
    replica  protocol.replica.Replica.sum of batch x 2 partial logits among K ranks
             (model partitioning's sum inside a replica)
    KIND+step  the same round with every computing rank's training step before it (the
             2-H-2 step at batch B of STEP_PROBE; ps's servers do not compute; replica+step:
             model partitioning as asgd.train runs it, replicas of 2, each member its
             slice's step with the logit sum inside, pushing asynchronously to a server on
             an odd rank 0): a round on cores the ranks share, as a run has it. With more ranks
             than cores the OS runs them in turns, so a rank often waits at the sum for a
             partner that is not running; the no-compute round cannot show that. At
             n_w = 5 H + 2 (replica+step: batch B) only.

Units: seconds; sizes in weights (values of the probe's precision: float64 unless given).
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from ..core.wire import shard_bounds
from ..data import problem
from ..mpiutil import Waiter, oversubscribed
from ..net import mlp
from ..perf.architectures import KINDS, STEP, STEP_PROBE
from ..protocol.allreduce import MPIAllreduce, Ring
from ..core.schedule import Schedule
from ..protocol.context import Endpoint
from ..protocol.messages import DenseLink, DenseShard
from ..protocol.p2p import peer_link, run_peer
from ..protocol.replica import Replica
from ..core.policy import Async, Sync
from ..protocol.server import Server, serve_all
from ..protocol.worker import PushPull, run_worker
from ..run.trace import PhaseClock


def probe_exchange(kinds: list[str], sizes: list[int], rounds: int, batches: list[int] = (), servers: int = 1,
                   precision: str = "float64") -> dict | None:
    """Seconds per synchronous round of each of `kinds` at each size (weights; replica:
    logits of each of `batches` samples), every value (and the steps') of `precision`,
    the slowest rank's mean over `rounds` rounds after a warm-up of a few. All kinds in
    one job: a launch costs seconds, a probe milliseconds. Rank 0 returns {"seconds":
    {kind: {size: s}}, "ranks": N}; the others None."""
    comm = MPI.COMM_WORLD
    bad = [k for k in kinds if k.removesuffix(STEP) not in KINDS]
    if bad:
        raise ValueError(f"unknown exchange(s) {bad}: one of {KINDS}, each also with {STEP}")
    if any(k.startswith(("ps", "async")) for k in kinds) and not 0 < servers < comm.size:
        raise ValueError(f"ps needs 0 < servers < ranks, got {servers} of {comm.size}")
    dtype = np.dtype(precision)
    mlp.compile_kernels("aggregate", "update:sgd", "step", "mp_step", dtype=dtype)
    H, B = STEP_PROBE
    out: dict = {}
    for kind in kinds:
        base, stepped = kind.removesuffix(STEP), kind.endswith(STEP)
        one = _ROUNDS.get(kind, _ROUNDS[base])
        work = _stepper(H, B, comm.rank, dtype) if stepped and base != "replica" else None   # replica's: its own
        for n in ([B] if stepped and base == "replica" else [5 * H + 2] if stepped
                  else batches if base == "replica" else sizes):
            r = (max(3, rounds // 4) if base != "replica" and n > 200_000    # long rounds, alike
                 else 2 * rounds if stepped else rounds)   # the OS's turns: more rounds to average them
            one(comm, n, max(2, r // 5), servers, work, dtype)        # warm-up: connections, buffers, caches
            comm.Barrier()
            t = time.perf_counter()
            one(comm, n, r, servers, work, dtype)
            elapsed = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
            out.setdefault(kind, {})[n] = elapsed / r
    return {"seconds": out, "ranks": comm.size} if comm.rank == 0 else None


def _stepper(hidden: int, batch: int, rank: int, dtype):
    """work(): one training step of 2-hidden-2 at this batch on data of its own, in dtype
    (the exchange's w and Delta-w are left alone)."""
    layout = mlp.Layout(2, hidden, 2)
    w, dw, ds = mlp.init_params(layout, rank, dtype), np.zeros(layout.n_w, dtype), problem.rings(batch, rank)
    X = ds.X.astype(dtype)
    step = mlp.make_step(layout, batch, dtype)
    return lambda progress=None: step(w, X, ds.y, 1e-9, dw, progress)


def _endpoint(comm):
    waiter = Waiter(oversubscribed(comm), time.monotonic() + 300, f"calibrate rank {comm.rank}")
    return Endpoint(comm, waiter, PhaseClock("compute"))


def _plan(rounds: int, rank: int, dtype, overlap: bool = False):
    """`rounds` steps of one point each, the same count on every worker (a sync schedule;
    overlap: the next step computes while the exchange is in flight, as async's)."""
    X, y = np.zeros((rounds, 2), dtype), np.zeros(rounds, np.int64)
    return X, y, Schedule(batch=1, epochs=1, seed=(0, rank), lr=0.0, steps_per_epoch=rounds, overlap=overlap,
                          progress=overlap)


def _no_step(w, X, y, lr, dw, progress=None):
    return 0.0


def _step_of(work):
    """run_worker's step: the probe's work() (or nothing), Delta-w left as it is."""
    if work is None:
        return _no_step

    def step(w, X, y, lr, dw, progress=None):
        work(progress)
        return 0.0
    return step


def _async_rounds(comm, n_w: int, rounds: int, servers: int, work=None, dtype=np.float64) -> None:
    _ps_rounds(comm, n_w, rounds, servers, work, dtype, asynchronous=True)


def _ps_rounds(comm, n_w: int, rounds: int, servers: int, work=None, dtype=np.float64,
               asynchronous: bool = False) -> None:

    ep = _endpoint(comm)
    shards = shard_bounds(n_w, servers)
    comm.Barrier()
    if comm.rank < servers:
        lo, hi = shards[comm.rank]
        Server(ep, np.zeros(hi - lo, dtype), servers).serve(Async() if asynchronous else Sync())
    else:
        X, y, plan = _plan(rounds, comm.rank, dtype, overlap=asynchronous)
        link = PushPull(ep, shards, DenseLink(shards, np.zeros(n_w, dtype)))
        run_worker(link, X, y, _step_of(work), plan)


def _p2p_rounds(comm, n_w: int, rounds: int, servers: int, work=None, dtype=np.float64) -> None:

    ep = _endpoint(comm)
    N = comm.size
    shards = shard_bounds(n_w, N)
    lo, hi = shards[comm.rank]
    shard = np.zeros(hi - lo, dtype)
    rule = Sync()
    owner = Server(ep, shard, list(range(N)), messages=DenseShard(shard, N))
    link = peer_link(ep, shards, DenseLink(shards, np.zeros(n_w, dtype)), owner, rule, list(range(N)))
    X, y, plan = _plan(rounds, comm.rank, dtype)
    comm.Barrier()
    run_peer(link, owner, rule, X, y, _step_of(work), plan)


def _allreduce_rounds(algorithm: str):
    def rounds_of(comm, n_w: int, rounds: int, servers: int, work=None, dtype=np.float64) -> None:

        ep = _endpoint(comm)
        part, total = np.ones(n_w + 3, dtype), np.zeros(n_w + 3, dtype)
        summer = (Ring if algorithm == "ring" else MPIAllreduce)(ep, n_w + 3, dtype)
        comm.Barrier()
        for _ in range(rounds):
            if work:
                work()
            summer.sum(part, total)
    return rounds_of


def _replica_rounds(comm, batch: int, rounds: int, servers: int, work=None, dtype=np.float64) -> None:
    """One replica of all ranks summing batch x 2 logits."""
    ep = _endpoint(comm)
    Z = np.ones((batch, 2), dtype)
    replica = Replica(ep, comm)
    comm.Barrier()
    for _ in range(rounds):
        replica.sum(Z, 0, False)


def _mp_rounds(comm, batch: int, rounds: int, servers: int, work=None, dtype=np.float64) -> None:
    """Replicas of 2, each member its slice's 2-H-2 step with the replica's logit sum
    inside it (net.mlp.make_mp_step, the sum where asgd.train has it: between the forward
    and the backward), then, with an odd rank count, its slice's asynchronous push and
    pull to a server on rank 0 that holds both slices (asgd.train's default mode); with
    an even one, steps and sums only. A round: one member step."""
    ep = _endpoint(comm)
    sliced = mlp.Sliced(mlp.Layout(2, STEP_PROBE[0], 2), 2)
    odd = comm.size % 2
    group = comm.Split(MPI.UNDEFINED if odd and comm.rank == 0 else (comm.rank - odd) // 2, comm.rank)
    comm.Barrier()
    if group == MPI.COMM_NULL:      # the server: slice k's pushers are every replica's member k
        slices = [Server(ep, np.zeros(b - a, dtype), list(range(odd + k, comm.size, 2))) for k, (a, b) in
                  enumerate(sliced.bounds)]
        serve_all(slices, [Async() for _ in slices])
        return
    k = group.rank
    a, b = sliced.bounds[k]
    replica = Replica(ep, group)
    step = mlp.make_mp_step(sliced, k, batch, lambda Z: replica.sum(Z, 0, False), dtype)
    w = sliced.from_standard(mlp.init_params(sliced.layout, 0, dtype))[a:b].copy()
    ds = problem.rings(batch, comm.rank)
    Xs, ys = ds.X.astype(dtype), ds.y
    if odd:
        X, y, plan = _plan(rounds, comm.rank, dtype, overlap=True)
        link = PushPull(ep, [(0, b - a)], DenseLink([(0, b - a)], w), servers=[0])
        run_worker(link, X, y, lambda w_, X_, y_, lr, dw, progress=None: step(w_, Xs, ys, 1e-9, dw, progress),
                   plan)
    else:
        dw = np.zeros(b - a, dtype)
        for _ in range(rounds):
            step(w, Xs, ys, 1e-9, dw)
    group.Free()


_ROUNDS = {"ps": _ps_rounds, "async": _async_rounds, "p2p": _p2p_rounds, "ring": _allreduce_rounds("ring"),
           "mpi": _allreduce_rounds("mpi"), "replica": _replica_rounds,
           "replica" + STEP: _mp_rounds}   # its own step, the sum inside it: no work() before the round
