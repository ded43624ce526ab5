"""Every option of asgd.train: its default, its validation, and the one dataclass
that the rest of the program receives."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from dataclasses import dataclass

from .. import BadInput
from ..core.target import EVAL_BUDGET, Cadence
from ..core.wire import PRECISIONS
from ..data import READERS  # how ranks read the data file
from ..data.dialect import add_file_options, delimiter_option
from ..net import OPTIMIZERS
from ..net.optimizers import STALE_STEPS


class ConfigError(BadInput):
    """A bad option; the message is one line a user can act on."""


EMBEDDED_HIDDEN = 10000   # the paper's 2-10K-2, on the embedded problem
EMBEDDED_EPOCHS = 5
FILE_HIDDEN = 256         # a user's file (bench_defaults' study over data sets and 1-31 workers)
FILE_SAMPLES = 700_000    # a user's file: epochs enough for about this many samples ...
FILE_EPOCHS = (10, 200)   # ... within these bounds


@dataclass(frozen=True)
class Config:
    data: str | None = None      # training file; None: the embedded default problem
    test: str | None = None      # held-out file; None: <data stem>.test.<ext>, or a split
    delimiter: str = "auto"      # a text file's: comma, tab, semicolon, pipe, whitespace, auto (data.dialect)
    header: bool | None = None   # line 1 is column names; None: detected
    label_column: str | None = None  # a name or a 0-based index; None: the last column
    classes: int | None = None   # None: from the labels
    reader: str = "parallel"     # READERS: how ranks read the data file
    hidden: int | None = None    # None: EMBEDDED_HIDDEN, or FILE_HIDDEN for --data (resolved by parse)
    batch: int = 256
    lr: float | None = None      # None: optimizers.default_lr(optimizer, hidden, averaged workers)
    optimizer: str = "adagrad"   # OPTIMIZERS: what a server does with an update (asgd.net.optimizers);
                                 # adagrad: the most robust under asynchrony across data sets (bench_defaults)
    stale_step: str = "off"      # net.optimizers.STALE_STEPS: the share of the step a stale update takes
    lr_guard: bool = True        # halve the step when the held-out loss climbs (run.progress)
    standardize: bool | None = None  # scale features to mean 0, variance 1; None: on for --data, off embedded
    epochs: int | None = None    # None: EMBEDDED_EPOCHS, or file_epochs(training points) (resolved by train.init)
    seed: int = 0
    out: str | None = None       # None: runs/<timestamp>-n<ranks>
    force: bool = False          # --out may be an existing run: overwrite it
    timeout: float = 0.0         # seconds for the whole job; 0: none
    progress: float = 2.0        # seconds between progress lines at most
    trace: bool = False          # write trace.json (Chrome Trace Event format)
    arch: str = "ps"             # ps: parameter servers; p2p: every rank a worker owning 1/N of w;
                                 # allreduce: every rank a worker, summing with the others
    allreduce: str = "ring"      # allreduce's algorithm: ring (asgd's, point to point) | mpi (MPI_Iallreduce)
    model_parallel: int = 1      # K: replicas of K workers that split the hidden layer (run.topology)
    servers: int = 1             # ranks 0..servers-1 serve a shard of w each
    mode: str = "async"          # async | ssp | sync
    staleness: int = 3           # ssp: at most this many steps ahead of the slowest worker
    compress: str = "none"       # none | 1bit: 1-bit messages with error feedback (protocol.onebit)
    precision: str = "float32"   # core.wire.PRECISIONS: the dtype of w, Delta-w, the optimizer's state and messages
    mpi_progress: str = "step"   # step: the worker's step tests the exchange in flight between its sample blocks; off
    overlap: str = "auto"        # async, ssp: compute beside the exchange in flight: auto (while short) | on | off
    stall_timeout: float = 0.0   # seconds one wait may take; 0: no limit
    checkpoint_every: str | None = None  # "N" updates or "Ns" seconds
    resume: str | None = None    # run folder to continue from its last checkpoint
    trace_steps: str = "0:200"   # window of worker steps the trace records, A:B
    quiet: bool = False
    dry_run: bool = False        # start up (kernels, data, model, output folder) and stop: nothing trained
    fault_tolerant: bool = False  # a lost worker does not end the job (Open MPI's ULFM)
    backup_workers: int = 0      # sync: each round applies the first W - b pushes, drops the late
    target_accuracy: float | None = None   # end the run once the held-out accuracy reaches this
    target_loss: float | None = None       # ... or the held-out loss falls to this (core.target)
    eval_every: str = "auto"     # held-out evaluations: "N" updates, "Ns" seconds, "epoch" (their ends only), or auto
    eval_deferred: bool = False  # --eval-every's evaluations made after training, of copies of w taken on time

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def file_epochs(train_points: int) -> int:
    """--epochs for a user's file: about FILE_SAMPLES samples, within FILE_EPOCHS."""
    lo, hi = FILE_EPOCHS
    return max(lo, min(hi, math.ceil(FILE_SAMPLES / max(train_points, 1))))


