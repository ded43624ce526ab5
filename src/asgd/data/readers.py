"""How each rank gets its share of the data: `sequential` (the paper's finding) or
`parallel` (the fix).

Both end in the same place: each worker holds the points that `assign` gives it (a
seeded random 1/w of the file, so both readers give identical shares), the servers
(ranks 0..S-1) hold none, rank 0 also holds the held-out set (it evaluates the model),
and every point keeps its 0-based line (row) of the file, so tests can prove that the
shares cover the file exactly once.

sequential  CNTK's UCIFastReader: ranks take turns (a token passed rank to rank with
            Isend/Irecv); each reads and parses the whole file and keeps its own points.
            Init grows as (ranks) x T_disk(d), the paper's eq. 12.
parallel    every rank reads 1/P of the file's bytes (rows of a .npy) at once with one
            collective MPI-IO read, parses them, and one all-to-all sends every point to
            its owner. The held-out file is read the same way and sent to rank 0.
            Rank 0 reads its part too (it holds bytes) though a server keeps no points.

A failure must end the job on every rank, never hang it: each step that can fail on
some ranks only (opening, parsing, packing) is local, and is followed by an agreement
(`mpiutil.agree`: every rank learns every rank's result or error) before the next collective.
A failure outside such a step is not agreed on: it ends the whole job (train.py).
All waits poll (no MPI_Wait, which busy-polls in MPICH): through mpiutil.Waiter, or for the
bulk transfer, yielding the core between polls (_bulk_wait).

`mpiexec -n N python -m asgd.data check FILE...` runs both readers on files and checks
that the workers' shares are each file exactly once.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from ..mpiutil import StallError, Waiter, agree, describe
from ..core.wire import TAG_TURN
from . import READERS, formats, parse
from . import labels as lab
from .formats import DataError, Dataset
from .shares import EVALUATOR, HELD_OUT, HOLDOUT, Job, Loaded, Times, assign

MARGIN = 1 << 16    # bytes read past a range's end to finish its last line (more if needed)


def load(comm: MPI.Comm, waiter: Waiter, path: str, test: str | None = None,
         reader: str = "parallel", job: Job = Job(1)) -> Loaded:
    """Collective. Raises the same DataError on every rank if the data is bad."""
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
    if not 0 <= job.servers < comm.size:
        raise ValueError(f"need at least one worker: {job.servers} servers of {comm.size} ranks")
    test_file = test or formats.test_path(path)
    has_test = test is not None or os.path.exists(test_file)  # every rank sees the same files
    run = _sequential if reader == "sequential" else _parallel
    return run(comm, waiter, path, test_file if has_test else None, job, Times())


# -- sequential: one rank after another, each reads everything ---------------------

def _sequential(comm, waiter, path, test_file, job, times) -> Loaded:
    rank, size = comm.rank, comm.size
    token = np.zeros(1, np.int64)  # 1: an earlier rank failed; skip the file
    traffic = {"sent": 0, "recv": 0}
    times.enter("read")  # waiting for my turn counts as reading: the disk is busy
    if rank > 0:
        waiter.all([comm.Irecv([token, MPI.INT64_T], rank - 1, TAG_TURN)],
                   f"rank {rank - 1} to finish reading {path}")
        traffic["recv"] += token.nbytes
    err, got = None, None
    if not token[0]:
        try:
            got = _whole_share(comm, path, test_file is None, job, times)
        except Exception as e:
            err, token[0] = describe(e, f"rank {rank}"), 1
    if rank < size - 1:
        waiter.all([comm.Isend([token, MPI.INT64_T], rank + 1, TAG_TURN)], f"rank {rank + 1} to take its turn")
        traffic["sent"] += token.nbytes
    if rank == EVALUATOR and test_file and err is None:  # after passing the token: overlaps rank 1's turn
        try:
            f = _whole_file(test_file, job, times)
            got["held"] = (f["X"], f["codes"], np.arange(len(f["X"])))
            got["meta"]["test"] = (f["labels"], f["X"].shape[1])
        except Exception as e:
            err = describe(e, f"rank {rank}")
    times.enter("read")  # the others' turns
    meta = got["meta"] if got else None  # None: skipped, an earlier rank failed (its error comes first)
    metas = agree(comm, waiter, lambda: _raise(err) or meta, f"the other ranks to read {path}", DataError)
    times.enter("shuffle")
    out = _finish(rank, path, test_file, metas[EVALUATOR], job, got["mine"], got.get("held"), times)
    out.traffic = traffic
    times.enter(None)
    return out


def _whole_file(path, job, times) -> dict:
    """A whole file, timed as read + parse: X, its label Codes, its FileLabels, its Dialect."""
    times.enter("read")
    if formats.is_npz(path):
        X, y, tokens = formats.read_npz(path, job.classes, job.label_column)
        times.enter("parse")
        d = formats.npz_dialect(path, X.shape[1])
        return {"X": X, "codes": parse.Codes(y if tokens is None else tokens),
                "labels": formats.npz_labels(path, y, tokens, job.classes), "dialect": d}
    if formats.is_binary(path):
        A = parse.read_rows(path)
        times.enter("parse")
        d = parse.binary_dialect(path, A.shape[1], job.label_column)
        _, _, fl = parse.resolve(path, d, [parse.check_array(A, d, job.classes)])
        X, y = parse.split_rows(A, d)
        return {"X": X, "codes": parse.Codes(y), "labels": fl, "dialect": d}
    d = formats.dialect_of(path, job.delimiter, job.header, job.label_column)
    buf = parse.read_bytes(path)
    times.enter("parse")
    X, codes, _, fl = parse.parse_bytes(path, buf, d, job.classes)
    return {"X": X, "codes": codes, "labels": fl, "dialect": d}


def _whole_share(comm, path, holdout, job, times) -> dict:
    """Read the whole file, keep my points (and on rank 0 the held-out ones)."""
    f = _whole_file(path, job, times)
    X, codes = f["X"], f["codes"]
    times.enter("shuffle")
    n = len(X)
    _check_holdout(path, n, holdout)
    workers, stride = job.owners(comm.size)
    owner = assign(n, job.seed, job.servers, workers, holdout, stride=stride)  # every line: CNTK's way
    got = {"meta": {"n": n, "features": X.shape[1], "labels": f["labels"], "dialect": f["dialect"]}}
    for key, who in (("mine", comm.rank), ("held", HELD_OUT if comm.rank == EVALUATOR else None)):
        if who is not None:
            lines = np.flatnonzero(owner == who)
            got[key] = (X[lines], codes.take(lines), lines)
    return got


# -- parallel: every rank reads its part at once, then one all-to-all ---------------

def _parallel(comm, waiter, path, test_file, job, times) -> Loaded:
    train = _read_part(comm, waiter, path, job, times)
    test = _read_part(comm, waiter, test_file, job, times) if test_file else None
    times.enter("shuffle")
    n = train["n"]
    meta = {"n": n, "features": train["X"].shape[1], "labels": train["labels"], "dialect": train["dialect"]}
    if test:
        meta["test"] = (test["labels"], test["X"].shape[1])
    _check_holdout(path, n, test is None)  # every rank alike
    labels = _labels(path, test_file, meta, job)   # every rank alike: the classes of every rank's labels
    for part in (train, test) if test else (train,):
        part["y"] = part.pop("codes").classes(labels)
    workers, stride = job.owners(comm.size)
    owner = assign(n, job.seed, job.servers, workers, test is None, train["lines"], stride)
    kept = owner != HELD_OUT
    held = test or _take(train, ~kept)
    traffic = {"sent": 0, "recv": 0}
    unpack = [_redistribute(comm, waiter, _take(train, kept), owner[kept], traffic),
              _redistribute(comm, waiter, held, np.full(len(held["y"]), EVALUATOR, np.int32), traffic)]
    (X, y, lines), (hX, hy, hlines) = [u() for u in unpack]  # only after the last collective: local work from here
    out = _finish(comm.rank, path, test_file, meta, job, (X, y, lines), (hX, hy, hlines), times, labels)
    out.traffic = traffic
    times.enter(None)
    return out


def _take(part, mask):
    return {"X": part["X"][mask], "y": part["y"][mask], "lines": part["lines"][mask]}


def _read_part(comm, waiter, path, job, times) -> dict:
    """This rank's rows of `path` (their 0-based data rows attached), their label codes,
    and the whole file's verdict."""
    rank, P = comm.rank, comm.size
    binary, npz = formats.is_binary(path), formats.is_npz(path)
    classes = job.classes
    times.enter("read")
    part = {}  # what this rank reads: stays here (the agreement carries only errors)

    def probe():  # local: is the file there, how is it laid out, which part is mine, room for it
        if npz:   # no offsets to read at: every rank loads it, and keeps its rows
            X, y, tokens = formats.read_npz(path, classes, job.label_column)
            r0, r1 = rank * len(X) // P, (rank + 1) * len(X) // P
            labels = y if tokens is None else tokens
            part.update(first=r0, X=X[r0:r1], labels=labels[r0:r1], d=formats.npz_dialect(path, X.shape[1]),
                        rows=len(X))
            return
        if binary:
            offset, rows, cols = formats.npy_header(path)
            r0, r1 = rank * rows // P, (rank + 1) * rows // P
            part.update(at=offset + r0 * cols * 8, first=r0, buf=np.empty((r1 - r0, cols)),
                        d=parse.binary_dialect(path, cols, job.label_column))
            return
        size = formats.file_size(path)
        d = formats.dialect_of(path, job.delimiter, job.header, job.label_column)
        s, e = d.start + rank * (size - d.start) // P, d.start + (rank + 1) * (size - d.start) // P
        # buf[0]: the byte before s ('\n' at the data's start); then [s, e); then a tail
        # past e to finish my last line; then a sentinel for the parser
        buf = np.empty(1 + (e - s) + (min(MARGIN, size - e) if e > s else 0) + 1, np.uint8)
        buf[0] = buf[-1] = 10
        part.update(at=s, s=s, e=e, size=size, buf=buf, d=d)

    agree(comm, waiter, probe, f"the other ranks to open {path}", DataError)
    d, err = part["d"], None
    if not npz:
        buf = part["buf"]
        fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)  # collective; the probe said it opens
        try:
            # the ranges are disjoint and contiguous, so MPI-IO reads them independently
            # (overlapping ranges would make ROMIO shuffle the data through aggregators)
            spec = [buf, MPI.DOUBLE] if binary else [buf[1:1 + part["e"] - part["s"]], MPI.BYTE]
            waiter.all([fh.Iread_at_all(part["at"], spec)], f"the collective read of {path}")
            if not binary:
                try:
                    buf, lo, hi = _own_lines(fh, buf, part)
                except Exception as e:  # local; reported at the next agreement
                    err = describe(e, f"rank {rank}")
        finally:
            fh.Close()

    times.enter("parse")

    def parse_mine():
        _raise(err)
        if npz:
            fl = formats.npz_labels(path, part["labels"], None if part["labels"].dtype.kind == "i" else part["labels"],
                                    classes)
            fl.tokens = {t: r - 1 for t, r in fl.tokens.items()}   # rows of my part, from 0
            fl.out_of_range -= 1 if fl.out_of_range > 0 else 0
            part["codes"] = parse.Codes(part["labels"])
            return parse.Summary(len(part["X"]), len(part["X"]), -1, fl)
        if binary:
            return parse.check_array(buf, d, classes)
        if d.columns == 0:   # empty, or blank lines only: the same dialect, the same message, on every rank
            raise DataError(f"{path}: empty data file")
        X, codes, summary = parse.parse_chunk(buf, lo, hi, d, classes)
        part["X"], part["codes"] = X, codes
        return summary

    chunks = agree(comm, waiter, parse_mine, f"the other ranks to parse {path}", DataError)
    offsets, n, labels = parse.resolve(path, d, chunks)  # raises on every rank alike
    if binary:
        X, y = parse.split_rows(buf, d)
        codes, first = parse.Codes(y), part["first"]
    elif npz:
        X, codes, first = part["X"], part["codes"], part["first"]
    else:
        X, codes, first = part["X"], part["codes"], offsets[rank]
        X = X.reshape(len(codes.y), d.features)  # a chunk with no line has no fields: (0, 0)
    return {"X": X, "codes": codes, "lines": np.arange(first, first + len(X)), "n": n, "labels": labels,
            "dialect": d}


