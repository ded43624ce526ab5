"""The parameter server over MPI: the transport that drives a shard's protocol
(asgd.core.shard.Shard, with a reply policy of asgd.core.policy, which hold every rule:
when to apply, when to answer, when to hold, staleness, checkpoint cuts, lost workers,
the divergence guard). Here is only the I/O those rules ask for.

One persistent receive stays posted per worker, plus one for its end-of-work message;
the loop waits on all of them through the Waiter (no spinning), hands each completed one
to the shard, and ends when every worker has retired, whatever the policy. A push's
receive is re-armed once the shard releases it (applied and answered), so a held push's
buffer stays untouched. An apply is the shard's optimizer (net.optimizers: sgd adds
Delta-w; momentum, adagrad and adam keep their state per shard) that checks Delta-w for
NaN and inf and writes the next version of the shard into a buffer no reply is
being sent from; a reply is an Isend out of the version it carries, so no reply copies w
and none reads a shard being written (protocol.messages' versions). How the messages sit
in memory (dense, or 1-bit with a copy of the shard per worker) is the message
strategy's (protocol.messages).

Lost workers (fault_tolerant: Open MPI's ULFM): a worker that dies makes a wait on its
requests fail; the server learns who died (mpiutil.failed_ranks), withdraws its requests
and tells the shard, which retires it and goes on with the rest. A dead server ends the job.
"""

from __future__ import annotations

import functools
import time

import numpy as np
from mpi4py import MPI

from ..core.policy import Policy
from ..core.shard import Shard
from ..core.stats import ServerStats
from ..core.wire import (DONE_BYTES, P_CUT, P_LOSS, P_SAMPLES, P_STEP, P_STOP, P_VERSION, RECV, SEND,
                         TAG_DONE, TAG_PULL, TAG_PUSH, TAG_SHARD, flow_id)
from ..net.optimizers import Optimizer
from .context import Endpoint
from .deaths import Deaths
from .messages import DenseShard
from .updates import ShardUpdates

