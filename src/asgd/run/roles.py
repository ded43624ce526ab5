"""What each rank does once init has made the model, by its role in the job's topology
(run.topology); each returns the rank's entry of results.json's `ranks`.

    serve    a parameter server: its shards of w (one, or with more model-parallel slices
             than servers a few), until every worker is done
    work     a worker: its share against the servers of its slice
    peer     --arch p2p: both at once, serving its own shard while it trains
    reduce   --arch allreduce: its share, summed with its slice's other ranks
    dry_run  --dry-run: what the loop would have returned having trained nothing

With --model-parallel K a worker is member k of a replica: it holds slice k of w only,
its step sums the partial logits with its replica's other members (protocol.replica),
and it learns the checkpoint cut and whether to stop from that sum, so that a replica's
K pushes are always one step.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..core.schedule import Schedule, effective_mode, lockstep, schedule
from ..core.worker import WorkerStats
from ..net import mlp, optimizers
from ..protocol.allreduce import run_allreduce
from ..protocol.context import Endpoint
from ..protocol.messages import link_messages, shard_messages
from ..protocol.p2p import peer_link, run_peer
from ..protocol.replica import Replica
from ..core.policy import policy
from ..core.target import PROBE_MARGIN, AfterExchange, target
from ..core.stats import ServerStats, merge_shards
from ..data.shares import worker_points
from ..protocol.server import Server, gather_shards, serve_all
from ..protocol.worker import PushPull, run_worker
from . import checkpoint, config, signals
from .deferred import Copies, expected_copies
from .job import Job, Model
from .progress import EpochTracker


# -- what the roles share ------------------------------------------------------------------

def tracker_of(job: Job, m: Model, w=None, publish=None) -> EpochTracker | None:
    """Epochs and progress lines on rank 0, which sees every update (the server of shard
    0, p2p's owner of it, or allreduce's rank 0); it evaluates after each epoch and at
    --eval-every's cadence (and checks the target) when it holds all of w (one server,
    allreduce without slices) or is given w() (a p2p worker's, at most one exchange
    old). publish(): brings m.w up to date before it is evaluated (a server's shards
    live in versions: protocol.messages)."""
    if job.rank != 0:
        return None
    cfg, topo = job.cfg, job.topo
    who = {"p2p": f"every rank a worker owning 1/{job.comm.size} of w",
           "allreduce": "every rank a worker holding all of w"}.get(cfg.arch,
                                                                     f"{job.servers} server(s), {job.workers} workers")
    if topo.K > 1:
        who += f" in {topo.replicas} replicas of {topo.K} (model-parallel)"
    job.say(f"asgd: {job.comm.size} ranks: {who} ({cfg.arch}, {effective_mode(cfg.arch, cfg.mode)}); "
            f"{m.n_train:,} training and {len(m.test):,} held-out points; "
            f"{m.layout.d_in}-{m.layout.d_hidden}-{m.layout.d_out} MLP, batch {cfg.batch}, lr {m.lr:g}, "
            f"{cfg.epochs} epochs")
    if m.first_epoch:
        job.say(f"resuming from {cfg.resume} after epoch {m.first_epoch}")
    whole = (cfg.arch == "allreduce" and topo.K == 1) or (cfg.arch == "ps" and set(topo.hosts) == {0})
    current = None   # all of w as rank 0 holds it now, in the layout's order
    if w is not None and topo.K == 1:
        current = w
    elif whole:
        def current():
            if publish:
                publish()
            return m.standard(m.w)

    def evaluate():
        now = current()
        tracker.evaluated_w = now.copy()   # the final metrics reuse this evaluation only for these weights
        return mlp.make_evaluate(m.layout, now, m.test)()

    together = lockstep(cfg.arch, cfg.mode)
    cadence = config.eval_cadence(cfg.eval_every)
    if current and cfg.eval_deferred:   # copies of w now, evaluated after training
        copies = Copies(expected_copies(cadence, cfg.epochs - m.first_epoch, m.n_train,
                                        cfg.batch * (job.workers if together else 1)), m.layout.n_w, m.w.dtype)

        def deferred():
            return mlp.make_evaluate(m.layout, copies.take(current()), m.test)
    tracker = EpochTracker(m.n_train, cfg.epochs, evaluate if current else None, job.say, cfg.progress, job.clock,
                           history=list(m.resumed.get("history", [])), epoch=m.first_epoch,
                           samples=m.first_epoch * m.n_train, step_losses=[] if together else None,
                           target=target(cfg.target_accuracy, cfg.target_loss),
                           cadence=cadence,
                           eval_cost_s=evaluation_cost(m) if current else 0.0,
                           after_exchange=AfterExchange() if w is not None and topo.K == 1 else None,
                           deferred=deferred if current and cfg.eval_deferred else None)
    return tracker


EVAL_PROBE = 256    # held-out points timed before training (evaluation_cost)


def evaluation_cost(m: Model) -> float:
    """Seconds one evaluation of the whole held-out set may take, timed on its first
    EVAL_PROBE points with the initial w before training: --eval-every auto's first
    evaluation waits until the training time pays for that, as later ones do for the one
    before (measured). The faster of two calls (the first pays for numba's dispatch and
    cold caches: twice the next on 2-10K-2), times PROBE_MARGIN: during training the
    evaluation shares its core with the workers. Measured here, 2026-11-28 (2-10K-2,
    default run, 2 cores at a load of 15): the first evaluation took 1.5-2.4 times the
    probe's estimate."""
    k = min(EVAL_PROBE, len(m.test))
    if not k:
        return 0.0
    probe = dataclasses.replace(m.test, X=m.test.X[:k], y=m.test.y[:k])
    evaluate, took = mlp.make_evaluate(m.layout, m.standard(m.w), probe), []
    for _ in range(2):
        start = time.perf_counter()
        evaluate()
        took.append(time.perf_counter() - start)
    return PROBE_MARGIN * min(took) * len(m.test) / k


