"""up, down and status of a testbed, and the Testbed handle bench/ and the tests use.

up records its progress in state.json before each object it makes, and on any failure
takes down what it made; a killed up leaves objects that down finds by their names.
down is idempotent: it ends the launchers recorded by `run`, every process inside the
testbed's namespaces and its Slurm daemons (TERM, then KILL; it returns only once each is
gone, or names the zombies a parent does not reap), then removes namespaces, veths (their
qdiscs go with them), the bridge, the namespace files and the state directory, and checks
that nothing is left.
"""

from __future__ import annotations

import os
import re
import sys
import time
import zlib

from . import hostns, launch, links, procs, shaping, slurm, state
from .sh import TestbedError, missing_requirements
from .spec import CONTROL_PREFIX, PREFIX, Spec, check_name, format_rate, is_bridge_name, link_names, netns_names

RSH = """#!/bin/sh
# asgd testbed {name}: the MPI launcher's ssh stand-in. `rsh [-opts] HOST COMMAND...`
# runs COMMAND with /bin/sh inside HOST's network, UTS and IPC namespaces, as ssh would
# run it on a remote machine. Written by `python -m asgd.testbed up`, removed by down.
while [ $# -gt 0 ] && [ "${{1#-}}" != "$1" ]; do shift; done   # ssh options (hydra: -x)
host=$1; shift
d={dir}
if [ ! -e "/run/netns/$host" ] || [ ! -e "$d/$host.uts" ]; then
  echo "asgd testbed {name}: no host '$host' (hosts: {first} .. {last})" >&2; exit 255
fi
exec nsenter --net="/run/netns/$host" --uts="$d/$host.uts" --ipc="$d/$host.ipc" -- /bin/sh -c "$*"
"""

def _say_nothing(*_a, **_k):
    pass


def exists(name: str) -> bool:
    return (state.state_file(name).parent.exists() or bool(netns_names(name, links.list_netns()))
            or bool(link_names(name, links.list_links())))


def pick_subnet(name: str, base: str = "10.231", key: str = "subnet") -> str:
    """A free <base>.X.0/24 for this testbed (its data network; base 10.232 and key
    "control": its control network): X from its name, then the next free one."""
    taken = {(state.read(n) or {}).get(key) for n in state.names()}
    start = zlib.crc32(name.encode()) % 256
    for i in range(256):
        prefix = f"{base}.{(start + i) % 256}"
        if prefix not in taken and not links.subnet_in_use(prefix):
            return prefix
    raise TestbedError(f"no free {base}.X.0/24 subnet" + ("; pass --subnet" if key == "subnet" else ""))


def up(name: str, hosts: int, rate_bit: int, latency_us: float = 0.0, subnet: str | None = None,
       say=print, made_host=None, slurm_cpus: int | None = None, slurm_started=None) -> Testbed:
    """Make the testbed; returns its handle. Raises TestbedError (nothing left behind).
    made_host(k), if given, is called once host k is made and shaped, slurm_started()
    once the Slurm daemons are started (progress; the tests kill an up there).
    slurm_cpus: also start a Slurm whose nodes are the hosts, each claiming that many
    CPUs (asgd.testbed.slurm)."""
    check_name(name)
    reason = missing_requirements() or (slurm_cpus is not None and slurm.missing_requirements())
    if reason:
        raise TestbedError(f"cannot make a testbed here: {reason}")
    if exists(name):
        raise TestbedError(f"testbed {name!r} already exists (or pieces of it): "
                           f"python -m asgd.testbed down --name {name}")
    spec = Spec(name, hosts, rate_bit, latency_us, subnet or pick_subnet(name),
                pick_subnet(name, "10.232", "control"))
    state.write(spec, status="creating", pid=os.getpid(), start=procs.start_time(os.getpid()))
    t0 = time.perf_counter()
    try:
        links.make_bridges(spec)
        netem = shaping.netem_available(spec.bridge) if latency_us > 0 else None
        if latency_us > 0 and not netem:
            say(f"asgd.testbed: netem is not in this kernel (no sch_netem): no latency added; "
                f"--latency {latency_us:g} us is NOT applied (links have only their own sub-ms latency)",
                file=sys.stderr)
        delay = latency_us / 2 if netem else 0.0  # each end of a host-to-host path adds half
        for k in range(hosts):
            links.make_netns(spec, k)
            hostns.create({kind: spec.ns_file(k, kind) for kind in hostns.KINDS}, spec.host(k))
            links.make_links(spec, k)
            shaping.shape(spec.veth(k), rate_bit, delay)               # into host k
            shaping.shape("eth0", rate_bit, delay, netns=spec.host(k))  # out of host k
            if made_host:
                made_host(k)
        spec.rsh.write_text(RSH.format(name=name, dir=spec.dir, first=spec.host(0), last=spec.host(hosts - 1)))
        spec.rsh.chmod(0o755)
        cluster = slurm.start(spec, slurm_cpus, started=slurm_started) if slurm_cpus is not None else None
        state.write(spec, status="up", netem=netem, latency_applied_us=latency_us if netem else 0.0,
                    slurm=cluster, seconds_to_up=round(time.perf_counter() - t0, 3))
    except BaseException:
        down(name, say=_say_nothing)
        raise
    say(f"asgd.testbed: {name} up: {hosts} hosts {spec.host(0)} .. {spec.host(hosts - 1)} "
        f"({spec.host_ip(0)} .. {spec.host_ip(hosts - 1)}) on bridge {spec.bridge}, "
        f"{format_rate(rate_bit)} each way per link (tbf), latency "
        + (f"{latency_us:g} us (netem)" if latency_us and netem else "not added")
        + f"; the launcher's control network {spec.control_cidr} on bridge {spec.control_bridge} (unshaped)"
        + (f"; Slurm {slurm.version()}: slurmctld at {spec.launcher_ip}:{cluster['port']}, a slurmd on each host "
           f"({cluster['cpus']} CPUs each), partition {cluster['partition']}, its traffic on the control network: "
           f"export SLURM_CONF={cluster['conf']}" if cluster else "")
        + f"; {time.perf_counter() - t0:.2f} s")
    return Testbed(spec)


