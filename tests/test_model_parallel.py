"""Model parallelism's numerical half (--model-parallel K): the sliced parameter order
(mlp.Sliced) and one member's step (mlp.ModelParallelStep, mlp.make_mp_step), against
the full model's step (mlp.make_step, itself tested against the numpy reference in
test_kernels.py), in process: each member's forward, the partial logits summed, then
each member's backward."""

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from asgd.net import kernels
from asgd.net.mlp import Layout, ModelParallelStep, Sliced, init_params, make_evaluate, make_mp_step, make_step
from asgd.core.wire import column_bits_bytes

# (d_in, d_hidden, d_out, batch): the fused path (d_in = d_out = 2) with several sample
# blocks and chunks, a batch not a multiple of 4 and H not divisible by K; the generic path
SHAPES = [(2, 10000, 2, 256), (2, 1001, 2, 37), (2, 7, 2, 5), (3, 700, 4, 50), (1, 513, 3, 70), (2, 30, 3, 1)]


def _data(layout, n, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, layout.d_in)), rng.integers(0, layout.d_out, n)


def _replica_step(sliced, members, v, X, y, lr, progress=(None, None)):
    """One step of a whole replica in process: every member's forward, the partial logits
    summed in slice order into every member's, every member's backward. Returns Delta-w in
    sliced order (prefilled with NaN: the members must write all of it) and each member's loss."""
    Zs = [m.forward(v[a:b], X, progress[0]) for m, (a, b) in zip(members, sliced.bounds)]
    total = Zs[0].copy()
    for Z in Zs[1:]:
        total += Z
    for Z in Zs:
        Z[...] = total
    dv = np.full(sliced.n_w, np.nan)
    losses = [m.backward(X, y, lr, dv[a:b], progress[1]) for m, (a, b) in zip(members, sliced.bounds)]
    return dv, losses


