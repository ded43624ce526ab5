"""The numba kernels against the plain-numpy oracle in mlp.py and against finite differences."""

import subprocess
import sys

import numpy as np
import pytest

from asgd.net import kernels as K
from asgd.net.mlp import Layout, init_params
from asgd.net.reference import predict as reference_predict, step as reference_step


def _data(layout, n, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, layout.d_in)), rng.integers(0, layout.d_out, n)


def _both(layout, w, X, y, lr, scratch_batch):
    """Run the numba step (dw prefilled with NaN: it must overwrite all of it) and the reference."""
    dw_ref = np.empty(layout.n_w)
    loss_ref = reference_step(layout, w, X, y, lr, dw_ref)
    dw = np.full(layout.n_w, np.nan)
    scratch = K.make_scratch(scratch_batch, layout.d_hidden, layout.d_out)
    loss = K.sgd_step(*layout.views(w), X, y, lr, *layout.views(dw), scratch)
    return loss, dw, loss_ref, dw_ref


@pytest.mark.parametrize("d_in,d_h,d_out,batch,scratch_batch", [
    (2, 10000, 2, 256, 256),   # the paper's 2-10K-2: fused path, several sample blocks
    (2, 1000, 2, 37, 64),      # partial last batch, not a multiple of 4 (padded rows), H not a multiple of CH
    (2, 300, 2, 1, 256),       # batch 1
    (2, 700, 3, 33, 33),       # d_out 3: generic path
    (3, 50, 4, 16, 16),        # d_out 4, d_in 3
    (1, 513, 2, 70, 64),       # d_in 1, batch larger than the scratch's block
])
def test_step_matches_reference(d_in, d_h, d_out, batch, scratch_batch):
    layout = Layout(d_in, d_h, d_out)
    w = init_params(layout, seed=d_h)
    X, y = _data(layout, batch, seed=batch)
    loss, dw, loss_ref, dw_ref = _both(layout, w, X, y, 0.05, scratch_batch)
    assert np.isfinite(loss) and loss > 0
    assert loss == pytest.approx(loss_ref, rel=1e-12)
    for got, ref in zip(layout.views(dw), layout.views(dw_ref)):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12 * np.abs(dw_ref).max())


U32 = 2.0 ** -24   # float32's unit roundoff


@pytest.mark.parametrize("d_in,d_h,d_out,batch", [(2, 10000, 2, 256), (2, 1000, 2, 37), (2, 700, 3, 33)])
def test_a_float32_step_matches_the_float64_reference_within_its_sums_roundings(d_in, d_h, d_out, batch):
    """--precision float32: the kernels' float32 step against the float64 reference on the
    same (float32) w and X. Every value of a step is a sum: a logit of d_h products
    h_j W2_jk, each gradient entry of the batch's products carrying those logits' errors.
    A float32 sum of n terms errs by at most n u times the sum of its terms' magnitudes
    (Higham's gamma_n, u = 2^-24), and at initialization those magnitudes are the largest
    gradient's scale: so atol = (d_h + batch) u max|dw|, and the loss (a mean of log-sum-
    exps of the logits) within d_h u of itself (the sigmoid's exp adds 9.1e-8 < 2u per h)."""
    layout = Layout(d_in, d_h, d_out)
    w = init_params(layout, seed=d_h, dtype=np.float32)
    X, y = _data(layout, batch, seed=batch)
    X = X.astype(np.float32)
    dw_ref = np.empty(layout.n_w)
    loss_ref = reference_step(layout, w.astype(np.float64), X.astype(np.float64), y, 0.05, dw_ref)
    dw = np.full(layout.n_w, np.nan, np.float32)
    scratch = K.make_scratch(batch, d_h, d_out, np.float32)
    loss = K.sgd_step(*layout.views(w), X, y, 0.05, *layout.views(dw), scratch)
    assert dw.dtype == np.float32 and np.isfinite(dw).all()
    assert loss == pytest.approx(loss_ref, rel=(d_h + 2) * U32)
    np.testing.assert_allclose(dw, dw_ref, rtol=0, atol=(d_h + batch) * U32 * np.abs(dw_ref).max())