def default_hidden(embedded: bool) -> int:
    """--hidden when not given: the paper's 2-10K-2 on the embedded problem, FILE_HIDDEN
    for a file. asgd.perf and asgd.sim use this rule too, so a prediction of a default run
    predicts the run asgd.train makes."""
    return EMBEDDED_HIDDEN if embedded else FILE_HIDDEN


def default_epochs(train_points: int | None) -> int:
    """--epochs when not given: EMBEDDED_EPOCHS for the embedded problem (train_points
    None), file_epochs() for a file of that many training points."""
    return EMBEDDED_EPOCHS if train_points is None else file_epochs(train_points)


def with_defaults(cfg: Config) -> Config:
    """The defaults that depend on whether there is a data file (the embedded problem
    keeps the paper's 2-10K-2 and 5 epochs, unscaled)."""
    embedded = cfg.data is None
    return dataclasses.replace(
        cfg, hidden=cfg.hidden if cfg.hidden is not None else default_hidden(embedded),
        standardize=(not embedded) if cfg.standardize is None else cfg.standardize)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting on every rank."""

    def error(self, message: str):
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    d = Config()
    p = _Parser(
        prog="mpiexec -n N python -m asgd.train",
        description="Asynchronous SGD with a parameter server over MPI: rank 0 serves the "
                    "parameters, ranks 1..N-1 train the d_in-hidden-d_out MLP on their share "
                    "of the data. With --data: your file (CSV, TSV, white space, .npy, .npz), a "
                    f"{FILE_HIDDEN}-unit hidden layer, standardized features, epochs for about "
                    f"{FILE_SAMPLES:,} samples. With no options: the embedded 2-feature rings problem "
                    "(16384 points), the paper's 2-10K-2 MLP, batch 256, 5 epochs.",
        epilog="Writes OUT/results.json (schema: docs/formats.md), weights.npy, and what asgd.predict needs "
               "to apply the model to new data. Errors end the whole job with one line and exit status 2 "
               "(bad input) or 1 (failure during the run).")
    g = p.add_argument_group("your data")
    g.add_argument("--data", metavar="FILE", help="training data: delimited text (a point a line: numbers, and "
                   "a label in one column) or .npy/.npz (default: the embedded rings problem)")
    g.add_argument("--test", metavar="FILE", help="held-out data (default: DATA's <stem>.test.<ext> if it exists, "
                   "else a seeded 1/8 of DATA, recorded in OUT/heldout.npy)")
    add_file_options(g)   # shared with asgd.data check
    g.add_argument("--standardize", action=argparse.BooleanOptionalAction, default=None,
                   help="scale each feature to mean 0 and variance 1 with statistics of the training points "
                        "(written to OUT/standardize.json; asgd.predict applies them) (default: on with "
                        "--data, off for the embedded problem)")
    t = p.add_argument_group("training")
    t.add_argument("--hidden", type=int, help=f"hidden units (default {FILE_HIDDEN} with --data; the embedded "
                   f"problem: {EMBEDDED_HIDDEN}, the paper's, which also uses 100000)")
    t.add_argument("--epochs", type=int, help="passes over the training data by all workers together (default "
                   f"with --data: about {FILE_SAMPLES:,} samples' worth, {FILE_EPOCHS[0]} to {FILE_EPOCHS[1]}; "
                   f"the embedded problem: {EMBEDDED_EPOCHS})")
    t.add_argument("--batch", type=int, default=d.batch, help="mini-batch size per worker step (default %(default)s)")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer,
                   help="what the servers (allreduce: every rank) do with an update, each keeping its state "
                        "for its shard: adagrad (default: the most robust across data sets and worker counts), "
                        "momentum or adam (workers push the gradient, the server applies lr), or sgd (w += "
                        "Delta-w, the worker applies lr: the paper's ASGD)")
    t.add_argument("--lr", type=float, help="learning rate (default, by --optimizer: sgd 3/hidden, momentum "
                   "0.3/hidden, both x W workers in sync and allreduce, where each update averages W workers'; "
                   "adagrad 0.01; adam 0.001)")
    t.add_argument("--stale-step", choices=STALE_STEPS, default=d.stale_step,
                   help="the share of the step an update computed on an older w takes, by its staleness s "
                        "(the updates applied since): off (default: all of it), sqrt (1/sqrt(s)), inverse (1/s: "
                        "Zhang et al. 2016's staleness-aware async SGD)")
    t.add_argument("--lr-guard", action=argparse.BooleanOptionalAction, default=d.lr_guard,
                   help="halve the step when the held-out loss climbs well above its best and is still rising "
                        "(said in the progress line; one server, --arch ps) (default: on)")
    t.add_argument("--target-accuracy", type=float, metavar="A",
                   help="end the run once the held-out accuracy reaches A (0 < A <= 1), checked at every "
                        "held-out evaluation (--eval-every), keeping the weights that reached it; results.json's "
                        "target says when (default: none, train every epoch). Rank 0 must hold all of w: --arch ps "
                        "with one server, or p2p and allreduce without --model-parallel")
    t.add_argument("--target-loss", type=float, metavar="L",
                   help="end the run once the held-out loss falls to L (> 0), as --target-accuracy does (give "
                        "one of the two)")
    t.add_argument("--eval-every", default=d.eval_every, metavar="N|Ns|epoch|auto",
                   help="evaluate the held-out set every N updates (e.g. 200) or N seconds (e.g. 0.5s) as well "
                        "as after each epoch, or after each epoch only (epoch): results.json's metrics.curve, and "
                        "the checks of a target. auto (default): as often as keeps all of them within "
                        f"{EVAL_BUDGET * 100:g} %% of the training time so far, epoch ends first (some epochs "
                        "have none where one an epoch costs more). Rank 0 must hold all of w, as for a target")
    t.add_argument("--eval-deferred", action="store_true", default=d.eval_deferred,
                   help="at --eval-every's times copy w instead of evaluating it, and evaluate the copies "
                        "after training: the curve and the time to a target (found, not stopped at: every "
                        "epoch is trained) without the evaluations' own time in the training's, as a "
                        "benchmark of time to accuracy wants; a copy of w each (memory), no --lr-guard "
                        "(nothing evaluated during training); needs --eval-every N, Ns or epoch")
    t.add_argument("--seed", type=int, default=d.seed,
                   help="seed of the data split, shuffles and initial weights (default %(default)s)")
    t.add_argument("--precision", choices=PRECISIONS, default=d.precision,
                   help="the numbers w, Delta-w, the optimizer's state and every message's values are kept "
                        "and computed in: float32 (default, as CNTK and PyTorch train: half the bytes on "
                        "every wire and twice the SIMD lanes) or float64; message headers are float64 in both")
    a = p.add_argument_group("parallelism")
    a.add_argument("--arch", choices=["ps", "p2p", "allreduce"], default=d.arch,
                   help="ps: parameter servers and workers (default); p2p: every rank a worker and the "
                        "owner (server) of 1/N of w, each shard of Delta-w sent to its owner point to point; "
                        "allreduce: no servers, every rank a worker summing its Delta-w with the others' "
                        "each step")
    a.add_argument("--servers", type=int, default=None, metavar="S",
                   help="ranks 0..S-1 are servers, each owning a contiguous shard of the "
                        "parameters (default 1; with --model-parallel K, the fewest that leave a "
                        "multiple of K workers: 2 of 8 ranks for K = 2)")
    a.add_argument("--mode", choices=["async", "ssp", "sync"], default=d.mode,
                   help="async: apply each Delta-w as it arrives (default); ssp: stale-synchronous, "
                        "a worker at most --staleness steps ahead of the slowest; sync: each step "
                        "the servers apply the average of all workers' Delta-w once")
    a.add_argument("--staleness", type=int, default=d.staleness, metavar="K",
                   help="ssp's bound K >= 1 (default %(default)s)")
    a.add_argument("--allreduce", choices=["ring", "mpi"], default=d.allreduce,
                   help="--arch allreduce's algorithm: ring (default): asgd's own ring allreduce, a "
                        "reduce-scatter then an allgather to the next rank, point to point, so every byte is "
                        "counted; mpi: MPI_Iallreduce, whose algorithm (and bytes) the MPI library chooses")
    a.add_argument("--model-parallel", type=int, default=d.model_parallel, metavar="K",
                   help="split the hidden layer K ways (model partitioning): workers form replicas of K "
                        "consecutive ranks, each holding 1/K of the hidden units (its rows of W1 and b1, "
                        "its columns of W2), summing their partial logits each step, and exchanging only "
                        "its own slice of Delta-w; K must divide --hidden and the workers (default 1)")
    a.add_argument("--fault-tolerant", action="store_true",
                   help="a worker that dies (killed, its node lost) does not end the job: the servers "
                        "name it, stop waiting for it and train on with the rest (--arch ps; Open MPI "
                        "with ULFM: mpiexec --with-ft ulfm). A server's death still ends the job: "
                        "python -m asgd.launch --max-restarts restarts it from its checkpoint")
    a.add_argument("--backup-workers", type=int, default=d.backup_workers, metavar="B",
                   help="--mode sync: each round applies the first W - B workers' pushes and drops "
                        "the late ones (TensorFlow's SyncReplicasOptimizer), so a straggler or a lost "
                        "worker does not stall every step (default 0)")
    a.add_argument("--compress", choices=["none", "1bit"], default=d.compress,
                   help="none (default): every value as it is (--precision); 1bit: Seide et al.'s 1-bit "
                        "SGD with error feedback, both ways: a worker sends one bit per value of Delta-w "
                        "plus two scales per column and keeps the rest for its next push; a server replies "
                        "with the 1-bit change of its shard since that worker's last reply (parameter servers only)")
    lab = p.add_argument_group("the performance lab")
    lab.add_argument("--reader", choices=READERS, default=d.reader,
                     help="parallel (default): each rank reads its part of the file at once, then a "
                          "seeded shuffle; sequential: ranks take turns reading the whole file, as "
                          "CNTK did (init grows with the ranks)")
    lab.add_argument("--mpi-progress", choices=["step", "off"], default=d.mpi_progress,
                     help="step (default): while an exchange is in flight the worker's step tests it "
                          "between its sample blocks, so MPI moves large messages during the compute; "
                          "off: only the waits move them")
    lab.add_argument("--overlap", choices=["auto", "on", "off"], default=d.overlap,
                     help="async and ssp: whether a worker computes its next step while its exchange is in "
                          "flight (on the w of the exchange before). auto (default): while an exchange lasts "
                          "under 8 of its steps; once one lasts longer it waits for w' first (the step would "
                          "hide little of the exchange and learn from a staler w), and overlaps again under 4. "
                          "on: always (one worker against one server is then deterministic); off: never. "
                          "sync never overlaps")
    lab.add_argument("--dry-run", action="store_true",
                     help="start up as the run would (kernels, data and its exchange, model, checkpoint, output "
                          "folder), write OUT/results.json with \"dry_run\": true and stop: checks the options and "
                          "the data before a long job, and measures start-up traffic (asgd.testbed's byte proof)")
    lab.add_argument("--trace", action="store_true", help="write OUT/trace.json, a timeline of every "
                     "rank's phases and messages that opens in Perfetto (ui.perfetto.dev) and chrome://tracing")
    lab.add_argument("--trace-steps", default=d.trace_steps, metavar="A:B", help="record worker steps "
                     "A..B-1 only, which bounds the trace's size (default %(default)s; init is always recorded)")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", help="run folder for results.json, weights.npy and the rest (default: "
                   "runs/<time>-n<ranks>); an existing run is refused unless --force or --resume")
    o.add_argument("--force", action="store_true", help="write into --out even if it holds a run (its files are "
                   "replaced)")
    o.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    o.add_argument("--progress", type=float, default=d.progress, metavar="SECONDS",
                   help="seconds between progress lines within an epoch (default %(default)s)")
    o.add_argument("--timeout", type=float, default=d.timeout, metavar="SECONDS",
                   help="end the whole job with an error if it runs longer (default: no limit)")
    o.add_argument("--stall-timeout", type=float, default=d.stall_timeout, metavar="SECONDS",
                   help="end the job, naming who waited on whom, if one wait takes longer "
                        "(default: no limit)")
    o.add_argument("--checkpoint-every", metavar="N|Ns",
                   help="servers write their shard and the progress to OUT/checkpoint every N "
                        "updates (e.g. 500) or N seconds (e.g. 30s), atomically, and at the end")
    o.add_argument("--resume", metavar="RUN_DIR",
                   help="continue from RUN_DIR's last complete checkpoint (same --hidden and "
                        "--servers); the run folder defaults to RUN_DIR")
    return p


def parse(argv: list[str] | None, world_size: int, quiet_help: bool = False) -> Config:
    """Options -> validated Config. quiet_help: do not print --help (ranks other than 0)."""
    p = build_parser()
    if quiet_help:
        p._print_message = lambda *a, **k: None  # --help prints once, from rank 0
    a = p.parse_args(argv)
    if a.servers is None:
        a.servers = default_servers(a.arch, a.model_parallel, world_size)
    cfg = with_defaults(Config(**vars(a)))
    validate(cfg, world_size)
    return cfg


def default_servers(arch: str, K: int, world_size: int) -> int:
    """1, or under --arch ps with --model-parallel K the fewest servers (at most K) that
    leave whole replicas of workers, so mpiexec -n 8 ... --model-parallel 2 just runs."""
    if arch != "ps" or K <= 1:
        return 1
    fits = [s for s in range(1, K + 1) if world_size - s >= K and (world_size - s) % K == 0]
    return fits[0] if fits else 1   # none: validate says why in one line


def validate(cfg: Config, world_size: int) -> None:
    def need(ok: bool, msg: str):
        if not ok:
            raise ConfigError(msg)

    need(cfg.servers >= 1, f"--servers must be >= 1, got {cfg.servers}")
    need(cfg.staleness >= 1, f"--staleness must be >= 1, got {cfg.staleness}")
    if cfg.arch == "ps":
        need(world_size >= 2, f"need at least 2 MPI ranks (1 server + 1 worker), got {world_size}; "
                              "run under mpiexec -n N with N >= 2, or give --arch p2p or --arch allreduce "
                              "(they run on 1 rank)")
        need(cfg.servers < world_size, f"--servers {cfg.servers} leaves no worker among {world_size} "
                                       f"ranks; need mpiexec -n N with N > {cfg.servers}")
    else:
        need(cfg.servers == 1, f"--servers does not apply to --arch {cfg.arch} ("
                               + ("every rank owns 1/N of w)" if cfg.arch == "p2p" else "it has no servers)"))
    need(cfg.allreduce == "ring" or cfg.arch == "allreduce",
         f"--allreduce chooses --arch allreduce's algorithm; with --arch {cfg.arch} it does not apply")
    if cfg.arch == "allreduce":
        need(cfg.mode in ("async", "sync"), "--arch allreduce is synchronous; --mode ssp does not apply")
        need(cfg.compress == "none", "--compress 1bit needs --arch ps or p2p (allreduce sums Delta-w as it is)")
    need(cfg.hidden >= 1, f"--hidden must be >= 1, got {cfg.hidden}")
    ps_workers = world_size - cfg.servers
    need(cfg.backup_workers >= 0, f"--backup-workers must be >= 0, got {cfg.backup_workers}")
    if cfg.backup_workers:
        need(cfg.mode == "sync" and cfg.arch == "ps", "--backup-workers needs --mode sync with --arch ps "
             "(async and ssp never wait for a round)")
        need(cfg.backup_workers < ps_workers, f"--backup-workers {cfg.backup_workers} must leave at least one "
             f"of the {ps_workers} workers a round waits for")
        need(cfg.model_parallel == 1, "--backup-workers with --model-parallel: a replica's members push one step "
             "together, so a round cannot drop one of them")
    if cfg.fault_tolerant:
        need(cfg.arch == "ps", f"--fault-tolerant keeps training when workers die, which needs parameter servers: "
             f"with --arch {cfg.arch} every rank holds state no other can rebuild (use python -m asgd.launch "
             "--max-restarts instead)")
        need(cfg.model_parallel == 1, "--fault-tolerant with --model-parallel: a lost member would leave its "
             "replica without a slice (use python -m asgd.launch --max-restarts instead)")
    K = cfg.model_parallel
    workers = world_size - (cfg.servers if cfg.arch == "ps" else 0)
    need(K >= 1, f"--model-parallel must be >= 1, got {K}")
    need(cfg.hidden % K == 0, f"--model-parallel {K} does not divide --hidden {cfg.hidden}: every slice of "
                              "the hidden layer must be the same size")
    need(K <= workers, f"--model-parallel {K} needs at least {K} workers, got {workers}")
    need(workers % K == 0, f"--model-parallel {K} does not divide the {workers} workers into replicas: use a "
                           f"worker count that is a multiple of {K}")
    need(K == 1 or cfg.arch != "allreduce" or not (cfg.checkpoint_every or "").endswith("s"),
         "--arch allreduce with --model-parallel checkpoints every N updates, not every N seconds "
         "(its slices' ranks decide alone, by their count)")
    need(cfg.batch >= 1, f"--batch must be >= 1, got {cfg.batch}")
    need(cfg.epochs is None or cfg.epochs >= 1, f"--epochs must be >= 1, got {cfg.epochs}")
    try:
        delimiter_option(cfg.delimiter)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    need(cfg.data is not None or (cfg.delimiter == "auto" and cfg.header is None and cfg.label_column is None),
         "--delimiter, --header and --label-column describe a --data file")
    need(cfg.lr is None or (math.isfinite(cfg.lr) and cfg.lr > 0),
         f"--lr must be a positive finite number, got {cfg.lr}")
    need(cfg.classes is None or cfg.classes >= 2, f"--classes must be >= 2, got {cfg.classes}")
    need(math.isfinite(cfg.timeout) and cfg.timeout >= 0, f"--timeout must be >= 0 seconds, got {cfg.timeout}")
    need(math.isfinite(cfg.progress) and cfg.progress > 0, f"--progress must be > 0 seconds, got {cfg.progress}")
    need(math.isfinite(cfg.stall_timeout) and cfg.stall_timeout >= 0,
         f"--stall-timeout must be >= 0 seconds, got {cfg.stall_timeout}")
    checkpoint_every(cfg.checkpoint_every)
    eval_cadence(cfg.eval_every)
    validate_target(cfg)
    need(cfg.test is None or cfg.data is not None, "--test needs --data")
    need(cfg.reader in READERS, f"--reader must be one of {', '.join(READERS)}, got {cfg.reader!r}")
    trace_window(cfg.trace_steps)


def checkpoint_every(spec: str | None) -> tuple[str, float] | None:
    """--checkpoint-every: '500' (updates of the shard) or '30s' (seconds)."""
    return interval(spec, "--checkpoint-every") if spec else None


def eval_cadence(spec: str) -> Cadence:
    """--eval-every: 'auto', 'epoch', '200' (updates) or '0.5s' (seconds)."""
    if spec in ("auto", "epoch"):
        return Cadence(spec)
    return Cadence(*interval(spec, "--eval-every", "auto, epoch, "))


def interval(spec: str, option: str, other: str = "") -> tuple[str, float]:
    """'500' -> ('updates', 500); '30s' -> ('seconds', 30.0): `option`'s N or Ns
    (`other`: the forms it also takes, for the message)."""
    try:
        n = float(spec[:-1]) if spec.endswith("s") else int(spec)
    except ValueError:
        raise ConfigError(f"{option} must be {other}N (updates) or Ns (seconds), got {spec!r}") from None
    if not (math.isfinite(n) and n > 0):
        raise ConfigError(f"{option} must be positive, got {spec!r}")
    return ("seconds" if spec.endswith("s") else "updates", n)


def trace_window(spec: str) -> tuple[int, int]:
    """'A:B' -> (A, B), the worker steps a trace records."""
    try:
        a, b = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ConfigError(f"--trace-steps must be A:B with integers A < B, got {spec!r}") from None
    if not 0 <= a < b:
        raise ConfigError(f"--trace-steps must be A:B with 0 <= A < B, got {spec!r}")
    return a, b


def validate_target(cfg: Config) -> None:
    """--target-accuracy A in (0, 1], --target-loss L > 0, not both; they and a chosen
    --eval-every need a run whose rank 0 evaluates the held-out set during training."""
    a, loss = cfg.target_accuracy, cfg.target_loss
    if a is not None and not 0 < a <= 1:
        raise ConfigError(f"--target-accuracy must be in (0, 1], got {a}")
    if loss is not None and not (math.isfinite(loss) and loss > 0):
        raise ConfigError(f"--target-loss must be a positive finite number, got {loss}")
    if a is not None and loss is not None:
        raise ConfigError("give --target-accuracy or --target-loss, not both")
    if cfg.eval_deferred and cfg.eval_every == "auto":
        raise ConfigError("--eval-deferred needs --eval-every N, Ns or epoch: auto paces evaluations by "
                          "what they cost, and a copy of w costs next to nothing")
    asked = ("--target-accuracy" if a is not None else "--target-loss" if loss is not None
             else "--eval-every" if cfg.eval_every != "auto" else None)
    why = no_evaluation_in_training(cfg)
    if asked and why:
        raise ConfigError(f"{asked} needs the held-out evaluation during training, which needs all of w on "
                          f"rank 0: {why}")


def no_evaluation_in_training(cfg: Config) -> str | None:
    """Why rank 0 cannot evaluate the held-out set during training (it holds all of w
    only with one parameter server, or as p2p's and allreduce's rank 0 without slices),
    or None: it can."""
    if cfg.arch == "ps" and cfg.servers > 1:
        return f"use --servers 1 (got {cfg.servers})"
    if cfg.arch != "ps" and cfg.model_parallel > 1:
        return f"--arch {cfg.arch} with --model-parallel holds slices"
    return None


def default_out(world_size: int) -> str:
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S") + f"-n{world_size}")
