"""The paper's performance model (section 3 and 5.3: Table 1, equations 1-12), and what
asgd adds to it to predict its own runs.

Part 1 is the paper as printed: `Table1` holds its parameters with their units, and each
equation is a function of a Table1 and a number of data points n. Part 2 goes past it,
on the paper's own list of what its model misses:
  a. server saturation: a closed queueing model solved by mean-value analysis (MVA),
     w workers cycling between their own compute and the server's queue;
  b. cache effects of the batch size: the per-batch step time is measured at several
     batch sizes (calibrate), not assumed linear, and the working set is compared
     with the caches;
  c. ranks sharing cores: with more ranks than cores, work is CPU-bound at the cores;
  d. several servers, each owning a shard: one queue per server, each 1/S of the work;
  e. links that are the limit (asgd.testbed): the servers' links in and out as two more
     stations, crossed by all S shards of an update at once;
  f. the other architectures (p2p, allreduce, model partitioning) and every lockstep run,
     in Alqahtani & Demirbas's per-iteration form T_comp + T_comm (asgd.perf.architectures),
     and each server-side optimizer's own update cost.
asgd.perf.architectures.predict(params, Run(...)) combines them into init, compute,
communication and total seconds for one configuration of any architecture. Units
everywhere: seconds, bytes, data points.
"""

from __future__ import annotations

import bisect
import functools
import math
import warnings
from dataclasses import asdict, dataclass, field, fields, replace

from ..core import wire
from ..core.schedule import OverlapRule, lockstep
from ..core.target import PROBE_MARGIN, replay

# -- Part 1: the paper's model ---------------------------------------------------------

DOUBLE = 8  # bytes of a float64: a data point's values, and w's in the paper's float64 (Table1.value_bytes)


@dataclass(frozen=True)
class Table1:
    """The parameters of the paper's Table 1 (w_d = r_d and w_m = r_m, as it assumes)."""
    w: int                 # workers
    b: int                 # batch size, data points
    n_f: int               # features per data point (float64 each)
    n_w: int               # entries of w and of Delta-w (float64 each)
    d: int                 # data points in the input
    epoch: int             # passes over the data
    c_p: float             # s per data point processed
    c_b: float             # s per batch: preparing and sending one Delta-w
    c_u: float             # s on the server per Delta-w aggregated
    r_d: float             # s per byte read from disk (and parsed)
    r_m: float             # s per byte read from (or written to) memory
    r_net: float           # s per byte over the network: 1 / bandwidth
    point_bytes: float = 0.0  # bytes per point on disk; 0: 8 n_f as eq. 5 assumes (a text file is larger)
    value_bytes: int = DOUBLE  # bytes of a value of w and Delta-w: the paper's 8 (float64), 4 in float32

    UNITS = {"w": "workers", "b": "points", "n_f": "features", "n_w": "weights", "d": "points",
             "epoch": "passes", "c_p": "s/point", "c_b": "s/batch", "c_u": "s/update", "r_d": "s/byte",
             "r_m": "s/byte", "r_net": "s/byte", "point_bytes": "bytes/point"}

    @property
    def bytes_per_point(self) -> float:
        return self.point_bytes or DOUBLE * self.n_f


def T_processing(t: Table1, n: float) -> float:
    """Eq. 1: processing n data points once, c_p x n."""
    return t.c_p * n


def T_update(t: Table1, n: float) -> float:
    """Eq. 2: one Delta-w prepared and sent per batch, c_b x n / b."""
    return t.c_b * n / t.b


def T_computation(t: Table1, n: float) -> float:
    """Eq. 3: T_processing + T_update. (The paper's eq. 4, c_p n (1 + 1/b), is this with c_b = c_p.)"""
    return T_processing(t, n) + T_update(t, n)


def T_disk(t: Table1, n: float) -> float:
    """Eq. 5: reading n points from disk once, r_d x (bytes per point) x n."""
    return t.r_d * t.bytes_per_point * n


def T_memory(t: Table1, n: float) -> float:
    """Eq. 6: every point read once from memory per pass, and w read and written once per
    batch: 8 n (r_m n_f + (r_m + w_m) n_w / b), with w_m = r_m (w's 8 its value_bytes)."""
    return n * (DOUBLE * t.r_m * t.n_f + t.value_bytes * 2 * t.r_m * t.n_w / t.b)


def T_send(t: Table1, n: float) -> float:
    """Eq. 7: one Delta-w (8 n_w bytes; value_bytes n_w) sent per batch: r_net x 8 n_w x n / b."""
    return t.r_net * t.value_bytes * t.n_w * n / t.b


def T_network(t: Table1, n: float) -> float:
    """Eq. 8: Delta-w out and w' back per batch, and the server's c_u for each of the w
    workers' updates: n / b x (16 r_net n_w + w c_u)."""
    return 2 * T_send(t, n) + t.w * t.c_u * n / t.b


def T_total(t: Table1) -> float:
    """Eq. 9: T_disk(d/w) + epoch x max(T_network(d/w), T_computation(d/w) + T_memory(d/w)):
    communication overlaps computation, but reading does not."""
    n = t.d / t.w
    return T_disk(t, n) + t.epoch * max(T_network(t, n), T_computation(t, n) + T_memory(t, n))


def T_disk_new(t: Table1, w: int, n: float) -> float:
    """Eq. 12: every rank reads the whole file (n x w points), one rank after another: w x T_disk(n w)."""
    return w * T_disk(t, n * w)


def T_total_new(t: Table1, T_computation_phase: float) -> float:
    """Section 5.3's updated total: T_disk_new(w, d/w) + epoch x the computation phase,
    which cannot go below T_computation_phase (the least it took at any scale).

    As printed, the formula takes min(...) of T_network(d) and T_computation(d) +
    T_memory(d) for the whole data set; the text calls T_computation_phase the minimum
    achievable time, so here it is a floor (max) on eq. 9's per-worker term, d/w."""
    n = t.d / t.w
    per_pass = max(T_network(t, n), T_computation(t, n) + T_memory(t, n))
    return T_disk_new(t, t.w, n) + t.epoch * max(per_pass, T_computation_phase)


