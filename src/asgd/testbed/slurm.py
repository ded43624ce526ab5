"""A Slurm on the testbed (`up --slurm`): slurmctld in the root namespace, one slurmd per
host (inside the host's network, UTS and IPC namespaces: NodeName = the host's
hostname), a private munged, one partition of every host.

Slurm's own traffic runs on the control network: slurmctld listens on the root
namespace's control address, each node's NodeAddr is its control address, and srun,
slurmstepd and the PMI plugins (pmi2's tree, pmix's direct connections) reach each other
at those addresses. So the data links carry only what the MPI ranks send each other, and
the byte proof stays exact for jobs Slurm starts. The testbed's MPI settings, which a
site would put in its modules (TCP on each host's eth0 for UCX, libfabric and Open MPI's
TCP BTL; the launchers' own connections on the control network; that all hosts share
this machine's cores), reach every task through a TaskProlog.

Everything lives in the testbed's state directory, SLURM_DIR = <state>/slurm:
  slurm.conf, plugstack.conf (empty), task-prolog
  munge/      key, socket, pid and seed files of the private munged
  state/      slurmctld's StateSaveLocation     spool/<host>/  each slurmd's spool
  tmp/<host>/ each node's TmpFS: the pmix plugin makes its client directory there,
              named by job and step only, so nodes that shared one would collide
              ("Cannot create directory ...: File exists", and srun --mpi=pmix fails)
  log/        every daemon's log
Daemons are found by their command line, which names SLURM_DIR (munged --socket=...,
slurmctld and slurmd -f .../slurm.conf): `down` ends them even after a killed `up`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from ..mpienv import OVERSUBSCRIBED_ENV, cores_available
from . import procs
from . import spec as specmod
from .sh import TestbedError, run
from .spec import Spec

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")
DAEMONS = ("munged", "slurmctld", "slurmd")
SLURMD_PORT = 6818          # each slurmd in its own network namespace: one port for all
SLURMD_TIMEOUT_S = 20       # a node that does not answer this long is DOWN (Slurm's default: 300)
DEFAULT_CPUS = 4            # CPUs each node claims (config_overrides: more than the machine has)

# The testbed's MPI settings for every task (see launch.TCP_ONLY_ENV): UCX and libfabric
# on TCP over eth0 (UCX would find shared memory between hosts that share a kernel),
# UCX's keepalives off, Open MPI's TCP BTL on the data network and its daemons' channel
# on the control network, hydra (mpiexec inside an allocation) calling its proxies back
# on the control network, and Open MPI's mpiexec not binding ranks to cores (each node
# claims more CPUs than the machine has: binding to them fails).
TASK_ENV = {"UCX_TLS": "self,tcp", "UCX_NET_DEVICES": "eth0", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0",
            "UCX_TCP_KEEPIDLE": "inf", "OMPI_MCA_btl": "tcp,self,sm", "OMPI_MCA_pml": "ob1",
            "HYDRA_IFACE": "ctl", "PRTE_MCA_hwloc_default_binding_policy": "none"}


def missing_requirements() -> str | None:
    """None if a Slurm can be started here; else why not (for up's error, the tests' skip)."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"Slurm is not installed (no {', '.join(missing)}): apt-get install slurm-wlm slurm-wlm-torque munge"
    return None


def directory(spec_or_name) -> Path:
    name = spec_or_name.name if isinstance(spec_or_name, Spec) else spec_or_name
    return specmod.STATE_ROOT / name / "slurm"


def conf_path(spec_or_name) -> Path:
    return directory(spec_or_name) / "slurm.conf"


def env(spec: Spec) -> dict[str, str]:
    """What a Slurm client needs to talk to this testbed's Slurm."""
    return {"SLURM_CONF": str(conf_path(spec))}


def partition(spec: Spec) -> str:
    return spec.name


# -- configuration (pure) ---------------------------------------------------------------

def conf_text(spec: Spec, ctld_port: int, cpus: int, controller: str) -> str:
    """slurm.conf: the controller on the control network's root address, every host a
    node at its control address, one partition of them all."""
    d = directory(spec)
    nodes = "".join(f"NodeName={spec.host(k)} NodeAddr={spec.control_ip(k)} NodeHostname={spec.host(k)} "
                    f"CPUs={cpus} Sockets=1 CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN\n"
                    for k in range(spec.hosts))
    return f"""# asgd testbed {spec.name}: written by `python -m asgd.testbed up --slurm`, removed by down
ClusterName=asgd{spec.name}
SlurmctldHost={controller}({spec.launcher_ip})
SlurmctldPort={ctld_port}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
PlugStackConfig={d}/plugstack.conf
TaskProlog={d}/task-prolog
TmpFS={d}/tmp/%n
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout={SLURMD_TIMEOUT_S}
MinJobAge=3600
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{nodes}PartitionName={partition(spec)} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def prolog_text(spec: Spec, cores: int) -> str:
    """The TaskProlog: its `export NAME=VALUE` lines go into each task's environment
    (batch scripts, srun's tasks, hydra's proxies). Every host looks like a node of its
    own but all share this machine's cores: a step of more tasks than cores is crowded
    (asgd.mpienv.OVERSUBSCRIBED_ENV; the batch step counts the job's tasks)."""
    lines = "".join(f"echo export {k}={v}\n" for k, v in {
        **TASK_ENV, "OMPI_MCA_btl_tcp_if_include": spec.cidr, "OMPI_MCA_oob_tcp_if_include": spec.control_cidr,
        "PRTE_MCA_oob_tcp_if_include": spec.control_cidr}.items())
    return f"""#!/bin/sh
# asgd testbed {spec.name}: the MPI settings of this emulated cluster, for every task Slurm starts
{lines}n=${{SLURM_STEP_NUM_TASKS:-${{SLURM_NTASKS:-1}}}}
if [ "$n" -gt {cores} ]; then echo export {OVERSUBSCRIBED_ENV}=1; else echo export {OVERSUBSCRIBED_ENV}=0; fi
"""


# -- the daemons ----------------------------------------------------------------------------

def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _spawn(args: list[str], log: Path) -> int:
    """Start a daemon in the foreground mode, in a session of its own (it outlives up)."""
    with open(log, "ab") as out:
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, close_fds=True)
    return p.pid