class Server:
    """One shard served over MPI: the effects asgd.core.shard asks of a transport (reply,
    release and save here; apply, apply_mean and finite: ShardUpdates)."""

    def __init__(self, ep: Endpoint, w: np.ndarray, workers, optimizer: Optimizer | None = None,
                 messages=None, on_version=None, checkpoints=None, leader: bool | None = None,
                 fault_tolerant: bool = False, on_lost=None, cuts_done: int = 0, stale_step=None):
        """w: my shard (the caller's, current after publish()); workers: the ranks that push
        to it, or the first of them (an int: it and every one after); checkpoints: due(rounds)
        (asked of the leader, default rank 0's) and save(rounds, cut), or None; fault_tolerant:
        a dead worker is retired, not fatal (ULFM); the rest: asgd.core.shard.Shard's."""
        self.ep, self.comm, self.w, self.waiter, self.clock = ep, ep.comm, w, ep.waiter, ep.clock
        self.traced = getattr(ep.clock, "traces", True)   # whether clock.message records (off: skip its arguments)
        self.ranks = list(range(workers, ep.comm.size)) if isinstance(workers, int) else list(workers)
        W = self.W = len(self.ranks)
        leader = ep.rank == 0 if leader is None else leader
        self.optimizer = optimizer or Optimizer("sgd", 1.0, len(w), dtype=w.dtype)
        self.msgs = messages or DenseShard(w, W)
        self.checkpoints = checkpoints
        self.shard = Shard(self.ranks, self, None, checkpoints.due if leader and checkpoints else None,
                           stale_step, on_version, on_lost, cuts_done)
        self.st = self.shard.st   # its counts, which the transport adds its bytes to
        self.routes = [ep.route(r) for r in self.ranks]   # (communicator, rank) per worker
        self.pushes = [c.Recv_init([self.msgs.recv[j], self.msgs.kind], r, TAG_PUSH)
                       for j, (c, r) in enumerate(self.routes)]
        self._done = [np.empty(1) for _ in range(W)]
        self.dones = [c.Irecv([self._done[j], MPI.DOUBLE], r, TAG_DONE) for j, (c, r) in enumerate(self.routes)]
        self.requests = self.pushes + self.dones
        self.replies = [MPI.REQUEST_NULL] * W
        self.updates = ShardUpdates(self.optimizer, self.msgs, self.replies)   # the apply effects
        self.apply, self.apply_mean, self.finite = self.updates.apply, self.updates.apply_mean, self.updates.finite
        self.deaths = Deaths(ep.comm, self.ranks, fault_tolerant)
        self.dead, self.watch = self.deaths.dead, (self.deaths.watch if fault_tolerant else None)   # else a no-op
        self.wire = [int(r != ep.rank) for r in self.ranks]    # 0: a p2p owner's own worker, no wire between
        self.error = None                      # a reply that failed (a worker that died): raised after the event
        MPI.Prequest.Startall(self.pushes)

    def serve(self, policy: Policy) -> ServerStats:
        """Answer pushes as `policy` says until every worker has sent its end-of-work message."""
        self.shard.policy = policy
        waiting_for = functools.partial(_awaited_push, self)   # made once, said only if the wait ends the job
        while self.shard.live:
            self.clock.switch("idle")
            try:
                i = self.waiter.any(self.requests, waiting_for, self.watch)
                self.clock.switch("aggregate")
                self.event(i)   # its replies may meet a worker that died since
            except MPI.Exception as e:
                self.clock.switch("aggregate")
                self.survive(e)
        while True:
            try:
                return self.finish()
            except MPI.Exception as e:   # a worker died after its last push
                self.survive(e)

    def poll(self, policy: Policy) -> bool:
        """Serve what has arrived, without waiting (a p2p owner, between its own steps); True
        if anything was. The rank's phase and trace step are its own again afterwards."""
        self.shard.policy = policy
        phase, step, did = self.clock.phase, self.clock.step, False
        while self.shard.live:
            i, flag = MPI.Request.Testany(self.requests)
            if not flag or i == MPI.UNDEFINED:
                break
            if not did:
                self.clock.switch("aggregate")
            self.event(i)
            did = True
        if did:
            self.clock.switch(phase)
            self.clock.step = step
        return did

    def event(self, i: int) -> None:
        """Request i has completed: a push (i < W) or worker i - W's end-of-work message."""
        if i >= self.W:
            self.st.bytes_recv += self.wire[i - self.W] * DONE_BYTES
            self.shard.done(i - self.W)
        else:
            head = self.msgs.header(i).tolist()   # Python floats: one call, not one numpy scalar per field
            step = self.clock.step = int(head[P_STEP])   # the trace window counts worker steps
            if self.traced:
                self.clock.message(RECV, self.ranks[i], self.msgs.push_nbytes,
                                   flow_id(self.ranks[i], self.comm.rank, step, False))
            self.st.bytes_recv += self.wire[i] * self.msgs.push_nbytes   # a p2p owner's own: no wire
            self.updates.deltas[i] = self.msgs.delta(i)
            self.shard.pushed(i, head[P_VERSION], step, int(head[P_CUT]), head[P_LOSS], head[P_SAMPLES],
                              bool(head[P_STOP]) or self.ep.stop_requested())
        if self.error is not None:   # every due reply was tried first: the policy hands each out once
            error, self.error = self.error, None
            raise error

    # -- the effects asgd.core.shard asks for ------------------------------------------
    def reply(self, j: int, head: list) -> None:
        """Send worker j the current version of the shard, out of the buffer it lives in."""
        if self.dead[j]:
            return
        try:
            if self.replies[j] and not self.replies[j].Test():  # the previous reply: done long ago in practice
                self.waiter.all([self.replies[j]], f"worker rank {self.ranks[j]} to take its previous reply")
            c, r = self.routes[j]
            self.replies[j] = c.Isend([self.msgs.reply(j, head, self.replies), self.msgs.kind], r, TAG_PULL)
        except MPI.Exception as e:
            self.error = self.error or e
            return
        if self.traced:
            flow = flow_id(self.ranks[j], self.comm.rank, int(self.msgs.header(j)[P_STEP]), True)
            self.clock.message(SEND, self.ranks[j], self.msgs.pull_nbytes, flow)
        self.st.bytes_sent += self.wire[j] * self.msgs.pull_nbytes

    def release(self, j: int) -> None:   # a failure (j died) is kept for after the event, as reply's is
        if not self.dead[j]:
            self.error = _failed(self.pushes[j].Start) or self.error   # always tried

    def save(self, rounds: int, cut: int) -> None:
        self.publish()
        self.checkpoints.save(rounds, cut)

    def publish(self) -> np.ndarray:
        """Bring `w` (the caller's) up to the current version of the shard; returns it."""
        return self.msgs.publish()

    def survive(self, error: MPI.Exception) -> None:
        """An MPI call failed. With fault tolerance: withdraw every worker found dead, tell the
        shard (which answers the living: another may fail). Else, or if none died, it stands."""
        while self.deaths.fault_tolerant and (new := self.deaths.bury()):
            for j in new:   # bury() marked them all dead: no reply goes to any
                self.requests[j] = self.requests[self.W + j] = self.replies[j] = MPI.REQUEST_NULL
                self.shard.lost(j, time.time())
            error, self.error = self.error, None
            if error is None:
                return
        raise error

    def record(self, shard: tuple[int, int]) -> dict:
        """This server's entry of results.json's `ranks`, with its parameter-sized arrays' bytes."""
        rec = self.st.record(shard, self.ranks)
        rec["weight_bytes"] = self.w.nbytes + self.optimizer.nbytes + self.msgs.nbytes
        return rec

    def finish(self) -> ServerStats:
        self.st.stopped = self.shard.stopping or self.ep.stop_requested()
        self.clock.switch("idle")
        self.waiter.all([d for j, d in enumerate(self.dones) if not self.dead[j]],
                        "every worker's end-of-work message", self.watch)
        withdraw([p for j, p in enumerate(self.pushes) if not self.dead[j]])   # a dead one's failed with it
        self.waiter.all(self.replies, "workers to take their last replies", self.watch)
        self.publish()
        return self.st


