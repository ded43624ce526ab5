"""Running the system tools (ip, tc, nsenter, unshare, umount) with time limits, and
finding out whether this machine can make a testbed at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

TOOLS = ("ip", "tc", "bridge", "nsenter", "unshare", "umount")


class TestbedError(RuntimeError):
    """A testbed operation failed; the message says which command and why."""


def run(args: list[str], timeout: float = 20, check: bool = True,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run a command (stdin: `input`); on failure (check) raise TestbedError with its stderr."""
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
    except FileNotFoundError:
        raise TestbedError(f"{args[0]}: not found (install iproute2 / util-linux)") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{' '.join(args)}: no answer within {timeout:g} s") from None
    if check and p.returncode:
        raise TestbedError(f"{' '.join(args)}: {p.stderr.strip() or f'exit {p.returncode}'}")
    return p


def ok(args: list[str], timeout: float = 20) -> bool:
    return run(args, timeout, check=False).returncode == 0


def missing_requirements() -> str | None:
    """None if namespaces, a bridge and veths can be made here; else the reason why not
    (for the CLI's error and the tests' skip)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "making network namespaces, bridges and qdiscs needs root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)} (apt-get install iproute2 util-linux)"
    probe = f"asgdq{os.getpid() % 100000}"
    try:
        if not ok(["ip", "link", "add", probe, "type", "bridge"]):
            return "cannot create a bridge (no bridge module in this kernel?)"
        ok(["ip", "link", "del", probe])
        if not ok(["ip", "link", "add", probe, "type", "veth", "peer", "name", probe + "p"]):
            return "cannot create a veth pair (no veth module in this kernel?)"
        ok(["ip", "link", "del", probe])
        if not ok(["unshare", "--net", "--uts", "--ipc", "true"]):
            return "cannot create network/UTS/IPC namespaces (unshare failed)"
    except TestbedError as e:
        return str(e)
    return None
