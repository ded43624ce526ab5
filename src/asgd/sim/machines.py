"""The platforms to simulate, as data (no SimGrid here; platform.py builds them).

`here` is the calibrated machine: one node of params.cores cores, ranks sharing them,
messages through shared memory (the ping-pong's latency and bandwidth). The paper's two
testbeds are described from its Tables 2 and 3; where the paper is silent, the value
is an assumption, named in `assumed` with its reason, and printed with every result.

Speeds are relative to one core of the calibrated machine (core_speed 1.0 = a step
takes what calibrate measured here). Bandwidths in bytes/s, latencies in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

TOPOLOGIES = ("one-node", "star", "torus", "fat-tree", "testbed")


@dataclass(frozen=True)
class Machine:
    name: str
    cores_per_node: int
    core_speed: float = 1.0            # one core's speed against the calibrated machine's core
    topology: str = "one-node"         # TOPOLOGIES
    link_bw: float = 0.0               # node <-> network, bytes/s (0: from the calibration's ping-pong)
    link_lat: float = 0.0              # s per hop (0: from the calibration's ping-pong)
    torus_dims: tuple = ()             # torus: nodes per dimension (empty: the smallest cube that holds them)
    fs_bw: float = 0.0                 # shared file system: bytes/s its server delivers (0: files are local)
    fs_lat: float = 0.0                # s per request to the file system
    stated: dict = field(default_factory=dict)   # what the paper's table states
    assumed: dict = field(default_factory=dict)  # what it does not, and why we chose the value

    @property
    def multi_node(self) -> bool:
        return self.topology != "one-node"

    @property
    def calibrated(self) -> bool:
        """Its cores are the calibrated machine's (this machine, or a testbed on it)."""
        return self.name in ("here", "testbed")


def here(cores: int) -> Machine:
    return Machine("here", cores, stated={"source": "python -m asgd.perf calibrate on this machine"})


def testbed(cores: int, rate_bit: float, latency_s: float = 0.0) -> Machine:
    """asgd.testbed on this machine: every rank on a host of its own, each host's link at
    rate_bit each way, all hosts sharing this machine's `cores` (platform.py: the ranks
    compute on one host of those cores and send over their own hosts' links)."""
    return Machine("testbed", cores, topology="testbed", link_bw=rate_bit / 8, link_lat=latency_s,
                   stated={"source": "asgd.testbed: hosts of one rank each, tc tbf links, this machine's cores"},
                   assumed={"links": "a message's bytes on the wire from params.json's link_s (TCP/IP framing, "
                                     "asgd.testbed.model); what tbf's bucket on each end passes at line speed "
                                     "(link_burst_s, refilled while the link idles: sim.buckets) taken off, "
                                     "the rest times the exchange's measured link efficiency"})


# Relative core speeds: one core of this machine (an AMD EPYC with AVX-512, Zen 4 class)
# against the paper's cores, for a float64 step of dense matrix products and exps. The
# paper gives clocks only; these are assumptions from public per-core figures (double
# precision FLOPs per cycle x clock), and they only matter for "asgd on the paper's
# machines": the CNTK-like scenario takes its costs from the paper's own numbers.
MUSTANG = Machine(
    "mustang", cores_per_node=16, core_speed=0.5, topology="star",
    link_bw=10e9 / 8, link_lat=25e-6, fs_bw=0.0,
    stated={"table": "Table 2", "nodes": 7, "cpu": "2 x Intel Xeon E5-2660", "clock": "1.20-3.00 GHz",
            "cores": "2 x 8 physical, 2 x 16 logical", "L2": "256 KB", "L3": "20480 KB", "memory": "128 GB",
            "disk": "256 GB SSD", "network": "10 Gbps Ethernet, one top-of-rack switch",
            "mpi": "OpenMPI 1.10.2"},
    assumed={"core_speed": "0.5 of this machine's core: Sandy Bridge AVX (8 DP flops/cycle) at about "
                           "2.2-3.0 GHz against a Zen 4 core (AVX-512) here",
             "topology": "a star: every node on one top-of-rack switch (the paper's single rack)",
             "link_lat": "25 us per hop: MPI over TCP on 10 GbE (Open MPI 1.10), not stated",
             "file system": "each node reads its local SSD copy (the paper lists a local SSD)"})

BLUE_WATERS = Machine(
    "bluewaters", cores_per_node=16, core_speed=0.35, topology="torus",
    link_bw=9.6e9, link_lat=1.5e-6, fs_bw=1.0e9, fs_lat=1e-3,
    stated={"table": "Table 3", "nodes": 64, "cores": "16 x 64 (2 x 8 physical, 2 x 16 logical)",
            "clock": "2.3 GHz", "L2": "2048 KB", "L3": "6144 KB", "memory": "512 GB", "network": "InfiniBand",
            "mpi": "Cray MPICH 7.3.0", "io": "shared I/O nodes between processing nodes (section 5.3)"},
    assumed={"core_speed": "0.35 of this machine's core: AMD Interlagos at 2.3 GHz (Table 3's caches), two "
                           "cores share one FPU module",
             "topology": "a 3-D torus (Blue Waters' Gemini network joins its compute nodes; the paper's "
                         "'InfiniBand' is, on Blue Waters, the I/O network to the Lustre file system)",
             "link_bw": "9.6 GB/s per torus link, 1.5 us per hop: Gemini's published figures, not stated",
             "file system": "one shared file-system server reached over the network: 1 GB/s for this job "
                            "and 1 ms per request (a Lustre share under other jobs' load, not stated; "
                            "section 5.3: the I/O node is shared)"})

MACHINES = {"mustang": MUSTANG, "bluewaters": BLUE_WATERS}


def by_name(name: str, cores: int, topology: str | None = None) -> Machine:
    """`here` (the calibrated machine, `cores` cores) or one of MACHINES; `topology`
    overrides its network's shape."""
    m = here(cores) if name == "here" else MACHINES[name]
    if topology and topology != m.topology:
        m = replace(m, topology=topology)
    return m
