"""Processes of a testbed: those inside its hosts' namespaces (ranks, launcher proxies),
found by namespace inode in /proc, and ending them. Only processes in namespaces the
testbed made, or launchers it recorded itself (pid and start time), are ever signalled.
Both `run` (a job past its time) and `down` end them through here."""

from __future__ import annotations

import os
import signal
import time

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