def down(name: str, say=print) -> dict:
    """Remove everything of testbed `name` (idempotent). Returns what was removed; raises
    TestbedError if something could not be."""
    check_name(name)
    removed = {"launchers": [], "processes": [], "netns": [], "links": [], "files": []}
    for r in state.recorded_runs(name):
        if procs.kill_group(r["pid"], r.get("start")):
            removed["launchers"].append(r["pid"])
    info = state.read(name) or {}
    if info.get("status") == "creating" and info.get("pid") and procs.alive(info["pid"], info.get("start")) \
            and info["pid"] != os.getpid():
        procs.kill([info["pid"]])   # an `up` still under way (or stalled)
        removed["launchers"].append(info["pid"])
    # TERM, KILL after a grace, and back only once each is gone: reaped, not a zombie
    inside = procs.of_testbed(name)
    ended = procs.end(inside)
    left = ended.running
    stopped = slurm.stop(name)   # slurmctld, munged (slurmd went with its host's processes)
    removed["daemons"] = sorted(stopped.gone + list(stopped.unreaped))
    removed["unreaped"] = {**ended.unreaped, **stopped.unreaped}   # exited; their parent does not reap
    namespaces = netns_names(name, links.list_netns())
    removed["processes"] = inside
    # links before namespaces: a namespace's deletion takes its veth pair with it, but
    # asynchronously, so a later look could still see (and count) the root-side end
    devs = link_names(name, links.list_links())
    for dev in sorted(devs, key=lambda d: is_bridge_name(name, d)):   # veths first, the bridges last
        links.delete_link(dev)
        removed["links"].append(dev)
    for ns in namespaces:
        links.delete_netns(ns)
        removed["netns"].append(ns)
    d = state.state_file(name).parent
    if d.is_dir():
        for f in sorted(d.glob("*.uts")) + sorted(d.glob("*.ipc")):
            hostns.remove(f)
            removed["files"].append(f.name)
        for f in sorted((d / "runs").glob("*")) if (d / "runs").is_dir() else []:
            f.unlink(missing_ok=True)
        for f in ("rsh", "state.json", "state.tmp"):
            (d / f).unlink(missing_ok=True)
        for sub in (d / "runs", d):
            try:
                sub.rmdir()
            except FileNotFoundError:
                pass
    leftovers = leftovers_of(name) + [f"process {p}" for p in left]
    if leftovers:
        raise TestbedError(f"testbed {name}: could not remove {', '.join(leftovers)}")
    if any(removed.values()):
        say(f"asgd.testbed: {name} down: removed {len(removed['netns'])} namespaces, {len(removed['links'])} "
            f"interfaces, {len(removed['processes'])} processes, {len(removed['launchers'])} launchers"
            + (f", {len(removed['daemons'])} Slurm daemons" if removed["daemons"] else "")
            + (f"; {len(removed['unreaped'])} exited but their parent has not reaped them (pid/parent "
               + ", ".join(f"{p}/{pp}" for p, pp in removed["unreaped"].items())
               + "): zombies until it does" if removed["unreaped"] else ""))
    else:
        say(f"asgd.testbed: {name}: nothing to remove")
    return removed


