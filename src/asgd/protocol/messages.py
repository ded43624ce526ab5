"""How a push and a pull are laid out in memory, on each side: the message strategies the
worker's link (worker.PushPull) and the server (server.Server) each hold one of. The
link and the server do the protocol (what is sent when, versions, stops, counts); a
strategy only owns the buffers and turns Delta-w and w into messages and back.

  Dense          values of the run's precision (float32 or float64; the headers float64
                 in their slots, wire.header_slots): a worker writes Delta-w straight
                 into one of two push buffers
                 [Delta-w | S headers] (the other may be in flight) and w' lands in a
                 second w buffer [w | S headers] that is swapped in; an indexed datatype
                 per server picks its slice and its header: no copies. A server receives
                 [Delta-w shard | header] into one buffer per worker and keeps its shard
                 in versions [w | header]: an update writes the next version into a
                 buffer no reply is in flight from, and a reply goes out of the version
                 it carries: no copies either.
  OneBit         --compress 1bit (protocol.onebit): a push is quantized per server shard
                 with the worker's error feedback; a reply is the quantized change of the
                 shard since that worker's last one, added to w in place; the server keeps
                 the shard as each worker holds it (workers x shard of memory).

A buffer in flight is never written: a worker's push is encoded only after the exchange
before it completed, and its w changes only in pulled(), after the step that read it.
"""

from __future__ import annotations

import struct

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from ..core import wire
from ..core.wire import PULL_HEADER, PUSH_HEADER, header_slots
from .onebit import OneBit, codecs


def shard_types(n_w: int, shards: list[tuple[int, int]], slots: int, dtype) -> list[MPI.Datatype]:
    """Per server, the datatype that picks its slice of a flat [vector | S headers]
    buffer of `dtype` and its own header (`slots` values); on the wire it is hi-lo+slots
    contiguous values."""
    return [from_numpy_dtype(dtype).Create_indexed([hi - lo, slots], [lo, n_w + s * slots]).Commit()
            for s, (lo, hi) in enumerate(shards)]


def header_view(buf: np.ndarray, start: int, slots: int) -> np.ndarray:
    """The float64 header in buf[start:start + slots] (a view: read or write it). In a
    float32 buffer it may sit at an odd slot, unaligned for float64: numpy reads and
    writes it all the same (a header is a few values, never a numba kernel's)."""
    return buf[start:start + slots].view(np.float64)


class Header:
    """A message buffer's float64 header at values [start, start + slots), made once per
    buffer: `view` (header_view) to read it, write(values) to fill it. The write packs with
    struct: numpy's assignment of a few Python floats took ten times as long (about 1 µs,
    once per push and per reply, on the round trip's path)."""

    def __init__(self, buf: np.ndarray, start: int, slots: int):
        self.view = header_view(buf, start, slots)
        self._bytes = memoryview(buf).cast("B")
        self._at = start * buf.itemsize
        self._pack = struct.Struct(f"={len(self.view)}d").pack_into   # native order, no padding

    def write(self, values) -> None:
        self._pack(self._bytes, self._at, *values)


# -- the worker's side ------------------------------------------------------------------

