"""--target-accuracy, --target-loss and --eval-every end to end: a run ends at its target on
every rank, cleanly, before its epochs (an unreachable one trains them all), and its
held-out curve has the cadence asked. Small runs (2-64-2 on the embedded problem)."""

import os

import pytest

from conftest import load_results, mpiexec

SMALL = ["--hidden", "64", "--seed", "3", "--quiet"]


def epoch_ends(r: dict) -> set[int]:
    """The samples at which the run's epochs ended (their evaluations are on the curve too)."""
    return {h["samples"] for h in r["metrics"]["history"]}


def check_done_at_target(p, out, epochs: int, kept: bool = True) -> dict:
    """The run exited 0 on every rank, reached its target before its epochs ended, and
    finished as a run that is done: not stopped, no checkpoint, results written; `kept`:
    the weights saved are those that reached it (no update applied after)."""
    assert p.returncode == 0, p.stderr
    r = load_results(out)
    t = r["target"]
    assert t["reached"] and t["metric"] == "accuracy" and t["value"] == 0.97
    assert 0 < t["epochs"] < epochs and len(r["metrics"]["history"]) < epochs
    assert t["samples"] <= r["throughput"]["samples"] < epochs * r["config"]["train_points"]
    reached = [c for c in r["metrics"]["curve"] if c["updates"] == t["updates"]]
    assert reached and reached[0]["accuracy"] >= 0.97 and reached[0]["train_s"] == t["train_s"]
    if kept:
        assert (r["metrics"]["loss"], r["metrics"]["accuracy"]) == (reached[0]["loss"], reached[0]["accuracy"])
        assert r["throughput"]["samples"] == t["samples"]
    assert all(c["accuracy"] < 0.97 for c in r["metrics"]["curve"] if c["updates"] < t["updates"])
    assert r["stopped"] is None and not any(x["stopped"] for x in r["ranks"])
    assert not os.path.exists(os.path.join(out, "checkpoint")) and os.path.exists(os.path.join(out, "weights.npy"))
    assert "reached the target held-out accuracy 0.97" in p.stdout
    return r


def test_a_parameter_server_run_ends_at_its_target_checked_every_n_updates(tmp_path):
    p = mpiexec(3, [*SMALL, "--epochs", "30", "--target-accuracy", "0.97", "--eval-every", "5",
                    "--out", str(tmp_path)], timeout=90)
    r = check_done_at_target(p, tmp_path, 30)
    curve, ends = r["metrics"]["curve"], epoch_ends(r)
    assert curve[0]["updates"] == 5
    for a, b in zip(curve, curve[1:]):   # every 5 updates, counted from the evaluation before
        assert b["updates"] - a["updates"] == 5 or b["samples"] in ends, (a, b)
        assert b["train_s"] > a["train_s"] and b["samples"] > a["samples"]


def test_at_the_default_cadence_a_run_ends_at_its_target_with_its_curve_and_its_cost(tmp_path):
    """--eval-every auto: the evaluations the budget pays for (asgd.core.target.Cadence)
    reach the target; results.json has the curve, the seconds they took and their share
    of the training time (profile.eval_pct; its bound is tests/test_target.py's, on a
    fake clock: no timing here)."""
    p = mpiexec(3, [*SMALL, "--epochs", "30", "--target-accuracy", "0.97", "--out", str(tmp_path)], timeout=90)
    r = check_done_at_target(p, tmp_path, 30)
    assert r["config"]["eval_every"] == "auto"
    m, pct = r["metrics"], r["profile"]["eval_pct"]
    assert m["curve"] and 0 < m["eval_s"] < r["train_s"]
    assert pct == pytest.approx(100 * m["eval_s"] / r["train_s"])
    n = len(m["curve"])   # a target reached at the first evaluation: "1 evaluation"
    said = f"{n} evaluation{'' if n == 1 else 's'} during training: {m['eval_s']:.2f} s, {pct:.1f}% of train"
    assert said in p.stdout


@pytest.mark.parametrize("n, args", [(3, ["--arch", "allreduce"]), (3, ["--arch", "p2p"]),
                                     (5, ["--model-parallel", "2", "--mode", "sync"])], ids=["allreduce", "p2p", "mp"])
def test_every_rank_of_other_architectures_ends_at_its_target(tmp_path, n, args):
    """allreduce's rank 0 says done in its sum; p2p's owner of shard 0 in its replies; a
    model-parallel replica's members agree on done (not asked) in their logits' sum."""
    p = mpiexec(n, [*SMALL, *args, "--epochs", "30", "--target-accuracy", "0.97", "--out", str(tmp_path)], timeout=90)
    check_done_at_target(p, tmp_path, 30, kept=args[1] == "allreduce")   # elsewhere other shards apply the last pushes


