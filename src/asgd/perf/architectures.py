"""Every architecture's iteration in Alqahtani & Demirbas's form: a lockstep iteration
(sync mode, and allreduce always) takes

    T_iter = T_comp + T_comm

T_comp is a worker's training step (a model-parallel member's: its slice's), stretched
when the workers computing at once outnumber the cores' worth of work they get. T_comm is
what the architecture adds, as the paper's model has it (the bytes its busiest link
carries over the bandwidth, plus per-message latency) and what asgd pays besides:

    ps         each server's link carries every worker's push of its shard in, then every
               reply out: 2 W x wire(n / S) / B              (Alqahtani & Demirbas: 2 W M / B)
    p2p        each peer's link carries its pushes to the N - 1 other owners and their
               replies, and the others' pushes to it and its replies:
               2 (N - 1) x wire(n / N) / B                  (2 (N - 1) M / (N B))
    allreduce  the ring's 2 (P - 1) steps, each one chunk of n / P to the next rank:
               2 (P - 1) x (wire(n / P) / B + L)            (2 (P - 1) M / (P B) + 2 (P - 1) L)
    model partitioning (K)  each member exchanges its slice (n / K) with its slice's
               servers (or owners, or ring), and the replica sums its logits every step

plus, measured rather than derived (asgd.probes.exchanges, through `calibrate`):
    exchange   one synchronous round of the architecture with no compute, on this
               machine: the protocol's CPU, copies and waits (the server's Sync round and
               its replies; p2p's owners serving while they wait; the ring's 2 (P - 1)
               polled steps; MPI_Iallreduce, whatever its algorithm here)
    replica    a replica's logit sum (K - 1 small messages to member 0 and back)
    crowding   with more ranks on a node than cores, what a round loses beyond T_comp and
               the no-compute exchange: the OS runs the ranks in turns, so at each sum a
               rank waits for partners that are not running. Measured as the same round
               after a training step (exchanges' KIND+step), less this model's own
               prediction of that round; linear in the ranks between the measured counts
    optimizer  the server-side optimizer's update beyond sgd's add (allreduce: the whole
               update, which every rank applies to its copy)
and, where links are the limit, the derived wire time above times the link efficiency
of that exchange measured on the links (Params.efficiency: a no-compute round across the
testbed's hosts against its derived wire time; 1 where none was measured).

Asynchronous runs (ps, p2p: the next step computes while the exchange is in flight) are
analytic.predict_train's queueing model. predict() is the whole model's entry: one run of
any architecture, its initialization and its training.

The exchange probes' names (KINDS, each also KIND+step after a training step at
STEP_PROBE) are the model's vocabulary: params.json's exchange_s is keyed by them, and
asgd.probes.exchanges runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..net import OPTIMIZERS
from ..core.wire import DOUBLE, PUSH_HEADER
from .analytic import (Params, Prediction, Run, cache_level, evaluation_s, extrapolate_linear, predict_init,
                       predict_train, working_set_bytes)

ARCHES = ("ps", "p2p", "allreduce")
KINDS = ("ps", "async", "p2p", "ring", "mpi", "replica")   # the exchange probes (asgd.probes.exchanges)
STEP = "+step"                 # KIND+step: the same round after every computing rank's training step
STEP_PROBE = (10_000, 256)     # hidden, batch of the step in KIND+step rounds (a default run's)


def check(run: Run) -> None:
    """A one-line ValueError for a configuration asgd.train would refuse (or the model cannot predict)."""
    if run.arch not in ARCHES:
        raise ValueError(f"unknown architecture {run.arch!r}: one of {', '.join(ARCHES)}")
    if run.workers < 1 or (run.arch == "ps" and run.servers < 1):
        raise ValueError("the parameter-server architecture needs at least one server and one worker")
    K = run.model_parallel
    if K < 1 or run.workers % K or run.hidden % K:
        raise ValueError(f"--model-parallel {K} must divide the workers ({run.workers}) and the hidden units "
                         f"({run.hidden})")
    if run.optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {run.optimizer!r}: one of {', '.join(OPTIMIZERS)}")
    if run.allreduce not in ("ring", "mpi"):
        raise ValueError(f"unknown allreduce {run.allreduce!r}: ring or mpi")
    if run.mode not in ("async", "ssp", "sync"):
        raise ValueError(f"unknown mode {run.mode!r}")


@dataclass
class Iteration:
    """One lockstep iteration's seconds, term by term."""
    compute_s: float                 # T_comp: the step, stretched by the cores' sharing
    exchange_s: float                # the architecture's round with no compute (measured)
    replica_s: float                 # model partitioning: the replica's logit sum
    crowd_s: float                   # ranks outnumbering cores: the rounds' waits for partners
    optimizer_s: float               # the optimizer's update beyond what the exchange holds
    link_s: float                    # the busiest link's wire time x its measured efficiency
    latency_s: float                 # the links' latency, per message in sequence
    kind: str                        # the exchange: ps, p2p, ring or mpi
    detail: dict = field(default_factory=dict)

    @property
    def comm_s(self) -> float:
        """T_comm: everything but the step."""
        return self.exchange_s + self.replica_s + self.crowd_s + self.optimizer_s + self.link_s + self.latency_s

    @property
    def iteration_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def bound(self) -> str:
        """The term that takes the largest part of an iteration, as a resource."""
        terms = {"compute": self.compute_s, "exchange": self.exchange_s + self.replica_s + self.optimizer_s,
                 "link": self.link_s + self.latency_s, "crowding": self.crowd_s}
        top = max(terms, key=terms.get)
        if top == "crowding":
            return "cores"
        if top == "compute":
            return "cores" if self.detail.get("stretch", 1.0) > 1.05 else "workers"
        if top == "link":
            return "server link" if self.kind == "ps" else "worker link"
        return "server" if self.kind == "ps" else "messaging"