class DenseLink:
    """A worker's uncompressed messages, in w0's dtype (the run's precision)."""

    def __init__(self, shards: list[tuple[int, int]], w0: np.ndarray):
        S, n, dt = len(shards), len(w0), w0.dtype
        self.S, self.n = S, n
        size = dt.itemsize
        self.push_slots, self.pull_slots = header_slots(PUSH_HEADER, size), header_slots(PULL_HEADER, size)
        self.push_types = shard_types(n, shards, self.push_slots, dt)
        self.pull_types = shard_types(n, shards, self.pull_slots, dt)
        self.push_bytes = [wire.push_bytes(hi - lo, itemsize=size) for lo, hi in shards]
        self.pull_bytes = [wire.pull_bytes(hi - lo, itemsize=size) for lo, hi in shards]
        self.pushes = [np.zeros(n + S * self.push_slots, dt) for _ in range(2)]
        self.cur = np.zeros(n + S * self.pull_slots, dt)  # [w | a reply header per server]; version 0: the initial w
        self.cur[:n] = w0
        self.nxt = np.empty_like(self.cur)
        self.free = 0  # the push buffer not in flight
        self.push_heads = [[Header(b, n + s * self.push_slots, self.push_slots) for s in range(S)]
                           for b in self.pushes]
        self.cur_heads, self.nxt_heads = ([header_view(b, n + s * self.pull_slots, self.pull_slots) for s in range(S)]
                                          for b in (self.cur, self.nxt))
        # views and message specs made once: an exchange's hot path makes none (a slice costs ~0.1 us)
        self.deltas = [b[:n] for b in self.pushes]
        self.cur_w, self.nxt_w = self.cur[:n], self.nxt[:n]
        self.push_msgs = [[[b, 1, t] for t in self.push_types] for b in self.pushes]
        self.cur_msgs, self.nxt_msgs = ([[b, 1, t] for t in self.pull_types] for b in (self.cur, self.nxt))

    @property
    def w(self) -> np.ndarray:
        return self.cur_w

    def delta(self) -> np.ndarray:
        return self.deltas[self.free]

    def push_header(self, s: int) -> np.ndarray:
        return self.push_heads[self.free][s].view

    def write_push_header(self, s: int, values: list) -> None:
        self.push_heads[self.free][s].write(values)

    def push(self, s: int, dw: np.ndarray):
        """Server s's push message of dw (delta()'s buffer, its header filled)."""
        return self.push_msgs[self.free][s]

    def pushed(self) -> None:
        self.free ^= 1

    def pull(self, s: int):
        return self.nxt_msgs[s]

    def pulled(self, s: int) -> np.ndarray:
        """Server s's reply has arrived; its header."""
        return self.nxt_heads[s]

    def all_pulled(self) -> None:
        self.cur, self.nxt = self.nxt, self.cur
        self.cur_heads, self.nxt_heads = self.nxt_heads, self.cur_heads
        self.cur_w, self.nxt_w = self.nxt_w, self.cur_w
        self.cur_msgs, self.nxt_msgs = self.nxt_msgs, self.cur_msgs

    def close(self) -> None:
        for t in self.push_types + self.pull_types:
            t.Free()

    @property
    def nbytes(self) -> int:
        """Bytes of parameter-sized buffers it holds (results.json's weight_bytes)."""
        return sum(a.nbytes for a in (*self.pushes, self.cur, self.nxt))


class OneBitLink:
    def __init__(self, shards: list[tuple[int, int]], w0: np.ndarray, pushes: list[OneBit], pulls: list[OneBit]):
        self.shards, self.push_codec, self.pull_codec = shards, pushes, pulls
        self.push_bytes = [c.nbytes for c in pushes]
        self.pull_bytes = [c.nbytes for c in pulls]
        self.out = [c.buffer() for c in pushes]
        self.inbox = [c.buffer() for c in pulls]
        self._w = w0.copy()
        self.dw = np.zeros_like(w0)
        self.residual = np.zeros_like(w0)  # error feedback: what the pushes so far did not say

    @property
    def w(self) -> np.ndarray:
        return self._w

    def delta(self) -> np.ndarray:
        return self.dw

    def push_header(self, s: int) -> np.ndarray:
        return self.push_codec[s].head(self.out[s])

    def write_push_header(self, s: int, values: list) -> None:
        self.push_header(s)[:] = values

    def push(self, s: int, dw: np.ndarray):
        lo, hi = self.shards[s]
        c, buf = self.push_codec[s], self.out[s]
        c.encode(dw[lo:hi], self.residual[lo:hi], buf)
        if not c.finite(buf):  # NaN or inf: the server refuses this push; start the residual afresh
            self.residual[lo:hi] = 0.0
        return [buf, MPI.BYTE]

    def pushed(self) -> None:
        pass

    def pull(self, s: int):
        return [self.inbox[s], MPI.BYTE]

    def pulled(self, s: int) -> np.ndarray:
        lo, hi = self.shards[s]
        c, buf = self.pull_codec[s], self.inbox[s]
        c.decode(buf, self._w[lo:hi], add=True)
        return c.head(buf)

    def all_pulled(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self._w, self.dw, self.residual, *self.out, *self.inbox))


