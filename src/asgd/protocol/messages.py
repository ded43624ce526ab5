"""How a push and a pull are laid out in memory, on each side: the message strategies the
worker's link (worker.PushPull) and the server (server.Server) each hold one of. The
link and the server do the protocol (what is sent when, versions, stops, counts); a
strategy only owns the buffers and turns Delta-w and w into messages and back.

  Float64        a worker writes Delta-w straight into one of two push buffers
                 [Delta-w | S headers] (the other may be in flight) and w' lands in a
                 second w buffer [w | S headers] that is swapped in; an indexed datatype
                 per server picks its slice and its header: no copies. A server receives
                 [Delta-w shard | header] into one buffer per worker and replies from one
                 per worker, since the shard changes while a reply is in flight.
  OneBit         --compress 1bit (protocol.onebit): a push is quantized per server shard
                 with the worker's error feedback; a reply is the quantized change of the
                 shard since that worker's last one, added to w in place; the server keeps
                 the shard as each worker holds it (workers x shard of memory).

A buffer in flight is never written: a worker's push is encoded only after the exchange
before it completed, and its w changes only in pulled(), after the step that read it.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import wire
from ..wire import PULL_HEADER, PUSH_HEADER
from .onebit import OneBit, codecs


def shard_types(n_w: int, shards: list[tuple[int, int]], header: int) -> list[MPI.Datatype]:
    """Per server, the datatype that picks its slice of a flat [vector | S headers]
    buffer and its own header; on the wire it is hi-lo+header contiguous doubles."""
    return [MPI.DOUBLE.Create_indexed([hi - lo, header], [lo, n_w + s * header]).Commit()
            for s, (lo, hi) in enumerate(shards)]


# -- the worker's side ------------------------------------------------------------------

class Float64Link:
    def __init__(self, shards: list[tuple[int, int]], w0: np.ndarray):
        S, n = len(shards), len(w0)
        self.S, self.n = S, n
        self.push_types, self.pull_types = shard_types(n, shards, PUSH_HEADER), shard_types(n, shards, PULL_HEADER)
        self.push_bytes = [wire.push_bytes(hi - lo) for lo, hi in shards]
        self.pull_bytes = [wire.pull_bytes(hi - lo) for lo, hi in shards]
        self.pushes = [np.zeros(n + S * PUSH_HEADER) for _ in range(2)]
        self.cur = np.zeros(n + S * PULL_HEADER)  # [w | a reply header per server]; version 0: the initial w
        self.cur[:n] = w0
        self.nxt = np.empty_like(self.cur)
        self.free = 0  # the push buffer not in flight

    @property
    def w(self) -> np.ndarray:
        return self.cur[:self.n]

    def delta(self) -> np.ndarray:
        return self.pushes[self.free][:self.n]

    def push_header(self, s: int) -> np.ndarray:
        return self.pushes[self.free][self.n + s * PUSH_HEADER:self.n + (s + 1) * PUSH_HEADER]

    def push(self, s: int, dw: np.ndarray):
        """Server s's push message of dw (delta()'s buffer, its header filled)."""
        return [self.pushes[self.free], 1, self.push_types[s]]

    def pushed(self) -> None:
        self.free ^= 1

    def pull(self, s: int):
        return [self.nxt, 1, self.pull_types[s]]

    def pulled(self, s: int) -> np.ndarray:
        """Server s's reply has arrived; its header."""
        return self.nxt[self.n + s * PULL_HEADER:self.n + (s + 1) * PULL_HEADER]

    def all_pulled(self) -> None:
        self.cur, self.nxt = self.nxt, self.cur

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
        self.dw = np.zeros(len(w0))
        self.residual = np.zeros(len(w0))  # error feedback: what the pushes so far did not say

    @property
    def w(self) -> np.ndarray:
        return self._w

    def delta(self) -> np.ndarray:
        return self.dw

    def push_header(self, s: int) -> np.ndarray:
        return self.push_codec[s].head(self.out[s])

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

class Float64Shard:
    """A server's buffers for float64 messages: per worker, [Delta-w | header] received
    and [w | header] sent."""

    kind = MPI.DOUBLE

    def __init__(self, w: np.ndarray, workers: int):
        n = len(w)
        self.n = n
        self.recv = [np.empty(n + PUSH_HEADER) for _ in range(workers)]
        self.send = [np.empty(n + PULL_HEADER) for _ in range(workers)]
        self.push_nbytes, self.pull_nbytes = wire.push_bytes(n), wire.pull_bytes(n)

    def header(self, j: int) -> np.ndarray:
        return self.recv[j][self.n:]

    def delta(self, j: int) -> np.ndarray:
        """Worker j's Delta-w, as received."""
        return self.recv[j][:self.n]

    def reply(self, j: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Worker j's reply buffer holding w; (the buffer, its header to fill)."""
        out = self.send[j]
        out[:self.n] = w
        return out, out[self.n:]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.recv, *self.send))


class OneBitShard:
    """A server's buffers for 1-bit messages: pushes decoded into a float64 buffer per
    worker (a held push stays there until its round is applied), and per worker the
    shard as that worker holds it (`views`), which a reply's quantized change moves."""

    kind = MPI.BYTE

    def __init__(self, w: np.ndarray, workers: int, push: OneBit, pull: OneBit):
        self.codecs = (push, pull)
        self.recv = [push.buffer() for _ in range(workers)]
        self.send = [pull.buffer() for _ in range(workers)]
        self.deltas = [np.empty(len(w)) for _ in range(workers)]
        self.views = [w.copy() for _ in range(workers)]
        self.push_nbytes, self.pull_nbytes = push.nbytes, pull.nbytes

    def header(self, j: int) -> np.ndarray:
        return self.codecs[0].head(self.recv[j])

    def delta(self, j: int) -> np.ndarray:
        self.codecs[0].decode(self.recv[j], self.deltas[j])
        return self.deltas[j]

    def reply(self, j: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pull, out = self.codecs[1], self.send[j]
        pull.encode_diff(w, self.views[j], out)
        return out, pull.head(out)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.recv, *self.send, *self.deltas, *self.views))


# -- choosing them (asgd.train's --compress) ---------------------------------------------

def link_messages(compress: str, layout, shards: list[tuple[int, int]], w0: np.ndarray):
    """A worker's strategy for servers owning `shards` of the flat layout, from w0."""
    if compress == "none":
        return Float64Link(shards, w0)
    return OneBitLink(shards, w0, codecs(layout, shards, PUSH_HEADER), codecs(layout, shards, PULL_HEADER))


def shard_messages(compress: str, layout, shard: tuple[int, int], w: np.ndarray, workers: int):
    """A server's strategy for its shard [lo, hi) (w: that shard) and `workers` workers."""
    if compress == "none":
        return Float64Shard(w, workers)
    lo, hi = shard
    cols = layout.columns(lo, hi)
    return OneBitShard(w, workers, OneBit(cols, hi - lo, PUSH_HEADER), OneBit(cols, hi - lo, PULL_HEADER))