def test_the_float32_step_runs_in_float32_vector_lanes(float32_step_llvm):
    """The float32 specialization of the step's rows (the worker's: mlp.make_step) computes
    its hot loops in float32: the sigmoid's exp is _vexp32, vectorized (its 2^k a shift by
    23 of int32 lanes, not float64's by 52 of int64 lanes), and the sums are float32
    vectors (a float64 literal in the loop would lift them to double and halve the lanes;
    only the per-sample softmax over d_out values stays float64). The IR: conftest's
    float32_step_llvm, from the compile the cold-cache tests share."""
    import re
    code = float32_step_llvm
    assert re.search(r"shl <\d+ x i32> [^\n]*i32 23", code), "the float32 exp did not vectorize"
    assert not re.search(r"shl <\d+ x i64> [^\n]*i64 52", code), "float64's exp in the float32 step"
    assert re.search(r"fmul[^\n]*<\d+ x float>", code), "no float32 vector multiply in the float32 step"


def test_scratch_is_reusable_across_batch_sizes():
    layout = Layout(2, 600, 2)
    w = init_params(layout, 1)
    scratch = K.make_scratch(64, 600, 2)
    for batch in (64, 13, 64, 2):   # full batches, then the short last batch of an epoch
        X, y = _data(layout, batch, seed=batch)
        dw_ref = np.empty(layout.n_w)
        loss_ref = reference_step(layout, w, X, y, 0.1, dw_ref)
        dw = np.empty(layout.n_w)
        assert K.sgd_step(*layout.views(w), X, y, 0.1, *layout.views(dw), scratch) == pytest.approx(loss_ref, rel=1e-12)
        np.testing.assert_allclose(dw, dw_ref, rtol=1e-9, atol=1e-12 * np.abs(dw_ref).max())


def test_gradient_matches_central_differences():
    layout = Layout(3, 7, 4)
    w = init_params(layout, 3)
    X, y = _data(layout, 9, seed=4)
    scratch = K.make_scratch(9, 7, 4)
    dw = np.empty(layout.n_w)

    def loss(v):
        return K.sgd_step(*layout.views(v), X, y, 1.0, *layout.views(np.empty(layout.n_w)), scratch)

    K.sgd_step(*layout.views(w), X, y, 1.0, *layout.views(dw), scratch)   # lr = 1: dw = -grad
    eps = 1e-6
    fd = np.empty(layout.n_w)
    for i in range(layout.n_w):
        wp, wm = w.copy(), w.copy()
        wp[i] += eps
        wm[i] -= eps
        fd[i] = (loss(wp) - loss(wm)) / (2 * eps)
    np.testing.assert_allclose(-dw, fd, rtol=1e-6, atol=1e-8)
    assert np.abs(fd).max() > 1e-3   # the check is not vacuous


@pytest.mark.parametrize("d_in,d_h,d_out,n", [(2, 1000, 2, 3001), (3, 40, 4, 517)])
def test_evaluate_matches_reference_predict(d_in, d_h, d_out, n):
    layout = Layout(d_in, d_h, d_out)
    w = init_params(layout, 5)
    X, y = _data(layout, n, seed=6)
    p = reference_predict(layout, w, X)
    loss, acc = K.evaluate(*layout.views(w), X, y)
    assert loss == pytest.approx(np.mean(-np.log(p[np.arange(n), y])), rel=1e-12)
    # the same count of correct predictions (acc is count/n, np.mean sums pairwise: the two
    # quotients may differ in the last bit)
    assert round(acc * n) == np.sum(p.argmax(axis=1) == y)
    assert acc == pytest.approx(np.mean(p.argmax(axis=1) == y), rel=1e-15)
    assert 0.0 < acc < 1.0


def test_extreme_logits_and_saturated_sigmoid_stay_finite():
    layout = Layout(2, 400, 3)
    w = init_params(layout, 7)
    W1, b1, W2, b2 = layout.views(w)
    W2 *= 400.0                      # logits in the hundreds
    X, y = _data(layout, 40, seed=8)
    X *= 300.0                       # pre-activations far beyond exp's range: sigmoid saturates
    with np.errstate(over="ignore"):
        p = reference_predict(layout, w, X)
        loss, dw, loss_ref, dw_ref = _both(layout, w, X, y, 0.1, 40)
    z = np.abs(np.log(p[p > 0]))
    assert z.max() > 100                               # the test really is extreme
    assert np.isfinite(loss) and loss > 50 and np.all(np.isfinite(dw))
    assert loss == pytest.approx(loss_ref, rel=1e-9)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-9, atol=1e-12 * np.abs(dw_ref).max())
    assert np.isfinite(K.evaluate(*layout.views(w), X, y)[0])


