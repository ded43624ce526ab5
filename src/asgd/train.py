"""mpiexec -n N python -m asgd.train [options]: the whole run, top to bottom.

    options -> init: each rank loads its role's kernels, then its share of the data and
               the model; bad input is agreed on by every rank and reported once
            -> the loop: servers serve their shards of w, workers push Delta-w and pull
               w' (--arch p2p: every rank both, owning 1/N of w; --arch allreduce:
               every rank a worker, summing with the others)
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

import dataclasses
import json
import os
import socket
import sys
import traceback

import numpy as np
from mpi4py import MPI

from . import BadInput
from .data import shares
from .data.formats import DataError, Dataset, test_path
from .data import standardize
from .data.dialect import delimiter_option, index_notes
from .data.labels import notes as label_notes
from .mpiutil import (Waiter, agree, agree_on, clock_bytes, clock_offsets, describe,
                      end_fault_tolerant_job, gather_objects, leave_without_finalize,
                      oversubscribed, ulfm_missing)
from .net import mlp, optimizers
from .run import checkpoint, config, folder, results, roles, signals, startup
from .run.job import Job, Model
from .run.progress import RunFacts, convergence_notes
from .core.schedule import lockstep
from .core.topology import Topology
from .run.trace import PhaseClock, TraceClock
from .run.trace import export as export_trace
from .mpienv import RESTARTS_ENV
from .core.wire import TAG_RECORD, TAG_SHARE

ABORT_GRACE_S = 0.5   # a failing rank's wait between its one line and MPI_Abort


class Agreed(BadInput):
    """A failure every rank learned of at the same point: reported once, by rank 0."""


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
    if cfg.fault_tolerant and (why := ulfm_missing()):
        if comm.rank == 0:
            print(f"asgd.train: error: {why}", file=sys.stderr)
        return 2
    signals.install()  # SIGTERM/SIGINT: stop at a step boundary, checkpoint, exit cleanly
    servers = cfg.servers if cfg.arch == "ps" else 0
    role = "peer" if cfg.arch == "p2p" else "server" if comm.rank < servers else "worker"
    clock = (TraceClock("init", T0_NS, config.trace_window(cfg.trace_steps)) if cfg.trace
             else PhaseClock("init", T0_NS))
    crowded = oversubscribed(comm)   # ranks per core, 0.0: each has one
    waiter = Waiter(crowded, time.monotonic() + cfg.timeout if cfg.timeout else 0.0,
                    f"rank {comm.rank} ({role})", cfg.stall_timeout)
    resumed_in = None if cfg.dry_run else cfg.resume   # a dry run never writes into the run it checks
    out = cfg.out or resumed_in or comm.bcast(config.default_out(comm.size) if comm.rank == 0 else None)
    job = Job(cfg, comm, None, servers, out, waiter, clock, crowded)
    try:
        model = init(job)
        if cfg.dry_run:
            record = roles.dry_run(job, model)
        else:
            record = {"server": roles.serve, "worker": roles.work, "peer": roles.peer,
                      "reducer": roles.reduce}[job.role if cfg.arch != "allreduce" else "reducer"](job, model)
        save(job, model, record)
        if cfg.fault_tolerant:   # every rank: one that never talked to the dead may not know of them
            leave_without_finalize(0)
        return 0
    except (Agreed, DataError) as e:  # raised on every rank alike
        if comm.rank == 0:
            print(f"asgd.train: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if cfg.fault_tolerant:
            end_fault_tolerant_job(comm, e, f"rank {comm.rank} ({role})", servers, ABORT_GRACE_S, out)
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
    mp = cfg.model_parallel > 1
    mine = startup.loads(job.role, job.rank, reads_file, allreduce, cfg.optimizer, compress, mp)
    error = startup.warm_up(comm, waiter, mine, startup.node_loads(reads_file, allreduce, cfg.optimizer, compress, mp),
                            cfg.precision)
    agree_on(comm, waiter, error, "the other ranks to load their kernels", Agreed)

    got = load_data(job)  # collective; a bad file raises the same DataError on every rank
    job.count("init", got.traffic["sent"], got.traffic["recv"])
    if cfg.epochs is None:   # a file's default: its size says how many (every rank knows it)
        job.cfg = cfg = dataclasses.replace(cfg, epochs=config.default_epochs(
            None if cfg.data is None else got.train_points))
    stats = feature_stats(got.test.X) if got.test is not None else (0.0, 1.0)
    scaling = None
    if cfg.standardize:  # collective: the statistics of the workers' shares together
        scaling = standardize.statistics(comm, waiter, got.train.X)
        for data in (got.train, got.test):
            if data is not None:
                standardize.apply(data.X, *scaling)
    for data in (got.train, got.test):   # read (and scaled) in float64, trained in --precision: cast once
        if data is not None:
            data.X = data.X.astype(cfg.precision, copy=False)
    made = {}

    def local():  # no MPI in here: it may fail on some ranks only, and is agreed on
        layout = mlp.Layout(got.train.features, cfg.hidden, got.train.classes)
        K = cfg.model_parallel
        sliced = mlp.Sliced(layout, K) if K > 1 else None   # w in its slices' order
        job.topo = Topology(cfg.arch, comm.size, job.servers, sliced.bounds if sliced else ((0, layout.n_w),))
        w, resumed, saved = mlp.init_params(layout, cfg.seed, cfg.precision), {}, {}
        if sliced:
            w = sliced.from_standard(w)
        if cfg.resume:  # every rank reads every shard: workers need all of w too
            w, resumed, saved = checkpoint.load(cfg.resume, layout.n_w, cfg.optimizer, K, cfg.precision)
            if (line := checkpoint.converted(cfg.resume, resumed, cfg.precision)) and job.rank == 0:
                print(f"asgd.train: note: {line}", file=sys.stderr, flush=True)
            if resumed.get("epoch", 0) >= cfg.epochs and job.rank == 0:
                # A job that failed while finishing (asgd.launch restarts it) ends now: the
                # results of the checkpoint's weights, nothing trained.
                print(f"asgd.train: note: {cfg.resume}: its checkpoint has {resumed['epoch']} epochs done, "
                      f"--epochs {cfg.epochs}: nothing left to train (ask for more with --epochs)",
                      file=sys.stderr, flush=True)
        if job.rank == 0:
            folder.check_out(job.out, cfg.force, cfg.resume is not None)
            _check_writable(job.out)
        averaged = job.topo.replicas if allreduce or cfg.mode == "sync" else 1
        lr = cfg.lr or optimizers.default_lr(cfg.optimizer, cfg.hidden, averaged)
        made["model"] = Model(got.train, got.test, got.train_points, got.times, layout, sliced, w, lr, resumed,
                              saved, scaling, labels=got.labels, dialect=got.dialect, test_lines=got.test_lines,
                              feature_stats=stats)
        return socket.gethostname()
    job.hosts = agree(comm, waiter, local, "the other ranks to finish start-up", Agreed)
    model = made["model"]
    split_replicas(job)
    return model


def split_replicas(job: Job) -> None:
    """--model-parallel: each replica's communicator (its members sum their logits on
    it) and, for allreduce, each slice's (its ranks sum their updates on it). Collective."""
    topo, comm = job.topo, job.comm
    worker = comm.rank >= job.servers
    job.replica_comm = comm.Split(topo.replica(comm.rank) if worker and topo.K > 1 else MPI.UNDEFINED, comm.rank)
    job.slice_comm = (comm.Split(topo.member(comm.rank), comm.rank) if job.cfg.arch == "allreduce" and topo.K > 1
                      else comm if job.cfg.arch == "allreduce" else None)


