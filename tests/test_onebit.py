"""1-bit quantization with error feedback (--compress 1bit): the columns, the numba kernels
against a plain numpy reference, error feedback's bookkeeping, and the reply's copies."""

import numpy as np
import pytest

from asgd.net import kernels as K
from asgd.net.mlp import Layout
from asgd.protocol import onebit
from asgd.core.wire import PULL_HEADER, PUSH_HEADER, shard_bounds
from asgd.core.wire import column_bits_bytes as onebit_bits_bytes


def _indices(cols):
    """The flat indices of each column, in the order the bits go."""
    return [start + np.arange(count) * stride for start, count, stride in cols]


def reference_quantize(x, cols):
    """numpy: (scales, bits, reconstruction) of x, column by column; each column's bits
    from a byte boundary, its first element in the lowest bit."""
    scales, packed, rec = [], [], np.empty_like(x)
    for idx in _indices(cols):
        v = x[idx]
        pos = v > 0
        ap = v[pos].mean() if pos.any() else 0.0
        an = v[~pos].mean() if (~pos).any() else 0.0
        scales += [ap, an]
        packed.append(np.packbits(pos, bitorder="little"))
        rec[idx] = np.where(pos, ap, an)
    return np.array(scales), np.concatenate(packed), rec


@pytest.mark.parametrize("shape", [(2, 10000, 2), (3, 37, 4), (1, 5, 3), (2, 1, 2)])
@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_columns_cover_each_shard_once(shape, servers):
    layout = Layout(*shape)
    for lo, hi in shard_bounds(layout.n_w, servers):
        cols = layout.columns(lo, hi)
        got = np.sort(np.concatenate(_indices(cols))) if len(cols) else np.array([], int)
        np.testing.assert_array_equal(got, np.arange(hi - lo))
        assert (cols[:, 1] > 0).all()


def test_columns_are_lines_along_the_hidden_dimension():
    layout = Layout(2, 4, 3)
    W1, b1, W2, b2 = layout.views(np.arange(layout.n_w, dtype=float))
    lines = [W1[0], W1[1], b1, W2[:, 0], W2[:, 1], W2[:, 2], b2]
    got = [np.arange(layout.n_w, dtype=float)[idx] for idx in _indices(layout.columns())]
    assert len(got) == len(lines)
    for g, line in zip(got, lines):
        np.testing.assert_array_equal(g, line)


