"""--arch p2p: peer-to-peer servers (Alqahtani and Demirbas's P2P). Every rank is a worker
and the owner of one shard of w, 1/N of it: its optimizer state too. A worker sends each
shard of its Delta-w to that shard's owner and gets the owner's updated shard back, point
to point (one Isend/Irecv pair per owner: the parameter server's exchange, protocol.worker's
PushPull, with N servers that are the workers themselves), so the traffic is P2P's: every
rank talks to every rank, and each link carries 1/N of every update each way. A collective
(a neighbourhood or an all-to-all exchange) would force every rank into the same round,
which async and ssp must not do.

An owner is protocol.server's Server for its shard, run inside the worker's loop: it
serves the pushes that have arrived between the blocks of its own training step (the
step's progress hook) and while its own exchange is in flight (the link's wait), never
blocking, so no rank waits on an owner that is computing for long, and no two ranks can
wait on each other. Every reply policy works as with parameter servers: sync aggregates
all N workers' pushes before answering, ssp keeps its bound. After its last step a rank
goes on serving until every rank is done.
"""

from __future__ import annotations

import numpy as np

from ..core.policy import Policy
from ..core.schedule import Schedule
from ..core.stats import ServerStats
from ..core.worker import WorkerStats
from .server import Server
from .worker import PushPull, run_worker


def run_peer(link: PushPull, owner: Server, policy: Policy, X: np.ndarray, y: np.ndarray, step,
             plan: Schedule) -> tuple[WorkerStats, ServerStats]:
    """Train my share through `link` (whose background duty must be `owner.poll(policy)`:
    see peer_link), then serve my shard until every worker is done."""
    worked = run_worker(link, X, y, step, plan)
    return worked, owner.serve(policy)


def peer_link(ep, shards, messages, owner: Server, policy: Policy, owners: list[int] | None = None) -> PushPull:
    """A worker's link to the owners of `shards` (ranks `owners`, default 0..N-1) whose
    background duty is serving my own shard."""
    return PushPull(ep, shards, messages, background=lambda: owner.poll(policy), servers=owners)
