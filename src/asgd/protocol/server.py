"""The parameter server: one request handler, and a reply policy that says when to answer.

Every push goes through `Server.handle` (account for it, hand it to the policy, which
applies or holds it; a non-finite one is refused where it is applied); every end-of-work
message retires its worker; the loop ends when every worker has retired, whatever the
policy, so no server waits for pushes that will never come (a stop that reached the
workers through another server's reply included).
The policy decides what is applied and who is answered:
  Async  answer each push at once with the current shard, then apply its Delta-w (the
         paper's ASGD; the reply goes out before the update, so the server's work is
         off the worker's round trip, and a worker sees its own Delta-w one exchange
         later: one more version of staleness).
  SSP    apply each Delta-w, then answer, but hold a worker's answer while its next push
         would put it more than K steps ahead of the slowest active worker
         (stale-synchronous parallel; applied first, so a worker reads its own writes).
  Sync   hold the pushes until every active worker has pushed, apply their
         sample-weighted mean once, in worker order (deterministic), answer everyone.
"Apply" is the shard's optimizer (net.optimizers: sgd adds Delta-w; momentum, adagrad and
adam move the shard along the pushed negative gradient, keeping their state per shard).
One persistent receive stays posted per worker; it is re-armed once that worker's push
is applied and answered, so a held push's buffer stays untouched. An update is one pass
(net.optimizers) that checks Delta-w for NaN and inf and writes the next version of the
shard into a buffer no reply is being sent from; a reply goes out of the version it
carries, so no reply copies w and none reads a shard being written (protocol.messages'
versions). How the messages sit in memory (float64, or 1-bit with a copy of the shard
per worker) is the message strategy's (protocol.messages).

Checkpoints are consistent cuts (Chandy and Lamport's idea, carried by the workers):
server 0 starts cut c when --checkpoint-every says so and stamps c on its replies; a
worker stamps each push with the last cut it heard of, and sends the same push to every
server, so every server splits the pushes alike: those stamped below c are in the cut,
the rest are not. A server applies the ones in the cut and holds (received and counted,
not applied nor answered) each worker's first one past it, until every active worker's
has come (a retired worker's pushes all precede the cut); then it saves its shard as
cut c and goes on with the held pushes. Every shard's file of cut c is then the same
pushes applied: one model. A worker is held at most for one push; ssp's bound counts a
held push as taken, so it never waits on a cut.

Lost workers (fault_tolerant: Open MPI's ULFM): a worker that dies makes a wait on its
requests fail; the server learns who died (mpiutil.failed_ranks), records it (rank, time,
the pushes it made), retires it as if it had said it was done, and goes on with the rest:
ssp's bound is over the live workers, a sync round waits for the live ones, a cut counts
it as past. What it did not push is lost to training. A dead server ends the job.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..mpiutil import failed_ranks, failed_ranks_soon
from ..net import kernels
from ..net.optimizers import Optimizer
from ..core.wire import (DONE_BYTES, DOUBLE, P_CUT, P_LOSS, P_SAMPLES, P_STEP, P_STOP, P_VERSION, PULL_HEADER, R_CUT,
                    R_STOP, R_VERSION, RECV, SEND, STOP_ASKED, STOP_DONE, TAG_DONE, TAG_PULL, TAG_PUSH, TAG_SHARD,
                    flow_id)
from .context import Endpoint
from .messages import Float64Shard

DIVERGED_AFTER = 10  # refused Delta-w in a row that end the job
WATCH_S = 0.25       # a fault-tolerant server looks at the failed group this often while it waits (watch)


class DivergenceError(RuntimeError):
    """Training produced NaN or inf again and again: the learning rate is too high."""


@dataclass
class ServerStats:
    updates: int = 0   # Delta-w received (requests), applied or refused
    rounds: int = 0    # versions of the shard (= updates in async and ssp; one per round in sync)
    bytes_sent: int = 0
    bytes_recv: int = 0
    staleness: list = field(default_factory=list)  # per worker: its Delta-w's staleness when applied
    step_gap: list = field(default_factory=list)   # per worker: steps ahead of the slowest
    refused: int = 0   # Delta-w with NaN or inf, not applied
    stopped: bool = False  # a stop request ended the run early
    cuts: int = 0      # checkpoint cuts completed
    dropped: int = 0   # sync with backup workers: pushes that came after their round was applied
    lost: list = field(default_factory=list)   # workers found dead: {rank, time, updates}

    def record(self, shard: tuple[int, int], ranks: list[int]) -> dict:
        """This server's entry of results.json's `ranks` (the run adds the rest); its
        workers' staleness and step-gap histograms by their rank."""
        return {"role": "server", "stopped": self.stopped, "refused": self.refused,
                "updates": self.updates, "rounds": self.rounds, "bytes_sent": self.bytes_sent,
                "bytes_recv": self.bytes_recv, "shard": list(shard), "requests": self.updates, "cuts": self.cuts,
                "dropped": self.dropped, "lost": self.lost,
                "staleness_hist": {r: np.bincount(v).tolist() for r, v in zip(ranks, self.staleness)},
                "step_gap_hist": {r: np.bincount(v).tolist() for r, v in zip(ranks, self.step_gap)}}


