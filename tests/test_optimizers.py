"""The server-side optimizers against plain-numpy references, step by step, and what the
end of a run says about convergence."""

import numpy as np
import pytest

from asgd.net import optimizers
from asgd.net.optimizers import Optimizer
from oracles import optimizer_steps as reference
from asgd.run.progress import convergence_notes


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
def test_each_update_matches_numpy(name):
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=1001)
    ds = [rng.normal(scale=10.0 ** rng.uniform(-4, 1), size=1001) for _ in range(25)]
    scales = [1.0 if i % 3 else 1 / (i + 2) for i in range(25)]  # sync and allreduce pass a mean's scale
    opt, w = Optimizer(name, 0.01, len(w0)), w0.copy()
    for d, c in zip(ds, scales):
        opt.step(w, d.copy(), c)
    np.testing.assert_allclose(w, reference(name, 0.01, w0, ds, scales), rtol=1e-12, atol=1e-14)
    assert opt.t == 25


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
def test_the_state_saved_and_restored_continues_the_same(name):
    rng = np.random.default_rng(2)
    ds = [rng.normal(size=64) for _ in range(10)]
    a, wa = Optimizer(name, 0.05, 64), np.zeros(64)
    for d in ds:
        a.step(wa, d.copy())
    b, wb = Optimizer(name, 0.05, 64), np.zeros(64)
    for d in ds[:6]:
        b.step(wb, d.copy())
    c = Optimizer(name, 0.05, 64)
    c.load({k: v.copy() for k, v in b.save().items()})
    for d in ds[6:]:
        c.step(wb, d.copy())
    np.testing.assert_array_equal(wa, wb)


def test_workers_push_delta_w_for_sgd_and_the_gradient_otherwise():
    assert optimizers.worker_lr("sgd", 0.3) == 0.3
    assert all(optimizers.worker_lr(o, 0.3) == 1.0 for o in ("momentum", "adagrad", "adam"))


def test_a_refused_shape_is_an_error():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        Optimizer("rmsprop", 0.1, 4)


def _history(losses, key="test_loss"):
    return [{"epoch": i + 1, "train_loss": x, key: x} for i, x in enumerate(losses)]


@pytest.mark.parametrize("losses, refused, expect", [
    ([0.9, 0.8, 0.7], 0, ["still falling 11% or more an epoch"]),  # the case: underfit, still learning
    ([0.9, 0.31, 0.30], 0, []),                                  # flattened out
    ([0.02, 0.003, 0.0003], 0, []),                              # falling fast, but near zero: done
    ([0.5, 0.49], 3, ["3 update(s) were refused"]),
    ([0.9], 0, []),                                              # one epoch: nothing to compare
    ([17.7, 32.3, 7.4, 2.0, 0.04], 0, []),                       # fell fast, but to near zero: done
    # issue 14's case: digits at the old default lr, 20 epochs, 1-2 % an epoch, far from done
    ([2.3 - 0.023 * i for i in range(20)], 0, [("still falling, from 1.95 to 1.86 over the last 4 epochs",
                                                 "lower it by 25%")]),
    ([1.0] * 5 + [0.30 + 0.001 * (i % 2) for i in range(15)], 0, []),   # flat and noisy: converged
])
def test_convergence_notes(losses, refused, expect):
    notes = convergence_notes(_history(losses), refused)
    assert len(notes) == len(expect), notes
    for note, texts in zip(notes, expect):
        for text in [texts] if isinstance(texts, str) else texts:
            assert text in note, note


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_an_update_refuses_a_non_finite_d_in_its_one_pass_and_changes_nothing(name, bad):
    """update() checks d in the pass that moves w: a NaN or inf anywhere (here in the
    last block, after the pass has written the blocks before it) leaves w, the state and
    t as they were; the next finite d then moves them as if the bad one never came."""
    rng = np.random.default_rng(3)
    n = 3 * 512 + 17   # blocks and a tail
    w = rng.normal(size=n)
    opt, twin = Optimizer(name, 0.01, n), Optimizer(name, 0.01, n)
    for _ in range(3):
        opt.step(w, rng.normal(size=n))
    twin.load({k: v.copy() for k, v in opt.save().items()})
    state = {k: v.copy() for k, v in opt.save().items()}
    d = rng.normal(size=n)
    d[n - 5] = bad
    w_before, d_before, out = w.copy(), d.copy(), np.zeros(n)
    assert not opt.update(w, d, out)
    np.testing.assert_array_equal(w, w_before)
    np.testing.assert_array_equal(d, d_before, "update() never writes d")
    for k, v in opt.save().items():
        np.testing.assert_array_equal(v, state[k], k)
    good = rng.normal(size=n)
    assert opt.update(w, good, out)
    w_twin = w.copy()
    twin.step(w_twin, good.copy())
    np.testing.assert_array_equal(out, w_twin)
    np.testing.assert_array_equal(w, w_before, "w stays the version replies may be reading")


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
def test_an_update_out_of_place_is_the_step_in_place_and_leaves_d_unscaled(name):
    rng = np.random.default_rng(4)
    w0, ds = rng.normal(size=700), [rng.normal(size=700) for _ in range(6)]
    a, b = Optimizer(name, 0.02, 700), Optimizer(name, 0.02, 700)
    wa, wb = w0.copy(), w0.copy()
    for k, d in enumerate(ds):
        scale = 0.25 if k % 2 else 1.0
        a.step(wa, d.copy(), scale)
        out = np.empty(700)
        kept = d.copy()
        assert b.update(wb, d, out, scale)
        np.testing.assert_array_equal(d, kept)
        wb = out
    np.testing.assert_array_equal(wa, wb)
    assert a.t == b.t == 6


def test_a_step_in_place_with_a_non_finite_d_is_an_error():
    opt = Optimizer("adagrad", 0.1, 8)
    with pytest.raises(ValueError, match="NaN or inf"):
        opt.step(np.zeros(8), np.array([0.0] * 7 + [np.nan]))