# -- Part 2: past the paper -------------------------------------------------------------

def mva(customers: int, think_s: float, service_s: list[float], overlap: bool = False,
        delay_s: float = 0.0, transit_s: list[float] | None = None,
        cap_s: list[float] = (), overlap_within: float = math.inf) -> tuple[float, list[float]]:
    """Exact mean-value analysis of a closed network (extension a): `customers` workers
    each compute for think_s, then visit every queueing station once (a server: service
    s each, FIFO, one at a time), plus delay_s of an exchange no queue holds (latency,
    transfers). Returns (throughput in cycles/s, response time per station at that
    population).

    overlap (asgd's async workers): the next batch is computed while the exchange is in
    flight, so a cycle lasts max(think, exchange) rather than their sum; only while the
    exchange lasts at most overlap_within think times (--overlap auto waits beyond that:
    asgd.core.schedule.OverlapRule).
    transit_s (links, extension e): a customer's own time through a station it finds idle,
    where that is less than the service it takes of the station's capacity (a token
    bucket passes its burst at line speed): response = transit + s x queue, no longer exact.
    cap_s: demands per cycle that bound throughput (at most 1 / demand) but hold no queue
    (a link each worker has to itself)."""
    transit = service_s if transit_s is None else transit_s
    queue = [0.0] * len(service_s)
    X, R = 0.0, [0.0] * len(service_s)
    demand = max([*service_s, *cap_s], default=0.0)
    cap = 1 / demand if demand > 0 else math.inf
    for n in range(1, customers + 1):
        R = [t + s * q for s, t, q in zip(service_s, transit, queue)]
        exchange = delay_s + sum(R)
        overlapped = overlap and exchange <= overlap_within * think_s
        cycle = max(think_s, exchange) if overlapped else think_s + exchange
        # overlap is an approximation: keep it within the busiest station's capacity,
        # and never below the throughput of one worker fewer
        X = max(X, min(n / cycle if cycle > 0 else math.inf, cap))
        queue = [X * r for r in R]
    return X, R


def saturation_workers(think_s: float, service_s: float) -> float:
    """The knee of the MVA curve (asymptotic bounds): past (think + service) / service
    workers, one more worker adds nothing, as the paper saw at 16 nodes."""
    return (think_s + service_s) / service_s if service_s > 0 else math.inf


def cores_shared(ranks: float, cores: int) -> float:
    """Extension c: how many ranks' worth of work one second buys when `ranks` runnable
    processes share `cores` (1 while every rank has a core)."""
    return min(1.0, cores / ranks) if ranks > 0 else 1.0