class Server:
    def __init__(self, ep: Endpoint, w: np.ndarray, workers, optimizer: Optimizer | None = None,
                 messages=None, on_version=None, checkpoints=None, leader: bool | None = None,
                 fault_tolerant: bool = False, on_lost=None, cuts_done: int = 0, stale_step=None):
        """w: my shard (the caller's array, current after publish() and after serving;
        meanwhile the shard lives in the message strategy's versions); workers: the
        ranks that push to it (a list), or the first of them (an int: that rank and
        every one after it); optimizer: what an
        update does to w, with its state for my shard (default: sgd, w += Delta-w);
        messages: my side's message strategy (default: float64, protocol.messages);
        on_version(rounds, loss_sum, samples): after each new version of the shard
        (progress); checkpoints: due(rounds) (asked of the leader, which starts the cuts:
        default the server on rank 0) and save(rounds, cut)
        (asgd.run.checkpoint.Checkpointing), or None. fault_tolerant: a dead worker is
        retired, not fatal (ULFM); on_lost(rank, samples it pushed) then tells the
        progress. cuts_done: the cut the run resumed from (cut numbers go on from it, so the
        newest is always this run's). stale_step(staleness) -> the share of the learning
        rate a push of that staleness moves w by (None: all of it; net.optimizers.stale_step)."""
        comm = ep.comm
        self.ep, self.comm, self.w, self.waiter, self.clock = ep, comm, w, ep.waiter, ep.clock
        self.traced = getattr(ep.clock, "traces", True)   # whether clock.message records (off: skip its arguments)
        self.ranks = list(range(workers, comm.size)) if isinstance(workers, int) else list(workers)
        self.W = len(self.ranks)
        self.leader = comm.rank == 0 if leader is None else leader
        self.optimizer = optimizer or Optimizer("sgd", 1.0, len(w))
        self.msgs = messages or Float64Shard(w, self.W)
        self.on_version = on_version or (lambda rounds, loss_sum, samples: None)
        self.stopping = False  # a stop request: replies tell the workers to stop
        self.finished = False  # the run's epochs are trained (sync with backup workers): so do replies
        self.goal = None       # goal(): whether they are (the server that keeps the progress)
        self.routes = [ep.route(r) for r in self.ranks]   # (communicator, rank) per worker
        self.pushes = [c.Recv_init([self.msgs.recv[j], self.msgs.kind], r, TAG_PUSH)
                       for j, (c, r) in enumerate(self.routes)]
        self._done = [np.empty(1) for _ in range(self.W)]
        self.dones = [c.Irecv([self._done[j], MPI.DOUBLE], r, TAG_DONE) for j, (c, r) in enumerate(self.routes)]
        self.requests = self.pushes + self.dones
        self.replies = [MPI.REQUEST_NULL] * self.W
        self.answered = np.zeros(self.W, bool)   # answered before its push was applied (Async)
        self.active = np.ones(self.W, bool)
        self.live = self.W                       # active workers (the loop's test, without numpy)
        self.steps = np.zeros(self.W, np.int64)  # pushes taken per worker
        self.samples = np.zeros(self.W)          # samples their pushes brought
        self.pushed_step = np.zeros(self.W, np.int64)   # each worker's last push's step
        self.fault_tolerant, self.on_lost = fault_tolerant, on_lost
        self.dead = np.zeros(self.W, bool)
        self.index = {r: j for j, r in enumerate(self.ranks)}   # worker rank -> j
        self.wire = [int(r != comm.rank) for r in self.ranks]    # 0: a p2p owner's own worker, no wire between
        self.watched = time.monotonic()        # watch()'s last look at the failed group
        self.st = ServerStats(staleness=[[] for _ in range(self.W)], step_gap=[[] for _ in range(self.W)],
                              cuts=cuts_done)
        self.refused_in_a_row = 0
        self.stale_step = stale_step
        self.lr_scale = np.ones(self.W)      # each worker's last push: the share of lr its staleness earns
        self.step_share = 1.0                # the share of lr every update takes (lowered by halve_step)
        self.checkpoints = checkpoints
        self.collecting = 0                  # the cut being collected (0: none)
        self.past = np.zeros(self.W, bool)   # whose push past it has come
        self.held: list[tuple] = []          # (j, dw, loss_sum, m) past it, not yet taken
        MPI.Prequest.Startall(self.pushes)

    # -- the loop --------------------------------------------------------------------

    def serve(self, policy: Policy) -> ServerStats:
        """Answer pushes as `policy` says until every worker has sent its end-of-work message."""
        while self.live:
            self.clock.switch("idle")
            try:
                i = self.waiter.any(self.requests, lambda: "a push from any of the worker ranks "
                                    f"{[self.ranks[j] for j in np.flatnonzero(self.active)]}", self.watch)
                self.clock.switch("aggregate")
                self.event(i, policy)   # its replies may meet a worker that died since
            except MPI.Exception as e:
                self.clock.switch("aggregate")
                self.survive(e, policy)
        while True:
            try:
                return self.finish()
            except MPI.Exception as e:   # a worker died after its last push
                self.survive(e, policy)

    def watch(self) -> bool:
        """While waiting, with fault tolerance, every WATCH_S: a worker in the failed group
        that this server still counts as active raises (serve's survive() buries it). A
        death is otherwise seen only when a request with the dead fails, and with several
        killed at once one failure can come before the others' news: a dead worker left
        active holds every checkpoint cut (and sync's rounds) forever."""
        if not self.fault_tolerant or time.monotonic() < self.watched + WATCH_S:
            return False
        self.watched = time.monotonic()
        if self.newly_dead(failed_ranks(self.comm)):
            raise MPI.Exception(MPI.ERR_PROC_FAILED)
        return False

    def retire(self, j: int) -> None:
        """Worker j pushes no more (it said it was done, or it died)."""
        if self.active[j]:
            self.active[j] = False
            self.live -= 1

    def newly_dead(self, dead: list[int]) -> list[int]:
        """The ranks of `dead` not yet retired here (any rank not my worker counts)."""
        return [r for r in dead if r not in self.index or not self.dead[self.index[r]]]

    def survive(self, error: MPI.Exception, policy: Policy) -> None:
        """An MPI call failed. With fault tolerance: retire every worker found dead, then
        answer the living (which may meet another dead worker: again). Without it, or
        when no worker newly died, the error stands."""
        while self.fault_tolerant and self.bury():
            try:
                self.maybe_cut(policy)
                self.answer_all(policy)
                return
            except MPI.Exception as e:
                error = e
        raise error

    def bury(self) -> int:
        """Retire every worker found dead (a dead server: the job ends); how many newly.
        With five workers killed at once a failure came before its news: wait for it."""
        dead = failed_ranks_soon(self.comm, self.newly_dead)
        others = [r for r in dead if r not in self.index]
        if others:
            raise RuntimeError(f"rank(s) {others} died, and they were not this server's workers: a server's "
                               "shard cannot be rebuilt; restart from the checkpoint (python -m asgd.launch "
                               "--max-restarts, or --resume)")
        new = [self.index[r] for r in self.newly_dead(dead)]
        for j in new:
            self.dead[j] = True
            self.retire(j)
            self.st.lost.append({"rank": self.ranks[j], "time": time.time(), "updates": int(self.steps[j])})
            self.requests[j] = self.requests[self.W + j] = self.replies[j] = MPI.REQUEST_NULL
            if self.on_lost:
                self.on_lost(self.ranks[j], float(self.samples[j]))
        return len(new)

    def poll(self, policy: Policy) -> bool:
        """Serve what has arrived, without waiting (a p2p owner, between its own steps'
        blocks and while it waits); True if anything was. The rank's phase and trace step
        are its own again afterwards."""
        did = False
        while self.live:
            i, flag = MPI.Request.Testany(self.requests)
            if not flag or i == MPI.UNDEFINED:
                break
            if not did:
                phase, step = self.clock.phase, self.clock.step
                self.clock.switch("aggregate")
            self.event(i, policy)
            did = True
        if did:
            self.clock.switch(phase)
            self.clock.step = step
        return did

    def event(self, i: int, policy: Policy) -> None:
        """Request i has completed: a push (i < W) or worker i - W's end-of-work message."""
        if i >= self.W:  # a done arrives only after its sender took the reply to its last push
            self.retire(i - self.W)
            self.st.bytes_recv += self.wire[i - self.W] * DONE_BYTES
            self.maybe_cut(policy)
        else:
            self.handle(i, policy)
        self.answer_all(policy)

    def answer_all(self, policy: Policy) -> None:
        """Reply to every worker the policy says is due, each even when another's reply
        fails (a worker that died): the policy hands each out once, so one left out would
        wait forever. The first failure is raised after."""
        error = None
        for j in policy.answerable(self):
            try:
                self.reply(j)
            except MPI.Exception as e:
                error = error or e
        if error is not None:
            raise error

    def handle(self, j: int, policy: Policy) -> None:
        """Worker j's push has arrived: account for it, then the policy applies or holds it."""
        head = self.msgs.header(j).tolist()   # Python floats: one call, not one numpy scalar per field
        version, loss_sum, m, step = head[P_VERSION], head[P_LOSS], head[P_SAMPLES], int(head[P_STEP])
        self.stopping |= bool(head[P_STOP]) or self.ep.stop_requested()
        nbytes = self.msgs.push_nbytes
        self.clock.step = step  # the trace window counts worker steps
        if self.traced:
            self.clock.message(RECV, self.ranks[j], nbytes, flow_id(self.ranks[j], self.comm.rank, step, False))
        staleness = self.st.rounds - int(version)
        self.st.staleness[j].append(staleness)
        if self.stale_step is not None:   # a held push keeps it: its worker pushes no more until answered
            self.lr_scale[j] = self.stale_step(staleness)
        self.st.updates += 1
        self.st.bytes_recv += self.wire[j] * nbytes   # a p2p owner's own: no wire
        self.steps[j] += 1
        self.samples[j] += m
        self.pushed_step[j] = step
        self.route(policy, j, int(head[P_CUT]), self.msgs.delta(j), loss_sum, m)

    # -- consistent checkpoint cuts (module docstring) --------------------------------

    def route(self, policy: Policy, j: int, cut: int, dw, loss_sum: float, m: float) -> None:
        """Worker j's accounted push, stamped `cut`: to the policy, or held past a cut."""
        if not self.collecting and cut > self.st.cuts:   # a cut server 0 started: collect it too
            self.start_cut()
        if self.collecting and cut >= self.collecting:
            self.past[j] = True
            self.held.append((j, cut, dw, loss_sum, m))
            self.maybe_cut(policy)
        else:
            policy.take(self, j, dw, loss_sum, m)

    def start_cut(self) -> None:
        self.collecting = self.st.cuts + 1
        self.past[:] = False

    def maybe_cut(self, policy: Policy) -> None:
        """Every active worker's push past the cut has come (or, sync with backup workers,
        a round's worth: the round before is complete on every server, and what a
        straggler still sends for it is late, dropped): save my shard as the cut, then go
        on with the held pushes (which may start the next cut)."""
        quorum = policy.cut_quorum(self)
        if not self.collecting:
            return
        if not ((self.past | ~self.active).all() or (quorum is not None and self.past.sum() >= quorum)):
            return
        if self.past.any():
            self.publish()
            self.checkpoints.save(self.st.rounds, self.collecting)
            self.st.cuts = self.collecting
        # else every worker retired and none pushed past it: server 0's own cut, started
        # at the end and never announced, which no other server saves; the final one will
        self.collecting = 0
        held, self.held = self.held, []
        for j, cut, dw, loss_sum, m in held:
            self.route(policy, j, cut, dw, loss_sum, m)

    def apply(self, j: int, d: np.ndarray, loss_sum: float) -> bool:
        """Worker j's push: the optimizer moves my shard along d into its next version,
        checking d in the same pass; False if d or its loss had NaN or inf (refused:
        nothing moves; counted by acceptable())."""
        if math.isfinite(loss_sum) and self.update(d, lr_scale=self.lr_scale[j]):
            return self.acceptable(j, None, loss_sum)
        return self.acceptable(j, d, math.nan)

    def update(self, d: np.ndarray, scale: float = 1.0, lr_scale: float = 1.0) -> bool:
        """The optimizer moves my shard along scale * d, with lr_scale times the share of
        the learning rate every update takes (halve_step), into a fresh version, which
        becomes the current one; False (nothing moved) if d is not finite."""
        ok = self.optimizer.update(self.msgs.w, d, self.msgs.fresh(self.replies), scale,
                                   self.step_share * lr_scale)
        if ok:
            self.msgs.commit()
        return ok

    def publish(self) -> np.ndarray:
        """Bring `w` (the caller's) up to the current version of the shard; returns it."""
        return self.msgs.publish()

    def halve_step(self) -> float:
        """Every later update takes half the step it would have (a guard against a
        climbing loss: asgd.run.progress); returns the share of lr they now take."""
        self.step_share *= 0.5
        return self.step_share

    def new_version(self, loss_sum: float, samples: float) -> None:
        """The shard has a new version; count it, report the samples it took in."""
        self.st.rounds += 1
        self.on_version(self.st.rounds, loss_sum, samples)
        if (self.leader and self.checkpoints and not self.collecting
                and self.checkpoints.due(self.st.rounds)):
            self.start_cut()   # before this version's replies go out: they carry it

    def acceptable(self, j: int | None, dw: np.ndarray | None, loss_sum: float) -> bool:
        """False for a Delta-w or loss with NaN or inf: refused (not applied) and counted;
        DIVERGED_AFTER of them in a row stop the job. dw None: found finite already;
        j None: a sync round's mean."""
        if math.isfinite(loss_sum) and (dw is None or kernels.all_finite(dw)):
            self.refused_in_a_row = 0
            return True
        self.st.refused += 1
        self.refused_in_a_row += 1
        if self.refused_in_a_row >= DIVERGED_AFTER:
            raise DivergenceError(
                f"server rank {self.comm.rank} refused {self.refused_in_a_row} updates in a row with NaN "
                f"or inf values (the last {self._whose(j)}): training diverged; "
                "lower --lr")
        return False

    def _whose(self, j: int | None) -> str:
        return "a round's mean" if j is None else f"from worker rank {self.ranks[j]}"

    def reply(self, j: int) -> None:
        """Answer worker j (unless answer() did already), then re-arm its receive: its
        push has been taken. A dead worker: nothing."""
        if self.dead[j]:
            return
        if not self.answered[j]:
            self.answer(j)
        self.answered[j] = False
        self.pushes[j].Start()

    def answer(self, j: int) -> None:
        """Send worker j the current version of the shard, out of the buffer it lives in.
        Before its push is applied (Async) reply() must follow once it is: the push's
        receive is re-armed only then."""
        if self.replies[j] and not self.replies[j].Test():  # the previous reply: done long ago in practice
            self.waiter.all([self.replies[j]], f"worker rank {self.ranks[j]} to take its previous reply")
        head = [0.0] * PULL_HEADER
        stop = STOP_ASKED if self.stopping else STOP_DONE if self.finished else 0.0
        head[R_VERSION], head[R_STOP], head[R_CUT] = self.st.rounds, stop, self.collecting or self.st.cuts
        out = self.msgs.reply(j, head, self.replies)
        c, r = self.routes[j]
        self.replies[j] = c.Isend([out, self.msgs.kind], r, TAG_PULL)
        nbytes = self.msgs.pull_nbytes
        if self.traced:
            step = int(self.msgs.header(j)[P_STEP])
            self.clock.message(SEND, self.ranks[j], nbytes, flow_id(self.ranks[j], self.comm.rank, step, True))
        self.st.bytes_sent += self.wire[j] * nbytes
        self.answered[j] = True

    def gap(self, j: int) -> int:
        """How many steps worker j is ahead of the slowest active worker."""
        slowest = self.steps.min() if self.live == self.W else self.steps[self.active].min(initial=self.steps[j])
        return int(self.steps[j] - slowest)

    def record(self, shard: tuple[int, int]) -> dict:
        """This server's entry of results.json's `ranks`, with the bytes of parameter-sized
        arrays it held (its shard, the optimizer's state and next state, its message
        buffers and versions)."""
        rec = self.st.record(shard, self.ranks)
        rec["weight_bytes"] = self.w.nbytes + self.optimizer.nbytes + self.msgs.nbytes
        return rec

    def finish(self) -> ServerStats:
        self.st.stopped = self.stopping or self.ep.stop_requested()
        self.clock.switch("idle")
        dones = [d for j, d in enumerate(self.dones) if not self.dead[j]]
        self.waiter.all(dones, "every worker's end-of-work message", self.watch)
        for j, p in enumerate(self.pushes):  # every worker is done: withdraw the receives still posted
            if self.dead[j] or p == MPI.REQUEST_NULL:
                continue   # its receive failed with it, or a retry after a death found it freed
            p.Cancel()
            p.Wait()
            p.Free()
        self.waiter.all(self.replies, "workers to take their last replies", self.watch)
        self.publish()
        return self.st


