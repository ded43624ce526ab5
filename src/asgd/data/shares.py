"""Who gets which point: each worker a seeded random 1/w of the data, whichever reader
read it, so both readers (and the embedded problem) give identical shares; servers get
none; rank 0 (the evaluator) also holds the held-out set. And the embedded problem's
"reader": every rank generates it (a few ms) and keeps its share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from . import problem
from .formats import Dataset

HOLDOUT = 8         # with no held-out file, 1/HOLDOUT of the data file is held out
EVALUATOR = 0       # the rank that evaluates the model holds the held-out set
HELD_OUT = -1       # assign's owner of a held-out point


@dataclass
class Loaded:
    train: Dataset                 # this rank's training points (servers: none)
    lines: np.ndarray              # the file line (row) of each, 0-based, increasing
    test: Dataset | None           # the held-out set, on rank 0 only
    test_lines: np.ndarray | None  # its lines (in the test file, or the data file if held out of it)
    train_points: int              # all workers' training points together
    times: dict                    # seconds of `read`, `parse`, `shuffle` (parts of init)
    traffic: dict = field(default_factory=lambda: {"sent": 0, "recv": 0})   # bytes of its point-to-point
                                   # messages (the readers' token and row exchange) to and from other ranks
    labels: object = None          # data.labels.Labels: the classes (and their names) of a file's labels
    dialect: dict | None = None    # how the data file was read (data.dialect.Dialect.to_dict), for results.json


def assign(n: int, seed: int, servers: int, workers: int, holdout: bool,
           rows: np.ndarray | None = None, stride: int = 1) -> np.ndarray:
    """Owner rank of points `rows` (default: all n): a seeded random 1/workers to each
    worker rank servers + j * stride, j < workers (sizes differ by at most one; stride K:
    model-parallel replicas of K ranks, the points to each replica's first); with
    holdout, a random 1/8 is HELD_OUT first (rank 0's test set). Point i goes by its place
    p(i) in a seeded random permutation of 0..n-1, computed for just these rows (O(rows),
    not O(n): the parallel reader only knows its own rows)."""
    rows = np.arange(n) if rows is None else rows
    key = np.random.default_rng([seed, HOLDOUT]).integers(0, 2**63, 4, dtype=np.uint64)
    p = _permuted(rows.astype(np.int64), n, key)
    cut = n // HOLDOUT if holdout else 0
    return np.where(p < cut, HELD_OUT, servers + (p - cut) % workers * stride).astype(np.int32)


def worker_points(points: int, workers: int, j: int) -> int:
    """Training points of worker j of `workers`: assign deals a seeded permutation of the
    `points` round-robin, so the first points % workers workers get one more."""
    return points // workers + (1 if j < points % workers else 0)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


@njit(cache=True)
def _mix(x):
    """splitmix64's finalizer: a well-mixed 64-bit hash."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@njit(cache=True)
def _permuted(rows, n, key):
    """p(i) for i in rows: a 4-round Feistel network (a keyed bijection) on the smallest
    even number of bits that holds n, applied again while the result is >= n (cycle
    walking), which keeps it a bijection of 0..n-1. About 15 ns a point."""
    bits = 2
    while (1 << bits) < n:
        bits += 2
    half = np.uint64(bits // 2)
    mask = np.uint64((1 << (bits // 2)) - 1)
    un = np.uint64(n)
    out = np.empty(len(rows), np.int64)
    for i in range(len(rows)):
        x = np.uint64(rows[i])
        while True:
            left, right = x >> half, x & mask
            for r in range(4):
                left, right = right, left ^ (_mix(right ^ key[r]) & mask)
            x = (left << half) | right
            if x < un:
                break
        out[i] = np.int64(x)
    return out


@dataclass(frozen=True)
class Job:
    """What a reader needs to know about the run."""
    servers: int          # ranks 0..servers-1 hold no training points (0: all are workers)
    seed: int = 0
    classes: int | None = None
    replica: int = 1      # --model-parallel K: workers come in replicas of K ranks that train the same points
    delimiter: str = "auto"          # a text file's: data.dialect
    header: bool | None = None       # None: detected
    label_column: str | None = None  # a name or an index; None: the last column

    def owners(self, size: int) -> tuple[int, int]:
        """(workers, stride) for assign: one share per replica, to its first rank."""
        return (size - self.servers) // self.replica, self.replica


def embedded(rank: int, size: int, job: Job = Job(1)) -> Loaded:
    """The default problem has no file: every rank generates it from the seed (a few ms)
    and keeps the share `assign` gives it, as if a reader had read it (no MPI needed)."""
    times = Times()
    times.enter("shuffle")
    train, test = problem.default_problem(job.seed)
    k = job.classes or max(train.classes, test.classes)
    if rank >= job.servers:
        first = rank - (rank - job.servers) % job.replica   # my replica's first rank: its share is mine too
        workers, stride = job.owners(size)
        mine = np.flatnonzero(assign(len(train), job.seed, job.servers, workers, False, stride=stride) == first)
    else:
        mine = np.empty(0, np.int64)  # a server holds no training points
    evaluator = rank == EVALUATOR
    times.enter(None)
    return Loaded(Dataset(train.X[mine], train.y[mine], k), mine,
                  Dataset(test.X, test.y, k) if evaluator else None,
                  np.arange(len(test)) if evaluator else None, len(train), times.seconds)


class Times:
    """Seconds per sub-phase of init; one clock read per switch."""

    def __init__(self):
        self.seconds = {"read": 0.0, "parse": 0.0, "shuffle": 0.0}
        self.phase, self.since = None, time.perf_counter()

    def enter(self, phase):
        now = time.perf_counter()
        if self.phase:
            self.seconds[self.phase] += now - self.since
        self.phase, self.since = phase, now
