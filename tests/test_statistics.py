"""The statistical model of epochs to a target (asgd.perf.statistics), optimize's ranking by
time to a target (asgd.perf.to_target and the command), and the pilot end to end on a
tiny setting."""

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from asgd.perf import cli
from asgd.perf.statistics import (NoPilot, Reference, Statistics, batch_factor, fit_efficiency,
                                  fit_staleness_growth, pooled_in_lockstep, samples_to_target, staleness_factor,
                                  update_samples)
from asgd.perf.to_target import rank_to_target, what_binds
from asgd.probes.pilot import measured_evaluation
from conftest import MPIEXEC, REPO
from test_analytic import make_params


def test_epochs_grow_with_the_batch_from_e_min_as_mccandlish_says():
    b_noise = 100.0
    factors = [batch_factor(b, b_noise) for b in (1, 10, 100, 1000, 10000)]
    assert factors == sorted(factors) and len(set(factors)) == len(factors)
    assert batch_factor(0, b_noise) == 1.0                                # B -> 0: E_min samples
    assert batch_factor(b_noise, b_noise) == 2.0                          # B = B_noise: twice E_min
    assert batch_factor(1e9, b_noise) * b_noise / 1e9 == pytest.approx(1.0, rel=1e-6)   # B -> inf: S_min steps
    for B in (3.0, 100.0, 5000.0):   # (S/S_min - 1)(E/E_min - 1) = 1, S = E / B steps, S_min = E_min / B_noise
        E = batch_factor(B, b_noise)   # in units of E_min
        S = E / B * b_noise            # in units of S_min
        assert (S - 1) * (E - 1) == pytest.approx(1.0)


def test_an_update_carries_the_batch_or_what_is_left_of_a_share():
    assert update_samples(8192, 1, 256, False) == 256
    assert update_samples(8192, 5, 512, False) == pytest.approx(1639 / 4)     # 4 steps a share: 512 x 3 + 103
    assert update_samples(1257, 4, 1024, False) == 315                       # a batch past the share is the share
    assert update_samples(8192, 3, 128, True) == pytest.approx(3 * 2731 / 22)   # lockstep: every replica's step
    assert update_samples(8192, 4, 64, True) == 256
    assert update_samples(1257, 5, 256, True, backup=1) == pytest.approx(4 * 252)   # a round: all but the backup's


def test_backup_workers_price_a_round_as_the_pushes_it_applies():
    """Sync with b backup workers applies W - b pushes a round, and its epochs count the
    samples applied: fewer samples an update than W replicas' (a smaller U, fewer epochs)."""
    st = Statistics(b_noise=100.0, staleness_cost=0.1, staleness_one=2.0, staleness_per_worker=1.0,
                    references={"adagrad": Reference(batch=64, points=1257, staleness=2.0,
                                                     curve=[{"samples": 1257 * e, "accuracy": a, "loss": 1.0 - a}
                                                            for e, a in ((1, 0.5), (10, 0.9), (20, 0.99))])})
    plain, backup = (st.epochs_to_target("adagrad", "accuracy", 0.9, 256, 5, True, 0.0, b) for b in (0, 1))
    assert backup < plain
    assert (st.update_samples("adagrad", 256, 5, True, 1) / st.update_samples("adagrad", 256, 5, True)
            == pytest.approx(4 / 5))
    rows = [{"arch": "ps", "mode": "sync", "workers": 5, "batch": 256, "replicas": 5, "init_s": 0.0, "per_epoch_s": 1.0,
             "backup": b} for b in (0, 1)]
    ranked = rank_to_target(rows, st, "accuracy", 0.9, "adagrad")
    assert [r["backup"] for r in ranked] == [1, 0] and ranked[0]["epochs_to_target"] == pytest.approx(backup)


def test_the_staleness_factor_and_the_staleness_line():
    assert staleness_factor(0, 0.3) == 1.0 and staleness_factor(4, 0.25) == 2.0
    assert staleness_factor(-1, 0.3) == 1.0
    assert fit_staleness_growth([1, 3, 5], [1.0, 5.0, 9.0]) == pytest.approx((1.0, 2.0))
    assert fit_staleness_growth([4, 4], [3.0, 5.0]) == (4.0, 0.0)


