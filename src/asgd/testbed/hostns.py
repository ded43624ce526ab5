"""A host's own hostname and IPC: persistent UTS and IPC namespaces.

`unshare --uts=FILE --ipc=FILE hostname NAME` creates both and bind-mounts them on FILE
(as `ip netns add` does for network namespaces), so they live without a holder process
that could die or be left behind; `nsenter --uts=FILE --ipc=FILE` enters them, and
unmounting the files is all it takes to remove them once no process is inside.
Why both: MPI libraries decide "same node" by hostname (MPICH's hydra, UCX's machine
identity) and reach shared memory through System V IPC; a host of its own must differ in
both (UCX still finds /dev/shm and process_vm_readv across hosts, which is why launch.py
also restricts UCX to TCP; the veth counters prove the bytes went over the wire).
"""

from __future__ import annotations

from pathlib import Path

from .sh import TestbedError, run

KINDS = ("uts", "ipc")


def create(files: dict[str, Path], hostname: str) -> None:
    """files: {'uts': path, 'ipc': path}; the files must not be mount points yet."""
    for f in files.values():
        f.touch()
    run(["unshare", *(f"--{k}={files[k]}" for k in KINDS), "hostname", hostname])
    got = run(["nsenter", f"--uts={files['uts']}", "hostname"]).stdout.strip()
    if got != hostname:
        raise TestbedError(f"{files['uts']}: hostname is {got!r}, not {hostname!r}")


def is_mounted(path: Path) -> bool:
    """True when `path` has a namespace bind-mounted on it (an nsfs file)."""
    target = str(path)
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == target for line in f)
    except OSError:
        return False


def remove(path: Path) -> None:
    """Unmount (repeatedly: a file may carry stacked mounts after a retried up) and delete."""
    for _ in range(8):
        if not is_mounted(path):
            break
        run(["umount", str(path)], check=False)
    if is_mounted(path):
        run(["umount", "-l", str(path)], check=False)
    if is_mounted(path):
        raise TestbedError(f"cannot unmount {path}")
    path.unlink(missing_ok=True)


def inode(path: Path) -> int | None:
    """The namespace's inode (what /proc/PID/ns/* link to), or None when not mounted."""
    try:
        return path.stat().st_ino if is_mounted(path) else None
    except OSError:
        return None
