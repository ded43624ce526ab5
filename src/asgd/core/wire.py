"""asgd's wire format, written once: the tags, the message headers, how w is cut into
server shards, the byte count of every message, and the id that names a message on both
of its ends. The protocol sends these; the simulator, the performance model and the
testbed's byte proof count them; none spells them again.

Messages (no pickling on the hot path), as a server s that owns w[lo:hi] sees them:
    push  worker -> s, TAG_PUSH: [ Delta-w[lo:hi] | PUSH header ]
    pull  s -> worker, TAG_PULL: [ w[lo:hi]       | PULL header ]
    done  worker -> s, TAG_DONE: [ 0.0 ]  after the worker's last exchange
A message's payload is values of the run's precision (--precision: float32, the default,
4 bytes each, or float64, 8); its header is float64 values after the payload whatever
the precision (HEADER_VALUE bytes each: versions, steps and cuts stay exact to 2^53), 2
float32 slots each in a float32 buffer (a push's `version` is the version of the
shard its Delta-w was computed from, a pull's the version it carries: staleness =
version at apply - push version; `stop` 1.0 carries a stop request, a signal (a reply's 2.0: the run's epochs are
trained, with --backup-workers, whose workers train until told); `cut` is
the number of the last checkpoint cut the worker had heard of from server 0 when it
pushed (a push past cut c is not in cut c), and a reply's the last cut its server
started: asgd.core.shard's consistent checkpoints). With
--compress 1bit a message is bytes: [ float64 header | 2 scales per column, of the run's
precision | bits, each column's from a byte boundary ] (protocol.onebit).

Imports numpy only: every layer may use it.
"""

from __future__ import annotations

import numpy as np

# every point-to-point tag asgd uses, in one place so none is used twice
TAG_PUSH, TAG_PULL, TAG_DONE, TAG_CLOCK, TAG_SHARD = 11, 12, 13, 14, 15
TAG_RECORD = 16     # the end-of-run records, each rank's to rank 0
TAG_RING = 17       # --arch allreduce's ring: a chunk to the next rank
TAG_REPLICA = 18    # --model-parallel: a replica's partial logits and their sum
TAG_SHARE = 19      # --model-parallel: a replica's data share, its first rank's to the others
TAG_TURN = 21       # the sequential reader's token
TAG_PROBE = 31      # asgd.testbed.model.probe's ping-pong

DOUBLE = 8          # bytes of a float64
HEADER_VALUE = DOUBLE   # bytes of a header's value: float64 in every precision
PRECISIONS = ("float32", "float64")   # --precision: the dtype of w, Delta-w and every message's payload

PUSH_FIELDS = ("version", "loss_sum", "samples", "step", "stop", "cut")   # step: the worker's, names it in traces
PULL_FIELDS = ("version", "stop", "cut")
PUSH_HEADER, PULL_HEADER = len(PUSH_FIELDS), len(PULL_FIELDS)
P_VERSION, P_LOSS, P_SAMPLES, P_STEP, P_STOP, P_CUT = range(PUSH_HEADER)   # a push header's fields
R_VERSION, R_STOP, R_CUT = range(PULL_HEADER)                              # a pull (reply) header's fields
STOP_ASKED, STOP_DONE = 1.0, 2.0   # a reply's stop: a stop was asked (a signal); the run is done (epochs, target)
DONE_BYTES = DOUBLE  # a float64 0.0


