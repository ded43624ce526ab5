"""Batch jobs on a testbed's Slurm: `run -- sbatch ...` and `run -- qsub ...` (Slurm's
torque wrapper), as a user submits them, and the byte proof of what they did.

The command runs as given, with the testbed's SLURM_CONF and ASGD_OUT (the batch
scripts' run folder: results.json in it, or in n<K>/ for each run of a sweep) unless the
caller set it; then the job is waited for (squeue, every 0.2 s) and scontrol's record
says how it ended (JobState, ExitCode, its nodes). The data links' counters are read
before the submission and after the job's end: Slurm's own traffic (slurmctld, slurmd,
srun, the PMI plugins) runs on the control network (asgd.testbed.slurm), so the data
links carry only what the ranks send each other.

The byte proof (check_bytes), as `run --check-bytes` does for mpiexec: first the same
submission with `--dry-run` after the script's arguments (qsub: in ASGD_ARGS) and
ASGD_OUT=OUT/dry-run
(the baseline: every run of the job started up and stopped, on the same nodes, since
Slurm places a job of the same shape alike on idle nodes), then the job; what the job
added to each host's link over its baseline must be what its ranks counted, summed over
the job's runs (asgd.testbed.proof.job_traffic).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import proof, slurm, state
from .sh import TestbedError
from .spec import Spec

POLL_S = 0.2
SUBMIT_S = 60   # sbatch and qsub answer at once; longer means --wait, or no scheduler


@dataclass
class JobEnd:
    """How a batch job ended, from scontrol's record."""
    id: str
    state: str                   # COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    exit_code: str               # "status:signal"
    nodes: str                   # Slurm's node list
    stdout: str                  # the job's output file
    restarts: int = 0            # times Slurm requeued it
    wall_s: float = 0.0
    wire: list[dict] = field(default_factory=list)   # per host: bytes and frames sent and received

    @property
    def rc(self) -> int:
        """0 for COMPLETED 0:0; else the script's exit status, or 128 + the signal, or 1."""
        status, _, sig = self.exit_code.partition(":")
        if self.state == "COMPLETED" and status == "0":
            return 0
        return int(status) if status.isdigit() and int(status) else 128 + int(sig) if sig.isdigit() and int(sig) else 1

    def output(self) -> str:
        try:
            return Path(self.stdout).read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class BatchResult:
    rc: int
    cmd: list[str]
    out: str                     # ASGD_OUT
    job: JobEnd
    runs: list[str]              # the folders with a results.json, in order
    results: list[dict]
    proof: dict | None = None
    baseline: JobEnd | None = None

    @property
    def hosts(self) -> list[list[str]]:
        """Per run, the host of each rank (results.json's)."""
        return [[x.get("host") for x in r["ranks"]] for r in self.results]


