"""results.json (schema: docs/formats.md) and the end-of-run summary, both built from the
per-rank records gathered on rank 0. bench/, plots and the model read only this file."""

from __future__ import annotations

import json
import os
import platform
import socket

import numpy as np

from ..mpienv import cores_available
from .files import atomic_write
from .trace import PHASES

SCHEMA_VERSION = 1


def machine(comm, oversubscribed: bool) -> dict:
    """Where the run ran; not collective (only rank 0 calls it)."""
    # here, not at the top: the tools that read results.json import this module and must
    # neither initialize MPI nor pay numba's import
    from mpi4py import MPI
    import mpi4py
    import numba

    return {
        "world_size": comm.size,
        "host": socket.gethostname(),
        "cores": cores_available(),
        "oversubscribed": oversubscribed,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_version": "%d.%d" % MPI.Get_version(),
        "mpi4py": mpi4py.__version__,
        "launcher": launcher(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
    }


def launcher() -> str:
    """Which launcher started us, from the environment it leaves behind. Hydra alone sets
    MPI_LOCALNRANKS (srun --mpi=pmi2 sets PMI_RANK too, so that cannot tell them apart)."""
    env = os.environ
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpirun (Open MPI)"
    if "MPI_LOCALNRANKS" in env or "HYDRA_CONTROL_FD" in env:
        return "mpiexec (Hydra)"
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        return "srun"
    if "PMI_RANK" in env or "PMI_FD" in env:
        return "a PMI launcher"
    return "singleton"


def build(config: dict, ranks: list[dict], server: dict, wall_s: float, meta: dict) -> dict:
    """ranks: one record per rank (rank, role, phases, bytes_sent, bytes_recv, updates;
    servers: per-worker staleness and step-gap histograms); server: updates, samples
    (samples_run: a resumed run's own, for the rate; default samples),
    history, final loss/accuracy, and where rank 0 evaluated during training the held-out
    curve, those evaluations' seconds (eval_s) and the target's record
    (asgd.run.progress.EpochTracker's)."""
    _staleness(ranks)
    init_s = max(r["phases"].get("init", 0.0) for r in ranks)
    train_s = training_span(ranks)
    no_rate = why_no_rate(train_s)
    out = {
        "schema": SCHEMA_VERSION,
        "config": {**config, **meta},
        "wall_s": wall_s,
        "init_s": init_s,
        "train_s": train_s,
        "metrics": {"loss": server["loss"], "accuracy": server["accuracy"],
                    "history": server["history"], "curve": server.get("curve", []),
                    "eval_s": server.get("eval_s"), "eval_after_s": server.get("eval_after_s")},
        "target": server.get("target"),
        "throughput": {"samples_per_s": None if no_rate else server.get("samples_run", server["samples"]) / train_s,
                       "updates_per_s": None if no_rate else server["updates"] / train_s,
                       "samples": server["samples"], "updates": server["updates"], "no_rate": no_rate},
        "ranks": ranks,
    }
    out["profile"] = profile(out)
    return out


MIN_TRAIN_S = 0.01   # a shorter training phase gives no rate: see why_no_rate


def training_span(ranks: list[dict]) -> float:
    """Seconds from the last rank's end of init to the last rank's end of training, on the
    job's one clock (each record's `timeline`, offset-corrected to rank 0's clock). Not
    rank 0's wall less the slowest init: ranks start seconds apart under a loaded launcher
    (a Slurm step, an oversubscribed node), and a late rank's init then overlaps rank 0's
    wait, so that difference undercounts training, to zero and below."""
    return max(max(r["timeline"]["end"] for r in ranks) - max(r["timeline"]["init_end"] for r in ranks), 0.0)


def why_no_rate(train_s: float) -> str | None:
    """Why a training time gives no samples/s or updates/s (None: it gives them). Below
    MIN_TRAIN_S a rate would be clock noise (the offsets' microseconds, the switch to
    idle) divided into the samples (issue 39: 701 samples in "0.00 s" gave 701,000,000,000
    samples/s); at zero no training was timed at all."""
    if train_s <= 0:
        return "no training time: the last rank ended training as the last init ended"
    if train_s < MIN_TRAIN_S:
        return f"training took {1e3 * train_s:.2f} ms, under {1e3 * MIN_TRAIN_S:.0f} ms: too short to time"
    return None


def rates_text(throughput: dict) -> str:
    """The summary's rates: '350,500 samples/s  1,500.0 updates/s', or 'n/a' and why."""
    if throughput.get("samples_per_s") is None:
        return f"samples/s n/a, updates/s n/a ({throughput.get('no_rate') or 'no training time'})"
    return f"{throughput['samples_per_s']:,.0f} samples/s  {throughput['updates_per_s']:,.1f} updates/s"


def _staleness(records: list[dict]) -> None:
    """Each worker's staleness and step-gap distributions, over every server that applied
    its Delta-w; servers get the distribution over all workers."""
    def dist(hists: list[list[int]]) -> dict:
        h = np.zeros(max((len(x) for x in hists), default=1), np.int64)
        for x in hists:
            h[:len(x)] += np.asarray(x, np.int64)  # an empty one is float64
        n = h.sum()
        return {"mean": float(h @ np.arange(len(h)) / n) if n else 0.0,
                "max": int(np.flatnonzero(h).max(initial=0)), "histogram": h.tolist()}
    servers = [r for r in records if r["role"] in ("server", "peer")]   # p2p: every rank both
    workers = [r for r in records if r["role"] in ("worker", "peer")]

    def of(hists, j: int, rank: int) -> list[list[int]]:
        """A server's histogram of one worker: by rank (a dict), or by its place among
        the workers (a list: asgd.sim's); none if the worker never pushed to it."""
        if isinstance(hists, dict):
            got = hists.get(rank, hists.get(str(rank)))
            return [got] if got is not None else []
        return [hists[j]]
    worked = {}
    for j, r in enumerate(workers):
        worked[r["rank"]] = (dist([h for s in servers for h in of(s["staleness_hist"], j, r["rank"])]),
                             dist([h for s in servers for h in of(s["step_gap_hist"], j, r["rank"])]))
    for s in servers:
        s["staleness_applied"] = dist(_hists(s.pop("staleness_hist")))
        s["step_gap_applied"] = dist(_hists(s.pop("step_gap_hist")))
    for r in records:
        if r["rank"] in worked:   # a worker's: of its own pushes, on every server
            r["staleness"], r["step_gap"] = worked[r["rank"]]
        else:                     # a server's: of the pushes it applied
            r["staleness"], r["step_gap"] = r["staleness_applied"], r["step_gap_applied"]
        if r["role"] != "peer":
            r.pop("staleness_applied", None)
            r.pop("step_gap_applied", None)


def _hists(h) -> list:
    return list(h.values()) if isinstance(h, dict) else h


def profile(results: dict) -> dict:
    """The IPM-style view: per rank, the share of its wall time in each kind of work,
    and a one-line verdict on what bounds the run."""
    rows = []
    for r in results["ranks"]:
        p = r["phases"]
        total = sum(v for k, v in p.items() if k not in _INIT_PARTS) or 1e-9
        def pct(*names):
            return 100.0 * sum(p.get(n, 0.0) for n in names) / total
        row = {"rank": r["rank"], "role": r["role"], "init_pct": pct("init"), "barrier_pct": pct("idle")}
        if r["role"] in ("worker", "peer"):
            row.update(compute_pct=pct("compute"), comm_wait_pct=pct("comm_wait", "push"))
            if "replica_sum" in p:   # model-parallel: the replica's members summing their logits
                row["replica_pct"] = pct("replica_sum")
        if r["role"] in ("server", "peer"):
            training = total - p.get("init", 0.0)
            row.update(busy_pct=100.0 * (p.get("aggregate", 0.0) + p.get("evaluate", 0.0)) / max(training, 1e-9))
        rows.append(row)
    slowest = slowest_init(results)
    return {"ranks": rows, "init_rank": slowest["rank"], "init_parts": init_parts(slowest["phases"]),
            "crowding": crowding(results), "eval_pct": eval_pct(results), **verdict(results, rows)}


def eval_pct(results: dict) -> float | None:
    """The held-out evaluations during training (metrics.eval_s) as a % of train_s: what
    --eval-every costs (the server evaluates between two updates, the workers waiting for
    its replies). None where no rank evaluated during training, no training was timed, or
    the results predate eval_s (a results.json of an older run, read by asgd.perf report)."""
    spent, train = (results.get("metrics") or {}).get("eval_s"), results.get("train_s") or 0.0
    return None if spent is None or train <= 0 else 100.0 * spent / train


def slowest_init(results: dict) -> dict:
    """The rank whose init is the job's (init_s)."""
    return max(results["ranks"], key=lambda r: r["phases"].get("init", 0.0))


def init_parts(phases: dict) -> dict[str, float]:
    """A rank's init in seconds by part: start-up (what the recorded sub-phases leave:
    nearly all of it the interpreter's imports and numba's cache), read, parse, shuffle."""
    parts = {k: phases.get(k, 0.0) for k in _INIT_PARTS}
    return {"start-up": max(phases.get("init", 0.0) - sum(parts.values()), 0.0), **parts}


def crowding(results: dict) -> dict | None:
    """{ranks, cores} of rank 0's node when its ranks outnumber its cores, else None (also
    where the ranks' hosts are not recorded: asgd.sim's)."""
    cores = results["config"].get("cores")
    host = results["ranks"][0].get("host")
    ranks = sum(r.get("host") == host for r in results["ranks"])
    return {"ranks": ranks, "cores": cores} if host and cores and ranks > cores else None


def verdict(results: dict, rows: list[dict]) -> dict:
    """Initialization-, server-, communication- or computation-bound, and why. An
    initialization verdict names the largest part of the slowest rank's init (profile's
    init_parts) and, with more ranks than cores on rank 0's node, how many on how few.
    Its % are of the job's wall_s (init_s / wall_s: the summary line's), not a row's of
    the per-rank table (each of that rank's own time)."""
    wall = max(results["wall_s"], 1e-9)
    init = results["init_s"] / wall
    busy = max((r["busy_pct"] for r in rows if "busy_pct" in r), default=0.0)
    workers = [r for r in rows if "compute_pct" in r]
    compute = float(np.mean([r["compute_pct"] for r in workers]))
    wait = float(np.mean([r["comm_wait_pct"] for r in workers]))
    if init >= 0.5:
        parts = init_parts(slowest_init(results)["phases"])
        part = max(parts, key=parts.get)
        most = "mostly" if parts[part] >= 0.5 * sum(parts.values()) else "its largest part"
        share = f"{100 * parts[part] / wall:.0f}% of the wall time"
        named = f"start-up (imports and numba's cache: {share})" if part == "start-up" else f"{part} ({share})"
        why = f"init is {100 * init:.0f}% of the wall time, {most} {named}"
        crowded = crowding(results)
        if crowded:
            several = len({r.get("host") for r in results["ranks"]}) > 1
            why += f"; {crowded['ranks']} ranks on {crowded['cores']} cores" + (" (rank 0's node)" if several else "")
        return {"bound": "initialization", "why": why}
    if busy >= 80.0:
        return {"bound": "server", "why": f"the server is busy {busy:.0f}% of the training time"}
    if wait > compute:
        why = (f"workers wait {wait:.0f}% of their time (compute {compute:.0f}%), while the server "
               f"is busy only {busy:.0f}%")
        if results["config"].get("oversubscribed"):
            why += ": with more ranks than cores, mostly waiting for a core"
        return {"bound": "communication", "why": why}
    return {"bound": "computation", "why": f"workers compute {compute:.0f}% of their time, wait {wait:.0f}%"}


def write(path: str, results: dict) -> None:
    """Atomically: a reader never sees half a file."""
    atomic_write(path, lambda f: f.write(json.dumps(results, indent=1, default=_plain) + "\n"))


def _plain(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x)}")