@pytest.mark.parametrize("shape, servers, s", [((2, 1000, 2), 1, 0), ((2, 999, 3), 3, 1), ((3, 10, 2), 2, 1)])
def test_quantize_matches_numpy(shape, servers, s):
    layout = Layout(*shape)
    lo, hi = shard_bounds(layout.n_w, servers)[s]
    cols = layout.columns(lo, hi)
    rng = np.random.default_rng(1)
    v, r = rng.normal(size=hi - lo), rng.normal(size=hi - lo) * 0.1
    v[::17] = 0.0      # zeros go with the non-positive values
    ref_scales, ref_bits, rec = reference_quantize(v + r, cols)
    scales, bits = np.empty(2 * len(cols)), np.empty(onebit_bits_bytes(cols), np.uint8)
    residual = r.copy()
    assert K.quantize_1bit(v, residual, cols, scales, bits) == len(ref_bits) == len(bits)
    np.testing.assert_allclose(scales, ref_scales, rtol=1e-12)
    np.testing.assert_array_equal(bits, ref_bits)
    np.testing.assert_allclose(residual, (v + r) - rec, rtol=1e-12, atol=1e-14)
    out = np.full(hi - lo, np.nan)
    K.dequantize_1bit(cols, scales, bits, out, False)
    exact, byte = np.empty(hi - lo), 0
    for c, idx in enumerate(_indices(cols)):   # each value is its column's scale, exactly
        flags = np.unpackbits(bits[byte:byte + (len(idx) + 7) // 8], bitorder="little")[:len(idx)].astype(bool)
        exact[idx] = np.where(flags, scales[2 * c], scales[2 * c + 1])
        byte += (len(idx) + 7) // 8
    np.testing.assert_array_equal(out, exact)
    np.testing.assert_allclose(out, rec, rtol=1e-12)
    base = rng.normal(size=hi - lo)
    added = base.copy()
    K.dequantize_1bit(cols, scales, bits, added, True)
    np.testing.assert_array_equal(added, base + out)


def test_error_feedback_sends_everything_eventually():
    """The sum of the dequantized pushes plus the final residual is the sum of the Delta-w."""
    layout = Layout(2, 500, 2)
    codec = onebit.codecs(layout, shard_bounds(layout.n_w, 1), PUSH_HEADER)[0]
    rng = np.random.default_rng(2)
    residual, sent, pushed = np.zeros(layout.n_w), np.zeros(layout.n_w), np.zeros(layout.n_w)
    buf, out = codec.buffer(), np.empty(layout.n_w)
    for _ in range(50):
        dw = rng.normal(size=layout.n_w) * rng.uniform(0.1, 10, size=layout.n_w)
        codec.encode(dw, residual, buf)
        codec.decode(buf, out)
        sent += dw
        pushed += out
    np.testing.assert_allclose(pushed + residual, sent, rtol=0, atol=1e-9 * np.abs(sent).max())
    assert np.abs(residual).max() < 0.5 * np.abs(sent).max()   # the residual stays bounded


def test_reply_copies_stay_equal_and_follow_w():
    """The server's view of a worker and the worker's w move by the same additions; w - view
    (what the replies have not said yet) stays small however w moves."""
    layout = Layout(2, 300, 2)
    lo, hi = shard_bounds(layout.n_w, 2)[1]
    codec = onebit.OneBit(layout.columns(lo, hi), hi - lo, PULL_HEADER)
    rng = np.random.default_rng(3)
    w = rng.normal(size=hi - lo)
    view, worker = w.copy(), w.copy()
    buf = codec.buffer()
    for _ in range(200):
        w += rng.normal(size=w.size) * 0.01
        codec.encode_diff(w, view, buf)
        codec.decode(buf, worker, add=True)
        np.testing.assert_array_equal(worker, view)
    assert np.abs(w - worker).max() < 0.05


def test_message_sizes():
    layout = Layout(2, 10000, 2)
    push = onebit.codecs(layout, shard_bounds(layout.n_w, 1), PUSH_HEADER)[0]
    pull = onebit.codecs(layout, shard_bounds(layout.n_w, 1), PULL_HEADER)[0]
    assert push.nbytes == 8 * (6 + 12) + 6251 == 6395        # header, 6 columns x 2 scales, 50,002 bits
    assert pull.nbytes == 8 * (3 + 12) + 6251 == 6371
    assert 8 * (layout.n_w + PUSH_HEADER) / push.nbytes > 60
    assert onebit.bytes_per_weight(layout, 1) == pytest.approx((6395 - 48) / 50002)


def test_a_non_finite_push_has_non_finite_scales():
    layout = Layout(2, 50, 2)
    codec = onebit.codecs(layout, shard_bounds(layout.n_w, 1), PUSH_HEADER)[0]
    buf = codec.buffer()
    for bad in (np.nan, np.inf, -np.inf):
        dw = np.ones(layout.n_w)
        dw[7] = bad
        codec.encode(dw, np.zeros(layout.n_w), buf)
        assert not codec.finite(buf)
        out = np.empty(layout.n_w)
        codec.decode(buf, out)
        assert not K.all_finite(out)      # the server's check refuses it
    codec.encode(np.ones(layout.n_w), np.zeros(layout.n_w), buf)
    assert codec.finite(buf)


def test_the_one_bit_warm_up_stays_inside_its_buffers(tmp_path):
    """compile_kernels('onebit') with numba's bounds checks forced on (and a cold cache, so
    they are compiled in): every column's bits start a byte, so a bit buffer sized from the
    weight count alone, (n_w + 7) // 8, is written past its end."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", "from asgd.net import mlp; mlp.compile_kernels('onebit')"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]


def test_every_bit_buffer_is_sized_from_its_columns():
    layout = Layout(2, 3, 2)
    cols = layout.columns()
    assert len(cols) == 6 and onebit_bits_bytes(cols) == 6 > (layout.n_w + 7) // 8
    for shard in shard_bounds(Layout(3, 37, 4).n_w, 3):
        c = Layout(3, 37, 4).columns(*shard)
        assert onebit_bits_bytes(c) == sum((count + 7) // 8 for _, count, _ in c)