def state_of(job: Job, m: Model, index: int, count: int, lo: int, hi: int, w: np.ndarray):
    """The optimizer for w[lo:hi] (a shard, or a slice, or all of w), restored when
    resuming, and its checkpoints (file `index` of `count`; rank 0's with the progress)."""
    opt = optimizers.Optimizer(job.cfg.optimizer, m.lr, hi - lo, dtype=w.dtype)
    if m.saved_optimizer:   # full-length arrays: this shard's part, whatever shards the run had
        opt.load({k: (v[lo:hi] if v.ndim else v) for k, v in m.saved_optimizer.items()})
    tracker = job.tracker
    progress = ((lambda: {"epoch": tracker.epoch, "samples": tracker.samples, "history": tracker.history})
                if tracker and index == 0 else dict)
    ckpt = checkpoint.Checkpointing(job.out, index, count, (lo, hi), m.layout.n_w, w,
                                    config.checkpoint_every(job.cfg.checkpoint_every), progress,
                                    state=opt.save, optimizer=opt.name, model_parallel=job.topo.K)
    return opt, ckpt


def on_version_of(job: Job, ckpt: checkpoint.Checkpointing | None = None, cuts_done: int = 0):
    """What a new version of w (or of a shard) does: rank 0's progress; with `ckpt`
    (allreduce's ranks, which checkpoint by their own count) a checkpoint when one is
    due, after the progress, so a checkpoint's progress matches its weights. (Servers
    checkpoint at the cuts they agree on: asgd.core.shard.) It returns True once rank 0's
    held-out evaluation reached the target: the run is done."""
    tracker = job.tracker

    def on_version(rounds: int, loss_sum: float, samples: float) -> bool:
        done = tracker.add(loss_sum, samples) if tracker else False   # True: the target is reached
        if ckpt and ckpt.due(rounds):
            ckpt.save(rounds, cut=cuts_done + rounds)
        return done
    return on_version


