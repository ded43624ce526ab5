"""asgd's protocol as SimGrid actors: one actor per MPI rank, doing what asgd.train,
asgd.protocol and asgd.data.readers do, with the calibrated costs (costs.py) in place of
the work and SimGrid's mailboxes in place of MPI's messages (of asgd.core.wire's sizes).

Every rank (asgd.train.main)
  init     start-up: imports (CPU shared with the node's other ranks, a wall floor for
           their I/O); numba's cache of the readers' parsers and of the kernels, loaded by
           the node's first rank and then by the others (asgd.run.startup.warm_up); every
           rank agrees (a barrier); the data (reader below); every rank agrees again.
           init ends there.
  train    server, worker or allreduce loop (below)
  end      idle until every rank is done (a barrier), then rank 0 takes the clock offsets
           (asgd.mpiutil.clock_offsets: 5 ping-pongs per rank) and gathers the records:
           its wall time ends there.

Readers (asgd.data.readers)
  embedded    every rank generates the problem (embedded_s)
  sequential  a token passed rank to rank; each reads and parses the whole file and keeps
              its points; rank 0 reads the held-out file after passing the token
  parallel    every rank reads and parses 1/P of the bytes at once, then one all-to-all
  On a machine with a shared file system, bytes travel from its host over the network
  (SimGrid shares its bandwidth among the readers); otherwise they are in memory.

Worker (asgd.protocol.worker.run_worker): the real worker's loop (asgd.core.worker.loop:
its schedule, overlap rule, epoch end and `done`) over mailboxes (links.MailboxLink), each
step's compute charged at the step's time, drawn from the measured spread.
Server (asgd.protocol.server): a permanent receiver per server (the persistent Irecvs)
driving the same bookkeeping and reply policies as the real server (asgd.core.shard,
asgd.core.policy): async answers each push, then applies it (c_u); ssp applies, then holds
the reply while the worker's next push would be more than K steps ahead of the slowest
active worker; sync's rounds apply one averaged update, then answer every worker.
Allreduce (asgd.protocol.allreduce): the real rank's loop (asgd.core.worker.allreduce_loop);
each step one allreduce of [m * Delta-w | m, loss, stop] (links.RingSum).
Not simulated: --standardize's statistics, checkpoints, stop requests.

Waiting (asgd.mpiutil.Waiter): a rank notices a completed message only when it polls:
it spins 2 ms and then sleeps 10 us doubling to 100 us when its node has a core per
rank; when ranks outnumber cores it polls between yields for 1 ms over the ranks per core
(simulated as a spin: a yield costs the others next to nothing), then sleeps 10 us doubling
to 80 us per rank per core, at most 1 ms (asgd.core.waiting); every
sleep also overshoots by the calibrated sleep overhead. The simulated rank wakes at that
poll, not at the message's arrival.
"""
from __future__ import annotations

import math
import random

from ..mpiutil import CLOCK_PINGS
from ..core.policy import policy
from ..core.schedule import Schedule, schedule
from ..core.shard import Shard
from ..core.stats import merge_shards
from ..core.target import PROBE_MARGIN, AfterExchange, Evaluations
from ..core.waiting import FIRST_SLEEP_S, max_sleep_s, ranks_per_core, spin_s   # the Waiter's polls
from ..core.wire import DOUBLE, R_VERSION, RECV, SEND, flow_id
from ..core.worker import allreduce_loop, loop
from ..data.shares import worker_points
from ..run.config import eval_cadence
from .buckets import TokenBuckets
from .clock import SimClock
from .costs import Costs, Spec
from .links import MailboxLink, RingSum
from .platform import FLOPS


def random_stream(seed: int, rank: int, purpose: str) -> random.Random:
    """A random stream of its own per (seed, rank, purpose), the same in every process:
    random.Random seeds from a str through SHA-512, never through Python's hash(), which
    salts strings per process (PYTHONHASHSEED)."""
    return random.Random(f"asgd.sim {purpose} seed={seed} rank={rank}")


