"""One simulation: the engine, the platform, one actor per rank, and the run's outputs
in asgd's own formats (results.json through asgd.run.results.build, so `asgd.perf
report` and `compare` read it as a real run's; trace.json through asgd.run.trace.export).

SimGrid has one engine per process: run one simulation per process (the command line,
or `simulate` in a fresh subprocess).
"""

from __future__ import annotations

import multiprocessing
import os
import platform as _platform
import time
import traceback

import numpy as np

from ..core.schedule import lockstep
from ..net.optimizers import default_lr, worker_lr
from ..run import results as _results
from ..run.config import Config
from ..run.trace import export as export_trace
from . import actors, quiet_stderr, simgrid
from .costs import Costs, Spec
from .platform import Platform

# time.sleep's overshoot when calibrate did not measure it (about 60-100 us on a 2-core Debian 12 machine)
DEFAULT_SLEEP_OVERHEAD = 60e-6


def engine_config(costs: Costs) -> list[str]:
    """Plain latency + size / bandwidth per message with max-min sharing of the links
    (CM02; none of LV08's TCP corrections, which are for wide-area TCP), and the node's
    loopback (messages between ranks of one node) from the calibrated ping-pong."""
    return ["asgd.sim", "--cfg=network/model:CM02", "--cfg=network/latency-factor:1",
            "--cfg=network/bandwidth-factor:1", "--cfg=network/TCP-gamma:0", "--cfg=network/crosstraffic:0",
            f"--cfg=network/loopback-lat:{costs.latency():.9g}", f"--cfg=network/loopback-bw:{costs.bandwidth():.9g}",
            "--log=root.thres:warning"]


def simulate(spec: Spec, costs: Costs, out: str | None = None, trace: bool = False,
             trace_steps: tuple[int, int] = (0, 200), sleep_overhead: float | None = None,
             data_path: str | None = None, params_path: str | None = None) -> dict:
    """Run the simulation; returns results.json's content (also written to out/ if given)."""
    sg = simgrid()
    t_wall = time.perf_counter()
    with quiet_stderr():
        e = sg.Engine(engine_config(costs))
        plat = Platform(sg, spec.machine, spec.nodes, costs)
    overhead = DEFAULT_SLEEP_OVERHEAD if sleep_overhead is None else sleep_overhead
    world = actors.World(sg, spec, costs, plat.nodes, plat.fs, overhead, trace, trace_steps, plat.nics)
    for r in range(spec.ranks):
        if spec.arch == "allreduce":
            body, role = actors.allreduce_rank, "worker"
        elif spec.arch == "p2p":   # its worker starts its owner once init is done
            body, role = actors.worker, "peer"
        else:
            body = actors.server if r < spec.servers else actors.worker
            role = "server" if r < spec.servers else "worker"
        sg.Actor.create(f"{role}{r}", plat.nodes[spec.node_of(r)], body, world, r)
    e.run()
    sim_wall = time.perf_counter() - t_wall
    res = build_results(world, spec, costs, plat, sim_wall, out, data_path, params_path, sg,
                        trace, trace_steps)
    if out:
        os.makedirs(out, exist_ok=True)
        _results.write(os.path.join(out, "results.json"), res)
        if trace:
            names = [f"{r['role']} {r['rank']}" for r in res["ranks"]]
            info = export_trace(os.path.join(out, "trace.json"), [c.events() for c in world.clocks], names,
                                [0] * spec.ranks, 0)
            res["simulated"]["trace"] = info
    del e
    return res


def simulate_isolated(*args, **kwargs) -> dict:
    """simulate() in a forked child process (SimGrid keeps one engine per process: a
    second simulation in the same process would inherit the first's clock and platform).
    A fork of a process that has imported everything costs milliseconds."""
    simgrid()  # imported once, before forking
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def body():
        try:
            child.send(("ok", simulate(*args, **kwargs)))
        except BaseException as e:  # everything, on purpose: the parent reports it
            child.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        finally:
            child.close()
    proc = ctx.Process(target=body)
    proc.start()
    child.close()
    try:
        kind, got = parent.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the simulation's process died (exit {proc.exitcode})") from None
    proc.join()
    if kind == "error":
        raise RuntimeError(f"the simulation failed: {got}")
    return got