def test_nan_in_w_reaches_dw():
    layout = Layout(2, 100, 2)
    w = init_params(layout, 9)
    w[5] = np.nan                    # a diverged worker: the server must see it in Delta-w
    X, y = _data(layout, 8, seed=9)
    dw = np.zeros(layout.n_w)
    loss = K.sgd_step(*layout.views(w), X, y, 0.1, *layout.views(dw), K.make_scratch(8, 100, 2))
    assert np.isnan(loss)
    assert not K.all_finite(dw)


def test_bad_labels_raise():
    layout = Layout(2, 100, 2)
    w = init_params(layout, 0)
    X, y = _data(layout, 8, seed=0)
    y[3] = 2
    with pytest.raises(ValueError):
        K.sgd_step(*layout.views(w), X, y, 0.1, *layout.views(np.empty(layout.n_w)), K.make_scratch(8, 100, 2))
    with pytest.raises(ValueError):
        K.evaluate(*layout.views(w), X, y)


def test_add_into():
    rng = np.random.default_rng(10)
    w, dw = rng.normal(size=1003), rng.normal(size=1003)
    expect = w + dw
    K.add_into(w, dw)
    np.testing.assert_array_equal(w, expect)
    shard = w[101:900]               # a server shard is a contiguous slice of w
    expect = shard + dw[:799]
    K.add_into(shard, dw[:799])
    np.testing.assert_array_equal(w[101:900], expect)


def test_all_finite():
    a = np.random.default_rng(11).normal(size=1001) * 1e300
    assert K.all_finite(a) and K.all_finite(a[:0])
    for bad in (np.nan, np.inf, -np.inf):
        for i in (0, 500, 1000):     # vector body and scalar tail
            b = a.copy()
            b[i] = bad
            assert not K.all_finite(b)


def test_vexp_against_numpy():
    x = np.concatenate([np.linspace(-708, 709, 1_000_001), np.linspace(-1, 1, 100_001), [0.0, 1e-300, -1e-300]])
    out = np.empty_like(x)
    K.exp_into(x, out)
    assert np.max(np.abs(out / np.exp(x) - 1)) < 1e-15
    out = np.empty(4)
    K.exp_into(np.array([-1e4, 1e4, np.nan, -np.inf]), out)
    assert 0 < out[0] < 1e-300 and np.isfinite(out[1]) and out[1] > 1e307   # clamped, not 0/inf
    assert np.isnan(out[2]) and 0 < out[3] < 1e-300