def _awaited_push(srv: Server) -> str:
    return f"a push from any of the worker ranks {[srv.ranks[j] for j in np.flatnonzero(srv.shard.active)]}"


def _failed(call) -> MPI.Exception | None:
    """call(); the MPI error it raised, or None. A re-armed receive from a worker that has
    just died fails; raised at once, it left the rest of a completed cut's held pushes
    unanswered (their workers then waited forever: one chaos run hung so)."""
    try:
        call()
    except MPI.Exception as e:
        return e
    return None


def withdraw(receives: list) -> None:
    """Cancel and free persistent receives still posted (every worker is done); one a retry
    after a death found freed already is skipped."""
    for p in receives:
        if p != MPI.REQUEST_NULL:
            p.Cancel()
            p.Wait()
            p.Free()


def serve_all(servers: list[Server], policies: list[Policy]) -> list[ServerStats]:
    """Serve several shards on one rank (more model-parallel slices than servers: one
    Server each, their workers apart) until all their workers are done, with one wait
    over all their requests."""
    if len(servers) == 1:
        return [servers[0].serve(policies[0])]
    for srv, rule in zip(servers, policies):
        srv.shard.policy = rule
    first = servers[0]
    where = [(k, i) for k, srv in enumerate(servers) for i in range(len(srv.requests))]
    requests = [r for srv in servers for r in srv.requests]
    while any(srv.shard.live for srv in servers):
        first.clock.switch("idle")
        i = first.waiter.any(requests, "a push to any of this rank's shards")
        first.clock.switch("aggregate")
        k, j = where[i]
        servers[k].event(j)
    return [srv.finish() for srv in servers]


def gather_shards(ep: Endpoint, w: np.ndarray | None, shards: list[tuple[int, int]], hosts: list[int],
                  parts: dict | None = None) -> tuple[int, int]:
    """After training: each shard's host (hosts[v], a rank) sends its part of w, parts[v],
    to rank 0, which receives them into w (all of it, to evaluate and save); rank 0's own
    shards stay. Returns this rank's (sent, received) bytes."""
    comm, me = ep.comm, ep.rank
    if me == 0:
        reqs = [comm.Irecv(w[a:b], h, TAG_SHARD) for (a, b), h in zip(shards, hosts) if h != 0]
        moved = (0, w.itemsize * sum(b - a for (a, b), h in zip(shards, hosts) if h != 0))
    else:
        mine = [np.ascontiguousarray(parts[v]) for v, h in enumerate(hosts) if h == me]
        reqs = [comm.Isend(part, 0, TAG_SHARD) for part in mine]
        moved = (sum(part.nbytes for part in mine), 0)
    ep.waiter.all(reqs, "the final shards")
    return moved
