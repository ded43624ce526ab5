"""The d_in-d_hidden-d_out MLP: one flat parameter vector, a view per layer, in the run's
precision (--precision: float32 by default, or float64; the kernels compile per dtype).

Layout of w (so a whole Delta-w is one contiguous message):

    [ W1 (d_in x d_hidden, row-major) | b1 (d_hidden) | W2 (d_hidden x d_out) | b2 (d_out) ]

Sigmoid hidden layer, softmax output, mean cross-entropy over the batch.

With --model-parallel K a replica of K ranks splits the hidden layer: Sliced gives the
parameters' "sliced order" (one contiguous vector per rank) and its permutations to and
from this one; ModelParallelStep / make_mp_step are one rank's step, cut where the
replica sums its partial logits.

The numba kernels are imported where a step, an evaluation or a compilation needs them,
not at the top: the layout, the slicing and the initialization serve numpy-only users
(asgd.predict, the performance model, the simulator), which need not import numba.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace

import numpy as np

from ..core.wire import column_bits_bytes, shard_bounds
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


def init_params(layout: Layout, seed: int, dtype=np.float64) -> np.ndarray:
    """Same seed, same w (drawn in float64, then rounded once to `dtype`: a float32 run
    starts from the float64 run's w, rounded). Each hidden unit is a steep sigmoid across a random
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
    return w.astype(dtype, copy=False)


# -- the numba kernels behind the flat layout (the training hot path) --------------

PROGRESS_S = 0.5e-3   # the step's work between two progress() calls, while they say False


def make_step(layout: Layout, batch: int, dtype=np.float64):
    """step(w, X, y, lr, dw, progress=None) -> loss: the numba training step with its
    scratch allocated once, in `dtype` (w's, dw's and X's); same contract as
    net.reference.step.

    progress: a callable the step calls about every PROGRESS_S of its work (between calls
    of step_rows over a few samples, a multiple of 4, sized from the time the last call
    took) while it returns False, e.g. to let MPI move a message in flight
    (protocol.worker.PushPull.progress); once it returns True the rest of the batch runs
    in one call. Every sum over samples runs in sample order however the batch is split,
    so Delta-w and the loss are the same, bit for bit, with or without it (both run the
    same compiled kernels, step_begin, step_rows, step_end: sgd_step inlines them, and its
    compiled copy may contract other multiply-adds into FMAs); without it each is called
    once."""
    from . import kernels   # numba: see the module docstring
    scratch = kernels.make_scratch(batch, layout.d_hidden, layout.d_out, dtype)
    block = kernels.step_block(scratch)

    def step(w, X, y, lr, dw, progress=None):
        W, D = layout.views(w), layout.views(dw)
        kernels.step_begin(*W, X, y, *D, scratch)
        loss = 0.0

        def rows(r0, r1):
            nonlocal loss
            loss = kernels.step_rows(*W, X, y, lr, r0, r1, *D, scratch, loss)
        in_pieces(rows, len(y), block, progress)
        kernels.step_end(D[2], scratch)
        return float(loss) / len(y)
    return step


def in_pieces(run, B: int, block: int, progress=None):
    """run(r0, r1) over the rows [0, B) of a batch: in one call without progress; with
    it, progress() before each call while it returns False, each call over about
    PROGRESS_S of work (a multiple of 4 rows, at most `block`, sized from the time the
    last call took), and the rest in one call once it returns True. Returns progress, or
    None once it has returned True (then the caller's next phase need not ask again)."""
    r, rows = 0, block
    while r < B:
        if progress is None or progress():
            progress, r1 = None, B
        else:
            r1 = min(r + rows, B)
        t = time.perf_counter()
        run(r, r1)
        if progress is not None:   # the next call's samples: about PROGRESS_S of work
            per_row = (time.perf_counter() - t) / (r1 - r)
            rows = max(4, min(block, int(PROGRESS_S / per_row) // 4 * 4)) if per_row > 0 else block
        r = r1
    return progress


# -- model parallelism: a replica of K ranks splits the hidden layer ---------------

class Sliced:
    """The parameters of `layout` split K ways along the hidden layer (--model-parallel K):
    slice k holds hidden units units[k] = [j0, j1) (K contiguous groups, sizes within one
    of each other), i.e. their rows of W1 and b1, their columns of W2 (rows of the
    row-major H x d_out W2), and, on slice 0 only, b2.

    "Sliced order" lays w out as the concatenation of the K slice vectors; slice k's, at
    bounds[k] = [start, stop), is the flat vector of layouts[k] = Layout(d_in, H_k, d_out)
    with b2 on slice 0 and without it on the others (so each slice is contiguous and the
    total is layout.n_w). K = 1 is the standard order itself. The same seed gives the same
    model for every K: from_standard(init_params(layout, seed)).
    """

    def __init__(self, layout: Layout, K: int):
        H = layout.d_hidden
        if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or not 1 <= K <= H:
            raise ValueError(f"model-parallel K must be an integer from 1 to the hidden units ({H}), got {K!r}")
        self.layout, self.K = layout, int(K)
        self.units = tuple(shard_bounds(H, self.K))   # hidden units [j0, j1) per slice
        self.layouts = tuple(Layout(layout.d_in, j1 - j0, layout.d_out) for j0, j1 in self.units)
        ends = np.cumsum([lay.n_w - (layout.d_out if k else 0) for k, lay in enumerate(self.layouts)])
        self.bounds = tuple(zip([0, *map(int, ends[:-1])], map(int, ends)))   # [start, stop) per slice
        assert self.bounds[-1][1] == layout.n_w

    @property
    def n_w(self) -> int:
        return self.layout.n_w

    def size(self, k: int) -> int:
        """Length of slice k's vector."""
        start, stop = self.bounds[k]
        return stop - start

    def views(self, k: int, v: np.ndarray, b2: np.ndarray | None = None):
        """(W1, b1, W2, b2) of layouts[k] as views into slice k's vector v. On slices
        k > 0, b2 is not part of v: the array `b2` stands in (default: new zeros); a
        forward reads it as zeros, a backward's gradient written into it is discarded."""
        lay = self.layouts[k]
        if k == 0:
            return lay.views(v)
        assert v.shape == (self.size(k),), (v.shape, self.size(k))
        o1, o2, o3 = lay._ends
        b2 = np.zeros(lay.d_out, v.dtype) if b2 is None else b2
        assert b2.shape == (lay.d_out,), b2.shape
        return v[:o1].reshape(lay.d_in, lay.d_hidden), v[o1:o2], v[o2:o3].reshape(lay.d_hidden, lay.d_out), b2

    def _pairs(self, standard: np.ndarray, sliced: np.ndarray):
        """(slice's view, the standard vector's view of the same parameters) per parameter block."""
        W1, b1, W2, b2 = self.layout.views(standard)
        for k, ((j0, j1), (start, stop)) in enumerate(zip(self.units, self.bounds)):
            V = self.views(k, sliced[start:stop])
            yield from ((V[0], W1[:, j0:j1]), (V[1], b1[j0:j1]), (V[2], W2[j0:j1]))
        yield self.views(0, sliced[slice(*self.bounds[0])])[3], b2

    def to_standard(self, v: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """w in the standard order (Layout's) from v in sliced order: an exact permutation,
        into `out` if given (e.g. the vector a make_evaluate reads)."""
        assert v.shape == (self.n_w,), (v.shape, self.n_w)
        out = np.empty(self.n_w, v.dtype) if out is None else out
        for part, whole in self._pairs(out, v):
            whole[...] = part
        return out

    def from_standard(self, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """v in sliced order from w in the standard order: to_standard's inverse."""
        assert w.shape == (self.n_w,), (w.shape, self.n_w)
        out = np.empty(self.n_w, w.dtype) if out is None else out
        for part, whole in self._pairs(w, out):
            part[...] = whole
        return out

    def columns(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Layout.columns over the range [lo, hi) of the sliced vector (a server's shard of
        it; slice k's own: columns(*bounds[k])): each slice's lines along its hidden units,
        cut at the slices' bounds, so 1-bit quantization works on any slice or shard."""
        hi = self.n_w if hi is None else hi
        parts = [np.empty((0, 3), np.int64)]
        for k, (start, stop) in enumerate(self.bounds):
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                cols = self.layouts[k].columns(a - start, b - start)   # b <= stop: slice k > 0 has no b2 line
                cols[:, 0] += a - lo
                parts.append(cols)
        return np.concatenate(parts)


class ModelParallelStep:
    """Member k's training step in a replica of K ranks that split the hidden layer
    (Sliced): its numba kernels with their scratch allocated once.

        Z = mp.forward(w_k, X)          # this slice's h (kept) and its partial logits
        (sum Z over the replica's members, in place, the same values on every member)
        loss = mp.backward(X, y, lr, dw_k)

    writes slice k's Delta-w = -lr * gradient of the batch's mean loss into dw_k (b2's on
    slice 0 only) and returns that loss, the same on every member. make_mp_step wraps the
    two with the sum. The backward uses the w of the forward (its W2, copied), so w_k may
    change in between; X and y must be the forward's batch. Memory: h of the whole batch,
    batch x H_k values (the backward needs no second exp), besides make_step's scratch.

    progress: as make_step's, called between sample blocks of either half while it says
    False. One slice (K = 1) gives make_step's Delta-w and loss bit for bit; any split of
    the halves by progress changes no bit."""

    def __init__(self, sliced: Sliced, k: int, batch: int, dtype=np.float64):
        if not 0 <= k < sliced.K:
            raise ValueError(f"slice {k} is not one of the model's {sliced.K}")
        self.sliced, self.k, self.dtype = sliced, k, np.dtype(dtype)
        self._alloc(max(1, batch))
        d_out = sliced.layout.d_out
        # b2 of slices k > 0: zeros; its gradient discarded
        self._zero_b2, self._db2_sink = np.zeros(d_out, dtype), np.empty(d_out, dtype)
        self._B = 0   # the batch of the last forward, until its backward

    def _alloc(self, batch: int):
        from . import kernels   # numba: see the module docstring
        lay = self.sliced.layouts[self.k]
        self._rows = batch
        self._scratch = kernels.make_mp_scratch(batch, lay.d_hidden, lay.d_out, self.dtype)
        self._block = kernels.mp_block(batch, lay.d_hidden)

    def forward(self, w_k: np.ndarray, X: np.ndarray, progress=None) -> np.ndarray:
        """The batch's partial logits (batch x d_out, a view into the scratch) over this
        slice's units, plus b2 on slice 0: the caller sums them across the replica in place."""
        return self._forward(w_k, X, progress)[0]

    def backward(self, X: np.ndarray, y: np.ndarray, lr: float, dw_k: np.ndarray, progress=None) -> float:
        """From the summed logits: slice k's Delta-w into dw_k; returns the batch's mean loss."""
        return self._backward(X, y, lr, dw_k, progress)[0]

    def _forward(self, w_k, X, progress):
        from . import kernels   # numba: see the module docstring
        B = len(X)
        self._B = 0   # until this forward has run
        if B > self._rows:
            self._alloc(B)
        W1, b1, W2, b2 = self.sliced.views(self.k, w_k, self._zero_b2)
        scratch = self._scratch
        kernels.mp_forward_begin(W1, W2, X, scratch)
        progress = in_pieces(lambda r0, r1: kernels.mp_forward_rows(W1, b1, b2, X, r0, r1, self._block, scratch),
                             B, self._block, progress)
        self._B = B
        return scratch[4][:B], progress

    def _backward(self, X, y, lr, dw_k, progress):
        from . import kernels   # numba: see the module docstring
        B = len(y)
        if B == 0 or B != self._B or len(X) != B:
            raise ValueError("ModelParallelStep.backward: not the batch of the last forward")
        self._B = 0   # the logits become dz: one backward per forward
        D = self.sliced.views(self.k, dw_k, self._db2_sink)
        scratch = self._scratch
        kernels.mp_backward_begin(y, D[0], D[1], D[3], scratch)
        loss = 0.0

        def rows(r0, r1):
            nonlocal loss
            loss = kernels.mp_backward_rows(X, y, lr, r0, r1, self._block, D[0], D[1], D[3], scratch, loss)
        progress = in_pieces(rows, B, self._block, progress)
        kernels.step_end(D[2], scratch)
        return float(loss) / B, progress


def make_mp_step(sliced: Sliced, k: int, batch: int, sum_logits, dtype=np.float64):
    """step(w_k, X, y, lr, dw_k, progress=None) -> mean loss: make_step's contract for
    member k of a model-parallel replica, w_k and dw_k slice k's vectors (Sliced.bounds[k]
    of the sliced order). sum_logits(Z) sums the members' partial logits Z (batch x d_out,
    C-contiguous, of `dtype`) in place, leaving the same values on every member (e.g. an
    Allreduce over the replica's sub-communicator; batch x d_out values). progress() is
    called between sample blocks of the forward and of the backward until it returns True,
    never after."""
    mp = ModelParallelStep(sliced, k, batch, dtype)

    def step(w_k, X, y, lr, dw_k, progress=None):
        Z, progress = mp._forward(w_k, X, progress)
        sum_logits(Z)
        return mp._backward(X, y, lr, dw_k, progress)[0]
    return step


def make_evaluate(layout: Layout, w: np.ndarray, test):
    """evaluate() -> (mean loss, accuracy) of the current w on a held-out Dataset."""
    from . import kernels   # numba: see the module docstring

    def evaluate():
        loss, acc = kernels.evaluate(*layout.views(w), test.X, test.y)
        return float(loss), float(acc)
    return evaluate


KERNEL_USES = ("step", "mp_step", "evaluate", "aggregate", *(f"update:{o}" for o in OPTIMIZERS),
               "onebit")  # see compile_kernels


def compile_kernels(*uses: str, dtype=np.float64) -> None:
    """Call the kernels of `uses` once on a tiny model with the run's argument types
    (C-contiguous vectors of `dtype`, the run's precision, int64 labels), so numba
    compiles them, or loads them from its cache, before the timed loop; with no argument,
    all of them.
      step       step_begin, step_rows, step_end (a worker: make_step)
      mp_step    mp_forward_begin, mp_forward_rows, mp_backward_begin, mp_backward_rows,
                 step_end (a worker of a model-parallel replica: make_mp_step)
      evaluate   evaluate (the rank that evaluates: rank 0)
      aggregate  add_into, add_scaled, all_finite (a server; allreduce ranks)
      update:O   optimizer O's update (a server; allreduce ranks)
      onebit     quantize_1bit, quantize_diff_1bit, dequantize_1bit, all_finite (--compress 1bit)"""
    from . import kernels   # numba: see the module docstring
    from .optimizers import Optimizer   # it imports the kernels too
    unknown = set(uses) - set(KERNEL_USES)
    if unknown:
        raise ValueError(f"unknown kernel uses {sorted(unknown)}; choose from {KERNEL_USES}")
    uses = uses or KERNEL_USES
    tiny = Layout(2, 3, 2)
    w, dw = init_params(tiny, 0, dtype), np.zeros(tiny.n_w, dtype)
    X, y = np.zeros((2, 2), dtype), np.zeros(2, dtype=np.int64)
    if "step" in uses:
        step = make_step(tiny, 2, dtype)
        step(w, X, y, 0.1, dw)
        step(w, X, y, 0.1, dw, progress=iter((False, True)).__next__)  # split: the same kernels, once more
    if "mp_step" in uses:
        sliced = Sliced(tiny, 2)
        v, dv = sliced.from_standard(w), np.zeros(tiny.n_w, dtype)
        for k, (start, stop) in enumerate(sliced.bounds):   # slice 0 with b2, slice 1 without
            step = make_mp_step(sliced, k, 2, lambda Z: None, dtype)
            step(v[start:stop], X, y, 0.1, dv[start:stop])
            step(v[start:stop], X, y, 0.1, dv[start:stop], progress=iter((False, True)).__next__)
    if "evaluate" in uses:
        make_evaluate(tiny, w, SimpleNamespace(X=X, y=y))()
    if "aggregate" in uses:
        kernels.all_finite(dw)
        kernels.add_into(w, dw)
        kernels.add_scaled(w, dw, 0.5)
    if "onebit" in uses:
        cols = tiny.columns()
        scales, bits = np.zeros(2 * len(cols), dtype), np.zeros(column_bits_bytes(cols), np.uint8)
        kernels.quantize_1bit(dw, w.copy(), cols, scales, bits)
        kernels.quantize_diff_1bit(w, w.copy(), cols, scales, bits)
        kernels.dequantize_1bit(cols, scales, bits, dw, True)
        kernels.all_finite(scales)
    for use in uses:
        if use.startswith("update:"):
            opt = Optimizer(use.split(":", 1)[1], 0.1, tiny.n_w, dtype=dtype)
            opt.update(w, dw.copy(), np.empty_like(w), 0.5)   # a server's: into another version
            opt.step(w, dw.copy(), 0.5)                       # allreduce's: in place
