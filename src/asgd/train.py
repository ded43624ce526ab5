"""mpiexec -n N python -m asgd.train [options]: the whole run, top to bottom.

options -> data -> init (load, split, JIT) -> training loop (rank 0 serves, the others
work) -> gather per-rank records -> results.json and summary on rank 0.
"""

from __future__ import annotations

import time

T0_NS = time.perf_counter_ns()  # init starts when the process does: imports and JIT count

import math  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from .data import formats, readers  # noqa: E402
from .net import mlp  # noqa: E402
from .protocol.allreduce import run_allreduce  # noqa: E402
from .protocol.comm import TAG_SHARD, Waiter, clock_offsets, oversubscribed, shard_bounds  # noqa: E402
from .protocol.server import Server  # noqa: E402
from .protocol.worker import run_worker  # noqa: E402
from .run import checkpoint, config, results, signals  # noqa: E402
from .run.progress import EpochTracker  # noqa: E402
from .run.trace import PhaseClock, TraceClock  # noqa: E402
from .run.trace import export as export_trace  # noqa: E402


def load(comm: MPI.Comm, cfg: config.Config, waiter: Waiter) -> readers.Loaded:
    """This rank's share of the training points (servers: none) and, on rank 0, the
    held-out set, read by cfg.reader. Collective: a bad file raises the same DataError
    on every rank. The embedded problem has no file: each rank generates it, keeps its share."""
    job = readers.Job(0 if cfg.arch == "allreduce" else cfg.servers, cfg.seed, cfg.classes)
    if cfg.data is None:
        return readers.embedded(comm, waiter, job)
    return readers.load(comm, waiter, cfg.data, cfg.test, cfg.reader, job)


def agree(comm: MPI.Comm, waiter: Waiter, error: str | None) -> str | None:
    """Every rank learns whether any failed, and the lowest failing rank's message."""
    waiter.barrier(comm, "the other ranks to finish start-up")
    return next((e for e in comm.allgather(error) if e), None)