def role_split(results: dict) -> dict[str, dict[str, float]]:
    """Mean seconds per phase over the ranks of each role."""
    out: dict[str, dict[str, float]] = {}
    for role in ("server", "worker", "peer"):
        rs = [r for r in results["ranks"] if r["role"] == role]
        if rs:
            names = sorted({p for r in rs for p in r["phases"]}, key=_PHASE_ORDER.index)
            out[role] = {p: float(np.mean([r["phases"].get(p, 0.0) for r in rs])) for p in names}
    return out


_PHASE_ORDER = list(PHASES)
_INIT_PARTS = ("read", "parse", "shuffle")  # sub-phases inside init: not added to the total again


def evaluations_text(results: dict) -> str:
    """The summary's note of the held-out evaluations during training and their cost."""
    pct = results["profile"].get("eval_pct")
    if pct is None:
        return ""
    m = results["metrics"]
    if results["config"].get("eval_deferred"):
        return (f"  ({count(len(m['curve']), 'copy', 'copies')} of w during training, evaluated after it: "
                f"{m['eval_s']:.2f} s, {pct:.1f}% of train)")
    return f"  ({count(len(m['curve']), 'evaluation')} during training: {m['eval_s']:.2f} s, {pct:.1f}% of train)"


def count(n: int, one: str, many: str | None = None) -> str:
    """'1 worker', '3 workers', '0 servers'."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def summary(results: dict, path: str) -> str:
    c, t = results["config"], results["throughput"]
    lines = [
        f"asgd: {count(c['world_size'], 'rank')} ("
        + (f"p2p: every rank a worker owning 1/{c['world_size']} of w" if c.get("arch") == "p2p"
           else f"{count(c['servers'], 'server')}, {count(c['workers'], 'worker')}")
        + (f" in {count(c['replicas'], 'replica')} of {c['model_parallel']}" if c.get("model_parallel", 1) > 1 else "")
        + "), "
        f"{c['features']}-{c['hidden']}-{c['classes']} MLP ({c['n_w']:,} parameters), "
        f"batch {c['batch']}, lr {c['lr']:g}, {count(c['epochs'], 'epoch')}"
        + (f", {c['compress']} messages" if c.get("compress", "none") != "none" else ""),
        f"held-out loss {results['metrics']['loss']:.4f}  accuracy {results['metrics']['accuracy']:.4f}"
        + evaluations_text(results),
        f"wall {results['wall_s']:.2f} s (init {results['init_s']:.2f} s, train {results['train_s']:.2f} s)  "
        + rates_text(t),
        "time split, seconds (mean over the role's ranks):",
    ]
    split = role_split(results)
    phases = [p for p in _PHASE_ORDER if any(p in s for s in split.values())]
    lines.append("  " + f"{'role':8}" + "".join(f"{p:>12}" for p in phases))
    for role, s in split.items():
        lines.append("  " + f"{role:8}" + "".join(
            f"{s[p]:>12.2f}" if p in s else f"{'-':>12}" for p in phases))
    lines.append("per rank, % of its own wall time (IPM style; busy: % of the server's training time):")
    rows = results["profile"]["ranks"]
    replica = any("replica_pct" in row for row in rows)   # model-parallel: the replica's logit sums
    lines.append(f"  {'rank':>4} {'role':7} {'init':>6} {'compute':>8} {'wait':>6} "
                 + (f"{'replica':>8} " if replica else "") + f"{'barrier':>8} {'busy':>6}")
    def f(row, k):
        return f"{row[k]:.1f}" if k in row else "-"
    for row in rows:
        lines.append(f"  {row['rank']:>4} {row['role']:7} {f(row, 'init_pct'):>6} {f(row, 'compute_pct'):>8} "
                     f"{f(row, 'comm_wait_pct'):>6} " + (f"{f(row, 'replica_pct'):>8} " if replica else "")
                     + f"{f(row, 'barrier_pct'):>8} {f(row, 'busy_pct'):>6}")
    pr = results["profile"]
    lines.append(f"verdict: {pr['bound']}-bound: {pr['why']}")
    lines.append(f"results: {path}")
    return "\n".join(lines)