# -- the server's side ------------------------------------------------------------------
# A server's shard lives in versions: an update writes the next version into a buffer no
# reply is being sent from (`fresh`), which then becomes the current one (`commit`), so a
# reply is sent straight out of the version it carries, while later updates go on into
# other buffers: no copy of w per reply, and no reply reads a shard being written. The
# caller's w (`home`) is brought up to date only when asked (`publish`: checkpoints, the
# evaluation, the end of the run).

def _in_flight(req) -> bool:
    """A reply still being sent (Test completes a finished one, which frees its buffer).
    One to a worker that died (--fault-tolerant) is not: nobody will read it, and its
    error must not escape here, half-way through a push's update, where it would leave
    that push unanswered (bench_chaos: a job hung); the death is seen where it is waited on."""
    if req == MPI.REQUEST_NULL:
        return False
    try:
        return not req.Test()
    except MPI.Exception:
        return False


class DenseShard:
    """A server's buffers for uncompressed messages in w's dtype (the run's precision;
    headers float64 in their slots): per worker, [Delta-w | header] received;
    and a pool of versions of the shard, each [w | header], that replies go out of.

    A version is sent to every worker it answers (sync's round: all of them) with one
    header; if a reply needs another header (a new stop, cut or version number, which a
    refused push brings) while a reply is in flight out of that buffer, the version is
    copied to a free buffer first: the one copy left, on a path taken only then. The pool
    grows to the replies in flight, at most workers + 2 buffers."""

    def __init__(self, w: np.ndarray, workers: int):
        n, dt = len(w), w.dtype
        self.n, self.home, self.kind = n, w, from_numpy_dtype(dt)
        self.push_slots, self.pull_slots = (header_slots(h, dt.itemsize) for h in (PUSH_HEADER, PULL_HEADER))
        self.recv = [np.empty(n + self.push_slots, dt) for _ in range(workers)]
        self.deltas = [r[:n] for r in self.recv]   # views made once: a push's hot path makes none
        self.heads = [header_view(r, n, self.push_slots) for r in self.recv]
        self.pool = [np.empty(n + self.pull_slots, dt) for _ in range(2)]
        self.views = [b[:n] for b in self.pool]
        self.heads_out = [Header(b, n, self.pull_slots) for b in self.pool]   # each version's reply header
        self.pool[0][:n] = w
        self.cur, self.next = 0, 1     # the current version's buffer; the one fresh() gave
        self.written = [None, None]    # per buffer, the header values at its tail (None: none written yet)
        self.made = [0, -1]            # per buffer, when its version was made (commits so far)
        self.commits = 0
        self.source = [-1] * workers   # the buffer worker j's last reply went out of
        self.senders = [set(), set()]  # per buffer, the workers whose last reply may still be going out of it
        self.published = True          # home holds the current version
        self.push_nbytes = wire.push_bytes(n, itemsize=dt.itemsize)
        self.pull_nbytes = wire.pull_bytes(n, itemsize=dt.itemsize)

    def header(self, j: int) -> np.ndarray:
        return self.heads[j]

    def delta(self, j: int) -> np.ndarray:
        """Worker j's Delta-w, as received."""
        return self.deltas[j]

    @property
    def w(self) -> np.ndarray:
        """The shard's current version (read it; never write it)."""
        return self.views[self.cur]

    def _sending(self, b: int, replies: list) -> bool:
        """Whether a reply is in flight out of buffer b (forgetting the ones found done)."""
        senders = self.senders[b]
        if not senders:   # the usual case: no list made
            return False
        for j in list(senders):
            if _in_flight(replies[j]):
                return True
            senders.discard(j)
        return False

    def fresh(self, replies: list) -> np.ndarray:
        """A buffer to write the next version into: not the current one, and no reply
        (`replies`, the server's per worker) in flight out of it; the oldest such."""
        order = (1 - self.cur,) if len(self.pool) == 2 else sorted(range(len(self.pool)), key=self.made.__getitem__)
        for b in order:   # stops at the first: few Tests
            if b != self.cur and not self._sending(b, replies):
                self.next = b
                return self.views[b]
        self.pool.append(np.empty(self.n + self.pull_slots, self.home.dtype))
        self.views.append(self.pool[-1][:self.n])
        self.heads_out.append(Header(self.pool[-1], self.n, self.pull_slots))
        self.written.append(None)
        self.senders.append(set())
        self.made.append(-1)
        self.next = len(self.pool) - 1
        return self.views[self.next]

    def commit(self) -> None:
        """The buffer fresh() gave holds the next version: it becomes the current one."""
        self.cur = self.next
        self.written[self.cur] = None
        self.commits += 1
        self.made[self.cur] = self.commits
        self.published = False

    def reply(self, j: int, head: tuple, replies: list) -> np.ndarray:
        """Worker j's reply: the current version's buffer with `head` (the pull header's
        values) at its tail."""
        head = list(head)
        if self.written[self.cur] != head:
            if self._sending(self.cur, replies):   # the header must change under a reply in flight
                self.fresh(replies)[:] = self.w
                published = self.published
                self.commit()
                self.published = published
            self.heads_out[self.cur].write(head)
            self.written[self.cur] = head
        buf = self.pool[self.cur]
        if self.source[j] >= 0:
            self.senders[self.source[j]].discard(j)
        self.source[j] = self.cur
        self.senders[self.cur].add(j)
        return buf

    def publish(self) -> np.ndarray:
        """Bring home (the caller's w) up to the current version; returns it."""
        if not self.published:
            self.home[:] = self.w
            self.published = True
        return self.home

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.recv, *self.pool))


