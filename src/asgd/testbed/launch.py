"""Running an MPI job on a testbed's hosts through the launcher's own remote start.

`run(spec, ["mpiexec", "-n", "4", "python", "-m", "asgd.train", ...])` places the ranks
(placement.plan: servers on hosts of their own, workers round-robin or in blocks) and
rewrites the command so that the launcher starts its remote agent on each host through
the testbed's ssh stand-in (state dir's `rsh`, which enters the host's namespaces):

  MPICH (hydra)  mpiexec -launcher ssh -launcher-exec RSH -localhost LAUNCHER_IP
                         -hosts h0,h1,.. -rankmap i0,i1,.. <the rest as given>
                 hydra's proxies connect back to LAUNCHER_IP, on the control network
                 (PMI and forwarded output stay off the shaped links); each host is a node of its own
                 (its own hostname), so MPICH uses its network module between hosts. Its
                 UCX module would still take shared memory (sysv, cma) across hosts, since
                 they share a kernel: UCX_TLS=self,tcp and UCX_NET_DEVICES=eth0 keep it to
                 TCP on the host's link (MPICH's own shared memory still serves ranks on
                 the same host); the OFI module is told FI_PROVIDER=tcp, FI_TCP_IFACE=eth0.
  Open MPI       mpiexec --mca plm_rsh_agent RSH --host h0:k0,.. --map-by rankfile ...
                 (see _openmpi).

The job runs in its own session with a time limit; if this process dies, the launcher gets
SIGTERM (PR_SET_PDEATHSIG) and ends its ranks; `down` ends whatever is left. With
check_bytes the same job first runs with --dry-run on the same placement: the byte
proof's baseline (asgd.testbed.proof).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..mpienv import OVERSUBSCRIBED_ENV, cores_available
from ..run.config import default_servers
from . import placement, procs, proof, shaping, state
from .sh import TestbedError
from .spec import Spec

TCP_ONLY_ENV = {"UCX_TLS": "self,tcp", "UCX_NET_DEVICES": "eth0", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}
# UCX's TCP keepalive probes every idle connection about every 10 s (measured: 3 KB a
# minute on each of 8 idle hosts, none with this): liveness checks of MPI's own, which
# the launcher's end of a dead rank makes needless here, and which would add to the
# links' counts in proportion to the job's length
NO_KEEPALIVE_ENV = {"UCX_TCP_KEEPIDLE": "inf"}
HYDRA_CONFLICTS = ("-hosts", "-host", "-f", "-machinefile", "-launcher", "-launcher-exec", "-rankmap",
                   "-ppn", "-localhost", "-bootstrap", "-bootstrap-exec", "-rmk")


@dataclass
class RunResult:
    rc: int
    cmd: list[str]                       # what ran, after rewriting
    wall_s: float
    hosts: list[str]                     # the host of each rank, as planned
    out: str | None = None               # asgd.train's run folder
    stdout: str | None = None            # when captured
    stderr: str | None = None
    wire: list[dict] = field(default_factory=list)    # per host {sent, recv}, bytes on its link
    qdisc: list[dict] = field(default_factory=list)   # per host, both ends: drops, overlimits
    proof: dict | None = None            # proof.check's verdict (check_bytes)
    baseline: dict | None = None         # check_bytes: the dry run's folder, wall time, wire, output
    results: dict | None = None          # results.json
    cpu_s: float = 0.0                   # CPU seconds (user + system) of the whole job, every rank


# -- reading the command ----------------------------------------------------------------

def flavour(mpiexec: str) -> str:
    """'mpich' (hydra) or 'openmpi', from `mpiexec --version`."""
    try:
        p = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        raise TestbedError(f"{mpiexec}: not found") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{mpiexec} --version: no answer in 20 s") from None
    text = p.stdout + p.stderr
    if "HYDRA" in text or "hydra" in text:
        return "mpich"
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text or "prte" in text.lower():
        return "openmpi"
    raise TestbedError(f"{mpiexec}: neither MPICH's hydra nor Open MPI (its --version says: {text.strip()[:200]})")


def _option(args: list[str], names: tuple[str, ...]) -> tuple[int, str] | None:
    """(index of the value, value) of the first `--name value` or `--name=value`."""
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return i + 1, args[i + 1]
            if a.startswith(n + "="):
                return i, a.split("=", 1)[1]
    return None


def parse(cmd: list[str]) -> dict:
    """The parts of `mpiexec -n N [opts] python -m asgd.train [train options]` run needs:
    ranks, the train module's options (servers, arch, out) if it is asgd.train."""
    if not cmd:
        raise TestbedError("no command: run -- mpiexec -n N python -m asgd.train ...")
    if "mpiexec" not in os.path.basename(cmd[0]) and "mpirun" not in os.path.basename(cmd[0]):
        raise TestbedError(f"the command must start with mpiexec or mpirun, not {cmd[0]!r}")
    n = _option(cmd[1:], ("-n", "-np", "--n", "--np"))
    if n is None or not n[1].isdigit() or int(n[1]) < 1:
        raise TestbedError("give the number of ranks with -n N (one program, no ':' MPMD)")
    if ":" in cmd[1:]:
        raise TestbedError("MPMD commands (':') are not supported")
    train = None
    for i in range(1, len(cmd) - 1):
        if cmd[i] == "-m" and cmd[i + 1] == "asgd.train":
            train = i + 2
            break
    info = {"ranks": int(n[1]), "train_at": train, "servers": None, "out": None, "arch": None,
            "allreduce": None, "model_parallel": 1, "dry_run": False}
    if train is not None:
        targs = cmd[train:]
        arch = _option(targs, ("--arch",))
        allreduce = _option(targs, ("--allreduce",))
        mp = _option(targs, ("--model-parallel",))
        info["model_parallel"] = int(mp[1]) if mp else 1
        servers = _option(targs, ("--servers",))
        info["arch"] = arch[1] if arch else "ps"
        info["allreduce"] = allreduce[1] if allreduce else "ring"
        info["servers"] = (0 if info["arch"] in ("allreduce", "p2p") else int(servers[1]) if servers
                           else default_servers(info["arch"], info["model_parallel"], info["ranks"]))
        out = _option(targs, ("--out",))
        info["out"] = out[1] if out else None
        info["dry_run"] = "--dry-run" in targs
    return info