def _own_lines(fh, buf, part):
    """Cut my byte range [s, e) at line boundaries: I own the lines that start in it.
    buf[i] holds file byte s-1+i. My first line starts after the first newline at or
    after byte s-1, my last ends at the first newline at or after byte e-1: independent
    reads fetch byte s-1 and the tail past e (more if the tail holds no newline)."""
    s, e, size = part["s"], part["e"], part["size"]
    if e == s:
        return buf, 0, 0
    if s > part["d"].start:   # else the byte before s is a header's '\n', or there is none: buf[0] stands in
        fh.Read_at(s - 1, [buf[:1], MPI.BYTE])
    held = len(buf) - 1  # bytes held (the last is the sentinel)
    if held > 1 + e - s:
        fh.Read_at(e, [buf[1 + e - s:held], MPI.BYTE])
    nl = parse.find_byte(buf, 0, e - s, 10)
    if nl < 0:  # a line longer than my whole range: no line starts in it
        return buf, 0, 0
    lo, search = nl + 1, e - s
    while True:
        nl = parse.find_byte(buf, search, held, 10)
        if nl >= 0:
            return buf, lo, nl + 1
        if s - 1 + held >= size:
            return buf, lo, held  # the file's last line has no '\n'
        more = min(max(held, MARGIN), size - (s - 1 + held))
        grown = np.empty(held + more + 1, np.uint8)
        grown[:held] = buf[:held]
        grown[-1] = 10
        fh.Read_at(s - 1 + held, [grown[held:held + more], MPI.BYTE])
        buf, search, held = grown, held, held + more


