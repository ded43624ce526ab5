"""--precision float32 | float64 (issue 40): the option, the wire's byte counts, the message
buffers, the optimizers' state and checkpoints in either precision. The runs end to end:
test_train_e2e (the accuracy band, the bytes), test_architectures (sync in float32),
test_reliability (a resume in the other precision)."""

import numpy as np
import pytest
from mpi4py import MPI

from asgd.core import wire
from asgd.net.mlp import Layout, init_params
from asgd.net.optimizers import Optimizer
from asgd.protocol.messages import DenseLink, DenseShard, link_messages, shard_messages
from asgd.run import checkpoint, config


def test_float32_is_the_default_and_results_json_records_it():
    assert config.parse([], 2).precision == "float32"
    assert config.parse(["--precision", "float64"], 2).to_dict()["precision"] == "float64"
    with pytest.raises(config.ConfigError, match="--precision: invalid choice: 'float16'"):
        config.parse(["--precision", "float16"], 2)


@pytest.mark.parametrize("k", [1, 7, 50002])
def test_a_float32_payload_is_half_a_float64_one_and_the_header_stays_float64(k):
    for header, count in ((wire.PUSH_HEADER, wire.push_bytes), (wire.PULL_HEADER, wire.pull_bytes)):
        f32, f64 = count(k, itemsize=wire.itemsize("float32")), count(k, itemsize=wire.itemsize("float64"))
        assert f64 - 8 * header == 8 * k and f32 - 8 * header == 4 * k   # half the payload, the same header
    n = 1505
    for r in range(3):   # the ring's vector: every value half the bytes
        assert [2 * b for b in wire.ring_bytes(n, 3, r, 4)] == list(wire.ring_bytes(n, 3, r, 8))


def test_one_bit_scales_take_the_runs_precision():
    cols = Layout(2, 10000, 2).columns()
    f32, f64 = wire.onebit_bytes(cols, wire.PUSH_HEADER, 4), wire.onebit_bytes(cols, wire.PUSH_HEADER, 8)
    assert f64 == 6395 and f64 - f32 == 4 * 2 * len(cols)


@pytest.mark.parametrize("precision", wire.PRECISIONS)
def test_dense_messages_carry_the_precision_and_a_float64_header(precision):
    """An odd shard puts a float32 buffer's headers at odd slots (unaligned for float64):
    they still read back what was written, and each server's datatype is exactly the
    message's bytes."""
    shards = [(0, 5), (5, 12)]
    w0 = np.arange(12, dtype=precision)
    link = DenseLink(shards, w0)
    assert link.w.dtype == np.dtype(precision) and link.delta().dtype == np.dtype(precision)
    fields = [3.0, 1.5, 64.0, 2.0**40 + 1, 0.0, 7.0]   # a version past float32's 2^24 stays exact
    for s, (lo, hi) in enumerate(shards):
        link.push_header(s)[:] = fields
        assert link.push_header(s).tolist() == fields
        assert link.push_types[s].Get_size() == link.push_bytes[s] == wire.push_bytes(hi - lo, itemsize=w0.itemsize)
        assert link.pull_types[s].Get_size() == link.pull_bytes[s]
    link.close()
    shard = DenseShard(w0[5:12].copy(), 2)
    assert shard.kind.Get_size() == w0.itemsize and shard.recv[0].dtype == np.dtype(precision)
    shard.header(1)[:] = fields
    assert shard.header(1).tolist() == fields
    replies = [MPI.REQUEST_NULL] * 2
    buf = shard.reply(0, (9.0, 0.0, 2.0), replies)
    assert buf[7:].view(np.float64).tolist() == [9.0, 0.0, 2.0] and buf.nbytes == shard.pull_nbytes


@pytest.mark.parametrize("precision", wire.PRECISIONS)
def test_one_bit_messages_in_either_precision(precision):
    layout = Layout(2, 6, 2)
    w0 = init_params(layout, 0, precision)
    shards = wire.shard_bounds(layout.n_w, 2)
    link = link_messages("1bit", layout, shards, w0)
    server = shard_messages("1bit", layout, shards[0], w0[:shards[0][1]].copy(), 1)
    assert link.push_bytes[0] == server.push_nbytes == wire.onebit_bytes(layout.columns(*shards[0]), wire.PUSH_HEADER,
                                                                          w0.itemsize)
    dw = link.delta()
    dw[:] = np.linspace(-1, 1, layout.n_w)
    buf = link.push(0, dw)[0]
    server.recv[0][:] = buf
    got = server.delta(0)
    assert got.dtype == np.dtype(precision)
    # error feedback: nothing lost, but the one rounding of the residual x - s (|x - s| <= 2 max|x|)
    hi = shards[0][1]
    np.testing.assert_allclose(got + link.residual[:hi], dw[:hi], rtol=0, atol=2 * np.finfo(precision).eps)


@pytest.mark.parametrize("precision", wire.PRECISIONS)
def test_the_initial_w_is_float64s_rounded(precision):
    layout = Layout(2, 50, 2)
    w = init_params(layout, 3, precision)
    assert w.dtype == np.dtype(precision)
    np.testing.assert_array_equal(w, init_params(layout, 3).astype(precision))