class World:
    """What the actors share: the platform, costs, clocks, records and the epoch tracker."""

    def __init__(self, sg, spec: Spec, costs: Costs, hosts: list, fs_host, sleep_overhead: float,
                 trace: bool = False, window: tuple[int, int] = (0, 200), nics: list | None = None):
        self.sg, self.spec, self.costs = sg, spec, costs
        self.topo = costs.topo
        self.nics = nics or []   # testbed: each rank's host on the links
        bucket = costs.bucket_bytes()
        self.buckets = TokenBuckets(len(self.nics), bucket, spec.machine.link_bw) if self.nics and bucket else None
        self.run = spec.run
        self.P, self.S, self.W = spec.ranks, spec.servers, spec.run.workers
        self.hosts, self.fs_host = hosts, fs_host
        self.sleep_overhead = sleep_overhead
        def now():
            return sg.Engine.clock
        self.now = now
        self.clocks = [SimClock(now, "init", trace, window) for _ in range(self.P)]
        self.owner_clocks = [SimClock(now, "idle", trace, window) for _ in range(self.P)]   # p2p's owners
        self.served: dict[int, dict] = {}   # p2p: each rank's owner's record
        self.records: list[dict | None] = [None] * self.P
        self.init_end = [0.0] * self.P
        self.end = [0.0] * self.P
        self.node = [spec.node_of(r) for r in range(self.P)]
        on_node: dict[int, list[int]] = {}
        for r in range(self.P):
            on_node.setdefault(self.node[r], []).append(r)
        self.on_node = on_node
        self.node_barriers = {n: sg.Barrier(len(rs)) for n, rs in on_node.items()}
        self.barriers = {}  # name -> sg.Barrier over all ranks
        self.mb = {}
        self.history: list[dict] = []
        self.samples = 0
        self.epoch = 0
        self.serve_start = None
        self.versions = 0          # of w, on rank 0 (the tracker's updates)
        self.epoch_began = self.epoch_s = None
        self.cadence = eval_cadence(spec.run.eval_every)
        # a p2p peer's rank 0 evaluates its worker's w, made once that worker's exchange is done
        self.after_exchange = AfterExchange() if spec.arch == "p2p" and self.topo.K == 1 else None
        # auto's first waits for the trainer's estimate (run.roles.evaluation_cost), timed as the
        # node's other ranks start and compute: at the cores' share they leave it. The analytical
        # model prices that estimate unstretched (analytic.evaluation_s): the two differ here
        ranks = costs.ranks_on[self.node[0]]
        shared = ranks / max(min(ranks, costs.cores_worth(ranks)), 1e-9)
        self.evals = Evaluations(took_s=PROBE_MARGIN * costs.evaluate() * shared)
        self.wall = 0.0
        self.rngs = [random_stream(spec.seed, r, "steps") for r in range(self.P)]
        self.credit = [0.0] * self.P   # CPU seconds each rank's next steps are short of (crowd_turns)

    # -- helpers the actors use ------------------------------------------------------------

    def mailbox(self, name: str):
        m = self.mb.get(name)
        if m is None:
            m = self.mb[name] = self.sg.Mailbox.by_name(name)
        return m

    def crowded(self, rank: int) -> bool:
        return self.costs.crowded[self.node[rank]]

    def per_core(self, rank: int) -> float:
        """The Waiter's word for this rank's node (asgd.core.waiting.ranks_per_core)."""
        return ranks_per_core(self.costs.ranks_on[self.node[rank]], self.costs.cores)

    def execute(self, seconds: float, rank: int | None = None) -> None:
        """CPU work of `seconds` reference seconds, shared with the node's other actors.
        With `rank` (a short burst right after a wait: the server's update, a worker's
        push/pull), the work has the weight of all the node's ranks: Linux's scheduler
        runs a task that mostly sleeps ahead of the ones that compute, so a crowded
        node's server is not slowed P-fold by the workers (it gets about a core)."""
        if seconds > 0:
            if rank is not None and self.crowded(rank):
                self.sg.this_actor.execute(seconds * FLOPS, float(len(self.on_node[self.node[rank]])))
            else:
                self.sg.this_actor.execute(seconds * FLOPS)

    def execute_with_floor(self, cpu: float, wall: float) -> None:
        """CPU work that also lasts at least `wall` (its I/O): max(wall, the CPU's time)."""
        start = self.now()
        self.execute(cpu)
        left = wall - (self.now() - start)
        if left > 0:
            self.sg.this_actor.sleep_for(left)

    def notice(self, rank: int, started: float, extra: float = 0.0) -> None:
        """Sleep until this rank's Waiter would next poll (it began waiting at `started`)
        after what it waits for is done, `extra` seconds from now (one sleep for both)."""
        done = self.now() + extra
        if done <= started:
            return  # done at once: the first Test saw it
        t = started + _next_poll(done - started, self.per_core(rank), self.sleep_overhead)
        if t > self.now():
            self.sg.this_actor.sleep_for(t - self.now())

    def crowd_turns(self, rank: int, kind: str) -> None:
        """What a crowded round of `kind` adds or takes to meet calibrate's probe of it
        (Costs.crowd, sim.probes), as the node's cores' time: CPU work shared among the
        node's computing ranks (each takes its turn once a round), so that the node's
        round lasts that much longer whether its other ranks wait too (a lockstep round)
        or compute meanwhile (a replica's sum, an asynchronous worker); a negative one is
        taken from this rank's next steps."""
        node = self.node[rank]
        busy = max(self.costs.workers_on[node], 1)
        t = self.costs.crowd[kind][node] * min(self.costs.cores, busy) / busy
        if t > 0:
            self.execute(t)
        elif t < 0:
            self.credit[rank] -= t

    def step_work(self, rank: int, seconds: float) -> float:
        """A step's CPU less this rank's credit (crowd_turns), which it uses up."""
        used = min(self.credit[rank], seconds)
        self.credit[rank] -= used
        return seconds - used

    def barrier(self, rank: int, name: str) -> None:
        """asgd.mpiutil.Waiter.barrier over all ranks: an Ibarrier (log2 P message rounds), polled."""
        b = self.barriers.get(name)
        if b is None:
            b = self.barriers[name] = self.sg.Barrier(self.P)
        started = self.now()
        b.wait()
        self.notice(rank, started, math.ceil(math.log2(self.P)) * self._latency(rank) if self.P > 1 else 0.0)

    def node_barrier(self, rank: int) -> None:
        started = self.now()
        self.node_barriers[self.node[rank]].wait()
        self.notice(rank, started)

    def _latency(self, rank: int) -> float:
        m = self.spec.machine
        return m.link_lat if m.multi_node and self.spec.nodes > 1 else self.costs.latency()

    def first_on_node(self, rank: int) -> bool:
        return self.on_node[self.node[rank]][0] == rank

    def send(self, src: int, dst: int, to: str, payload, nbytes: float):
        """Rank src's message to mailbox `to` of rank dst; .wait() until it is delivered.
        On a testbed it crosses src's and dst's links (a courier actor carries it between
        their hosts, then hands it over on the cores' host), unless both are one rank."""
        if self.nics and src != dst:
            return _Delivery(self.sg.Actor.create(f"msg{src}-{dst}", self.hosts[0], self._courier, src, dst, to,
                                                  payload, nbytes))
        return self.mailbox(to).put_async(payload, int(max(nbytes, 1)))

    def post(self, src: int, dst: int, to: str, payload, nbytes: float) -> None:
        """A message sent and forgotten (MPI sends it eagerly, or the sender waits on
        something that implies its arrival: a push's reply)."""
        if self.nics and src != dst:
            self.send(src, dst, to, payload, nbytes)
            return
        self.mailbox(to).put_init(payload, int(max(nbytes, 1))).detach()

    def _courier(self, src: int, dst: int, to: str, payload, nbytes: float) -> None:
        """The message's bytes past both links' buckets cross them at the rate, times the
        efficiency the testbed measured for the run's exchange (against the same: wire
        time less the burst, asgd.testbed.model.measure_efficiency)."""
        wire = self.costs.wire(nbytes)
        free = self.buckets.take(src, dst, wire, self.now()) if self.buckets else 0.0
        self.sg.Comm.sendto(self.nics[src], self.nics[dst], int(max((wire - free) * self.costs.eta, 1)))
        if self.buckets:
            self.buckets.sent(src, dst, self.now())
        self.mailbox(to).put(payload, 1)

    def receive_on(self, *names: str) -> None:
        """This actor is the permanent receiver of these mailboxes: messages to them move as
        soon as they are sent (MPI's receives posted in advance), not when it asks."""
        me = self.sg.Actor.self()
        for n in names:
            self.mailbox(n).set_receiver(me)

    def worker_barrier(self, rank: int, epoch: int) -> None:
        """All workers meet (CNTK's end-of-epoch barrier), polled."""
        key = ("workers", epoch)
        b = self.barriers.get(key)
        if b is None:
            b = self.barriers[key] = self.sg.Barrier(self.W)
        started = self.now()
        b.wait()
        self.notice(rank, started)

    def recv(self, name: str):
        return self.mailbox(name).get()

    def fetch(self, rank: int, nbytes: float) -> None:
        """Bring nbytes of a file to this rank: over the network from the file system's
        host (a request's latency, then the bytes, sharing the links), or nothing (the
        file is in this node's memory: reading it is part of the parse's r_d)."""
        if self.fs_host is None or nbytes <= 0:
            return
        self.sg.this_actor.sleep_for(self.spec.machine.fs_lat)
        self.sg.Comm.sendto_async(self.fs_host, self.hosts[self.node[rank]], int(nbytes)).wait()

    def step_samples(self, steps: int) -> list[int]:
        """Samples of all replicas together at each step of an epoch (sync, allreduce)."""
        R, b, n = self.run.replicas, self.run.batch, self.run.points
        return [sum(max(0, min(b, worker_points(n, R, q) - k * b)) for q in range(R)) for k in range(steps)]

    # -- the epoch tracker (asgd.run.progress.EpochTracker on rank 0) -----------------------

    def track(self, m: int, evaluate) -> None:
        """A version of m samples: the epochs it ends, and the held-out evaluations
        `evaluate` makes at --eval-every's cadence (the tracker's own rule, on this clock)."""
        self.samples += m
        self.versions += 1
        start, n = self.serve_start or 0.0, self.run.points
        while self.epoch < self.run.epochs and self.samples >= (self.epoch + 1) * n:
            self.epoch += 1
            t = self.now()
            self.epoch_s, self.epoch_began = t - (start if self.epoch_began is None else self.epoch_began), t
            if evaluate is not None and self.cadence.due(self.evals, self.versions, t - start, epoch_end=True,
                                                         epoch_s=self.epoch_s):
                self._held_out(evaluate, start)
            t = self.now()
            self.history.append({"epoch": self.epoch, "samples": self.samples,
                                 "time_s": round(t - start, 4), "wall_s": round(t, 4),
                                 "train_loss": None, "test_loss": None, "test_accuracy": None})
        if evaluate is not None and self.cadence.due(self.evals, self.versions, self.now() - start,
                                                     epoch_s=self.epoch_s):
            if self.after_exchange is None:
                self._held_out(evaluate, start)
            else:
                self.after_exchange.ask()

    def exchanged(self) -> None:
        """Rank 0's worker, a p2p peer, has its exchange's fresh w: the evaluation owed,
        made on the worker's clock (run.progress.EpochTracker.exchanged)."""
        if self.after_exchange is not None and self.after_exchange.take(self.evals.updates, self.versions):
            self._held_out(lambda: _evaluate(self, self.clocks[0]), self.serve_start or 0.0)

    def _held_out(self, evaluate, start: float) -> None:
        began = self.now()
        evaluate()
        self.evals.add(self.versions, began - start, self.now() - start)