def runs_of(e_min: float, b_noise: float, c: float, noise=None):
    """The pilot's runs (update samples, mean staleness) and their epochs as the model says, times noise."""
    u = [256, 32, 1024, 256, 256, 256, 256]
    s = [2.0, 1.9, 2.0, 3.5, 5.0, 9.0, 0.0]
    e = [e_min * batch_factor(a, b_noise) * staleness_factor(b, c) for a, b in zip(u, s)]
    return u, s, [x * k for x, k in zip(e, noise or [1] * len(e))]


def test_the_fit_recovers_b_noise_and_the_staleness_cost():
    for b_noise, c in ((100.0, 0.15), (45.0, 0.05), (400.0, 0.0)):
        got = fit_efficiency(*runs_of(10.0, b_noise, c))
        assert got[0] == pytest.approx(b_noise, rel=0.03) and got[1] == pytest.approx(c, abs=0.003)
    # noise of a few percent in the epochs (a held-out curve's first crossing): near, not off by a factor
    b, c = fit_efficiency(*runs_of(10.0, 100.0, 0.15, noise=[1.0, 1.05, 0.96, 1.04, 0.97, 1.03, 1.02]))
    assert 70 < b < 140 and 0.08 < c < 0.25
    # epochs flat in the update size: B_noise at the grid's top (the batch costs nothing)
    assert fit_efficiency([32, 1024], [2.0, 2.0], [5.0, 5.0])[0] >= 1e5
    # fewer epochs when staler: no cost, not a gain
    assert fit_efficiency([32, 256, 256], [2.0, 2.0, 8.0], [4.0, 10.0, 8.0])[1] == 0.0
    with pytest.raises(ValueError, match="two update sizes"):
        fit_efficiency([256, 256], [2.0, 5.0], [10.0, 12.0])
    # c known (the shared staleness cost): B_noise alone, from two runs of a second optimizer
    u, s, e = runs_of(10.0, 60.0, 0.15)
    got = fit_efficiency([u[0], u[1]], [s[0], s[1]], [e[0], e[1]], costs=[0.15])   # reference, batch 32
    assert got[0] == pytest.approx(60.0, rel=0.03) and got[1] == 0.15


CURVE = [{"samples": 100, "accuracy": 0.5, "loss": 0.9}, {"samples": 200, "accuracy": 0.7, "loss": 0.6},
         {"samples": 300, "accuracy": 0.9, "loss": 0.3}]


def test_samples_to_target_read_off_the_curve():
    assert samples_to_target(CURVE, "accuracy", 0.8) == pytest.approx(250)
    assert samples_to_target(CURVE, "accuracy", 0.4) == 100
    assert samples_to_target(CURVE, "loss", 0.3) == pytest.approx(300)
    assert samples_to_target(CURVE, "accuracy", 0.95) is None


def stats(b_noise=20.0, c=0.1, s1=1.0, slope=1.0) -> Statistics:
    ref = Reference(batch=16, staleness=1.0, points=1000, curve=CURVE)
    return Statistics(b_noise, c, s1, slope, {"adagrad": ref}, data="embedded", hidden=100)


