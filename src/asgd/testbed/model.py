"""The performance model on a testbed: a calibration of this machine (asgd.perf calibrate,
shared memory between ranks) plus the testbed's link rate and latency give the Params
that asgd.perf.analytic.predict needs for a run across the testbed's hosts.

Only the network terms change; everything the cores do (steps, the server's CPU per
update, the cores' worth of P ranks, the CPU cost of messaging under crowding) stays as
calibrated. With B = rate / 8 bytes/s per direction of every link, L the one-way latency,
and wire(k) = f x (8k + header) the bytes a message of k weights puts on a link (f: the
byte proof's wire/app ratio, TCP/IP and Ethernet headers):

  link_s[k]        wire(k) / B: a shard of k weights on one link, one direction.
      predict_train (its extension e) makes each server's link in and out two stations
      of this demand, crossed by all S shards at once, and adds the worker's own link
      (all S shards each way: 2 (S - 1) of them beyond those stations) to the exchange
  round_trip_s[k]  rtt(k) + 2L: the calibrated round trip's CPU and copies, plus latency
  pingpong_s[b]    pingpong(b) + f b / B + L: one way (r_net, for the paper's equations)

A lone worker's cycle is then its step plus 2 x wire(S k) / B + 2L whatever S, what its
own link allows, and S servers saturate at S times one server's link ceiling.
`probe` measures the two-host ping-pong and round trip directly, to check these.
"""

from __future__ import annotations

from dataclasses import replace

from ..perf.analytic import Params

PUSH_HEADER_DOUBLES = 5   # protocol.comm.PUSH_HEADER (Delta-w and its header travel together)


def wire_bytes(k: int, f: float, bytes_per_weight: float = 8.0) -> float:
    """Bytes on a link for a message of k weights (bytes_per_weight: 8 for float64; less
    with compression)."""
    return f * (bytes_per_weight * k + 8 * PUSH_HEADER_DOUBLES)


def testbed_params(base: Params, rate_bit: float, latency_s: float = 0.0, wire_overhead: float = 1.02,
                   bytes_per_weight: float = 8.0, sizes: list[int] | None = None) -> Params:
    """Params for runs on a testbed of this link rate and latency, any server count.
    sizes: the message sizes (weights) to tabulate, e.g. n_w / S for the runs predicted;
    by default the calibrated ones."""
    B = rate_bit / 8.0
    ks = sorted(set(base.round_trip_s) | set(base.server_update_s) | set(sizes or []))

    def t(k):
        return wire_bytes(k, wire_overhead, bytes_per_weight) / B

    round_trip = {k: base.per_nw(base.round_trip_s, k) + 2 * latency_s for k in ks}
    pingpong = {b: v + wire_overhead * b / B + latency_s for b, v in base.pingpong_s.items()}
    return replace(base, round_trip_s=round_trip, pingpong_s=pingpong, link_s={k: t(k) for k in ks})


def link_ceiling(rate_bit: float, n_w: int, servers: int, wire_overhead: float = 1.02,
                 bytes_per_weight: float = 8.0) -> float:
    """Updates/s at which S servers' links are full: each carries wire(n_w / S) per update
    each way, at rate_bit / 8 bytes/s."""
    return rate_bit / 8.0 / wire_bytes(-(-n_w // servers), wire_overhead, bytes_per_weight)


def worker_ceiling(rate_bit: float, n_w: int, wire_overhead: float = 1.02, bytes_per_weight: float = 8.0,
                   latency_s: float = 0.0) -> float:
    """Updates/s of one worker whose link is the limit: push then reply, one outstanding."""
    return 1.0 / (2 * wire_bytes(n_w, wire_overhead, bytes_per_weight) / (rate_bit / 8.0) + 2 * latency_s)


def probe(comm, n_w: int, pings: int = 10, updates: int = 20, repeat: int = 3) -> dict | None:
    """On 2 ranks (one per host): the raw MPI ping-pong of one Delta-w (8 n_w bytes, one
    way, least of `pings`) and asgd's own push/pull round trip with no compute (mean over
    `updates`, through calibrate's exchange: the real Server and run_worker), each the
    least of `repeat` tries (a loaded machine delays single tries). Rank 0 returns
    {pingpong_s, round_trip_s, tries}."""
    import time

    import numpy as np

    from ..perf.calibrate import _exchange, _spin_step
    buf = np.zeros(n_w)
    tries = []
    for _ in range(repeat):
        best = []
        for _ in range(pings):
            comm.Barrier()
            t = time.perf_counter()
            if comm.rank == 0:
                comm.Send(buf, 1, 7)
                comm.Recv(buf, 1, 7)
            else:
                comm.Recv(buf, 0, 7)
                comm.Send(buf, 0, 7)
            best.append((time.perf_counter() - t) / 2)
        t = time.perf_counter()
        _exchange(comm, n_w, updates, False, _spin_step(0.0))
        rtt = comm.bcast((time.perf_counter() - t) / updates, root=1)
        tries.append({"pingpong_s": min(best), "round_trip_s": rtt})
    if comm.rank:
        return None
    return {"pingpong_s": min(x["pingpong_s"] for x in tries), "round_trip_s": min(x["round_trip_s"] for x in tries),
            "bytes": buf.nbytes, "tries": tries}