class _Delivery:
    """A message a courier actor carries (World.send on a testbed): wait() until delivered."""

    def __init__(self, actor):
        self.actor = actor

    def wait(self) -> None:
        self.actor.join()


def _next_poll(elapsed: float, per_core: float, overhead: float) -> float:
    """The Waiter's first poll at or after `elapsed` seconds into a wait, among `per_core`
    ranks per core (0: a core of its own)."""
    spin = spin_s(per_core)
    if elapsed <= spin:
        return elapsed
    cap = max_sleep_s(per_core)
    t, s = spin, FIRST_SLEEP_S
    while t < elapsed:
        t += s + overhead
        s = min(2 * s, cap)
        if s == cap and t < elapsed:  # steady state: jump whole periods at once
            period = s + overhead
            t += math.floor((elapsed - t) / period) * period
            if t < elapsed:
                t += period
            break
    return t


# -- init ----------------------------------------------------------------------------------

def startup(world: World, rank: int) -> None:
    """Imports with MPI_Init, then numba's cache (asgd.run.startup.warm_up), then every
    rank agrees on it (asgd.mpiutil.agree_on) before the data."""
    wall, cpu = world.costs.imports(len(world.on_node[world.node[rank]]))
    world.execute_with_floor(cpu, wall)
    _warm_up(world, rank)
    world.barrier(rank, "kernels-agree")