def test_vexp_in_float32_against_float64s_exp():
    """The float32 exp (_vexp32, the float32 step's): within 9.1e-8 of float64's exp of the
    same float32 x (net.kernels documents it: under float32's ulp at 1, 2^-23), over the
    range it does not clamp; clamped and NaN as the float64 one."""
    x = np.concatenate([np.linspace(-87, 88, 2_000_001), np.linspace(-1, 1, 100_001), [0.0, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    K.exp_into(x, out)
    assert out.dtype == np.float32
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(out / ref - 1)) <= 9.2e-8
    out = np.empty(4, np.float32)
    K.exp_into(np.array([-1e4, 1e4, np.nan, -np.inf], np.float32), out)
    assert 0 < out[0] < 1e-37 and np.isfinite(out[1]) and out[1] > 1e38   # clamped, not 0/inf
    assert np.isnan(out[2]) and 0 < out[3] < 1e-37


def test_the_warm_up_compiles_every_kernel_a_run_calls():
    """After the warm-up train does before its timed loop, the kernels called with the
    loop's own argument types (a shard view of w, a receive buffer's Delta-w part) have
    nothing left to compile or load: the first timed update pays no JIT."""
    code = """
import os
import subprocess
import sys

import numpy as np
from asgd.net import kernels, mlp
mlp.compile_kernels()
names = ["step_begin", "step_rows", "step_end", "evaluate", "add_into", "all_finite", "add_scaled",
         "quantize_1bit", "quantize_diff_1bit", "dequantize_1bit",
         "sgd_update", "momentum_update", "adagrad_update", "adam_update"]
before = {n: len(getattr(kernels, n).signatures) for n in names}
w, buf = np.zeros(1000), np.zeros(600 + 5)  # a shard of w; a push: [Delta-w | header]
kernels.all_finite(buf[:600]); kernels.add_into(w[400:], buf[:600]); kernels.add_scaled(w[400:], buf[:600], 0.5)
from asgd.net.optimizers import Optimizer   # a server's update: its versions [w | header], a push's Delta-w
versions = [np.zeros(600 + 3) for _ in range(2)]
for name in ("sgd", "momentum", "adagrad", "adam"):
    Optimizer(name, 0.1, 600).update(versions[0][:600], buf[:600], versions[1][:600])
    Optimizer(name, 0.1, 600).update(w[400:], buf[:600], versions[1][:600], 0.5)
from asgd.protocol import onebit    # 1-bit messages: slices of w, the float64 and byte parts of a message
layout = mlp.Layout(2, 100, 2); n = layout.n_w
c = onebit.codecs(layout, [(0, 200), (200, n)], 5)[1]
msg, v, r = c.buffer(), np.zeros(n), np.zeros(n)
c.encode(v[200:], r[200:], msg); c.encode_diff(v[200:], r[200:], msg); c.decode(msg, v[200:], add=True)
c.decode(msg, np.empty(n - 200)); c.finite(msg)
after = {n: len(getattr(kernels, n).signatures) for n in names}
print(before, after)
assert all(before.values()), before
assert before == after, (before, after)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("d_in,d_h,d_out,batch", [(2, 10000, 2, 256), (2, 1000, 2, 37), (3, 300, 4, 50)])
def test_a_step_split_by_progress_is_the_same_step(d_in, d_h, d_out, batch):
    """mlp.make_step with progress (step_rows over a few samples at a time, as many calls
    as progress says False) against the unsplit step: Delta-w and the loss bit for bit;
    and step_rows over any split at multiples of 4 likewise."""
    from asgd.net.mlp import make_step
    layout = Layout(d_in, d_h, d_out)
    w = init_params(layout, 5)
    X, y = _data(layout, batch, seed=6)
    step = make_step(layout, batch)
    whole = np.full(layout.n_w, np.nan)
    loss_whole = step(w, X, y, 0.05, whole)
    for answers in ([False] * 1000, [False, False, True], [True]):
        calls = []

        def progress():
            calls.append(1)
            return answers[min(len(calls), len(answers)) - 1]
        split = np.full(layout.n_w, np.nan)
        loss = step(w, X, y, 0.05, split, progress=progress)
        np.testing.assert_array_equal(split, whole)
        assert loss == loss_whole
        assert 1 <= len(calls) <= min(len(answers), -(-batch // 4))   # before each call, until it says done
    scratch = K.make_scratch(batch, d_h, d_out)
    rng = np.random.default_rng(7)
    for _ in range(3):
        cuts = np.unique(np.concatenate([[0, batch], 4 * rng.integers(0, -(-batch // 4), 5)]))
        cuts = cuts[cuts <= batch]
        V, D = layout.views(w), layout.views(np.full(layout.n_w, np.nan))
        K.step_begin(*V, X, y, *D, scratch)
        loss = 0.0
        for a, b in zip(cuts[:-1], cuts[1:]):
            loss = K.step_rows(*V, X, y, 0.05, int(a), int(b), *D, scratch, loss)
        K.step_end(D[2], scratch)
        np.testing.assert_array_equal(np.concatenate([v.ravel() for v in D]), whole)
        assert loss / batch == loss_whole
    with pytest.raises(ValueError):
        K.step_rows(*V, X, y, 0.05, 2, batch, *D, scratch, 0.0)


def test_a_step_has_the_same_bits_compiled_or_loaded_from_the_cache(cold_cache_steps):
    """A job's ranks share numba's cache: the first rank of a node compiles the step, the
    others load it. Delta-w and the loss must be the same bit for bit on all of them (sync
    mode's determinism, a model-parallel replica's identical loss). The processes, which
    share a cache that starts empty: conftest.cold_cache_steps (three shapes, each precision)."""
    compiled = cold_cache_steps["compiles make_step"]
    loaded = {k: v for k, v in cold_cache_steps["loads it, compiles the slice's"].items() if k.startswith("s")}
    assert loaded.keys() == compiled.keys() and len(compiled) == 6
    for shape in compiled:
        np.testing.assert_array_equal(loaded[shape], compiled[shape], err_msg=shape)
