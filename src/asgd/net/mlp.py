"""The d_in-d_hidden-d_out MLP: one flat float64 parameter vector, a view per layer.

Layout of w (so a whole Delta-w is one contiguous message):

    [ W1 (d_in x d_hidden, row-major) | b1 (d_hidden) | W2 (d_hidden x d_out) | b2 (d_out) ]

Sigmoid hidden layer, softmax output, mean cross-entropy over the batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace

import numpy as np

from ..wire import column_bits_bytes
from . import OPTIMIZERS



@dataclass(frozen=True)
class Layout:
    d_in: int
    d_hidden: int
    d_out: int

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return (self.d_in * self.d_hidden, self.d_hidden, self.d_hidden * self.d_out, self.d_out)

    @property
    def n_w(self) -> int:
        """Number of parameters: d_i*d_h + d_h*d_o (the paper's n_w) plus the biases."""
        return sum(self.sizes)

    @cached_property
    def _ends(self) -> tuple[int, int, int]:
        o1, o2, o3, _ = (int(x) for x in np.cumsum(self.sizes))
        return o1, o2, o3

    def views(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(W1, b1, W2, b2) as views into the flat vector w (or any slice-compatible copy)."""
        assert w.shape == (self.n_w,), (w.shape, self.n_w)
        o1, o2, o3 = self._ends
        return (w[:o1].reshape(self.d_in, self.d_hidden), w[o1:o2],
                w[o2:o3].reshape(self.d_hidden, self.d_out), w[o3:])

    def columns(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """The columns of 1-bit quantization (net.kernels.quantize_1bit), within the flat
        range [lo, hi) (a server's shard): an int64 array of (start - lo, count, stride),
        one row per non-empty column, which together cover [lo, hi) once.

        A column is one line of a layer along the hidden dimension, each with its own two
        reconstruction values: W1's row per input (the d_hidden weights out of input i:
        CNTK's column of its hidden x input matrix), b1, W2's column per output unit (the
        d_hidden weights into output k, stride d_out in the flat vector), and b2. Lines
        along the short dimensions (the d_in weights into one hidden unit) would spend two
        float64 scales on every two or three values and send more bytes than float32."""
        hi = self.n_w if hi is None else hi
        o1, o2, o3 = self._ends
        H = self.d_hidden
        lines = ([(i * H, H, 1) for i in range(self.d_in)] + [(o1, H, 1)]
                 + [(o2 + k, H, self.d_out) for k in range(self.d_out)] + [(o3, self.d_out, 1)])
        out = []
        for start, count, stride in lines:
            first = max(0, -(-(lo - start) // stride))              # first t with start + t stride >= lo
            last = min(count, -(-(hi - start) // stride))            # first t with start + t stride >= hi
            if last > first:
                out.append((start + first * stride - lo, last - first, stride))
        return np.array(out, dtype=np.int64).reshape(-1, 3)


def init_params(layout: Layout, seed: int) -> np.ndarray:
    """Same seed, same w. Each hidden unit is a steep sigmoid across a random
    direction, switched on only on a cap of the input region (features of scale ~1,
    as the embedded problem's and as --standardize makes them): its mean activation
    is small. Sparse features keep the output layer well conditioned; with the usual
    dense init (mean activation 1/2) the common mode of d_hidden features has
    curvature ~ d_hidden/4 and stale asynchronous updates oscillate.

    W1's spread is 6 * sqrt(2 / d_in): 6 for the 2 features of the embedded problem
    (where it was tuned; the same w as before), and for more features a pre-activation
    whose spread does not grow with their number. With a fixed 6, the 64 features of
    scikit-learn's digits gave pre-activations of spread ~50: every unit saturated, the
    hidden layer barely trained, and a single-process loop (Adam, lr 0.01, 20 epochs,
    hidden 256, standardized) reached 0.953 held-out accuracy against 0.967 with this
    scaling (measured here, bench/bench_defaults.py's notes)."""
    rng = np.random.default_rng(seed)
    w = np.empty(layout.n_w)
    W1, b1, W2, b2 = layout.views(w)
    W1[:] = rng.normal(0.0, 6.0 * np.sqrt(2.0 / layout.d_in), W1.shape)
    b1[:] = -np.sqrt((W1**2).sum(axis=0)) * rng.uniform(0.2, 1.0, b1.shape)
    W2[:] = rng.normal(0.0, 1.0 / np.sqrt(layout.d_hidden), W2.shape)
    b2[:] = 0.0
    return w


# -- the numba kernels behind the flat layout (the training hot path) --------------

PROGRESS_S = 0.5e-3   # the step's work between two progress() calls, while they say False


def make_step(layout: Layout, batch: int):
    """step(w, X, y, lr, dw, progress=None) -> loss: the numba training step with its
    scratch allocated once; same contract as net.reference.step.

    progress: a callable the step calls about every PROGRESS_S of its work (between calls
    of step_rows over a few samples, a multiple of 4, sized from the time the last call
    took) while it returns False, e.g. to let MPI move a message in flight
    (protocol.worker.PushPull.progress); once it returns True the rest of the batch runs
    in one call. Every sum over samples runs in sample order however the batch is split,
    so Delta-w and the loss are the same, bit for bit, with or without it (both run the
    same compiled kernels, step_begin, step_rows, step_end: sgd_step inlines them, and its
    compiled copy may contract other multiply-adds into FMAs); without it each is called
    once."""
    from . import kernels
    scratch = kernels.make_scratch(batch, layout.d_hidden, layout.d_out)
    block = kernels.step_block(scratch)

    def step(w, X, y, lr, dw, progress=None):
        W, D = layout.views(w), layout.views(dw)
        B = len(y)
        kernels.step_begin(*W, X, y, *D, scratch)
        loss, r, rows = 0.0, 0, block
        while r < B:
            if progress is None or progress():
                progress, r1 = None, B
            else:
                r1 = min(r + rows, B)
            t = time.perf_counter()
            loss = kernels.step_rows(*W, X, y, lr, r, r1, *D, scratch, loss)
            if progress is not None:   # the next call's samples: about PROGRESS_S of work
                per_row = (time.perf_counter() - t) / (r1 - r)
                rows = max(4, min(block, int(PROGRESS_S / per_row) // 4 * 4)) if per_row > 0 else block
            r = r1
        kernels.step_end(D[2], scratch)
        return loss / B
    return step


def make_evaluate(layout: Layout, w: np.ndarray, test):
    """evaluate() -> (mean loss, accuracy) of the current w on a held-out Dataset."""
    from . import kernels

    def evaluate():
        loss, acc = kernels.evaluate(*layout.views(w), test.X, test.y)
        return float(loss), float(acc)
    return evaluate


KERNEL_USES = ("step", "evaluate", "aggregate", *(f"update:{o}" for o in OPTIMIZERS), "onebit")  # see compile_kernels


def compile_kernels(*uses: str) -> None:
    """Call the kernels of `uses` once on a tiny model with the run's argument types
    (C-contiguous float64 vectors, int64 labels), so numba compiles them, or loads them
    from its cache, before the timed loop; with no argument, all of them.
      step       step_begin, step_rows, step_end (a worker: make_step)
      evaluate   evaluate (the rank that evaluates: rank 0)
      aggregate  add_into, add_scaled, all_finite (a server; allreduce ranks)
      update:O   optimizer O's update (a server; allreduce ranks)
      onebit     quantize_1bit, quantize_diff_1bit, dequantize_1bit, all_finite (--compress 1bit)"""
    from . import kernels
    from .optimizers import Optimizer
    unknown = set(uses) - set(KERNEL_USES)
    if unknown:
        raise ValueError(f"unknown kernel uses {sorted(unknown)}; choose from {KERNEL_USES}")
    uses = uses or KERNEL_USES
    tiny = Layout(2, 3, 2)
    w, dw = init_params(tiny, 0), np.zeros(tiny.n_w)
    X, y = np.zeros((2, 2)), np.zeros(2, dtype=np.int64)
    if "step" in uses:
        step = make_step(tiny, 2)
        step(w, X, y, 0.1, dw)
        step(w, X, y, 0.1, dw, progress=iter((False, True)).__next__)  # split: the same kernels, once more
    if "evaluate" in uses:
        make_evaluate(tiny, w, SimpleNamespace(X=X, y=y))()
    if "aggregate" in uses:
        kernels.all_finite(dw)
        kernels.add_into(w, dw)
        kernels.add_scaled(w, dw, 0.5)
    if "onebit" in uses:
        cols = tiny.columns()
        scales, bits = np.zeros(2 * len(cols)), np.zeros(column_bits_bytes(cols), np.uint8)
        kernels.quantize_1bit(dw, w.copy(), cols, scales, bits)
        kernels.quantize_diff_1bit(w, w.copy(), cols, scales, bits)
        kernels.dequantize_1bit(cols, scales, bits, dw, True)
        kernels.all_finite(scales)
    for use in uses:
        if use.startswith("update:"):
            Optimizer(use.split(":", 1)[1], 0.1, tiny.n_w).step(w, dw.copy(), 0.5)
