"""A machine (machines.py) as a SimGrid platform: hosts with the node's cores, links,
routes, and where a shared file system sits.

  one-node   one host with the calibrated machine's cores; ranks talk through its
             loopback (the ping-pong's latency and bandwidth, set in the engine's config)
  star       nodes on one switch, each by its own full-duplex link (a rack, Mustang); a
             file-system host on the switch too when the machine has one
  torus      a 3-D torus of nodes (Blue Waters' Gemini); the file-system host is one more
             leaf, its bandwidth capped by a limiter link
  fat-tree   a two-level fat-tree of nodes, 16 per leaf switch, the file-system host a leaf

CPU sharing: a host's cores are shared among the actors computing at once (SimGrid's CPU
model: an action gets at most one core). On the calibrated machine the host's capacity
also follows the measured cores' worth (effective_cores: P busy ranks get less than P
cores' worth of steps done), through a non-linear sharing callback.
"""

from __future__ import annotations

import math

from .costs import Costs
from .machines import Machine

FLOPS = 1e9  # a core of the calibrated machine does 1e9 simulated flops per second


class Platform:
    """The built platform: nodes[i] is node i's host; fs the file-system host or None."""

    def __init__(self, sg, machine: Machine, nodes: int, costs: Costs):
        self.sg, self.machine, self.costs = sg, machine, costs
        self.nodes: list = []
        self.fs = None
        self._cb = []  # keep sharing callbacks alive as long as the platform
        speed = machine.core_speed * FLOPS
        bw = machine.link_bw or costs.bandwidth()
        lat = machine.link_lat or costs.latency()
        topo = machine.topology
        self.nics: list = []   # testbed: each rank's host on the links (its actor computes on nodes[0])
        if topo == "testbed":
            self._testbed(costs.spec.ranks, speed, machine.link_bw, machine.link_lat)
        elif topo == "one-node" or nodes <= 1 and not machine.fs_bw:
            zone = sg.NetZone.create_full_zone("asgd")
            self.nodes = [self._host(zone, "node0", speed)]
            zone.seal()
        elif topo == "star":
            self._star(nodes, speed, bw, lat)
        elif topo in ("torus", "fat-tree"):
            self._cluster(topo, nodes, speed, bw, lat)
        else:
            raise ValueError(f"unknown topology {topo!r}")

    def _host(self, zone, name: str, speed: float):
        h = zone.create_host(name, speed)
        h.core_count = self.machine.cores_per_node
        if self.machine.calibrated or self.costs.spec.background > 0:  # cores' worth of P busy ranks
            costs = self.costs

            def capacity(cap: float, n: int) -> float:
                return speed * costs.cores_worth(n) if n > 0 else cap
            self._cb.append(capacity)
            h.set_sharing_policy(self.sg.Host.SharingPolicy.NONLINEAR, capacity)
        return h.seal()

    def _star(self, nodes: int, speed: float, bw: float, lat: float) -> None:
        sg = self.sg
        zone = sg.NetZone.create_star_zone("rack")
        up = sg.LinkInRoute.Direction.UP

        def attach(host, link_bw: float, link_lat: float):
            link = zone.create_split_duplex_link(f"link-{host.name}", link_bw)
            link.set_latency(link_lat)
            link.seal()
            zone.add_route(host.netpoint, None, None, None, [sg.LinkInRoute(link, up)], True)
        for i in range(nodes):
            h = self._host(zone, f"node{i}", speed)
            attach(h, bw, lat)
            self.nodes.append(h)
        if self.machine.fs_bw:
            self.fs = zone.create_host("fs", speed).seal()
            attach(self.fs, self.machine.fs_bw, lat)
        zone.seal()

    def _testbed(self, ranks: int, speed: float, bw: float, lat: float) -> None:
        """asgd.testbed: one host of the machine's cores where every rank computes, and a
        host per rank on a star of split-duplex links of the testbed's rate (its link),
        which that rank's messages cross (actors.World.send)."""
        sg = self.sg
        zone = sg.NetZone.create_star_zone("testbed")
        up = sg.LinkInRoute.Direction.UP

        def attach(host, link_bw: float, link_lat: float, name: str):
            link = zone.create_split_duplex_link(name, link_bw)
            link.set_latency(link_lat)
            link.seal()
            zone.add_route(host.netpoint, None, None, None, [sg.LinkInRoute(link, up)], True)
        cpu = self._host(zone, "cores", speed)
        attach(cpu, 1e12, 0.0, "link-cores")   # the cores talk to themselves through the loopback only
        self.nodes = [cpu]
        for r in range(ranks):
            nic = zone.create_host(f"host{r}", speed).seal()
            attach(nic, bw, lat, f"link-host{r}")
            self.nics.append(nic)
        zone.seal()

    def _cluster(self, topo: str, nodes: int, speed: float, bw: float, lat: float) -> None:
        sg = self.sg
        leaves = nodes + (1 if self.machine.fs_bw else 0)
        by_ident: dict[int, object] = {}
        fs_ident = nodes if self.machine.fs_bw else -1

        def make(zone, coord, ident):
            name = f"node{ident}" if ident < nodes else ("fs" if ident == fs_ident else f"spare{ident}")
            h = self._host(zone, name, speed) if ident < nodes else zone.create_host(name, speed).seal()
            by_ident[ident] = h
            return h.netpoint, None

        def limiter(zone, coord, ident):
            if ident == fs_ident:  # the file system's own bandwidth, whatever the network's
                return zone.create_link("fs-limiter", self.machine.fs_bw).seal()
            return zone.create_link(f"nolimit{ident}", 100 * bw).seal()  # SimGrid wants one per element
        self._cb += [make, limiter]
        callbacks = sg.ClusterCallbacks(make, None, limiter)
        policy = sg.Link.SharingPolicy.SPLITDUPLEX
        if topo == "torus":
            self._torus(nodes, speed, bw, lat)
            return
        else:
            per = 16
            switches = max(2, math.ceil(leaves / per))
            params = sg.FatTreeParams(2, [per, switches], [1, per], [1, 1])
            zone = sg.NetZone.create_fatTree_zone("fat-tree", None, params, callbacks, bw, lat, policy)
        zone.seal()
        self.nodes = [by_ident[i] for i in range(nodes)]
        self.fs = by_ident.get(fs_ident)

    def _torus(self, nodes: int, speed: float, bw: float, lat: float) -> None:
        """A 3-D torus built by hand: a full-duplex link between each node and its six
        neighbours, shortest-path routes (Floyd). (SimGrid 3.32's own torus zone crashed
        its solver with over a thousand ranks and several servers.)"""
        sg = self.sg
        dims = list(self.machine.torus_dims) or _cube(nodes)
        if math.prod(dims) < nodes:
            raise ValueError(f"a {'x'.join(map(str, dims))} torus holds {math.prod(dims)} nodes, fewer than {nodes}")
        zone = sg.NetZone.create_floyd_zone("torus")
        hosts = [self._host(zone, f"node{i}", speed) if i < nodes else zone.create_host(f"spare{i}", speed).seal()
                 for i in range(math.prod(dims))]
        up = sg.LinkInRoute.Direction.UP

        def coord(i):
            return (i % dims[0], i // dims[0] % dims[1], i // (dims[0] * dims[1]))

        def index(c):
            return c[0] + dims[0] * (c[1] + dims[1] * c[2])
        done = set()
        for i in range(len(hosts)):
            c = coord(i)
            for d in range(3):
                if dims[d] < 2:
                    continue
                n = list(c)
                n[d] = (n[d] + 1) % dims[d]
                j = index(n)
                if (min(i, j), max(i, j)) in done or i == j:
                    continue
                done.add((min(i, j), max(i, j)))
                link = zone.create_split_duplex_link(f"torus-{i}-{j}", bw)
                link.set_latency(lat)
                link.seal()
                zone.add_route(hosts[i].netpoint, hosts[j].netpoint, None, None, [sg.LinkInRoute(link, up)], True)
        if self.machine.fs_bw:  # the file system: one more host on a link of its bandwidth, off the last node
            self.fs = zone.create_host("fs", speed).seal()
            link = zone.create_split_duplex_link("fs-link", self.machine.fs_bw)
            link.set_latency(lat)
            link.seal()
            zone.add_route(self.fs.netpoint, hosts[len(hosts) - 1].netpoint, None, None,
                           [sg.LinkInRoute(link, up)], True)
        zone.seal()
        self.nodes = hosts[:nodes]

    def describe(self) -> dict:
        m = self.machine
        return {"machine": m.name,
                "topology": m.topology if len(self.nodes) > 1 or self.fs or self.nics else "one-node",
                "nodes": len(self.nics) or len(self.nodes), "cores_per_node": m.cores_per_node,
                "core_speed": m.core_speed,
                "link_bandwidth_Bps": m.link_bw or self.costs.bandwidth(),
                "link_latency_s": m.link_lat or self.costs.latency(),
                "file_system_Bps": m.fs_bw or None, "stated": m.stated, "assumed": m.assumed}


def _cube(n: int) -> list[int]:
    """The smallest near-cubic 3-D torus that holds n nodes."""
    a = max(1, round(n ** (1 / 3)))
    dims = [a, a, a]
    i = 0
    while math.prod(dims) < n:
        dims[i % 3] += 1
        i += 1
    return dims
