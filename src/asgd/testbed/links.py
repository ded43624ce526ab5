"""The testbed's networks: per host a network namespace, joined to the data bridge by a
veth pair (eth0 inside) and to the control bridge by another (ctl inside); the control
bridge has the launcher's address in the root namespace, the data bridge none.

The data links carry nothing but the ranks' TCP, so that their counters prove where
MPI's bytes went: IPv6 is off (no router solicitations, no neighbour discovery), eth0
has multicast off (no IGMP reports) and a permanent neighbour entry for every other
host's fixed MAC (no ARP), the data bridge knows every host's MAC and port from the
start (a static entry: no frame to a host not heard from yet is flooded to every link),
and the launcher talks to the hosts over the control links."""

from __future__ import annotations

import os
import re

from .sh import TestbedError, run
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


def make_bridges(spec: Spec) -> None:
    """The data bridge (no address: nothing of the root namespace's crosses the data
    links), then the control bridge with the launcher's address."""
    for bridge, address in ((spec.bridge, None), (spec.control_bridge, spec.launcher_ip)):
        run(["ip", "link", "add", bridge, "type", "bridge"])
        _no_ipv6(bridge)
        if address:
            run(["ip", "addr", "add", f"{address}/24", "dev", bridge])
        run(["ip", "link", "set", bridge, "up"])


def make_netns(spec: Spec, k: int) -> None:
    """Host k's network namespace: IPv6 off, loopback up, and TCP's tail loss probes off:
    the data links never drop (deep tbf queues; run reports drops), so a probe, sent
    when a queue delays an ACK past twice the smoothed round trip, is always a spurious
    resend (measured: 27 of them on a server's link in one 12-host run); the timeout's
    resends stay, counted by the byte proof."""
    ns = spec.host(k)
    run(["ip", "netns", "add", ns])
    for dev in ("all", "default"):
        _no_ipv6(dev, ns)
    run(["nsenter", f"--net=/run/netns/{ns}", "/bin/sh", "-c", "echo 0 > /proc/sys/net/ipv4/tcp_early_retrans"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])


def make_links(spec: Spec, k: int) -> None:
    """Host k's data link (veth asgd-<name>-<k> in the data bridge <-> eth0, its fixed MAC,
    multicast off, every host's neighbour entry) and control link (asgc-<name>-<k> in the
    control bridge <-> ctl)."""
    ns = spec.host(k)
    for veth, inner, bridge, address in ((spec.veth(k), "eth0", spec.bridge, spec.host_ip(k)),
                                         (spec.control_veth(k), "ctl", spec.control_bridge, spec.control_ip(k))):
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", inner, "netns", ns])
        _no_ipv6(veth)
        run(["ip", "link", "set", veth, "master", bridge])
        if inner == "eth0":
            run(["ip", "-n", ns, "link", "set", "eth0", "address", spec.host_mac(k), "multicast", "off"])
            run(["bridge", "fdb", "replace", spec.host_mac(k), "dev", veth, "master", "static"])
        run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", inner])
        run(["ip", "-n", ns, "link", "set", inner, "up"])
        run(["ip", "link", "set", veth, "up"])
    if spec.hosts > 1:
        run(["ip", "-n", ns, "-batch", "-"], input="".join(
            f"neigh replace {spec.host_ip(j)} lladdr {spec.host_mac(j)} dev eth0 nud permanent\n"
            for j in range(spec.hosts) if j != k))


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


def counters(dev: str) -> dict[str, int]:
    """tx_bytes, rx_bytes, tx_packets, rx_packets of a root-namespace interface (a packet:
    one frame, or one TSO/GSO frame that the kernel splits into segments later)."""
    base = f"/sys/class/net/{dev}/statistics/"
    out = {}
    for k in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets"):
        with open(base + k) as f:
            out[k] = int(f.read())
    return out


# TCP's own counters of a host (its network namespace's /proc/net/snmp and netstat): the
# segments it sent again (retransmissions, tail loss probes among them) and the ones it
# received twice (each answered with a duplicate SACK, RFC 2883)
RESENT, RECEIVED_TWICE = ("Tcp", "RetransSegs"), (("TcpExt", "TCPDSACKOldSent"), ("TcpExt", "TCPDSACKOfoSent"))


def tcp_counters(spec: Spec) -> list[dict[str, int]]:
    """Per host: {resent, received_twice} TCP segments since its namespace was made."""
    script = "".join(f"echo @; nsenter --net=/run/netns/{spec.host(k)} cat /proc/net/snmp /proc/net/netstat; "
                      for k in range(spec.hosts))
    out = []
    for block in run(["/bin/sh", "-c", script], timeout=60).stdout.split("@\n")[1:]:
        lines = block.splitlines()
        table = {}
        for names, values in zip(lines[::2], lines[1::2]):
            kind, *keys = names.split()
            table.update({(kind.rstrip(":"), k): int(v) for k, v in zip(keys, values.split()[1:])})
        out.append({"resent": table[RESENT], "received_twice": sum(table[k] for k in RECEIVED_TWICE)})
    if len(out) != spec.hosts:
        raise TestbedError(f"TCP counters of {len(out)} of {spec.hosts} hosts read")
    return out


def subnet_in_use(prefix: str) -> bool:
    """True if the root namespace already has an address or a route in <prefix>.0/24
    (another testbed's, or the machine's own)."""
    out = run(["ip", "-4", "route", "show", "table", "all"]).stdout + run(["ip", "-4", "-o", "addr", "show"]).stdout
    return re.search(r"(^|\s)" + re.escape(prefix) + r"\.\d+", out, re.M) is not None