def load_data(job: Job) -> shares.Loaded:
    """This rank's share of the training points (servers: none; a model-parallel replica's
    members: the same) and, on rank 0, the held-out set, read by --reader; the embedded
    problem is generated, not read."""
    cfg = job.cfg
    which = shares.Job(job.servers, cfg.seed, cfg.classes, cfg.model_parallel, delimiter_option(cfg.delimiter),
                       cfg.header, cfg.label_column)
    if cfg.data is None:
        return shares.embedded(job.rank, job.comm.size, which)
    from .data import readers  # the parsers: only a run with a file imports them
    got = readers.load(job.comm, job.waiter, cfg.data, cfg.test, cfg.reader, which)
    if cfg.model_parallel > 1:
        share_with_replica(job, got)
    return got


def share_with_replica(job: Job, got: shares.Loaded) -> None:
    """The readers give a replica's share to its first rank: it sends the points to the
    replica's other members, point to point (counted), so all K train the same batches."""
    comm, K, S = job.comm, job.cfg.model_parallel, job.servers
    if comm.rank < S:
        return
    member = (comm.rank - S) % K
    X, y, f = got.train.X, got.train.y, got.train.features
    if member == 0:
        rows = np.ascontiguousarray(np.column_stack([X, y.astype(np.float64)]))
        size = np.array([len(rows)], np.int64)
        reqs = [r for k in range(1, K) for r in (comm.Isend([size, MPI.INT64_T], comm.rank + k, TAG_SHARE),
                                                  comm.Isend([rows, MPI.DOUBLE], comm.rank + k, TAG_SHARE))]
        job.waiter.all(reqs, "the replica's members to take its points")
        job.count("init", (K - 1) * (size.nbytes + rows.nbytes), 0)
        return
    size = np.zeros(1, np.int64)
    first = comm.rank - member
    job.waiter.all([comm.Irecv([size, MPI.INT64_T], first, TAG_SHARE)], f"rank {first}'s points")
    rows = np.empty((int(size[0]), f + 1))
    job.waiter.all([comm.Irecv([rows, MPI.DOUBLE], first, TAG_SHARE)], f"rank {first}'s points")
    job.count("init", 0, size.nbytes + rows.nbytes)
    got.train = Dataset(np.ascontiguousarray(rows[:, :f]), rows[:, f].astype(np.int64), got.train.classes)