def main(argv: list[str] | None = None) -> int:
    comm = MPI.COMM_WORLD
    rank = comm.rank
    try:
        cfg = config.parse(argv, comm.size, quiet_help=rank != 0)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except config.ConfigError as e:
        if rank == 0:
            print(f"asgd.train: error: {e} (see --help)", file=sys.stderr)
        return 2
    signals.install()  # SIGTERM/SIGINT: stop at a step boundary, checkpoint, exit cleanly
    clock = (TraceClock("init", T0_NS, config.trace_window(cfg.trace_steps)) if cfg.trace
             else PhaseClock("init", T0_NS))
    deadline = time.monotonic() + cfg.timeout if cfg.timeout else 0.0
    crowded = oversubscribed(comm)
    role = "server" if cfg.arch == "ps" and rank < cfg.servers else "worker"
    waiter = Waiter(crowded, deadline, f"rank {rank} ({role})", cfg.stall_timeout)
    say = (lambda s: print(s, flush=True)) if rank == 0 and not cfg.quiet else (lambda s: None)

    # -- init: data, model, output folder. Only local work here (no collective may
    # follow a step that can fail on some ranks): failures are agreed on, reported once.
    # load is collective, but agrees on a bad file itself (the same error on every rank).
    out = cfg.out or cfg.resume or comm.bcast(config.default_out(comm.size) if rank == 0 else None)
    error = None
    try:
        got = load(comm, cfg, waiter)
        train, test, n_train = got.train, got.test, got.train_points  # train: my share
        layout = mlp.Layout(train.features, cfg.hidden, train.classes)
        S = 0 if cfg.arch == "allreduce" else cfg.servers
        workers = comm.size - S
        averaged = workers if cfg.arch == "allreduce" or cfg.mode == "sync" else 1
        lr = cfg.lr or mlp.default_lr(cfg.hidden, averaged)
        w, resumed = mlp.init_params(layout, cfg.seed), {}
        if cfg.resume:  # every rank reads every shard: workers need all of w too
            w, resumed = checkpoint.load(cfg.resume, max(S, 1), layout.n_w)
            if resumed.get("epoch", 0) >= cfg.epochs:
                raise checkpoint.CheckpointError(f"{cfg.resume}: its checkpoint has {resumed['epoch']} "
                                                 f"epochs done; ask for more with --epochs")
        first_epoch = resumed.get("epoch", 0)
        if rank == 0:
            _check_writable(out)
    except (formats.DataError, checkpoint.CheckpointError, OSError, MemoryError) as e:
        error = str(e)
    except Exception as e:  # a bug: say where
        error = f"rank {rank} ({role}): {type(e).__name__}: {e}"
    error = agree(comm, waiter, error)
    if error:
        if rank == 0:
            print(f"asgd.train: error: {error}", file=sys.stderr)
        return 2

    # -- JIT and training: from here a failure anywhere aborts the whole job
    try:
        warm_up_jit(comm, waiter)
        init_end_ns = time.perf_counter_ns()
        steps = math.ceil(math.ceil(n_train / workers) / cfg.batch)  # per epoch of the largest share
        tracker = None
        if rank == 0:
            say(f"asgd: {comm.size} ranks: {S} server(s), {workers} workers ({cfg.arch}, {cfg.mode}); "
                f"{n_train:,} training and {len(test):,} held-out points; "
                f"{layout.d_in}-{layout.d_hidden}-{layout.d_out} MLP, batch {cfg.batch}, lr {lr:g}, "
                f"{cfg.epochs} epochs")
            evaluate = mlp.make_evaluate(layout, w, test) if S <= 1 else None  # needs all of w
            tracker = EpochTracker(n_train, cfg.epochs, evaluate, say, cfg.progress, clock,
                                   history=list(resumed.get("history", [])), epoch=first_epoch,
                                   samples=first_epoch * n_train)
            if first_epoch:
                say(f"resuming from {cfg.resume} after epoch {first_epoch}")
        ckpt = None
        if rank < max(S, 1):  # servers, or allreduce's rank 0: they can save a checkpoint
            lo, hi = shard_bounds(layout.n_w, max(S, 1))[rank]
            progress = (lambda: {"epoch": tracker.epoch, "samples": tracker.samples,
                                 "history": tracker.history}) if tracker else dict
            ckpt = checkpoint.Checkpointing(out, rank, max(S, 1), (lo, hi), layout.n_w, w[lo:hi],
                                            checkpoint.parse_every(cfg.checkpoint_every), progress)
        if rank < S:
            record = serve(cfg, comm, w, S, (cfg.epochs - first_epoch) * steps, waiter, clock, tracker, ckpt)
        else:
            X, y, step = train.X, train.y, mlp.make_step(layout, cfg.batch)
            if S:
                st = run_worker(comm, shard_bounds(layout.n_w, S), w, X, y, step, lr, cfg.batch,
                                cfg.epochs, [cfg.seed, rank - S], waiter, clock, overlap=cfg.mode != "sync",
                                steps_per_epoch=steps if cfg.mode == "sync" else None, first_epoch=first_epoch)
            else:
                st = run_allreduce(comm, w, X, y, step, lr, cfg.batch, cfg.epochs, steps, [cfg.seed, rank],
                                   waiter, clock, tracker, first_epoch, ckpt.maybe if ckpt else None)
                if ckpt and (cfg.checkpoint_every or st.stopped):
                    ckpt.save(st.updates)
            record = {"role": "worker", "updates": st.updates, "bytes_sent": st.bytes_sent,
                      "bytes_recv": st.bytes_recv, "stopped": st.stopped}
        end_ns = clock.switch("idle")
        waiter.barrier(comm, "the other ranks to finish")
        record.update(rank=rank, host=socket.gethostname(), phases={**clock.seconds(), **got.times},  # + init's read/parse/shuffle
                      clock_ns=(T0_NS, init_end_ns, end_ns))
        offsets = clock_offsets(comm, waiter)
        records = comm.gather(record, root=0)
        events = comm.gather(clock.events() if cfg.trace else None, root=0)
        if rank == 0:
            wall = clock.elapsed()
            zero = min(r["clock_ns"][0] + off for r, off in zip(records, offsets))  # first rank's start
            for r, off in zip(records, offsets):
                r["timeline"] = {k: (t + off - zero) / 1e9
                                 for k, t in zip(("start", "init_end", "end"), r.pop("clock_ns"))}
            _staleness_per_worker(records, S)
            if cfg.trace:
                names = [f"{r['role']} {r['rank']}" for r in records]
                info = export_trace(os.path.join(out, "trace.json"), events, names, offsets, zero)
                say(f"trace: {os.path.join(out, 'trace.json')} ({info['events']:,} events, "
                    f"{info['flows']:,} message arrows, {info['dropped']:,} dropped)")
            final = tracker.history[-1] if tracker.history else {}
            if final.get("test_accuracy") is None:  # sharded: w was assembled on rank 0 by serve()
                final = dict(zip(("test_loss", "test_accuracy"), mlp.make_evaluate(layout, w, test)()))
            updates = records[0]["rounds"] if S else records[0]["updates"]
            stopped = any(r.get("stopped") for r in records)
            res = results.build(
                config={**cfg.to_dict(), "out": out, "lr": lr, "servers": S, "workers": workers,
                        "features": layout.d_in, "classes": layout.d_out, "n_w": layout.n_w,
                        "train_points": n_train, "test_points": len(test)},
                ranks=records, wall_s=wall, meta=results.machine(comm, crowded),
                server={"updates": updates, "samples": tracker.samples, "history": tracker.history,
                        "loss": final["test_loss"], "accuracy": final["test_accuracy"]})
            res["stopped"] = (signals.requested() or "a stop request") if stopped else None
            np.save(os.path.join(out, "model.npy"), w)
            path = os.path.join(out, "results.json")
            results.write(path, res)
            print(results.summary(res, path), flush=True)
            if stopped:
                print(f"asgd.train: stopped early by {res['stopped']} after epoch {tracker.epoch} "
                      f"({tracker.samples:,} samples); checkpoint in {checkpoint.folder(out)}; "
                      f"continue with --resume {out}", flush=True)
        return 0
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        if isinstance(e, MPI.Exception):  # e.g. a peer killed mid-exchange, seen here before the launcher
            why = (f"MPI communication failed; another rank probably died or was killed "
                   f"(MPI: {str(e).split(',')[0]})")
        print(f"asgd.train: rank {rank} ({role}): {why}", file=sys.stderr, flush=True)
        if os.environ.get("ASGD_DEBUG"):
            traceback.print_exc()
        comm.Abort(1)
        return 1


