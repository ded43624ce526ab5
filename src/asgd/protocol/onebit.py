"""1-bit messages (--compress 1bit): Seide et al.'s 1-bit SGD with error feedback (2014),
in both directions of a parameter server's exchange.

  push  worker -> server s: x = Delta-w[lo:hi] + the worker's residual, one bit per value
        (x > 0) and two scales per column (the mean of its x > 0 and of the rest, values of
        the run's precision); the
        residual keeps what the bits did not say (x minus its reconstruction) and is added
        to the next Delta-w. The server decodes the reconstruction and applies it as it
        would a Delta-w (its optimizer, its policy).
  pull  server s -> worker j: the server keeps, per worker, the shard as that worker
        holds it (`view`); a reply is the 1-bit quantization of w - view, and both sides
        add its reconstruction to their copy (the same additions, in w's dtype: they stay equal
        bit for bit). What a reply did not say stays in w - view and goes with the next
        one: error feedback without a residual of its own. Memory: workers x shard.

Columns (net.mlp.Layout.columns): each layer's lines along the hidden dimension, cut at
the shard's bounds, so every message is decoded with its shard's columns alone.

A message is one contiguous byte buffer, sent as MPI.BYTE:
    [ header (float64: a push's or a pull's, asgd.core.wire) | 2 scales per column | bits ]
(each column's bits from a byte boundary: its size is wire.onebit_bytes).
For 2-10K-2 on one server: 6,395 bytes a push and 6,371 a reply, against 400,064 and
400,040 uncompressed in float64 (62.6x fewer); in float32 the scales take half the bytes.
"""

from __future__ import annotations

import numpy as np

from ..core import wire
from ..net import kernels


class OneBit:
    """The 1-bit message of one shard: k weights in the given columns, a header of
    `header` float64 values and scales of `dtype` (the run's precision)."""

    def __init__(self, cols: np.ndarray, k: int, header: int, dtype=np.float64):
        self.cols, self.k, self.header, self.dtype = cols, k, header, np.dtype(dtype)
        self.ncol = len(cols)
        self.head_end = wire.HEADER_VALUE * header                          # bytes: the header, then
        self.scales_end = self.head_end + self.dtype.itemsize * 2 * self.ncol   # the scales, then the bits
        self.nbytes = wire.onebit_bytes(cols, header, self.dtype.itemsize)   # what goes on the wire

    def buffer(self) -> np.ndarray:
        """A message buffer (bytes; its header and scales aligned: numpy aligns allocations)."""
        return np.zeros(self.nbytes, np.uint8)

    def head(self, buf: np.ndarray) -> np.ndarray:
        """The header of a message buffer, as float64 (a view: write or read it)."""
        return buf[:self.head_end].view(np.float64)

    def _parts(self, buf):
        return buf[self.head_end:self.scales_end].view(self.dtype), buf[self.scales_end:]

    def encode(self, v: np.ndarray, residual: np.ndarray, buf: np.ndarray) -> None:
        """A push: v + residual into buf's scales and bits; residual keeps the rest."""
        scales, bits = self._parts(buf)
        kernels.quantize_1bit(v, residual, self.cols, scales, bits)

    def encode_diff(self, w: np.ndarray, view: np.ndarray, buf: np.ndarray) -> None:
        """A reply: w - view into buf's scales and bits; view moves as the receiver's copy will."""
        scales, bits = self._parts(buf)
        kernels.quantize_diff_1bit(w, view, self.cols, scales, bits)

    def decode(self, buf: np.ndarray, out: np.ndarray, add: bool = False) -> None:
        """out = (add: out +) the reconstruction the message carries."""
        scales, bits = self._parts(buf)
        kernels.dequantize_1bit(self.cols, scales, bits, out, add)

    def finite(self, buf: np.ndarray) -> bool:
        """False if a scale is NaN or inf (the reconstruction then is too)."""
        return bool(kernels.all_finite(self._parts(buf)[0]))


def codecs(layout, shards: list[tuple[int, int]], header: int, dtype=np.float64) -> list[OneBit]:
    """One codec per server shard."""
    return [OneBit(layout.columns(lo, hi), hi - lo, header, dtype) for lo, hi in shards]


def bytes_per_weight(layout, servers: int, itemsize: int = wire.DOUBLE) -> float:
    """Payload bytes per weight of a 1-bit push (scales of `itemsize` bytes and bits, no
    header), the largest shard's: what asgd.testbed.model's wire_bytes takes for
    compressed messages."""
    header = wire.HEADER_VALUE * wire.PUSH_HEADER
    return max((wire.onebit_bytes(layout.columns(lo, hi), wire.PUSH_HEADER, itemsize) - header) / (hi - lo)
               for lo, hi in wire.shard_bounds(layout.n_w, servers))