def test_an_unreachable_target_trains_every_epoch_with_a_curve_every_n_seconds(tmp_path):
    p = mpiexec(3, [*SMALL, "--hidden", "8000", "--epochs", "3", "--target-loss", "1e-9", "--eval-every", "0.01s",
                    "--out", str(tmp_path)], timeout=90)   # epochs of some 0.1 s in float32 (measured here, 2026-11-28)
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    assert r["target"] == {"metric": "loss", "value": 1e-9, "reached": False, "train_s": None, "epochs": None,
                           "samples": None, "updates": None}
    assert len(r["metrics"]["history"]) == 3 and r["stopped"] is None
    assert r["throughput"]["samples"] >= 3 * r["config"]["train_points"]
    curve, ends = r["metrics"]["curve"], epoch_ends(r)
    between = [b for b in curve if b["samples"] not in ends]
    assert between, "no evaluation between the epochs' ends"
    for a, b in zip(curve, curve[1:]):   # at least 0.01 s apart (from the end of the one before)
        assert b["samples"] in ends or b["train_s"] - a["train_s"] >= 0.01, (a, b)
    assert "never reached the target 1e-09" in p.stdout


def test_p2p_rank_0_evaluates_its_fresh_w_after_its_own_exchanges(tmp_path):
    """p2p's rank 0 evaluates its worker's w, which only that worker's exchange refreshes
    (asgd.core.target.AfterExchange): at --eval-every 1 it evaluates at most once an
    exchange of its own, not at each of the owner's versions (4 peers: 4 times as many).
    Made at once, the evaluations starved its worker and saw the same stale w again."""
    p = mpiexec(4, [*SMALL, "--arch", "p2p", "--epochs", "2", "--eval-every", "1", "--out", str(tmp_path)],
                timeout=90)
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    mine, versions = r["ranks"][0]["updates"], r["throughput"]["updates"]
    curve = r["metrics"]["curve"]
    assert versions >= 3 * mine and mine // 2 <= len(curve) <= mine + len(r["metrics"]["history"])
    assert all(b["updates"] > a["updates"] for a, b in zip(curve, curve[1:]))   # each of a newer w


def test_deferred_evaluation_is_the_online_curve_without_stopping(tmp_path):
    """--eval-deferred: rank 0 copies w at the cadence and evaluates the copies after
    training. In lockstep (sync, deterministic) the same cadence online gives the same
    curve, figure for figure; the deferred run trains every epoch and finds its target
    afterwards, the first copy that reached it; the epochs' ends carry their copies'
    figures."""
    args = [*SMALL, "--mode", "sync", "--epochs", "6", "--eval-every", "3"]
    online = mpiexec(3, [*args, "--out", str(tmp_path / "online")], timeout=90)
    deferred = mpiexec(3, [*args, "--eval-deferred", "--target-accuracy", "0.97", "--out", str(tmp_path / "later")],
                       timeout=90)
    assert online.returncode == 0 and deferred.returncode == 0, online.stderr + deferred.stderr
    a, b = load_results(tmp_path / "online"), load_results(tmp_path / "later")
    figures = [[(c["updates"], c["loss"], c["accuracy"]) for c in r["metrics"]["curve"]] for r in (a, b)]
    assert figures[0] == figures[1] and len(figures[1]) > 6
    ends = [[h["test_accuracy"] for h in r["metrics"]["history"]] for r in (a, b)]
    assert ends[0] == ends[1] and None not in ends[1]
    assert len(b["metrics"]["history"]) == 6 and b["throughput"]["samples"] == a["throughput"]["samples"]
    assert b["metrics"]["eval_after_s"] > 0 and a["metrics"]["eval_after_s"] is None   # the copies' evaluations
    t, curve = b["target"], b["metrics"]["curve"]
    first = next(c for c in curve if c["accuracy"] >= 0.97)   # the embedded rings reach it within 6 epochs
    assert t["reached"] and (t["updates"], t["train_s"]) == (first["updates"], first["train_s"])
    assert "found after training (--eval-deferred), every epoch trained" in deferred.stdout
    assert f"{len(curve)} copies of w during training, evaluated after it" in deferred.stdout


def test_deferred_evaluation_needs_a_cadence_it_can_count():
    p = mpiexec(2, [*SMALL, "--eval-deferred", "--dry-run"], timeout=60)
    assert p.returncode != 0 and "--eval-deferred needs --eval-every N, Ns or epoch" in p.stderr + p.stdout