def serve_all(servers: list[Server], policies: list[Policy]) -> list[ServerStats]:
    """Serve several shards on one rank (more model-parallel slices than servers: one
    Server each, their workers apart) until all their workers are done, with one wait
    over all their requests."""
    if len(servers) == 1:
        return [servers[0].serve(policies[0])]
    first = servers[0]
    where = [(k, i) for k, srv in enumerate(servers) for i in range(len(srv.requests))]
    requests = [r for srv in servers for r in srv.requests]
    while any(srv.live for srv in servers):
        first.clock.switch("idle")
        i = first.waiter.any(requests, "a push to any of this rank's shards")
        first.clock.switch("aggregate")
        k, j = where[i]
        servers[k].event(j, policies[k])
    return [srv.finish() for srv in servers]


# -- reply policies: what to apply, and whom to answer --------------------------------

class Policy:
    def take(self, srv: Server, j: int, dw: np.ndarray | None, loss_sum: float, m: float) -> None:
        """Worker j's accounted push (dw None: refused)."""
        raise NotImplementedError

    def cut_quorum(self, srv: Server) -> int | None:
        """How many workers' pushes past a checkpoint cut complete it; None: every active one's."""
        return None

    def answerable(self, srv: Server) -> list[int]:
        """Workers to answer now (each has a push taken and not yet answered)."""
        raise NotImplementedError