def test_epochs_to_target_of_a_configuration():
    st = stats()
    e_min = 0.25 / (batch_factor(1000 / 63, 20) * staleness_factor(1.0, 0.1))   # 250 samples of 1000 points
    e = st.epochs_to_target("adagrad", "accuracy", 0.8, 50, 4, False, st.mean_staleness(4, "async", False))
    assert e == pytest.approx(e_min * batch_factor(50, 20) * staleness_factor(4.0, 0.1))
    sync = st.epochs_to_target("adagrad", "accuracy", 0.8, 50, 4, True, st.mean_staleness(4, "sync", True))
    assert sync == pytest.approx(e_min * batch_factor(200, 20))     # lockstep: no staleness, 4 x 50 an update
    big = st.epochs_to_target("adagrad", "accuracy", 0.8, 4096, 4, False, 4.0)
    assert big == pytest.approx(e_min * batch_factor(250, 20) * staleness_factor(4.0, 0.1))   # the share, 250
    assert st.mean_staleness(8, "async", False) == 8
    assert st.mean_staleness(8, "ssp", False, bound=3) == 7          # it reads its own last update
    assert stats(slope=3.0).mean_staleness(8, "ssp", False, bound=2) == 16   # 2 steps ahead x 8 workers
    # sgd's default lr is W times in lockstep (linear scaling): a round moves w as W steps of one replica's
    assert pooled_in_lockstep("adagrad") and pooled_in_lockstep("adam")
    assert not pooled_in_lockstep("sgd") and not pooled_in_lockstep("momentum")
    sgd = Statistics(20.0, 0.1, 1.0, 1.0, {"sgd": st.references["adagrad"]})
    assert sgd.update_samples("sgd", 50, 4, True) == 50 and st.update_samples("adagrad", 50, 4, True) == 200
    assert sgd.epochs_to_target("sgd", "accuracy", 0.8, 50, 4, True, 0.0) == pytest.approx(e_min * batch_factor(50, 20))
    with pytest.raises(NoPilot, match="never reached"):
        st.epochs_to_target("adagrad", "accuracy", 0.95, 16, 1, False, 1.0)
    with pytest.raises(NoPilot, match="--optimizers sgd"):
        st.epochs_to_target("sgd", "accuracy", 0.8, 16, 1, False, 1.0)
    again = Statistics.from_dict(json.loads(json.dumps({**dataclasses.asdict(st), "references": {
        "adagrad": dataclasses.asdict(st.references["adagrad"])}})))
    assert again == st


def test_an_optimizer_piloted_at_two_batches_has_its_own_b_noise():
    """adam's epochs priced with adam's B_noise (its reference's E_min too); adagrad's with
    the first optimizer's; a file from before per-optimizer B_noise reads as before."""
    ref = stats().references["adagrad"]
    st = Statistics(20.0, 0.1, 1.0, 1.0, {"adagrad": ref, "adam": ref}, b_noise_by_optimizer={"adam": 5.0})
    assert st.b_noise_of("adam") == 5.0 and st.b_noise_of("adagrad") == 20.0
    for opt, b in (("adam", 5.0), ("adagrad", 20.0)):
        e_min = 0.25 / (batch_factor(1000 / 63, b) * staleness_factor(1.0, 0.1))
        got = st.epochs_to_target(opt, "accuracy", 0.8, 50, 4, False, 4.0)
        assert got == pytest.approx(e_min * batch_factor(50, b) * staleness_factor(4.0, 0.1))
    # a smaller B_noise: a larger batch costs more epochs than the first optimizer's says
    assert (st.epochs_to_target("adam", "accuracy", 0.8, 256, 1, False, 1.0)
            > st.epochs_to_target("adagrad", "accuracy", 0.8, 256, 1, False, 1.0))
    d = {**dataclasses.asdict(st), "references": {k: dataclasses.asdict(v) for k, v in st.references.items()}}
    assert Statistics.from_dict(json.loads(json.dumps(d))) == st
    del d["b_noise_by_optimizer"]
    assert Statistics.from_dict(d).b_noise_of("adam") == 20.0


def row(batch, per_epoch_s, workers=1, arch="ps", mode="async"):
    return {"arch": arch, "mode": mode, "workers": workers, "servers": 1, "model_parallel": 1, "replicas": workers,
            "batch": batch, "ranks": workers + 1, "init_s": 0.01, "per_epoch_s": per_epoch_s, "bound": "workers"}