def feature_stats(X: np.ndarray) -> tuple[float, float]:
    """(largest |value|, largest std / smallest non-zero std) of features as read: the
    notes say when they were left unscaled."""
    if not len(X):
        return 0.0, 1.0
    std = X.std(axis=0)
    nonzero = std[std > 0]
    return float(np.abs(X).max()), float(nonzero.max() / nonzero.min()) if len(nonzero) else 1.0


def _check_writable(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".asgd-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise config.ConfigError(f"cannot write to output folder {out}: {e.strerror}") from None


# -- save ------------------------------------------------------------------------------

def data_record(cfg, m: Model) -> dict:
    """results.json's `data`: what the model was trained and evaluated on, to check it
    and to apply it (asgd.predict): the files' size and hash, how they were read, where
    the held-out points came from, the classes' names."""
    if cfg.data is None:
        return {"embedded": "rings", "seed": cfg.seed, "heldout": None, "labels": None}
    held_out_of_data = cfg.test is None and not os.path.exists(test_path(cfg.data))
    return {"train": folder.file_digest(cfg.data),
            "test": None if held_out_of_data else folder.file_digest(cfg.test or test_path(cfg.data)),
            "read_as": m.dialect,
            "heldout": "heldout.npy" if held_out_of_data else None,
            "heldout_rule": (f"a seeded 1/{shares.HOLDOUT} of the data file's rows (asgd.data.shares.assign, seed "
                             f"{cfg.seed})" if held_out_of_data else "every row of the test file"),
            "labels": list(m.labels.names) if m.labels is not None and m.labels.names else None}


def class_counts(job: Job, m: Model) -> list[int]:
    """My training rows of each class (a model-parallel replica's members train copies of
    its first member's rows: only that one counts them)."""
    mine = job.rank >= job.servers and (job.rank - job.servers) % job.cfg.model_parallel == 0
    return np.bincount(m.train.y if mine else np.zeros(0, np.int64), minlength=m.layout.d_out).tolist()


def data_notes(cfg, m: Model, counts: list) -> list[str]:
    """Rank 0: the notes on the file's columns (a row index read as a feature:
    data.dialect.index_notes) and labels (data.labels.notes) from every rank's
    class_counts and the held-out rows; none for the embedded problem."""
    if cfg.data is None:
        return []
    columns = index_notes(m.dialect, cfg.data)
    if m.labels is None or any(c is None for c in counts):
        return columns
    rows = np.sum(counts, axis=0) + np.bincount(m.test.y, minlength=m.layout.d_out)
    separate = cfg.test is not None or os.path.exists(test_path(cfg.data))
    return columns + label_notes(m.labels, rows,
                                 f"{cfg.data} and {cfg.test or test_path(cfg.data)}" if separate else cfg.data)


def save(job: Job, m: Model, record: dict) -> None:
    """Every rank's record to rank 0, which writes the weights, results.json (its final
    metrics are those of the weights saved), the trace and the summary. Every byte of
    asgd's own messages is in the records (`bytes`), the gather's own included."""
    clock, cfg = job.clock, job.cfg
    end_ns = clock.switch("idle")
    # with workers lost (--fault-tolerant), the survivors end the run among themselves
    comm = job.comm.Shrink() if cfg.fault_tolerant else job.comm
    job.waiter.barrier(comm, "the other ranks to finish")
    job.count("train", record.pop("bytes_sent"), record.pop("bytes_recv"))
    job.count("finish", *clock_bytes(comm.rank, comm.size))
    if m.labels is not None:   # a file's labels: my rows of each class, for rank 0's label notes
        record["class_counts"] = class_counts(job, m)
    record.update(rank=job.rank, host=socket.gethostname(),
                  phases={**clock.seconds(), **m.read_times},  # + init's read/parse/shuffle
                  # init_end: where the init phase ended (the role's first switch), so the
                  # timeline's init is the phase's, and init_s + train_s fit in wall_s
                  clock_ns=(T0_NS, clock.first_end_ns, end_ns), bytes=job.traffic)
    offsets = clock_offsets(comm, job.waiter)
    gathered, sent = gather_objects(comm, job.waiter, (record, clock.events() if cfg.trace else None), TAG_RECORD)
    if job.rank != 0:
        return
    records, events = [g[0] for g in gathered], [g[1] for g in gathered]
    job.tracker.settle()   # --eval-deferred: the copies of w taken during training, evaluated now
    notes = data_notes(cfg, m, [r.pop("class_counts", None) for r in records])
    for r, nbytes in zip(records, sent):   # the gather's own bytes: each rank's pickle, rank 0's receipt
        r["bytes"]["finish"]["sent"] += nbytes
        records[0]["bytes"]["finish"]["recv"] += nbytes
    for r in records:
        r["bytes_sent"] = sum(b["sent"] for b in r["bytes"].values())
        r["bytes_recv"] = sum(b["recv"] for b in r["bytes"].values())
    wall = clock.elapsed()   # rank 0's own
    zero = min(r["clock_ns"][0] + off for r, off in zip(records, offsets))  # the first rank's start
    for r, off in zip(records, offsets):
        r["timeline"] = {k: (t + off - zero) / 1e9 for k, t in zip(("start", "init_end", "end"), r.pop("clock_ns"))}
    # the job's wall, from the first rank's start: a rank the launcher started before rank 0
    # has an init (init_s) longer than rank 0's own wall, which the summary then cannot split
    wall += records[0]["timeline"]["start"]
    if cfg.trace:
        path = os.path.join(job.out, "trace.json")
        info = export_trace(path, events, [f"{r['role']} {r['rank']}" for r in records], offsets, zero)
        job.say(f"trace: {path} ({info['events']:,} events, {info['flows']:,} message arrows, "
                f"{info['dropped']:,} dropped)")
    tracker = job.tracker
    w = m.standard(m.w)   # all of w on rank 0, in the layout's order
    loss, accuracy = (None, None) if cfg.dry_run else tracker.final_metrics(w, mlp.make_evaluate(m.layout, w, m.test))
    stopped = any(r.get("stopped") for r in records)
    res = results.build(
        config={**cfg.to_dict(), "out": job.out, "lr": m.lr, "servers": job.topo.owners, "workers": job.workers,
                "replicas": job.topo.replicas,
                "worker_lr": optimizers.worker_lr(cfg.optimizer, m.lr),
                "features": m.layout.d_in, "classes": m.layout.d_out, "n_w": m.layout.n_w,
                "train_points": m.n_train, "test_points": len(m.test)},
        ranks=records, wall_s=wall, meta=results.machine(job.comm, bool(job.crowded)),
        server={"updates": records[0]["rounds"] if job.topo.owners else records[0]["updates"],
                "samples": tracker.samples, "samples_run": tracker.samples - tracker.first_samples,
                "history": tracker.history, "loss": loss, "accuracy": accuracy,
                "curve": tracker.curve, "target": tracker.target_record(),
                "eval_s": tracker.evals.spent_s if tracker.evaluate else None,
                "eval_after_s": tracker.settled_s if tracker.deferred else None})
    res["stopped"] = (signals.requested() or "a stop request") if stopped else None
    if os.environ.get(RESTARTS_ENV):   # python -m asgd.launch restarted this run: its history
        with open(os.environ[RESTARTS_ENV]) as f:
            res["restarts"] = json.load(f)
    lost = {x["rank"]: x for r in records for x in r.get("lost", [])}   # every server saw it die
    res["lost"] = [{**x, "host": job.hosts[rank]} for rank, x in sorted(lost.items())]
    res["dry_run"] = cfg.dry_run
    res["data"] = data_record(cfg, m)
    if tracker.step_losses is not None:   # lockstep runs: every version's mean batch loss
        res["metrics"]["step_loss"] = tracker.step_losses
    if m.scaling:
        res["standardize"] = {"mean": m.scaling[0].tolist(), "std": m.scaling[1].tolist()}
    path = os.path.join(job.out, "results.json")
    if cfg.dry_run:
        res["notes"] = notes
        results.write(path, res)
        print(f"asgd.train: dry run: {comm.size} ranks started, {m.n_train:,} training and {len(m.test):,} "
              f"held-out points read, the {m.layout.d_in}-{m.layout.d_hidden}-{m.layout.d_out} MLP built in "
              f"{res['init_s']:.2f} s; nothing trained. results: {path}", flush=True)
        for note in notes:
            print(f"asgd.train: note: {note}", flush=True)
        return
    if m.scaling:
        folder.write_scaling(job.out, *m.scaling)
    chance = float(np.bincount(m.test.y).max() / len(m.test)) if len(m.test) else None
    facts = RunFacts(accuracy=accuracy, chance=chance, workers=1 if lockstep(cfg.arch, cfg.mode) else job.topo.replicas,
                     standardized=bool(cfg.standardize), feature_max=m.feature_stats[0],
                     std_ratio=m.feature_stats[1], guard_cuts=tracker.guard_cuts, stale_step=cfg.stale_step,
                     target_reached=tracker.reached is not None)
    res["notes"] = notes + convergence_notes(tracker.history, sum(r.get("refused", 0) for r in records), facts)
    if m.labels is not None and m.labels.names:
        folder.write_labels(job.out, m.labels.names)
    if res["data"].get("heldout") and m.test_lines is not None:
        folder.write_heldout(job.out, m.test_lines)
    folder.write_weights(job.out, w)
    results.write(path, res)
    print(results.summary(res, path), flush=True)
    if res["lost"]:
        print(f"asgd.train: lost {len(res['lost'])} worker(s) and trained on without them: ranks "
              f"{', '.join(str(x['rank']) for x in res['lost'])} (results.json's `lost`)", flush=True)
    for note in res["notes"]:
        print(f"asgd.train: note: {note}", flush=True)
    if res["target"] is not None:
        print(target_line(res["target"], cfg.eval_deferred), flush=True)
    if stopped:
        print(f"asgd.train: stopped early by {res['stopped']} after epoch {tracker.epoch} "
              f"({tracker.samples:,} samples); checkpoint in {checkpoint.folder(job.out)}; "
              f"continue with --resume {job.out}", flush=True)


def target_line(t: dict, deferred: bool = False) -> str:
    """The summary's line on --target-accuracy or --target-loss (deferred: found after
    training, every epoch trained)."""
    if not t["reached"]:
        return f"asgd.train: the held-out {t['metric']} never reached the target {t['value']:g}"
    return (f"asgd.train: reached the target held-out {t['metric']} {t['value']:g} after {t['train_s']:.2f} s of "
            f"training, {t['epochs']:.2f} epochs ({t['samples']:,} samples, {t['updates']:,} updates)"
            + ("; found after training (--eval-deferred), every epoch trained" if deferred else ""))


if __name__ == "__main__":
    sys.exit(main())