def _warm_up(world: World, rank: int) -> None:
    """asgd.run.startup.warm_up (asgd.mpiutil.once_per_node): the node's first rank loads
    numba's cache of the parsers and the kernels, the others wait for it (a node barrier),
    then load theirs."""
    st = world.costs.startup()
    first = world.first_on_node(rank)
    if first:
        for stage in ("parsers", "kernels"):
            world.execute_with_floor(st[stage][1], st[stage][0])
    world.node_barrier(rank)
    if not first:
        for stage in ("parsers", "kernels"):
            world.execute_with_floor(st[stage][1], st[stage][0])


def read_data(world: World, rank: int) -> None:
    """The run's reader (asgd.data.readers); the sub-phases read/parse/shuffle are recorded."""
    r, c, clock = world.run, world.costs, world.clocks[rank]
    if not r.file_bytes:  # the embedded problem
        t = world.now()
        world.execute(c.embedded())
        clock.add_sub("shuffle", world.now() - t)
        return
    if r.reader == "sequential":
        _read_sequential(world, rank)
    else:
        _read_parallel(world, rank)


def _read_sequential(world: World, rank: int) -> None:
    r, c, clock, P = world.run, world.costs, world.clocks[rank], world.P
    t = world.now()
    if rank > 0:
        world.recv(f"token{rank}")
        world.notice(rank, t)
    world.fetch(rank, r.file_bytes)
    t1 = world.now()
    world.execute(c.read_parse(r.file_bytes))
    t2 = world.now()
    world.execute(c.select(r.points))   # assign every line, keep mine
    t3 = world.now()
    if rank < P - 1:
        world.post(rank, rank + 1, f"token{rank + 1}", rank, DOUBLE)
    read, parse, shuffle = t1 - t, t2 - t1, t3 - t2
    if rank == 0 and r.test_bytes:  # after passing the token: overlaps rank 1's turn
        t4 = world.now()
        world.fetch(rank, r.test_bytes)
        t5 = world.now()
        world.execute(c.read_parse(r.test_bytes))
        read, parse = read + t5 - t4, parse + world.now() - t5
    t6 = world.now()
    world.barrier(rank, "sequential-agree")  # asgd.mpiutil.agree: every rank learns every rank's verdict
    clock.add_sub("read", read + world.now() - t6)
    clock.add_sub("parse", parse)
    clock.add_sub("shuffle", shuffle)


