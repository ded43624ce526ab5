"""Processes of a testbed: those inside its hosts' namespaces (ranks, launcher proxies),
found by namespace inode in /proc, and ending them. Only processes in namespaces the
testbed made, or launchers it recorded itself (pid and start time), are ever signalled.
Both `run` (a job past its time) and `down` end them through here."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

from . import hostns, links, state
from .spec import netns_names


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat):
    with the pid, it names one process even after pids are reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def session(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, start: int | None = None) -> bool:
    """Running (not a zombie) and, if given, started at `start`."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (start is None or int(fields[19]) == start)


def _ns_inode(pid: int, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def inside(inodes: dict[str, set[int]]) -> list[int]:
    """PIDs (live, not this process) whose namespace of some kind ('net', 'uts', 'ipc')
    is one of the given inodes."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if any(_ns_inode(pid, kind) in nodes for kind, nodes in inodes.items() if nodes) and alive(pid):
            out.append(pid)
    return sorted(out)


def namespaces_of(name: str) -> dict[str, set[int]]:
    """The inodes of testbed `name`'s namespaces, by kind: its hosts' network namespaces
    (/run/netns) and the UTS and IPC namespaces bind-mounted in its state directory
    (also those of a host whose network namespace is already gone)."""
    out: dict[str, set[int]] = {"net": set(), "uts": set(), "ipc": set()}
    for ns in netns_names(name, links.list_netns()):
        try:
            out["net"].add(os.stat(f"/run/netns/{ns}").st_ino)
        except OSError:
            pass
    d = state.state_file(name).parent
    for kind in hostns.KINDS:
        for f in d.glob(f"*.{kind}") if d.is_dir() else []:
            ino = hostns.inode(f)
            if ino:
                out[kind].add(ino)
    return out


def of_testbed(name: str) -> list[int]:
    """PIDs inside any of testbed `name`'s namespaces."""
    return inside(namespaces_of(name))


def kill(pids: list[int], wait_s: float = 5.0) -> list[int]:
    """SIGKILL each; returns those still alive after wait_s."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        if left:
            time.sleep(0.02)
    return left


TERM_GRACE_S = 3.0   # end(): a process's time to exit on SIGTERM before it gets SIGKILL
KILL_WAIT_S = 5.0    # end(): after SIGKILL, how long to wait for it to exit
REAP_WAIT_S = 1.0    # end(): then how long to wait for the exited ones' parents to reap them


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def gone(pid: int, start: int | None = None) -> bool:
    """The process has exited and been reaped: its pid no longer names it (absent, or a
    later process's). A zombie is not gone: `ps` and pgrep still list it. This process's
    own children (daemons an `up` in this process started) are reaped here; any other's
    is its parent's to reap (an orphan's, init's: a container's pid 1 may never do it)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:   # not my child
        pass
    now = start_time(pid)
    return now is None or (start is not None and now != start)


def _wait(pids: list[int], done, wait_s: float) -> list[int]:
    """Those of pids for which done(pid) is not true within wait_s."""
    deadline = time.monotonic() + wait_s
    left = [p for p in pids if not done(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if not done(p)]
    return left


@dataclass
class Ended:
    """What end() did: every pid it was given is in `gone`, `running` or `unreaped`."""
    gone: list[int] = field(default_factory=list)       # exited and reaped: the pid is free
    killed: list[int] = field(default_factory=list)     # those SIGTERM did not end within the grace
    running: list[int] = field(default_factory=list)    # still running after SIGKILL and its wait
    unreaped: dict[int, int | None] = field(default_factory=dict)   # exited, not reaped: pid -> its parent

    def survivors(self) -> list[str]:
        """One phrase per process that is not gone, for an error or a report."""
        return ([f"process {p} (still running after SIGKILL)" for p in self.running]
                + [f"process {p} (exited, not reaped by its parent {pp})" for p, pp in self.unreaped.items()])


def end(pids: list[int], grace_s: float = TERM_GRACE_S, kill_wait_s: float = KILL_WAIT_S,
        reap_wait_s: float = REAP_WAIT_S) -> Ended:
    """SIGTERM each process; SIGKILL those still running after grace_s; wait (bounded)
    until each has exited and then until each is gone (gone(): reaped, its pid free), so
    that a caller that returns leaves none behind, not even a zombie for `ps` to list a
    moment later, unless its parent will not reap it (Ended.unreaped says whose). A pid is
    signalled only while it names the process it named on entry (its start time)."""
    starts = {p: start_time(p) for p in pids}

    def exited(p):
        return gone(p, starts[p]) or not alive(p, starts[p])
    for pid in pids:
        _signal(pid, starts[pid], signal.SIGTERM)
    killed = _wait(pids, exited, grace_s)
    for pid in killed:
        _signal(pid, starts[pid], signal.SIGKILL)
    running = _wait(killed, exited, kill_wait_s)
    unreaped = _wait([p for p in pids if p not in running], lambda p: gone(p, starts[p]), reap_wait_s)
    return Ended(gone=[p for p in pids if p not in running and p not in unreaped], killed=killed,
                 running=running, unreaped={p: parent(p) for p in unreaped})


def _signal(pid: int, start: int | None, sig: int) -> None:
    if start is None or not alive(pid, start):
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_group(pid: int, start: int | None, sig: int = signal.SIGKILL) -> bool:
    """Signal the process group of a launcher we started (its own session: pgid == pid),
    only if that pid is still the process we recorded."""
    if not alive(pid, start):
        return False
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
    return True