def _crowd(p: Params, run: Run, busy: float) -> float:
    """How much longer `busy` ranks computing at once take than one alone: busy over the
    cores' worth they get (1 while each has a core)."""
    if busy <= 0:
        return 1.0
    node = run.node_ranks or run.ranks
    busy = min(busy, node)
    return busy / max(min(busy, p.parallelism(busy, run.cores, run.hidden)), 1e-9)


def crowding(p: Params, kind: str, ranks: int, cores: int = 0, step_s: float | None = None) -> float:
    """Seconds a lockstep round of `kind` (ps, p2p, ring, mpi, replica; async: an update of
    an asynchronous worker) loses when `ranks` ranks share a node's `cores` (0: the
    calibrated machine's): the KIND+step probe's round less this model's round of that
    probe, linear in ranks between the probes (none beyond the largest's). 0 while every
    rank has a core, or where none was measured.
    step_s: the run's step (a member's: its slice's), if shorter than the probe's: the loss
    in proportion, as a rank that computes less between sums is less often out of turn."""
    t = p.exchange_s.get(kind + STEP)
    if not t or ranks <= (cores or p.cores):
        return 0.0
    p = p.paper_shape()   # the probes stepped 2-10K-2, whatever the run's shape
    lost = {P: max(by_n[min(by_n)] - _probe_round(p, kind, P), 0.0) for P, by_n in t.items()}
    return max(at_ranks(p, kind, lost, ranks, cores, step_s), 0.0)


def at_ranks(p: Params, kind: str, by_probe: dict, ranks: float, cores: int = 0, step_s: float | None = None
             ) -> float:
    """Seconds a round of `kind` with `ranks` ranks on a node of `cores` (0: the calibrated
    machine's) has of what by_probe[P] says a KIND+step probe of P ranks had: none while
    every rank has a core, linear in ranks between the probes, none beyond the largest's;
    in proportion to the run's step (step_s) where it is shorter than the probe's."""
    H, B = STEP_PROBE
    p = p.paper_shape()
    by_probe = {**by_probe, p.cores: 0.0}   # every rank on a core of its own: nothing
    x = ranks * p.cores / (cores or p.cores)   # as crowded as the probes' ranks on this machine's cores
    share = 1.0 if step_s is None else min(step_s / (p.mp_step(2, H, B) if kind == "replica" else p.step(H, B)), 1.0)
    return extrapolate_linear(by_probe, min(x, max(by_probe))) * share


PROBE_ROUNDS = 20   # steps per worker of a probe_run (the probes' own means are over 20-80)