def _submit(spec: Spec, cmd: list[str], env: dict) -> str:
    """Submit; the job's id (sbatch: 'Submitted batch job N', qsub: 'N')."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBMIT_S, env=env)
    except FileNotFoundError:
        raise TestbedError(f"{cmd[0]}: not found") from None
    except subprocess.TimeoutExpired:   # sbatch --wait, or a scheduler that does not answer
        raise TestbedError(f"{shlex.join(cmd)}: no job id within {SUBMIT_S:g} s (asgd.testbed run waits for the "
                           "job itself: leave out --wait/-W)") from None
    if p.returncode:
        raise TestbedError(f"{shlex.join(cmd)}: {p.stderr.strip() or f'exit {p.returncode}'}")
    m = re.search(r"(\d+)(?:\.\S*)?\s*$", p.stdout.strip())
    if not m:
        raise TestbedError(f"{shlex.join(cmd)}: no job id in its output {p.stdout.strip()!r}")
    return m.group(1)


def _record(spec: Spec, job: str) -> dict:
    p = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=20,
                       env={**os.environ, **slurm.env(spec)})
    return dict(re.findall(r"(\w+)=(\S*)", p.stdout))


def _pending(spec: Spec, job: str) -> bool:
    """Whether Slurm still lists the job as pending, running or ending (squeue)."""
    p = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20,
                       env={**os.environ, **slurm.env(spec)})
    return bool(p.stdout.strip())


def _cancel(spec: Spec, job: str) -> None:
    subprocess.run(["scancel", job], capture_output=True, timeout=20, env={**os.environ, **slurm.env(spec)})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _pending(spec, job):
        time.sleep(POLL_S)


def submit_and_wait(spec: Spec, cmd: list[str], env: dict, timeout: float, say=print) -> JobEnd:
    """Submit `cmd` and wait for the job's end (scancel after `timeout` s: TestbedError);
    the links' counters around it."""
    before = proof.snapshot(spec)
    t0 = time.perf_counter()
    job = _submit(spec, cmd, env)
    say(f"asgd.testbed: job {job} submitted: {shlex.join(cmd)}")
    try:
        while _pending(spec, job):
            if time.perf_counter() - t0 > timeout:
                _cancel(spec, job)
                rec = _record(spec, job)
                raise TestbedError(f"job {job} took over {timeout:g} s and was cancelled (its output: "
                                   f"{rec.get('StdOut', '?')})")
            time.sleep(POLL_S)
    except BaseException as e:   # KeyboardInterrupt: the job goes with us
        if not isinstance(e, TestbedError):
            _cancel(spec, job)
        raise
    rec = _record(spec, job)
    end = JobEnd(job, rec.get("JobState", "?"), rec.get("ExitCode", "?"), rec.get("NodeList", "?"),
                 rec.get("StdOut", ""), int(rec.get("Restarts", "0") or 0), time.perf_counter() - t0,
                 proof.wire(before, proof.snapshot(spec)))
    say(f"asgd.testbed: job {job} {end.state}, exit code {end.exit_code}, nodes {end.nodes}"
        + (f", requeued {end.restarts} times" if end.restarts else "") + f", {end.wall_s:.1f} s; output {end.stdout}")
    return end


def dry_run(cmd: list[str], env: dict) -> tuple[list[str], dict]:
    """The submission and environment of the job's dry run: sbatch with --dry-run after
    the script's arguments; qsub (whose wrapper would read --dry-run as its own option,
    and passes a `--` on to the script) with it at the end of ASGD_ARGS, the PBS
    scripts' asgd.train options, from the environment."""
    if slurm.submit_kind(cmd) == "sbatch":
        return [*cmd, "--dry-run"], env
    if any(a.startswith("-v") for a in cmd[1:]) and "-V" not in cmd[1:]:
        raise TestbedError("qsub -v passes only the variables it names (and not the testbed's ASGD_OUT): "
                           "add -V, or export the variables instead")
    return cmd, {**env, "ASGD_ARGS": f"{env.get('ASGD_ARGS', '')} --dry-run".strip()}


def run_folders(out: str) -> list[str]:
    """The folders under OUT (itself included) with a results.json, the dry run's left out."""
    root = Path(out)
    found = [p.parent for p in root.glob("**/results.json") if "dry-run" not in p.relative_to(root).parts]
    return [str(p) for p in sorted(found, key=lambda p: (len(p.parts), _natural(p.name)))]


