"""What every simulated operation costs, from a calibration (params.json); no SimGrid.

All CPU costs are in seconds of one core of the calibrated machine ("reference
seconds"); the simulator executes them as work on a host whose cores run at
machine.core_speed, sharing the cores among the actors that compute at once. Network
costs are latencies and bandwidths the platform's links carry.

Where each comes from (python -m asgd.perf calibrate, asgd.perf.analytic.Params):
  precision       every table below that calibrate measures per precision is the run's
                  (--precision; Params.at: params.json's params["precisions"])
  step            step_s[hidden][batch] (the best of many steps), interpolated like the
                  analytical model, times a draw from the measured spread of single
                  steps (step_spread, quantiles of step / best; none measured: no spread)
  server update   server_update_s[n_w] (c_u: the server's CPU per Delta-w: receive,
                  check, add, copy into the reply), at the shard's size
  worker message  worker_msg_s[n_w]: a worker's time per push/pull beyond its step
  crowded         with more ranks than cores, contended_update_s[P][n_w] (CPU per push/pull
                  of all ranks together, measured with P ranks sharing the cores) replaces
                  the sum of the two above, split between them in the same proportion;
                  effective_cores[hidden][P] is how many cores' worth P busy ranks get
  messages        ping-pong: one-way time at 8 bytes is the latency, r_net's slope the
                  bandwidth (shared memory here; a cluster's links come from the machine)
  evaluation      eval_s_per_point[hidden] x held-out points (--eval-deferred: a copy of w,
                  memory_s_per_byte x its bytes), on rank 0 (CPU shared with the
                  node's computing ranks), at --eval-every's cadence (asgd.core.target.Cadence,
                  asked after each version of w); auto's first waits for the trainer's estimate,
                  timed in the run on the cores the node's ranks share
  start-up        startup {imports,parsers,kernels}_{wall,cpu}_s: one rank's stages;
                  startup_by_ranks[P] (a whole job's start, measured) is used to check them
  reading         read_s_per_byte[reader][format] (r_d: read + parse on one rank),
                  select_s_per_point[reader] (keep or shuffle per point), embedded_s
"""

from __future__ import annotations

import bisect
import json
import math
import random
from dataclasses import asdict, dataclass, field, replace

from ..core import wire
from ..core.topology import Topology
from ..net.mlp import Layout, Sliced
from ..perf.analytic import Params, Run, evaluation_cost_s, extrapolate_linear, interpolate_log
from ..perf.architectures import STEP, at_ranks, crowding
from ..core.wire import DOUBLE, shard_bounds
from .machines import Machine


def load_params(path: str) -> tuple[Params, dict]:
    """(Params, the raw params dict: what the probes' simulated rounds are cached under)."""
    with open(path) as f:
        got = json.load(f)
    return Params.from_file(got), got["params"]