def leftovers_of(name: str) -> list[str]:
    """Anything of testbed `name` still present: namespaces, interfaces, state files, mounts,
    Slurm daemons."""
    out = [f"netns {n}" for n in netns_names(name, links.list_netns())]
    out += [f"Slurm daemon {p}" for p in slurm.daemons(name)]
    out += [f"link {d}" for d in link_names(name, links.list_links())]
    d = state.state_file(name).parent
    if d.exists():
        out.append(f"directory {d}")
    with open("/proc/self/mountinfo") as f:
        out += [f"mount {line.split()[4]}" for line in f if line.split()[4].startswith(str(d) + "/")]
    return out


def status(name: str | None = None) -> list[dict]:
    """Per testbed: its spec, status, and per host the address, counters, qdiscs, processes
    inside, and what is missing."""
    out = []
    present_ns, present_links = links.list_netns(), links.list_links()
    for n in ([name] if name else sorted(set(state.names()) | _names_from_objects(present_ns, present_links))):
        info = state.read(n)
        namespaces = netns_names(n, present_ns)
        devs = link_names(n, present_links)
        entry = {"name": n, "status": (info or {}).get("status", "no state file (a killed up? run down)"),
                 "state": info, "hosts": [], "problems": []}
        if info:
            spec = Spec.from_dict(info)
            pids = procs.of_testbed(n)
            by_net = {}
            for p in pids:
                try:
                    by_net.setdefault(os.stat(f"/proc/{p}/ns/net").st_ino, []).append(p)
                except OSError:
                    pass
            for k in range(spec.hosts):
                h = {"host": spec.host(k), "ip": spec.host_ip(k), "veth": spec.veth(k)}
                if spec.host(k) not in namespaces:
                    entry["problems"].append(f"netns {spec.host(k)} missing")
                if spec.veth(k) in devs:
                    c = links.counters(spec.veth(k))
                    h.update(recv_bytes=c["tx_bytes"], sent_bytes=c["rx_bytes"],
                             qdisc=shaping.qdisc_stats(spec.veth(k))["kinds"])
                else:
                    entry["problems"].append(f"veth {spec.veth(k)} missing")
                if spec.control_veth(k) not in devs:
                    entry["problems"].append(f"veth {spec.control_veth(k)} missing")
                try:
                    h["processes"] = len(by_net.get(os.stat(f"/run/netns/{spec.host(k)}").st_ino, []))
                except OSError:
                    h["processes"] = 0
                entry["hosts"].append(h)
            for bridge in (spec.bridge, spec.control_bridge):
                if bridge not in devs:
                    entry["problems"].append(f"bridge {bridge} missing")
        else:
            entry["objects"] = namespaces + devs
        out.append(entry)
    return out


def _names_from_objects(namespaces: list[str], devs: list[str]) -> set[str]:
    """Testbed names whose objects exist without a state directory (after a crash)."""
    got = set()
    for ns in namespaces:
        m = re.fullmatch(re.escape(PREFIX) + r"([a-z0-9]{1,6})-h\d+", ns)
        if m:
            got.add(m.group(1))
    for dev in devs:   # a bridge alone (up killed before its first host)
        m = re.fullmatch(f"(?:{re.escape(PREFIX)}|{re.escape(CONTROL_PREFIX)})" + r"([a-z0-9]{1,6})", dev)
        if m and os.path.isdir(f"/sys/class/net/{dev}/bridge"):
            got.add(m.group(1))
    return got


class Testbed:
    """A handle on a testbed that is up: its spec, running jobs on it, taking it down."""

    def __init__(self, spec: Spec):
        self.spec = spec

    @classmethod
    def open(cls, name: str) -> Testbed:
        info = state.read(check_name(name))
        if not info:
            raise TestbedError(f"no testbed {name!r}: python -m asgd.testbed up --name {name} --hosts H "
                               "--bandwidth RATE")
        if info.get("status") != "up":
            raise TestbedError(f"testbed {name!r} is {info.get('status')!r}, not up: "
                               f"python -m asgd.testbed down --name {name}, then up again")
        return cls(Spec.from_dict(info))

    @property
    def info(self) -> dict:
        return state.read(self.spec.name) or {}

    def run(self, cmd: list[str], **kw) -> launch.RunResult:
        """launch.run on this testbed (see there)."""
        return launch.run(self.spec, cmd, **kw)

    def down(self, say=_say_nothing) -> dict:
        return down(self.spec.name, say=say)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.down()
