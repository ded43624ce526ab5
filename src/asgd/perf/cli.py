"""python -m asgd.perf calibrate | predict | compare | optimize | pilot | report: the performance
lab at the command line (the analytical model is asgd.perf.analytic and
asgd.perf.architectures; the measurements asgd.probes).

  calibrate   measure this machine's parameters (asgd.probes.calibrate) into params.json
  predict     predicted init, compute, communication and total seconds per configuration
  compare     predicted against measured for asgd.train runs (their results.json)
  optimize    the configurations with the least predicted time, ranked (Yan et al. 2015); with a
              target, by predicted time to it (the pilot's statistics, asgd.perf.statistics)
  report      the paper's figures from runs' results.json, or one HTML page of them (--html)
  pilot       short runs on the data: what a configuration's epochs to a target depend on

predict, compare and optimize read the parameters from --params (default params.json);
report only with --html --params.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import shlex
import statistics
import sys
import warnings
from dataclasses import asdict, replace

from ..core.schedule import effective_mode
from ..core.wire import PRECISIONS
from ..data import formats, problem
from ..data.shares import HOLDOUT
from ..net import OPTIMIZERS
from ..run import config, signals
from ..run.files import atomic_write
from ..run.results import why_no_rate
from . import analytic, html, report
from .statistics import PILOT_BATCHES, Statistics, samples_to_target
from .to_target import rank_to_target, what_binds
from .analytic import Params, Run
from .architectures import ARCHES, cluster_links, predict

TRAIN = config.Config()   # asgd.train's defaults: a prediction of a default run predicts that run

PHASES = ("init", "train", "total")  # the paper's two phases (Figure 9) and their sum: what runs measure
DETAIL = ("compute", "comm")         # inside train: a worker's compute, and its waits and sends


class PerfError(RuntimeError):
    pass


def warnings_in_one_line(prog: str) -> None:
    """Print a warning (a run priced at another precision's rates: analytic.PrecisionFallback)
    as one line of this command's, not Python's file, line and source."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"{prog}: warning: {message}", file=file or sys.stderr)
    warnings.showwarning = show


def load_params(path: str) -> Params:
    try:
        with open(path) as f:
            got = json.load(f)
        return Params.from_file(got)
    except FileNotFoundError:
        raise PerfError(f"{path}: no such file; measure this machine first: "
                         f"python -m asgd.perf calibrate --out {path}") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise PerfError(f"{path}: not a parameters file from 'asgd.perf calibrate' ({e})") from None


# -- the data a configuration reads ------------------------------------------------------

def data_of(path: str | None, points: int | None, fmt: str, p: Params, label_column: str | None = None,
            classes: int | None = None) -> dict:
    """Run fields for the data: a real file (size, points, held-out companion, features
    and classes), a file of `points` points in `fmt` that need not exist, or the embedded
    problem."""
    if path:
        binary = formats.is_binary(path)
        size = os.path.getsize(path)
        n = _points(path, binary)
        features, classes = _shape(path, label_column, classes, os.stat(path).st_mtime_ns)
        shape = dict(features=features, classes=classes, binary=binary)
        test = formats.test_path(path)
        if os.path.exists(test):
            tn = _points(test, binary)
            return dict(points=n, test_points=tn, file_bytes=size, test_bytes=os.path.getsize(test), **shape)
        held = n // HOLDOUT  # without a held-out file, the readers hold out 1/HOLDOUT of it
        return dict(points=n - held, test_points=held, file_bytes=size, test_bytes=0, **shape)
    if fmt == "embedded":
        return dict(points=points or problem.DEFAULT_POINTS,
                    test_points=points // 4 if points else problem.DEFAULT_TEST_POINTS)
    n = points or 16384
    per = p.bytes_per_point[fmt]
    return dict(points=n, test_points=n // 4, file_bytes=int(n * per), test_bytes=int(n // 4 * per),
                binary=fmt == "npy")


@functools.lru_cache(maxsize=8)
def _shape(path: str, label_column: str | None, classes: int | None, mtime_ns: int) -> tuple[int, int]:
    """formats.shape_of, once per file version: it reads the whole label column, and
    optimize --measure asks before and after its pilot."""
    return formats.shape_of(path, label_column, classes)


def label_args(a) -> list[str]:
    """asgd.train's options that pick a --data file's labels, as this command was given them."""
    return ((["--label-column", a.label_column] if a.label_column else [])
            + (["--classes", str(a.classes)] if a.classes else []))


def _points(path: str, binary: bool) -> int:
    """Data points in a file: a .npy header's rows, a .npz's labels, or a text file's lines
    after its header (as asgd.train counts them: a header is not a point)."""
    if binary:
        return formats.npy_header(path)[1]
    if formats.is_npz(path):
        return len(formats.read_npz(path)[1])
    return _count_lines(path, formats.dialect_of(path).start)


def _count_lines(path: str, start: int = 0) -> int:
    """Lines from byte `start` on, the last one counted without its newline too."""
    with open(path, "rb") as f:
        f.seek(start)
        n, last = 0, b"\n"
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n, last = n + chunk.count(b"\n"), chunk[-1:]
        return n + (last != b"\n")


def run_of(results: dict, p: Params) -> Run:
    """The Run a results.json describes (its config), for predicting it."""
    c = results["config"]
    d = c.get("data")
    got = dict(points=c["train_points"], test_points=c["test_points"])  # as the run counted them
    if d:
        binary = d.lower().endswith(".npy")
        test = c.get("test") or formats.test_path(d)
        if os.path.exists(d):  # the sizes only: the points are known
            got.update(binary=binary, file_bytes=os.path.getsize(d),
                       test_bytes=os.path.getsize(test) if os.path.exists(test) else 0)
        else:  # the file is gone: its size from the calibrated bytes per point
            n = c["train_points"] + c["test_points"]
            got.update(binary=binary, file_bytes=int(n * p.bytes_per_point["npy" if binary else "tsv"]))
    arch = c.get("arch", "ps")
    epochs, t = c["epochs"], results.get("target") or {}
    if t.get("reached") and t.get("epochs") is not None and not c.get("eval_deferred"):
        epochs = min(epochs, math.ceil(t["epochs"]))   # it ended at its target, in the epoch it had begun
    return Run(workers=c["workers"], servers=max(c["servers"], 1) if arch == "ps" else c["servers"],
               batch=c["batch"], hidden=c["hidden"], epochs=epochs, reader=c["reader"], mode=c["mode"],
               backup=c.get("backup_workers", 0),
               features=c["features"], classes=c["classes"], cores=c.get("cores", 0), arch=arch,
               model_parallel=c.get("model_parallel", 1), optimizer=c.get("optimizer", "sgd"),
               allreduce=c.get("allreduce") or "ring", precision=c.get("precision", "float64"),   # before it: float64
               overlap=c.get("overlap", "on"),   # before --overlap, workers always overlapped
               eval_every=c.get("eval_every", "epoch"),   # before --eval-every, every epoch's end
               eval_deferred=c.get("eval_deferred", False), **got)


COMM_PHASES = ("push", "comm_wait", "replica_sum", "aggregate")   # a worker's (peer's) time beside its step


def measured(results: dict) -> dict:
    """Measured seconds per phase: init, train, total (job level), and the workers' (p2p's
    peers') mean compute and communication (push, waits, the replica's logit sums, and
    what a peer serves or an allreduce rank applies: everything of training but the step)."""
    workers = [r for r in results["ranks"] if r["role"] in ("worker", "peer")]
    def mean(*keys):
        return statistics.fmean(sum(r["phases"].get(k, 0.0) for k in keys) for r in workers)
    return {"init": results["init_s"], "train": results["train_s"], "total": results["wall_s"],
            "compute": mean("compute"), "comm": mean(*COMM_PHASES)}


def predicted(pr: analytic.Prediction) -> dict:
    return {"init": pr.init_s, "train": pr.train_s, "total": pr.total_s, "compute": pr.compute_s, "comm": pr.comm_s}


def ape(pred: float, meas: float) -> float:
    """Absolute percentage error of a prediction, % of the measured value."""
    return abs(pred - meas) / meas * 100 if meas > 0 else math.inf


def paper_total(p: Params, run: Run) -> float:
    """The paper's own prediction with these calibrated parameters, for contrast: section
    5.3's T_total_new (eq. 12's reading) for the sequential reader and the embedded
    problem (every rank builds all of it), eq. 9 for the parallel one. It knows no
    start-up, no cores shared and no server queue."""
    t = p.table1(run)
    if run.reader == "parallel" and run.file_bytes:
        return analytic.T_total(t)
    return analytic.T_total_new(t, 0.0)


def compare(paths: list[str], p: Params) -> tuple[list[dict], list[str]]:
    """One row per usable run: its configuration, predicted and measured seconds and the
    APE per phase. Runs the model does not cover (dry runs, stopped early, resumed, 1-bit
    messages) and trainings too short to time (asgd.train's MIN_TRAIN_S) are skipped, with
    the reason."""
    rows, skipped = [], []
    for path in paths:
        f = os.path.join(path, "results.json") if os.path.isdir(path) else path
        try:
            with open(f) as fh:
                res = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            skipped.append(f"{path}: unreadable ({e})")
            continue
        c = res.get("config", {})
        why = ("dry run: nothing trained" if res.get("dry_run") else
               "stopped early" if res.get("stopped") else "resumed from a checkpoint" if c.get("resume") else
               "--compress 1bit (the model prices plain messages)" if c.get("compress", "none") != "none" else
               # asgd.train's own word: too short to time is clock noise, not an error (a simulated clock has none)
               None if res.get("simulated") else why_no_rate(res["train_s"]))
        if why:
            skipped.append(f"{path}: {why}")
            continue
        run = run_of(res, p)
        pr, me = predicted(predict(p, run)), measured(res)
        row = {"run": path, "arch": run.arch, "workers": run.workers, "servers": run.dedicated_servers,
               "model_parallel": run.model_parallel, "optimizer": run.optimizer, "batch": run.batch,
               "hidden": run.hidden, "reader": run.reader if run.file_bytes else "embedded",
               "epochs": run.epochs, "mode": effective_mode(run.arch, run.mode)}
        for k in PHASES + DETAIL:
            row.update({f"{k}_pred_s": pr[k], f"{k}_meas_s": me[k], f"{k}_ape": ape(pr[k], me[k])})
        paper = paper_total(p, run)
        row.update(paper_total_pred_s=paper, paper_total_ape=ape(paper, me["total"]))
        rows.append(row)
    return rows, skipped


def error_summary(rows: list[dict], phases=PHASES + DETAIL) -> dict:
    """Median and 90th percentile APE per phase over all rows."""
    out = {}
    for k in phases:
        e = sorted(r[f"{k}_ape"] for r in rows)
        if e:
            out[k] = {"median": statistics.median(e), "p90": e[min(len(e) - 1, math.ceil(0.9 * len(e)) - 1)]}
    return out


def optimize(p: Params, nodes: int, cores_per_node: int, base: Run, workers: list[int], servers: list[int],
             batches: list[int], readers: list[str], max_ranks: int | None = None, archs=("ps",),
             Ks=(1,), memory_bytes: float = 0.0, shared_cores: bool = False) -> list[dict]:
    """Yan et al.'s scalability optimizer over asgd's choices: every configuration of the
    grid (architecture x servers x model-parallel K x workers x batch x reader) within
    max_ranks ranks (default one per core), ranked by predicted total time (init and
    `base.epochs` epochs of training). Ranks fill the nodes in blocks: a node's ranks share
    its cores and its link (p.link_s: a link's time per message, none on one node);
    shared_cores: every rank has a host of its own but all share `cores_per_node` cores (the
    emulated cluster). memory_bytes: a node's memory; a configuration whose ranks' buffers
    exceed it is left out (0: no limit)."""
    limit = max_ranks or nodes * cores_per_node
    out = []
    for run in configurations(base, archs, workers, servers, Ks, batches, readers if base.file_bytes else ["parallel"],
                              limit):
        per_node = 0 if shared_cores or nodes == 1 else math.ceil(run.ranks / nodes)
        run = replace(run, cores=cores_per_node, node_ranks=per_node)
        need = memory_of(run) * (per_node or run.ranks) / run.ranks
        if memory_bytes and need > memory_bytes:
            continue
        pr = predict(p, run)
        out.append({"arch": run.arch, "workers": run.workers, "servers": run.dedicated_servers,
                    "model_parallel": run.model_parallel, "replicas": run.replicas, "batch": run.batch,
                    "reader": run.reader if base.file_bytes else "embedded", "ranks": run.ranks,
                    "init_s": pr.init_s, "train_s": pr.train_s, "total_s": pr.total_s,
                    "per_epoch_s": pr.train_s / run.epochs, "bound": pr.detail["bound"],
                    "iteration_s": pr.detail.get("iteration_s"), "memory_bytes": need,
                    "memory_share": need / memory_bytes if memory_bytes else None})
    out.sort(key=lambda r: r["total_s"])
    if out and out[0]["memory_share"] and out[0]["memory_share"] > 0.8:
        out[0]["bound"] = "memory"   # the winner barely fits: memory decides what can run at all
    return out


def optimize_in_modes(modes: list[str], p: Params, nodes: int, cores_per_node: int, base: Run, *args,
                      archs=("ps",), **kw) -> list[dict]:
    """optimize's grid in each consistency mode, each row with its `mode`, best total first;
    allreduce's rows once (lockstep whatever the mode: "sync")."""
    out = []
    for i, mode in enumerate(modes):
        kinds = [x for x in archs if x != "allreduce" or i == 0]
        rows = optimize(p, nodes, cores_per_node, replace(base, mode=mode), *args, archs=kinds, **kw) if kinds else []
        out += [{**r, "mode": effective_mode(r["arch"], mode)} for r in rows]
    return sorted(out, key=lambda r: r["total_s"])


def configurations(base: Run, archs, workers, servers, Ks, batches, readers, limit: int):
    """The grid's Runs that asgd.train would accept, within `limit` ranks."""
    for arch in archs:
        for K in Ks:
            if base.hidden % K:
                continue
            for w in workers:
                if w % K:
                    continue
                for s in (servers if arch == "ps" else [w if arch == "p2p" else 0]):
                    if w + (s if arch == "ps" else 0) > limit:
                        continue
                    for b in batches:
                        for r in readers:
                            yield replace(base, arch=arch, workers=w, servers=s, model_parallel=K, batch=b, reader=r)


def memory_of(run: Run) -> float:
    """Bytes of parameter-sized buffers the job's ranks hold together (results.json's
    weight_bytes, estimated): a worker's w, Delta-w, its second push buffer and w' (of its
    slice); a server's shard, optimizer state, and a receive and a reply buffer per worker
    it serves; allreduce ranks' w, its sum buffers and optimizer state; p2p peers both."""
    state = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2}[run.optimizer]
    n = run.value_bytes * run.n_w
    worker = 4 * n / run.model_parallel
    if run.arch == "allreduce":
        return run.workers * (3 + state) * n / run.model_parallel
    # every shard (all of w together) with its state, and a receive and a reply buffer for
    # each of its pushers: the W / K members of its slice
    served = n * (1 + state) + 2 * n * run.workers / run.model_parallel
    return run.workers * worker + served


# -- command line ---------------------------------------------------------------------------

def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def _data_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("data (default: the embedded problem)")
    g.add_argument("--data", help="a real data file: points, size, features, classes and held-out companion from it")
    g.add_argument("--label-column", metavar="NAME|INDEX", help="the --data file's label column, as asgd.train's "
                   "(default: the last)")
    g.add_argument("--classes", type=positive_int, help="the --data file's classes, as asgd.train's (default: from "
                   "the labels)")
    g.add_argument("--points", type=positive_int, help="training points of a file that need not exist")
    g.add_argument("--format", choices=("tsv", "npy", "embedded"), default=None,
                   help="with --points: tsv or npy file, or the embedded problem (default tsv with --points)")
    g.add_argument("--epochs", type=positive_int, help="passes over the data (default as asgd.train's: "
                   f"{config.EMBEDDED_EPOCHS} on the embedded problem; a file's by its size)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m asgd.perf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate", help="measure this machine's parameters")
    c.add_argument("--out", default="params.json", help="parameters file to write (default params.json)")
    c.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (seconds, not minutes)")
    c.add_argument("--launcher", default=None, help="MPI launcher command, e.g. 'srun' (default: mpiexec)")
    params = dict(default="params.json", help="parameters from calibrate (default params.json)")

    pp = sub.add_parser("predict", help="predicted phase times per configuration")
    pp.add_argument("--workers", type=int_list, default=[1, 2, 4, 8, 16], help="comma-separated (default 1,2,4,8,16)")
    pp.add_argument("--servers", type=positive_int, default=1, help="parameter servers (default 1)")
    pp.add_argument("--hidden", type=int_list, help="hidden units, comma-separated (default as asgd.train's: "
                    f"{config.EMBEDDED_HIDDEN} on the embedded problem, {config.FILE_HIDDEN} for a file)")
    pp.add_argument("--batch", type=int_list, default=[256], help="batch sizes, comma-separated (default 256)")
    pp.add_argument("--reader", choices=("sequential", "parallel"), default="parallel",
                    help="data reader, as asgd.train's (default parallel; no effect on the embedded problem)")
    pp.add_argument("--mode", choices=("async", "ssp", "sync"), default="async",
                    help="consistency mode, as asgd.train's (default async; ssp is predicted as async)")
    pp.add_argument("--arch", choices=("ps", "p2p", "allreduce"), default="ps", help="as asgd.train's (default ps)")
    pp.add_argument("--model-parallel", type=positive_int, default=1, help="as asgd.train's (default 1)")
    pp.add_argument("--optimizer", choices=OPTIMIZERS, default=TRAIN.optimizer,
                    help="the servers' optimizer, as asgd.train's (default %(default)s)")
    pp.add_argument("--allreduce", choices=("ring", "mpi"), default="ring", help="as asgd.train's (default ring)")
    pp.add_argument("--precision", choices=PRECISIONS, default=TRAIN.precision,
                    help="as asgd.train's (default %(default)s): the bytes of a value of w on links and in "
                         "memory, and calibrate's compute and exchange rates measured in it")
    pp.add_argument("--cores", type=positive_int, default=0,
                    help="cores the ranks share (default: the calibrated machine's)")
    pp.add_argument("--params", **params)
    pp.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    _data_args(pp)

    cp = sub.add_parser("compare", help="predicted against measured for asgd.train runs")
    cp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (or their results.json)")
    cp.add_argument("--params", **params)
    cp.add_argument("--csv", help="also write the rows to this CSV file")

    op = sub.add_parser("optimize", help="which architecture, how many ranks of each, which batch: the "
                        "configurations ranked by predicted time (Yan et al. 2015)")
    op.add_argument("--nodes", type=positive_int, default=1, help="nodes (default 1; with a testbed's params, "
                    "its hosts)")
    op.add_argument("--cores-per-node", type=positive_int, required=True, help="cores per node")
    op.add_argument("--link-gbps", type=float, help="each node's link, Gbit/s each way (needed with --nodes > 1, "
                    "unless --params holds a testbed's links: asgd.testbed.model)")
    op.add_argument("--link-latency-us", type=float, default=50.0, help="one-way latency per message over a link, "
                    "us (default 50)")
    op.add_argument("--memory-gb", type=float, help="memory per node, GB (default: this machine's); "
                    "configurations that do not fit are left out")
    op.add_argument("--hidden", type=positive_int, help="hidden units (default as asgd.train's: "
                    f"{config.EMBEDDED_HIDDEN} on the embedded problem, {config.FILE_HIDDEN} for a file)")
    op.add_argument("--archs", default="ps,p2p,allreduce", help="architectures to try (default ps,p2p,allreduce)")
    op.add_argument("--workers", type=int_list, help="worker counts to try (default 1 .. ranks)")
    op.add_argument("--servers", type=int_list, default=[1, 2, 4], help="server counts to try with ps (default 1,2,4)")
    op.add_argument("--model-parallel", type=int_list, default=[1, 2], help="model-parallel K to try (default 1,2)")
    op.add_argument("--batches", type=int_list, default=[16, 64, 256, 1024], help="default 16,64,256,1024")
    op.add_argument("--readers", default="parallel", help="default parallel (also: sequential)")
    op.add_argument("--mode", metavar="MODES",
                    help="consistency modes of ps and p2p to try, as asgd.train's --mode, comma-separated (default "
                         "async; with a target async,sync, which trade speed for staleness; allreduce is lockstep)")
    op.add_argument("--optimizer", choices=OPTIMIZERS, default=TRAIN.optimizer,
                    help="as asgd.train's (default %(default)s)")
    op.add_argument("--allreduce", choices=("ring", "mpi"), default="ring", help="as asgd.train's (default ring)")
    op.add_argument("--precision", choices=PRECISIONS, default=TRAIN.precision,
                    help="as asgd.train's (default %(default)s): the bytes of a value of w on links and in "
                         "memory, and calibrate's compute and exchange rates measured in it")
    op.add_argument("--max-ranks", type=positive_int,
                    help="most ranks to start (default: one per core, or per host of a testbed)")
    op.add_argument("--top", type=positive_int, default=10, help="configurations to print (default 10)")
    op.add_argument("--json", action="store_true", help="one JSON line per configuration, best first, each "
                    "with its ranks and argv (asgd.train's options that run it)")
    tg = op.add_mutually_exclusive_group()
    tg.add_argument("--target-accuracy", type=float, metavar="A", help="rank by predicted time to held-out "
                    "accuracy A: epochs to it (from --params' statistics: python -m asgd.perf pilot) x s/epoch "
                    "+ start-up; as asgd.train's targets, one server and no --model-parallel")
    tg.add_argument("--target-loss", type=float, metavar="L", help="as --target-accuracy, held-out loss L")
    op.add_argument("--params", **params)
    op.add_argument("--measure", action="store_true", help="first measure what --params lacks for this question: "
                    "calibrate this machine if the file does not exist (minutes), and with a target pilot the data "
                    "if its statistics are of other data, another optimizer or never reached the target (at most "
                    "about 2 minutes); both are kept in the file, so the next call is instant")
    op.add_argument("--launcher", help="with --measure: MPI launcher command (default: mpiexec beside this Python)")
    _data_args(op)

    pl = sub.add_parser("pilot", help="short runs on your data: the statistics optimize --target-* needs "
                        "(noise scale, staleness cost, each optimizer's reference)")
    pl.add_argument("--params", **{**params, "help": "parameters file to add the statistics to (a calibrate "
                    "params.json, or a new file) (default params.json)"})
    pl.add_argument("--data", metavar="FILE", help="training data, as asgd.train's (default: the embedded problem)")
    pl.add_argument("--label-column", metavar="NAME|INDEX", help="as asgd.train's")
    pl.add_argument("--classes", type=positive_int, help="as asgd.train's")
    pl.add_argument("--hidden", type=positive_int, help="hidden units (default as asgd.train's)")
    pl.add_argument("--batch", type=positive_int, default=TRAIN.batch, help="the reference's and the "
                    "asynchronous pilots' batch (default %(default)s)")
    pl.add_argument("--batches", type=int_list, default=list(PILOT_BATCHES), help="the sequential pilots' other "
                    f"batches, whose epochs fit B_noise (default {','.join(map(str, PILOT_BATCHES))})")
    pl.add_argument("--optimizers", default=TRAIN.optimizer, help="optimizers to pilot, comma-separated; each "
                    "after the first also runs at the smallest --batches, for its own B_noise "
                    f"(default %(default)s; choose from {', '.join(OPTIMIZERS)})")
    pl.add_argument("--workers", type=int_list, default=[2, 4, 8], help="the asynchronous pilots' worker counts "
                    "(default 2,4,8)")
    pt = pl.add_mutually_exclusive_group()
    pt.add_argument("--target-accuracy", type=float, metavar="A", help="the pilots' target (default: 0.9 of the "
                    "way from the reference's first held-out accuracy to its best); optimize can then ask for "
                    "any target the reference reached")
    pt.add_argument("--target-loss", type=float, metavar="L", help="as --target-accuracy, of the held-out loss")
    pl.add_argument("--epochs", type=positive_int, help="the reference's epochs at most (default as asgd.train's)")
    pl.add_argument("--folder", help="where the pilot runs go (default: pilot/ beside --params)")
    pl.add_argument("--launcher", help="MPI launcher command (default: mpiexec beside this Python)")
    pl.add_argument("--timeout", type=float, default=120.0, help="seconds any one pilot run may take (default 120)")

    rp = sub.add_parser("report", help="the paper's profiling figures from runs' results.json")
    report.add_arguments(rp)
    return ap


def parse_args(argv):
    return build_parser().parse_args(argv)


def _fmt_s(x: float) -> str:
    return f"{x:9.3f}" if x < 1000 else f"{x:9.0f}"


def main(argv=None) -> int:
    a = parse_args(argv)
    warnings_in_one_line(f"asgd.perf {a.cmd}")
    try:
        if a.cmd == "calibrate":
            return _calibrate(a)
        if a.cmd == "report":
            return _report(a)
        if a.cmd == "pilot":
            return _pilot(a)
        if a.cmd == "optimize" and a.measure:
            _measure(a)
        p = load_params(a.params)
        return {"predict": _predict, "compare": _compare, "optimize": _optimize}[a.cmd](a, p)
    except BrokenPipeError:
        return signals.reader_left()
    except (PerfError, ValueError, OSError) as e:
        print(f"asgd.perf {a.cmd}: error: {e}", file=sys.stderr)
        return 2


def _report(a) -> int:
    if not a.html:
        if a.params:
            raise PerfError("--params goes with --html (the page's predicted against measured)")
        return report.write_figures(a.runs, a.out)
    compared = None
    if a.params:
        rows, skipped = compare(report.expand(a.runs), load_params(a.params))
        for s in skipped:
            print(f"not predicted: {s}", file=sys.stderr)
        compared = (rows, PHASES + DETAIL)
    return html.write_page(a.runs, a.out, compared)


def _calibrate(a) -> int:
    # here: the measurements load numba, which the other commands need not wait for
    from ..probes import CalibrationError
    from ..probes.calibrate import calibrate
    folder = os.path.dirname(os.path.abspath(a.out))
    try:   # before minutes of measuring: a folder that cannot be made fails now
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise PerfError(f"--out {a.out}: cannot make its folder {folder} ({e.strerror})") from None
    try:
        got = calibrate(a.launcher, a.quick)
    except CalibrationError as e:
        raise PerfError(str(e)) from None
    kept = _file_part(a.out, "statistics")   # a pilot may have made the file first
    if kept:
        got["statistics"] = kept
    atomic_write(a.out, lambda f: json.dump(got, f, indent=1))
    if kept:
        print(f"kept {a.out}'s pilot statistics beside the new calibration")
    p = Params.from_dict(got["params"])
    t = p.table1(Run(workers=1, hidden=10000, batch=256))
    print(f"Table 1 on this machine (2-10K-2, batch 256), measured in {got['seconds']:.0f} s:")
    for k in ("c_p", "c_b", "c_u", "r_d", "r_m", "r_net", "point_bytes"):
        print(f"  {k:12s} {getattr(t, k):.4g} {analytic.Table1.UNITS[k]}")
    pp = p.pingpong_s
    print(f"  {'MPI':12s} {min(pp.values()) * 1e6:.1f} us latency, {1 / p.r_net() / 1e9:.2f} GB/s "
          f"(ping-pong, {min(pp)} to {max(pp):,} bytes)")
    st = p.startup
    print(f"  {'startup':12s} {sum(v for k, v in st.items() if k.endswith('wall_s')):.3f} s per rank "
          f"(imports {st['imports_wall_s']:.3f}, cache loads {st['parsers_wall_s'] + st['kernels_wall_s']:.3f}); "
          f"{p.cores} cores")
    print(f"parameters: {a.out}")
    return 0


def _pilot(a) -> int:
    # here: the probes are a layer above the model
    from ..probes.pilot import PILOT_SHARE, PilotError, add_statistics, pilot
    optimizers = _words(a.optimizers, OPTIMIZERS, "optimizer")
    # training points, as asgd.train counts them
    points = data_of(a.data, None, "embedded", None, a.label_column, a.classes)["points"]
    hidden = a.hidden or config.default_hidden(not a.data)
    epochs = a.epochs or config.default_epochs(points if a.data else None)
    args = ["--hidden", str(hidden)] + (["--data", a.data] if a.data else [])
    args += label_args(a)
    target = _target(a)
    folder = a.folder or os.path.join(os.path.dirname(os.path.abspath(a.params)), "pilot")
    print(f"pilot: {', '.join(optimizers)}; references of 1 worker, asynchronous pilots of "
          f"{', '.join(map(str, a.workers))} workers and 2 in lockstep, batch {a.batch}; 1 worker at batches "
          f"{', '.join(map(str, a.batches))}; hidden {hidden}; "
          + (f"target {target[0]} {target[1]:g}" if target else f"target {PILOT_SHARE:g} of the reference's gain")
          + f"; runs in {folder}")
    try:
        stats = pilot(args, points, a.batch, optimizers, a.workers, target, epochs, folder, a.launcher,
                      a.timeout, tuple(a.batches))
    except PilotError as e:
        raise PerfError(str(e)) from None
    add_statistics(a.params, stats)
    print(f"pilot took {stats['pilot']['seconds']:.0f} s; statistics added to {a.params}")
    return 0


def _measure(a) -> None:
    """optimize --measure: calibrate and pilot where --params lacks them for this question."""
    target = _target(a)
    launcher = ["--launcher", a.launcher] if a.launcher else []
    if not _file_part(a.params, "params"):
        why = "has no calibration" if os.path.exists(a.params) else "does not exist"
        print(f"optimize --measure: {a.params} {why}: calibrating this machine first (minutes, once)", flush=True)
        _calibrate(parse_args(["calibrate", "--out", a.params, *launcher]))
    if target is None:
        return
    why = _pilot_missing(a, target)
    if why:
        print(f"optimize --measure: {why}: piloting the data first (up to about 2 minutes)", flush=True)
        _pilot(parse_args(["pilot", "--params", a.params, "--optimizers", a.optimizer, f"--target-{target[0]}",
                           str(target[1]), *(["--data", a.data] if a.data else []),
                           *label_args(a), *(["--epochs", str(a.epochs)] if a.epochs else []),
                           *(["--hidden", str(a.hidden)] if a.hidden else []), *launcher]))


def _file_part(path: str, key: str):
    """`key`'s part of a parameters file (calibrate's "params", pilot's "statistics"); None if
    the file, or that part, is missing or unreadable."""
    try:
        with open(path) as f:
            got = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    return got.get(key) if isinstance(got, dict) else None


def _pilot_missing(a, target: tuple[str, float]) -> str | None:
    """Why the statistics in --params cannot answer this target (None: they can)."""
    with open(a.params) as f:
        got = json.load(f).get("statistics")
    if not got:
        return f"{a.params} has no pilot"
    stats = Statistics.from_dict(got)
    data = os.path.abspath(a.data) if a.data else "embedded"
    hidden = a.hidden or config.default_hidden(not a.data)
    if (stats.data, stats.hidden) != (data, hidden):
        return f"its pilot ran {stats.data} with hidden {stats.hidden}"
    ref = stats.references.get(a.optimizer)
    if ref is None:
        return f"its pilot did not run --optimizer {a.optimizer}"
    if samples_to_target(ref.curve, *target) is None:
        return f"its pilot's reference never reached held-out {target[0]} {target[1]:g}"
    return None


def _target(a) -> tuple[str, float] | None:
    return (("accuracy", a.target_accuracy) if a.target_accuracy is not None else
            ("loss", a.target_loss) if a.target_loss is not None else None)


def _base_run(a, p: Params) -> Run:
    """The data's run fields; --epochs and --hidden, when not given, by asgd.train's rule
    (written into `a`, so the headers print what was predicted)."""
    fmt = a.format or ("tsv" if a.points else "embedded")
    data = data_of(a.data, a.points, fmt, p, a.label_column, a.classes)
    embedded = fmt == "embedded" and not a.data
    if a.epochs is None:
        a.epochs = config.default_epochs(None if embedded else data["points"])
    if a.hidden is None:
        h = config.default_hidden(embedded)
        a.hidden = [h] if a.cmd == "predict" else h
    return Run(workers=1, epochs=a.epochs, **data)


def _predict(a, p: Params) -> int:
    base = _base_run(a, p)
    cols = ("workers servers  hidden  batch  reader       init_s compute_s    comm_s   train_s   total_s  bound"
            "    step fits in")
    if not a.json:
        what = "embedded problem" if not base.file_bytes else f"{'npy' if base.binary else 'text'} file"
        print(f"predicted, {base.points:,} training points ({what}), {a.epochs} epoch(s), "
              f"{a.cores or p.cores} cores, {a.mode}, --arch {a.arch}"
              + (f" --model-parallel {a.model_parallel}" if a.model_parallel > 1 else "")
              + f", {a.optimizer}, {a.precision}")
        print(cols)
    for h in a.hidden:
        for b in a.batch:
            for w in a.workers:
                run = replace(base, workers=w, servers=a.servers, hidden=h, batch=b, reader=a.reader,
                              mode=a.mode, cores=a.cores, arch=a.arch, model_parallel=a.model_parallel,
                              optimizer=a.optimizer, allreduce=a.allreduce, precision=a.precision)
                pr = predict(p, run)
                if a.json:
                    print(json.dumps({"run": asdict(run), **pr.as_dict()}))
                    continue
                print(f"{w:7d} {run.dedicated_servers:7d} {h:7d} {b:6d}  "
                      f"{a.reader if base.file_bytes else 'embedded':10s}"
                      f"{_fmt_s(pr.init_s)} {_fmt_s(pr.compute_s)} {_fmt_s(pr.comm_s)} {_fmt_s(pr.train_s)} "
                      f"{_fmt_s(pr.total_s)}  {pr.detail['bound']:8s} {pr.detail['cache_level']}")
    return 0


def _compare(a, p: Params) -> int:
    rows, skipped = compare(a.runs, p)
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    if not rows:
        raise PerfError("no run to compare")
    print("predicted / measured seconds, and the absolute percentage error (APE)")
    print(f"{'run':28s} {'arch':9s} {'mode':5s} {'w':>2s} {'S':>2s} {'hidden':>6s} {'batch':>5s} {'reader':10s}" +
          "".join(f" {k:>22s}" for k in PHASES + DETAIL))
    for r in rows:
        cells = "".join(f" {r[f'{k}_pred_s']:7.2f}/{r[f'{k}_meas_s']:6.2f} {r[f'{k}_ape']:5.0f}%"
                        for k in PHASES + DETAIL)
        print(f"{os.path.basename(os.path.normpath(r['run']))[-28:]:28s} {r['arch']:9s} {r['mode']:5s} "
              f"{r['workers']:2d} {r['servers']:2d} "
              f"{r['hidden']:6d} {r['batch']:5d} {r['reader']:10s}{cells}")
    print(f"APE over {len(rows)} runs:  " + "   ".join(
        f"{k} median {e['median']:.1f}% p90 {e['p90']:.1f}%" for k, e in error_summary(rows).items()))
    e = error_summary(rows, ("paper_total",))["paper_total"]
    print(f"the paper's own equations (eq. 9; 5.3's update for the sequential reader), same parameters: "
          f"total median {e['median']:.1f}% p90 {e['p90']:.1f}%")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
        print(f"rows: {a.csv}")
    return 0


def load_statistics(path: str) -> Statistics:
    """The pilot's statistics in a parameters file (python -m asgd.perf pilot)."""
    with open(path) as f:
        got = json.load(f).get("statistics")
    if not got:
        raise PerfError(f"{path}: no statistics for a target; measure them first: "
                        f"python -m asgd.perf pilot --params {path} (with the same --data)")
    return Statistics.from_dict(got)


def train_argv(r: dict, base: Run, hidden: int, data: str | None, target: list[str],
               labels: list[str] = ()) -> list[str]:
    """asgd.train's options that run optimize's row r (started on r['ranks'] ranks); labels:
    the data's label options (label_args)."""
    argv = ["--arch", r["arch"]] + (["--servers", str(r["servers"])] if r["arch"] == "ps" else [])
    argv += ["--model-parallel", str(r["model_parallel"])] if r["model_parallel"] > 1 else []
    argv += ["--allreduce", base.allreduce] if r["arch"] == "allreduce" else ["--mode", r["mode"]]
    argv += ["--batch", str(r["batch"]), "--hidden", str(hidden), "--optimizer", base.optimizer,
             "--precision", base.precision]
    argv += ["--data", data, "--reader", r["reader"]] if data else []
    argv += list(labels) if data else []
    return argv + target


# A run to a target gets --epochs of at least this many times its predicted epochs (and
# asgd.train's default, if more): a newcomer's picks took 2 epochs where 0.61 were
# predicted (569 rows), and one predicted at 37.5 epochs ended short of its target at the
# default cap of 40 (17,500 rows; it took 43.4).
TARGET_EPOCHS_ROOM = 4


def _optimize(a, p: Params) -> int:
    target = _target(a)
    stats = load_statistics(a.params) if target else None
    if target:   # asgd.train stops at a target where rank 0 holds all of w
        a.servers, a.model_parallel = [1], [1]
    modes = optimize_modes(a.mode, target is not None)
    base = replace(_base_run(a, p), hidden=a.hidden, mode=modes[0], optimizer=a.optimizer, allreduce=a.allreduce,
                   precision=a.precision)
    readers = _words(a.readers, ("sequential", "parallel"), "reader")
    archs = _words(a.archs, ARCHES, "architecture")
    testbed = bool(p.link_s)
    if testbed and a.link_gbps:
        raise PerfError("--link-gbps with a testbed's params (they hold its links): give one or the other")
    if a.nodes > 1 and not testbed and not a.link_gbps:
        raise PerfError("--nodes > 1 needs the links between them: --link-gbps G (and --link-latency-us)")
    where = "one node, shared memory"
    if a.link_gbps:
        p = cluster_links(p, a.link_gbps * 1e9 / 8, a.link_latency_us * 1e-6)
        where = f"{a.nodes} nodes x {a.cores_per_node} cores, {a.link_gbps:g} Gbit/s links"
    elif testbed:
        where = f"a testbed of {a.nodes} hosts sharing {a.cores_per_node} cores, its links"
    limit = a.max_ranks or (a.nodes if testbed else a.nodes * a.cores_per_node)
    memory = a.memory_gb * 1e9 if a.memory_gb else _memory_bytes()
    workers = a.workers or list(range(1, limit + 1))
    ranked = optimize_in_modes(modes, p, a.nodes, a.cores_per_node, base, workers, a.servers, a.batches, readers,
                               limit, archs=archs, Ks=a.model_parallel, memory_bytes=memory, shared_cores=testbed)
    if not ranked:
        raise PerfError(f"no configuration fits in {limit} ranks (--max-ranks) and the memory")
    goal = [f"--target-{target[0]}", f"{target[1]:g}"] if target else ["--epochs", str(a.epochs)]
    for r in ranked:
        r["argv"] = train_argv(r, base, a.hidden, a.data, goal, label_args(a))
    if target:
        _same_problem(stats, a)
        _reference_reaches(stats, a.optimizer, target)
        ranked = rank_to_target(ranked, stats, *target, a.optimizer, TRAIN.staleness)
        for r in ranked:   # asgd.train stops at the target: --epochs is its cap, with room for the prediction's misses
            r["argv"] += ["--epochs", str(max(a.epochs, math.ceil(TARGET_EPOCHS_ROOM * r["epochs_to_target"])))]
    if a.json:
        for r in ranked:
            print(json.dumps(r))
        return 0
    print(f"{len(ranked)} configurations on {where}, at most {limit} ranks; "
          f"{base.features}-{a.hidden}-{base.classes}, {base.points:,} points, "
          + (f"to held-out {target[0]} {target[1]:g}" if target else f"{a.epochs} epoch(s)")
          + f", {a.optimizer}, {','.join(modes)}, {a.precision}; best first (predicted):")
    if target:
        print(" rank  arch       mode   workers  batch  staleness  epochs  s/epoch    init_s  to_target_s  bound")
        for i, r in enumerate(ranked[:a.top], 1):
            print(f"{i:5d}  {r['arch']:9s} {r['mode']:5s} {r['workers']:8d} {r['batch']:6d} "
                  f"{r['mean_staleness']:10.1f} {r['epochs_to_target']:7.2f} {r['per_epoch_s']:8.3f} "
                  f"{_fmt_s(r['init_s'])}    {_fmt_s(r['time_to_target_s'])}  {r['bound']}")
    else:
        print(" rank  arch       mode   servers  K  workers  batch     init_s   train_s   total_s  s/epoch  bound")
        for i, r in enumerate(ranked[:a.top], 1):
            print(f"{i:5d}  {r['arch']:9s} {r['mode']:5s} {r['servers']:7d} {r['model_parallel']:2d} {r['workers']:8d} "
                  f"{r['batch']:6d} {_fmt_s(r['init_s'])} {_fmt_s(r['train_s'])} {_fmt_s(r['total_s'])} "
                  f"{r['per_epoch_s']:8.3f}  {r['bound']}")
    w = ranked[0]
    print(f"best: --arch {w['arch']}" + (f" --servers {w['servers']}" if w["arch"] == "ps" else "")
          + (f" --mode {w['mode']}" if w["arch"] != "allreduce" else "")
          + (f" --model-parallel {w['model_parallel']}" if w["model_parallel"] > 1 else "")
          + f" with {w['ranks']} rank{'s' if w['ranks'] > 1 else ''}, --batch {w['batch']}; what binds it: "
          + (what_binds(ranked) if target else w["bound"]))
    # the winner as a command line (on a cluster, the same options after the batch script's name)
    print(f"run it: mpiexec -n {w['ranks']} python -m asgd.train {shlex.join(w['argv'])}")
    return 0


def optimize_modes(spec: str | None, target: bool) -> list[str]:
    """optimize's --mode: the modes given, else asgd.train's; to a target, sync beside it
    (a lockstep update is fresher and slower, which is what the target weighs)."""
    default = [TRAIN.mode] + (["sync"] if target and TRAIN.mode != "sync" else [])
    return _words(spec, ("async", "ssp", "sync"), "mode") if spec else default


def _same_problem(stats: Statistics, a) -> None:
    """The pilot's statistics are of one data set and model: refuse another's."""
    data = os.path.abspath(a.data) if a.data else "embedded"
    if (stats.data, stats.hidden) != (data, a.hidden):
        raise PerfError(f"{a.params}: its pilot ran {stats.data} with hidden {stats.hidden}, not {data} with hidden "
                        f"{a.hidden}: run python -m asgd.perf pilot for this problem (or optimize --measure)")


def _reference_reaches(stats: Statistics, optimizer: str, target: tuple[str, float]) -> None:
    """Refuse a target the pilot's reference of this optimizer never reached, naming what
    helps: more pilot epochs to this target (optimize --measure pilots to it), or an easier
    target. Run to this target already, another pilot with the same epochs misses it again."""
    ref = stats.references.get(optimizer)
    if ref is None or samples_to_target(ref.curve, *target) is not None:
        return   # a missing optimizer: the statistics' own NoPilot says so
    metric, value = target
    best = (max if metric == "accuracy" else min)((p[metric] for p in ref.curve if p[metric] is not None),
                                                  default=math.nan)
    epochs = ref.curve[-1]["samples"] / ref.points if ref.curve else 0
    raise PerfError(f"the pilot's {optimizer} reference never reached held-out {metric} {value:g} in its "
                    f"{epochs:.3g} epochs (best {best:.4f}): give the pilot more epochs (add --measure --epochs N "
                    f"to this optimize, or run python -m asgd.perf pilot with --target-{metric} {value:g} --epochs N) "
                    "or ask an easier target")


def _words(text: str, allowed, what: str) -> list[str]:
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in got if x not in allowed]
    if bad or not got:
        raise PerfError(f"unknown {what}(s) {bad or text!r}: choose from {', '.join(allowed)}")
    return got


def _memory_bytes() -> float:
    """This machine's memory (MemTotal), bytes; 0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return 0.0


if __name__ == "__main__":
    sys.exit(main())
