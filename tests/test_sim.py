"""asgd.sim: the SimGrid simulation of asgd's protocol.

Most tests use a hand-written parameters file (round numbers, so what the simulation
must give can be worked out here) and run each simulation in a forked child (SimGrid has
one engine per process); one test reads a real `calibrate --quick` file. Every test but
the first skips, saying why, where SimGrid's Python bindings are not installed
(scripts/install_simgrid.sh).
"""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from asgd.core import wire
from asgd.core.target import EVAL_BUDGET
from asgd.data.shares import worker_points
from asgd.net.mlp import Layout
from asgd.net.optimizers import default_lr, worker_lr
from asgd.perf import analytic
from asgd.run.config import Config
from asgd.sim import INSTALL_HINT, available
from asgd.core.waiting import CROWDED_MAX_SLEEP_S
from asgd.sim.costs import Costs, Spec
from asgd.sim.machines import Machine, by_name
from asgd.sim.probes import corrections

needs_simgrid = pytest.mark.skipif(not available(), reason=INSTALL_HINT)

STEP_256 = 0.02     # s per step of 2-10K-2 at batch 256 (the synthetic machine)
C_U = 0.001         # s of server CPU per Delta-w of 50,002 weights


def synthetic_params(**over) -> dict:
    """A params.json 'params' block with round numbers: steps scale linearly in batch
    and hidden, no spread unless asked, a 2-core machine with perfect cores."""
    p = {
        "cores": 2, "effective_cores": {"10000": {"1": 1.0, "2": 2.0, "5": 2.0}},
        "startup": {"imports_wall_s": 0.5, "imports_cpu_s": 0.4, "parsers_wall_s": 0.1, "parsers_cpu_s": 0.1,
                    "kernels_wall_s": 0.05, "kernels_cpu_s": 0.05},
        "embedded_s": 0.01, "startup_by_ranks": {},
        "step_s": {"1000": {"16": STEP_256 / 160, "256": STEP_256 / 10, "1024": 4 * STEP_256 / 10},
                   "10000": {"16": STEP_256 / 16, "256": STEP_256, "1024": 4 * STEP_256}},
        "eval_s_per_point": {"1000": 1e-6, "10000": 1e-5},
        "worker_msg_s": {"5002": 1e-5, "50002": 1e-4},
        "server_update_s": {"5002": C_U / 10, "50002": C_U},
        "round_trip_s": {"5002": 2e-4, "50002": 1.5e-3},
        "pingpong_s": {"8": 5e-6, "65536": 5e-6 + 65536 * 5e-10, "1048576": 5e-6 + 1048576 * 5e-10},
        "contended_update_s": {},
        "read_s_per_byte": {"sequential": {"tsv": 2e-8, "npy": 5e-9}, "parallel": {"tsv": 2e-8, "npy": 5e-9}},
        "select_s_per_point": {"sequential": 5e-8, "parallel": 2e-7},
        "bytes_per_point": {"tsv": 40.0, "npy": 24.0},
        "memory_s_per_byte": 1e-10, "caches": {"L2": 1 << 20, "L3": 32 << 20},
        "sleep_overhead_s": 0.0,
    }
    p.update(over)
    return p


@pytest.fixture
def params_file(tmp_path):
    """write(**over) -> a params.json of synthetic_params(**over) as calibrate writes it:
    the per-precision tables (overrides included) alike in float32 and float64, unless
    `precisions` is given; old=True: as calibrate wrote it before, every table flat."""
    def write(old: bool = False, **over) -> str:
        path = tmp_path / f"params-{len(list(tmp_path.glob('params-*')))}.json"
        params = synthetic_params(**over)
        if not old:
            tables = {k: params.pop(k) for k in analytic.PER_PRECISION if k in params}
            params["precisions"] = over.get("precisions") or {"float32": tables, "float64": tables}
        path.write_text(json.dumps({"schema": 1 if old else 2, "params": params}))
        return str(path)
    return write


def simulate(params_path: str, out=None, trace=False, **spec_over) -> dict:
    """One simulation in a forked child, from a Spec built like the command line's."""
    from asgd.sim.costs import load_params
    from asgd.sim.run import simulate_isolated
    p, raw = load_params(params_path)
    machine = spec_over.pop("machine", by_name("here", p.cores))
    run_over = {k: spec_over.pop(k) for k in list(spec_over) if k in analytic.Run.__dataclass_fields__}
    run = analytic.Run(**{"workers": 3, "epochs": 1, "cores": machine.cores_per_node, **run_over})
    spec = Spec(run=run, machine=machine, **spec_over)
    return simulate_isolated(spec, Costs(p, spec, raw, corrections=corrections), out, trace, params_path=params_path)