def working_set_bytes(batch: int, n_w: int, hidden: int, n_f: int = 2, value_bytes: int = DOUBLE) -> int:
    """Extension b: what one training step touches: w and Delta-w (n_w values each), the
    batch, and the hidden activations of a block of samples (the kernel blocks samples so
    that they stay below kernels.H_BYTES), every value of value_bytes (the run's precision)."""
    from ..net.kernels import H_BYTES   # here: importing numba takes a second the model's users need not pay
    rows = max(4, min(32, H_BYTES // (DOUBLE * hidden), (batch + 3) // 4 * 4) // 4 * 4)  # kernels._block_rows
    return value_bytes * (2 * n_w + (n_f + 1) * batch + rows * hidden)


def cache_level(nbytes: int, caches: dict[str, int]) -> str:
    """The smallest cache ('L1d', 'L2', 'L3') that holds nbytes, or 'memory'."""
    for name in ("L1d", "L2", "L3"):
        if name in caches and nbytes <= caches[name]:
            return name
    return "memory"


def interpolate_log(table: dict[int, float], x: float) -> float:
    """Piecewise linear in (log x, log y) through measured points; beyond the ends, the
    nearest end scaled linearly in x. Calibrated costs are tabulated, not assumed smooth."""
    xs = sorted(table)
    if x <= xs[0]:
        return table[xs[0]] * x / xs[0]
    if x >= xs[-1]:
        return table[xs[-1]] * x / xs[-1]
    for a, b in zip(xs, xs[1:]):
        if a <= x <= b:
            f = math.log(x / a) / math.log(b / a)
            return math.exp(math.log(table[a]) * (1 - f) + math.log(table[b]) * f)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Run:
    """One configuration to predict (asgd.train's options, and the data)."""
    workers: int
    servers: int = 1
    batch: int = 256
    hidden: int = 10000
    epochs: int = 1
    reader: str = "parallel"        # sequential | parallel
    points: int = 16384             # training points (a file without a held-out companion: 7/8 of its lines)
    test_points: int = 4096         # held-out points rank 0 evaluates after every epoch
    file_bytes: int = 0             # training file size; 0: the embedded problem (no file)
    test_bytes: int = 0             # held-out file size (0: none, or embedded)
    binary: bool = False            # .npy rather than TSV
    features: int = 2
    classes: int = 2
    mode: str = "async"             # async | ssp | sync
    backup: int = 0                 # sync's --backup-workers (the statistics' update; not its time)
    overlap: str = "auto"           # --overlap: auto | on | off (async and ssp)
    cores: int = 0                  # 0: the calibrated machine's
    arch: str = "ps"                # ps | p2p | allreduce (asgd.train's --arch)
    model_parallel: int = 1         # K: workers in replicas of K ranks, each 1/K of the hidden layer
    optimizer: str = "sgd"          # the servers' (allreduce: every rank's) --optimizer
    allreduce: str = "ring"         # ring | mpi (--allreduce)
    precision: str = "float64"      # --precision: a value's bytes on the wire and in memory, and which of
                                    # calibrate's tables price its compute and exchanges (Params.at)
    node_ranks: int = 0             # ranks sharing one node's cores and link (0: all of them: one
                                    # node, or a testbed whose hosts share this machine's cores)
    eval_every: str = "auto"        # --eval-every: when rank 0 evaluates the held-out set (evaluation_s)
    eval_deferred: bool = False     # --eval-deferred: it copies w then, evaluated after training

    @property
    def value_bytes(self) -> int:
        """Bytes of a value of w (asgd.core.wire.itemsize of the precision)."""
        return wire.itemsize(self.precision)

    def wire_values(self, k: float) -> float:
        """The float64 values whose bytes a message of k values occupies: what tables
        keyed by float64 messages (p.link_s) are read at."""
        return k * self.value_bytes / DOUBLE

    @property
    def dedicated_servers(self) -> int:
        """Ranks that only serve: --servers with ps, none with p2p or allreduce."""
        return self.servers if self.arch == "ps" else 0

    @property
    def owners(self) -> int:
        """Ranks that own shards of w: the servers, every peer (p2p), none (allreduce)."""
        return {"ps": self.servers, "p2p": self.workers}.get(self.arch, 0)

    @property
    def ranks(self) -> int:
        return self.workers + self.dedicated_servers

    @property
    def replicas(self) -> int:
        """Data-parallel ways: workers / K."""
        return max(self.workers // self.model_parallel, 1)

    @property
    def lockstep(self) -> bool:
        """Every worker takes each step with the others: sync mode, or allreduce."""
        return lockstep(self.arch, self.mode)

    @property
    def n_w(self) -> int:
        return self.hidden * (self.features + 1) + self.classes * (self.hidden + 1)


@dataclass
class Prediction:
    init_s: float
    compute_s: float          # a worker's own work (steps), inflated by sharing cores
    comm_s: float             # the part of a worker's time spent waiting on the server or the network
    train_s: float            # compute + communication + per-epoch evaluation, the training phase
    total_s: float            # init + train: the wall time
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Params:
    """Calibrated, machine-dependent parameters (asgd.probes.calibrate writes them; see its
    docstring for how each is measured). Tables are keyed by hidden size and batch size."""
    cores: int
    effective_cores: dict          # [hidden][ranks] cores' worth of steps P ranks do at once (or [ranks])
    startup: dict[str, float]      # one rank's start: {imports,parsers,kernels}_{wall,cpu}_s
    step_s: dict[int, dict[int, float]]   # [hidden][batch] s per training step (batch gather included)
    eval_s_per_point: dict[int, float]    # [hidden] s per held-out point evaluated
    worker_msg_s: dict[int, float]        # [n_w] a worker's time per push/pull beyond its step (2 ranks)
    server_update_s: dict[int, float]     # [n_w] c_u: the server's CPU per Delta-w (receive, check, add, reply)
    round_trip_s: dict[int, float]        # [n_w] a push/pull round trip with no compute, 2 ranks
    pingpong_s: dict[int, float]          # [bytes] raw MPI ping-pong one way (r_net by fit)
    read_s_per_byte: dict[str, dict[str, float]]  # [reader][tsv|npy] read + parse, one rank (r_d)
    select_s_per_point: dict[str, float]  # [sequential|parallel] a rank's keep/shuffle work per point of the file
    memory_s_per_byte: float       # r_m (STREAM-like copy)
    bytes_per_point: dict[str, float]     # [tsv|npy] on disk, from the calibration file
    embedded_s: float = 0.0        # one rank generating the embedded problem (no data file)
    # [ranks] a job's start-up, no data, measured (none: from `startup`, one rank's stages)
    startup_by_ranks: dict[int, float] = field(default_factory=dict)
    # [ranks][n_w] push/pull CPU per update, all ranks together, ranks > cores (none: as 2 ranks)
    contended_update_s: dict[int, dict[int, float]] = field(default_factory=dict)
    caches: dict[str, int] = field(default_factory=dict)
    # [n_w] s a message of n_w weights holds one link, one direction, where the links are
    # the limit (asgd.testbed.model fills it); none: shared memory, whose copies are in
    # round_trip_s and server_update_s
    link_s: dict[int, float] = field(default_factory=dict)
    # s of line time a paused link passes at once (a token bucket's burst / rate): what of a
    # message crosses without waiting for the link's rate; 0: none
    link_burst_s: float = 0.0
    # [optimizer][n] s per server-side optimizer update of n values (none: every optimizer costs sgd's)
    optimizer_s: dict = field(default_factory=dict)
    # [K][hidden][batch] s per step of a model-parallel member, its logit sum left out
    mp_step_s: dict = field(default_factory=dict)
    # [ps|p2p|ring|mpi][ranks][n_w] s per synchronous round with no compute; [replica][K][batch]
    exchange_s: dict = field(default_factory=dict)
    # [ps|p2p|ring|mpi][ranks][n_w] how much longer a round's busiest link took than its derived
    # wire time, where links are the limit (asgd.testbed.model measures it); none: 1
    link_efficiency: dict = field(default_factory=dict)
    # s of one-way latency a link adds to each message (asgd.testbed.model)
    link_latency_s: float = 0.0
    # bytes/s each way of every link, where link_s is given (its wire times are at this rate)
    link_Bps: float = 0.0
    # [hidden][batch] least CPU s per step, and {"p", "ratio"}: one step's CPU time over the
    # least, quantiles (asgd.sim; none: the wall time step_s, no spread)
    step_cpu_s: dict = field(default_factory=dict)
    step_spread: dict = field(default_factory=dict)
    # the precision the tables above were measured in (PER_PRECISION's), and every measured
    # precision's own tables, [precision][table] (none: a file from before calibrate measured
    # both, its tables float64's): Params.at swaps them in
    precision: str = "float64"
    precisions: dict = field(default_factory=dict)
    # [hidden][batch][D + C] s per step of a D-H-C MLP (4: 2-H-2), and the (features,
    # classes) the step tables are priced for (Params.shaped); none measured: every shape
    # is priced as 2-H-2's
    shape_s: dict = field(default_factory=dict)
    shape: tuple = (2, 2)
    unshaped: dict = field(default_factory=dict)   # the 2-H-2 step tables shaped() replaced
    # the held-out evaluation the pilot measured on the user's data (params.json's
    # statistics.evaluation: s_per_point at features-hidden-classes, precision); none: no
    # pilot, or one from before it measured this (Params.shaped then estimates it)
    evaluation: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> Params:
        """Params from params.json's "params": the tables every precision shares, and
        the float64 tables (or `d["precision"]`'s) in place; the others kept for at()."""
        measured = {prec: _parse_tables(t) for prec, t in d.get("precisions", {}).items()}
        top = d.get("precision", DEFAULT_PRECISION)
        if measured and top not in measured:
            top = next(iter(measured))
        names = {f.name for f in fields(cls)}
        p = _parse_tables({k: v for k, v in d.items() if k in names and k != "precisions"})
        if "shape" in p:   # JSON's list
            p["shape"] = tuple(p["shape"])
        return cls(**{**p, **measured.get(top, {}), "precision": top, "precisions": measured})

    @classmethod
    def from_file(cls, got: dict) -> Params:
        """Params from a whole params.json: calibrate's "params", and the held-out evaluation
        the pilot measured on the user's data where its "statistics" hold one."""
        p = cls.from_dict(got["params"])
        measured = (got.get("statistics") or {}).get("evaluation")
        return replace(p, evaluation=measured) if measured else p

    def at(self, precision: str) -> Params:
        """These parameters with `precision`'s compute and exchange tables (PER_PRECISION)
        in place: the one place the model and the simulator choose a precision's rates.
        Tables from before calibrate measured both precisions are float64's; another
        precision then gets them as they are, with a PrecisionFallback warning (a fixed
        ratio would be a guess: float32's gain differs by machine and by table)."""
        if precision == self.precision:
            return self
        tables = self.precisions.get(precision)
        if tables is None:
            warnings.warn(PrecisionFallback(
                f"the parameters hold {self.precision} rates only (calibrated before calibrate measured both "
                f"precisions): a {precision} run's compute and exchanges are priced at {self.precision}'s; "
                f"calibrate again for {precision}'s own"), stacklevel=2)
            return self
        return replace(self, **tables, precision=precision, shape=(2, 2), unshaped={}).shaped(*self.shape)

    def shaped(self, features: int, classes: int) -> Params:
        """These parameters with the step tables (step_s, step_cpu_s, mp_step_s,
        eval_s_per_point) priced for a features-hidden-classes MLP. calibrate's grids are
        2-H-2's, the paper's shape; MNIST's 784 features and 10 classes make a step over a
        hundred times longer. The one place the model and the simulator meet the data's
        shape (after at(), which keeps it). An evaluation is priced at the pilot's measured
        figure where it has one (measured_evaluation)."""
        if (features, classes) == self.shape:
            return self
        if self.shape != (2, 2):
            raise ValueError(f"these parameters are priced for {self.shape[0]}-H-{self.shape[1]} already")
        if not self.shape_s:
            warnings.warn(ShapeFallback(
                f"the parameters were calibrated before calibrate measured steps of other shapes than 2-H-2: "
                f"a {features}-H-{classes} run's steps are priced as 2-H-2's (too fast for many features); "
                "calibrate again"), stacklevel=2)
            return replace(self, eval_s_per_point=self.measured_evaluation(features, classes, self.eval_s_per_point))
        f = functools.partial(self.shape_factor, features, classes)

        def scale(t: dict) -> dict:
            return {h: {b: v * f(h, b) for b, v in row.items()} for h, row in t.items()}
        big = max(b for row in self.step_s.values() for b in row)   # evaluation goes in big batches
        estimate = {h: v * f(h, big) for h, v in self.eval_s_per_point.items()}
        tables = ("step_s", "step_cpu_s", "mp_step_s", "eval_s_per_point")
        return replace(self, step_s=scale(self.step_s), step_cpu_s=scale(self.step_cpu_s),
                       mp_step_s={K: scale(t) for K, t in self.mp_step_s.items()},
                       eval_s_per_point=self.measured_evaluation(features, classes, estimate),
                       shape=(features, classes), unshaped={k: getattr(self, k) for k in tables})

    def measured_evaluation(self, features: int, classes: int, estimate: dict[int, float]) -> dict[int, float]:
        """eval_s_per_point ([hidden]) of a features-hidden-classes MLP: `estimate`, calibrate's
        2-H-2 figure times the shape's step factor at the biggest batch, rescaled to what the
        pilot measured in its runs on the user's data (self.evaluation) where it evaluated
        this shape at this precision: the measured figure at the pilot's hidden size, the
        estimate's ratio between hidden sizes (at 784-H-10, 4.1 from 256 to 1,024 as a
        forward pass's H, where 2-H-2's own, fixed costs and all, is 3.1). Why: the step's
        factor (forward and backward, at training batches) extrapolates a forward pass
        over the held-out set from 2-H-2 by a factor 220 at 784-256-10, and the pilot's runs
        measured 9-24 % under it on MNIST, digits and 5-class rings (2026-11-28). Without
        the pilot's figure (an older file, other data, the other precision) the estimate
        stands."""
        m = self.evaluation
        if not m or (m["features"], m["classes"], m["precision"]) != (features, classes, self.precision):
            return estimate
        k = m["s_per_point"] / interpolate_log(estimate, m["hidden"])
        return {h: v * k for h, v in estimate.items()}

    def paper_shape(self) -> Params:
        """These parameters with the 2-H-2 step tables back: for calibrate's probes (2-10K-2
        steps between rounds), whatever shape a run's prediction has priced."""
        return replace(self, **self.unshaped, shape=(2, 2), unshaped={}) if self.unshaped else self

    def shape_factor(self, features: int, classes: int, hidden: int, batch: int) -> float:
        """A features-hidden-classes step's time over 2-H-2's at this hidden and batch
        (shape_s): the generic path's time interpolated in D + C (log-log, linear beyond
        the largest), over the fused path's, interpolated in batch and hidden between the
        measured ones (the nearest beyond them)."""
        s = features + classes

        def at(h: int) -> float:
            return _clamped_log({b: interpolate_log({k: v for k, v in t.items() if k != 4}, s) / t[4]
                                 for b, t in self.shape_s[h].items()}, batch)
        return _clamped_log({h: at(h) for h in self.shape_s}, hidden)

    def each_precision(self, change) -> Params:
        """change(params) applied to these parameters at every measured precision: for
        derived parameters (a testbed's links, a calibration without some probes) whose
        change touches per-precision tables, so that at() keeps it."""
        out = change(self)
        return replace(out, precisions={prec: {k: getattr(change(self.at(prec)), k) for k in PER_PRECISION}
                                        for prec in self.precisions})

    def optimizer_update(self, name: str, n: int) -> float:
        """s per update of n values by optimizer `name` (linear between measured sizes;
        none measured: 0, every optimizer as cheap as the sgd add already in c_u)."""
        t = self.optimizer_s.get(name)
        return self.per_nw(t, n) if t else 0.0

    def optimizer_extra(self, name: str, n: int) -> float:
        """What optimizer `name` costs a server beyond sgd's add (which c_u and the
        exchange probes already include), per update of n values."""
        return max(self.optimizer_update(name, n) - self.optimizer_update("sgd", n), 0.0)

    def mp_step(self, K: int, hidden: int, batch: int) -> float:
        """s per step of one member of a replica of K: measured, interpolated in batch and
        hidden; K not measured (or none): the whole step over K."""
        t = self.mp_step_s.get(K)
        if not t:
            return self.step(hidden, batch) / K
        by_h = {h: interpolate_log(tb, batch) for h, tb in t.items()}
        return interpolate_log(by_h, hidden)

    def exchange(self, kind: str, ranks: float, n: int) -> float:
        """s per synchronous round of `kind` with no compute at this rank count and size:
        per_nw in n at each measured rank count, then in ranks interpolate_geometric (once
        the ranks outnumber the cores a round grows by factors: 4-rank rings were 0.16 ms
        among 3 ranks on 2 cores and 1.9 ms among 5, so 4's sits near their geometric mean,
        not half-way). None measured: 0."""
        t = self.exchange_s.get(kind)
        if not t:
            return 0.0
        by_p = {P: self.per_nw(tab, n) for P, tab in t.items()}
        return max(interpolate_geometric(by_p, ranks), 0.0)

    def replica_sum(self, K: int, batch: int) -> float:
        """s per logit sum in a replica of K at this batch (linear between measured K and batch)."""
        t = self.exchange_s.get("replica")
        if not t or K < 2:
            return 0.0
        by_k = {k: self.per_nw(tab, batch) for k, tab in t.items()}
        return max(extrapolate_linear(by_k, K), 0.0)

    def efficiency(self, kind: str, ranks: float, n: int) -> float:
        """Measured link time over derived wire time of `kind`'s round (>= 1 in practice),
        linear between measured rank counts and sizes, the nearest beyond; none: 1."""
        t = self.link_efficiency.get(kind)
        if not t:
            return 1.0
        by_p = {P: self.per_nw(tab, n) if len(tab) > 1 else next(iter(tab.values())) for P, tab in t.items()}
        xs = sorted(by_p)
        return max(extrapolate_linear(by_p, min(max(ranks, xs[0]), xs[-1])), 0.0)

    def cores_worth(self, ranks: float, hidden: int = 10000) -> float:
        """Extension c: cores' worth of training steps `ranks` busy ranks get done on this
        machine, measured per hidden size (a larger model shares caches and memory worse):
        linear between measured rank counts, flat beyond the largest; between measured
        hidden sizes, linear in log(hidden), the nearest one outside them."""
        t = self.effective_cores
        if not isinstance(next(iter(t.values())), dict):  # one table, for every hidden size
            t = {hidden: t}
        by_h = {h: extrapolate_linear(tab, min(ranks, max(tab))) for h, tab in t.items()}
        hs = sorted(by_h)
        if hidden <= hs[0] or hidden >= hs[-1]:
            return by_h[hs[0] if hidden <= hs[0] else hs[-1]]
        i = bisect.bisect_left(hs, hidden)
        a, b = hs[i - 1], hs[i]
        f = math.log(hidden / a) / math.log(b / a)
        return by_h[a] * (1 - f) + by_h[b] * f

    def parallelism(self, ranks: float, cores: int = 0, hidden: int = 10000) -> float:
        """Cores' worth of work from `ranks` busy ranks; on another core count than the
        calibrated one, min(ranks, cores) at the calibrated per-core efficiency."""
        if not cores or cores == self.cores:
            return self.cores_worth(ranks, hidden)
        return min(ranks, cores) * self.cores_worth(self.cores, hidden) / self.cores

    def link_transit(self, t: float) -> float:
        """Seconds a transfer of t seconds of line time takes through a link that paused:
        its token bucket's burst crosses at once."""
        return max(t - self.link_burst_s, 0.0)

    def step(self, hidden: int, batch: int) -> float:
        """Seconds per training step: measured tables, interpolated in batch, then scaled
        with the hidden size between (or beyond) the measured ones."""
        by_h = {h: interpolate_log(t, batch) for h, t in self.step_s.items()}
        return interpolate_log(by_h, hidden)

    def per_nw(self, table: dict[int, float], n_w: int) -> float:
        """A per-message cost at n_w weights: linear between measured sizes (a fixed part and
        a per-byte part), as MPI's s + r n model."""
        xs = sorted(table)
        if len(xs) == 1:
            return table[xs[0]] * n_w / xs[0]
        i = min(max(bisect.bisect_left(xs, n_w), 1), len(xs) - 1)
        a, b = xs[i - 1], xs[i]
        slope = (table[b] - table[a]) / (b - a)
        return max(table[a] + slope * (n_w - a), 0.0)

    def message_cpu(self, n_w: int, crowded_ranks: int = 0) -> tuple[float, float]:
        """(worker's, server's) CPU seconds per push/pull of a shard of n_w weights:
        worker_msg_s and server_update_s (c_u, its sgd add included), each measured with a
        core of its own; with `crowded_ranks` ranks sharing the cores (0: not crowded),
        contended_update_s's total for them, split in the same proportion."""
        wm, c_u = self.per_nw(self.worker_msg_s, n_w), self.per_nw(self.server_update_s, n_w)
        if crowded_ranks and self.contended_update_s:
            f = self.contended(crowded_ranks, n_w) / max(wm + c_u, 1e-12)
            return wm * f, c_u * f
        return wm, c_u

    def owner_push_s(self, n_w: int, value_bytes: int) -> float:
        """A p2p owner's CPU per push of its shard of n_w weights (sgd's; an optimizer's
        extra comes on top). It serves inside its peer's loop (protocol.p2p: Server.poll
        from the step's progress hook and the link's waits), so it never sleeps and wakes
        for a push as a server does, and c_u's fixed part (the probe's server slept between
        pushes: probes.ranks.push_pull) is not its own: only the add and the reply's copy,
        SHARD_PASSES passes over the shard."""
        return self.memory_s_per_byte * SHARD_PASSES * value_bytes * n_w

    def contended(self, ranks: int, n_w: int) -> float:
        """CPU seconds per push/pull (worker's and server's, messages included) when
        `ranks` ranks share the cores: linear in ranks between measured counts."""
        by_p = {P: self.per_nw(t, n_w) for P, t in self.contended_update_s.items()}
        xs = sorted(by_p)
        if ranks <= xs[0] or ranks >= xs[-1]:
            return by_p[xs[0] if ranks <= xs[0] else xs[-1]]
        i = bisect.bisect_left(xs, ranks)
        a, b = xs[i - 1], xs[i]
        return by_p[a] + (by_p[b] - by_p[a]) * (ranks - a) / (b - a)

    def r_d(self, reader: str, fmt: str) -> float:
        """s per byte read and parsed by one rank, for this reader and format (a flat
        [format] table, from older files, serves both readers)."""
        t = self.read_s_per_byte
        return t[reader][fmt] if isinstance(t.get(reader), dict) else t[fmt]

    def r_net(self) -> float:
        """s per byte: the least-squares slope of the ping-pong's time against its size,
        over the sizes of 64 KiB and up (below, latency dominates)."""
        pts = [(b, t) for b, t in self.pingpong_s.items() if b >= 1 << 16] or list(self.pingpong_s.items())
        if len(pts) < 2:
            b, t = pts[0]
            return t / b
        mb = sum(b for b, _ in pts) / len(pts)
        mt = sum(t for _, t in pts) / len(pts)
        return sum((b - mb) * (t - mt) for b, t in pts) / sum((b - mb) ** 2 for b, _ in pts)

    def table1(self, run: Run) -> Table1:
        """The paper's Table 1 for this run, from these calibrated values (its precision's)."""
        self = self.at(run.precision).shaped(run.features, run.classes)
        t_small, t_big = self.step(run.hidden, 16), self.step(run.hidden, 1024)
        c_p = (t_big - t_small) / (1024 - 16)
        fmt = "npy" if run.binary else "tsv"
        return Table1(w=run.workers, b=run.batch, n_f=run.features, n_w=run.n_w, d=run.points,
                      epoch=run.epochs, c_p=c_p, c_b=max(t_small - 16 * c_p, 0.0)
                      + self.per_nw(self.worker_msg_s, run.n_w),
                      c_u=self.per_nw(self.server_update_s, run.n_w), r_d=self.r_d(run.reader, fmt),
                      r_m=self.memory_s_per_byte, r_net=self.r_net(),
                      point_bytes=self.bytes_per_point[fmt], value_bytes=run.value_bytes)


DEFAULT_PRECISION = "float64"   # a Params' tables unless said otherwise (and every table of an older file)
# the tables calibrate measures once per precision (params.json: params["precisions"][precision]);
# the others (start-up, cores' worth, readers, ping-pong, caches) are shared
PER_PRECISION = ("step_s", "step_cpu_s", "step_spread", "eval_s_per_point", "mp_step_s", "optimizer_s",
                 "memory_s_per_byte", "worker_msg_s", "server_update_s", "round_trip_s", "contended_update_s",
                 "exchange_s", "shape_s")


class PrecisionFallback(UserWarning):
    """A run priced at another precision's calibrated rates (Params.at)."""


class ShapeFallback(UserWarning):
    """A run of another shape than 2-H-2 priced at 2-H-2's steps (Params.shaped)."""


def _clamped_log(table: dict[int, float], x: float) -> float:
    """interpolate_log between the measured points, the nearest one's value beyond them
    (for ratios, which do not grow with x as costs do)."""
    xs = sorted(table)
    return interpolate_log(table, min(max(x, xs[0]), xs[-1]))


def _parse_tables(d: dict) -> dict:
    """params.json's tables with their JSON string keys back to ints (sizes, ranks, K);
    tables keyed by name first (optimizer, exchange kind) keep that key."""
    def keys_int(t, depth=99):
        return {int(k): (keys_int(v, depth - 1) if isinstance(v, dict) and depth > 1 else v) for k, v in t.items()}
    p = dict(d)
    for k in ("effective_cores", "startup_by_ranks", "contended_update_s", "step_s", "eval_s_per_point",
              "worker_msg_s", "server_update_s", "round_trip_s", "pingpong_s", "link_s", "mp_step_s", "step_cpu_s",
              "shape_s"):
        if k in p:  # a missing one is reported by the constructor, or takes its default
            p[k] = keys_int(p[k])
    if "step_spread" in p:   # [hidden][batch], then {"p": [...], "ratio": [...]}
        p["step_spread"] = keys_int(p["step_spread"], 2)
    for k in ("optimizer_s", "exchange_s", "link_efficiency"):   # keyed by name first
        if k in p:
            p[k] = {name: keys_int(t) for name, t in p[k].items()}
    return p


def extrapolate_linear(table: dict[int, float], x: float) -> float:
    """Linear between measured points; beyond them, along the nearest end segment."""
    xs = sorted(table)
    if len(xs) == 1:
        return table[xs[0]]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    a, b = xs[i - 1], xs[i]
    return table[a] + (table[b] - table[a]) * (x - a) / (b - a)


def interpolate_geometric(table: dict[int, float], x: float) -> float:
    """Between two measured points, linear in the log of the value (geometric); beyond
    them, or where a value is not positive, as extrapolate_linear: growth by factors
    extrapolated would explode."""
    xs = sorted(table)
    if len(xs) == 1 or not xs[0] < x < xs[-1]:
        return extrapolate_linear(table, x)
    i = bisect.bisect_left(xs, x)
    a, b = xs[i - 1], xs[i]
    if min(table[a], table[b]) <= 0:
        return extrapolate_linear(table, x)
    return table[a] * (table[b] / table[a]) ** ((x - a) / (b - a))


def predict_startup(st: dict[str, float], P: int, C: float) -> float:
    """A job's start (extension c): P ranks import at once, sharing C cores; then numba's
    cache loads, parsers then kernels, each by one rank of the node first (the others
    wait) and then by the other P-1 at once (run.startup.warm_up)."""
    t = max(st["imports_wall_s"], st["imports_cpu_s"] * P / C)
    for stage in ("parsers", "kernels"):
        wall, cpu = st[f"{stage}_wall_s"], st[f"{stage}_cpu_s"]
        t += wall + (max(wall, cpu * (P - 1) / C) if P > 1 else 0.0)
    return t


def predict_init(p: Params, run: Run) -> dict:
    """Init: every rank starts (imports, MPI_Init, numba cache loads: CPU the ranks share
    when they outnumber the cores; measured per rank count where calibrate did, else
    predict_startup), then reads the data.
      sequential  eq. 12: the ranks take turns, each reading and parsing the whole file
                  and keeping its points: P x (r_d B + keep d);
      parallel    the file's parse work spread over the cores, then one all-to-all."""
    P = run.ranks
    C = p.parallelism(P, run.cores)  # cores' worth of work the P ranks get done together
    if p.startup_by_ranks and run.cores in (0, p.cores):  # measured on this machine
        startup = extrapolate_linear(p.startup_by_ranks, P)
    else:
        startup = predict_startup(p.startup, P, C)
    if not run.file_bytes:  # embedded: every rank generates the problem itself
        read = p.embedded_s * max(1.0, P / C)
        return {"startup_s": startup, "read_s": read, "init_s": startup + read}
    fmt = "npy" if run.binary else "tsv"
    whole = p.r_d(run.reader, fmt) * run.file_bytes
    test = p.r_d(run.reader, fmt) * run.test_bytes
    select = p.select_s_per_point[run.reader] * (run.points + run.test_points)
    if run.reader == "sequential":
        # rank 0 reads the held-out file after passing the token: hidden behind rank 1's turn
        read = P * (whole + p.select_s_per_point["sequential"] * run.points) + (test if P == 1 else 0.0)
    else:
        read = (whole + test + select) / C
    return {"startup_s": startup, "read_s": read, "init_s": startup + read}


SHARD_PASSES = 4   # an owner's push served: Delta-w and w read, w written, w copied into the reply


def async_crowding_kind(arch: str, model_parallel: int) -> str:
    """The KIND+step probe whose crowding (architectures.crowding) an asynchronous update
    meets, by whom it waits on: a model-parallel member on its replica's partners in the
    logit sum (replica); a p2p peer on every owner, each a computing rank that serves only
    when it runs (Server.poll from its peer's step and waits: protocol.p2p), as in p2p's
    lockstep probe (p2p); a ps worker on a server that sleeps between pushes and so wakes
    ahead of the computing ranks (async)."""
    if model_parallel > 1:
        return "replica"
    return "p2p" if arch == "p2p" else "async"


def predict_train(p: Params, run: Run, crowding=None) -> dict:
    """The training phase: each worker's steps (think time Z), the servers' work per
    Delta-w (c_u, split over S shards), and the held-out evaluation after every epoch.

    Throughput (updates/s) is the least of: MVA over the S server queues with w workers
    (extension a, d) and, where links are the limit, the servers' links (extension e); the
    round trip when it outlasts a step; and, when ranks outnumber cores, the cores'
    capacity (extension c): their measured worth C over the CPU seconds per update of all
    ranks together, a step plus the push/pull as measured with as many ranks crowding the
    cores.

    Extension e, links (p.link_s, t a shard's time on one link one way): every update
    crosses each server's link twice, its shard in and its reply out, and crosses all S
    servers' links at once (the shards travel in parallel), so the links add two stations
    of demand t, not 2 S. The worker's own link carries all S shards each way, sharing
    itself among them: it holds each worker to 1 / (S t) updates/s, and its exchange
    takes 2 S t, of which those stations hold 2 t, so the other 2 (S - 1) t join the
    exchange's latency. A link that paused passes p.link_burst_s of line time at once (a
    token bucket's burst), so a message crosses an idle link in its time less that: the
    stations' own transit, and the worker link's. Messages that fit the burst (1-bit's)
    then cost no time below the links' rate, and the links only cap the rate.

    crowding(p, kind, ranks, cores, step_s): the seconds a round of the probe `kind` loses
    to the ranks' turns on shared cores (architectures.crowding: with more ranks than cores,
    an asynchronous ps worker's and a replica's measured waits for ranks not running);
    None leaves that term out. Passed in, as that term is set against this model's own
    prediction of the probe's round (architectures.predict passes it)."""
    S, w, K = run.owners, run.workers, run.model_parallel
    # a cluster's nodes (run.node_ranks ranks each) have cores of their own: C is all of
    # theirs, and ranks crowd a node's cores, not the job's
    node = run.node_ranks or run.ranks
    C = math.ceil(run.ranks / node) * p.parallelism(node, run.cores, run.hidden)
    share = math.ceil(run.points / run.replicas)
    steps = math.ceil(share / run.batch) * run.epochs       # per worker (the largest share)
    updates = steps * w
    b = min(run.batch, share)
    # model partitioning (K > 1): a member's step is its slice's, plus the replica's logit sum
    step = p.mp_step(K, run.hidden, b) + p.replica_sum(K, b) if K > 1 else p.step(run.hidden, b)
    # w's shards never cross a slice: max(S, K) of them; a member pushes to its slice's servers
    k = math.ceil(run.n_w / max(S, K))
    visits = max(1, S // K)                                 # messages per update of one member
    peer = run.arch == "p2p"
    wm, c_u = p.message_cpu(k)
    # p2p: a peer waits once for all its owners' replies (wm), and each owner serves inside
    # its peer's loop with no wake-up of its own: each push costs the owner its bytes
    c_u = (p.owner_push_s(k, run.value_bytes) if peer else c_u) + p.optimizer_extra(run.optimizer, k)
    msg = (wm if peer else visits * wm) + visits * c_u   # all ranks' CPU per update
    # a p2p peer also serves its shard: as many pushes per update as it makes
    Z = step + (msg if peer else visits * wm)
    D = c_u * visits / S    # each station's demand per member update (every update visits `visits` of S)
    rtt_free = p.per_nw(p.round_trip_s, k)   # transfer both ways, no queueing
    link = p.per_nw(p.link_s, run.wire_values(k)) if p.link_s else 0.0
    # the measured round trip holds sgd's add, not the optimizer's extra (a station's demand)
    latency = (max(rtt_free - p.per_nw(p.server_update_s, k), 0.0)
               + 2 * (p.link_transit(visits * link) - p.link_transit(link)))
    stations = [D] * S + ([link * visits / S] * 2 if link else [])
    transits = [D] * S + ([p.link_transit(link)] * 2 if link else [])
    overlap = run.mode != "sync" and run.overlap != "off"
    # async: the round trip hides behind the next step unless it is longer (with --overlap
    # auto, not beyond RATIO steps: the worker then waits first)
    X_mva, R = mva(w, Z, stations, overlap=overlap, delay_s=latency, transit_s=transits,
                   cap_s=[visits * link / w] if link else [],
                   overlap_within=OverlapRule.RATIO if run.overlap == "auto" else math.inf)
    crowded = node > (run.cores or p.cores)
    # with ranks sharing cores, messaging costs what it measured under the same crowding
    if crowded and p.contended_update_s:
        wm_c, c_u_c = p.message_cpu(k, node)   # an owner's push never slept: its bytes, as uncrowded
        msg = wm_c + visits * c_u if peer else visits * (wm_c + c_u_c + p.optimizer_extra(run.optimizer, k))
    cpu_per_update = step + msg
    X_cpu = C / cpu_per_update if crowded else math.inf
    if crowded and crowding:   # the ranks' turns on shared cores: each update also waits for ranks not running
        own = p.mp_step(K, run.hidden, b) if K > 1 else step
        # a replica's probe is an asynchronous model-partitioned job, its server's turns included
        lost = crowding(p, async_crowding_kind(run.arch, K), node, run.cores, own)
        X_cpu = w / (w / X_cpu + lost)
    X = min(X_mva, X_cpu)
    steps_s = updates / X
    # shard 0's versions: its slice's pushes; a p2p rank 0 evaluates after its own exchanges
    evaluate = evaluation_s(p, run, steps_s, updates // K, steps if peer else None)
    # a worker's own compute, stretched by sharing the cores
    busy = w + min(S, S * X * D) if run.arch == "ps" else w   # the workers, and the servers' utilization
    compute = steps * step / cores_shared(busy, C)
    train = steps_s + evaluate
    if X_cpu <= X_mva:
        bound = "cores"
    elif link and X_mva * link * visits / S >= 0.9:
        bound = "server link" if run.arch == "ps" else "worker link"
    elif link and X_mva * visits * link / w >= 0.9:
        bound = "worker link"
    else:
        bound = "server" if sum(R) >= Z else "workers"
    return {"train_s": train, "compute_s": min(compute, steps_s), "comm_s": max(steps_s - compute, 0.0),
            "evaluate_s": evaluate, "updates": updates, "updates_per_s": X, "bound": bound,
            "think_s": Z, "c_u_s": c_u,
            "knee_workers": saturation_workers(Z + sum(stations) - max(stations), max(stations)),
            "working_set_bytes": (ws := working_set_bytes(run.batch, run.n_w // K, run.hidden // K, run.features,
                                                          run.value_bytes)),
            "cache_level": cache_level(ws, p.caches)}


def evaluates(run: Run) -> bool:
    """Whether rank 0 evaluates the held-out set during training (asgd.run.roles.tracker_of):
    where it holds all of w (one server, model-partitioned or not; a p2p peer's own w,
    allreduce, without model partitioning). Elsewhere only the final metrics are taken,
    after training (outside train_s)."""
    return (run.arch == "ps" and run.servers == 1) or (run.model_parallel == 1 and run.arch != "ps")


def evaluation_cost_s(p: Params, run: Run) -> float:
    """One of rank 0's held-out evaluations during training: the held-out points at the
    calibrated (or the pilot's measured) cost a point; with --eval-deferred a copy of w,
    its evaluation made after training (outside train_s)."""
    if run.eval_deferred:
        return run.n_w * run.value_bytes * p.memory_s_per_byte
    return run.test_points * interpolate_log(p.eval_s_per_point, run.hidden)


def evaluation_s(p: Params, run: Run, steps_s: float, versions: int, exchanges: int | None = None) -> float:
    """Seconds rank 0's held-out evaluations add to a training of steps_s seconds (without
    them) and `versions` versions of w (training waits for each): the ones run.eval_every's
    cadence makes (asgd.core.target.replay: the tracker's own rule), each costing the
    calibrated evaluation; --eval-every auto's first waits for PROBE_MARGIN times it, as
    the trainer's estimate does. auto holds them to EVAL_BUDGET of the training time, so
    a fast run (float32's) may have none: one an epoch would be priced far above it.
    exchanges: where rank 0 evaluates only after its worker's own exchanges (a p2p peer's:
    core.target.AfterExchange), their number, at most one evaluation each."""
    if not evaluates(run) or versions < 1 or run.epochs < 1:
        return 0.0
    from ..run.config import eval_cadence   # here: the run layer imports numba (as working_set_bytes does)
    cost = evaluation_cost_s(p, run)
    per_epoch = max(versions // run.epochs, 1)
    spent = replay(eval_cadence(run.eval_every), run.epochs, per_epoch, steps_s / (per_epoch * run.epochs), cost,
                   PROBE_MARGIN * cost).spent_s
    return spent if exchanges is None else min(spent, exchanges * cost)
