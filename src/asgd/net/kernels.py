"""Numba kernels of one worker step (forward, backward, Delta-w) and of the server's
aggregation. Serial by design: each MPI rank is one single-threaded process.

Every kernel takes the run's precision (--precision: float32 or float64 arrays) and numba
compiles one specialization per dtype (each cached on disk). A float32 step computes in
float32 throughout its hot loops (the sums over hidden units, the sigmoid and its exp, the
gradients): constants come in the arrays' dtype (`x.dtype.type(c)`, float32 globals), since
a float64 literal would lift a float32 loop to float64 and halve its SIMD lanes. Only the
per-sample softmax and the loss accumulate in float64 (d_out values a sample).

How sgd_step stays fast (2-10K-2, one core):
- exp is `vexp`, a polynomial the LLVM loop vectorizer turns into AVX2/AVX-512 code
  (float64: _vexp64, 8 lanes to an AVX-512 register; float32: _vexp32, 16 lanes);
  math.exp/np.exp inside numba are scalar libm calls (no SVML in PyPI llvmlite).
- Samples go in blocks of S <= 32 rows (S * d_hidden * 8 bytes <= H_BYTES). Per block: forward over
  chunks of CH hidden units (the chunk's weights stay in L1 for the whole block),
  storing h (S x d_hidden) so the backward pass needs no second exp; then the
  softmax; then backward over the same chunks, gradients accumulated in place.
- For the paper's shape (d_in == d_out == 2) forward and backward are one fused
  loop each with 2 resp. 4 samples per iteration (fewer loads/stores per FLOP);
  other shapes take a generic path with short vector loops over a chunk.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

CH = 512             # hidden units per chunk: that chunk's weights and gradients stay in L1/L2 for a block
H_BYTES = 2_500_000  # budget for the h of one sample block (rows x d_hidden float64): L2/L3 sized

# reassoc lets LLVM vectorize the dot-product reductions; no nnan/ninf, so a NaN or
# inf in w or X still reaches Delta-w, where the server's all_finite() sees it.
_FAST = dict(fastmath={"reassoc", "contract", "nsz", "arcp"}, boundscheck=False,
             error_model="numpy", cache=True)   # numpy model: no ZeroDivision branch, loops vectorize


@intrinsic
def _f64_bits(typingctx, x):
    """Reinterpret a float64's bits as int64 (a plain bitcast, which vectorizes)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _bits_f64(typingctx, x):
    """Reinterpret int64 bits as a float64 (a plain bitcast, which vectorizes)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def _f32_bits(typingctx, x):
    """Reinterpret a float32's bits as int32 (a plain bitcast, which vectorizes)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, x):
    """Reinterpret int32 bits as a float32 (a plain bitcast, which vectorizes)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


# exp(x) = 2^k * exp(r), |r| <= ln2/2. Degree-11 interpolant of exp at Chebyshev
# nodes (computed in 60-digit arithmetic): ~1.5e-16 relative on the reduced range.
_C = (1.0, 1.0, 0.5000000000000019, 0.1666666666666668, 0.0416666666664881,
      0.008333333333319601, 0.0013888888952314775, 0.00019841269890047113,
      2.4801485482328494e-05, 2.755724091857897e-06, 2.763263963904103e-07,
      2.5110037605963777e-08)
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8, _C9, _C10, _C11 = _C
_LOG2E = 1.4426950408889634
_LN2HI = 6.93147180369123816490e-01   # Cody-Waite split: k*_LN2HI is exact for |k| < 2^21
_LN2LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0 + 1023.0  # 1.5*2^52 + bias: x*log2e + _SHIFT rounds to k, low bits = k + 1023


@njit(fastmath={"contract"}, error_model="numpy", cache=True)   # no reassoc: it would fold the _SHIFT trick away
def _vexp64(x):
    """exp(x) to ~2e-16 relative, branch-free so loops calling it vectorize; x clamped to [-708, 709], NaN stays NaN."""
    if x < -708.0:   # keeps 2^k normal; comparisons are false for NaN, so NaN passes through
        x = -708.0
    if x > 709.0:
        x = 709.0
    t = x * _LOG2E + _SHIFT
    k = t - _SHIFT                       # round(x / ln2), exactly, as a float
    r = x - k * _LN2HI - k * _LN2LO
    p = _C11
    p = p * r + _C10
    p = p * r + _C9
    p = p * r + _C8
    p = p * r + _C7
    p = p * r + _C6
    p = p * r + _C5
    p = p * r + _C4
    p = p * r + _C3
    p = p * r + _C2
    p = p * r + _C1
    p = p * r + _C0
    return p * _bits_f64(_f64_bits(t) << 52)   # (k + 1023) << 52 is 2^k; a multiply keeps NaN a NaN


# float32: the same reduction, every constant a float32 (a float64 one would lift the
# arithmetic to float64). Degree-6 interpolant of exp at Chebyshev nodes of
# [-ln2/2, ln2/2] (computed in 50-digit arithmetic, then rounded to float32). Accuracy,
# measured against float64's exp of the same float32 x at 20,000,001 points evenly over
# [-87, 88]: at most 9.1e-8 relative (0.77 of float32's ulp at 1, 2^-23; numpy's float32
# exp: 2.1e-7), mean 2.3e-8: as good as float32 can hold the result (tests/test_kernels.py).
_F = np.float32
_D0, _D1, _D2, _D3, _D4, _D5, _D6 = (_F(c) for c in (
    1.0, 1.000000037716214, 0.5000000047117757, 0.16666415514653277, 0.04166635289677516,
    0.008375126398153335, 0.0013941108433972674))
_LOG2E_32 = _F(1.4426950408889634)
_LN2HI_32 = _F(0.693359375)          # Cody-Waite split: k*_LN2HI_32 is exact for |k| < 2^15 (it has 9 significant bits)
_LN2LO_32 = _F(-2.12194440e-4)
_SHIFT_32 = _F(12582912.0 + 127.0)   # 1.5*2^23 + bias: x*log2e + _SHIFT_32 rounds to k, low bits = k + 127
_LO_32, _HI_32 = _F(-87.0), _F(88.0)   # keeps 2^k normal in float32
_ONE_32 = _F(1.0)


@njit(fastmath={"contract"}, error_model="numpy", cache=True)   # no reassoc: it would fold the _SHIFT_32 trick away
def _vexp32(x):
    """exp(x) of a float32 in float32, to 9.1e-8 relative, branch-free so loops calling it
    vectorize (16 lanes to an AVX-512 register); x clamped to [-87, 88], NaN stays NaN."""
    if x < _LO_32:
        x = _LO_32
    if x > _HI_32:
        x = _HI_32
    t = x * _LOG2E_32 + _SHIFT_32
    k = t - _SHIFT_32
    r = x - k * _LN2HI_32 - k * _LN2LO_32
    p = _D6
    p = p * r + _D5
    p = p * r + _D4
    p = p * r + _D3
    p = p * r + _D2
    p = p * r + _D1
    p = p * r + _D0
    return p * _bits_f32(_f32_bits(t) << 23)   # (k + 127) << 23 is 2^k


def vexp(x):
    """exp(x), vectorizable inside numba: _vexp32 for a float32 x, _vexp64 otherwise (this
    Python body: numpy's, for a caller outside numba)."""
    return np.exp(x)


@overload(vexp, inline="always")
def _vexp_of(x):
    if x == types.float32:
        return lambda x: _vexp32(x)
    return lambda x: _vexp64(x)


def _sigmoid(a):
    """Logistic sigmoid through vexp, in a's precision (inlined into the vector loops)."""
    return 1.0 / (1.0 + np.exp(-a))


@overload(_sigmoid, inline="always")
def _sigmoid_of(a):
    if a == types.float32:
        return lambda a: _ONE_32 / (_ONE_32 + _vexp32(-a))
    return lambda a: 1.0 / (1.0 + _vexp64(-a))


@njit(**_FAST)
def exp_into(x, out):
    """out[:] = vexp(x) elementwise: the vectorized exp over an array (tests, benchmarks)."""
    for i in range(x.size):
        out[i] = vexp(x[i])


@njit(cache=True)
def _block_rows(batch, d_hidden):
    """Samples per block: a multiple of 4 (the fused loops take fours), at most 32, h within H_BYTES."""
    s = min(32, H_BYTES // (8 * d_hidden), (batch + 3) // 4 * 4)
    return max(4, s // 4 * 4)


def make_scratch(batch: int, d_hidden: int, d_out: int, dtype=np.float64):
    """Work arrays for sgd_step, made once per worker and reused: (W2T, dW2T, Hs, Xs, Zs, gb),
    in w's dtype (the run's precision: numba compiles a step per dtype).

    `batch` only sizes the sample block; sgd_step takes any batch size with it."""
    s = _block_rows(batch, d_hidden)
    return (np.empty((d_out, d_hidden), dtype),   # W2 transposed: one contiguous row per output
            np.empty((d_out, d_hidden), dtype),   # its gradient, transposed back at the end
            np.empty((s, d_hidden), dtype),       # h of one sample block
            np.empty((s, 2), dtype),              # X rows of the block, zero-padded (fused d_in = 2 path)
            np.empty((s, d_out), dtype),          # logits, then dz, of the block
            np.empty(CH, dtype))                  # dh of one sample and chunk (generic path)


@njit(**_FAST)
def _fwd22(W1, b1, W2T, Xs, Zs, Hs, nb, j0, j1):
    """d_in = d_out = 2: h = sigmoid(x W1 + b1) stored, z += h W2, two samples per pass."""
    w0 = W1[0, j0:j1]; w1 = W1[1, j0:j1]; c = b1[j0:j1]; v0 = W2T[0, j0:j1]; v1 = W2T[1, j0:j1]
    n = j1 - j0
    zero = Hs.dtype.type(0.0)   # the sums in the run's precision
    for b in range(0, nb, 2):
        xa0 = Xs[b, 0]; xa1 = Xs[b, 1]; xb0 = Xs[b + 1, 0]; xb1 = Xs[b + 1, 1]
        ha = Hs[b, j0:j1]; hb = Hs[b + 1, j0:j1]
        sa0 = zero; sa1 = zero; sb0 = zero; sb1 = zero
        for j in range(n):
            p = _sigmoid(c[j] + xa0 * w0[j] + xa1 * w1[j])
            q = _sigmoid(c[j] + xb0 * w0[j] + xb1 * w1[j])
            ha[j] = p; hb[j] = q
            sa0 += p * v0[j]; sa1 += p * v1[j]
            sb0 += q * v0[j]; sb1 += q * v1[j]
        Zs[b, 0] += sa0; Zs[b, 1] += sa1; Zs[b + 1, 0] += sb0; Zs[b + 1, 1] += sb1


@njit(**_FAST)
def _bwd22(W2T, Xs, Zs, Hs, dW1, db1, dW2T, nb, j0, j1):
    """d_in = d_out = 2: accumulate dW2, db1, dW1 of one chunk from stored h, four samples per pass."""
    v0 = W2T[0, j0:j1]; v1 = W2T[1, j0:j1]
    g0 = dW1[0, j0:j1]; g1 = dW1[1, j0:j1]; gc = db1[j0:j1]; u0 = dW2T[0, j0:j1]; u1 = dW2T[1, j0:j1]
    n = j1 - j0
    for b in range(0, nb, 4):
        Ha = Hs[b, j0:j1]; Hb = Hs[b + 1, j0:j1]; Hc = Hs[b + 2, j0:j1]; Hd = Hs[b + 3, j0:j1]
        xa0 = Xs[b, 0]; xa1 = Xs[b, 1]; za0 = Zs[b, 0]; za1 = Zs[b, 1]
        xb0 = Xs[b + 1, 0]; xb1 = Xs[b + 1, 1]; zb0 = Zs[b + 1, 0]; zb1 = Zs[b + 1, 1]
        xc0 = Xs[b + 2, 0]; xc1 = Xs[b + 2, 1]; zc0 = Zs[b + 2, 0]; zc1 = Zs[b + 2, 1]
        xd0 = Xs[b + 3, 0]; xd1 = Xs[b + 3, 1]; zd0 = Zs[b + 3, 0]; zd1 = Zs[b + 3, 1]
        for j in range(n):
            ha = Ha[j]; hb = Hb[j]; hc = Hc[j]; hd = Hd[j]
            # dh = (dz W2^T) * h (1 - h), per sample
            da = (za0 * v0[j] + za1 * v1[j]) * (ha - ha * ha)
            db = (zb0 * v0[j] + zb1 * v1[j]) * (hb - hb * hb)
            dc = (zc0 * v0[j] + zc1 * v1[j]) * (hc - hc * hc)
            dd = (zd0 * v0[j] + zd1 * v1[j]) * (hd - hd * hd)
            u0[j] += za0 * ha + zb0 * hb + zc0 * hc + zd0 * hd
            u1[j] += za1 * ha + zb1 * hb + zc1 * hc + zd1 * hd
            gc[j] += da + db + dc + dd
            g0[j] += xa0 * da + xb0 * db + xc0 * dc + xd0 * dd
            g1[j] += xa1 * da + xb1 * db + xc1 * dc + xd1 * dd


@njit(**_FAST)
def _fwd_any(W1, b1, W2T, X, b0, Zs, Hs, nb, j0, j1):
    """Any d_in, d_out: the forward of one chunk as short vector loops over the chunk."""
    d_in = W1.shape[0]; d_out = W2T.shape[0]
    c = b1[j0:j1]
    n = j1 - j0
    for b in range(nb):
        h = Hs[b, j0:j1]
        for j in range(n):
            h[j] = c[j]
        for i in range(d_in):
            xi = X[b0 + b, i]; w = W1[i, j0:j1]
            for j in range(n):
                h[j] += xi * w[j]
        for j in range(n):
            h[j] = _sigmoid(h[j])
        for k in range(d_out):
            v = W2T[k, j0:j1]
            s = Hs.dtype.type(0.0)   # the sum in the run's precision
            for j in range(n):
                s += h[j] * v[j]
            Zs[b, k] += s


@njit(**_FAST)
def _bwd_any(W2T, X, b0, Zs, Hs, dW1, db1, dW2T, gb, nb, j0, j1):
    """Any d_in, d_out: the backward of one chunk as short vector loops over the chunk."""
    d_in = dW1.shape[0]; d_out = W2T.shape[0]
    gc = db1[j0:j1]
    n = j1 - j0
    for b in range(nb):
        h = Hs[b, j0:j1]
        for j in range(n):
            gb[j] = 0.0
        for k in range(d_out):
            dz = Zs[b, k]; v = W2T[k, j0:j1]; u = dW2T[k, j0:j1]
            for j in range(n):
                gb[j] += dz * v[j]
                u[j] += dz * h[j]
        for j in range(n):
            gb[j] *= h[j] - h[j] * h[j]
            gc[j] += gb[j]
        for i in range(d_in):
            xi = X[b0 + b, i]; g = dW1[i, j0:j1]
            for j in range(n):
                g[j] += xi * gb[j]


@njit(**_FAST)
def _forward_block(W1, b1, W2T, b2, X, b0, nb, Xs, Zs, Hs):
    """Logits of samples b0..b0+nb into Zs and their h into Hs; returns the rows used (nb, padded on the fused path)."""
    d_in, H = W1.shape
    d_out = W2T.shape[0]
    fused = d_in == 2 and d_out == 2
    nbp = (nb + 3) // 4 * 4 if fused else nb   # the fused loops take samples in fours; pad rows are zeros
    for b in range(nbp):
        if fused:
            for i in range(2):
                Xs[b, i] = X[b0 + b, i] if b < nb else 0.0
        for k in range(d_out):
            Zs[b, k] = b2[k]
    for j0 in range(0, H, CH):
        j1 = min(j0 + CH, H)
        if fused:
            _fwd22(W1, b1, W2T, Xs, Zs, Hs, nbp, j0, j1)
        else:
            _fwd_any(W1, b1, W2T, X, b0, Zs, Hs, nbp, j0, j1)
    return nbp


@njit(**_FAST)
def _transpose_into(A, AT):
    """AT[:] = A.T for a tall (n, k) A with small k."""
    n, k = A.shape
    for j in range(n):
        for m in range(k):
            AT[m, j] = A[j, m]


@njit(cache=True)
def _check_labels(y, d_out):
    """Raise on a label outside [0, d_out): boundscheck is off, so it would read/write out of bounds."""
    for b in range(y.shape[0]):
        if y[b] < 0 or y[b] >= d_out:
            raise ValueError("label out of range [0, d_out)")


@njit(**_FAST)
def step_begin(W1, b1, W2, b2, X, y, dW1, db1, dW2, db2, scratch):
    """The first part of a step: check the batch against the layout, W2 transposed into
    the scratch, the gradients zeroed. Then step_rows over the batch, then step_end."""
    W2T, dW2T, Hs, Xs, Zs, gb = scratch
    B = y.shape[0]
    d_in, H = W1.shape
    d_out = W2.shape[1]
    S = Hs.shape[0]
    if (B == 0 or X.shape[0] != B or X.shape[1] != d_in or W2T.shape[0] != d_out or W2T.shape[1] != H
            or Hs.shape[1] != H or S % 4 != 0 or Xs.shape[0] < S or Zs.shape[0] < S or gb.shape[0] < CH):
        raise ValueError("sgd_step: empty batch, or X/scratch do not match the layout (see make_scratch)")
    _check_labels(y, d_out)
    _transpose_into(W2, W2T)
    dW2T[:] = 0.0
    dW1[:] = 0.0
    db1[:] = 0.0
    db2[:] = 0.0


@njit(**_FAST)
def step_rows(W1, b1, W2, b2, X, y, lr, r0, r1, dW1, db1, dW2, db2, scratch, loss):
    """Samples r0..r1-1 of the batch X, y: their gradients (scaled by -lr / the whole
    batch's size) added into the step's, their losses added to `loss`, which is returned.
    r0 must be a multiple of 4: the fused loops take samples in fours (the generic ones
    one by one) and every sum over samples runs in sample order, so any split of the
    batch into calls gives the same Delta-w and loss, bit for bit, as one call over all
    of it (blocks shorter than step_block(scratch) only reload more weights)."""
    W2T, dW2T, Hs, Xs, Zs, gb = scratch
    B = y.shape[0]
    S = Hs.shape[0]
    if r0 % 4 != 0 or r0 < 0 or r1 > B:
        raise ValueError("step_rows: rows must start at a multiple of 4 and lie in the batch")
    scale = -lr / B
    for b0 in range(r0, r1, S):
        nb = min(S, r1 - b0)
        nbp = _forward_block(W1, b1, W2T, b2, X, b0, nb, Xs, Zs, Hs)
        loss = _xent_block(Zs, y, b0, nb, nbp, scale, db2, loss)
        _backward_block(W2T, X, b0, Zs, Hs, Xs, dW1, db1, dW2T, gb, nbp)
    return loss


# _xent_block and _backward_block are inlined by numba, not called: a call to a shared
# helper may go at run time to another compiled copy of it than the caller's own (numba
# links a helper into each caller as a weak symbol, and the first copy loaded wins),
# optimized apart and different in the last bit; a rank that loaded step_rows from the
# cache then computed other bits than the rank that compiled it
# (test_a_step_has_the_same_bits_compiled_or_loaded_from_the_cache), and the
# model-parallel step other bits than make_step.
@njit(inline="always", **_FAST)
def _xent_block(Zs, y, b0, nb, nbp, scale, db2, loss):
    """Softmax cross-entropy of the block's logits Zs (samples b0..b0+nb of y) via
    log-sum-exp (finite for any finite logits): their losses added to `loss`, which is
    returned; Zs becomes dz (scaled by `scale`), pad rows up to nbp zero; dz added into db2."""
    d_out = Zs.shape[1]
    for b in range(nbp):
        if b >= nb:
            for k in range(d_out):
                Zs[b, k] = 0.0      # pad rows: dz = 0, so they add nothing to the gradients
            continue
        m = Zs[b, 0]
        for k in range(1, d_out):
            m = max(m, Zs[b, k])
        s = 0.0
        for k in range(d_out):
            s += math.exp(Zs[b, k] - m)
        yb = y[b0 + b]
        loss += math.log(s) - (Zs[b, yb] - m)
        for k in range(d_out):
            Zs[b, k] = math.exp(Zs[b, k] - m) / s * scale
        Zs[b, yb] -= scale
        for k in range(d_out):
            db2[k] += Zs[b, k]
    return loss


@njit(inline="always", **_FAST)
def _backward_block(W2T, X, b0, Zs, Hs, Xs, dW1, db1, dW2T, gb, nbp):
    """The block's dz (Zs) and stored h (Hs) into the gradients of W1, b1 and W2 (transposed), chunk by chunk."""
    d_in, H = dW1.shape
    fused = d_in == 2 and W2T.shape[0] == 2
    for j0 in range(0, H, CH):
        j1 = min(j0 + CH, H)
        if fused:
            _bwd22(W2T, Xs, Zs, Hs, dW1, db1, dW2T, nbp, j0, j1)
        else:
            _bwd_any(W2T, X, b0, Zs, Hs, dW1, db1, dW2T, gb, nbp, j0, j1)


@njit(**_FAST)
def step_end(dW2, scratch):
    """The last part of a step: the transposed gradient of W2 written into dW2."""
    dW2T = scratch[1]
    H, d_out = dW2.shape
    for j in range(H):
        for k in range(d_out):
            dW2[j, k] = dW2T[k, j]


def step_block(scratch) -> int:
    """The samples of one block of the step (a step_rows call must start at a multiple)."""
    return scratch[2].shape[0]


@njit(**_FAST)
def sgd_step(W1, b1, W2, b2, X, y, lr, dW1, db1, dW2, db2, scratch):
    """Write Delta-w = -lr * grad(mean softmax cross-entropy) into dW1, db1, dW2, db2; return the
    mean loss (= net.reference.step).
    One call of step_begin, step_rows over the whole batch and step_end; the worker calls
    those three itself (mlp.make_step), splitting the middle one while an exchange is in
    flight."""
    step_begin(W1, b1, W2, b2, X, y, dW1, db1, dW2, db2, scratch)
    loss = step_rows(W1, b1, W2, b2, X, y, lr, 0, y.shape[0], dW1, db1, dW2, db2, scratch, 0.0)
    step_end(dW2, scratch)
    return loss / y.shape[0]


# -- one slice of a model-parallel replica (mlp.ModelParallelStep) ------------------
# The step above cut where a replica sums its members' partial logits: the forward over
# the whole batch first, keeping h for all of it (batch x the slice's units, so the
# backward needs no second exp), then the caller's sum, then the softmax and the
# backward. Same block kernels, same order of every sum over samples and units, so one
# slice holding the whole model gives step_rows' bits, and any split of either half
# into calls (rows starting at multiples of 4) gives the same bits as one call.

def make_mp_scratch(batch: int, d_hidden: int, d_out: int, dtype=np.float64):
    """Work arrays of a model-parallel slice: (W2T, dW2T, Hb, Xb, Zb, gb) as make_scratch's,
    but h (Hb), the padded X rows (Xb) and the logits/dz (Zb) for the whole batch, rows
    rounded up to a multiple of 4 (the fused loops' pad rows)."""
    rows = (batch + 3) // 4 * 4
    return (np.empty((d_out, d_hidden), dtype), np.empty((d_out, d_hidden), dtype), np.empty((rows, d_hidden), dtype),
            np.empty((rows, 2), dtype), np.empty((rows, d_out), dtype), np.empty(CH, dtype))


def mp_block(batch: int, d_hidden: int) -> int:
    """Samples per block of the model-parallel kernels (the unit of a progress split): step_rows'."""
    return int(_block_rows(batch, d_hidden))


@njit(**_FAST)
def mp_forward_begin(W1, W2, X, scratch):
    """Check a batch against the slice and its scratch; W2 transposed into the scratch
    (the backward uses this copy: w may change before it runs)."""
    W2T, dW2T, Hb, Xb, Zb, gb = scratch
    B = X.shape[0]
    d_in, H = W1.shape
    d_out = W2.shape[1]
    rows = (B + 3) // 4 * 4
    if (B == 0 or X.shape[1] != d_in or W2.shape[0] != H or W2T.shape[0] != d_out or W2T.shape[1] != H
            or dW2T.shape[0] != d_out or dW2T.shape[1] != H or Hb.shape[1] != H or Zb.shape[1] != d_out
            or Hb.shape[0] < rows or Xb.shape[0] < rows or Zb.shape[0] < rows or gb.shape[0] < CH):
        raise ValueError("mp_forward: empty batch, or X/scratch do not match the slice (see make_mp_scratch)")
    _transpose_into(W2, W2T)


@njit(**_FAST)
def mp_forward_rows(W1, b1, b2, X, r0, r1, S, scratch):
    """Samples r0..r1-1 (r0 a multiple of 4), S at a time: their h into the scratch's Hb
    and their logits over this slice's units, plus b2 (zeros on all slices but one),
    into its Zb."""
    W2T, dW2T, Hb, Xb, Zb, gb = scratch
    if r0 % 4 != 0 or r0 < 0 or r1 > X.shape[0] or S <= 0 or S % 4 != 0:
        raise ValueError("mp_forward_rows: rows must start at a multiple of 4 and lie in the batch")
    for b0 in range(r0, r1, S):
        _forward_block(W1, b1, W2T, b2, X, b0, min(S, r1 - b0), Xb[b0:], Zb[b0:], Hb[b0:])


@njit(**_FAST)
def mp_backward_begin(y, dW1, db1, db2, scratch):
    """Check the labels against the scratch (the forward's batch); the gradients zeroed."""
    W2T, dW2T, Hb, Xb, Zb, gb = scratch
    d_out, H = W2T.shape
    if (y.shape[0] == 0 or Zb.shape[0] < y.shape[0] or dW1.shape[1] != H or db1.shape[0] != H
            or db2.shape[0] != d_out):
        raise ValueError("mp_backward: empty batch, or the gradients do not match the slice")
    _check_labels(y, d_out)
    dW2T[:] = 0.0
    dW1[:] = 0.0
    db1[:] = 0.0
    db2[:] = 0.0


@njit(**_FAST)
def mp_backward_rows(X, y, lr, r0, r1, S, dW1, db1, db2, scratch, loss):
    """Samples r0..r1-1 (r0 a multiple of 4), S at a time, from their summed logits in the
    scratch's Zb: their losses added to `loss`, which is returned, and their gradients
    (scaled by -lr / the batch's size) added into the slice's (dW2's transposed, in the
    scratch: step_end writes it out). X and y are the forward's batch."""
    W2T, dW2T, Hb, Xb, Zb, gb = scratch
    B = y.shape[0]
    if r0 % 4 != 0 or r0 < 0 or r1 > B or S <= 0 or S % 4 != 0:
        raise ValueError("mp_backward_rows: rows must start at a multiple of 4 and lie in the batch")
    scale = -lr / B
    fused = dW1.shape[0] == 2 and W2T.shape[0] == 2
    for b0 in range(r0, r1, S):
        nb = min(S, r1 - b0)
        nbp = (nb + 3) // 4 * 4 if fused else nb   # the forward's pad rows (the batch's last block)
        loss = _xent_block(Zb[b0:], y, b0, nb, nbp, scale, db2, loss)
        _backward_block(W2T, X, b0, Zb[b0:], Hb[b0:], Xb[b0:], dW1, db1, dW2T, gb, nbp)
    return loss


@njit(**_FAST)
def evaluate(W1, b1, W2, b2, X, y):
    """(mean cross-entropy, accuracy) over a whole held-out set, in blocks so memory is
    O(d_hidden), not O(n d_hidden)."""
    n = X.shape[0]
    H = W1.shape[1]
    d_out = W2.shape[1]
    if n == 0 or y.shape[0] != n or X.shape[1] != W1.shape[0]:
        raise ValueError("evaluate: empty set, or X/y do not match the layout")
    _check_labels(y, d_out)
    W2T = np.empty((d_out, H), W2.dtype)
    _transpose_into(W2, W2T)
    S = _block_rows(n, H)
    Hs = np.empty((S, H), W1.dtype)
    Xs = np.empty((S, 2), W1.dtype)
    Zs = np.empty((S, d_out), W1.dtype)
    loss = 0.0
    correct = 0
    for b0 in range(0, n, S):
        nb = min(S, n - b0)
        _forward_block(W1, b1, W2T, b2, X, b0, nb, Xs, Zs, Hs)
        for b in range(nb):
            m = Zs[b, 0]
            best = 0
            for k in range(1, d_out):
                if Zs[b, k] > m:        # first maximum wins, as np.argmax
                    m = Zs[b, k]
                    best = k
            s = 0.0
            for k in range(d_out):
                s += math.exp(Zs[b, k] - m)
            loss += math.log(s) - (Zs[b, y[b0 + b]] - m)
            correct += best == y[b0 + b]
    return loss / n, correct / n


@njit(boundscheck=False, cache=True)
def add_into(w, dw):
    """w += dw in place (the server's aggregation; one streaming pass, vectorized)."""
    if w.size != dw.size:
        raise ValueError("add_into: sizes differ")
    for i in range(w.size):
        w[i] += dw[i]


# reassoc vectorizes the sum; without nnan x*0 is not folded
@njit(fastmath={"reassoc"}, boundscheck=False, cache=True)
def all_finite(a):
    """True iff a has no NaN or inf: x*0 is 0 for finite x and NaN otherwise, summed branch-free
    (in a's dtype: a float32 array is checked in float32 lanes)."""
    zero = a.dtype.type(0.0)
    s = zero
    for i in range(a.size):
        s += a[i] * zero
    return s == zero


@njit(boundscheck=False, cache=True)
def add_scaled(w, dw, a):
    """w += a * dw in place: a sync server's weighted average, one worker at a time. In w's
    dtype: a is rounded to it once, so a float32 w is summed in float32 lanes (a float64 a
    would lift every product to float64). Each value is then within u |w'| + 2u |a dw| of the
    exact w + a dw (u: the dtype's unit roundoff, 2^-24 in float32: a's rounding and the
    product's, then the sum's), where a float64 product erred u |w'| only."""
    if w.size != dw.size:
        raise ValueError("add_scaled: size mismatch")
    a = w.dtype.type(a)
    for i in range(w.size):
        w[i] += a * dw[i]


# -- server-side optimizers: w moves along d = -gradient (for sgd, d = -lr * gradient) ----
# An update moves w into `out` (the server's next version of its shard: w itself stays as
# it was, the version a reply may still be reading; out None: w in place) and refuses a d
# with NaN or inf, having changed nothing: a refused update costs no copy and no undo. d is
# scaled by `scale` as it is read (sync's and allreduce's means), never in place.
# sgd, which keeps no state, does it in one pass: d goes in blocks of _BLOCK values, each
# checked, then used while it is still in L1, so d crosses the memory bus once (a bad
# block found late leaves only `out`, scratch until True, partly written).
# momentum, adagrad and adam check all of d first (all_finite: one read of d, which the
# update then finds in cache: at 400 KB in L2, at 4 MB in L3), then move their state in
# place. Double-buffering the state instead (a single pass writing the next state into
# other buffers, swapped in on success) moves two more streams per state array than this
# pass moves (the new buffers' write-allocate reads): adam 10 line transfers a value
# against 8 (+ d again from cache), adagrad 7 against 6; measured here in float32
# (2026-11-28, 2 shared cores, load ~15, ABAB medians of 9, CPU lock): adam over sgd per
# update 3.25x -> 2.48x at 400 KB and 3.54x -> 2.81x at 4 MB, adagrad 2.12x -> 1.78x and
# 1.96x -> 1.85x. adam's floor is 7 arrays moved against sgd's 3 (2.33x): it is
# bandwidth-bound at both sizes (a 400 KB shard's 7 arrays are 2.8 MB, past the 1 MB L2).
# Each update's loop is a plain loop over slices (the `_*_block` kernels): written inline
# as range(a, b) over the whole arrays, LLVM left the loop scalar, 2.5x (sgd) to 4x
# (adagrad) slower at 400 KB (measured here, timing Optimizer.update alone). In place
# (out None) they go through a block-sized scratch, so that the loop's stores never
# alias its loads (aliased, LLVM's runtime check would send it down its scalar path).
# error_model="numpy": with numba's default ("python") every division checks for a zero
# divisor, which keeps the loop scalar (adagrad and adam moved 4x less, bench_server.py).
# The divisor is >= eps > 0, so nothing changes but the speed: sqrt and division stay
# exact (no fastmath beyond contraction). Looser flags bought nothing: with
# {"contract", "arcp", "afn"} LLVM still emits vsqrtps and vdivps on 16 lanes (zmm); with
# "ninf" too the division becomes vrcp14ps and a Newton step, and adam's update took as
# long (2026-11-28, as above: 3.44x sgd against 3.30x exact, at 400 KB): memory, not the
# square root or the division, bounds it.
# Precision: every scalar comes in w's dtype (Optimizer.update casts lr, eps, the betas
# and the scales; Adam's lr, eps and bias corrections come folded into two, a and e, made
# in float64 and rounded once each), so a float32 shard is updated in float32
# arithmetic throughout, 16 lanes to an AVX-512 register where float64 had 8: sqrt and
# division are IEEE float32's, correctly rounded. What that costs in accuracy, per update:
# each value computed is within (its roundings) x 2^-24 relative of the same update done
# in float64 from the same float32 inputs (adagrad's step: 6.5 roundings; Adam's: 7.5,
# against the exact float64 lr, eps and corrections; tests/test_optimizers.py pins both),
# far inside what an optimizer needs, whose step size is a learning rate tuned by factors
# of 2 and is perturbed far more by the staleness of an asynchronous push; summed over T
# updates, adagrad's G drifts at most T x 2^-24 relative (its terms are positive): after
# 10^5 updates, its step within 0.3 %.

_BLOCK = 512   # values of d checked, then used: 4 KB of float64 (2 KB of float32), in L1 between the two
_EXACT = dict(boundscheck=False, error_model="numpy", cache=True)   # sgd, momentum: no contraction, as before
_OPT = dict(_EXACT, fastmath={"contract"})                           # adagrad, adam


@njit(fastmath={"reassoc"}, boundscheck=False, cache=True)   # reassoc vectorizes the sum
def _finite_block(d):
    """d has no NaN or inf (x*0 is 0 for finite x, NaN otherwise; summed branch-free, in d's dtype)."""
    zero = d.dtype.type(0.0)
    s = zero
    for i in range(d.size):
        s += d[i] * zero
    return s == zero


@njit(boundscheck=False, cache=True)
def _sizes_agree(n, *arrays):
    for a in arrays:
        if a.size != n:
            return False
    return True


@njit(**_EXACT)
def _sgd_block(w, d, out, scale):
    for i in range(w.size):
        out[i] = w[i] + scale * d[i]


@njit(**_EXACT)
def sgd_update(w, d, out, scale):
    """out = w + scale d, d checked in the same pass; False (out scratch) if d is not finite."""
    n = w.size
    if not _sizes_agree(n, d) or (out is not None and out.size != n):
        raise ValueError("sgd_update: sizes differ")
    tmp = np.empty(_BLOCK if out is None else 0, w.dtype)   # in place: each block through L1 (see above)
    for a in range(0, n, _BLOCK):
        b = min(a + _BLOCK, n)
        if not _finite_block(d[a:b]):
            return False
        if out is None:
            _sgd_block(w[a:b], d[a:b], tmp[:b - a], scale)
            w[a:b] = tmp[:b - a]
        else:
            _sgd_block(w[a:b], d[a:b], out[a:b], scale)
    return True


@njit(**_EXACT)
def _momentum_block(w, v, d, out, lr, mu, scale):
    for i in range(w.size):
        vi = mu * v[i] + lr * (scale * d[i])
        v[i] = vi
        out[i] = w[i] + vi


@njit(**_EXACT)
def momentum_update(w, v, d, out, lr, mu, scale):
    """Heavy-ball momentum: v = mu v + lr d in place; out = w + v; False (nothing changed) if d
    is not finite."""
    n = w.size
    if not _sizes_agree(n, v, d) or (out is not None and out.size != n):
        raise ValueError("momentum_update: sizes differ")
    if not all_finite(d):
        return False
    if out is not None:
        _momentum_block(w, v, d, out, lr, mu, scale)
        return True
    tmp = np.empty(_BLOCK, w.dtype)   # in place: through a scratch block (see above)
    for a in range(0, n, _BLOCK):
        b = min(a + _BLOCK, n)
        _momentum_block(w[a:b], v[a:b], d[a:b], tmp[:b - a], lr, mu, scale)
        w[a:b] = tmp[:b - a]
    return True


@njit(**_OPT)
def _adagrad_block(w, g2, d, out, lr, eps, scale):
    for i in range(w.size):
        di = scale * d[i]
        s = g2[i] + di * di
        g2[i] = s
        out[i] = w[i] + lr * di / (math.sqrt(s) + eps)


@njit(**_OPT)
def adagrad_update(w, g2, d, out, lr, eps, scale):
    """Adagrad (Duchi et al. 2011; DistBelief's Downpour SGD): g2 = g2 + d^2 in place;
    out = w + lr d / (sqrt(g2) + eps); False (nothing changed) if d is not finite."""
    n = w.size
    if not _sizes_agree(n, g2, d) or (out is not None and out.size != n):
        raise ValueError("adagrad_update: sizes differ")
    if not all_finite(d):
        return False
    if out is not None:
        _adagrad_block(w, g2, d, out, lr, eps, scale)
        return True
    tmp = np.empty(_BLOCK, w.dtype)   # in place: through a scratch block (see above)
    for a in range(0, n, _BLOCK):
        b = min(a + _BLOCK, n)
        _adagrad_block(w[a:b], g2[a:b], d[a:b], tmp[:b - a], lr, eps, scale)
        w[a:b] = tmp[:b - a]
    return True


@njit(**_OPT)
def _adam_block(w, m, v, d, out, a, b1, b2, e, scale):
    one = w.dtype.type(1.0)   # a literal 1.0 is float64: it would lift a float32 update to float64
    for i in range(w.size):
        di = scale * d[i]
        mi = b1 * m[i] + (one - b1) * di
        vi = b2 * v[i] + (one - b2) * di * di
        m[i] = mi
        v[i] = vi
        out[i] = w[i] + a * mi / (math.sqrt(vi) + e)


@njit(**_OPT)
def adam_update(w, m, v, d, out, a, b1, b2, e, scale):
    """Adam (Kingma & Ba 2015), step t >= 1: m = b1 m + (1-b1) d; v = b2 v + (1-b2) d^2, in
    place; out = w + lr m^ / (sqrt(v^) + eps), with the bias corrections m^ = m c1, v^ = v c2,
    c1 = 1/(1-b1^t), c2 = 1/(1-b2^t), taken as out = w + a m / (sqrt(v) + e) with the caller's
    a = lr c1 / sqrt(c2) and e = eps / sqrt(c2) (the same quantity: sqrt(v c2) = sqrt(v) sqrt(c2);
    computed in float64 and rounded once each, so no value pays for the corrections); False
    (nothing changed) if d is not finite."""
    n = w.size
    if not _sizes_agree(n, m, v, d) or (out is not None and out.size != n):
        raise ValueError("adam_update: sizes differ")
    if not all_finite(d):
        return False
    if out is not None:
        _adam_block(w, m, v, d, out, a, b1, b2, e, scale)
        return True
    tmp = np.empty(_BLOCK, w.dtype)   # in place: through a scratch block (see above)
    for i in range(0, n, _BLOCK):
        j = min(i + _BLOCK, n)
        _adam_block(w[i:j], m[i:j], v[i:j], d[i:j], tmp[:j - i], a, b1, b2, e, scale)
        w[i:j] = tmp[:j - i]
    return True


# -- 1-bit quantization with error feedback (Seide et al. 2014; --compress 1bit) ---------
# A vector is quantized column by column; cols[c] = (start, count, stride) picks column c's
# elements v[start + t * stride], t < count (net.mlp.Layout.columns: a layer's line along
# the hidden dimension). Each element becomes one bit: x > 0 or not; a column's two
# reconstruction values are the means of its positive and of its other elements (the least
# squares choice for that split, Seide et al.'s). Each column's bits start a new byte
# (asgd.core.wire.column_bits_bytes), its t-th element in bit t % 8 of its byte t // 8. The loops are
# branch-free (selects) and go eight elements to a byte, so they run at about a
# nanosecond a value; a column's sums may be added in any order (reassoc).

_Q = dict(fastmath={"reassoc"}, boundscheck=False, cache=True)


@njit(**_Q)
def _split_means(v, r, sign, start, count, stride):
    """(mean of x > 0, mean of the rest) over x = v + sign * r along one column."""
    sp = 0.0
    sn = 0.0
    npos = 0
    for t in range(count):
        i = start + t * stride
        x = v[i] + sign * r[i]
        p = x > 0.0
        sp += x if p else 0.0
        sn += 0.0 if p else x
        npos += 1 if p else 0
    ap = sp / npos if npos > 0 else 0.0
    an = sn / (count - npos) if count > npos else 0.0
    return ap, an


@njit(**_Q)
def quantize_1bit(v, residual, cols, scales, bits):
    """Quantize x = v + residual into scales (2 per column: the mean of x > 0, the mean
    of the rest) and bits; residual becomes x - its reconstruction (error feedback: the
    part not sent is added to the next v). A NaN in x makes its column's scales NaN.
    Returns the bytes of bits written."""
    byte = 0
    for c in range(cols.shape[0]):
        start, count, stride = cols[c, 0], cols[c, 1], cols[c, 2]
        ap, an = _split_means(v, residual, 1.0, start, count, stride)
        scales[2 * c] = ap
        scales[2 * c + 1] = an
        for b in range((count + 7) // 8):
            acc = 0
            base = start + 8 * b * stride
            if 8 * b + 8 <= count:   # a whole byte: a fixed trip count, unrolled
                for k in range(8):
                    i = base + k * stride
                    x = v[i] + residual[i]
                    p = np.int64(x > 0.0)
                    acc |= p << k
                    residual[i] = x - scales[2 * c + 1 - p]   # a load, not a branch on random signs
            else:
                for k in range(count - 8 * b):
                    i = base + k * stride
                    x = v[i] + residual[i]
                    p = np.int64(x > 0.0)
                    acc |= p << k
                    residual[i] = x - scales[2 * c + 1 - p]   # a load, not a branch on random signs
            bits[byte + b] = acc
        byte += (count + 7) // 8
    return byte


@njit(**_Q)
def quantize_diff_1bit(w, view, cols, scales, bits):
    """The reply's quantization: x = w - view, quantized as quantize_1bit does; view
    then moves by x's reconstruction (view += it), exactly as the receiver's
    dequantize_1bit(..., add=True) moves its copy, so the two stay equal bit for bit,
    and what was not sent stays in w - view for the next reply (error feedback)."""
    byte = 0
    for c in range(cols.shape[0]):
        start, count, stride = cols[c, 0], cols[c, 1], cols[c, 2]
        ap, an = _split_means(w, view, -1.0, start, count, stride)
        scales[2 * c] = ap
        scales[2 * c + 1] = an
        for b in range((count + 7) // 8):
            acc = 0
            base = start + 8 * b * stride
            if 8 * b + 8 <= count:
                for k in range(8):
                    i = base + k * stride
                    p = np.int64(w[i] - view[i] > 0.0)
                    acc |= p << k
                    view[i] = view[i] + scales[2 * c + 1 - p]
            else:
                for k in range(count - 8 * b):
                    i = base + k * stride
                    p = np.int64(w[i] - view[i] > 0.0)
                    acc |= p << k
                    view[i] = view[i] + scales[2 * c + 1 - p]
            bits[byte + b] = acc
        byte += (count + 7) // 8
    return byte


@njit(**_Q)
def dequantize_1bit(cols, scales, bits, out, add):
    """out[i] = (add: out[i] +) the reconstruction of element i: its column's first scale
    where its bit is set, the second where not. Returns the bytes of bits read."""
    byte = 0
    for c in range(cols.shape[0]):
        start, count, stride = cols[c, 0], cols[c, 1], cols[c, 2]
        for b in range((count + 7) // 8):
            acc = bits[byte + b]
            base = start + 8 * b * stride
            for k in range(min(8, count - 8 * b)):
                i = base + k * stride
                a = scales[2 * c + 1 - ((acc >> k) & 1)]
                out[i] = (out[i] + a) if add else a
        byte += (count + 7) // 8
    return byte
