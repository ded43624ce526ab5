"""The job's shape, from its options, its size and the model: who serves, who works, and
how w is cut among them. Every rank computes the same Topology, so none needs to ask.

    --arch ps         ranks 0..S-1 are servers, the rest workers
    --arch p2p        every rank is a worker and the owner (server) of one shard
    --arch allreduce  every rank is a worker; no shards: every rank holds all it trains
    --model-parallel K  workers come in replicas of K consecutive ranks: member k of
        replica r is worker r K + k and holds slice k of w (net.mlp.Sliced: a part of the
        hidden layer). w is then in sliced order; its shards (wire.slice_shards) never
        cross a slice, so a member talks only to its slice's servers, and with fewer
        servers than slices a server holds several shards (wire.slice_hosts).

A shard is the unit a Server object serves, a checkpoint file holds, and the final
gather moves; `shards` lists them in order, with their host ranks in `hosts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .wire import shard_bounds, slice_hosts, slice_shards


@dataclass(frozen=True)
class Topology:
    arch: str                        # ps | p2p | allreduce
    size: int                        # ranks
    servers: int                     # dedicated server ranks (ps: --servers; otherwise 0)
    slices: tuple                    # ((start, stop) of each model-parallel slice of w, in order)

    @property
    def K(self) -> int:
        return len(self.slices)

    @property
    def n_w(self) -> int:
        return self.slices[-1][1]

    @property
    def workers(self) -> int:
        return self.size - self.servers

    @property
    def replicas(self) -> int:
        return self.workers // self.K

    def role(self, rank: int) -> str:
        if self.arch == "p2p":
            return "peer"
        return "server" if rank < self.servers else "worker"

    @property
    def owners(self) -> int:
        """Ranks that own shards: the servers, every rank in p2p, none in allreduce."""
        return {"ps": self.servers, "p2p": self.size, "allreduce": 0}[self.arch]

    # -- workers ------------------------------------------------------------------------

    def worker_index(self, rank: int) -> int:
        return rank - self.servers

    def replica(self, rank: int) -> int:
        """The replica a worker rank belongs to: its data share and its shuffles (member k
        of replica r trains what worker r would with one slice)."""
        return self.worker_index(rank) // self.K

    def member(self, rank: int) -> int:
        """Which slice of w a worker rank holds."""
        return self.worker_index(rank) % self.K

    def replica_ranks(self, rank: int) -> list[int]:
        first = rank - self.member(rank)
        return list(range(first, first + self.K))

    def slice_group(self, rank: int) -> list[int]:
        """allreduce: the ranks holding the same slice as `rank`, one per replica."""
        return [self.servers + r * self.K + self.member(rank) for r in range(self.replicas)]

    # -- shards -------------------------------------------------------------------------

    @cached_property
    def shards(self) -> list[tuple[int, int]]:
        """Every shard [lo, hi) of w (sliced order), in order; none in allreduce."""
        n = self.owners
        if not n:
            return []
        return slice_shards(list(self.slices), n) if self.K > 1 else shard_bounds(self.n_w, n)

    @cached_property
    def hosts(self) -> list[int]:
        """The rank each shard lives on."""
        return slice_hosts(len(self.shards), self.owners) if self.shards else []

    def slice_of(self, v: int) -> int:
        lo = self.shards[v][0]
        return next(k for k, (a, b) in enumerate(self.slices) if a <= lo < b)

    def shards_of(self, rank: int) -> list[int]:
        """The shards a rank serves."""
        return [v for v, h in enumerate(self.hosts) if h == rank]

    def pushers(self, v: int) -> list[int]:
        """The worker ranks that push to shard v: those holding its slice."""
        k = self.slice_of(v)
        first = 0 if self.arch == "p2p" else self.servers
        return [first + r * self.K + k for r in range(self.replicas)]

    def link(self, rank: int) -> tuple[list[int], list[tuple[int, int]]]:
        """A worker's servers: (their host ranks, the shards in its own slice's coordinates)."""
        a, b = self.slices[self.member(rank)]
        mine = [v for v, (lo, hi) in enumerate(self.shards) if a <= lo and hi <= b]
        return [self.hosts[v] for v in mine], [(self.shards[v][0] - a, self.shards[v][1] - a) for v in mine]
