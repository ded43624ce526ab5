"""The batch scripts on a multi-node Slurm: the emulated cluster's hosts as Slurm nodes
(python -m asgd.testbed up --slurm), a training job submitted with sbatch across them,
its byte proof, and that down (also after a killed up) leaves no daemon, namespace, link
or file behind.

The tests that start Slurm need root, namespaces (asgd.testbed's requirements) and
Debian's slurm-wlm; elsewhere they skip, saying why. The others (the configuration, the
dry run's submission, the proof's rule for ranks beside their server) run anywhere.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from asgd.testbed import batch, faults, lifecycle, links, placement, proof, slurm, state
from asgd.testbed.sh import TestbedError, missing_requirements
from asgd.testbed.spec import Spec, parse_rate
from conftest import MPIEXEC

REPO = Path(__file__).resolve().parents[1]
REASON = (missing_requirements() if sys.platform.startswith("linux") else "not Linux") or slurm.missing_requirements()
needs_slurm_testbed = pytest.mark.skipif(bool(REASON), reason=f"no Slurm on a testbed here: {REASON}")
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install -e '.[mpich]')")


def quiet(*_a, **_k):
    pass


# -- anywhere --------------------------------------------------------------------------

def test_slurm_conf_puts_slurms_traffic_on_the_control_network():
    """slurmctld at the control network's root address, each node at its host's control
    address under the host's name; every node its own spool and TmpFS (%n): the pmix
    plugin names its client directory by job and step only, so nodes sharing one TmpFS
    failed `srun --mpi=pmix` ("File exists")."""
    s = Spec("x", 3, 10**8, subnet="10.231.7", control="10.232.7")
    conf = slurm.conf_text(s, 40000, 4, "ctl")
    lines = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and not line.startswith(("#", "Node")))
    assert lines["SlurmctldHost"] == "ctl(10.232.7.1)" and lines["SlurmctldPort"] == "40000"
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [n.split()[:3] for n in nodes] == [[f"NodeName=asgd-x-h{k}", f"NodeAddr=10.232.7.{10 + k}",
                                               f"NodeHostname=asgd-x-h{k}"] for k in range(3)]
    assert all("CPUs=4 " in n for n in nodes)
    assert lines["TmpFS"].endswith("/slurm/tmp/%n") and lines["SlurmdSpoolDir"].endswith("/slurm/spool/%n")
    assert lines["AuthInfo"] == f"socket={slurm.directory(s)}/munge/sock"
    assert "PartitionName=x Nodes=ALL Default=YES" in conf


def test_task_prolog_gives_every_task_the_testbeds_mpi_settings(tmp_path):
    """The TaskProlog's exports: TCP on eth0 (UCX, libfabric), Open MPI's TCP BTL on the data
    network and its daemons on the control network, hydra's proxies calling back on ctl,
    and crowded ranks told so when a step has more tasks than the machine has cores."""
    s = Spec("x", 3, 10**8, subnet="10.231.7", control="10.232.7")
    f = tmp_path / "prolog"
    f.write_text(slurm.prolog_text(s, cores=2))

    def exports(**env):
        out = subprocess.run(["sh", str(f)], capture_output=True, text=True, timeout=10,
                             env={"PATH": os.environ["PATH"], **env}).stdout
        return dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    got = exports(SLURM_NTASKS="16")
    assert got["UCX_TLS"] == "self,tcp" and got["UCX_NET_DEVICES"] == "eth0" and got["HYDRA_IFACE"] == "ctl"
    assert got["OMPI_MCA_btl_tcp_if_include"] == "10.231.7.0/24"
    assert got["PRTE_MCA_oob_tcp_if_include"] == "10.232.7.0/24"
    assert got["ASGD_OVERSUBSCRIBED"] == "1"
    assert exports(SLURM_NTASKS="16", SLURM_STEP_NUM_TASKS="2")["ASGD_OVERSUBSCRIBED"] == "0"


def test_the_dry_run_is_the_same_submission_with_dry_run():
    """sbatch: --dry-run after the script's own arguments; qsub (whose Perl wrapper takes
    --dry-run for its own option, and passes a `--` on to the script): at the end of
    ASGD_ARGS, which needs the environment passed (qsub -v alone passes only what it
    names)."""
    cmd, env = batch.dry_run(["sbatch", "-N", "3", "slurm/train.sbatch", "--epochs", "1"], {"ASGD_OUT": "x"})
    assert cmd[-3:] == ["--epochs", "1", "--dry-run"] and env == {"ASGD_OUT": "x"}
    cmd, env = batch.dry_run(["qsub", "-l", "nodes=3:ppn=1", "pbs/train.pbs"], {"ASGD_ARGS": "--epochs 1"})
    assert cmd == ["qsub", "-l", "nodes=3:ppn=1", "pbs/train.pbs"] and env["ASGD_ARGS"] == "--epochs 1 --dry-run"
    with pytest.raises(batch.TestbedError, match="-V"):
        batch.dry_run(["qsub", "-v", "ASGD_ARGS=x", "pbs/train.pbs"], {})
    assert batch.dry_run(["qsub", "-V", "-v", "A=1", "pbs/train.pbs"], {})[1]["ASGD_ARGS"] == "--dry-run"


def test_a_jobs_runs_are_found_in_order(tmp_path):
    for d in ("n16", "n2", "n4", "dry-run/n2", "dry-run"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "results.json").write_text("{}")
    assert batch.run_folders(str(tmp_path)) == [str(tmp_path / d) for d in ("n2", "n4", "n16")]
    (tmp_path / "results.json").write_text("{}")
    assert batch.run_folders(str(tmp_path))[0] == str(tmp_path)


def test_fail_refuses_a_host_it_does_not_have():
    s = Spec("x", 3, 10**8)
    with pytest.raises(batch.TestbedError, match=r"no host 3 in testbed x \(hosts 0..2\)"):
        faults.fail(s, 3, "kill")
    with pytest.raises(ValueError, match="--how must be one of link, kill"):
        faults.fail(s, 0, "unplug")


def test_open_mpis_mpiexec_keeps_the_allocations_slots(monkeypatch, tmp_path):
    """Inside a Slurm or PBS allocation whose tasks hold the ranks, asgd.mpienv gives Open
    MPI's mpiexec no --oversubscribe: with it, `ASGD_LAUNCHER=mpiexec sbatch -N 4 -n 16
    slurm/train.sbatch` ran all 16 ranks on the first node. More ranks than the job's
    tasks (calibrate's probes in a one-task job) still need it."""
    from asgd import mpienv
    monkeypatch.setattr(mpienv, "flavour", lambda _launcher: "openmpi")
    for var in ("SLURM_JOB_ID", "SLURM_NTASKS", "PBS_JOBID", "PBS_NODEFILE"):
        monkeypatch.delenv(var, raising=False)
    assert "--oversubscribe" in mpienv.flags("mpiexec", 16)    # a workstation: more ranks than cores
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    monkeypatch.setenv("SLURM_NTASKS", "16")
    assert "--oversubscribe" not in mpienv.command(16, "python", launcher="mpiexec")
    assert "--oversubscribe" in mpienv.flags("mpiexec", 17)
    for var in ("SLURM_JOB_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(var)
    nodes = tmp_path / "nodefile"
    nodes.write_text("h0\nh0\nh1\nh1\n")
    monkeypatch.setenv("PBS_JOBID", "12.server")
    monkeypatch.setenv("PBS_NODEFILE", str(nodes))
    assert "--oversubscribe" not in mpienv.flags("mpiexec", 4)
    assert "--oversubscribe" in mpienv.flags("mpiexec", 8)


def test_a_jobs_end_as_an_exit_status():
    def end(state, code):
        return batch.JobEnd("1", state, code, "n", "").rc
    assert end("COMPLETED", "0:0") == 0
    assert end("FAILED", "2:0") == 2
    assert end("CANCELLED", "0:15") == 128 + 15
    assert end("NODE_FAIL", "0:0") == 1 and end("TIMEOUT", "0:0") == 1


def test_a_submission_that_does_not_return_ends_in_one_line(monkeypatch, tmp_path):
    """`run -- sbatch --wait ...` blocked until the job's end and ended in a traceback
    (TimeoutExpired): the submitter must answer with a job id at once."""
    fake = tmp_path / "sbatch"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(batch, "SUBMIT_S", 0.5)
    with pytest.raises(TestbedError, match=r"no job id within 0.5 s .*leave out --wait"):
        batch._submit(None, [str(fake), "--wait", "x.sbatch"], dict(os.environ))


def _ps(spec, where, S, updates=10, push=1000, reply=990, dry=False):
    """A results.json of S servers and workers at `where` (a host per rank): each worker
    `updates` pushes to each server; the end-of-run records to rank 0."""
    ranks = []
    W = len(where) - S
    for r, k in enumerate(where):
        u = 0 if dry else updates
        train = ({"sent": W * u * reply, "recv": W * (u * push + 8)} if r < S else
                 {"sent": S * (u * push + 8), "recv": S * u * reply})
        n = len(where) - 1   # each rank sends rank 0 its 400 B of records, rank 0 answers 40 B
        finish = {"sent": 40 * n, "recv": 400 * n} if r == 0 else {"sent": 400, "recv": 40}
        b = {"init": {"sent": 0, "recv": 0}, "train": {"sent": 0, "recv": 0} if dry else train, "finish": finish}
        ranks.append({"rank": r, "host": spec.host(k), "updates": u, "refused": 0, "bytes": b,
                      "bytes_sent": sum(x["sent"] for x in b.values()),
                      "bytes_recv": sum(x["recv"] for x in b.values())})
        if r < S:
            ranks[-1]["shard"] = [r * 100, (r + 1) * 100]
    return {"config": {"arch": "ps", "allreduce": "ring", "servers": S}, "dry_run": dry, "ranks": ranks}


def test_the_proof_leaves_out_workers_beside_their_server():
    """Slurm's block placement (srun -N 2 -n 4: ranks 0, 1 on the first host) puts workers
    beside the server: their pushes and replies never cross a link, so they are neither
    in the host's bytes nor among its messages; the workers on the other host are. Before,
    the proof counted them on the server's link (3 times what crossed it here)."""
    spec = Spec("p", 2, 10**8)
    where = [0, 0, 1, 1]
    job = _ps(spec, where, 1)
    hosts = proof.app(job, spec, where)
    worker = 10 * 1000 + 8                                  # a worker's pushes and its done message
    assert hosts[1]["sent"] == 2 * (worker + 400)           # ranks 2 and 3: pushes and records to rank 0
    assert hosts[0]["recv"] == 2 * (worker + 400)           # rank 0 takes them; rank 1's stay inside
    assert hosts[0]["sent"] == 2 * (10 * 990 + 40)
    m = proof.added_messages(job, where)
    assert not m[1]["sent"] and m[2]["sent"] == Counter({1000: 10, 8: 1}) and m[0]["recv"][1000] == 20
    # two servers beside a worker: which of its bytes went to which is not in results.json
    with pytest.raises(proof.ProofError, match="one shares its host"):
        proof.app(_ps(Spec("p", 2, 10**8), [0, 0, 0, 1], 2), spec, [0, 0, 0, 1])
    # servers on a host of their own (srun -N 3 -n 6, --servers 2): no worker beside them
    assert proof.beside_their_server(_ps(Spec("p", 3, 10**8), [0, 0, 1, 1, 2, 2], 2), [0, 0, 1, 1, 2, 2]) == []


def test_a_sweeps_runs_add_up_on_the_links():
    """job_traffic: the runs one job made one after another (a sweep of 2, then 4 ranks)
    add up per host; the proof's noise allowance is per run."""
    spec = Spec("p", 2, 10**8)
    runs = [_ps(spec, [0, 1], 1), _ps(spec, [0, 0, 1, 1], 1)]
    quiet_link = [{"sent": 0, "recv": 0, "frames_sent": 0, "frames_recv": 0}] * 2
    t = proof.job_traffic(runs, spec, quiet_link)
    one = [proof.traffic(r, spec, [spec.index(x["host"]) for x in r["ranks"]], quiet_link) for r in runs]
    assert t[1]["app"]["sent"] == one[0][1]["app"]["sent"] + one[1][1]["app"]["sent"]
    assert t[0]["msgs"]["recv"][1000] == 10 + 20 and t[1]["ranks"] == [1, 2, 3]
    assert "app - 2048 <=" in proof.check(t, t, spec.host, runs=2)["rule"]


# A stand-in for a Slurm daemon: its command line names the Slurm directory (argv[1]), as
# slurm.daemons finds them; it ignores SIGTERM for argv[2] seconds, then exits.
FAKE_DAEMON = """
import signal, sys, time
if float(sys.argv[2]):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
time.sleep(60) if not float(sys.argv[2]) else None
"""


def _fake_daemon(kind: str, d: Path, ignore_term_s: float) -> subprocess.Popen:
    p = subprocess.Popen([kind, "-c", FAKE_DAEMON, str(d / "slurm.conf"), str(ignore_term_s)],
                         executable=sys.executable, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout.readline() == "ready\n"
    return p


def test_stopping_slurm_returns_once_every_daemon_is_gone(tmp_path, monkeypatch):
    """Issue 39: three slurmd were found right after `down --slurm` returned. Its daemons,
    started by an `up` in the same process (a test's, bench's), were signalled but their
    pids not yet gone: exited and never reaped. slurm.stop returns only once each pid is
    gone: one that ends on SIGTERM, one that ignores it for a moment, one that ignores
    it for good (SIGKILL after the grace)."""
    monkeypatch.setattr(slurm.specmod, "STATE_ROOT", tmp_path)
    d = slurm.directory("fake")
    d.mkdir(parents=True)
    made = [_fake_daemon("slurmctld", d, 0), _fake_daemon("slurmd", d, 0.5), _fake_daemon("slurmd", d, 600)]
    pids = [p.pid for p in made]
    try:
        assert slurm.daemons("fake") == sorted(pids)
        stopped = slurm.stop("fake")
        assert [p for p in pids if Path(f"/proc/{p}").exists()] == [], "pids not gone when stop returned"
        assert sorted(stopped.gone) == sorted(pids) and stopped.killed == [pids[2]] and not d.exists()
    finally:
        for p in made:
            if p.poll() is None:
                p.kill()
            p.wait()


# -- as root, with namespaces and Slurm ------------------------------------------------------

def _name(tag: str) -> str:
    return f"{tag}{os.getpid() % 10000}"


def _nothing_left(name: str) -> None:
    assert lifecycle.leftovers_of(name) == []
    assert slurm.daemons(name) == []
    assert not [x for x in links.list_netns() if x.startswith(f"asgd-{name}-")]
    assert not [x for x in links.list_links() if x in (f"asgd-{name}", f"asgc-{name}")
                or x.startswith((f"asgd-{name}-", f"asgc-{name}-"))]
    assert not state.state_file(name).parent.exists()


@pytest.fixture(scope="module")
def cluster():
    """A 3-host testbed with a Slurm (down in any case)."""
    from asgd.data import parse
    from asgd.net import mlp
    parse.compile_parsers()   # numba's cache filled here, not by three hosts at once inside the job
    mlp.compile_kernels()
    name = _name("s")
    t0 = time.perf_counter()
    tb = lifecycle.up(name, 3, parse_rate("1gbit"), slurm_cpus=2, say=quiet)
    tb.seconds_to_up = time.perf_counter() - t0
    yield tb
    lifecycle.down(name, say=quiet)


@needs_slurm_testbed
@pytest.mark.timeout(30)
def test_a_slurm_of_three_hosts_comes_up(cluster):
    """One idle node per host, named by its hostname, at its control address."""
    spec = cluster.spec
    assert slurm.node_states(spec) == {h: "idle" for h in spec.host_names}
    p = subprocess.run(["scontrol", "-o", "show", "node", spec.host(2)], capture_output=True, text=True, timeout=20,
                       env={**os.environ, **slurm.env(spec)})
    assert f"NodeAddr={spec.control_ip(2)} " in p.stdout and "CPUTot=2 " in p.stdout
    assert cluster.info["slurm"]["partition"] == spec.name
    assert cluster.seconds_to_up < 20


@needs_slurm_testbed
@needs_mpi
@pytest.mark.timeout(150)
def test_sbatch_training_job_across_three_hosts(cluster, tmp_path):
    """sbatch -N 3 slurm/train.sbatch: ExitCode 0:0, a rank on each host (srun's PMI-2 over
    the control network, the ranks' bytes over the data links), and the byte proof over
    its dry run, submitted the same way, holds."""
    env = {"ASGD_OUT": str(tmp_path / "run"), "ASGD_TIMEOUT": "100", "ASGD_VENV": sys.prefix,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    t0 = time.perf_counter()
    os.chdir(tmp_path)   # the job's output file lands in the submission's folder
    res = batch.run(cluster.spec, ["sbatch", "-N", "3", "-n", "3", "-t", "3", str(REPO / "slurm" / "train.sbatch"),
                                   "--epochs", "1", "--hidden", "2000", "--quiet"],
                    check_bytes=True, timeout=120, env=env, say=quiet)
    out = res.job.output()
    assert (res.job.state, res.job.exit_code) == ("COMPLETED", "0:0"), out
    assert (res.baseline.state, res.baseline.exit_code) == ("COMPLETED", "0:0")
    assert res.hosts == [cluster.spec.host_names]
    r = res.results[0]
    assert r["config"]["launcher"] == "srun" and r["metrics"]["accuracy"] > 0.9
    assert res.proof["ok"], proof.table(res.proof)
    for row in res.proof["hosts"]:
        # hidden 2000, float32 (the default): 40 KB a message, 32+ each way
        assert row["app_sent"] > 1_000_000 and 1.0 <= row["ratio_sent"] < 1.08, row
    assert json.loads((tmp_path / "run" / "dry-run" / "results.json").read_text())["dry_run"] is True
    print(f"sbatch -N 3 with its dry run: {time.perf_counter() - t0:.1f} s; load {os.getloadavg()[0]:.2f}")


@needs_slurm_testbed
@pytest.mark.timeout(60)
def test_a_lost_host_comes_back(cluster):
    """fail --how kill ends every process of the host (its slurmd among them), --how link
    takes its two links down; heal brings the links up and starts its slurmd again, and
    Slurm has the node idle again (ReturnToService=2)."""
    spec = cluster.spec
    env = {**os.environ, **slurm.env(spec)}

    def link_up(dev):
        return "state UP" in subprocess.run(["ip", "link", "show", dev], capture_output=True, text=True,
                                            timeout=10).stdout
    killed = faults.fail(spec, 2, "kill")["killed"]
    assert killed and faults.host_processes(spec, 2) == []
    assert slurm.daemons(spec.name) and all(p not in slurm.daemons(spec.name) for p in killed)
    assert faults.fail(spec, 2, "link")["links_down"] == [spec.veth(2), spec.control_veth(2)]
    assert not link_up(spec.veth(2)) and not link_up(spec.control_veth(2))
    assert faults.heal(spec, 2)["slurmd_started"] is True
    assert [p for p in faults.host_processes(spec, 2) if faults.is_slurmd(p)]
    assert link_up(spec.veth(2)) and link_up(spec.control_veth(2))
    deadline = time.monotonic() + 20
    while slurm.node_states(spec).get(spec.host(2)) != "idle" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slurm.node_states(spec)[spec.host(2)] == "idle", subprocess.run(
        ["sinfo", "-N"], capture_output=True, text=True, env=env, timeout=20).stdout
    assert faults.heal(spec, 2)["slurmd_started"] is False   # a second heal starts no second slurmd


@needs_slurm_testbed
@pytest.mark.timeout(60)
def test_down_leaves_no_slurm_behind(cluster):
    """down ends slurmctld, every slurmd and munged, and removes their state, spool and
    sockets with the hosts."""
    name = cluster.spec.name
    d = slurm.directory(cluster.spec)
    assert len(slurm.daemons(name)) == 2 + cluster.spec.hosts and (d / "munge" / "sock").is_socket()
    removed = lifecycle.down(name, say=quiet)
    assert len(removed["daemons"]) == 2   # slurmctld, munged: the slurmds went with their hosts' processes
    _nothing_left(name)


@needs_slurm_testbed
@pytest.mark.timeout(60)
def test_a_killed_up_leaves_no_slurm_behind():
    """up --slurm killed once its daemons are started, before its nodes are idle: down
    finds the daemons by their command line (they name the testbed's Slurm directory)
    and removes them with the rest."""
    name = _name("k")
    halt = ("import threading; from asgd.testbed import lifecycle\n"
            "def started():\n"
            "    print('slurm started', flush=True); threading.Event().wait()\n"
            f"lifecycle.up({name!r}, 2, 10**8, slurm_cpus=1, slurm_started=started)\n")
    up = subprocess.Popen([sys.executable, "-c", halt], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = up.stdout.readline()
        assert line == "slurm started\n", line
        os.killpg(up.pid, signal.SIGKILL)
        up.wait(timeout=10)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    try:
        assert state.read(name)["status"] == "creating"
        assert len(slurm.daemons(name)) == 4     # munged, slurmctld, 2 slurmd
    finally:
        p = subprocess.run([sys.executable, "-m", "asgd.testbed", "down", "--name", name], capture_output=True,
                           text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "2 Slurm daemons" in p.stdout
    _nothing_left(name)


def test_placement_of_a_block_of_four_matches_srun():
    """The synthetic placement above is srun's block distribution (a sanity check of the
    helpers, not of Slurm): 4 ranks on 2 hosts in blocks of 2."""
    assert placement.plan(4, 0, 2, ranks_per_host=2) == [0, 0, 1, 1]


@needs_mpi
@pytest.mark.timeout(90)
def test_a_requeued_job_resumes_from_its_checkpoint(tmp_path):
    """slurm/train.sbatch run again by Slurm (a requeue after a node failure: the same job
    id, so the same run folder, and SLURM_RESTART_COUNT > 0) resumes from the folder's
    checkpoint instead of starting over. The script runs here as Slurm's batch step would,
    with the allocation's variables and ASGD_LAUNCHER=mpiexec."""
    script = REPO / "slurm" / "train.sbatch"
    out = tmp_path / "slurm-7"
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "here", "ASGD_LAUNCHER": "mpiexec",
           "ASGD_SRUN_MPI": "pmi2", "ASGD_TIMEOUT": "60", "ASGD_OUT": str(out)}
    train = ["--hidden", "20", "--checkpoint-every", "5"]
    first = subprocess.run(["bash", str(script), "--epochs", "1", *train], capture_output=True, text=True,
                           timeout=80, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (out / "checkpoint").is_dir()
    again = subprocess.run(["bash", str(script), "--epochs", "2", *train], capture_output=True, text=True,
                           timeout=80, env={**env, "SLURM_RESTART_COUNT": "1"}, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"job 7 was requeued (1 times): resuming from {out}/checkpoint" in again.stdout
    assert f"resuming from {out} after epoch 1" in again.stdout   # asgd.train's own word for it
    history = json.loads((out / "results.json").read_text())["metrics"]["history"]
    assert [h["epoch"] for h in history] == [1, 2]