def probe_run(kind: str, P: int, rounds: int = PROBE_ROUNDS, precision: str = "float64") -> Run:
    """The asgd.train run that exchanges' KIND+step probe among P ranks is, `rounds` steps
    per worker, no held-out evaluation: what the model (crowding) and the simulator
    (asgd.sim.probes) each set against the probe's measured round. replica: replicas of 2
    with the logit sum inside each member's step; with an odd P, an asynchronous server on
    rank 0; with an even one the probe has no server and no exchange, which no run lacks:
    a synchronous one stands in. precision: the probe's (calibrate runs them in each)."""
    H, B = STEP_PROBE
    common = dict(hidden=H, batch=B, epochs=1, test_points=0, precision=precision)
    if kind in ("ps", "async"):
        return Run(workers=P - 1, servers=1, points=B * (P - 1) * rounds, mode="sync" if kind == "ps" else "async",
                   **common)
    if kind == "p2p":
        return Run(workers=P, servers=P, arch="p2p", mode="sync", points=B * P * rounds, **common)
    if kind in ("ring", "mpi"):
        return Run(workers=P, servers=0, arch="allreduce", allreduce=kind, points=B * P * rounds, **common)
    if kind == "replica":
        members = P - P % 2
        return Run(workers=members, servers=1, model_parallel=2, mode="async" if P % 2 else "sync",
                   points=B * members // 2 * rounds, **common)
    raise ValueError(f"no probe {kind!r}")


def _probe_round(p: Params, kind: str, P: int) -> float:
    """This model's seconds for one round of exchanges' KIND+step probe among P ranks
    (async, and replica with its server: a worker's seconds per update)."""
    probe = probe_run(kind, P, precision=p.precision)
    if not probe.lockstep:
        return probe.workers / predict_train(p, probe)["updates_per_s"]   # no turns: the model's own round
    if kind == "replica":   # steps and sums alone
        H, B = STEP_PROBE
        return p.mp_step(2, H, B) * _crowd(p, probe, probe.workers) + p.replica_sum(2, B)
    return iteration(p, probe, turns=False).iteration_s


def iteration(p: Params, run: Run, turns: bool = True) -> Iteration:
    """The seconds of one lockstep iteration of `run`, term by term (module docstring);
    turns=False leaves the crowding term (the ranks' turns on shared cores) out."""
    W, K, R, n, h = run.workers, run.model_parallel, run.replicas, run.n_w, run.hidden
    share = math.ceil(run.points / R)
    b = min(run.batch, share)
    stretch = _crowd(p, run, W)
    step = p.mp_step(K, h, b) if K > 1 else p.step(h, b)
    slice_n = math.ceil(n / K)
    L = p.link_latency_s
    links = bool(p.link_s)
    per_link = run.node_ranks or 1     # ranks whose messages share one link (a cluster's node)

    def wire(k: float) -> float:       # one message of k weights on one link, one way
        return p.per_nw(p.link_s, math.ceil(run.wire_values(k))) * per_link if links else 0.0

    detail: dict = {"stretch": stretch, "step_s": step}
    if run.arch == "ps":
        S = run.servers
        shards = max(S, K)
        k = math.ceil(n / shards)
        visits = max(1, S // K)                  # a member's messages: its slice's servers
        pushes = W * visits / S                  # a server's pushes per round
        kind, P = "ps", 1 + pushes               # the probe: one server and `pushes` workers of k weights
        ex = p.exchange(kind, P, k)
        cpu = pushes * p.per_nw(p.server_update_s, k)   # the servers' own work in it: S of them at once
        crowd_s = _crowd(p, run, S)
        ex = max(ex - cpu, 0.0) + cpu * crowd_s
        opt = max(1, K // S) * p.optimizer_extra(run.optimizer, k) * crowd_s
        phase = max(pushes, visits) * wire(k)
        link = 2 * p.link_transit(phase)
        latency = 2 * L if links else 0.0
        eff_n = k
        detail.update(servers=S, shard=k, pushes_per_server=pushes)
    elif run.arch == "p2p":
        N = W
        k = math.ceil(n / N)
        kind, P = "p2p", N / K
        ex = p.exchange(kind, P, slice_n)
        opt = p.optimizer_extra(run.optimizer, k) * _crowd(p, run, N)
        link = 2 * p.link_transit((N - 1) / K * wire(k))
        latency = 2 * L if links else 0.0
        eff_n = slice_n
        detail.update(owners=N, shard=k)
    else:
        kind, P = run.allreduce, R
        ex = p.exchange(kind, R, slice_n) if R > 1 else 0.0
        opt = p.optimizer_update(run.optimizer, slice_n) * _crowd(p, run, W)   # every rank applies it
        chunk = (slice_n + 3) / R
        steps = 2 * (R - 1)
        link = steps * p.link_transit(wire(chunk))
        latency = steps * L if links else 0.0
        eff_n = slice_n
        detail.update(steps=steps, chunk=chunk)
    eta = p.efficiency(kind, P, eff_n) if links else 1.0
    replica = p.replica_sum(K, b) + (2 * L if links and K > 1 else 0.0) if K > 1 else 0.0
    node, cores = run.node_ranks or run.ranks, run.cores
    crowd = (crowding(p, kind, node, cores, step) + (crowding(p, "replica", node, cores, step) if K > 1 else 0.0)
             if turns else 0.0)
    detail.update(efficiency=eta, link_raw_s=link, probe_ranks=P)
    return Iteration(compute_s=step * stretch, exchange_s=ex, replica_s=replica, crowd_s=crowd, optimizer_s=opt,
                     link_s=link * eta, latency_s=latency, kind=kind, detail=detail)


def lockstep(p: Params, run: Run) -> dict:
    """analytic.predict_train's result for a lockstep run: iterations x T_iter, plus rank
    0's held-out evaluations."""
    it = iteration(p, run)
    share = math.ceil(run.points / run.replicas)
    iterations = math.ceil(share / run.batch) * run.epochs
    steps_s = iterations * it.iteration_s
    evaluate = evaluation_s(p, run, steps_s, iterations)   # a version of w each iteration
    updates = iterations * (1 if run.arch == "allreduce" else run.workers)
    evaluate = evaluation_s(p, run, steps_s, updates)
    return {"train_s": steps_s + evaluate, "compute_s": iterations * it.compute_s,
            "comm_s": iterations * it.comm_s, "evaluate_s": evaluate, "updates": updates,
            "updates_per_s": updates / steps_s if steps_s > 0 else math.inf, "bound": it.bound,
            "iterations": iterations, "iteration_s": it.iteration_s, "iteration_compute_s": it.compute_s,
            "iteration_comm_s": it.comm_s,
            "terms": {"compute_s": it.compute_s, "exchange_s": it.exchange_s, "replica_s": it.replica_s,
                      "crowd_s": it.crowd_s, "optimizer_s": it.optimizer_s, "link_s": it.link_s,
                      "latency_s": it.latency_s,
                      **it.detail},
            "working_set_bytes": (ws := working_set_bytes(run.batch, run.n_w // run.model_parallel,
                                                          run.hidden // run.model_parallel, run.features,
                                                          run.value_bytes)),
            "cache_level": cache_level(ws, p.caches)}


def cluster_links(p: Params, bytes_per_s: float, latency_s: float) -> Params:
    """Params for ranks on nodes joined by links of this rate (each way) and latency: a
    message of k weights holds a link for its bytes (asgd.core.wire's: payload and header) over
    the rate; no token bucket; every exchange at the efficiency measured on a testbed
    where one was (p.link_efficiency), else 1. (asgd.testbed.model derives a testbed's
    links from its shaping and TCP/IP framing instead.)"""
    sizes = (1, 1 << 24)
    return replace(p, link_s={k: DOUBLE * (k + PUSH_HEADER) / bytes_per_s for k in sizes},
                   link_burst_s=0.0, link_latency_s=latency_s, link_Bps=bytes_per_s)


def probe_link_time(p: Params, kind: str, ranks: int, n: int) -> float:
    """The derived wire time of one no-compute round of an exchange probe
    (asgd.probes.exchanges: ps with one server and ranks - 1 workers, p2p among `ranks`
    peers, ring and mpi among `ranks`) of n weights, on p's links at efficiency 1: what
    the probe's time measured on the links is set against (their efficiency)."""
    arch = {"ps": "ps", "p2p": "p2p"}.get(kind, "allreduce")
    run = Run(workers=ranks - 1 if kind == "ps" else ranks, servers=1, arch=arch,
              allreduce=kind if arch == "allreduce" else "ring", hidden=max(1, round((n - 2) / 5)), batch=1,
              points=ranks)   # 2-H-2 has n_w = 5 H + 2
    return iteration(replace(p, link_efficiency={}), run).link_s


def predict(p: Params, run: Run) -> Prediction:
    """Predicted phases of one run of any architecture, at calibrate's rates of its
    precision (Params.at): analytic.predict_init, and analytic.predict_train (the ranks'
    turns on shared cores: crowding) or, for a lockstep run, lockstep."""
    check(run)
    p = p.at(run.precision).shaped(run.features, run.classes)
    if run.reader not in ("sequential", "parallel"):
        raise ValueError(f"unknown reader {run.reader!r}")
    i = predict_init(p, run)
    t = lockstep(p, run) if run.lockstep else predict_train(p, run, crowding)
    return Prediction(init_s=i["init_s"], compute_s=t["compute_s"], comm_s=t["comm_s"],
                      train_s=t["train_s"], total_s=i["init_s"] + t["train_s"], detail={**i, **t})