def config_of(spec: Spec, out: str | None, data_path: str | None, trace: bool = False,
              trace_steps: tuple[int, int] = (0, 200)) -> dict:
    """results.json's config: the run simulated, as asgd.train records its own (its options,
    then what it resolved: lr, the rank counts, the network's and the data's sizes)."""
    r = spec.run
    averaged = r.replicas if lockstep(spec.arch, r.mode) else 1
    lr = spec.lr if spec.lr is not None else default_lr(spec.optimizer, r.hidden, averaged)
    simulated = dict(data=data_path, classes=r.classes, reader=r.reader, hidden=r.hidden, batch=r.batch,
                     epochs=r.epochs, seed=spec.seed, arch=spec.arch, servers=max(r.servers, 1), mode=r.mode,
                     model_parallel=r.model_parallel, allreduce=r.allreduce,
                     staleness=spec.staleness, compress=spec.compress, precision=r.precision,
                     optimizer=spec.optimizer, lr=lr, out=out,
                     trace=trace, trace_steps=f"{trace_steps[0]}:{trace_steps[1]}")
    cfg = Config(**{**spec.recorded, **simulated}).to_dict()
    cfg.update(servers=spec.topology.owners, workers=r.workers, world_size=spec.ranks, replicas=r.replicas,
               worker_lr=worker_lr(spec.optimizer, lr),
               features=r.features, n_w=r.n_w, train_points=r.points, test_points=r.test_points)
    return cfg


def build_results(world: actors.World, spec: Spec, costs: Costs, plat: Platform, sim_wall: float,
                  out: str | None, data_path: str | None, params_path: str | None, sg, trace: bool = False,
                  trace_steps: tuple[int, int] = (0, 200)) -> dict:
    r = spec.run
    records = [dict(x) for x in world.records]
    for k, rec in enumerate(records):
        rec["timeline"] = {"start": 0.0, "init_end": world.init_end[k], "end": world.end[k]}
    cfg = config_of(spec, out, data_path, trace, trace_steps)
    version = getattr(sg, "simgrid_version", "?")
    meta = {"world_size": spec.ranks, "host": f"simulated {spec.machine.name}", "cores": spec.machine.cores_per_node,
            "oversubscribed": any(costs.crowded), "mpi_library": f"SimGrid {version} (simulated)",
            "mpi_version": None, "mpi4py": None, "launcher": "asgd.sim", "python": _platform.python_version(),
            "numpy": np.__version__, "numba": None}
    updates = records[0]["rounds"] if spec.arch != "allreduce" else records[0]["updates"]
    res = _results.build(config=cfg, ranks=records, wall_s=world.wall, meta=meta,
                         server={"updates": updates, "samples": world.samples, "history": world.history,
                                 "loss": None, "accuracy": None})
    res["stopped"] = None
    res["simulated"] = {
        "engine": f"SimGrid {version}", "sim_wall_s": sim_wall, "params": params_path,
        "platform": plat.describe(), "placement": spec.placement, "nodes": spec.nodes,
        "ranks_per_node": costs.ranks_on, "epoch_barrier": spec.epoch_barrier,
        "seed": spec.seed, "straggler": spec.straggler, "background_load": spec.background,
        "step_spread": costs.spread_q is not None, "mean_step_over_best": costs.mean_spread(),
        "sleep_overhead_s": world.sleep_overhead,
        "data_bytes": {"train": r.file_bytes, "test": r.test_bytes, "binary": r.binary},
        "startup_check": {"calibrated_job_startup_s": costs.measured_job_startup(spec.ranks)
                          if spec.machine.name == "here" else None},
        "note": "times are simulated; metrics (loss, accuracy) are not: no arithmetic is simulated",
    }
    return res


def summary(res: dict) -> str:
    c, t, sim = res["config"], res["throughput"], res["simulated"]
    pl = sim["platform"]
    lines = [f"asgd.sim: {c['world_size']} ranks ({c['servers']} server(s), {c['workers']} workers, {c['arch']}, "
             f"{c['mode']}) on {pl['machine']} ({pl['topology']}, {pl['nodes']} node(s) x {pl['cores_per_node']} "
             f"cores), {c['features']}-{c['hidden']}-{c['classes']}, batch {c['batch']}, {c['epochs']} epoch(s), "
             f"reader {c['reader'] if c['data'] else 'embedded'}",
             f"simulated wall {res['wall_s']:.3f} s (init {res['init_s']:.3f} s, train {res['train_s']:.3f} s)  "
             + _results.rates_text(t),
             f"verdict: {res['profile']['bound']}-bound: {res['profile']['why']}",
             f"simulated in {sim['sim_wall_s']:.2f} s with {sim['engine']}"]
    return "\n".join(lines)