def _natural(name: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def _load(folders: list[str]) -> list[dict]:
    return [json.loads((Path(f) / "results.json").read_text()) for f in folders]


def run(spec: Spec, cmd: list[str], check_bytes: bool = False, timeout: float = 900, env: dict | None = None,
        say=print) -> BatchResult:
    """Submit `cmd` (sbatch or qsub, with its script and the script's arguments) to the
    testbed's Slurm and wait for it; with check_bytes, its dry run first and the byte
    proof. Raises TestbedError when the job cannot be submitted, outlives `timeout`, or
    its bytes cannot be proved."""
    kind = slurm.submit_kind(cmd)
    if kind is None:
        raise TestbedError(f"not a batch submission: {cmd[0] if cmd else '(nothing)'} (sbatch or qsub)")
    if not (state.read(spec.name) or {}).get("slurm"):
        raise TestbedError(f"testbed {spec.name} has no Slurm: python -m asgd.testbed down --name {spec.name}, "
                           "then up again with --slurm")
    job_env = {**os.environ, **(env or {}), **slurm.env(spec)}
    out = job_env.get("ASGD_OUT") or os.path.abspath(
        f"runs/testbed-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{kind}")
    job_env["ASGD_OUT"] = out
    say(f"asgd.testbed: results in {out} (ASGD_OUT)")
    baseline = None
    if check_bytes:
        dry_out = os.path.join(out, "dry-run")
        say(f"asgd.testbed: the byte proof's baseline: the same job with --dry-run (results in {dry_out})")
        baseline = submit_and_wait(spec, *dry_run(cmd, {**job_env, "ASGD_OUT": dry_out}), timeout, say)
        dry_folders = run_folders(dry_out)
        if baseline.rc or not dry_folders:
            raise TestbedError(f"the dry run (the byte proof's baseline) failed: job {baseline.id} {baseline.state} "
                               f"{baseline.exit_code}, {len(dry_folders)} results.json in {dry_out}; its output: "
                               + " | ".join(baseline.output().strip().splitlines()[-6:]))
    job = submit_and_wait(spec, cmd, job_env, timeout, say)
    folders = run_folders(out)
    res = BatchResult(job.rc, cmd, out, job, folders, _load(folders), baseline=baseline)
    for f, hosts in zip(folders, res.hosts):
        say(f"asgd.testbed: {os.path.relpath(f, out) if f != out else 'run'}: {len(hosts)} ranks on "
            f"{len(set(hosts))} hosts: {_describe(hosts)}")
    if job.rc:
        say(f"asgd.testbed: job {job.id} failed; the end of its output:\n" + "\n".join(job.output().splitlines()[-10:]))
    say("asgd.testbed: bytes on the data links during the job: " + ", ".join(
        f"{spec.host(k)} {w['sent']:,} sent {w['recv']:,} received" for k, w in enumerate(job.wire)))
    if check_bytes:
        if job.rc or not folders:
            raise TestbedError(f"the job failed ({job.state}, exit code {job.exit_code}) or left no results.json "
                               f"in {out}: no bytes to prove")
        dry = _load(run_folders(os.path.join(out, "dry-run")))
        if len(dry) != len(res.results):
            raise TestbedError(f"the job made {len(res.results)} runs, its dry run {len(dry)}: cannot pair them")
        for r in res.results + dry:
            reason = proof.refusal(r)
            if reason:
                raise TestbedError(reason)
        moved = [(a["host"], b["host"]) for r, d in zip(res.results, dry) for a, b in zip(r["ranks"], d["ranks"])
                 if a["host"] != b["host"]]
        if moved:
            raise TestbedError(f"Slurm placed the job's ranks elsewhere than its dry run's ({moved[0][1]} -> "
                               f"{moved[0][0]}, ...): the baseline does not hold; submit to idle nodes")
        res.proof = proof.check(proof.job_traffic(res.results, spec, job.wire),
                                proof.job_traffic(dry, spec, baseline.wire), spec.host, runs=len(res.results))
        say(proof.table(res.proof))
    return res


def _describe(hosts: list[str]) -> str:
    """'asgd-tb-h0: 0-3; asgd-tb-h1: 4-7; ...'"""
    by: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by.setdefault(h, []).append(r)
    return "; ".join(f"{h}: {_ranges(rs)}" for h, rs in sorted(by.items()))


def _ranges(rs: list[int]) -> str:
    parts, start = [], rs[0]
    for a, b in zip(rs, rs[1:] + [None]):
        if b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ",".join(parts)