class OneBitShard:
    """A server's buffers for 1-bit messages: pushes decoded into a buffer (w's dtype) per
    worker (a held push stays there until its round is applied), per worker the shard as
    that worker holds it (`views`), which a reply's quantized change moves, and two
    versions of the shard (a reply is encoded, so none is ever in flight): home, the
    caller's w, and one more, taking turns."""

    kind = MPI.BYTE

    def __init__(self, w: np.ndarray, workers: int, push: OneBit, pull: OneBit):
        self.codecs = (push, pull)
        self.home = w
        self.pool = [w, np.empty_like(w)]
        self.cur = 0
        self.recv = [push.buffer() for _ in range(workers)]
        self.send = [pull.buffer() for _ in range(workers)]
        self.deltas = [np.empty_like(w) for _ in range(workers)]
        self.views = [w.copy() for _ in range(workers)]
        self.push_nbytes, self.pull_nbytes = push.nbytes, pull.nbytes

    def header(self, j: int) -> np.ndarray:
        return self.codecs[0].head(self.recv[j])

    def delta(self, j: int) -> np.ndarray:
        self.codecs[0].decode(self.recv[j], self.deltas[j])
        return self.deltas[j]

    @property
    def w(self) -> np.ndarray:
        return self.pool[self.cur]

    def fresh(self, replies: list) -> np.ndarray:
        return self.pool[1 - self.cur]

    def commit(self) -> None:
        self.cur = 1 - self.cur

    def reply(self, j: int, head: tuple, replies: list) -> np.ndarray:
        pull, out = self.codecs[1], self.send[j]
        pull.encode_diff(self.w, self.views[j], out)
        pull.head(out)[:] = head
        return out

    def publish(self) -> np.ndarray:
        if self.cur:
            self.home[:] = self.pool[1]
            self.cur = 0
        return self.home

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.recv, *self.send, *self.deltas, *self.views, self.pool[1]))


# -- choosing them (asgd.train's --compress) ---------------------------------------------

def link_messages(compress: str, layout, shards: list[tuple[int, int]], w0: np.ndarray):
    """A worker's strategy for servers owning `shards` of the flat layout, from w0."""
    if compress == "none":
        return DenseLink(shards, w0)
    return OneBitLink(shards, w0, codecs(layout, shards, PUSH_HEADER, w0.dtype),
                      codecs(layout, shards, PULL_HEADER, w0.dtype))


def shard_messages(compress: str, layout, shard: tuple[int, int], w: np.ndarray, workers: int):
    """A server's strategy for its shard [lo, hi) (w: that shard) and `workers` workers."""
    if compress == "none":
        return DenseShard(w, workers)
    lo, hi = shard
    cols = layout.columns(lo, hi)
    return OneBitShard(w, workers, OneBit(cols, hi - lo, PUSH_HEADER, w.dtype),
                       OneBit(cols, hi - lo, PULL_HEADER, w.dtype))