def test_a_slower_epoch_that_needs_fewer_epochs_wins_when_the_statistics_say_so():
    rows = [row(1024, 0.1), row(16, 0.3)]
    ranked = rank_to_target(rows, stats(b_noise=20.0), "accuracy", 0.8, "adagrad")
    assert ranked[0]["batch"] == 16 and ranked[0]["per_epoch_s"] > ranked[1]["per_epoch_s"]
    assert ranked[0]["epochs_to_target"] < ranked[1]["epochs_to_target"]
    assert ranked[0]["time_to_target_s"] == pytest.approx(0.01 + 0.3 * ranked[0]["epochs_to_target"])
    assert [r["update_samples"] for r in ranked] == [1000 / 63, 1000]   # 1,000 points: 63 steps of 16, or all at once
    assert what_binds(ranked).startswith("hardware: its s/epoch is 3.00x the least")
    # with a noise scale far above both batches, the batch barely matters: the faster epoch wins
    ranked = rank_to_target(rows, stats(b_noise=1e6), "accuracy", 0.8, "adagrad")
    assert ranked[0]["batch"] == 1024
    assert what_binds(ranked).startswith("neither")
    ranked = rank_to_target([row(16, 0.1, workers=8), row(16, 0.5)], stats(c=1.0), "accuracy", 0.8, "adagrad")
    assert ranked[0]["workers"] == 8 and what_binds(ranked).startswith("statistics: it needs")
    slow_start = [{**r, "init_s": 100.0} for r in rows]
    ranked = rank_to_target(slow_start, stats(b_noise=20.0), "accuracy", 0.8, "adagrad")
    assert what_binds(ranked).startswith("start-up first (100 s of its 10") and "then hardware" in what_binds(ranked)


def test_what_binds_prints_a_fast_epochs_seconds_to_three_figures():
    """A small problem's epochs take milliseconds: 'the least (0.000, p2p 2 workers x batch
    256)' said nothing; its seconds and epochs get 3 significant figures."""
    rows = [{**r, "init_s": 1e-5} for r in (row(1024, 0.000123), row(16, 0.000369))]
    binds = what_binds(rank_to_target(rows, stats(b_noise=20.0), "accuracy", 0.8, "adagrad"))
    assert binds.startswith("hardware: its s/epoch is 3.00x the least (0.000123, ps 1 workers x batch 1024), "
                            "whose 7.11 epochs"), binds
    slow_start = [{**r, "init_s": 0.0042} for r in rows]
    binds = what_binds(rank_to_target(slow_start, stats(b_noise=20.0), "accuracy", 0.8, "adagrad"))
    assert binds.startswith("start-up first (0.0042 s of its 0.00429 s); then hardware"), binds
    binds = what_binds(rank_to_target([row(16, 0.0001, workers=8), row(16, 0.0005)], stats(c=1.0), "accuracy",
                                      0.8, "adagrad"))
    assert "statistics: it needs 4.47x the fewest epochs of any (0.25, ps 1 workers x batch 16)" in binds, binds


def test_each_row_is_judged_in_its_own_mode():
    """optimize ranks modes side by side: a sync row's update is every replica's batch at no
    staleness; the async row of the same shape carries the pilots' staleness instead."""
    st = stats(b_noise=20.0, c=1.0)
    ranked = rank_to_target([row(16, 0.1, workers=4, mode="sync"), row(16, 0.1, workers=4)], st,
                            "accuracy", 0.8, "adagrad")
    by = {r["mode"]: r for r in ranked}
    assert by["sync"]["mean_staleness"] == 0 and by["async"]["mean_staleness"] > 0
    pooled = st.update_samples("adagrad", 16, 4, True)     # adagrad pools a lockstep round's 4 batches
    assert by["sync"]["update_samples"] == pooled == 4 * by["async"]["update_samples"]
    assert by["sync"]["epochs_to_target"] == pytest.approx(
        st.epochs_to_target("adagrad", "accuracy", 0.8, 16, 4, True, 0.0))


def write_params(tmp_path, statistics: dict) -> str:
    p = dataclasses.asdict(make_params())
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"schema": 1, "params": p, "statistics": statistics}))
    return str(path)


def st_dict(st: Statistics) -> dict:
    return {**dataclasses.asdict(st), "references": {k: dataclasses.asdict(v) for k, v in st.references.items()}}