def schedule_of(job: Job, m: Model) -> Schedule:
    """My mini-batches: my replica's (one worker's without slices); sync and allreduce
    take the same number of steps on every worker (the largest share's), async and ssp
    their own share's."""
    cfg, topo = job.cfg, job.topo
    return schedule(cfg.arch, cfg.mode, cfg.overlap, cfg.batch, cfg.epochs, m.n_train, topo.replicas,
                    (cfg.seed, topo.replica(job.rank)), optimizers.worker_lr(cfg.optimizer, m.lr),
                    first_epoch=m.first_epoch, progress=cfg.mpi_progress == "step",
                    open_ended=cfg.backup_workers > 0)


def my_w(job: Job, m: Model) -> np.ndarray:
    """The part of w this worker trains: all of it, or (model-parallel) its slice, a copy."""
    if job.topo.K == 1:
        return m.w
    a, b = job.topo.slices[job.topo.member(job.rank)]
    return m.w[a:b].copy()


def drop_w(job: Job, m: Model) -> None:
    """Once a rank's role holds what it needs (its own copies), it lets all of w go:
    only rank 0 keeps it, to evaluate and save. A server then holds its shards, a
    model-parallel worker its slice (results.json's weight_bytes)."""
    if job.rank != 0:
        m.w = None


def step_of(job: Job, m: Model, replica: Replica | None, cut=lambda: 0, link=None):
    """My training step: the whole model's, or (a replica's member) my slice's, which sums
    the partial logits with the replica, agreeing on the cut (member 0's: cut()) and on
    stopping (any member's signal, or what its link's servers said: asked, or done)."""
    if replica is None:
        return mlp.make_step(m.layout, job.cfg.batch, job.cfg.precision)
    clock = job.clock

    def sum_logits(Z):
        clock.switch("replica_sum")
        replica.sum(Z, cut(), signals.requested() is not None or (link is not None and link.asked_to_stop),
                    link is not None and link.heard_stop)
        clock.switch("compute")
    return mlp.make_mp_step(m.sliced, job.topo.member(job.rank), job.cfg.batch, sum_logits, job.cfg.precision)


def member_endpoint(job: Job, replica: Replica | None, comm=None) -> Endpoint:
    """The endpoint a worker's loop runs with (on `comm`, default the job's): a replica's
    member is asked to stop when its replica agreed it was, never alone (a run done,
    its link's stop_source says)."""
    ep = job.endpoint
    if comm is not None:
        ep = Endpoint(comm, ep.waiter, ep.clock, ep.stop_requested)
    if replica is not None:
        ep = Endpoint(ep.comm, ep.waiter, ep.clock, lambda: replica.asked)
    return ep


def replica_of(job: Job, background=None) -> Replica | None:
    return Replica(job.endpoint, job.replica_comm, background) if job.topo.K > 1 else None


def merge_records(worked: dict, served: dict) -> dict:
    """A p2p rank's results.json entry: its worker's counts and its owner's, bytes added."""
    return {**served, **{k: v for k, v in worked.items() if k not in ("bytes_sent", "bytes_recv", "refused")},
            "role": "peer", "updates": worked["updates"], "rounds": served["rounds"],
            "bytes_sent": worked["bytes_sent"] + served["bytes_sent"],
            "bytes_recv": worked["bytes_recv"] + served["bytes_recv"],
            "weight_bytes": worked.get("weight_bytes", 0) + served.get("weight_bytes", 0),
            "stopped": worked["stopped"] or served["stopped"]}