def start(spec: Spec, cpus: int = DEFAULT_CPUS, timeout: float = 60, started=None) -> dict:
    """Write the configuration, start munged, slurmctld and a slurmd per host, and wait
    until every node is idle. Returns what state.json records; TestbedError if a daemon
    fails (with the end of its log). started(), if given, is called once every daemon
    is started (the tests kill an up there)."""
    reason = missing_requirements()
    if reason:
        raise TestbedError(f"cannot start Slurm: {reason}")
    if cpus < 1:
        raise ValueError(f"--slurm-cpus must be >= 1, not {cpus}")
    d = directory(spec)
    for sub in ("munge", "state", "log", *(f"{kind}/{h}" for kind in ("spool", "tmp") for h in spec.host_names)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d / "munge", 0o755)   # munged checks its socket directory's mode
    key = d / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (d / "plugstack.conf").write_text("")   # no site SPANK plugins (the system's file is not read)
    prolog = d / "task-prolog"
    prolog.write_text(prolog_text(spec, cores_available()))
    prolog.chmod(0o755)
    port = _free_port(spec.launcher_ip)
    conf_path(spec).write_text(conf_text(spec, port, cpus, socket.gethostname().split(".")[0]))
    _spawn(["munged", "--foreground", "--force", f"--socket={d}/munge/sock", f"--key-file={key}",
            f"--pid-file={d}/munge/pid", f"--seed-file={d}/munge/seed", f"--log-file={d}/log/munged.log"],
           d / "log" / "munged.out")
    wait_until(lambda: (d / "munge" / "sock").is_socket(), 10, "munged did not make its socket", d)
    conf = str(conf_path(spec))
    _spawn(["slurmctld", "-D", "-f", conf], d / "log" / "slurmctld.out")
    for k in range(spec.hosts):
        start_slurmd(spec, k)
    if started:
        started()
    wait_until(lambda: set(node_states(spec).values()) == {"idle"}, timeout,
          f"the nodes were not idle within {timeout:g} s", d, lambda: node_states(spec))
    return {"conf": conf, "port": port, "cpus": cpus, "partition": partition(spec)}


def start_slurmd(spec: Spec, k: int) -> None:
    """Host k's slurmd, inside its network, UTS and IPC namespaces (nsenter, not `ip netns
    exec`, which remounts /sys and hides the cgroup tree slurmd reads)."""
    h = spec.host(k)
    _spawn(["nsenter", f"--net=/run/netns/{h}", f"--uts={spec.ns_file(k, 'uts')}", f"--ipc={spec.ns_file(k, 'ipc')}",
            "--", "slurmd", "-D", "-N", h, "-f", str(conf_path(spec))], directory(spec) / "log" / f"slurmd-{h}.out")


def wait_until(ok, timeout: float, what: str, d: Path, detail=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.1)
    logs = "".join(f"\n--- {f.name}: " + " | ".join(f.read_text(errors="replace").splitlines()[-4:])
                   for f in sorted((d / "log").glob("*")) if f.stat().st_size)
    raise TestbedError(f"Slurm: {what}" + (f" ({detail()})" if detail else "") + logs)


def node_states(spec: Spec) -> dict[str, str]:
    """{node: state} as sinfo reports it (idle, alloc, mixed, down*, ...); {} if slurmctld
    does not answer."""
    p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20,
                       env={**os.environ, **env(spec)})
    if p.returncode:
        return {}
    return dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)


def daemons(name: str) -> list[int]:
    """PIDs of this testbed's Slurm and munge daemons, wherever they run: their command
    line names its Slurm directory (slurmstepd and the jobs run inside the hosts and are
    the hosts' processes)."""
    mark = (str(directory(name)) + "/").encode()
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(words[0]).decode(errors="replace") in DAEMONS + ("nsenter",) \
                and any(mark in w for w in words) and procs.alive(int(entry)):
            out.append(int(entry))
    return sorted(out)


def stop(name: str) -> procs.Ended:
    """End the daemons (TERM, then KILL after procs.TERM_GRACE_S), wait until each is gone
    (procs.end: reaped, not a zombie that `ps` still lists), and remove the Slurm
    directory; idempotent. Returns what procs.end saw: a daemon exited but left unreaped
    by a parent other than this process is in its `unreaped`; one still running raises
    TestbedError."""
    got = procs.end(daemons(name))
    if got.running:
        raise TestbedError(f"Slurm daemons of testbed {name} did not end: {', '.join(got.survivors())}")
    d = directory(name)
    if d.exists():
        shutil.rmtree(d)
    return got


def submit_kind(cmd: list[str]) -> str | None:
    """'sbatch' or 'qsub' if the command submits a batch job, else None."""
    base = os.path.basename(cmd[0]) if cmd else ""
    return base if base in ("sbatch", "qsub") else None


def version() -> str:
    p = run(["slurmctld", "-V"], check=False)
    m = re.search(r"[\d.]+", p.stdout + p.stderr)
    return m.group(0) if m else "?"