def _read_parallel(world: World, rank: int) -> None:
    r, c, clock, P = world.run, world.costs, world.clocks[rank], world.P
    t = world.now()
    mine = (r.file_bytes + r.test_bytes) / P
    world.fetch(rank, mine)
    t1 = world.now()
    world.execute(c.read_parse(mine))
    t2 = world.now()
    world.barrier(rank, "parallel-agree")  # the parse's verdict, agreed before the all-to-all
    t3 = world.now()
    points = (r.points + r.test_points) / P
    world.execute(c.select(points))
    _alltoall(world, rank, points * c.point_bytes())
    clock.add_sub("read", t1 - t)
    clock.add_sub("parse", t2 - t1 + t3 - t2)
    clock.add_sub("shuffle", world.now() - t3)


def _alltoall(world: World, rank: int, nbytes: float) -> None:
    """One Ialltoallv of this rank's points to their owners: (P-1)/P of its bytes leave;
    modelled as one message of that size to the next rank (its links and bandwidth) and
    the P-2 further latencies, polled by the Waiter."""
    P = world.P
    if P == 1:
        return
    started = world.now()
    out = world.send(rank, (rank + 1) % P, f"a2a{(rank + 1) % P}", rank, nbytes * (P - 1) / P)
    world.recv(f"a2a{rank}")
    out.wait()
    world.notice(rank, started, max(P - 2, 0) * world._latency(rank))