def test_optimize_ranks_by_time_to_target_with_ranks_and_argv(tmp_path, capsys):
    path = write_params(tmp_path, st_dict(stats(b_noise=20.0)))
    base = ["optimize", "--params", path, "--cores-per-node", "4", "--hidden", "100", "--archs", "ps",
            "--optimizer", "adagrad", "--batches", "16,1024", "--workers", "1,2", "--model-parallel", "1,2"]
    assert cli.main([*base, "--json"]) == 0
    by_epoch = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert cli.main([*base, "--target-accuracy", "0.8", "--json"]) == 0
    ranked = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert by_epoch[0]["batch"] == 1024 and ranked[0]["batch"] == 16    # the time-per-epoch pick loses
    assert all(r["model_parallel"] == 1 and r["servers"] == 1 for r in ranked)   # a target needs rank 0's whole w
    assert [r["time_to_target_s"] for r in ranked] == sorted(r["time_to_target_s"] for r in ranked)
    w = ranked[0]
    assert w["ranks"] == w["workers"] + 1
    # to a target, --epochs is asgd.train's cap: room for the predicted epochs' misses, never below the default
    room = max(5, math.ceil(cli.TARGET_EPOCHS_ROOM * w["epochs_to_target"]))
    assert w["argv"] == ["--arch", "ps", "--servers", "1", "--mode", "async", "--batch", "16", "--hidden", "100",
                         "--optimizer", "adagrad", "--precision", "float32", "--target-accuracy", "0.8",
                         "--epochs", str(room)]
    assert all(int(r["argv"][-1]) >= cli.TARGET_EPOCHS_ROOM * r["epochs_to_target"] for r in ranked)
    assert by_epoch[0]["argv"][-2:] == ["--epochs", "5"]
    assert {r["mode"] for r in by_epoch} == {"async"} and {r["mode"] for r in ranked} == {"async", "sync"}
    assert cli.main([*base, "--mode", "sync,ssp", "--json"]) == 0
    assert {json.loads(x)["mode"] for x in capsys.readouterr().out.splitlines()} == {"sync", "ssp"}
    assert cli.main([*base, "--mode", "bsp"]) == 2
    assert "unknown mode(s) ['bsp']" in capsys.readouterr().err
    assert cli.main([*base, "--target-accuracy", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "to held-out accuracy 0.8" in out and "epochs  s/epoch" in out
    assert "what binds it: " in out and "hardware: its s/epoch is" in out
    assert cli.main([*base, "--target-accuracy", "0.99"]) == 2
    assert "never reached held-out accuracy 0.99" in capsys.readouterr().err
    assert cli.main([*base, "--hidden", "400", "--target-accuracy", "0.8"]) == 2
    assert "run python -m asgd.perf pilot for this problem" in capsys.readouterr().err


def test_a_target_the_pilot_missed_asks_for_what_helps(tmp_path, capsys):
    """After a pilot that ran to this very target and missed it, optimize said "run the pilot
    with this target ... or more --epochs" (best 0.96875): more epochs for the pilot, or an
    easier target, are what help; its best to 4 decimals, as the pilot prints it."""
    curve = [{"samples": 10_000, "accuracy": 0.9, "loss": 0.3}, {"samples": 20_000, "accuracy": 0.96875, "loss": 0.1}]
    st = dataclasses.replace(stats(), references={"adagrad": Reference(batch=16, staleness=1.0, points=1000,
                                                                       curve=curve)})
    path = write_params(tmp_path, st_dict(st))
    assert cli.main(["optimize", "--params", path, "--cores-per-node", "4", "--hidden", "100",
                     "--precision", "float64", "--target-accuracy", "0.99"]) == 2
    assert capsys.readouterr().err == (
        "asgd.perf optimize: error: the pilot's adagrad reference never reached held-out accuracy 0.99 in its "
        "20 epochs (best 0.9688): give the pilot more epochs (add --measure --epochs N to this optimize, or run "
        "python -m asgd.perf pilot with --target-accuracy 0.99 --epochs N) or ask an easier target\n")


def test_optimize_to_a_target_without_a_pilot_says_how_to_run_one(tmp_path, capsys):
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"schema": 1, "params": dataclasses.asdict(make_params())}))
    assert cli.main(["optimize", "--params", str(path), "--cores-per-node", "4", "--hidden", "100",
                     "--target-loss", "0.1"]) == 2
    assert f"python -m asgd.perf pilot --params {path}" in capsys.readouterr().err


