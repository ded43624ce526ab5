"""mpiexec -n N python -m asgd.train [options]: the whole run, top to bottom.

    options -> init: each rank loads its role's kernels, then its share of the data and
               the model; bad input is agreed on by every rank and reported once
            -> the loop: servers serve their shards of w, workers push Delta-w and pull
               w' (or, with --arch allreduce, every rank is a worker)
            -> save: rank 0 gathers every rank's record and writes results.json,
               weights.npy and the summary
(--dry-run: init, then save without the loop: the options, the data and the output
folder checked, start-up's time and traffic measured, nothing trained.)

Past the options, a failure that is not agreed on (a bug, out of memory, a stall, a
dead peer) ends the whole job (MPI_Abort) with one line naming the rank, its role and
the cause: a rank that failed alone cannot be waited for.
"""

from __future__ import annotations

import time

T0_NS = time.perf_counter_ns()  # init starts when the process does: imports and JIT count

import math  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from . import BadInput  # noqa: E402
from .data import shares  # noqa: E402
from .data.formats import DataError, Dataset  # noqa: E402
from .data import standardize  # noqa: E402
from .mpiutil import (Waiter, agree, agree_on, clock_bytes, clock_offsets, describe, gather_objects,  # noqa: E402
                      oversubscribed)
from .net import mlp, optimizers  # noqa: E402
from .protocol.allreduce import run_allreduce  # noqa: E402
from .protocol.context import Endpoint, Schedule  # noqa: E402
from .protocol.messages import link_messages, shard_messages  # noqa: E402
from .protocol.server import Server, gather_shards, policy  # noqa: E402
from .protocol.worker import PushPull, run_worker  # noqa: E402
from .run import checkpoint, config, folder, results, signals, startup  # noqa: E402
from .run.progress import EpochTracker, convergence_notes  # noqa: E402
from .run.trace import PhaseClock, TraceClock  # noqa: E402
from .run.trace import export as export_trace  # noqa: E402
from .protocol.context import WorkerStats  # noqa: E402
from .protocol.server import ServerStats  # noqa: E402
from .wire import TAG_RECORD, shard_bounds  # noqa: E402

ABORT_GRACE_S = 0.5   # a failing rank's wait between its one line and MPI_Abort


class Agreed(BadInput):
    """A failure every rank learned of at the same point: reported once, by rank 0."""


@dataclass
class Job:
    """The run's shape, the same on every rank."""
    cfg: config.Config
    comm: MPI.Comm
    servers: int      # ranks 0..servers-1 serve (0: allreduce, every rank a worker)
    out: str          # the run folder
    waiter: Waiter
    clock: PhaseClock
    crowded: bool     # more ranks than cores on this node
    tracker: EpochTracker | None = None  # rank 0's epochs and progress, once the loop starts
    traffic: dict = field(default_factory=lambda: {k: {"sent": 0, "recv": 0} for k in ("init", "train", "finish")})
                      # bytes of asgd's own messages by part of the run (results.json's per-rank `bytes`)

    def count(self, part: str, sent: int, recv: int) -> None:
        self.traffic[part]["sent"] += int(sent)
        self.traffic[part]["recv"] += int(recv)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def endpoint(self) -> Endpoint:
        """What the protocol's loops need of this rank."""
        return Endpoint(self.comm, self.waiter, self.clock, lambda: signals.requested() is not None)

    @property
    def role(self) -> str:
        return "server" if self.rank < self.servers else "worker"

    @property
    def workers(self) -> int:
        return self.comm.size - self.servers

    def say(self, line: str) -> None:
        """A progress line, from rank 0 only."""
        if self.rank == 0 and not self.cfg.quiet:
            print(line, flush=True)