@dataclass(frozen=True)
class Spec:
    """One simulated run: asgd.train's options (`run`, an analytical-model Run, and the
    rest), the platform, and where the ranks go."""
    run: Run
    machine: Machine
    arch: str | None = None        # ps | p2p | allreduce (p2p: every rank a worker and an owner;
                                   # allreduce: every rank a worker); None: run.arch
    staleness: int = 3             # ssp's K
    seed: int = 0                  # seeds the step-time draws
    compress: str = "none"         # none | 1bit: Delta-w and w' on the wire (asgd.train --compress)
    # the servers' (allreduce: every rank's) optimizer, its update at calibrate's cost of it
    # (optimizer_s; sgd's where none was measured), and lr (None: default_lr's for the run);
    # None: run.optimizer
    optimizer: str | None = None
    lr: float | None = None
    # asgd.train's other options of a run simulated with --like (test, standardize, timeout, ...):
    # results.json's config records them as the run had them; nothing here simulates them
    recorded: dict = field(default_factory=dict)
    nodes: int = 1
    placement: str = "block"       # block: ranks fill node after node | spread: workers one per node
                                   # round-robin, servers on node 0 (CNTK's layout in the paper)
    epoch_barrier: bool = False    # CNTK: every worker waits for all at the end of each epoch
    straggler: float = 1.0         # the last worker's steps take this many times longer (a what-if)
    background: float = 0.0        # cores' worth of CPU other processes take on each node (a shared machine)

    def __post_init__(self):
        """One architecture and one optimizer: the Spec's (the run's then follows it) or the run's."""
        for k in ("arch", "optimizer"):
            if getattr(self, k) is None:
                object.__setattr__(self, k, getattr(self.run, k))
            elif getattr(self.run, k) != getattr(self, k):
                object.__setattr__(self, "run", replace(self.run, **{k: getattr(self, k)}))

    @property
    def servers(self) -> int:
        """Dedicated server ranks (ps only: p2p's owners share their ranks with workers)."""
        return self.run.servers if self.arch == "ps" else 0

    @property
    def topology(self):
        """The job's shape as asgd.train computes it (asgd.core.topology): shards, their
        owners, replicas and slices."""
        r = self.run
        sliced = Sliced(Layout(r.features, r.hidden, r.classes), r.model_parallel)
        return Topology(self.arch, self.ranks, self.servers, tuple(sliced.bounds))

    @property
    def ranks(self) -> int:
        return self.run.workers + self.servers

    def node_of(self, rank: int) -> int:
        """Which node a rank runs on."""
        if self.nodes <= 1:
            return 0
        S = self.servers
        if self.placement == "spread":
            return 0 if rank < S else (rank - S) % self.nodes
        per = math.ceil(self.ranks / self.nodes)
        return min(rank // per, self.nodes - 1)


class Costs:
    """Seconds of each simulated operation for one Spec (see the module docstring)."""

    def __init__(self, p: Params, spec: Spec, raw: dict | None = None, spread: bool = True, *, corrections):
        """corrections(p, raw) -> [kind][P]: the seconds each crowded round of `kind` among P
        ranks adds (negative: takes away) so that it meets calibrate's KIND+step probe
        (sim.probes.corrections, which simulates the probes: called only for a crowded run
        on this machine; on a testbed the model's crowding term stands in). None: the
        simulator's own rounds, what the corrections are measured against. Passed in, not
        imported: the probes' simulation runs the simulator, which prices with this class.
        Every cost is calibrate's at the run's precision (Params.at)."""
        p = p.at(spec.run.precision).shaped(spec.run.features, spec.run.classes)
        self.p, self.spec, self.run = p, spec, spec.run
        r = spec.run
        self.n_w = r.n_w
        self.topo = spec.topology
        self.K = r.model_parallel
        self.shards = self.topo.shards or shard_bounds(self.n_w, 1)
        # bytes of a value of w (--precision, run.precision; a header's: wire.HEADER_VALUE)
        self.itemsize = r.value_bytes
        if spec.compress not in ("none", "1bit"):
            raise ValueError(f"unknown --compress {spec.compress!r} (none, 1bit)")
        if spec.compress == "1bit" and self.K > 1:
            raise ValueError("the simulator prices 1-bit messages without model partitioning only")
        layout = Layout(r.features, r.hidden, r.classes)   # 1-bit's scales are per column of the shard
        self.shard_cols = ([layout.columns(lo, hi) for lo, hi in self.shards] if spec.compress == "1bit"
                           else [None] * len(self.shards))
        # where links are the limit (p.link_s: a testbed's), a message's bytes on the wire
        self.links = bool(p.link_s)
        kind = {"ps": "ps", "p2p": "p2p"}.get(spec.arch, r.allreduce)
        P = {"ps": 1 + r.workers * max(1, r.servers // self.K) / max(r.servers, 1), "p2p": r.workers / self.K}.get(
            spec.arch, r.replicas)
        n = -(-self.n_w // (max(r.servers, self.K) if spec.arch == "ps" else self.K))
        self.kind = kind
        self.eta = p.efficiency(kind, P, n) if self.links else 1.0
        self.spread_q = _spread_table(p.step_spread, r.hidden, r.batch) if spread else None
        # a step's CPU seconds (calibrate's step_cpu_s: what it costs its core, whatever else ran on
        # the machine meanwhile; the simulator shares the cores itself), else its wall time step_s
        self.step_table = p.step_cpu_s or None
        self.cores = spec.machine.cores_per_node
        # ranks per node, and whether a node's ranks outnumber its cores
        per_node = [0] * max(spec.nodes, 1)
        for k in range(spec.ranks):
            per_node[spec.node_of(k)] += 1
        self.ranks_on = per_node
        self.workers_on = [0] * len(per_node)   # the ranks that compute (not a dedicated server)
        for k in range(spec.servers, spec.ranks):
            self.workers_on[spec.node_of(k)] += 1
        self.crowded = [n > self.cores for n in per_node]
        # per node, what each crowded round adds (or takes) to meet calibrate's probes
        # (sim.probes), in proportion to the run's step where shorter than the probes'
        kinds = ("ps", "async", "p2p", "ring", "mpi", "replica")
        self.crowd = {k: [0.0] * len(per_node) for k in kinds}
        own = p.mp_step(self.K, r.hidden, r.batch) if self.K > 1 else p.step(r.hidden, r.batch)
        if corrections is not None and any(self.crowded) and spec.machine.name == "testbed":
            # the probes ran on shared memory: across the testbed's links only the ranks'
            # turns carry over, the model's crowding term (the probe less the model's round)
            self.crowd = {k: [crowding(p, k, n, self.cores, own) for n in per_node] for k in kinds}
        elif corrections is not None and any(self.crowded) and spec.machine.name == "here" and \
                any(k.endswith(STEP) for k in p.exchange_s):
            probes = p.paper_shape()   # calibrate's probes stepped 2-10K-2
            table = corrections(probes, raw if raw is not None else asdict(probes))
            for k, by_P in table.items():
                self.crowd[k] = [at_ranks(p, k, by_P, n, self.cores, own) if n > self.cores else 0.0
                                 for n in per_node]

    # -- computation -------------------------------------------------------------------

    def step(self, m: int) -> float:
        """Mean-free best step time for m points (0: an empty sync batch, zeroing Delta-w);
        a model-parallel member's (its slice's) with K > 1."""
        if m <= 0:
            return self.p.memory_s_per_byte * self.itemsize * self.n_w / self.K
        if self.step_table:
            by_h = {h: interpolate_log(t, m) for h, t in self.step_table.items()}
            whole = interpolate_log(by_h, self.run.hidden)
        else:
            whole = self.p.step(self.run.hidden, m)
        if self.K > 1:   # a member's step, at the CPU's share of the whole step's wall time
            return self.p.mp_step(self.K, self.run.hidden, m) * whole / self.p.step(self.run.hidden, m)
        return whole

    def spread_draw(self, rng: random.Random) -> float:
        """A step's time over the best step's, drawn from the measured quantiles (1.0
        without a measured spread): inverse-CDF sampling, linear between quantiles."""
        q = self.spread_q
        if not q:
            return 1.0
        u = rng.random()
        ps, vs = q
        i = bisect.bisect_right(ps, u)
        if i == 0:
            return vs[0]
        if i >= len(ps):
            return vs[-1]
        f = (u - ps[i - 1]) / (ps[i] - ps[i - 1])
        return vs[i - 1] + f * (vs[i] - vs[i - 1])

    def mean_spread(self) -> float:
        if not self.spread_q:
            return 1.0
        ps, vs = self.spread_q
        return sum((vs[i] + vs[i + 1]) / 2 * (ps[i + 1] - ps[i]) for i in range(len(ps) - 1))

    def cores_worth(self, busy: int, calibrated: bool = False) -> float:
        """Cores' worth of work `busy` computing ranks get done on one node (calibrated:
        effective_cores; linear between measured counts, flat past the last). With other
        users' load given (--background), the cores left to the ranks; `calibrated`: as
        the machine was when calibrate measured it, whatever the load now."""
        if busy <= 0:
            return 0.0
        worth = self._worth(busy)
        if self.spec.background > 0 and not calibrated:
            # other users took `background` cores' worth meanwhile: the ranks get at most the
            # rest of the node's worth, and never more than their own count's (one rank beside
            # one core of load still has a core). Replacing the calibrated worth by the cores
            # left, as this did, made 0.01 cores of load speed 3 ranks on 2 cores up from 1.6
            # cores' worth to 1.99.
            left = max(self.cores - self.spec.background, 0.05 * self.cores) / self.cores
            worth = min(worth, self._worth(self.cores) * left)
        return worth

    def _worth(self, busy: int) -> float:
        if not self.spec.machine.calibrated:
            return float(min(busy, self.cores))
        return max(min(self.p.cores_worth(busy, self.run.hidden), busy, self.cores), 1e-3)

    def _msg_split(self, node: int, shard_nw: int) -> tuple[float, float]:
        """(worker's, server's) CPU per push/pull of one shard, crowded or not."""
        crowded = self.crowded[node] and self.spec.machine.calibrated
        return self.p.message_cpu(shard_nw, self.ranks_on[node] if crowded else 0)

    def server_update(self, node: int, shard_nw: int) -> float:
        """c_u: the server's CPU per Delta-w of a shard (1-bit: decode the signs too), its
        add included (calibrate measured sgd's)."""
        return self._msg_split(node, shard_nw)[1] + self._decode(shard_nw)

    def owner_push(self, shard_nw: int) -> float:
        """A p2p owner's push served inside its peer's loop (no wake-up of its own): its
        bytes (Params.owner_push_s), 1-bit's decoding too."""
        return self.p.owner_push_s(shard_nw, self.itemsize) + self._decode(shard_nw)

    def _decode(self, shard_nw: int) -> float:
        """A 1-bit push's unpacking and scaling on its server or owner: about one pass over
        the shard (none without compression)."""
        return self.p.memory_s_per_byte * 2 * self.itemsize * shard_nw if self.spec.compress == "1bit" else 0.0

    def optimizer_extra(self, shard_nw: int) -> float:
        """The server-side optimizer's update beyond sgd's add, once per version of a shard."""
        return self.p.optimizer_extra(self.spec.optimizer, shard_nw)

    def worker_message(self, node: int, shard_nw: int) -> float:
        """A worker's time per push/pull of a shard beyond its step (1-bit: quantize Delta-w,
        keep the error, decode w': about three passes over the shard)."""
        base = self._msg_split(node, shard_nw)[0]
        if self.spec.compress == "1bit":
            base += self.p.memory_s_per_byte * 6 * self.itemsize * shard_nw
        return base

    def allreduce_add(self, values: int) -> float:
        """Reducing `values` received into the local sum (read two, write one)."""
        return self.p.memory_s_per_byte * 3 * self.itemsize * values

    def apply_update(self) -> float:
        """allreduce: the averaged update applied to w (its slice), by the run's optimizer
        (calibrated; none measured: sgd's add_scaled as three passes over memory)."""
        n = -(-self.n_w // self.K)
        return self.p.optimizer_update(self.spec.optimizer, n) or self.p.memory_s_per_byte * 3 * self.itemsize * n

    def mpi_allreduce(self, ranks: int, values: int) -> float:
        """MPI_Iallreduce's round of `values` among `ranks` as calibrate measured it on
        this machine (exchange_s["mpi"]: whatever algorithm the library picks), and on
        links its bytes as a ring's at the efficiency measured there."""
        t = self.p.exchange("mpi", ranks, values)
        if self.links and ranks > 1:
            chunk = self.p.per_nw(self.p.link_s, -(-values // ranks))
            t += self.eta * 2 * (ranks - 1) * self.p.link_transit(chunk)
        return t

    def replica_bytes(self, batch: int) -> int:
        """A replica's partial logits (batch x 2) with the cut and the stop (protocol.replica)."""
        return self.itemsize * (batch * self.run.classes + 2)

    def wire(self, nbytes: float) -> float:
        """Bytes a message of nbytes occupies on a link: itself on shared memory or a
        described cluster; on a testbed (p.link_s), its framed wire time at the link's
        rate (what tbf's buckets pass at line speed is taken from these: sim.buckets)."""
        if not self.links:
            return nbytes
        return self.p.per_nw(self.p.link_s, max(nbytes / DOUBLE, 1)) * self.spec.machine.link_bw

    def bucket_bytes(self) -> float:
        """tbf's bucket on each direction of a testbed's link (0: no testbed)."""
        return self.p.link_burst_s * self.spec.machine.link_bw if self.links else 0.0

    def evaluate(self) -> float:
        """Rank 0's held-out evaluation during training (a copy of w with --eval-deferred)."""
        return evaluation_cost_s(self.p, self.run)

    # -- messages ------------------------------------------------------------------------

    def push_bytes(self, s: int) -> int:
        """A push to server s, as asgd.core.wire counts it."""
        lo, hi = self.shards[s]
        return wire.push_bytes(hi - lo, self.shard_cols[s], self.itemsize)

    def pull_bytes(self, s: int) -> int:
        lo, hi = self.shards[s]
        return wire.pull_bytes(hi - lo, self.shard_cols[s], self.itemsize)

    def latency(self) -> float:
        """One-way latency of a small message between ranks of one node (ping-pong at 8 bytes)."""
        pp = self.p.pingpong_s
        return pp[min(pp)]

    def bandwidth(self) -> float:
        """Bytes/s of a large message between ranks of one node (1 / r_net)."""
        r = self.p.r_net()
        return 1.0 / r if r > 0 else 1e12

    # -- init ------------------------------------------------------------------------------

    def startup(self) -> dict[str, tuple[float, float]]:
        """Per stage (imports, parsers, kernels): (wall floor, CPU) seconds of one rank."""
        st = self.p.startup
        return {k: (st[f"{k}_wall_s"], st[f"{k}_cpu_s"]) for k in ("imports", "parsers", "kernels")}

    def imports(self, node_ranks: int) -> tuple[float, float]:
        """(wall floor, CPU per rank) of the imports stage with `node_ranks` ranks starting
        on one node. On the calibrated machine, the CPU is solved from the measured job
        start-up (startup_by_ranks, interpolated in P) minus the cache loads, so that the
        simulated stages, sharing the cores, take what a P-rank job took; elsewhere (or
        with no such table) one rank's measured imports."""
        (wall, cpu), caches = self.startup()["imports"], 0.0
        table = self.p.startup_by_ranks
        if not table or not self.spec.machine.calibrated:
            return wall, cpu
        P = node_ranks
        def worth(n):  # under the table's conditions: calibrated
            return self.cores_worth(n, calibrated=True)
        for stage in ("parsers", "kernels"):
            w, c = self.startup()[stage]
            caches += max(w, c) + (max(w, c * (P - 1) / worth(P - 1)) if P > 1 else 0.0)
        left = max(extrapolate_linear(table, P) - caches - self.embedded() * P / worth(P), 0.0)
        return min(wall, left), left * worth(P) / P

    def measured_job_startup(self, ranks: int) -> float | None:
        """The calibrated whole-job start-up at this rank count (for checking), or None."""
        t = self.p.startup_by_ranks
        return extrapolate_linear(t, ranks) if t else None

    def embedded(self) -> float:
        return self.p.embedded_s

    def read_parse(self, nbytes: float) -> float:
        """CPU to read (from memory: the page cache) and parse nbytes of the data file,
        with the run's reader's calibrated r_d."""
        fmt = "npy" if self.run.binary else "tsv"
        return self.p.r_d(self.run.reader, fmt) * nbytes

    def select(self, points: float) -> float:
        """Keeping (sequential) or shuffling (parallel) `points` points."""
        return self.p.select_s_per_point[self.run.reader] * points

    def point_bytes(self) -> int:
        """A point as the parallel reader's all-to-all sends it: features, label, line."""
        return DOUBLE * (self.run.features + 2)


def _spread_table(table, hidden: int, batch: int):
    """(probabilities, ratios) of the measured step spread at the hidden size and then
    the batch nearest (in log) to the run's, or None where none was measured."""
    if not table:
        return None
    def near(keys, x):
        return min(keys, key=lambda k: abs(math.log(int(k) / x)))
    by_batch = table[near(table, hidden)]
    if not by_batch:
        return None
    row = by_batch[near(by_batch, batch)]
    return [float(x) for x in row["p"]], [float(x) for x in row["ratio"]]