def init(world: World, rank: int) -> None:
    """Everything before the training loop; init_end is where asgd.train.init's ends."""
    world.receive_on(f"token{rank}", f"a2a{rank}", f"w{rank}", f"ar{rank}", f"r{rank}")
    if world.spec.arch == "ps" and rank < world.S:
        world.receive_on(f"s{rank}")
    if rank == 0:
        world.receive_on("shards")
    startup(world, rank)
    read_data(world, rank)
    world.barrier(rank, "agree")  # asgd.train.init's last agreement (asgd.mpiutil.agree)
    world.init_end[rank] = world.now()


def finish(world: World, rank: int, record: dict) -> None:
    """Idle until all are done; rank 0 then takes the clock offsets and gathers."""
    clock = world.clocks[rank]
    world.end[rank] = clock.switch("idle")
    world.barrier(rank, "end")
    if rank == 0 and world.P > 1:
        world.sg.this_actor.sleep_for(CLOCK_PINGS * (world.P - 1) * 2 * world._latency(rank))
    phases = clock.seconds()
    if record.get("role") == "peer":   # what its owner served, as the rank's aggregate time
        served = world.owner_clocks[rank].seconds()
        phases["aggregate"] = phases.get("aggregate", 0.0) + served.get("aggregate", 0.0)
    record.update(rank=rank, phases=phases)
    world.records[rank] = record
    if rank == 0:
        world.wall = world.now()


# -- the parameter-server protocol (ps servers, and p2p's owners) ---------------------------

def _my_shards(world: World, rank: int) -> list[int]:
    """The shards a worker rank pushes to: those of its slice (asgd.core.topology.Topology.link)."""
    topo = world.topo
    a, b = topo.slices[topo.member(rank)]
    return [v for v, (lo, hi) in enumerate(topo.shards) if a <= lo and hi <= b]


def _replica_sum(world: World, rank: int, m: int) -> None:
    """protocol.replica.Replica.sum: members 1..K-1 send their partial logits to member 0,
    which adds them and sends the sum back; every wait polled."""
    topo, clock, c = world.topo, world.clocks[rank], world.costs
    members = topo.replica_ranks(rank)
    first = members[0]
    nbytes = c.replica_bytes(max(m, 1))
    clock.switch("replica_sum")
    t = world.now()
    if rank == first:
        for _ in members[1:]:
            world.recv(f"r{first}")
        world.notice(rank, t)
        for q in members[1:]:
            world.post(first, q, f"r{q}", rank, nbytes)
    else:
        world.post(rank, first, f"r{first}", rank, nbytes)
        world.recv(f"r{rank}")
        world.notice(rank, t)
    world.crowd_turns(rank, "replica")
    clock.switch("compute")


def _compute(world: World, rank: int, m: int, factor: float) -> None:
    """One training step of m points: a model-parallel member's forward half, the replica's
    logit sum, its backward half; or the whole step."""
    c = world.costs
    t = world.step_work(rank, c.step(m) * factor)
    if c.K > 1 and m:   # an empty batch: no step, so no sum (asgd.core.worker.zero_delta)
        world.execute(t / 2)
        _replica_sum(world, rank, m)
        world.execute(t / 2)
    else:
        world.execute(t)


def _charged(world: World, rank: int, slow: float = 1.0):
    """core.worker's compute here: a step of m points charged at its drawn spread (times
    `slow`: a straggler's); an empty batch charges only the zeroing of Delta-w."""
    rng = world.rngs[rank]

    def compute(batch, dw) -> float:
        _compute(world, rank, len(batch), world.costs.spread_draw(rng) * slow)
        return 0.0

    def empty(dw) -> float:
        _compute(world, rank, 0, slow)
        return 0.0
    return compute, empty