def servers_of(job: Job, m: Model, shards: list[int], on_version) -> tuple[list[Server], list]:
    """A Server (and its checkpoints) for each of my shards; the one of shard 0 leads the
    checkpoint cuts and reports the progress."""
    topo, cfg = job.topo, job.cfg
    made, ckpts = [], []

    def lost(rank, pushed):   # shard 0's dead worker, priced at its share as the readers dealt it
        job.tracker.lose(pushed, worker_points(m.n_train, topo.replicas, topo.replica(rank)))
    for v in shards:
        lo, hi = topo.shards[v]
        w = m.w[lo:hi] if job.rank == 0 else m.w[lo:hi].copy()   # rank 0's: views of all of w
        opt, ckpt = state_of(job, m, v, len(topo.shards), lo, hi, w)
        workers = topo.pushers(v)
        msgs = shard_messages(cfg.compress, m.columns(), (lo, hi), w, len(workers))
        made.append(Server(job.endpoint, w, workers, opt, msgs, on_version if v == 0 else None, ckpt,
                           leader=v == 0, fault_tolerant=cfg.fault_tolerant,
                           on_lost=lost if job.tracker and v == 0 else None,
                           cuts_done=m.resumed.get("cut", 0), stale_step=optimizers.stale_step(cfg.stale_step)))
        ckpts.append(ckpt)
    return made, ckpts


def final_cuts(job: Job, servers: list[Server], stats: list[ServerStats], ckpts: list) -> None:
    """After training every shard has taken every push: one more cut, as asked (and
    always when stopped early)."""
    for st, ckpt in zip(stats, ckpts):
        if job.cfg.checkpoint_every or st.stopped:
            ckpt.save(st.rounds, cut=st.cuts + 1)


# -- the roles ----------------------------------------------------------------------------

def serve(job: Job, m: Model) -> dict:
    """Serve my shards of w (views: rank 0's w stays whole) until every worker is done;
    then rank 0 gathers all of w."""
    cfg, topo = job.cfg, job.topo
    job.tracker = tracker_of(job, m, publish=lambda: [srv.publish() for srv in servers])
    mine = topo.shards_of(job.rank)
    servers, ckpts = servers_of(job, m, mine, on_version_of(job))
    if job.tracker and cfg.lr_guard and len(topo.shards) == 1:   # one server holds every update's step
        job.tracker.guard = servers[0].shard.halve_step
    if job.tracker and cfg.backup_workers:   # workers train until the epochs' samples are applied
        servers[0].shard.goal = lambda: job.tracker.epoch >= job.tracker.epochs
    drop_w(job, m)
    stats = serve_all(servers, [policy(cfg.mode, cfg.staleness, cfg.backup_workers) for _ in servers])
    if job.tracker:
        job.tracker.close()   # with workers lost, the epoch they cut short ends here
    final_cuts(job, servers, stats, ckpts)
    job.count("finish", *gather_shards(job.endpoint, m.w, topo.shards, topo.hosts,
                                       {v: srv.w for v, srv in zip(mine, servers)}))
    return merge_shards([srv.record(topo.shards[v]) for v, srv in zip(mine, servers)])


def work(job: Job, m: Model) -> dict:
    """Train my share (my replica's, on my slice) against my slice's servers."""
    cfg, topo = job.cfg, job.topo
    w = my_w(job, m)
    hosts, shards = topo.link(job.rank)
    replica = replica_of(job)
    link = PushPull(member_endpoint(job, replica), shards,
                    link_messages(cfg.compress, m.columns(topo.member(job.rank) if topo.K > 1 else None), shards, w),
                    servers=hosts)
    if replica is not None:
        link.cut_source, link.stop_source = (lambda: replica.cut), (lambda: replica.stop)
    step = step_of(job, m, replica, cut=lambda: link.cut, link=link)
    weights = link.msgs.nbytes
    del w
    drop_w(job, m)
    rec = run_worker(link, m.train.X, m.train.y, step, schedule_of(job, m)).record()
    if replica is not None:
        job.count("train", *replica.bytes)
    return {**rec, "weight_bytes": weights}


