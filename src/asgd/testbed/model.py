"""The performance model on a testbed: a calibration of this machine (asgd.perf calibrate,
shared memory between ranks) plus the testbed's link rate, burst and latency give the
Params that asgd.perf.architectures.predict needs for a run across the testbed's hosts.

Only the network terms change; everything the cores do (steps, the server's CPU per
update, the cores' worth of P ranks, the CPU cost of messaging under crowding) stays as
calibrated, and nothing is fitted to a testbed run. With B = rate / 8 bytes/s per
direction of every link and L the one-way latency:

  wire(k)          the bytes a message of k weights puts on a link: its payload, a
                   FRAME_HEADERS-byte frame per MSS-byte TCP segment, and the ACKs of the
                   message going the other way on the same link (one per two segments,
                   Linux's delayed ACK): TCP/IP framing, derived, not measured
  link_s[k]        wire(k) / B: a shard of k weights on one link, one direction: what a
      link can carry (predict_train's extension e: each server's link in and out are two
      stations of this demand, crossed by all S shards at once; each worker's own link
      carries all S shards)
  link_burst_s     tbf's bucket / B: a link that has paused passes this much at line speed,
      so a message that fits crosses it in no time until the link runs at its rate, and
      a larger one in (its wire time - link_burst_s)
  round_trip_s[k]  rtt(k) + 2L: the calibrated round trip's CPU and copies, plus latency
  pingpong_s[b]    pingpong(b) + (b's frames - burst) / B + L: one way (r_net, for the
                   paper's equations)

A lone worker's cycle is then its step plus its message's wire time each way (less the
burst), whatever S: its own link carries all of it; S servers saturate at S times one
server's link ceiling. `probe` measures the two-host ping-pong and round trip directly, to
check these.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace

import numpy as np

from ..mpienv import find
from ..perf.analytic import Params
from ..perf.architectures import probe_link_time
from ..core.wire import DOUBLE, PUSH_HEADER, TAG_PROBE
from .links import FRAME_HEADERS, MSS
from .shaping import burst_bytes


def frames_bytes(payload: float) -> float:
    """A message's payload in TCP segments, as Ethernet frames."""
    return payload + FRAME_HEADERS * math.ceil(payload / MSS)


def wire_bytes(k: int, bytes_per_weight: float = 8.0) -> float:
    """Bytes on one direction of a link per message of k weights (bytes_per_weight: 8 for
    float64; less with compression): its frames, and the ACKs of the message of the same
    size going the other way (a push's reply, a reply's next push)."""
    payload = bytes_per_weight * k + DOUBLE * PUSH_HEADER
    return frames_bytes(payload) + FRAME_HEADERS * math.ceil(math.ceil(payload / MSS) / 2)


def testbed_params(base: Params, rate_bit: float, latency_s: float = 0.0, bytes_per_weight: float = 8.0,
                   sizes: list[int] | None = None) -> Params:
    """Params for runs on a testbed of this link rate and latency, any server count.
    sizes: the message sizes (weights) to tabulate, e.g. n_w / S for the runs predicted;
    by default the calibrated ones."""
    B = rate_bit / 8.0
    burst = burst_bytes(rate_bit)
    ks = sorted(set(base.round_trip_s) | set(base.server_update_s) | set(sizes or []))

    def round_trips(p: Params) -> Params:   # every precision's round trip (a Params.at table) crosses the links
        return replace(p, round_trip_s={k: p.per_nw(p.round_trip_s, k) + 2 * latency_s for k in ks})
    pingpong = {b: v + max(frames_bytes(b) - burst, 0.0) / B + latency_s for b, v in base.pingpong_s.items()}
    return replace(base.each_precision(round_trips), pingpong_s=pingpong,
                   link_s={k: wire_bytes(k, bytes_per_weight) / B for k in ks}, link_burst_s=burst / B,
                   link_latency_s=latency_s, link_Bps=B)