@pytest.mark.parametrize("name", ["sgd", "momentum", "adagrad", "adam"])
def test_an_optimizers_state_is_in_ws_dtype_and_loads_from_the_other(name):
    opt = Optimizer(name, 0.01, 10, dtype=np.float32)
    w, d = np.zeros(10, np.float32), np.ones(10, np.float32)
    opt.step(w, d)
    assert all(v.dtype == np.float32 for v in opt.state.values()) and w.dtype == np.float32
    twin = Optimizer(name, 0.01, 10, dtype=np.float64)
    twin.load(opt.save())
    assert all(v.dtype == np.float64 for v in twin.state.values()) and twin.t == opt.t == 1


def test_a_checkpoint_records_its_precision_and_converts_with_one_line(tmp_path):
    n = 9
    for precision, other in (("float32", "float64"), ("float64", "float32")):
        run = tmp_path / precision
        w = np.linspace(0, 1, n).astype(precision)
        opt = Optimizer("adagrad", 0.01, n, dtype=precision)
        opt.step(w, np.full(n, 0.1, precision))
        checkpoint.Checkpointing(str(run), 0, 1, (0, n), n, w, None, dict, state=opt.save,
                                 optimizer="adagrad").save(rounds=1, cut=1)
        same, meta, state = checkpoint.load(str(run), n, "adagrad", 1, precision)
        assert meta["precision"] == precision and checkpoint.converted(str(run), meta, precision) is None
        np.testing.assert_array_equal(same, w)
        got, meta, state = checkpoint.load(str(run), n, "adagrad", 1, other)
        assert got.dtype == np.dtype(other) and state["opt_g2"].dtype == np.dtype(other)
        np.testing.assert_array_equal(got, w.astype(other))
        line = checkpoint.converted(str(run), meta, other)
        how = "exactly" if other == "float64" else "rounded to nearest"
        assert line == (f"{run}: its checkpoint is {precision}, this run --precision {other}: w and the "
                        f"optimizer's state converted to {other} ({how})")


def test_the_model_counts_a_value_of_w_in_the_runs_bytes():
    """asgd.perf's Run carries --precision: the paper's eq. 7 (Delta-w sent per batch),
    the ranks' memory and the link tables (keyed by float64 messages) read at the bytes
    a float32 message has."""
    from asgd.perf import analytic
    from asgd.perf.cli import memory_of
    r64, r32 = analytic.Run(workers=3), analytic.Run(workers=3, precision="float32")
    assert (r64.value_bytes, r32.value_bytes) == (8, 4) and r32.wire_values(1000) == 500
    t = dict(w=3, b=256, n_f=2, n_w=50002, d=16384, epoch=1, c_p=0, c_b=0, c_u=0, r_d=0, r_m=1e-10, r_net=1e-9)
    t64, t32 = analytic.Table1(**t), analytic.Table1(**t, value_bytes=4)
    assert analytic.T_send(t32, 16384) == analytic.T_send(t64, 16384) / 2
    assert memory_of(r32) == memory_of(r64) / 2


def test_predict_reads_weights_in_the_runs_precision_and_refuses_others(tmp_path):
    """weights.npy is in the run's precision: asgd.predict takes it as results.json's
    config says, and a file of the other precision is refused in one line."""
    import json
    from asgd.predict import PredictError, Run
    layout = Layout(2, 4, 2)
    config = {"features": 2, "hidden": 4, "classes": 2, "precision": "float32"}
    (tmp_path / "results.json").write_text(json.dumps({"config": config, "data": {}}))
    np.save(tmp_path / "weights.npy", init_params(layout, 0, np.float32))
    run = Run(str(tmp_path))
    p = run.probabilities(np.array([[0.5, -0.25]]))
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    np.save(tmp_path / "weights.npy", init_params(layout, 0))   # float64 beside a float32 config
    with pytest.raises(PredictError, match="weights.npy holds float64, the run trained in float32"):
        Run(str(tmp_path))


def test_a_sync_means_weighted_sum_is_in_float32_within_its_stated_roundings():
    """kernels.add_scaled on a float32 w multiplies in float32 (the weight rounded once):
    each value within u |w'| + 2u |a dw| of the exact sum (u = 2^-24; its docstring), and a
    float64 weight compiles no float64 arithmetic into the float32 loop (the result differs
    from float64's product, rounded, where a's rounding shows)."""
    from asgd.net import kernels
    rng = np.random.default_rng(11)
    u, a = 2.0 ** -24, 1 / 3   # a third: not a float32, so its rounding is visible
    w = rng.normal(size=4000).astype(np.float32)
    dw = (rng.normal(size=4000) * 10.0 ** rng.uniform(-3, 3, 4000)).astype(np.float32)
    exact = w.astype(np.float64) + a * dw.astype(np.float64)
    got = w.copy()
    kernels.add_scaled(got, dw, a)
    assert got.dtype == np.float32
    np.testing.assert_array_less(np.abs(got - exact), u * np.abs(exact) + 2 * u * np.abs(a * dw) + 1e-45)
    assert not np.array_equal(got, exact.astype(np.float32)), "the product was float64's"
