"""--trace's Chrome Trace Event file, the IPM-style profile, and asgd.perf report's figures."""

import json
import os

import pytest

from asgd.run import results
from conftest import load_results, mpiexec


def check_trace(path, world, servers=1):
    with open(path) as f:
        trace = json.load(f)
    ev = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: (f"server {r}" if r < servers else f"worker {r}") for r in range(world)}
    slices = [e for e in ev if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == set(range(world))  # every rank has a timeline
    assert all(e["dur"] > 0 and e["ts"] >= 0 for e in slices)  # time zero: the first rank's start
    assert {"init", "compute", "comm_wait"} <= {e["name"] for e in slices if e["pid"] >= servers}
    assert {"init", "aggregate", "idle"} <= {e["name"] for e in slices if e["pid"] == 0}
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts and starts.keys() == ends.keys()  # every arrow has both ends
    for fid, s in starts.items():
        f = ends[fid]
        assert f["ts"] >= s["ts"]
        if s["name"] == "Δw":  # worker -> server
            assert s["pid"] >= servers and f["pid"] < servers
        else:                 # w' : server -> worker
            assert s["name"] == "w'" and s["pid"] < servers and f["pid"] >= servers
    return trace, starts


@pytest.mark.openmpi
def test_trace_structure_window_and_an_arrow_per_message_with_two_servers(tmp_path):
    """The trace's structure (check_trace), its --trace-steps window, and the arrows of
    sharded messages: every push goes to and every reply comes from each server. (One
    server's trace: the session's 16-rank run, test_sixteen_ranks_trace_and_report.)"""
    p = mpiexec(5, ["--epochs", "1", "--hidden", "1000", "--servers", "2", "--trace", "--trace-steps", "2:7",
                    "--out", str(tmp_path)])
    assert p.returncode == 0, p.stderr
    _, arrows = check_trace(tmp_path / "trace.json", 5, servers=2)
    # the window holds steps 2..6 of each of 3 workers: a push to and a reply from each of the 2 servers
    assert len(arrows) == 3 * 5 * 2 * 2
    for server in (0, 1):
        assert sum(a["pid"] == server for a in arrows.values() if a["name"] == "w'") == 3 * 5
    assert "trace:" in p.stdout and "message arrows" in p.stdout


def test_sixteen_ranks_trace_and_report(sixteen_ranks, tmp_path):
    """The README's 16-rank run with --trace (the session's, tests/conftest.py)."""
    p, run = sixteen_ranks
    assert p.returncode == 0, p.stderr
    _, arrows = check_trace(run / "trace.json", 16)
    assert {a["pid"] for a in arrows.values() if a["name"] == "Δw"} == set(range(1, 16))
    r = load_results(run)
    assert len(r["profile"]["ranks"]) == 16
    assert r["profile"]["bound"] in {"initialization", "server", "communication", "computation"}
    pytest.importorskip("matplotlib")
    from asgd.perf import report
    assert report.write_figures([str(run), str(run)], str(tmp_path / "fig")) == 0
    for name in ("profile-0-w15.png", "timeline-0-w15.png", "scaling.png"):
        assert os.path.getsize(tmp_path / "fig" / name) > 10_000


def _fake(init, aggregate, compute, wait, oversubscribed=False):
    ranks = [{"rank": 0, "role": "server", "phases": {"init": init, "aggregate": aggregate,
                                                      "idle": 10 - init - aggregate}},
             {"rank": 1, "role": "worker", "phases": {"init": init, "compute": compute,
                                                      "comm_wait": wait, "idle": 10 - init - compute - wait}}]
    return {"ranks": ranks, "init_s": init, "wall_s": 10.0, "config": {"oversubscribed": oversubscribed}}


@pytest.mark.parametrize("args, bound", [
    ((6, 1, 2, 1), "initialization"),
    ((1, 8, 2, 6), "server"),
    ((1, 2, 2, 6), "communication"),
    ((1, 2, 7, 1), "computation"),
])
def test_verdict(args, bound):
    r = _fake(*args)
    prof = results.profile(r)
    assert prof["bound"] == bound
    worker = prof["ranks"][1]
    assert worker["init_pct"] == pytest.approx(10 * args[0])
    assert worker["compute_pct"] == pytest.approx(10 * args[2])
    server = prof["ranks"][0]
    assert server["busy_pct"] == pytest.approx(100 * args[1] / (10 - args[0]))


def test_staleness_of_a_worker_whose_push_was_never_applied():
    """A worker stopped before its first push reached a server (SIGTERM) has an empty
    histogram: its distribution is empty, not a crash of rank 0."""
    records = [{"rank": 0, "role": "server", "staleness_hist": [[], [1, 2]], "step_gap_hist": [[], [3]]},
               {"rank": 1, "role": "worker"}, {"rank": 2, "role": "worker"}]
    results._staleness(records)
    assert records[1]["staleness"] == {"mean": 0.0, "max": 0, "histogram": []}
    assert records[2]["staleness"]["histogram"] == [1, 2] and records[2]["step_gap"]["histogram"] == [3]
    assert records[0]["staleness"]["histogram"] == [1, 2]


def test_staleness_of_p2p_peers_is_their_own_pushes_and_their_shards():
    """A p2p rank is a worker and an owner: `staleness` is its own pushes' on every owner,
    `staleness_applied` the pushes its shard took."""
    records = [{"rank": 0, "role": "peer", "staleness_hist": [[0, 1], [2]], "step_gap_hist": [[1], [1]]},
               {"rank": 1, "role": "peer", "staleness_hist": [[1], [0, 0, 3]], "step_gap_hist": [[1], [1]]}]
    results._staleness(records)
    assert records[0]["staleness"]["histogram"] == [1, 1]          # rank 0's pushes on owners 0 and 1
    assert records[1]["staleness"]["histogram"] == [2, 0, 3]
    assert records[0]["staleness_applied"]["histogram"] == [2, 1]  # what owner 0's shard took
    assert records[1]["staleness_applied"]["histogram"] == [1, 0, 3]


def _built(wall_s, init_s, samples=701_000, updates=3000, worker_start=0.0):
    """results.build over a one-server, one-worker run with the given wall and init times;
    the worker starts worker_start seconds after the server (the launcher's skew)."""
    def rank(k, role, start, phases):
        return {"rank": k, "role": role, "phases": {"init": init_s, **phases},
                "timeline": {"start": start, "init_end": start + init_s, "end": wall_s}}
    ranks = [{**rank(0, "server", 0.0, {"aggregate": 0.0, "idle": wall_s - init_s}),
              "staleness_hist": {1: [updates]}, "step_gap_hist": {1: [updates]}},
             rank(1, "worker", worker_start, {"compute": 0.0, "comm_wait": 0.0, "idle": wall_s - init_s})]
    config = {"world_size": 2, "servers": 1, "workers": 1, "features": 2, "hidden": 10, "classes": 2, "n_w": 52,
              "batch": 64, "lr": 0.1, "epochs": 1}
    return results.build(config=config, ranks=ranks, wall_s=wall_s, meta={"oversubscribed": False},
                         server={"updates": updates, "samples": samples, "history": [], "loss": 0.5,
                                 "accuracy": 0.75})


@pytest.mark.parametrize("wall_s, init_s", [(1.0, 1.0), (1.0, 0.9996)], ids=["zero", "under a millisecond"])
def test_a_training_time_too_short_to_time_gives_no_rate(wall_s, init_s):
    """Issue 39: 701 rows, 1 epoch, 2 ranks printed `train 0.00 s  701,000,000,000
    samples/s` (a division by a clamp of 1e-9 s). A training time near zero, or none at
    all, gives no rate: null in results.json with the reason, and "n/a (reason)" in the
    summary."""
    r = _built(wall_s, init_s)
    t = r["throughput"]
    assert t["samples_per_s"] is None and t["updates_per_s"] is None
    assert t["samples"] == 701_000 and t["updates"] == 3000
    assert ("too short to time" if wall_s > init_s else "no training time") in t["no_rate"]
    assert r["train_s"] == pytest.approx(wall_s - init_s)
    line = next(x for x in results.summary(r, "results.json").splitlines() if x.startswith("wall "))
    assert "samples/s n/a" in line and t["no_rate"] in line
    assert "701,000,000,000" not in line


def test_a_late_starting_rank_does_not_eat_the_training_time():
    """CI, a Slurm step of 3 ranks: one rank started late, its init (counted from its own
    start) ended after rank 0's wall less that init, and train_s = wall_s - init_s came out
    0 with no rate, for a run that trained. Training is timed on the job's one clock: from
    the last rank's end of init to the last rank's end of training."""
    r = _built(wall_s=3.0, init_s=1.0, worker_start=1.5)   # the worker is ready at 2.5 s
    assert r["train_s"] == pytest.approx(0.5)                 # wall - init would say 2.0
    assert r["throughput"]["samples_per_s"] == pytest.approx(701_000 / 0.5)
    r = _built(wall_s=3.0, init_s=1.0, worker_start=2.5)      # init ends at 3.5, after rank 0's wall
    assert r["train_s"] == 0 and r["throughput"]["samples_per_s"] is None


def test_a_training_time_long_enough_gives_rates():
    r = _built(wall_s=3.0, init_s=1.0)
    t = r["throughput"]
    assert t["samples_per_s"] == pytest.approx(701_000 / 2.0) and t["updates_per_s"] == pytest.approx(3000 / 2.0)
    assert t["no_rate"] is None
    assert "350,500 samples/s  1,500.0 updates/s" in results.summary(r, "results.json")


def test_the_summary_counts_in_the_singular_and_the_plural():
    """It said `(0 server, 1 workers)` and `(1 evaluations during training ...)`."""
    r = _built(wall_s=3.0, init_s=1.0)
    assert results.summary(r, "results.json").startswith("asgd: 2 ranks (1 server, 1 worker), 2-10-2 MLP (52 "
                                                          "parameters), batch 64, lr 0.1, 1 epoch\n")
    r["config"].update(world_size=1, servers=0, epochs=3)
    assert results.summary(r, "results.json").startswith("asgd: 1 rank (0 servers, 1 worker), ")
    r["config"].update(world_size=6, servers=1, workers=5, model_parallel=5, replicas=1)
    assert "(1 server, 5 workers in 1 replica of 5), " in results.summary(r, "results.json")
    r["profile"]["eval_pct"] = 12.5
    r["metrics"].update(curve=[[0, 0.5]], eval_s=0.25)
    assert results.evaluations_text(r) == "  (1 evaluation during training: 0.25 s, 12.5% of train)"
    r["metrics"]["curve"] = [[0, 0.5], [1, 0.4]]
    assert results.evaluations_text(r) == "  (2 evaluations during training: 0.25 s, 12.5% of train)"
    r["config"]["eval_deferred"] = True
    assert results.evaluations_text(r).startswith("  (2 copies of w during training, evaluated after it: ")
    r["metrics"]["curve"] = [[0, 0.5]]
    assert results.evaluations_text(r).startswith("  (1 copy of w during training, evaluated after it: ")


def _crowded_start(ranks=16, cores=2, init=9.0, read=0.3, parse=0.5, shuffle=0.4):
    """A default-like run of `ranks` ranks on one node of `cores` cores, 10 s of wall time,
    init `init` s on every rank but the last (0.5 s more: the slowest), its read, parse
    and shuffle as given."""
    out = []
    for r in range(ranks):
        slow = 0.5 if r == ranks - 1 else 0.0
        phases = {"init": init + slow, "read": read, "parse": parse, "shuffle": shuffle + slow,
                  "idle": 10 - init - slow - 0.5}
        if r == 0:
            out.append({"rank": 0, "role": "server", "host": "n0", "phases": {**phases, "aggregate": 0.5}})
        else:
            out.append({"rank": r, "role": "worker", "host": "n0",
                        "phases": {**phases, "compute": 0.3, "comm_wait": 0.2}})
    return {"ranks": out, "init_s": init + 0.5, "wall_s": 10.0,
            "config": {"oversubscribed": ranks > cores, "cores": cores, "world_size": ranks}}


def test_an_initialization_verdict_names_the_part_of_init_and_the_crowding():
    """Issue 39: a default run on 2 cores said only "init is 80-92 %"; most of it was 16
    interpreters importing numpy, mpi4py and numba. The verdict names the largest part of
    the slowest rank's init (start-up: imports and numba's cache, what is left of init
    besides read, parse and shuffle) and, with more ranks than cores, says how many on how
    few; results.json's profile has the parts and the crowding."""
    prof = results.profile(_crowded_start())
    assert prof["bound"] == "initialization"
    assert prof["why"] == ("init is 95% of the wall time, mostly start-up (imports and numba's cache: "
                           "78% of the wall time); 16 ranks on 2 cores")
    assert prof["init_rank"] == 15
    assert prof["init_parts"] == pytest.approx({"start-up": 7.8, "read": 0.3, "parse": 0.5, "shuffle": 0.9})
    assert prof["crowding"] == {"ranks": 16, "cores": 2}
    reading = results.profile(_crowded_start(ranks=2, cores=4, init=8.0, read=6.0, parse=0.5, shuffle=0.2))
    assert reading["why"] == "init is 85% of the wall time, mostly read (60% of the wall time)"
    assert reading["crowding"] is None