def _redistribute(comm, waiter, part, dest, traffic):
    """Send each of my rows to rank dest[i] (one Ialltoallv of [features, label, line]
    rows; an all-to-all sends each block straight to its rank, so the bytes to and from
    the other ranks, added to `traffic`, are what crosses the network). Returns a
    function that unpacks what arrived: rows in line order, since every rank sends its
    rows in order and rank k's lines precede rank k+1's."""
    X, y, lines = part["X"], part["y"], part["lines"]
    f, P = X.shape[1], comm.size

    def pack():
        order = np.argsort(dest, kind="stable")
        rows = np.empty((len(dest), f + 2))
        rows[:, :f], rows[:, f], rows[:, f + 1] = X[order], y[order], lines[order]
        part["send"] = rows
        return np.bincount(dest, minlength=P).astype(np.int32)

    counts = np.array(agree(comm, waiter, pack, "the other ranks to pack their rows", DataError))  # [from, to]
    send, send_n = part.pop("send"), np.ascontiguousarray(counts[comm.rank])
    recv_n = np.ascontiguousarray(counts[:, comm.rank])
    recv = np.empty((int(recv_n.sum()), f + 2))
    me, row_bytes = comm.rank, 8 * (f + 2)
    traffic["sent"] += row_bytes * int(send_n.sum() - send_n[me])
    traffic["recv"] += row_bytes * int(recv_n.sum() - recv_n[me])
    row = MPI.DOUBLE.Create_contiguous(f + 2).Commit()  # counts in rows, not doubles
    try:
        _bulk_wait(waiter, comm.Ialltoallv([send, (send_n, _starts(send_n)), row],
                                           [recv, (recv_n, _starts(recv_n)), row]), "the other ranks' rows")
    finally:
        row.Free()
    return lambda: (np.ascontiguousarray(recv[:, :f]), recv[:, f].astype(np.int64),
                    recv[:, f + 1].astype(np.int64))  # X, y, lines