class Async(Policy):
    """Answer each push at once, then apply its Delta-w (reply_first, the default: the
    update is off the worker's round trip, and the worker sees its own Delta-w one
    exchange later); or apply it, then answer (reply_first=False: a worker reads its own
    writes, as in SSP)."""

    def __init__(self, reply_first: bool = True):
        self.reply_first = reply_first
        self.ready: list[int] = []

    def take(self, srv, j, dw, loss_sum, m):
        if self.reply_first:
            srv.answer(j)
        if not srv.apply(j, dw, loss_sum):
            loss_sum, m = 0.0, 0.0   # a refused update adds no samples to the progress
        srv.new_version(loss_sum, m)
        srv.st.step_gap[j].append(srv.gap(j))
        self.ready.append(j)

    def answerable(self, srv):
        ready, self.ready = self.ready, []
        return ready


class SSP(Async):
    """Async, but a worker's answer waits while its next push would be more than K steps
    ahead of the slowest active worker; a retiring worker can release the others."""

    def __init__(self, K: int):
        super().__init__(reply_first=False)   # its bound is on what a worker has read: its own writes too
        self.K = K
        self.held: list[int] = []

    def answerable(self, srv):
        self.held += super().answerable(srv)
        slowest = srv.steps[srv.active].min() if srv.active.any() else 0
        go = [j for j in self.held if not srv.active.any() or srv.steps[j] + 1 - slowest <= self.K]
        self.held = [j for j in self.held if j not in go]
        return go


