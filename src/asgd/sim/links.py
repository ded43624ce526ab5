"""The simulator's transports of the worker's loop (asgd.core.worker): what MPI does for a
real worker (asgd.protocol.worker.PushPull, asgd.protocol.allreduce's ring), done with
SimGrid's mailboxes and the calibrated costs (sim.actors.World). The loop itself, its
overlap, schedule and end, is core's: the simulated worker runs the real one's."""

from __future__ import annotations

import numpy as np

from ..core.wire import DOUBLE, RECV, SEND, flow_id, shard_bounds
from ..core.worker import WorkerStats
from ..perf.analytic import async_crowding_kind

NO_BUFFER = np.empty(0)   # a simulated Delta-w: only its size (the costs') matters


class MailboxLink:
    """A worker's link to the servers of `shards` (PushPull's part): a push costs its CPU
    (the push phase's), then posts each shard's Delta-w (c.push_bytes) to the server's
    mailbox, forgotten (the reply implies its arrival); wait() takes the replies from
    this rank's mailbox and wakes at the Waiter's poll after the last. The simulator asks
    no stops: the loop ends with the epochs."""

    told_to_stop = asked_to_stop = False

    def __init__(self, world, rank: int, shards: list[int]):
        c, topo, spec = world.costs, world.topo, world.spec
        self.world, self.rank, self.c, self.clock = world, rank, c, world.clocks[rank]
        self.shards, self.hosts = shards, [topo.hosts[v] for v in shards]
        self.index = {v: i for i, v in enumerate(shards)}
        node, sizes = world.node[rank], [topo.shards[v][1] - topo.shards[v][0] for v in shards]
        self.cpu = sum(c.worker_message(node, k) for k in sizes)
        if spec.arch == "p2p":   # one wait for all the owners' replies; its owners, never woken,
            # charge their pushes' bytes themselves (ShardCosts)
            self.cpu = c.worker_message(node, sizes[0])
        self.versions = [0] * len(shards)   # each shard's version of my w (the last reply's)
        self.stamp = list(self.versions)    # the versions the Delta-w being computed comes from
        self.step = 0
        self.stats = WorkerStats()
        sync = world.run.mode == "sync"
        # the crowding calibrate measured for each exchange (Costs.crowd): a lockstep
        # round's once its replies are in; an asynchronous push's after it, the probe's
        # whose waits it shares (analytic.async_crowding_kind; a replica's member: in
        # its sum's)
        self.round_crowd = spec.arch if sync else None
        self.push_crowd = None if sync or c.K > 1 else async_crowding_kind(spec.arch, c.K)

    def delta(self) -> np.ndarray:
        self.stamp = list(self.versions)
        return NO_BUFFER

    def push_pull(self, dw, loss_sum: float, samples: int, stop: bool = False) -> int:
        world, rank, c, st = self.world, self.rank, self.c, self.stats
        world.execute(self.cpu, rank)
        for v, h, version in zip(self.shards, self.hosts, self.stamp):
            nb = c.push_bytes(v)
            world.post(rank, h, f"s{h}", ("push", v, rank, version, samples, self.step), nb)
            self.clock.message(SEND, h, nb, flow_id(rank, h, self.step, False))
            if h != rank:   # a p2p rank's own shard needs no wire
                st.bytes_sent += nb
                st.bytes_recv += c.pull_bytes(v)
        st.updates += 1
        st.samples += samples
        self.step += 1
        if self.push_crowd:
            world.crowd_turns(rank, self.push_crowd)
        return self.step - 1

    def wait(self, ticket: int) -> None:
        world, rank = self.world, self.rank
        started = world.now()
        for _ in self.shards:
            v, version = world.recv(f"w{rank}")
            self.versions[self.index[v]] = version
        world.notice(rank, started)
        for v, h in zip(self.shards, self.hosts):
            self.clock.message(RECV, h, self.c.pull_bytes(v), flow_id(rank, h, ticket, True))
        if self.round_crowd:
            world.crowd_turns(rank, self.round_crowd)
        if rank == 0:
            world.exchanged()

    def close(self) -> WorkerStats:
        """`done` to each of my servers, waited for until delivered."""
        done = [self.world.send(self.rank, h, f"s{h}", ("done", self.rank), DOUBLE) for h in sorted(set(self.hosts))]
        for d in done:
            d.wait()
        return self.stats


class RingSum:
    """An allreduce rank's sum and update (protocol.allreduce.Summed's part), among the
    ranks holding its slice: asgd's ring (Ring.sum's 2 (P - 1) chunk swaps with its
    neighbours, each waking at the Waiter's poll, the reduce-scatter's adds charged), or
    MPI_Iallreduce (its calibrated round once every rank is in it); then the update.
    Rank 0 tracks the epochs, `evaluate` after each."""

    told_to_stop = asked_to_stop = False

    def __init__(self, world, rank: int, steps: int, evaluate=None):
        topo = world.topo
        self.world, self.rank, self.c, self.evaluate = world, rank, world.costs, evaluate
        self.group = group = topo.slice_group(rank)
        self.P, self.pos = len(group), group.index(rank)
        a, b = topo.slices[topo.member(rank)]
        self.values = b - a + 3   # [m * Delta-w | m, loss, stop]
        self.chunk = [hi - lo for lo, hi in shard_bounds(self.values, self.P)]
        self.right = group[(self.pos + 1) % self.P]
        self.mpi = world.run.allreduce == "mpi"
        self.totals = world.step_samples(steps)   # the samples every replica's step k sums
        self.stats = WorkerStats()

    def delta(self) -> np.ndarray:
        return NO_BUFFER

    def sum(self, dw, loss_sum: float, m: int, stop: bool) -> None:
        world, rank, c, P, st = self.world, self.rank, self.c, self.P, self.stats
        started = world.now()
        if self.mpi and P > 1:   # the library's algorithm: its calibrated round, once every rank is in it
            key = ("mpi", world.topo.member(rank), st.updates)
            bar = world.barriers.get(key) or world.barriers.setdefault(key, world.sg.Barrier(P))
            bar.wait()
            world.sg.this_actor.sleep_for(c.mpi_allreduce(P, self.values))
            world.notice(rank, started)
            least = int(c.itemsize * 2 * (P - 1) * self.values / P)
            st.bytes_sent += least
            st.bytes_recv += least
        for rnd in (range(2 * (P - 1)) if not self.mpi else ()):   # Ring.sum's chunks: sent, then received
            j, pos = rnd % (P - 1), self.pos
            out_c, in_c = ((pos - j) % P, (pos - j - 1) % P) if rnd < P - 1 else ((pos + 1 - j) % P, (pos - j) % P)
            swap = world.now()   # Ring._swap: each swap a wait of its own, its backoff from the first sleep
            out = world.send(rank, self.right, f"ar{self.right}", rnd, c.itemsize * self.chunk[out_c])
            world.recv(f"ar{rank}")
            out.wait()
            world.notice(rank, swap)  # the schedule moves on only when the rank polls
            st.bytes_sent += c.itemsize * self.chunk[out_c]
            st.bytes_recv += c.itemsize * self.chunk[in_c]
            if rnd < P - 1:   # then the received chunk is added in
                world.execute(c.allreduce_add(self.chunk[in_c]))
        if P > 1:
            world.crowd_turns(rank, world.run.allreduce)

    def apply(self, m: int) -> bool:
        """The optimizer's update of my slice (a simulated sum is always finite)."""
        st = self.stats
        self.world.execute(self.c.apply_update())
        if self.rank == 0:
            self.world.track(self.totals[st.updates % len(self.totals)], self.evaluate)
        st.updates += 1
        st.samples += m
        return True