# -- rewriting it --------------------------------------------------------------------------

def _hydra(spec: Spec, cmd: list[str], where: list[int]) -> list[str]:
    bad = [a for a in cmd[1:] if a.split("=")[0] in HYDRA_CONFLICTS]
    if bad:
        raise TestbedError(f"the testbed places the ranks itself; drop {', '.join(bad)} from the command")
    used = sorted(set(where))
    index = {h: i for i, h in enumerate(used)}
    return [cmd[0], "-launcher", "ssh", "-launcher-exec", str(spec.rsh), "-localhost", spec.launcher_ip,
            "-hosts", ",".join(spec.host(h) for h in used),
            "-rankmap", ",".join(str(index[h]) for h in where), *cmd[1:]]


def _openmpi(spec: Spec, cmd: list[str], where: list[int], rankfile: Path) -> list[str]:
    """Open MPI 5 (PRRTE): the rsh agent is the stand-in, a rankfile places each rank, the
    daemons' out-of-band channel uses the control network and the TCP BTL the data
    network only, and the shared-memory BTL serves only ranks on one host (each host is a
    node of its own)."""
    rankfile.write_text("".join(f"rank {r}={spec.host(h)} slot={sum(1 for x in where[:r] if x == h)}\n"
                                for r, h in enumerate(where)))
    used = sorted(set(where))
    slots = {h: where.count(h) for h in used}
    return [cmd[0], "--mca", "plm_rsh_agent", str(spec.rsh),
            "--host", ",".join(f"{spec.host(h)}:{slots[h]}" for h in used),
            "--map-by", f"rankfile:file={rankfile}", "--bind-to", "none",
            "--mca", "oob_tcp_if_include", spec.control_cidr, "--mca", "btl_tcp_if_include", spec.cidr,
            "--mca", "btl", "tcp,self,sm", "--mca", "pml", "ob1", *cmd[1:]]


