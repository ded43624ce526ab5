"""The testbed's network: a bridge with an address in the root namespace, and per host a
network namespace joined to the bridge by a veth pair (eth0 inside). IPv6 is off on all
of them, so router solicitations and neighbour discovery do not add bytes of their own to
the counters that prove where MPI's bytes went."""

from __future__ import annotations

import os
import re

from .sh import run
from .spec import Spec

# TCP over the veths (MTU 1500, IPv4, timestamps on): a segment carries up to MSS bytes of
# payload in a frame FRAME_HEADERS bytes longer (Ethernet 14, IP 20, TCP 20 + 12 of
# options), as the veth counters and tbf count it.
MSS, FRAME_HEADERS = 1448, 66


def _no_ipv6(dev: str, netns: str | None = None) -> None:
    """/proc/sys/net is the writer's network namespace's (a kernel without IPv6: no file)."""
    knob = f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"
    if netns:
        run(["nsenter", f"--net=/run/netns/{netns}", "/bin/sh", "-c", f"[ ! -e {knob} ] || echo 1 > {knob}"])
    elif os.path.exists(knob):
        with open(knob, "w") as f:
            f.write("1")


def make_bridge(spec: Spec) -> None:
    run(["ip", "link", "add", spec.bridge, "type", "bridge"])
    _no_ipv6(spec.bridge)
    run(["ip", "addr", "add", f"{spec.bridge_ip}/24", "dev", spec.bridge])
    run(["ip", "link", "set", spec.bridge, "up"])


def make_netns(spec: Spec, k: int) -> None:
    ns = spec.host(k)
    run(["ip", "netns", "add", ns])
    for dev in ("all", "default"):
        _no_ipv6(dev, ns)
    run(["ip", "-n", ns, "link", "set", "lo", "up"])


def make_link(spec: Spec, k: int) -> None:
    """veth asgd-<name>-<k> in the bridge <-> eth0 in host k, with host k's address."""
    ns, veth = spec.host(k), spec.veth(k)
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    _no_ipv6(veth)
    run(["ip", "link", "set", veth, "master", spec.bridge])
    run(["ip", "-n", ns, "addr", "add", f"{spec.host_ip(k)}/24", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])
    run(["ip", "link", "set", veth, "up"])


def list_links() -> list[str]:
    out = run(["ip", "-o", "link", "show"]).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def list_netns() -> list[str]:
    out = run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def delete_netns(ns: str) -> None:
    run(["ip", "netns", "del", ns], check=False)


def delete_link(dev: str) -> None:
    run(["ip", "link", "del", dev], check=False)


def counters(dev: str) -> tuple[int, int]:
    """(tx_bytes, rx_bytes) of a root-namespace interface."""
    base = f"/sys/class/net/{dev}/statistics/"
    with open(base + "tx_bytes") as t, open(base + "rx_bytes") as r:
        return int(t.read()), int(r.read())


def subnet_in_use(prefix: str) -> bool:
    """True if the root namespace already has an address or a route in <prefix>.0/24
    (another testbed's, or the machine's own)."""
    out = run(["ip", "-4", "route", "show", "table", "all"]).stdout + run(["ip", "-4", "-o", "addr", "show"]).stdout
    return re.search(r"(^|\s)" + re.escape(prefix) + r"\.\d+", out, re.M) is not None