def _schedule(world: World, rank: int) -> tuple[Schedule, int]:
    """My schedule, as asgd.run.roles.schedule_of makes it (the batches' sizes only), and
    my share's points (my replica's)."""
    run, replica = world.run, world.topo.replica(rank)
    plan = schedule(world.spec.arch, run.mode, run.overlap, run.batch, run.epochs, run.points, run.replicas,
                    (world.spec.seed, replica), 0.0, shuffle=False)
    return plan, worker_points(run.points, run.replicas, replica)


def worker(world: World, rank: int) -> None:
    """asgd.protocol.worker.run_worker (a ps worker, or a p2p peer's worker side): the
    worker's loop (asgd.core.worker.loop) over mailboxes (links.MailboxLink)."""
    spec, topo, clock = world.spec, world.topo, world.clocks[rank]
    init(world, rank)
    owner = None
    if spec.arch == "p2p":   # the peer's owner serves its shard on the same rank (protocol.p2p)
        owner = world.sg.Actor.create(f"owner{rank}", world.hosts[world.node[rank]], server, world, rank, True)
    slow = spec.straggler if topo.worker_index(rank) == world.run.workers - 1 else 1.0
    compute, empty = _charged(world, rank, slow)
    meet = (lambda epoch: world.worker_barrier(rank, epoch)) if spec.epoch_barrier else None   # CNTK's
    plan, points = _schedule(world, rank)
    st = loop(MailboxLink(world, rank, _my_shards(world, rank)), compute, clock, plan, points, now=world.now,
              empty=empty, epoch_end=meet)
    record = st.record()
    if owner is not None:   # the peer serves until every peer is done, then reports both sides
        clock.switch("idle")
        owner.join()
        served = world.served[rank]
        record = {**served, "role": "peer", "updates": st.updates, "rounds": served["rounds"],
                  "bytes_sent": st.bytes_sent + served["bytes_sent"],
                  "bytes_recv": st.bytes_recv + served["bytes_recv"]}
    finish(world, rank, record)


class ShardCosts:
    """A simulated shard's effects (asgd.core.shard's transport): an apply charges the
    calibrated cost of an update (a sync round's: one per pusher), a reply goes to the
    worker's mailbox with the reply's bytes; nothing is ever refused, nor saved
    (checkpoints are not simulated)."""

    def __init__(self, world: World, rank: int, v: int, clock: SimClock):
        c, (lo, hi) = world.costs, world.topo.shards[v]
        self.world, self.rank, self.v, self.clock, self.shard = world, rank, v, clock, None
        # a p2p owner serves inside its peer's loop, never woken: each push its bytes
        self.c_u = c.owner_push(hi - lo) if world.spec.arch == "p2p" else c.server_update(world.node[rank], hi - lo)
        self.extra = c.optimizer_extra(hi - lo)
        self.push_bytes, self.pull_bytes = c.push_bytes(v), c.pull_bytes(v)
        self.sends: list = []

    def received(self, q: int, step: int) -> None:
        """Worker rank q's push of `step` has arrived: traced and counted."""
        self.clock.step = step
        self.clock.message(RECV, q, self.push_bytes, flow_id(q, self.rank, step, False))
        self.shard.st.bytes_recv += self.push_bytes if q != self.rank else 0

    def reply(self, j: int, head: list) -> None:
        q = self.shard.ranks[j]
        self.sends.append(self.world.send(self.rank, q, f"w{q}", (self.v, int(head[R_VERSION])), self.pull_bytes))
        self.clock.message(SEND, q, self.pull_bytes, flow_id(q, self.rank, int(self.shard.pushed_step[j]), True))
        self.shard.st.bytes_sent += self.pull_bytes if q != self.rank else 0

    def apply(self, j: int, share: float) -> bool:
        self.world.execute(self.c_u + self.extra, self.rank)
        return True

    def apply_mean(self, weights: list, share: float) -> bool:
        self.world.execute(len(weights) * self.c_u + self.extra, self.rank)
        return True

    def finite(self, j: int) -> bool:
        return True

    def release(self, j: int) -> None:
        pass

    def save(self, rounds: int, cut: int) -> None:
        pass