def test_optimize_measure_calibrates_and_pilots_only_what_the_file_lacks(tmp_path, capsys, monkeypatch):
    """--measure: no file, a calibration; a pilot where the statistics cannot answer (none,
    another optimizer, a target the reference never reached); none where they can."""
    calls, epochs = [], []

    def calibrate(a):
        calls.append(("calibrate", a.out))
        (tmp_path / "params.json").write_text(json.dumps({"schema": 1, "params": dataclasses.asdict(make_params())}))
        return 0

    def pilot(a):
        calls.append(("pilot", a.optimizers, a.target_accuracy))
        epochs.append(a.epochs)
        add = json.loads((tmp_path / "params.json").read_text())
        got = st_dict(stats())
        add["statistics"] = {**got, "references": {a.optimizers: got["references"]["adagrad"]}}
        (tmp_path / "params.json").write_text(json.dumps(add))
        return 0

    monkeypatch.setattr(cli, "_calibrate", calibrate)
    monkeypatch.setattr(cli, "_pilot", pilot)
    path = str(tmp_path / "params.json")
    base = ["optimize", "--measure", "--params", path, "--cores-per-node", "4", "--hidden", "100", "--json"]
    assert cli.main([*base, "--target-accuracy", "0.8"]) == 0
    assert calls == [("calibrate", path), ("pilot", "adagrad", 0.8)]
    assert "no pilot: piloting the data first" in capsys.readouterr().out
    assert cli.main([*base, "--target-accuracy", "0.8"]) == 0          # the file answers now
    assert len(calls) == 2
    assert cli.main([*base, "--target-accuracy", "0.8", "--optimizer", "adam"]) == 0
    assert calls[-1] == ("pilot", "adam", 0.8) and "did not run --optimizer adam" in capsys.readouterr().out
    # a target past the new pilot's reach too (this fake pilot's curve ends at 0.9): optimize says so
    assert cli.main([*base, "--target-accuracy", "0.95"]) == 2
    out, err = capsys.readouterr()
    assert calls[-1] == ("pilot", "adagrad", 0.95) and "never reached held-out accuracy 0.95" in out + err
    # which optimize's --epochs fixes: the pilot's reference gets them (it ran its default again)
    assert epochs[-1] is None
    assert cli.main([*base, "--target-accuracy", "0.95", "--epochs", "150"]) == 2
    assert epochs[-1] == 150


def test_optimize_measure_calibrates_a_file_that_holds_only_a_pilot_and_keeps_it(tmp_path, capsys, monkeypatch):
    """A params.json a pilot made first (statistics, no calibration): --measure calibrates,
    and the calibration keeps the pilot's statistics, so no second pilot runs."""
    import asgd.probes.calibrate as probe
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"schema": 1, "statistics": st_dict(stats())}))
    monkeypatch.setattr(probe, "calibrate", lambda launcher, quick: {
        "schema": 1, "params": dataclasses.asdict(make_params()), "seconds": 1.0})
    monkeypatch.setattr(cli, "_pilot", lambda a: pytest.fail("the pilot's statistics were lost"))
    assert cli.main(["optimize", "--measure", "--params", str(path), "--cores-per-node", "4", "--hidden", "100",
                     "--json", "--target-accuracy", "0.8"]) == 0
    assert f"{path} has no calibration: calibrating" in capsys.readouterr().out
    got = json.loads(path.read_text())
    assert got["params"]["cores"] == 4 and got["statistics"] == st_dict(stats())