class Sync(Policy):
    """Rounds: every active worker's push, their sample-weighted mean (summed in worker
    order, whatever the arrival order: deterministic) applied once, every worker answered.
    With `backup` workers (TensorFlow's SyncReplicasOptimizer) a round is applied once all
    but `backup` of the active workers have pushed; a push that comes after its round was
    applied (its step below the rounds so far) is dropped, counted and answered at once,
    and its worker, told the round, pushes its next step into the current one."""

    def __init__(self, backup: int = 0):
        self.backup = backup
        self.pending: dict[int, tuple] = {}
        self.late: list[int] = []
        self.mean: np.ndarray | None = None

    def cut_quorum(self, srv):
        return max(1, int(srv.active.sum()) - self.backup) if self.backup else None

    def take(self, srv, j, dw, loss_sum, m):
        if self.backup and srv.pushed_step[j] < srv.st.rounds:
            srv.st.dropped += 1
            self.late.append(j)
            return
        if not srv.acceptable(j, dw, loss_sum):   # checked on arrival: a round's weights need it
            dw, loss_sum, m = None, 0.0, 0.0
        self.pending[j] = (dw, loss_sum, m)

    def answerable(self, srv):
        late, self.late = self.late, []
        everyone = not any(srv.active[j] and j not in self.pending for j in range(srv.W))
        enough = self.backup and len(self.pending) >= max(1, int(srv.active.sum()) - self.backup)
        if not self.pending or not (everyone or enough):
            return late
        total = sum(m for _, _, m in self.pending.values())
        if self.mean is None:
            self.mean = np.empty(len(srv.w))
        self.mean[:] = 0.0
        for j in sorted(self.pending):
            dw, _, m = self.pending[j]
            if m:
                kernels.add_scaled(self.mean, dw, m / total)
            srv.st.step_gap[j].append(0)
        if total and not srv.update(self.mean):   # a mean that overflowed: refused too
            srv.acceptable(None, self.mean, math.nan)
            total = 0.0
        srv.new_version(sum(ls for _, ls, _ in self.pending.values()) if total else 0.0, total)
        if self.backup and srv.goal is not None and srv.goal():
            srv.finished = True   # workers train until told: rounds drop late pushes, so no fixed step count
        ready, self.pending = sorted(self.pending), {}
        return ready + late