def sim_cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asgd.sim", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_without_simgrid_a_clear_error(params_file):
    """asgd works without SimGrid: importing asgd.sim costs nothing, and a simulation
    without the bindings ends with one line saying how to install them (status 2)."""
    code = ("import sys; sys.modules['simgrid'] = None; from asgd.sim.cli import main; "
            "sys.exit(main(['--params', sys.argv[1], '-n', '3']))")
    p = subprocess.run([sys.executable, "-c", code, params_file()], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.startswith("asgd.sim: error:") and "install_simgrid.sh" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    done = subprocess.run([sys.executable, "-c", "import sys, asgd.sim, asgd.sim.cli, asgd.sim.costs; "
                           "print('simgrid' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False"


@needs_simgrid
def test_results_json_is_read_by_compare_and_report(params_file, tmp_path):
    """A simulated run writes results.json (and trace.json) in asgd's schema, which
    `asgd.perf compare` and `report` accept as they do a real run's."""
    pf = params_file()
    out = tmp_path / "sim-run"
    p = sim_cli(["--params", pf, "-n", "4", "--epochs", "2", "--points", "4096", "--reader", "sequential",
                 "--out", str(out), "--trace"])
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "results.json").read_text())
    for key in ("schema", "config", "wall_s", "init_s", "train_s", "metrics", "throughput", "ranks", "profile"):
        assert key in res
    assert res["config"]["world_size"] == 4 and res["config"]["workers"] == 3
    tl = [x["timeline"] for x in res["ranks"]]
    assert res["train_s"] == pytest.approx(max(t["end"] for t in tl) - max(t["init_end"] for t in tl))
    assert 0 < res["train_s"] <= res["wall_s"]
    for r in res["ranks"]:  # phases add up to the rank's wall time, as a real run's do
        total = sum(v for k, v in r["phases"].items() if k not in ("read", "parse", "shuffle"))
        assert total == pytest.approx(res["wall_s"], rel=0.02)
        assert r["timeline"]["init_end"] <= r["timeline"]["end"] <= res["wall_s"]
        assert set(r["staleness"]) == {"mean", "max", "histogram"}
    assert [h["epoch"] for h in res["metrics"]["history"]] == [1, 2]
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("name") == "Δw" for e in trace["traceEvents"])
    from asgd.perf import cli
    rows, skipped = cli.compare([str(out)], cli.load_params(pf))   # what `asgd.perf compare` does
    assert not skipped and len(rows) == 1
    assert rows[0]["train_meas_s"] == pytest.approx(res["train_s"]) and rows[0]["reader"] == "sequential"
    assert cli.main(["report", str(out), "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "profile.png").exists() and (tmp_path / "fig" / "timeline.png").exists()


@needs_simgrid
def test_every_update_applied_once_async_and_sharded(params_file):
    """async, 3 servers: each server applies every worker's every Delta-w slice once;
    the counts are the protocol's: ceil(share / batch) steps per worker and epoch."""
    pf = params_file()
    res = simulate(pf, workers=5, servers=3, batch=100, epochs=2, points=2003, hidden=1000)
    steps = [2 * math.ceil(worker_points(2003, 5, j) / 100) for j in range(5)]
    workers = [r for r in res["ranks"] if r["role"] == "worker"]
    servers = [r for r in res["ranks"] if r["role"] == "server"]
    assert [w["updates"] for w in workers] == steps
    assert [s["requests"] for s in servers] == [sum(steps)] * 3
    assert res["throughput"]["samples"] == 2 * 2003
    edges = [5002 * s // 3 for s in range(4)]   # asgd.core.wire.shard_bounds
    assert [s["shard"] for s in servers] == [[a, b] for a, b in zip(edges, edges[1:])]
    for w, n in zip(workers, steps):  # each server counted each of the worker's pushes
        assert sum(w["staleness"]["histogram"]) == 3 * n


@needs_simgrid
def test_sync_rounds_and_ssp_bound(params_file):
    """sync: every worker takes the same steps, each round applied once, no staleness.
    ssp: with one worker 4x slower, no Delta-w is applied more than K steps ahead of the
    slowest worker (async without the bound runs far ahead)."""
    pf = params_file()
    res = simulate(pf, workers=4, mode="sync", batch=64, epochs=2, points=1000, hidden=1000)
    rounds = 2 * math.ceil(math.ceil(1000 / 4) / 64)
    server = res["ranks"][0]
    assert server["rounds"] == rounds and res["throughput"]["updates"] == rounds
    assert all(r["updates"] == rounds for r in res["ranks"][1:])
    assert server["staleness"]["max"] == 0 and server["step_gap"]["max"] == 0
    K = 2
    ssp = simulate(pf, workers=4, mode="ssp", staleness=K, straggler=4.0, batch=32, points=2000, hidden=1000)
    free = simulate(pf, workers=4, mode="async", straggler=4.0, batch=32, points=2000, hidden=1000)
    assert ssp["ranks"][0]["step_gap"]["max"] <= K
    assert free["ranks"][0]["step_gap"]["max"] > 3 * K
    def wait(r):  # the fast workers' (ranks 1-3) time waiting
        return sum(x["phases"]["comm_wait"] for x in r["ranks"][1:4])
    assert wait(ssp) > 5 * wait(free)  # the bound holds the fast workers' replies back


@needs_simgrid
def test_the_simulated_worker_overlaps_as_the_real_one_does(params_file):
    """The simulated worker runs the real one's loop (asgd.core.worker): with --overlap
    off every push is waited for before the next step (the simulator used to overlap
    anyway), with on none is."""
    for overlap, waits in (("off", True), ("on", False)):
        res = simulate(params_file(), overlap=overlap)
        workers = [r for r in res["ranks"] if r["role"] == "worker"]
        assert len(workers) == 3
        assert all(r["waited"] == (r["updates"] if waits else 0) and r["updates"] > 0 for r in workers), workers


@needs_simgrid
def test_sequential_init_grows_linearly_with_ranks(params_file):
    """The sequential reader passes a token: every rank reads and parses the whole file
    in turn, so init grows by one file's read per rank (eq. 12), while the parallel
    reader's stays nearly flat. One rank per node (no cores shared)."""
    pf = params_file()
    node = Machine("cluster", cores_per_node=4, topology="star", link_bw=1.25e9, link_lat=20e-6)
    points, per = 100_000, 40.0
    inits = {}
    for reader, ws in (("sequential", (2, 4, 8, 16)), ("parallel", (2, 16))):
        for w in ws:
            res = simulate(pf, machine=node, nodes=w + 1, placement="spread", workers=w, reader=reader,
                           points=points, test_points=points // 4, file_bytes=int(points * per),
                           test_bytes=int(points // 4 * per), hidden=1000)
            inits[reader, w] = res["init_s"]
    ws = np.array([2, 4, 8, 16])
    seq = np.array([inits["sequential", w] for w in ws])
    slope, icpt = np.polyfit(ws + 1, seq, 1)
    fit = slope * (ws + 1) + icpt
    r2 = 1 - ((seq - fit) ** 2).sum() / ((seq - seq.mean()) ** 2).sum()
    assert r2 > 0.999
    turn = 2e-8 * points * per + 5e-8 * points   # r_d x the file's bytes + keeping its points
    assert slope == pytest.approx(turn, rel=0.1)
    assert inits["parallel", 16] < inits["sequential", 16] - 10 * turn
    assert inits["parallel", 16] - inits["parallel", 2] < 0.1 * (seq[-1] - seq[0])


@needs_simgrid
def test_one_server_saturates_where_mva_says(params_file):
    """One worker per node, so workers never share a core: updates/s grows with the
    workers while they are the bottleneck and flattens at the server's 1/c_u past the
    knee MVA predicts ((Z + c_u) / c_u workers)."""
    c_u = 0.004
    pf = params_file(server_update_s={"5002": c_u / 10, "50002": c_u}, worker_msg_s={"5002": 0.0, "50002": 0.0})
    node = Machine("cluster", cores_per_node=2, topology="star", link_bw=100e9, link_lat=1e-6)
    knee = analytic.saturation_workers(STEP_256, c_u)   # 6 workers
    rates = {}
    for w in (2, 3, 12, 24):
        res = simulate(pf, machine=node, nodes=w + 1, placement="spread", workers=w, points=256 * 25 * w,
                       test_points=16)
        rates[w] = res["throughput"]["updates_per_s"]
    assert rates[2] == pytest.approx(2 / STEP_256, rel=0.15)   # below the knee: workers' rate
    assert rates[3] == pytest.approx(3 / STEP_256, rel=0.15)
    assert rates[12] == pytest.approx(1 / c_u, rel=0.1)        # past it: the server's
    assert rates[24] == pytest.approx(1 / c_u, rel=0.1)
    assert 2 < knee < 12


@needs_simgrid
def test_other_users_load_takes_its_share_of_the_cores(params_file):
    """--background X: other processes take X cores' worth of the node meanwhile. Three
    workers on 2 cores compute at 2/3 of a core each; with one core's worth taken by
    others, at 1/3."""
    pf = params_file()
    # one evaluation, at the end (auto's budget would have rank 0 evaluate at every version: 5 % of the CPU)
    run = dict(workers=3, points=3 * 256 * 50, test_points=16, epochs=1, eval_every="epoch")
    alone = simulate(pf, **run)["ranks"][1]["phases"]["compute"]
    shared = simulate(pf, background=1.0, **run)["ranks"][1]["phases"]["compute"]
    assert alone == pytest.approx(50 * STEP_256 * 1.5, rel=0.05)
    assert shared == pytest.approx(2 * alone, rel=0.05)
    # on a machine whose calibrated cores' worth is less than its cores, a sliver of others'
    # load takes its sliver of that worth: never the cores' worth replaced by the cores left
    worth = params_file(effective_cores={"10000": {"1": 1.0, "2": 1.6, "5": 1.6}})
    alone = simulate(worth, **run)["ranks"][1]["phases"]["compute"]
    sliver = simulate(worth, background=0.02, **run)["ranks"][1]["phases"]["compute"]
    half = simulate(worth, background=1.0, **run)["ranks"][1]["phases"]["compute"]
    assert alone == pytest.approx(50 * STEP_256 * 3 / 1.6, rel=0.05)
    assert alone < sliver == pytest.approx(alone / 0.99, rel=0.02)
    assert half == pytest.approx(2 * alone, rel=0.05)
    # the cores' worth itself: one busy rank beside one core's worth of load still has a
    # core of its own; three share the one left; a sliver takes its sliver of 1.6
    from asgd.sim.costs import load_params
    for path, bg, want in ((pf, 1.0, {1: 1.0, 2: 1.0, 3: 1.0}), (worth, 0.02, {1: 1.0, 3: 1.6 * 0.99})):
        p, raw = load_params(path)
        machine = by_name("here", p.cores)
        spec = Spec(run=analytic.Run(workers=3, epochs=1, cores=machine.cores_per_node), machine=machine,
                    background=bg)
        costs = Costs(p, spec, raw, corrections=corrections)
        assert {n: costs.cores_worth(n) for n in want} == pytest.approx(want)


def wire_sizes(servers: int, compress: str, precision: str = "float64") -> list[tuple[int, int]]:
    """(push, reply) bytes per server shard of 2-10K-2, as asgd.core.wire counts them (the
    protocol's own count): every value, or 1-bit over the shard's columns, in `precision`."""
    layout = Layout(2, 10000, 2)
    size = wire.itemsize(precision)
    return [(wire.push_bytes(hi - lo, layout.columns(lo, hi) if compress == "1bit" else None, size),
             wire.pull_bytes(hi - lo, layout.columns(lo, hi) if compress == "1bit" else None, size))
            for lo, hi in wire.shard_bounds(layout.n_w, servers)]


@needs_simgrid
def test_the_simulated_ring_moves_the_bytes_a_real_ring_counts(params_file):
    """asgd's ring allreduce (the default --allreduce): each rank's simulated bytes are
    asgd.core.wire.ring_bytes per update, as a real run counts them (test_architectures)."""
    res = simulate(params_file(), workers=3, points=2048, arch="allreduce", servers=0)
    n = res["config"]["n_w"] + 3
    for x in res["ranks"]:
        sent, recv = wire.ring_bytes(n, 3, x["rank"])
        assert (x["bytes_sent"], x["bytes_recv"]) == (sent * x["updates"], recv * x["updates"]) != (0, 0)


@needs_simgrid
def test_each_ring_swap_is_a_wait_of_its_own(params_file):
    """Ring._swap waits for each swap on its own (Waiter.all), its backoff from the first
    sleep: 5 ranks on 2 cores, no crowding probes, an iteration takes the steps' shared
    compute (5 x STEP_256 / 2) and little more. Waking every swap at the 1 ms steady sleep
    of one wait from the start of the sum added a millisecond to each of the 8 swaps."""
    res = simulate(params_file(), workers=5, points=5 * 256 * 4, arch="allreduce", servers=0, test_points=0)
    floor = 5 * STEP_256 / 2
    assert floor < res["train_s"] / 4 < floor + 2 * CROWDED_MAX_SLEEP_S


def two_precisions(float32_speedup: float) -> dict:
    """synthetic_params' per-precision tables as calibrate writes them now: float64's as
    they are, float32's every cost float64's over `float32_speedup`."""
    flat = synthetic_params()
    f64 = {k: flat[k] for k in analytic.PER_PRECISION if k in flat}

    def faster(t):
        return {k: faster(v) for k, v in t.items()} if isinstance(t, dict) else t / float32_speedup
    return {"float64": f64, "float32": faster(f64)}


def costs_at(params_path: str, precision: str) -> Costs:
    from asgd.sim.costs import load_params
    p, raw = load_params(params_path)
    run = analytic.Run(workers=3, hidden=10000, batch=256, cores=p.cores, precision=precision)
    return Costs(p, Spec(run=run, machine=by_name("here", p.cores)), raw, corrections=None)


def test_the_simulator_prices_each_precision_at_its_own_rates(params_file):
    """Fails if a float32 run's steps, server updates, messages or evaluation cost
    float64's: with every float32 cost half float64's, each of them is half."""
    pf = params_file(precisions=two_precisions(2.0))
    c32, c64 = costs_at(pf, "float32"), costs_at(pf, "float64")
    assert c64.step(256) == pytest.approx(STEP_256) and c32.step(256) == pytest.approx(STEP_256 / 2)
    for cost in (lambda c: c.server_update(0, 50002), lambda c: c.worker_message(0, 50002), lambda c: c.evaluate()):
        assert cost(c32) == pytest.approx(cost(c64) / 2)
    # a pass over memory: float32's rate per byte (half) over half the bytes
    assert c32.allreduce_add(1000) == pytest.approx(c64.allreduce_add(1000) / 4)


def test_the_simulator_prices_an_evaluation_at_the_pilots_measured_figure(params_file):
    """Where the pilot measured the held-out evaluation on the data (statistics.evaluation),
    a run of that shape and precision evaluates at it, as the model does (Params.shaped);
    at another hidden size, by calibrate's ratio between them (no shape_s here)."""
    from asgd.sim.costs import load_params
    path = params_file()
    got = json.loads(open(path).read())
    got["statistics"] = {"evaluation": {"s_per_point": 3e-5, "evaluations": 40, "features": 784, "classes": 10,
                                        "hidden": 1000, "precision": "float64"}}
    with open(path, "w") as f:
        json.dump(got, f)
    p, raw = load_params(path)

    def evaluation(hidden):
        run = analytic.Run(workers=3, hidden=hidden, batch=256, cores=p.cores, features=784, classes=10,
                           test_points=100, precision="float64")
        return Costs(p, Spec(run=run, machine=by_name("here", p.cores)), raw, corrections=None).evaluate()
    with pytest.warns(analytic.ShapeFallback):   # its steps: calibrated before shape_s, 2-H-2's
        assert evaluation(1000) == pytest.approx(100 * 3e-5)
        assert evaluation(10000) == pytest.approx(100 * 3e-5 * 10)   # 1e-5 / 1e-6 between the hidden sizes


def test_an_old_float64_params_file_still_simulates_float32_at_its_rates(params_file):
    """A params.json from before both precisions (every table flat) is float64's: a
    float32 run gets its rates with a PrecisionFallback warning, and its own bytes."""
    pf = params_file(old=True)
    with pytest.warns(analytic.PrecisionFallback, match="float64 rates only"):
        c32 = costs_at(pf, "float32")
    c64 = costs_at(pf, "float64")
    assert c32.step(256) == pytest.approx(c64.step(256)) and c32.itemsize == 4 and c64.itemsize == 8


@needs_simgrid
def test_a_simulated_float32_run_trains_at_float32s_rates(params_file):
    """End to end: float32's every cost half float64's, a compute-bound run (one worker)
    simulates in about half the training time (its messages' bytes are shared-memory copies
    at calibrate's one ping-pong rate, a small part)."""
    pf = params_file(precisions=two_precisions(2.0))
    f64, f32 = (simulate(pf, workers=1, points=4096, precision=prec)["train_s"] for prec in ("float64", "float32"))
    assert f32 == pytest.approx(f64 / 2, rel=0.05)


@needs_simgrid
@pytest.mark.parametrize("servers", [1, 2, 3])
@pytest.mark.parametrize("compress", ["none", "1bit"])
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_messages_are_the_bytes_a_real_run_counts(params_file, servers, compress, precision):
    """Every push and reply has the size the protocol counts: on one server a 1-bit push of
    2-10K-2 is 6,395 bytes and a reply 6,371 in float64 (what a real run counts:
    test_train_e2e's 1-bit test), uncompressed 400,064 and 400,040 (50,002 values and 6 / 3
    float64 header values); in float32 every value of w and every scale takes 4 bytes; with
    2 or 3 servers each shard's own size (asgd.core.wire over its columns)."""
    sizes = wire_sizes(servers, compress, precision)
    if servers == 1:
        assert sizes == [{("none", "float64"): (400_064, 400_040), ("1bit", "float64"): (6395, 6371),
                          ("none", "float32"): (200_056, 200_032),
                          ("1bit", "float32"): (6395 - 4 * 2 * 6, 6371 - 4 * 2 * 6)}[compress, precision]]   # 6 columns
    res = simulate(params_file(), workers=2, servers=servers, points=2048, compress=compress, precision=precision)
    assert res["config"]["precision"] == precision
    srv, workers = res["ranks"][:servers], res["ranks"][servers:]
    updates = sum(w["updates"] for w in workers)
    assert updates == 2 * math.ceil(1024 / 256)
    for w in workers:
        assert w["bytes_sent"] == w["updates"] * sum(push for push, _ in sizes)
        assert w["bytes_recv"] == w["updates"] * sum(pull for _, pull in sizes)
    for s, (push, pull) in zip(srv, sizes):
        assert (s["bytes_recv"], s["bytes_sent"]) == (updates * push, updates * pull)


@needs_simgrid
def test_a_real_calibration_drives_the_simulator(quick_params, tmp_path):
    """A params.json straight from `calibrate --quick` (its step spread and sleep
    overhead included) simulates a 5-rank run; the simulated start-up matches the
    calibrated job start-up it was built from, within 10%."""
    p = sim_cli(["--params", str(quick_params), "-n", "5", "--epochs", "1", "--out", str(tmp_path / "r"), "--json"])
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert res["simulated"]["step_spread"] is True
    got = json.loads(p.stdout)
    assert got["train_s"] > 0 and got["init_s"] > 0
    cal = res["simulated"]["startup_check"]["calibrated_job_startup_s"]
    assert res["init_s"] == pytest.approx(cal, rel=0.1)


SPREAD = {"10000": {"256": {"p": [0.0, 0.5, 1.0], "ratio": [1.0, 1.2, 3.0]}}}   # steps up to 3x the best


@needs_simgrid
def test_same_seed_same_results_in_any_process(params_file, tmp_path):
    """The step-time draws are seeded from (seed, rank, purpose) alone: the same simulation
    in two processes whose string hashing is salted differently (PYTHONHASHSEED) writes the
    same results.json, apart from simulated.sim_wall_s (the simulator's own wall time, not
    the simulated run's); another --seed draws other steps."""
    pf = params_file(step_spread=SPREAD)

    def run(hash_seed: str, seed: int) -> dict:
        cwd = tmp_path / f"h{hash_seed}-s{seed}"
        cwd.mkdir()
        p = subprocess.run([sys.executable, "-m", "asgd.sim", "--params", pf, "-n", "4", "--points", "4096",
                            "--epochs", "1", "--seed", str(seed), "--out", "r", "--quiet"], cwd=cwd,
                           env={**os.environ, "PYTHONHASHSEED": hash_seed}, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        res = json.loads((cwd / "r" / "results.json").read_text())
        del res["simulated"]["sim_wall_s"]
        return res
    first = run("1", 0)
    assert run("2", 0) == first
    assert run("1", 1)["ranks"][1]["phases"]["compute"] != first["ranks"][1]["phases"]["compute"]


def options_of(config: dict) -> dict:
    """asgd.train's options in a results.json config."""
    return {k: config[k] for k in Config.__dataclass_fields__}


@needs_simgrid
@pytest.mark.parametrize("mode, averaged", [("async", 1), ("sync", 3)])
def test_config_is_what_was_simulated(params_file, tmp_path, mode, averaged):
    """results.json's config describes the simulated run: its messages (--compress, as
    asgd.train spells it), and the optimizer whose costs were charged (asgd.train's default,
    adagrad) with its default lr for the workers and mode; every other option of
    asgd.train at its default."""
    out = tmp_path / "r"
    p = sim_cli(["--params", params_file(), "-n", "4", "--mode", mode, "--compress", "1bit", "--hidden", "1000",
                 "--points", "2048", "--epochs", "1", "--out", str(out), "--quiet"])
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "results.json").read_text())
    c = res["config"]
    lr = default_lr(Config.optimizer, 1000, averaged)
    assert (c["optimizer"], c["lr"], c["compress"]) == (Config.optimizer, lr, "1bit")
    assert c["worker_lr"] == worker_lr(Config.optimizer, lr)   # adagrad: the server applies lr
    assert (c["mode"], c["hidden"], c["workers"], c["servers"]) == (mode, 1000, 3, 1)
    worker = res["ranks"][1]
    layout = Layout(2, 1000, 2)
    assert c["precision"] == Config.precision   # asgd.train's default: the scales' bytes
    push = wire.push_bytes(layout.n_w, layout.columns(0, layout.n_w), wire.itemsize(c["precision"]))
    assert worker["bytes_sent"] == worker["updates"] * push   # what config says is what was sent
    told = {"mode": mode, "hidden": 1000, "epochs": 1, "compress": "1bit", "optimizer": Config.optimizer, "lr": lr,
            "classes": 2, "data": "simulated-2048.tsv", "out": str(out)}
    assert options_of(c) == {**Config().to_dict(), **told}


def test_compress_is_spelled_as_asgd_train(params_file):
    """One spelling: --compress, as asgd.train; --compression is gone. 1-bit messages need
    parameter servers, as in asgd.train."""
    from asgd.sim import cli
    assert cli.parse_args(["--compress", "1bit"]).compress == "1bit"
    with pytest.raises(SystemExit):
        cli.parse_args(["--compression", "1bit"])
    p = sim_cli(["--params", params_file(), "-n", "3", "--arch", "allreduce", "--compress", "1bit"])
    assert p.returncode == 2
    assert p.stderr.strip() == ("asgd.sim: error: --compress 1bit needs --arch ps or p2p "
                                "(allreduce sums Delta-w as it is)")


def write_run(folder, **options) -> dict:
    """A run folder whose results.json config is what asgd.train writes for `options`
    (Config's fields, then what the run resolved: lr, the rank counts, the data's sizes)."""
    cfg = Config(**options)
    servers = 0 if cfg.arch == "allreduce" else cfg.servers
    config = {**cfg.to_dict(), "out": str(folder), "lr": cfg.lr, "servers": servers, "workers": 3,
              "world_size": 3 + servers, "worker_lr": cfg.lr if cfg.optimizer == "sgd" else 1.0,
              "features": 2, "classes": 2, "n_w": Layout(2, cfg.hidden, 2).n_w, "train_points": 2048,
              "test_points": 512}
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"schema": 1, "config": config}))
    return config


@needs_simgrid
def test_like_keeps_the_runs_options(params_file, tmp_path):
    """--like RUN_DIR simulates that run: its messages (1-bit), optimizer and lr (with a
    warning that its server's update is charged at sgd's cost), mode, servers, seed and
    every other option are in the simulated config as the run had them, but for the
    simulation's own outputs (out, trace); an option given overrides the run's."""
    run = write_run(tmp_path / "run", optimizer="adagrad", lr=0.02, compress="1bit", mode="ssp", staleness=2,
                    servers=2, seed=7, hidden=1000, batch=64, epochs=1, standardize=True, timeout=600.0,
                    progress=5.0, mpi_progress="off", stall_timeout=30.0, checkpoint_every="30s",
                    trace=True, trace_steps="0:50", quiet=False)
    out = tmp_path / "sim"
    p = sim_cli(["--params", params_file(), "--like", str(tmp_path / "run"), "--out", str(out), "--quiet"])
    assert p.returncode == 0, p.stderr
    assert "--optimizer adagrad" in p.stderr and "plain SGD's calibrated cost" in p.stderr
    res = json.loads((out / "results.json").read_text())
    c = res["config"]
    simulated_outputs = {"out": str(out), "trace": False, "trace_steps": "0:200"}
    assert options_of(c) == {**options_of(run), **simulated_outputs}
    assert (c["worker_lr"], c["world_size"], c["workers"], c["servers"]) == (1.0, 5, 3, 2)
    layout = Layout(2, 1000, 2)
    size = wire.itemsize(c["precision"])   # the run's, as --like took it
    sizes = [wire.push_bytes(hi - lo, layout.columns(lo, hi), size) for lo, hi in wire.shard_bounds(layout.n_w, 2)]
    worker = res["ranks"][2]
    assert worker["bytes_sent"] == worker["updates"] * sum(sizes)   # 1-bit messages were simulated
    over = tmp_path / "sim-over"
    p = sim_cli(["--params", params_file(), "--like", str(tmp_path / "run"), "--compress", "none", "--seed", "3",
                 "--mode", "async", "--out", str(over), "--quiet"])
    assert p.returncode == 0, p.stderr
    c = json.loads((over / "results.json").read_text())["config"]
    assert options_of(c) == {**options_of(run), **simulated_outputs, "out": str(over), "compress": "none",
                             "seed": 3, "mode": "async"}


@needs_simgrid
def test_p2p_and_model_partitioning_follow_the_protocol(params_file):
    """p2p: every peer owns 1/N of w and applies every peer's push of it once (its own
    included), its bytes those to and from the other peers. --model-parallel 2 with 2
    servers: a member pushes its slice's one shard only, and each step pays the replica's
    logit sum; the calibrated optimizer's extra cost lengthens the servers' work."""
    pf = params_file(optimizer_s={"sgd": {5002: 1e-5, 50002: 1e-4}, "adagrad": {5002: 1e-3, 50002: 1e-2}},
                     exchange_s={"replica": {"2": {"16": 1e-4, "1024": 1e-4}}})
    res = simulate(pf, workers=3, arch="p2p", servers=3, batch=128, points=1536, hidden=1000)
    peers = res["ranks"]
    steps = [math.ceil(worker_points(1536, 3, j) / 128) for j in range(3)]
    assert [r["role"] for r in peers] == ["peer"] * 3 and [r["updates"] for r in peers] == steps
    shards = [5002 * s // 3 for s in range(4)]
    for r in peers:
        own = shards[r["rank"] + 1] - shards[r["rank"]]
        others = [shards[s + 1] - shards[s] for s in range(3) if s != r["rank"]]
        assert r["rounds"] == sum(steps)   # its owner applied every peer's push
        pushes = r["updates"] * sum(wire.PUSH_HEADER * 8 + 8 * n for n in others)
        assert r["bytes_sent"] >= pushes and own > 0
    runs = {o: simulate(pf, workers=4, servers=2, model_parallel=2, batch=128, points=1024, hidden=1000, optimizer=o)
            for o in ("sgd", "adagrad")}
    mp = runs["sgd"]
    workers = [r for r in mp["ranks"] if r["role"] == "worker"]
    assert all(r["phases"]["replica_sum"] > 0 for r in workers)
    assert [s["requests"] for s in mp["ranks"][:2]] == [2 * math.ceil(512 / 128)] * 2   # a slice's 2 members each
    def busy(r):
        return sum(s["phases"].get("aggregate", 0) for s in r["ranks"][:2])
    extra = 1e-3 - (5002 - 2501) * (1e-2 - 1e-3) / 45000 - 1e-5 * 2501 / 5002   # adagrad less sgd at a shard
    assert busy(runs["adagrad"]) - busy(mp) == pytest.approx(2 * 8 * extra, rel=0.25)   # 8 updates a server


@pytest.mark.parametrize("mode, crowd", [("async", "p2p"), ("sync", None)])
def test_a_p2p_peer_pays_one_wait_and_its_owners_only_their_bytes(params_file, mode, crowd):
    """protocol.p2p: an owner serves inside its peer's loop (Server.poll from the step's
    progress and the link's waits), never sleeping and waking for a push as calibrate's
    server did (c_u's fixed part): a peer's push costs the worker's part of one push/pull,
    each owner's push its bytes. Crowded, an asynchronous push meets p2p's probe's turns:
    its owners are computing ranks (a lockstep round meets them once its replies are in)."""
    from types import SimpleNamespace
    from asgd.sim.costs import load_params
    from asgd.sim.links import MailboxLink
    p, raw = load_params(params_file(contended_update_s={"5": {"5002": 5e-3, "50002": 5e-3}}))
    spec = Spec(run=analytic.Run(workers=5, servers=5, arch="p2p", mode=mode, cores=2), machine=by_name("here", 2))
    c = Costs(p, spec, raw, corrections=None)
    world = SimpleNamespace(costs=c, topo=c.topo, spec=spec, run=spec.run, clocks=[None] * 5, node=[0] * 5)
    k = c.topo.shards[0][1] - c.topo.shards[0][0]
    link = MailboxLink(world, 1, [0, 1, 2, 3, 4])
    # 5 ranks on 2 cores: the contended 5e-3 per push/pull of a shard, the worker's part of
    # it as uncrowded (worker_msg_s is a tenth of server_update_s at every size): 1/11
    assert k == 10000 and link.cpu == pytest.approx(5e-3 / 11) and link.push_crowd == crowd
    assert c.owner_push(k) == pytest.approx(4 * c.itemsize * k * 1e-10)
    onebit = Costs(p, dataclasses.replace(spec, compress="1bit"), raw, corrections=None)   # and it decodes each
    assert onebit.owner_push(k) == pytest.approx(6 * c.itemsize * k * 1e-10)


@needs_simgrid
@pytest.mark.parametrize("kind", ["ring", "p2p", "replica"])
@pytest.mark.parametrize("factor", [0.8, 1.5])
def test_crowded_rounds_meet_the_probes_measured_rounds(params_file, tmp_path, monkeypatch, kind, factor):
    """Where calibrate's KIND+step probe of 5 ranks on the 2 cores measured a round longer
    or shorter than the simulator's own, the simulator's round of that probe is the
    measured one (sim.probes: the difference, added or taken per round)."""
    from asgd.perf.architectures import STEP_PROBE
    from asgd.sim import probes
    from asgd.sim.costs import load_params
    from asgd.sim.run import simulate_isolated
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    p, raw = load_params(params_file())
    own = probes.simulated_round(kind, 5, p, raw)
    H, B = STEP_PROBE
    measured = own * factor
    q, raw_q = load_params(params_file(exchange_s={f"{kind}+step": {"5": {str(B if kind == "replica" else 5 * H + 2):
                                                                           measured}}}))
    spec = Spec(run=probes.probe_run(kind, 5), machine=by_name("here", q.cores))
    costs = Costs(q, spec, raw_q, corrections=probes.corrections)
    got = simulate_isolated(spec, costs, None)["train_s"] / probes.ROUNDS
    assert got == pytest.approx(measured, rel=0.05) and abs(got - own) > 0.1 * own
    assert list((tmp_path / "cache" / "asgd").glob("sim-probes-*.json"))   # kept for the next simulation


@needs_simgrid
def test_one_server_evaluates_every_epoch_with_model_partitioning(params_file):
    """Rank 0, the one server, holds both slices: with --eval-every epoch it evaluates
    after every epoch, as asgd.train's does (run.roles.tracker_of); with two servers,
    never during training (the final metrics come after it)."""
    epochs, test_points = 3, 4096
    one = simulate(params_file(), workers=2, model_parallel=2, epochs=epochs, points=2 * 256 * 2,
                   test_points=test_points, eval_every="epoch")
    per = test_points * 1e-5          # eval_s_per_point at hidden 10,000 (3 ranks share 2 cores: a bit more)
    assert epochs * per <= one["ranks"][0]["phases"]["evaluate"] < (epochs + 0.5) * per
    two = simulate(params_file(), workers=2, servers=2, model_parallel=2, epochs=epochs, points=2 * 256 * 2,
                   test_points=test_points, eval_every="epoch")
    assert two["ranks"][0]["phases"].get("evaluate", 0.0) == 0.0


@needs_simgrid
def test_auto_evaluations_keep_to_their_budget_in_the_simulation(params_file):
    """--eval-every auto (the default), as the tracker decides it: an evaluation an eighth
    of an epoch (float32's 2-10K-2 on this machine: 14 %) is not made at every epoch's
    end; the budget's 5 % of training pays for some, after the estimate's wait. The
    simulator made one an epoch (float32's median train APE 16.1 %)."""
    epochs, test_points = 40, 1024   # an epoch: 4 steps of 0.02 s; an evaluation 0.01 s
    res = simulate(params_file(), workers=1, epochs=epochs, points=4 * 256, test_points=test_points)
    spent, per = res["ranks"][0]["phases"].get("evaluate", 0.0), test_points * 1e-5
    assert per > EVAL_BUDGET * 4 * STEP_256   # one an epoch would not fit its budget
    assert 2 * per <= spent <= EVAL_BUDGET * res["train_s"] + 1e-9 and spent < epochs * per / 2


@needs_simgrid
def test_evaluations_follow_the_cadence(params_file):
    """Rank 0 evaluates when asgd.core.target.Cadence says, as asgd.train's does: auto
    within 5 % of the training time however cheap one is, `epoch` at each epoch's end, N
    updates every N besides."""
    run = dict(workers=2, epochs=2, points=2 * 256 * 100, test_points=256)
    per = 256 * 1e-5          # eval_s_per_point at hidden 10,000
    got = {}
    for every in ("auto", "epoch", "50"):
        res = simulate(params_file(), eval_every=every, **run)
        got[every] = res["ranks"][0]["phases"].get("evaluate", 0.0), res["train_s"]
    spent, train = got["auto"]
    assert 0.03 * train < spent <= 0.05 * train and spent > 3 * per    # several, within the budget
    # (3 ranks share 2 cores: an evaluation's wall time is up to 1.5 x its cost)
    assert 2 * per <= got["epoch"][0] <= 2 * 1.5 * per
    assert got["50"][0] / got["epoch"][0] == pytest.approx((400 / 50 + 2) / 2, rel=0.1)   # 400 updates, 2 epoch ends


@needs_simgrid
def test_a_p2p_rank_0_evaluates_after_its_own_exchanges_as_the_trainer_does(params_file):
    """At --eval-every 1 a ps server evaluates every version; p2p's rank 0 evaluates its
    worker's w once that worker's exchange is done (core.target.AfterExchange), so at
    most once an exchange of its own: 3 peers of 20 steps make 60 versions, and rank 0
    about 20 evaluations, on its worker's clock."""
    run = dict(workers=3, epochs=1, points=3 * 64 * 20, batch=64, test_points=256, eval_every="1")
    per = 256 * 1e-5          # eval_s_per_point at hidden 10,000
    ps = simulate(params_file(), **run)["ranks"][0]["phases"].get("evaluate", 0.0)
    p2p = simulate(params_file(), arch="p2p", **run)["ranks"][0]["phases"].get("evaluate", 0.0)
    assert ps >= 55 * per
    assert 15 * per <= p2p <= 1.5 * 21 * per   # (ranks share cores: up to 1.5 x its cost)


@needs_simgrid
def test_the_simulated_async_server_answers_before_it_applies(params_file, tmp_path):
    """The simulator's server drives asgd.core's shard and policy, as the real one does:
    async answers a push the moment it arrives and applies it after, so the update's cost
    (c_u, 1 ms here) is off the worker's round trip, and a lone worker overlapping its
    steps sees every push from the third on two versions behind (the first 0, the second
    1), the histogram a real run records (test_train_e2e's
    test_staleness_is_counted_from_the_w_a_push_was_computed_from). Applying first, the
    simulation had one version less and c_u in every round trip."""
    out = tmp_path / "run"
    res = simulate(params_file(), out=str(out), trace=True, workers=1, batch=256, points=2560, hidden=10000)
    pushes = res["ranks"][1]["updates"]
    assert pushes == 10
    assert res["ranks"][0]["staleness"]["histogram"] == [1, 1, pushes - 2]
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    arrived = {e["id"]: e["ts"] for e in events if e.get("ph") == "f" and e["pid"] == 0}
    answered = {e["id"]: e["ts"] for e in events if e.get("ph") == "s" and e["pid"] == 0}
    for k in range(pushes):
        push, reply = wire.flow_id(1, 0, k, False), wire.flow_id(1, 0, k, True)
        assert answered[reply] == pytest.approx(arrived[push], abs=1.0)   # µs: no c_u between


@needs_simgrid
def test_the_simulator_predicts_time_to_a_target_from_the_staleness_it_simulates(params_file, tmp_path):
    """--target-accuracy: the pilot's statistics (in --params) fed the simulated staleness;
    epochs x the simulated s/epoch + the simulated init. Lockstep: staleness 0, a batch of
    every worker's samples."""
    curve = [{"samples": 16384 * k, "accuracy": 0.5 + 0.1 * k, "loss": 1.0 / k} for k in range(1, 5)]
    stats = {"b_noise": 100.0, "staleness_cost": 0.2, "staleness_one": 1.0, "staleness_per_worker": 1.0,
             "references": {"adagrad": {"batch": 256, "staleness": 1.0, "points": 16384, "curve": curve}},
             "data": "embedded", "hidden": 10000}
    pf = params_file()
    raw = json.loads(open(pf).read())
    raw["statistics"] = stats
    open(pf, "w").write(json.dumps(raw))
    got = {}
    for mode in ("async", "sync"):
        p = sim_cli(["--params", pf, "-n", "4", "--epochs", "1", "--mode", mode, "--optimizer", "adagrad",
                     "--target-accuracy", "0.8", "--json"])
        assert p.returncode == 0, p.stderr
        got[mode] = json.loads(p.stdout)
    e_min = 3.0 / ((1 + 256 / 100) * (1 + 0.2 * 1.0))    # the reference reached 0.8 at 3 epochs
    step = 5462 / 22      # a worker's share of 16,384 points in 22 steps of at most 256: the samples of one
    a, s = got["async"]["target"], got["sync"]["target"]
    assert a["mean_staleness"] > 0 and s["mean_staleness"] == 0
    assert a["epochs"] == pytest.approx(e_min * (1 + step / 100) * (1 + 0.2 * a["mean_staleness"]))
    assert s["epochs"] == pytest.approx(e_min * (1 + 3 * step / 100))
    for r in got.values():
        assert r["target"]["per_epoch_s"] == pytest.approx(r["train_s"])
        assert r["target"]["time_s"] == pytest.approx(r["init_s"] + r["target"]["epochs"] * r["train_s"])
    p = sim_cli(["--params", pf, "-n", "4", "--hidden", "1000", "--target-accuracy", "0.8"])
    assert p.returncode == 2 and "run python -m asgd.perf pilot for this problem" in p.stderr