# -- the sliced order -------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 10, 2), (3, 7, 4), (1, 5, 3), (2, 1, 2)])
def test_slices_split_the_hidden_units_evenly_and_tile_the_vector(shape):
    layout = Layout(*shape)
    d_in, H, d_out = shape
    for K in range(1, H + 1):
        s = Sliced(layout, K)
        sizes = [j1 - j0 for j0, j1 in s.units]
        assert s.units[0][0] == 0 and s.units[-1][1] == H and max(sizes) - min(sizes) <= 1
        assert all(a[1] == b[0] for a, b in zip(s.units, s.units[1:]))            # contiguous groups
        assert s.bounds[0][0] == 0 and s.bounds[-1][1] == layout.n_w
        assert all(a[1] == b[0] for a, b in zip(s.bounds, s.bounds[1:]))          # contiguous slices
        for k, (lay, h) in enumerate(zip(s.layouts, sizes)):
            assert lay == Layout(d_in, h, d_out)
            assert s.size(k) == lay.n_w - (d_out if k else 0)                    # b2 in slice 0 only
            assert s.size(k) <= -(-H // K) * (d_in + 1 + d_out) + d_out          # about n_w / K a member


def test_a_bad_K_or_slice_is_a_clear_error():
    layout = Layout(2, 5, 2)
    for K in (0, -1, 6, 2.0, "2", None):
        with pytest.raises(ValueError, match=r"model-parallel K must be an integer from 1 to the hidden units \(5\)"):
            Sliced(layout, K)
    assert Sliced(layout, np.int64(5)).K == 5
    for k in (-1, 2):
        with pytest.raises(ValueError, match="not one of the model's 2"):
            ModelParallelStep(Sliced(layout, 2), k, 8)


@pytest.mark.parametrize("shape, K", [((2, 10, 2), 3), ((3, 7, 4), 7), ((1, 5, 3), 2), ((4, 9, 1), 4)])
def test_the_sliced_order_is_a_permutation_of_the_standard_one(shape, K):
    layout = Layout(*shape)
    s = Sliced(layout, K)
    index = np.arange(layout.n_w, dtype=float)
    v = s.from_standard(index)
    np.testing.assert_array_equal(np.sort(v), index)                  # every parameter once
    np.testing.assert_array_equal(s.to_standard(v), index)            # inverses, both ways
    x = np.random.default_rng(0).normal(size=layout.n_w)
    np.testing.assert_array_equal(s.from_standard(s.to_standard(x)), x)
    out = np.empty(layout.n_w)
    assert s.to_standard(v, out=out) is out and s.from_standard(index, out=out) is out
    # and the right one: slice k's views are its units' rows of W1 and b1, columns of W2; b2 on slice 0
    W1, b1, W2, b2 = layout.views(index)
    for k, ((j0, j1), (a, b)) in enumerate(zip(s.units, s.bounds)):
        V = s.views(k, v[a:b])
        for got, want in zip(V[:3], (W1[:, j0:j1], b1[j0:j1], W2[j0:j1])):
            np.testing.assert_array_equal(got, want)
            assert np.shares_memory(got, v)
        if k == 0:
            np.testing.assert_array_equal(V[3], b2)
        else:
            np.testing.assert_array_equal(V[3], 0.0)
            assert not np.shares_memory(V[3], v)                        # a stand-in, not a parameter


def test_one_slice_is_the_standard_order():
    layout = Layout(3, 11, 4)
    s = Sliced(layout, 1)
    w = init_params(layout, 1)
    assert s.bounds == ((0, layout.n_w),) and s.layouts == (layout,)
    np.testing.assert_array_equal(s.from_standard(w), w)
    np.testing.assert_array_equal(s.columns(), layout.columns())
    np.testing.assert_array_equal(s.columns(5, 40), layout.columns(5, 40))


def _indices(cols):
    return [start + np.arange(count) * stride for start, count, stride in cols]


@pytest.mark.parametrize("shape, K", [((2, 10000, 2), 4), ((3, 37, 4), 3), ((1, 5, 3), 5), ((2, 9, 2), 2)])
def test_columns_cover_each_slice_and_shard_once_along_the_hidden_units(shape, K):
    """1-bit per slice (columns(*bounds[k])) or per server shard of the sliced vector:
    every element in exactly one column, and each column a part of one of the full
    model's columns (a line along the hidden dimension), never across two."""
    layout = Layout(*shape)
    s = Sliced(layout, K)
    line_of = np.empty(layout.n_w, int)                                 # standard index -> its full column
    for c, idx in enumerate(_indices(layout.columns())):
        line_of[idx] = c
    std_of = s.from_standard(np.arange(layout.n_w, dtype=float)).astype(int)   # sliced index -> standard index
    ranges = list(s.bounds) + [(0, layout.n_w), (3, layout.n_w - 2), (s.bounds[0][1] - 1, s.bounds[-1][0] + 1)]
    for lo, hi in ranges:
        cols = s.columns(lo, hi)
        assert (cols[:, 1] > 0).all()
        idx = _indices(cols)
        np.testing.assert_array_equal(np.sort(np.concatenate(idx)), np.arange(hi - lo))
        for i in idx:
            assert len(set(line_of[std_of[lo + i]])) == 1
    k = K - 1                                                           # a slice > 0: lines of W1, b1, W2
    assert len(s.columns(*s.bounds[k])) == shape[0] + 1 + shape[2]
    assert len(s.columns(*s.bounds[0])) == shape[0] + 1 + shape[2] + 1  # and b2


def test_onebit_quantizes_a_slice_with_its_columns():
    layout = Layout(2, 1001, 3)
    s = Sliced(layout, 3)
    a, b = s.bounds[1]
    cols = s.columns(a, b)
    rng = np.random.default_rng(2)
    v, residual = rng.normal(size=b - a), np.zeros(b - a)
    scales, bits = np.empty(2 * len(cols)), np.empty(column_bits_bytes(cols), np.uint8)
    assert kernels.quantize_1bit(v, residual, cols, scales, bits) == len(bits)
    rec = np.full(b - a, np.nan)
    kernels.dequantize_1bit(cols, scales, bits, rec, False)
    np.testing.assert_allclose(rec + residual, v, rtol=1e-12, atol=1e-14)   # error feedback keeps the rest
    assert len(np.unique(rec)) == 2 * len(cols)                         # each column its own two values


# -- the step -----------------------------------------------------------------------

@pytest.mark.parametrize("d_in,d_h,d_out,batch", SHAPES)
def test_one_slice_is_make_step_bit_for_bit(d_in, d_h, d_out, batch):
    layout = Layout(d_in, d_h, d_out)
    w = init_params(layout, d_h)
    X, y = _data(layout, batch, seed=batch)
    dw = np.full(layout.n_w, np.nan)
    loss = make_step(layout, batch)(w, X, y, 0.05, dw)
    sums = []
    step = make_mp_step(Sliced(layout, 1), 0, batch, sums.append)
    for progress in (None, iter([False] * 1000).__next__, iter([False, True]).__next__):
        dv = np.full(layout.n_w, np.nan)
        assert step(w, X, y, 0.05, dv, progress=progress) == loss
        np.testing.assert_array_equal(dv, dw)
    assert len(sums) == 3 and sums[0].shape == (batch, d_out) and sums[0].flags.c_contiguous


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("d_in,d_h,d_out,batch", SHAPES)
def test_the_slices_make_the_full_step(d_in, d_h, d_out, batch, K):
    """K members' Delta-w, put in standard order, is the full step's up to the order of
    the logits' sum; every member returns the same loss, the full step's."""
    layout = Layout(d_in, d_h, d_out)
    w = init_params(layout, d_h)
    X, y = _data(layout, batch, seed=batch)
    dw = np.empty(layout.n_w)
    loss = make_step(layout, batch)(w, X, y, 0.05, dw)
    s = Sliced(layout, K)
    dv, losses = _replica_step(s, [ModelParallelStep(s, k, batch) for k in range(K)], s.from_standard(w), X, y, 0.05)
    assert np.all(np.isfinite(dv))                                      # every member wrote all of its slice
    np.testing.assert_allclose(s.to_standard(dv), dw, rtol=0, atol=1e-9 * np.abs(dw).max())
    assert len(set(losses)) == 1 and losses[0] == pytest.approx(loss, rel=1e-12)


def test_only_slice_0_adds_b2_and_owns_its_gradient():
    """b2 large: added by every member it would count K times; its gradient on a slice
    k > 0 goes nowhere (its vector has no b2), and slice 0's is the full step's."""
    layout = Layout(3, 20, 4)
    w = init_params(layout, 4)
    layout.views(w)[3][:] = [3.0, -2.0, 1.0, 5.0]
    X, y = _data(layout, 12, seed=4)
    dw = np.empty(layout.n_w)
    loss = make_step(layout, 12)(w, X, y, 0.1, dw)
    s = Sliced(layout, 3)
    dv, losses = _replica_step(s, [ModelParallelStep(s, k, 12) for k in range(3)], s.from_standard(w), X, y, 0.1)
    np.testing.assert_allclose(s.to_standard(dv), dw, rtol=0, atol=1e-12 * np.abs(dw).max())
    assert losses[1] == pytest.approx(loss, rel=1e-12)


@pytest.mark.parametrize("d_in,d_h,d_out,batch", [(2, 10000, 2, 256), (2, 1001, 2, 37), (3, 300, 4, 50)])
def test_a_split_by_progress_changes_no_bit(d_in, d_h, d_out, batch):
    layout = Layout(d_in, d_h, d_out)
    w = init_params(layout, 5)
    X, y = _data(layout, batch, seed=6)
    s = Sliced(layout, 3)
    v = s.from_standard(w)
    members = [ModelParallelStep(s, k, batch) for k in range(3)]
    whole, losses = _replica_step(s, members, v, X, y, 0.05)
    blocks = -(-batch // 4)
    for answers in ([False] * 1000, [False, False, True], [True]):
        calls = []

        def progress():
            calls.append(1)
            return answers[min(len(calls), len(answers)) - 1]
        split, split_losses = _replica_step(s, members, v, X, y, 0.05, (progress, progress))
        np.testing.assert_array_equal(split, whole)
        assert split_losses == losses
        assert 6 <= len(calls) <= 6 * blocks   # each half of each member asks, at most a block at a time


def test_the_step_asks_progress_until_it_says_true_never_after():
    layout = Layout(2, 2000, 2)
    s = Sliced(layout, 2)
    w = s.from_standard(init_params(layout, 7))
    X, y = _data(layout, 64, seed=7)
    a, b = s.bounds[1]
    step = make_mp_step(s, 1, 64, lambda Z: None)
    whole = np.empty(b - a)
    loss = step(w[a:b], X, y, 0.1, whole)
    for answers, expect in (([False, False, True], 3), ([True], 1)):
        calls = []

        def progress():
            calls.append(1)
            return answers[len(calls) - 1]                              # an IndexError if asked after True
        dv = np.empty(b - a)
        assert step(w[a:b], X, y, 0.1, dv, progress=progress) == loss
        np.testing.assert_array_equal(dv, whole)
        assert len(calls) == expect
    calls = []
    step(w[a:b], X, y, 0.1, dv, progress=lambda: calls.append(1) or False)
    assert len(calls) >= 2                                              # the backward's blocks ask too


def test_the_backward_uses_the_forwards_w():
    """w_k may change between the halves (a new w arrives during the sum): the step is at
    the forward's w."""
    layout = Layout(2, 300, 2)
    s = Sliced(layout, 2)
    w = s.from_standard(init_params(layout, 8))
    X, y = _data(layout, 20, seed=8)
    members = [ModelParallelStep(s, k, 20) for k in range(2)]
    want, _ = _replica_step(s, members, w, X, y, 0.1)
    Zs = [m.forward(w[a:b], X) for m, (a, b) in zip(members, s.bounds)]
    total = Zs[0] + Zs[1]
    w[:] = np.nan
    dv = np.empty(s.n_w)
    for m, Z, (a, b) in zip(members, Zs, s.bounds):
        Z[...] = total
        m.backward(X, y, 0.1, dv[a:b])
    np.testing.assert_array_equal(dv, want)


def test_a_backward_needs_its_forwards_batch():
    layout = Layout(2, 30, 2)
    s = Sliced(layout, 2)
    w = s.from_standard(init_params(layout, 9))
    X, y = _data(layout, 16, seed=9)
    m = ModelParallelStep(s, 0, 16)
    a, b = s.bounds[0]
    dv = np.empty(b - a)
    with pytest.raises(ValueError, match="not the batch of the last forward"):
        m.backward(X, y, 0.1, dv)                                       # no forward yet
    m.forward(w[a:b], X)
    with pytest.raises(ValueError, match="not the batch of the last forward"):
        m.backward(X[:8], y[:8], 0.1, dv)
    m.forward(w[a:b], X)
    m.backward(X, y, 0.1, dv)
    with pytest.raises(ValueError, match="not the batch of the last forward"):
        m.backward(X, y, 0.1, dv)                                       # its logits are now dz: one backward each
    with pytest.raises(ValueError, match="mp_forward"):
        m.forward(w[a:b], X[:, :1])                                     # X of the wrong width
    y[3] = 2
    m.forward(w[a:b], X)
    with pytest.raises(ValueError, match="label out of range"):
        m.backward(X, y, 0.1, dv)


def test_a_batch_larger_than_the_scratch_and_a_short_last_one():
    layout = Layout(2, 501, 2)
    s = Sliced(layout, 2)
    w = init_params(layout, 10)
    members = [ModelParallelStep(s, k, 8) for k in range(2)]            # sized for 8
    for batch in (8, 45, 3, 45):
        X, y = _data(layout, batch, seed=batch)
        dw = np.empty(layout.n_w)
        loss = make_step(layout, batch)(w, X, y, 0.1, dw)
        dv, losses = _replica_step(s, members, s.from_standard(w), X, y, 0.1)
        np.testing.assert_allclose(s.to_standard(dv), dw, rtol=0, atol=1e-9 * np.abs(dw).max())
        assert losses[0] == pytest.approx(loss, rel=1e-12)


def test_training_in_slices_then_evaluating_in_standard_order():
    """A few SGD steps of a K = 3 replica track the full model's, and what evaluation
    needs is to_standard into the vector make_evaluate reads."""
    layout = Layout(2, 400, 3)
    s = Sliced(layout, 3)
    w = init_params(layout, 11)
    v = s.from_standard(w)
    X, _ = _data(layout, 64, seed=11)
    y = np.digitize(X[:, 0] + X[:, 1], [-0.5, 0.5])                    # a learnable rule: 3 classes
    test = SimpleNamespace(X=X, y=y)
    full, members = make_step(layout, 64), [ModelParallelStep(s, k, 64) for k in range(3)]
    w_eval = np.empty(layout.n_w)
    evaluate, evaluate_full = make_evaluate(layout, w_eval, test), make_evaluate(layout, w, test)
    first = evaluate_full()
    dw = np.empty(layout.n_w)
    for t in range(20):
        i = (np.arange(16) + 16 * t) % 64
        loss = full(w, X[i], y[i], 0.2, dw)
        dv, losses = _replica_step(s, members, v, X[i], y[i], 0.2)
        assert losses[0] == pytest.approx(loss, rel=1e-9)
        w += dw
        v += dv
    s.to_standard(v, out=w_eval)
    np.testing.assert_allclose(w_eval, w, rtol=1e-9, atol=1e-12)
    assert evaluate() == pytest.approx(evaluate_full(), rel=1e-9)
    assert evaluate_full()[0] < first[0]                                # it trained


def test_the_warm_up_compiles_every_model_parallel_kernel():
    """After compile_kernels('mp_step'), a replica's step with a run's argument types
    (slices of one sliced vector, either path, with and without progress) has nothing
    left to compile."""
    code = """
import numpy as np
from asgd.net import kernels, mlp
mlp.compile_kernels("mp_step")
names = ["mp_forward_begin", "mp_forward_rows", "mp_backward_begin", "mp_backward_rows", "step_end"]
before = {n: len(getattr(kernels, n).signatures) for n in names}
for shape in ((2, 100, 2), (3, 50, 4)):
    layout = mlp.Layout(*shape)
    s = mlp.Sliced(layout, 3)
    v, dv = s.from_standard(mlp.init_params(layout, 0)), np.zeros(layout.n_w)
    X, y = np.ones((9, shape[0])), np.zeros(9, dtype=np.int64)
    for k, (a, b) in enumerate(s.bounds):
        step = mlp.make_mp_step(s, k, 9, lambda Z: None)
        step(v[a:b], X, y, 0.1, dv[a:b])
        step(v[a:b], X, y, 0.1, dv[a:b], progress=lambda: False)
after = {n: len(getattr(kernels, n).signatures) for n in names}
assert all(before.values()), before
assert before == after, (before, after)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr



def test_one_slice_is_make_step_whichever_rank_compiled_the_kernels(cold_cache_steps):
    """A job's ranks share numba's cache: one compiles, the others load, and a rank may
    load make_step's kernels and compile the model-parallel ones. The bits must not depend
    on it. They did when the kernels called a shared helper at run time: the call went to
    whichever compiled copy of it the process had loaded first, and the copy optimized
    again inside its caller differed in the last bit (a rank that loaded make_step from
    the cache got other bits than the one that compiled it). (The three processes:
    conftest.cold_cache_steps.)"""
    sessions = cold_cache_steps
    want = sessions["compiles make_step"]
    for session, got in sessions.items():
        for key, value in got.items():
            np.testing.assert_array_equal(value, want[f"s{key[1:]}"], err_msg=f"{session}: {key}")