def warm_up_jit(comm: MPI.Comm, waiter: Waiter) -> None:
    """One rank per node compiles the kernels into numba's cache; the others then load
    it, rather than every rank compiling at once on the node's few cores."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        if node.rank == 0:
            mlp.compile_kernels()
        waiter.barrier(node, "the node's first rank to compile the kernels")
        if node.rank != 0:
            mlp.compile_kernels()
    finally:
        node.Free()


def serve(cfg: config.Config, comm: MPI.Comm, w: np.ndarray, S: int, rounds: int, waiter: Waiter,
          clock: PhaseClock, tracker: EpochTracker | None, ckpt: checkpoint.Checkpointing) -> dict:
    """Serve my shard of w (a view: rank 0's w stays whole), checkpointing as asked and
    at the end (always when stopped early); then the other servers send their shards to
    rank 0, which evaluates the assembled w."""
    shards = shard_bounds(len(w), S)
    lo, hi = shards[comm.rank]
    server = Server(comm, w[lo:hi], S, waiter, clock, tracker, on_update=ckpt.maybe)
    if cfg.mode == "sync":
        st = server.serve_sync(rounds)
    else:
        st = server.serve_async(cfg.staleness if cfg.mode == "ssp" else None)
    stopped = server.stopping or signals.requested() is not None
    if cfg.checkpoint_every or stopped:
        ckpt.save(st.rounds)
    if S > 1:
        reqs = ([comm.Irecv(w[a:b], s, TAG_SHARD) for s, (a, b) in enumerate(shards) if s] if comm.rank == 0
                else [comm.Isend(w[lo:hi], 0, TAG_SHARD)])
        waiter.all(reqs, "the servers' final shards")
    return {"role": "server", "stopped": stopped, "refused": st.refused,
            "updates": st.updates, "rounds": st.rounds, "bytes_sent": st.bytes_sent,
            "bytes_recv": st.bytes_recv, "shard": [lo, hi], "requests": st.updates,
            "staleness_hist": [np.bincount(v).tolist() for v in st.staleness],
            "step_gap_hist": [np.bincount(v).tolist() for v in st.step_gap]}


def _staleness_per_worker(records: list[dict], S: int) -> None:
    """Each worker's staleness and step-gap distributions, over every server that applied
    its Delta-w; servers get the distribution over all workers."""
    def dist(hists: list[list[int]]) -> dict:
        h = np.zeros(max((len(x) for x in hists), default=1), np.int64)
        for x in hists:
            h[:len(x)] += x
        n = h.sum()
        return {"mean": float(h @ np.arange(len(h)) / n) if n else 0.0,
                "max": int(np.flatnonzero(h).max(initial=0)), "histogram": h.tolist()}
    servers = records[:S]
    for j, r in enumerate(records[S:]):
        r["staleness"] = dist([s["staleness_hist"][j] for s in servers])
        r["step_gap"] = dist([s["step_gap_hist"][j] for s in servers])
    for s in servers:
        s["staleness"] = dist(s.pop("staleness_hist"))
        s["step_gap"] = dist(s.pop("step_gap_hist"))


def _check_writable(out: str) -> None:
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".asgd-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise OSError(f"cannot write to output folder {out}: {e.strerror}") from None


if __name__ == "__main__":
    sys.exit(main())