@dataclass
class Model:
    """What init made: this rank's data, the weights, and where training starts."""
    train: Dataset           # this rank's share (servers: none)
    test: Dataset | None     # the held-out set (rank 0)
    n_train: int             # all workers' training points together
    read_times: dict         # init's read / parse / shuffle seconds
    layout: mlp.Layout
    w: np.ndarray            # all of w (a server serves its shard, a view of it)
    lr: float                # the optimizer's (sgd: the workers' step's)
    resumed: dict            # the checkpoint's progress, or {}
    saved_optimizer: list    # each shard's optimizer state from the checkpoint, or []
    scaling: tuple | None    # --standardize: (mean, std) of every feature
    init_end_ns: int = 0

    @property
    def first_epoch(self) -> int:
        return self.resumed.get("epoch", 0)


def main(argv: list[str] | None = None) -> int:
    comm = MPI.COMM_WORLD
    try:
        cfg = config.parse(argv, comm.size, quiet_help=comm.rank != 0)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except config.ConfigError as e:
        if comm.rank == 0:
            print(f"asgd.train: error: {e} (see --help)", file=sys.stderr)
        return 2
    signals.install()  # SIGTERM/SIGINT: stop at a step boundary, checkpoint, exit cleanly
    servers = 0 if cfg.arch == "allreduce" else cfg.servers
    role = "server" if comm.rank < servers else "worker"
    clock = (TraceClock("init", T0_NS, config.trace_window(cfg.trace_steps)) if cfg.trace
             else PhaseClock("init", T0_NS))
    crowded = oversubscribed(comm)
    waiter = Waiter(crowded, time.monotonic() + cfg.timeout if cfg.timeout else 0.0,
                    f"rank {comm.rank} ({role})", cfg.stall_timeout)
    resumed_in = None if cfg.dry_run else cfg.resume   # a dry run never writes into the run it checks
    out = cfg.out or resumed_in or comm.bcast(config.default_out(comm.size) if comm.rank == 0 else None)
    job = Job(cfg, comm, servers, out, waiter, clock, crowded)
    try:
        model = init(job)
        if cfg.dry_run:
            record = dry_run(job, model)
        else:
            record = serve(job, model) if job.role == "server" else work(job, model)
        save(job, model, record)
        return 0
    except (Agreed, DataError) as e:  # raised on every rank alike
        if comm.rank == 0:
            print(f"asgd.train: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        why = describe(e, f"rank {comm.rank} ({role})")
        if isinstance(e, MPI.Exception):  # e.g. a peer killed mid-exchange, seen here before the launcher
            why = (f"rank {comm.rank} ({role}): MPI communication failed; another rank probably died or "
                   f"was killed (MPI: {str(e).split(',')[0]})")
        print(f"asgd.train: {why}", file=sys.stderr, flush=True)
        if os.environ.get("ASGD_DEBUG"):
            traceback.print_exc()
        # The line sits in the pipe to the launcher's proxy; an abort it sees first kills
        # the job before forwarding it (Hydra lost it 1 run in 15): give it a moment.
        time.sleep(ABORT_GRACE_S)
        comm.Abort(1)
        return 1


# -- init ----------------------------------------------------------------------------

def init(job: Job) -> Model:
    """Load this role's kernels, then the data, then the model. Bad input raises the same
    DataError or Agreed on every rank; any other failure is this rank's alone."""
    cfg, comm, waiter = job.cfg, job.comm, job.waiter
    allreduce = cfg.arch == "allreduce"
    reads_file = cfg.data is not None
    compress = cfg.compress != "none"
    mine = startup.loads(job.role, job.rank, reads_file, allreduce, cfg.optimizer, compress)
    error = startup.warm_up(comm, waiter, mine, startup.node_loads(reads_file, allreduce, cfg.optimizer, compress))
    agree_on(comm, waiter, error, "the other ranks to load their kernels", Agreed)

    got = load_data(job)  # collective; a bad file raises the same DataError on every rank
    job.count("init", got.traffic["sent"], got.traffic["recv"])
    scaling = None
    if cfg.standardize:  # collective: the statistics of the workers' shares together
        scaling = standardize.statistics(comm, waiter, got.train.X)
        for data in (got.train, got.test):
            if data is not None:
                standardize.apply(data.X, *scaling)
    made = {}

    def local():  # no MPI in here: it may fail on some ranks only, and is agreed on
        layout = mlp.Layout(got.train.features, cfg.hidden, got.train.classes)
        averaged = job.workers if allreduce or cfg.mode == "sync" else 1
        w, resumed, saved = mlp.init_params(layout, cfg.seed), {}, []
        if cfg.resume:  # every rank reads every shard: workers need all of w too
            w, resumed, saved = checkpoint.load(cfg.resume, max(job.servers, 1), layout.n_w, cfg.optimizer)
            if resumed.get("epoch", 0) >= cfg.epochs:
                raise checkpoint.CheckpointError(f"{cfg.resume}: its checkpoint has {resumed['epoch']} "
                                                 f"epochs done; ask for more with --epochs")
        if job.rank == 0:
            _check_writable(job.out)
        lr = cfg.lr or optimizers.default_lr(cfg.optimizer, cfg.hidden, averaged)
        made["model"] = Model(got.train, got.test, got.train_points, got.times, layout, w, lr, resumed,
                              saved, scaling)
    agree(comm, waiter, local, "the other ranks to finish start-up", Agreed)
    model = made["model"]
    model.init_end_ns = time.perf_counter_ns()
    return model


def load_data(job: Job) -> shares.Loaded:
    """This rank's share of the training points (servers: none) and, on rank 0, the
    held-out set, read by --reader; the embedded problem is generated, not read."""
    cfg = job.cfg
    which = shares.Job(job.servers, cfg.seed, cfg.classes)
    if cfg.data is None:
        return shares.embedded(job.rank, job.comm.size, which)
    from .data import readers  # the parsers: only a run with a file imports them
    return readers.load(job.comm, job.waiter, cfg.data, cfg.test, cfg.reader, which)


def _check_writable(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".asgd-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise config.ConfigError(f"cannot write to output folder {out}: {e.strerror}") from None


# -- the loop ------------------------------------------------------------------------

def tracker_of(job: Job, m: Model) -> EpochTracker | None:
    """Epochs and progress lines on rank 0, which sees every update (server 0, or
    allreduce's rank 0); it evaluates after each epoch when it holds all of w."""
    if job.rank != 0:
        return None
    cfg = job.cfg
    job.say(f"asgd: {job.comm.size} ranks: {job.servers} server(s), {job.workers} workers ({cfg.arch}, "
            f"{cfg.mode}); {m.n_train:,} training and {len(m.test):,} held-out points; "
            f"{m.layout.d_in}-{m.layout.d_hidden}-{m.layout.d_out} MLP, batch {cfg.batch}, lr {m.lr:g}, "
            f"{cfg.epochs} epochs")
    if m.first_epoch:
        job.say(f"resuming from {cfg.resume} after epoch {m.first_epoch}")
    evaluate = mlp.make_evaluate(m.layout, m.w, m.test) if job.servers <= 1 else None  # needs all of w
    return EpochTracker(m.n_train, cfg.epochs, evaluate, job.say, cfg.progress, job.clock,
                        history=list(m.resumed.get("history", [])), epoch=m.first_epoch,
                        samples=m.first_epoch * m.n_train)


def optimizer_of(job: Job, m: Model) -> tuple[optimizers.Optimizer, checkpoint.Checkpointing]:
    """A server's optimizer for its shard (allreduce's ranks: for all of w), restored from
    the checkpoint when resuming, and its checkpoints: the shard, the optimizer's state
    and, on rank 0, the progress."""
    n = max(job.servers, 1)
    lo, hi = shard_bounds(m.layout.n_w, n)[job.rank if job.servers else 0]
    opt = optimizers.Optimizer(job.cfg.optimizer, m.lr, hi - lo)
    if m.saved_optimizer:
        opt.load(m.saved_optimizer[job.rank if job.servers else 0])
    tracker = job.tracker
    progress = (lambda: {"epoch": tracker.epoch, "samples": tracker.samples,
                         "history": tracker.history}) if tracker else dict
    ckpt = checkpoint.Checkpointing(job.out, job.rank, n, (lo, hi), m.layout.n_w, m.w[lo:hi],
                                    config.checkpoint_every(job.cfg.checkpoint_every), progress,
                                    state=opt.save, optimizer=opt.name)
    return opt, ckpt


def on_version_of(job: Job, ckpt: checkpoint.Checkpointing | None):
    """What a new version of w (or of a shard) does: rank 0's progress, then a checkpoint
    if one is due (after the progress, so a checkpoint's progress matches its weights)."""
    tracker = job.tracker

    def on_version(rounds: int, loss_sum: float, samples: float) -> None:
        if tracker:
            tracker.add(loss_sum, samples)
        if ckpt:
            ckpt.maybe(rounds)
    return on_version


def schedule_of(job: Job, m: Model, worker_index: int) -> Schedule:
    """The mini-batches of worker `worker_index`: sync and allreduce take the same number
    of steps on every worker (the largest share's), async and ssp their own share's."""
    cfg = job.cfg
    lockstep = cfg.mode == "sync" or not job.servers
    steps = math.ceil(math.ceil(m.n_train / job.workers) / cfg.batch)  # per epoch of the largest share
    return Schedule(cfg.batch, cfg.epochs, (cfg.seed, worker_index), optimizers.worker_lr(cfg.optimizer, m.lr),
                    first_epoch=m.first_epoch, steps_per_epoch=steps if lockstep else None,
                    overlap=not lockstep, progress=cfg.mpi_progress == "step")


def serve(job: Job, m: Model) -> dict:
    """Serve my shard of w (a view: rank 0's w stays whole) until every worker is done;
    checkpoint as asked (and always when stopped early); then rank 0 gathers all of w."""
    job.tracker = tracker_of(job, m)
    opt, ckpt = optimizer_of(job, m)
    lo, hi = ckpt.shard
    ep = job.endpoint
    msgs = shard_messages(job.cfg.compress, m.layout, (lo, hi), m.w[lo:hi], job.workers)
    st = Server(ep, m.w[lo:hi], job.servers, opt, msgs, on_version_of(job, ckpt)).serve(
        policy(job.cfg.mode, job.cfg.staleness))
    if job.cfg.checkpoint_every or st.stopped:
        ckpt.save(st.rounds)
    job.count("finish", *gather_shards(ep, m.w, job.servers))
    return st.record((lo, hi))


def work(job: Job, m: Model) -> dict:
    """Train my share: against the servers, or (allreduce) with every other rank."""
    S = job.servers
    step = mlp.make_step(m.layout, job.cfg.batch)
    plan = schedule_of(job, m, job.rank - S)
    if S:
        job.tracker = None
        shards = shard_bounds(m.layout.n_w, S)
        link = PushPull(job.endpoint, shards, link_messages(job.cfg.compress, m.layout, shards, m.w))
        return run_worker(link, m.train.X, m.train.y, step, plan).record()
    job.tracker = tracker_of(job, m)
    opt, ckpt = optimizer_of(job, m)  # every rank applies the same updates; rank 0 checkpoints them
    st = run_allreduce(job.endpoint, m.w, m.train.X, m.train.y, step, opt, plan,
                       on_version_of(job, ckpt if job.rank == 0 else None), job.cfg.allreduce)
    if job.rank == 0 and (job.cfg.checkpoint_every or st.stopped):
        ckpt.save(st.updates)
    return st.record()


def dry_run(job: Job, m: Model) -> dict:
    """--dry-run: what the loop would have returned had it trained nothing."""
    if job.role == "server":
        lo, hi = shard_bounds(m.layout.n_w, job.servers)[job.rank]
        job.tracker = tracker_of(job, m)
        return ServerStats(staleness=[[] for _ in range(job.workers)],
                           step_gap=[[] for _ in range(job.workers)]).record((lo, hi))
    if not job.servers:
        job.tracker = tracker_of(job, m)
    return WorkerStats().record()


# -- save ------------------------------------------------------------------------------

def save(job: Job, m: Model, record: dict) -> None:
    """Every rank's record to rank 0, which writes the weights, results.json (its final
    metrics are those of the weights saved), the trace and the summary. Every byte of
    asgd's own messages is in the records (`bytes`), the gather's own included."""
    comm, clock, cfg = job.comm, job.clock, job.cfg
    end_ns = clock.switch("idle")
    job.waiter.barrier(comm, "the other ranks to finish")
    job.count("train", record.pop("bytes_sent"), record.pop("bytes_recv"))
    job.count("finish", *clock_bytes(job.rank, comm.size))
    record.update(rank=job.rank, host=socket.gethostname(),
                  phases={**clock.seconds(), **m.read_times},  # + init's read/parse/shuffle
                  clock_ns=(T0_NS, m.init_end_ns, end_ns), bytes=job.traffic)
    offsets = clock_offsets(comm, job.waiter)
    gathered, sent = gather_objects(comm, job.waiter, (record, clock.events() if cfg.trace else None), TAG_RECORD)
    if job.rank != 0:
        return
    records, events = [g[0] for g in gathered], [g[1] for g in gathered]
    for r, nbytes in zip(records, sent):   # the gather's own bytes: each rank's pickle, rank 0's receipt
        r["bytes"]["finish"]["sent"] += nbytes
        records[0]["bytes"]["finish"]["recv"] += nbytes
    for r in records:
        r["bytes_sent"] = sum(b["sent"] for b in r["bytes"].values())
        r["bytes_recv"] = sum(b["recv"] for b in r["bytes"].values())
    wall = clock.elapsed()
    zero = min(r["clock_ns"][0] + off for r, off in zip(records, offsets))  # the first rank's start
    for r, off in zip(records, offsets):
        r["timeline"] = {k: (t + off - zero) / 1e9 for k, t in zip(("start", "init_end", "end"), r.pop("clock_ns"))}
    if cfg.trace:
        path = os.path.join(job.out, "trace.json")
        info = export_trace(path, events, [f"{r['role']} {r['rank']}" for r in records], offsets, zero)
        job.say(f"trace: {path} ({info['events']:,} events, {info['flows']:,} message arrows, "
                f"{info['dropped']:,} dropped)")
    tracker = job.tracker
    loss, accuracy = (None, None) if cfg.dry_run else tracker.final_metrics(mlp.make_evaluate(m.layout, m.w, m.test))
    stopped = any(r.get("stopped") for r in records)
    res = results.build(
        config={**cfg.to_dict(), "out": job.out, "lr": m.lr, "servers": job.servers, "workers": job.workers,
                "worker_lr": optimizers.worker_lr(cfg.optimizer, m.lr),
                "features": m.layout.d_in, "classes": m.layout.d_out, "n_w": m.layout.n_w,
                "train_points": m.n_train, "test_points": len(m.test)},
        ranks=records, wall_s=wall, meta=results.machine(comm, job.crowded),
        server={"updates": records[0]["rounds"] if job.servers else records[0]["updates"],
                "samples": tracker.samples, "history": tracker.history, "loss": loss, "accuracy": accuracy})
    res["stopped"] = (signals.requested() or "a stop request") if stopped else None
    res["dry_run"] = cfg.dry_run
    if m.scaling:
        res["standardize"] = {"mean": m.scaling[0].tolist(), "std": m.scaling[1].tolist()}
    path = os.path.join(job.out, "results.json")
    if cfg.dry_run:
        results.write(path, res)
        print(f"asgd.train: dry run: {comm.size} ranks started, {m.n_train:,} training and {len(m.test):,} "
              f"held-out points read, the {m.layout.d_in}-{m.layout.d_hidden}-{m.layout.d_out} MLP built in "
              f"{res['init_s']:.2f} s; nothing trained. results: {path}", flush=True)
        return
    if m.scaling:
        folder.write_scaling(job.out, *m.scaling)
    res["notes"] = convergence_notes(tracker.history, sum(r.get("refused", 0) for r in records))
    folder.write_weights(job.out, m.w)
    results.write(path, res)
    print(results.summary(res, path), flush=True)
    for note in res["notes"]:
        print(f"asgd.train: note: {note}", flush=True)
    if stopped:
        print(f"asgd.train: stopped early by {res['stopped']} after epoch {tracker.epoch} "
              f"({tracker.samples:,} samples); checkpoint in {checkpoint.folder(job.out)}; "
              f"continue with --resume {job.out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