def peer(job: Job, m: Model) -> dict:
    """--arch p2p: train my share against the owners of my slice (myself, maybe, among
    them) while serving my own shard of w, then serve it until every rank is done; rank 0
    gathers all of w."""
    cfg, topo = job.cfg, job.topo
    job.tracker = tracker_of(job, m, w=lambda: link.w)   # evaluates my worker's w (link: below)
    rule = policy(cfg.mode, cfg.staleness)
    mine = topo.shards_of(job.rank)
    (owner,), ckpts = servers_of(job, m, mine, on_version_of(job))
    w = my_w(job, m) if topo.K > 1 else m.w
    hosts, shards = topo.link(job.rank)
    replica = replica_of(job, background=lambda: owner.poll(rule))
    msgs = link_messages(cfg.compress, m.columns(topo.member(job.rank) if topo.K > 1 else None), shards, w)
    link = peer_link(member_endpoint(job, replica), shards, msgs, owner, rule, hosts)
    if replica is not None:
        link.cut_source, link.stop_source = (lambda: replica.cut), (lambda: replica.stop)
    if job.tracker and job.tracker.after_exchange:   # evaluations wait for my w to be fresh
        link.exchanged = job.tracker.exchanged
    step = step_of(job, m, replica, cut=lambda: link.cut, link=link)
    weights = msgs.nbytes
    del w
    drop_w(job, m)
    worked, served = run_peer(link, owner, rule, m.train.X, m.train.y, step, schedule_of(job, m))
    final_cuts(job, [owner], [served], ckpts)
    if replica is not None:
        job.count("train", *replica.bytes)
    job.count("finish", *gather_shards(job.endpoint, m.w, topo.shards, topo.hosts, {mine[0]: owner.w}))
    return merge_records({**worked.record(), "weight_bytes": weights}, owner.record(topo.shards[mine[0]]))


def reduce(job: Job, m: Model) -> dict:
    """--arch allreduce: train my share, summing each step's update with every rank that
    holds my slice (every rank, without slices); every rank applies the same update."""
    cfg, topo = job.cfg, job.topo
    job.tracker = tracker_of(job, m)
    k = topo.member(job.rank)
    w = my_w(job, m)
    a, b = topo.slices[k]
    if topo.K > 1:
        drop_w(job, m)
    replica = replica_of(job)
    # every rank applies the same updates: each slice's first replica checkpoints it
    opt, ckpt = state_of(job, m, k, topo.K, a, b, w)
    keeper = topo.replica(job.rank) == 0
    step = step_of(job, m, replica)
    ep = member_endpoint(job, replica, job.slice_comm)
    cuts_done = m.resumed.get("cut", 0)
    st = run_allreduce(ep, w, m.train.X, m.train.y, step, opt, schedule_of(job, m),
                       on_version_of(job, ckpt if keeper else None, cuts_done), cfg.allreduce)
    if keeper and (cfg.checkpoint_every or st.stopped):
        ckpt.save(st.updates, cut=cuts_done + st.updates + 1)
    if replica is not None:
        job.count("train", *replica.bytes)
        # rank 0 gathers the slices from its replica's members
        if job.rank == 0:
            m.w[a:b] = w
        job.count("finish", *gather_shards(job.endpoint, m.w, list(topo.slices), list(range(topo.K)),
                                           {k: w} if keeper else {}))
    return {**st.record(), "weight_bytes": w.nbytes + opt.nbytes + 2 * (w.nbytes + 3 * w.itemsize)}


def dry_run(job: Job, m: Model) -> dict:
    """--dry-run: what the loop would have returned had it trained nothing."""
    topo = job.topo
    if job.rank == 0:
        job.tracker = tracker_of(job, m)
    mine = topo.shards_of(job.rank)
    served = [{**ServerStats(staleness=[[] for _ in topo.pushers(v)], step_gap=[[] for _ in topo.pushers(v)])
               .record(topo.shards[v], topo.pushers(v)), "weight_bytes": 0} for v in mine]
    if job.role == "server":
        return merge_shards(served)
    worked = {**WorkerStats().record(), "weight_bytes": 0}
    return merge_records(worked, served[0]) if job.role == "peer" else worked