def link_ceiling(rate_bit: float, n_w: int, servers: int, bytes_per_weight: float = 8.0) -> float:
    """Updates/s at which S servers' links are full: each carries wire(n_w / S) per update
    each way, at rate_bit / 8 bytes/s."""
    return rate_bit / 8.0 / wire_bytes(-(-n_w // servers), bytes_per_weight)


def worker_ceiling(rate_bit: float, n_w: int, bytes_per_weight: float = 8.0, latency_s: float = 0.0) -> float:
    """Updates/s of one worker whose link is the limit: push then reply, one outstanding,
    each crossing its link after the link paused (the bucket full); never more than the
    link carries (messages that fit the bucket: the link's rate decides)."""
    B = rate_bit / 8.0
    wire = wire_bytes(n_w, bytes_per_weight)
    cycle = 2 * max(wire - burst_bytes(rate_bit), 0.0) / B + 2 * latency_s
    return min(B / wire, 1.0 / cycle) if cycle > 0 else B / wire


def probe(comm, n_w: int, pings: int = 10, updates: int = 20, repeat: int = 3) -> dict | None:
    """On 2 ranks (one per host): the raw MPI ping-pong of one Delta-w (8 n_w bytes, one
    way, least of `pings`) and asgd's own push/pull round trip with no compute (mean over
    `updates`, through asgd.probes.ranks.exchange: the real Server and run_worker), each the
    least of `repeat` tries (a loaded machine delays single tries). Rank 0 returns
    {pingpong_s, round_trip_s, tries}."""
    from ..probes.ranks import exchange, spin_step   # here: importing it initializes MPI (a probe's rank only)
    buf = np.zeros(n_w)
    tries = []
    for _ in range(repeat):
        best = []
        for _ in range(pings):
            comm.Barrier()
            t = time.perf_counter()
            if comm.rank == 0:
                comm.Send(buf, 1, TAG_PROBE)
                comm.Recv(buf, 1, TAG_PROBE)
            else:
                comm.Recv(buf, 0, TAG_PROBE)
                comm.Send(buf, 0, TAG_PROBE)
            best.append((time.perf_counter() - t) / 2)
        t = time.perf_counter()
        exchange(comm, n_w, updates, False, spin_step(0.0))
        rtt = comm.bcast((time.perf_counter() - t) / updates, root=1)
        tries.append({"pingpong_s": min(best), "round_trip_s": rtt})
    if comm.rank:
        return None
    return {"pingpong_s": min(x["pingpong_s"] for x in tries), "round_trip_s": min(x["round_trip_s"] for x in tries),
            "bytes": buf.nbytes, "tries": tries}


# -- the links' efficiency per exchange, measured -------------------------------------------

PROBE_RANKS = {"ps": (4, 7, 11), "p2p": (3, 6, 10), "ring": (3, 6, 10), "mpi": (3, 6, 10)}


def measure_efficiency(tb, base: Params, rate_bit: float, sizes: list[int], kinds=("ps", "p2p", "ring"),
                       ranks: dict | None = None, rounds: int = 6, say=print) -> dict:
    """Each exchange's link efficiency on this testbed: asgd.probes.exchanges' no-compute
    rounds (one server and P - 1 workers; P peers; the ring, MPI_Iallreduce) run across
    its hosts at rank counts of their own (PROBE_RANKS: none a bench's worker count),
    their time less the same round on shared memory (base's exchange_s, the protocol's
    own CPU and waits) over the round's derived wire time (asgd.perf.architectures: the
    busiest link's bytes, framed, less the bucket's burst). Params.link_efficiency:
    [kind][P][n] (1.0: the derived time exactly; 2.0: the links took twice as long).
    Only microbenchmarks: no training run is seen."""
    ranks = ranks or PROBE_RANKS
    most = max(max(r) for r in ranks.values())
    p = testbed_params(base, rate_bit, sizes=[k for n in sizes for k in _probe_sizes(n, most)])
    out: dict = {}
    for kind in kinds:
        for P in ranks[kind]:
            cmd = [find(), "-n", str(P), sys.executable, "-m", "asgd.probes.ranks", "exchange", "--kinds", kind,
                   "--nw", ",".join(map(str, sizes)), "--rounds", str(rounds)]
            res = tb.run(cmd, servers=1 if kind == "ps" else 0, capture=True, timeout=900, say=lambda *a, **k: None)
            lines = [ln for ln in (res.stdout or "").splitlines() if ln.startswith("{")]
            if res.rc or not lines:
                raise RuntimeError(f"the {kind} probe at {P} ranks failed (exit {res.rc}): {(res.stderr or '')[-300:]}")
            got = json.loads(lines[-1])["seconds"][kind]
            for n_s, t in got.items():
                n = int(n_s)
                wire = probe_link_time(p, kind, P, n)
                cpu = base.exchange(kind, P, n)
                eff = max(t - cpu, 0.0) / wire if wire > 0 else 1.0
                out.setdefault(kind, {}).setdefault(P, {})[n] = eff
                say(f"  {kind} P={P} n={n:,}: {1e3 * t:.1f} ms on the links, {1e3 * cpu:.1f} ms on shared memory, "
                    f"{1e3 * wire:.1f} ms derived wire time: efficiency {eff:.2f}")
    return out


def _probe_sizes(n: int, ranks: int) -> list[int]:
    """The message sizes a probe of n weights sends among up to `ranks` ranks (shards, chunks)."""
    return sorted({n, *(-(-n // P) for P in range(1, ranks + 1)), *(-(-(n + 3) // P) for P in range(1, ranks + 1))})