def _bulk_wait(waiter, request, waiting_for):
    """Complete a bulk transfer that every rank is in: poll, yielding the core between
    polls. MPICH moves a large message in pieces, a piece per poll, so the Waiter's
    sleeps (up to 1 ms when oversubscribed) stretched it: 32 MB among 3 ranks took 0.8 s,
    yielding 0.01 s (about as fast as a blocking Alltoallv, which spins). A rank with
    work still gets the core: sched_yield hands it over. The job's deadline still holds."""
    while not request.Test():
        if waiter.deadline and time.monotonic() > waiter.deadline:
            raise StallError(f"{waiter.what} timed out waiting for {waiting_for}")
        os.sched_yield()


def _starts(counts):
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)


# -- shared by both --------------------------------------------------------------------

def _check_holdout(path, n, holdout):
    if holdout and n // HOLDOUT == 0:
        raise DataError(f"{path}: {n} points are too few to hold out a test set")


def _labels(path, test_file, meta, job) -> lab.Labels:
    """The classes from the files' labels (every rank alike: it has the same meta)."""
    test = meta.get("test")
    if test and test[1] != meta["features"]:
        raise DataError(f"{test_file}: {test[1]} features, but {path} has {meta['features']}")
    return lab.decide(path, meta["dialect"], meta["labels"], meta["n"], job.classes,
                      test[0] if test else None, test_file)


def _finish(rank, path, test_file, meta, job, mine, held, times, labels=None) -> Loaded:
    """The same checks on every rank (all know rank 0's metadata), then the Loaded.
    mine: (X, labels, lines) that `assign` gave this rank, the labels as parse.Codes or
    already classes; held: rank 0's held-out set."""
    labels = labels or _labels(path, test_file, meta, job)
    k = labels.classes
    n = meta["n"]
    train_points = n - (n // HOLDOUT if test_file is None else 0)
    X, codes, lines = mine

    def classes(c):
        return c.classes(labels) if isinstance(c, parse.Codes) else c
    test = Dataset(held[0], classes(held[1]), k, labels.names) if rank == EVALUATOR else None
    out = Loaded(Dataset(X, classes(codes), k, labels.names), lines, test,
                 held[2] if rank == EVALUATOR else None, train_points, times.seconds)
    out.labels, out.dialect = labels, meta["dialect"].to_dict()
    return out


def _raise(err):
    if err:
        raise DataError(err)