def itemsize(precision: str) -> int:
    """Bytes of one value of w in `precision` (PRECISIONS): 4 or 8."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return np.dtype(precision).itemsize


def header_slots(fields: int, itemsize: int = DOUBLE) -> int:
    """Values of the payload's dtype a header of `fields` float64 values takes in a
    message buffer of that dtype (float32: two per field)."""
    return fields * HEADER_VALUE // itemsize


def shard_bounds(n_w: int, servers: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) per server, sizes within one element of each other."""
    edges = [n_w * s // servers for s in range(servers + 1)]
    return list(zip(edges[:-1], edges[1:]))


def slice_shards(slices: list[tuple[int, int]], servers: int) -> list[tuple[int, int]]:
    """The shards of a vector cut into model-parallel slices (each a contiguous [a, b)),
    so that a worker holding one slice talks only to its slice's servers: with at least
    as many servers as slices, each slice split among servers of its own as evenly as
    possible (one shard a server); with fewer, one shard a slice, which slice_hosts
    gives to the servers a few slices each. No shard crosses a slice's bound. One
    slice: shard_bounds."""
    K = len(slices)
    n = max(servers, K)
    out = []
    for k, (a, b) in enumerate(slices):
        mine = n // K + (1 if k < n % K else 0)
        out += [(a + lo, a + hi) for lo, hi in shard_bounds(b - a, mine)]
    return out


def slice_hosts(shards: int, servers: int) -> list[int]:
    """The server (0..servers-1) each of slice_shards' shards lives on: its own, or with
    fewer servers than shards, consecutive shards grouped as evenly as possible."""
    return [v * servers // shards for v in range(shards)]


def column_bits_bytes(cols: np.ndarray) -> int:
    """Bytes of a 1-bit message's bits: each column's (cols rows: start, count, stride;
    net.mlp.Layout.columns) from a byte boundary."""
    return int(((np.asarray(cols, np.int64).reshape(-1, 3)[:, 1] + 7) // 8).sum())


def onebit_bytes(cols: np.ndarray, header: int, itemsize: int = DOUBLE) -> int:
    """A 1-bit message: a float64 header, two scales per column (`itemsize` bytes each:
    the run's precision), the columns' bits."""
    return HEADER_VALUE * header + itemsize * 2 * len(cols) + column_bits_bytes(cols)


def dense_bytes(k: int, header: int, itemsize: int = DOUBLE) -> int:
    """An uncompressed message: k values of `itemsize` bytes and a float64 header."""
    return itemsize * k + HEADER_VALUE * header


def push_bytes(k: int, cols: np.ndarray | None = None, itemsize: int = DOUBLE) -> int:
    """A push of a k-value shard, values of `itemsize` bytes (4: float32, 8: float64), or
    (cols given) 1-bit over those columns."""
    return dense_bytes(k, PUSH_HEADER, itemsize) if cols is None else onebit_bytes(cols, PUSH_HEADER, itemsize)


def pull_bytes(k: int, cols: np.ndarray | None = None, itemsize: int = DOUBLE) -> int:
    """A reply carrying a k-value shard (as push_bytes)."""
    return dense_bytes(k, PULL_HEADER, itemsize) if cols is None else onebit_bytes(cols, PULL_HEADER, itemsize)


def ring_bytes(n: int, ranks: int, rank: int, itemsize: int = DOUBLE) -> tuple[int, int]:
    """(sent, received) bytes of `rank` in one ring allreduce of n values of `itemsize`
    bytes (the sum's trailing m, loss and stop are values of the vector's dtype) over the
    chunks shard_bounds(n, ranks) (protocol.allreduce.Ring): the reduce-scatter passes on
    every chunk but (rank+1)'s and takes every chunk but its own, the allgather passes on
    every chunk but (rank+2)'s and takes every chunk but (rank+1)'s."""
    if ranks < 2:
        return 0, 0
    size = [hi - lo for lo, hi in shard_bounds(n, ranks)]
    r = rank
    return (itemsize * (2 * n - size[(r + 1) % ranks] - size[(r + 2) % ranks]),
            itemsize * (2 * n - size[r] - size[(r + 1) % ranks]))


SEND, RECV = 0, 1   # the two ends of a message, in traces


def stop_share(asked: bool, done: bool, ranks: int) -> float:
    """One rank's part of a stop summed over `ranks` ranks (allreduce's sum, a replica's
    logits): 1 if it was asked to stop (a signal), 1 / (ranks + 1) if its run is done (a
    target reached), else 0; so the sum's whole part counts the ranks asked, and a sum in
    (0, 1) says done (summed_stop)."""
    return 1.0 if asked else 1.0 / (ranks + 1) if done else 0.0


def summed_stop(total: float) -> tuple[bool, bool]:
    """(stop, asked) from a sum of stop_share()s: whether to stop, and whether it was asked
    (a signal: the run ends early) rather than the run being done."""
    return total > 0, total >= 1


def flow_id(worker_rank: int, server_rank: int, step: int, reply: bool) -> int:
    """One id per message, the same on both ends: a worker's push of `step` to a server,
    or that server's reply to it. Exact in JSON (below 2^53) up to 2,047 worker ranks,
    1,023 server ranks and 2^31 steps."""
    return (worker_rank << 42) | (server_rank << 32) | (2 * step + int(reply))


def flow_step(flow: int) -> int:
    """The step a flow id names."""
    return (flow & 0xFFFFFFFF) >> 1


def flow_is_reply(flow: int) -> bool:
    return bool(flow & 1)