def _pdeathsig():
    """In the launcher's child, before exec: SIGTERM it when its parent (run) dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# -- running it ----------------------------------------------------------------------------

@dataclass
class Execution:
    """One command's run on the testbed, with the data links' counters around it."""
    rc: int
    wall_s: float
    stdout: str | None
    stderr: str | None
    wire: list[dict]             # per host: bytes and frames sent and received
    qdisc: list[dict]
    cpu_s: float


def _execute(spec: Spec, full: list[str], env: dict, timeout: float, capture: bool) -> Execution:
    """Run `full` (a rewritten command) in a session of its own, recorded for down; the
    links' counters and qdiscs before and after."""
    before, q_before, cpu0 = proof.snapshot(spec), _qdiscs(spec), _children_cpu()
    t0 = time.perf_counter()
    p = subprocess.Popen(full, env=env, start_new_session=True, preexec_fn=_pdeathsig,
                         stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None,
                         text=True)
    record = state.record_run(spec, p.pid, procs.start_time(p.pid), full)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs.kill_group(p.pid, None)
        procs.kill(procs.of_testbed(spec.name))
        out, err = p.communicate()
        raise TestbedError(f"the job took over {timeout:g} s and was killed: {shlex.join(full)}"
                           + (f"\n{err[-2000:]}" if err else "")) from None
    except BaseException:   # KeyboardInterrupt: the job goes with us
        procs.kill_group(p.pid, None)
        p.wait()
        raise
    finally:
        record.unlink(missing_ok=True)
    return Execution(p.returncode, time.perf_counter() - t0, out, err, proof.wire(before, proof.snapshot(spec)),
                     _qdisc_delta(q_before, _qdiscs(spec)), _children_cpu() - cpu0)


def _dry_run(spec: Spec, full: list[str], env: dict, timeout: float, out: str) -> tuple[Execution, dict]:
    """The byte proof's baseline: `full` (the job with --dry-run --out OUT); its run and
    its results.json, or TestbedError with its own error."""
    dry = _execute(spec, full, env, timeout, capture=True)
    results = _results(out) if dry.rc == 0 else None
    if results is None or not results.get("dry_run"):
        raise TestbedError(f"the dry run (the byte proof's baseline) failed (exit {dry.rc})"
                           + (f": {dry.stderr.strip()[-1500:]}" if dry.stderr else ""))
    return dry, results


def _rewrite(spec: Spec, kind: str, cmd: list[str], where: list[int], rankfile: Path) -> list[str]:
    if kind == "mpich":
        return _hydra(spec, cmd, where)
    rankfile.parent.mkdir(parents=True, exist_ok=True)
    return _openmpi(spec, cmd, where, rankfile)


def _results(out: str | None) -> dict | None:
    path = Path(out) / "results.json" if out else None
    return json.loads(path.read_text()) if path and path.exists() else None