def _shards_of(world: World, rank: int, clock: SimClock) -> dict[int, Shard]:
    """This rank's shards, each the core's bookkeeping over ShardCosts; shard 0's, on rank
    0, reports the progress (evaluating when rank 0 holds all of w: one server,
    model-partitioned or not, or a p2p peer's own)."""
    topo, run = world.topo, world.run
    tracks = rank == 0 and 0 in topo.shards_of(rank)
    whole = topo.owners == 1 if world.spec.arch == "ps" else topo.K == 1
    evaluate = (lambda: _evaluate(world, clock)) if tracks and whole else None
    if tracks:
        world.serve_start = world.now()
    shards = {}
    for v in topo.shards_of(rank):
        fx = ShardCosts(world, rank, v, clock)
        progress = (lambda rounds, loss_sum, m: world.track(m, evaluate)) if tracks and v == 0 else None
        fx.shard = shards[v] = Shard(topo.pushers(v), fx, policy(run.mode, world.spec.staleness), on_version=progress)
    return shards


def _served(world: World, rank: int, shards: dict[int, Shard]) -> dict:
    """Serving is over: every reply delivered, the shards sent to rank 0
    (asgd.protocol.server.gather_shards); this rank's record, merged as a real server's."""
    topo, mine = world.topo, list(shards)
    for s in shards.values():
        for r in s.fx.sends:
            r.wait()
    lo, hi = topo.shards[mine[0]][0], topo.shards[mine[-1]][1]
    if rank != 0 and topo.owners > 1:
        world.send(rank, 0, "shards", rank, world.costs.itemsize * (hi - lo)).wait()
    elif rank == 0:
        for _ in range(len({h for h in topo.hosts if h != 0})):
            world.recv("shards")
    return merge_shards([s.st.record(topo.shards[v], s.ranks) for v, s in shards.items()])


def server(world: World, rank: int, peer: bool = False) -> None:
    """asgd.protocol.server's Server for each shard this rank holds (serve_all), driving the
    same core bookkeeping: a ps server, or (peer) a p2p rank's owner beside its worker."""
    clock = world.owner_clocks[rank] if peer else world.clocks[rank]
    if peer:
        world.receive_on(f"s{rank}")
    else:
        init(world, rank)
    shards = _shards_of(world, rank, clock)
    while any(s.live for s in shards.values()):
        t = clock.switch("idle")
        msg = world.recv(f"s{rank}")
        world.notice(rank, t)
        clock.switch("aggregate")
        if msg[0] == "done":   # to each of this rank's shards the worker pushed to
            for s in shards.values():
                if msg[1] in s.ranks:
                    s.done(s.ranks.index(msg[1]))
        else:
            _, v, q, version, m, step = msg
            s = shards[v]
            s.fx.received(q, step)
            s.pushed(s.ranks.index(q), version, step, 0, 0.0, m)
    clock.switch("idle")
    record = _served(world, rank, shards)
    if peer:
        world.served[rank] = record
        return
    finish(world, rank, record)


def _evaluate(world: World, clock: SimClock) -> None:
    prev = clock.phase
    clock.switch("evaluate")
    world.execute(world.costs.evaluate())
    clock.switch(prev)


# -- allreduce -------------------------------------------------------------------------------

def allreduce_rank(world: World, rank: int) -> None:
    """asgd.protocol.allreduce.run_allreduce: every rank a worker (asgd.core.worker's
    allreduce_loop); each step one allreduce of [m * Delta-w | m, loss, stop] (of its
    slice, among the ranks holding it: one per replica) by asgd's ring or
    MPI_Iallreduce (links.RingSum), then the averaged update."""
    init(world, rank)
    if rank == 0:
        world.serve_start = world.now()
    clock = world.clocks[rank]
    plan, points = _schedule(world, rank)
    evaluate = (lambda: _evaluate(world, clock)) if world.topo.K == 1 else None
    compute, empty = _charged(world, rank)
    st = allreduce_loop(RingSum(world, rank, plan.steps_per_epoch, evaluate), compute, clock, plan, points,
                        empty=empty)
    finish(world, rank, st.record())