def policy(mode: str, staleness: int, backup: int = 0) -> Policy:
    """The reply policy of asgd.train's --mode (sync: with `backup` workers)."""
    return {"async": Async, "ssp": lambda: SSP(staleness), "sync": lambda: Sync(backup)}[mode]()


def gather_shards(ep: Endpoint, w: np.ndarray | None, shards: list[tuple[int, int]], hosts: list[int],
                  parts: dict | None = None) -> tuple[int, int]:
    """After training: each shard's host (hosts[v], a rank) sends its part of w, parts[v],
    to rank 0, which receives them into w (all of it, to evaluate and save); rank 0's own
    shards stay. Returns this rank's (sent, received) bytes."""
    comm, me = ep.comm, ep.rank
    if me == 0:
        reqs = [comm.Irecv(w[a:b], h, TAG_SHARD) for (a, b), h in zip(shards, hosts) if h != 0]
        moved = (0, DOUBLE * sum(b - a for (a, b), h in zip(shards, hosts) if h != 0))
    else:
        mine = [np.ascontiguousarray(parts[v]) for v, h in enumerate(hosts) if h == me]
        reqs = [comm.Isend(part, 0, TAG_SHARD) for part in mine]
        moved = (sum(part.nbytes for part in mine), 0)
    ep.waiter.all(reqs, "the final shards")
    return moved