def test_the_pilots_evaluation_cost_pools_its_runs_evaluations():
    """The held-out evaluation's seconds a point, over every pilot run's evaluations during
    training (metrics.eval_s, one curve point each), at the runs' shape and precision; a
    run whose rank 0 did not evaluate adds nothing."""
    def run(eval_s, evaluations, test_points=100):
        return {"metrics": {"eval_s": eval_s, "curve": [{}] * evaluations},
                "config": {"features": 784, "classes": 10, "hidden": 256, "precision": "float32",
                           "test_points": test_points}}
    got = measured_evaluation([run(0.2, 10), run(0.6, 20), run(None, 0)])
    assert got == {"s_per_point": pytest.approx(0.8 / (30 * 100)), "evaluations": 30, "features": 784,
                   "classes": 10, "hidden": 256, "precision": "float32"}
    assert measured_evaluation([run(None, 0)]) is None


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec on PATH (pip install -e '.[mpich]')")
def test_the_pilot_end_to_end_on_a_tiny_setting(tmp_path, capsys):
    """A reference, the batch pilots, one asynchronous and the lockstep pilot of the penguins'
    4-256-3 MLP at batch 16, then optimize to a target from those statistics (the machine's
    parameters synthetic)."""
    path = write_params(tmp_path, {})
    data = str(REPO / "examples" / "penguins.csv")
    cmd = [sys.executable, "-m", "asgd.perf", "pilot", "--params", path, "--data", data, "--label-column",
           "species", "--batch", "16", "--workers", "2", "--epochs", "6", "--timeout", "60", "--optimizers",
           "adagrad,adam"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr
    got = json.loads(open(path).read())
    assert got["params"]["cores"] == 4          # the calibration kept, the statistics added
    st = Statistics.from_dict(got["statistics"])
    assert st.data == data and st.hidden == 256
    assert math.isfinite(st.b_noise) and st.b_noise > 0 and st.staleness_cost >= 0
    ref = st.references["adagrad"]
    run = json.loads((tmp_path / "pilot" / "reference-adagrad" / "results.json").read_text())
    assert ref.batch == 16 and ref.points == run["config"]["train_points"] and run["config"]["workers"] == 1
    assert len(ref.curve) > 6     # evaluated more often than once an epoch
    pilot = got["statistics"]["pilot"]
    assert pilot["async"][0]["workers"] == 2 and pilot["async"][0]["staleness"] > 0
    assert [(r["workers"], r["batch"]) for r in pilot["batches"]] == [(1, 32), (1, 1024)]
    assert pilot["batches"][1]["update_samples"] == ref.points        # a batch past the data: all of it an update
    assert pilot["lockstep"][0]["mode"] == "sync" and pilot["lockstep"][0]["staleness"] == 0
    assert pilot["lockstep"][0]["update_samples"] == pytest.approx(16, rel=0.01)   # 2 x 8, shares ending short
    # the second optimizer at the smallest batch too: its own B_noise
    assert [(r["optimizer"], r["workers"], r["batch"]) for r in pilot["optimizer_batches"]] == [("adam", 1, 32)]
    assert pilot["optimizer_batches"][0]["reached"] and st.b_noise_of("adam") > 0
    assert list(st.b_noise_by_optimizer) == ["adam"]
    assert "statistics added to" in p.stdout
    evaluation = got["statistics"]["evaluation"]   # every pilot run evaluated: their cost a held-out point
    assert (evaluation["features"], evaluation["classes"], evaluation["hidden"]) == (4, 3, 256)
    assert evaluation["precision"] == run["config"]["precision"] and evaluation["s_per_point"] > 0
    assert evaluation["evaluations"] >= len(ref.curve)
    assert cli.load_params(path).evaluation == evaluation    # the model's and the simulator's evaluations
    target = pilot["target"]["value"]
    assert cli.main(["optimize", "--params", path, "--cores-per-node", "4", "--data", data, "--hidden", "256",
                     "--archs", "ps,allreduce", "--workers", "1,2,3", "--target-accuracy", str(target),
                     "--json"]) == 0
    ranked = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert ranked and all(r["epochs_to_target"] > 0 for r in ranked)


def test_optimize_into_a_closed_pipe_ends_quietly(tmp_path):
    """`optimize ... | head -1`: the reader leaving is no error of optimize's (it printed
    'error: [Errno 32] Broken pipe')."""
    path = write_params(tmp_path, st_dict(stats()))
    p = subprocess.Popen([sys.executable, "-m", "asgd.perf", "optimize", "--params", path, "--cores-per-node", "64",
                          "--hidden", "100", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"{")
    p.stdout.close()   # as head does after its line, while thousands more are to come
    err = p.communicate(timeout=60)[1].decode()
    assert "Broken pipe" not in err and "Traceback" not in err, err