def run(spec: Spec, cmd: list[str], servers: int | None = None, ranks_per_host: int | None = None,
        check_bytes: bool = False, timeout: float = 600, capture: bool = False, env: dict | None = None,
        say=print) -> RunResult:
    """Run `cmd` (mpiexec ...) on the testbed; returns its RunResult. servers overrides what
    the command's asgd.train options say (default: theirs; 0 for another program).
    check_bytes: first the same job with --dry-run on the same placement (the baseline,
    its results in OUT/dry-run), then the job; the byte proof compares what the job added
    (asgd.testbed.proof). Raises TestbedError when the proof cannot check the job."""
    info = parse(cmd)
    if check_bytes:
        if info["train_at"] is None:
            raise TestbedError("--check-bytes needs an asgd.train job (its results.json has the ranks' bytes)")
        if info["dry_run"]:
            raise TestbedError("--check-bytes of a --dry-run job: it trains nothing, so there is nothing to prove "
                               "(the proof runs the dry run itself, as its baseline)")
        reason = proof.unprovable(info["arch"], info["allreduce"], info["model_parallel"])
        if reason:
            raise TestbedError(reason)
    if (state.read(spec.name) or {}).get("status") != "up":
        raise TestbedError(f"testbed {spec.name} is not up")
    S = servers if servers is not None else (info["servers"] or 0)
    where = placement.plan(info["ranks"], S, spec.hosts, ranks_per_host)
    cmd = list(cmd)
    if info["train_at"] is not None and info["out"] is None:
        info["out"] = os.path.abspath(f"runs/testbed-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-n{info['ranks']}")
        cmd += ["--out", info["out"]]
        say(f"asgd.testbed: results in {info['out']}")
    kind = flavour(cmd[0])
    rankfile = state.runs_dir(spec) / f"rankfile-{os.getpid()}"   # in the state dir: down removes it
    job_env = {**os.environ, **TCP_ONLY_ENV, **NO_KEEPALIVE_ENV, **(env or {})}
    # every host looks like a node of its own, but all share this machine's cores: tell the
    # ranks, or each polls as if it had a core (measured: 14 ranks on 2 cores polling every
    # 100 us took both cores while they waited on the links)
    job_env.setdefault(OVERSUBSCRIBED_ENV, "1" if info["ranks"] > cores_available() else "0")
    if kind == "openmpi" and os.geteuid() == 0:
        job_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        job_env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    say(f"asgd.testbed: {info['ranks']} ranks on {spec.name}: "
        + placement.describe(where, S, spec.host))
    try:
        if check_bytes:
            dry_out = os.path.join(info["out"], "dry-run")
            say(f"asgd.testbed: the byte proof's baseline: the same job with --dry-run (results in {dry_out})")
            dry, dry_results = _dry_run(spec, _rewrite(spec, kind, cmd + ["--dry-run", "--out", dry_out], where,
                                                        rankfile), job_env, timeout, dry_out)
        full = _rewrite(spec, kind, cmd, where, rankfile)
        job = _execute(spec, full, job_env, timeout, capture)
    finally:
        rankfile.unlink(missing_ok=True)
    res = RunResult(job.rc, full, job.wall_s, [spec.host(h) for h in where], info["out"], job.stdout, job.stderr,
                    job.wire, job.qdisc, cpu_s=job.cpu_s)
    if job.rc == 0:
        res.results = _results(info["out"])
    if res.results:
        placed = [r.get("host") for r in res.results["ranks"]]
        if all(placed) and placed != res.hosts:
            say(f"asgd.testbed: warning: ranks ran on {placed}, planned {res.hosts}", file=sys.stderr)
    if check_bytes:
        if res.results is None:
            raise TestbedError(f"the job failed (exit {job.rc}); no results.json to check the bytes against")
        reason = proof.refusal(res.results) or proof.refusal(dry_results)
        if reason:
            raise TestbedError(reason)
        res.baseline = {"out": dry_out, "wall_s": dry.wall_s, "wire": dry.wire}
        res.proof = proof.check(proof.traffic(res.results, spec, where, job.wire),
                                proof.traffic(dry_results, spec, where, dry.wire), spec.host)
        say(proof.table(res.proof))
    drops = sum(q["dropped"] for q in res.qdisc)
    if drops:
        say(f"asgd.testbed: note: the links' queues dropped {drops} packets (TCP retransmitted them)")
    return res


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for descendants: the launcher waits for its
    agents, which wait for the ranks, so after the job this includes every rank's."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _qdiscs(spec: Spec) -> list[dict]:
    out = []
    for k in range(spec.hosts):
        a = shaping.qdisc_stats(spec.veth(k))
        b = shaping.qdisc_stats("eth0", spec.host(k))
        out.append({"dropped": a["dropped"] + b["dropped"], "overlimits": a["overlimits"] + b["overlimits"]})
    return out


def _qdisc_delta(before: list[dict], after: list[dict]) -> list[dict]:
    return [{k: a[k] - b[k] for k in a} for b, a in zip(before, after)]
