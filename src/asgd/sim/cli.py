"""python -m asgd.sim: simulate an asgd.train run on this machine or on a described
cluster, with SimGrid, from a calibration (params.json), and write its results.json.

  python -m asgd.sim -n 16 --epochs 5 --out runs/sim-n16           # this machine, like mpiexec -n 16
  python -m asgd.sim -n 16 --servers 4 --mode ssp --data d.tsv --reader sequential
  python -m asgd.sim --like runs/RUN --out runs/RUN-sim            # the configuration of a real run
  python -m asgd.sim --machine bluewaters --nodes 64 -n 65 --placement spread --reader sequential \\
                     --points 16384 --epochs 1 --out runs/bw-64
  python -m asgd.sim --machine mustang --nodes 7 -n 1025 --servers 8 --compress 1bit

The options of asgd.train keep their meaning and spelling (-n is the rank count: S servers
+ workers, or all workers with --arch allreduce). Times in results.json are simulated
seconds; `python -m asgd.perf report` and `compare` read it as they read a real run's. Its
config is the run simulated: asgd.train's options given here, else the --like run's, else
asgd.train's defaults (run.config: the optimizer, --hidden and --epochs by the same rule);
each optimizer's update costs what calibrate measured of it (an older params.json without
those costs: sgd's, with a warning).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from ..core.wire import PRECISIONS
from ..perf import cli as perf_cli
from ..perf.analytic import Run
from ..perf.statistics import mean_staleness
from ..run.config import EMBEDDED_EPOCHS, EMBEDDED_HIDDEN, FILE_HIDDEN, Config, default_epochs, default_hidden
from . import SimgridMissing
from .costs import Costs, Spec, load_params
from ..net import OPTIMIZERS
from .machines import MACHINES, TOPOLOGIES, by_name, testbed
from .probes import corrections
from .run import simulate, summary

TRAIN = Config()   # asgd.train's defaults: simulating a default run simulates that run


class SimError(ValueError):
    pass


# asgd.train's options the simulation sets itself (the Spec, the data, its own outputs); a --like
# run's other options are recorded in results.json as the run had them (Spec.recorded)
SIMULATED_OPTIONS = frozenset({"data", "classes", "reader", "hidden", "batch", "epochs", "seed", "arch", "servers",
                               "model_parallel", "allreduce",
                               "mode", "staleness", "compress", "precision", "optimizer", "lr", "out", "trace",
                               "trace_steps"})


def positive(s: str) -> int:
    return perf_cli.positive_int(s)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m asgd.sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("the run (asgd.train's options)")
    g.add_argument("-n", "--ranks", type=positive, default=None,
                   help="MPI ranks, as mpiexec -n (default 16; with --like, the run's)")
    g.add_argument("--servers", type=positive, default=None, help="parameter servers S (default 1)")
    g.add_argument("--arch", choices=("ps", "p2p", "allreduce"), default=None, help="default ps")
    g.add_argument("--model-parallel", type=positive, default=None, metavar="K",
                   help="replicas of K workers, each 1/K of the hidden layer (default 1)")
    g.add_argument("--allreduce", choices=("ring", "mpi"), default=None, help="--arch allreduce's algorithm "
                   "(default ring; mpi: its calibrated MPI_Iallreduce round)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="the servers' (allreduce: every "
                   "rank's) optimizer, its update at its calibrated cost (default as asgd.train's: "
                   f"{Config.optimizer}; with --like, the run's)")
    g.add_argument("--mode", choices=("async", "ssp", "sync"), default=None, help="default async")
    g.add_argument("--staleness", type=positive, default=None, help="ssp's bound K (default 3)")
    g.add_argument("--reader", choices=("sequential", "parallel"), default=None, help="default parallel")
    g.add_argument("--hidden", type=positive, default=None, help="hidden units (default as asgd.train's: "
                   f"{EMBEDDED_HIDDEN} on the embedded problem, {FILE_HIDDEN} for a file)")
    g.add_argument("--batch", type=positive, default=None, help="mini-batch (default 256)")
    g.add_argument("--epochs", type=positive, default=None, help="passes over the data (default as "
                   f"asgd.train's: {EMBEDDED_EPOCHS} on the embedded problem, a file's by its size)")
    g.add_argument("--compress", choices=("none", "1bit"), default=None,
                   help="none (default; with --like, the run's): every value as it is; 1bit: Delta-w and w' as one "
                        "bit per value plus two scales per column (parameter servers only)")
    g.add_argument("--precision", choices=PRECISIONS, default=None,
                   help=f"the values' precision (default as asgd.train's: {Config.precision}; with --like, the "
                        "run's): the bytes of every value of w on the wire and in memory, and calibrate's "
                        "compute and exchange rates measured in it")
    g.add_argument("--seed", type=int, default=None, help="seeds the step-time draws (default 0; with --like, "
                   "the run's)")
    g.add_argument("--like", metavar="RUN_DIR", help="simulate a real run: its results.json's options (its "
                   "compression, optimizer and lr too) and data; the options above override them")
    d = ap.add_argument_group("data (default: the embedded problem)")
    d.add_argument("--data", help="a data file: its size, points, features, classes and held-out companion")
    d.add_argument("--label-column", metavar="NAME|INDEX", help="the --data file's label column, as asgd.train's "
                   "(default: the last)")
    d.add_argument("--classes", type=positive, help="the --data file's classes, as asgd.train's (default: from "
                   "the labels)")
    d.add_argument("--points", type=positive, help="training points of a file that need not exist")
    d.add_argument("--format", choices=("tsv", "npy", "embedded"), default=None,
                   help="with --points: tsv (default), npy, or the embedded problem")
    m = ap.add_argument_group("the platform")
    m.add_argument("--params", default="params.json", help="calibration from python -m asgd.perf calibrate "
                   "(default params.json)")
    m.add_argument("--machine", choices=("here", "testbed", *MACHINES), default="here",
                   help="here: the calibrated machine; testbed: asgd.testbed on it (a rank per host, --params "
                        "from asgd.testbed.model with its links); mustang, bluewaters: the paper's (Tables 2, 3)")
    m.add_argument("--topology", choices=TOPOLOGIES, default=None, help="network shape (default: the machine's)")
    m.add_argument("--nodes", type=positive, default=1, help="nodes (default 1)")
    m.add_argument("--placement", choices=("block", "spread"), default="block",
                   help="block: ranks fill node after node (mpiexec's default); spread: the servers on "
                        "node 0 and workers one per node round-robin (CNTK in the paper)")
    m.add_argument("--cores-per-node", type=positive, help="override the machine's cores per node")
    m.add_argument("--core-speed", type=float, help="override one core's speed against the calibrated one")
    m.add_argument("--link-gbps", type=float, help="override a node's link bandwidth, Gbit/s")
    m.add_argument("--link-latency-us", type=float, help="override the per-hop latency, microseconds")
    x = ap.add_argument_group("what-ifs")
    x.add_argument("--epoch-barrier", action="store_true", help="workers wait for each other at every epoch's "
                   "end (CNTK's barrier; asgd's async workers do not)")
    x.add_argument("--no-spread", action="store_true", help="every step takes the best measured time")
    x.add_argument("--straggler", type=float, default=1.0, metavar="FACTOR",
                   help="the last worker's steps take FACTOR times longer (default 1)")
    x.add_argument("--background", type=float, default=0.0, metavar="CORES",
                   help="cores' worth of CPU other processes take on each node meanwhile, as on a shared "
                        "machine (default 0)")
    t = ap.add_argument_group("time to a target (--params holds the pilot's statistics: python -m asgd.perf "
                              "pilot)").add_mutually_exclusive_group()
    t.add_argument("--target-accuracy", type=float, metavar="A", help="also predict the time to held-out accuracy "
                   "A: the pilot's epochs to it at the staleness this simulation had, x its simulated s/epoch, "
                   "+ its init")
    t.add_argument("--target-loss", type=float, metavar="L", help="as --target-accuracy, held-out loss L")
    o = ap.add_argument_group("output")
    o.add_argument("--out", help="run folder for results.json (and trace.json); default: print only")
    o.add_argument("--trace", action="store_true", help="also write trace.json (Chrome Trace Event format)")
    o.add_argument("--trace-steps", default="0:200", help="worker steps the trace records, A:B (default 0:200)")
    o.add_argument("--json", action="store_true", help="print results.json's headline numbers as one JSON line")
    o.add_argument("--quiet", action="store_true", help="no summary")
    return ap


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def spec_from_args(a, p) -> tuple[Spec, str | None]:
    """The Spec to simulate and the data path recorded in results.json."""
    base: dict = {}
    data_path = None
    like: dict = {}   # the --like run's config
    if a.like:
        f = a.like if a.like.endswith(".json") else os.path.join(a.like, "results.json")
        try:
            with open(f) as fh:
                res = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            raise SimError(f"--like {a.like}: cannot read {f} ({e})") from None
        run = perf_cli.run_of(res, p)
        base = dataclasses.asdict(run)
        like = res["config"]
        data_path = like.get("data")
        if like.get("optimizer", "sgd") != "sgd" and not p.optimizer_s:
            print(f"asgd.sim: --like {a.like}: the run used --optimizer {like['optimizer']}; this calibration has "
                  f"no optimizers' costs (an older calibrate), so its server's update is simulated at "
                  f"plain SGD's calibrated cost", file=sys.stderr)
    if a.data or a.points or a.format:
        fmt = a.format or ("tsv" if a.points else "embedded")
        if a.data and not os.path.exists(a.data):
            raise SimError(f"--data {a.data}: no such file (use --points N for a file that need not exist)")
        base.update(perf_cli.data_of(a.data, a.points, fmt, p, a.label_column, a.classes))
        data_path = a.data or (None if fmt == "embedded" else f"simulated-{a.points or 16384}.{fmt}")
        if fmt == "embedded" and not a.data:   # --data FILE is that file, whatever --format says
            base.update(file_bytes=0, test_bytes=0)
    arch = a.arch or like.get("arch", "ps")
    ranks = a.ranks or like.get("world_size", 16)
    compress = a.compress or like.get("compress", "none")
    if arch == "allreduce" and compress != "none":
        raise SimError(f"--compress {compress} needs --arch ps or p2p (allreduce sums Delta-w as it is)")
    servers = a.servers or (base.get("servers", 1) if arch == "ps" else 1)
    S = servers if arch == "ps" else 0
    workers = ranks - S
    if workers < 1:
        raise SimError(f"-n {ranks} leaves no worker beside {S} server(s): need -n > --servers")
    K = a.model_parallel or like.get("model_parallel", 1)
    fields = {k: v for k, v in base.items() if k in {f.name for f in dataclasses.fields(Run)}}
    fields.update(workers=workers, servers=max(servers, 1) if arch == "ps" else (workers if arch == "p2p" else 0),
                  arch=arch, model_parallel=K, allreduce=a.allreduce or like.get("allreduce") or "ring",
                  optimizer=a.optimizer or like.get("optimizer", TRAIN.optimizer),
                  # a run written before --precision was float64
                  precision=a.precision or like.get("precision", "float64" if like else TRAIN.precision))
    for k in ("mode", "reader", "hidden", "batch", "epochs"):
        v = getattr(a, k)
        if v is not None:
            fields[k] = v
    if not like:   # asgd.train's defaults for what neither the options nor a run say
        embedded = not base.get("file_bytes")
        fields.setdefault("hidden", default_hidden(embedded))
        fields.setdefault("epochs", default_epochs(None if embedded else base["points"]))
    run = Run(**fields)
    if workers % K or run.hidden % K:
        raise SimError(f"--model-parallel {K} must divide the workers ({workers}) and --hidden ({run.hidden})")
    if a.machine == "testbed":
        if not p.link_s or not p.link_Bps:
            raise SimError(f"--machine testbed needs a testbed's params (asgd.testbed.model.testbed_params: its "
                           f"links); {a.params} has none")
        machine = testbed(p.cores, 8 * p.link_Bps, p.link_latency_s)
    else:
        machine = by_name(a.machine, p.cores, a.topology)
    over = {}
    if a.cores_per_node:
        over["cores_per_node"] = a.cores_per_node
    if a.core_speed:
        over["core_speed"] = a.core_speed
    if a.link_gbps:
        over["link_bw"] = a.link_gbps * 1e9 / 8
    if a.link_latency_us is not None:
        over["link_lat"] = a.link_latency_us * 1e-6
    if over:
        machine = dataclasses.replace(machine, **over)
    if a.nodes > 1 and machine.topology == "one-node":
        machine = dataclasses.replace(machine, topology="star")
    run = dataclasses.replace(run, cores=machine.cores_per_node)
    try:
        lo, hi = (int(x) for x in a.trace_steps.split(":"))
    except ValueError:
        raise SimError(f"--trace-steps {a.trace_steps!r}: expected A:B") from None
    a.trace_window = (lo, hi)
    recorded = {k: v for k, v in like.items() if k in Config.__dataclass_fields__ and k not in SIMULATED_OPTIONS}
    if data_path != like.get("data"):
        recorded.pop("test", None)   # the run's held-out file belongs to its own data
    seed = a.seed if a.seed is not None else like.get("seed", 0)
    spec = Spec(run=run, machine=machine, arch=arch, staleness=a.staleness or like.get("staleness", 3),
                seed=seed, compress=compress, optimizer=run.optimizer,
                lr=like.get("lr") if not a.optimizer else None,
                recorded=recorded, nodes=a.nodes, placement=a.placement, epoch_barrier=a.epoch_barrier,
                straggler=a.straggler, background=a.background)
    return spec, data_path


def target_of(a, spec: Spec, data_path: str | None):
    """With --target-*: a function of the simulated results.json giving the predicted time to
    the target, the statistical model (the pilot's, in --params) fed the staleness simulated."""
    if a.target_accuracy is None and a.target_loss is None:
        return None
    metric, value = ("accuracy", a.target_accuracy) if a.target_accuracy is not None else ("loss", a.target_loss)
    stats = perf_cli.load_statistics(a.params)
    run = spec.run
    data = os.path.abspath(data_path) if data_path else "embedded"
    if (stats.data, stats.hidden) != (data, run.hidden):
        raise SimError(f"{a.params}: its pilot ran {stats.data} with hidden {stats.hidden}, not {data} with hidden "
                       f"{run.hidden}: run python -m asgd.perf pilot for this problem")

    def predict(res: dict) -> dict:
        s = mean_staleness(res)
        e = stats.epochs_to_target(run.optimizer, metric, value, run.batch, run.replicas, run.lockstep, s,
                                   run.backup)
        per_epoch = res["train_s"] / run.epochs
        return {"metric": metric, "value": value, "mean_staleness": s, "epochs": e, "per_epoch_s": per_epoch,
                "time_s": res["init_s"] + e * per_epoch}
    return predict


def main(argv=None) -> int:
    a = parse_args(argv)
    perf_cli.warnings_in_one_line("asgd.sim")
    try:
        try:
            p, raw = load_params(a.params)
        except FileNotFoundError:
            raise SimError(f"{a.params}: no such file; measure this machine first: "
                           f"python -m asgd.perf calibrate --out {a.params}") from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise SimError(f"{a.params}: not a parameters file from 'asgd.perf calibrate' ({e})") from None
        spec, data_path = spec_from_args(a, p)
        costs = Costs(p, spec, raw, spread=not a.no_spread, corrections=corrections)
        to_target = target_of(a, spec, data_path)   # before the simulation: a missing pilot fails now
        res = simulate(spec, costs, a.out, a.trace, a.trace_window, raw.get("sleep_overhead_s"),
                       data_path, os.path.abspath(a.params))
        predicted = to_target(res) if to_target else None
    except (SimError, SimgridMissing, perf_cli.PerfError, ValueError, OSError) as e:
        print(f"asgd.sim: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"wall_s": res["wall_s"], "init_s": res["init_s"], "train_s": res["train_s"],
                          "updates_per_s": res["throughput"]["updates_per_s"],
                          "sim_wall_s": res["simulated"]["sim_wall_s"], "bound": res["profile"]["bound"],
                          **({"target": predicted} if predicted else {})}))
    elif not a.quiet:
        print(summary(res))
        if predicted:
            print(f"to held-out {predicted['metric']} {predicted['value']:g}: {predicted['epochs']:.2f} epochs at mean "
                  f"staleness {predicted['mean_staleness']:.2f} (simulated) x {predicted['per_epoch_s']:.3f} s/epoch "
                  f"+ init {res['init_s']:.2f} s = {predicted['time_s']:.2f} s (predicted)")
        if a.out:
            print(f"results: {os.path.join(a.out, 'results.json')}")
    return 0
