"""Checkpoints: each server's shard and the training progress, written atomically, every
server's at the same consistent cut.

One file per server and cut, RUN_DIR/checkpoint/shard-<s>.npz (the latest) and
shard-<s>.prev.npz (the one before), each holding the shard, the optimizer's state for
it (opt_* arrays) and a JSON header (the cut's number, progress, layout, the optimizer,
the precision, a sha256 of it all). A file is written to a temporary file, fsynced and renamed over the
previous one, so a crash leaves complete files only.

A cut (asgd.core.shard: the servers agree on it through the workers' pushes) is the
same set of pushes applied on every shard, so every server's file of cut c describes
one model. Servers write cut c at different moments, but a server completes cut c + 1
only after every other has completed c (a worker's push past c + 1 follows the replies
to its push past c, which no server sends before completing c); so keeping two files a
server is enough, and --resume takes the newest cut every server has. A missing,
damaged or mismatched file is refused with a message that says which.

A checkpoint in the other precision (--precision) is converted, not refused: its w and
optimizer state are cast to the resumed run's dtype (float32 to float64 exactly; float64
to float32 rounded to nearest, as a float32 run's init rounds its float64 draw), and the
run says so in one line (converted()). A checkpoint written before --precision is float64.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

from .. import BadInput
from .files import atomic_write


class CheckpointError(BadInput):
    """A checkpoint that cannot be resumed from; the message says why."""


def folder(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoint")


def path_of(run_dir: str, server: int, previous: bool = False) -> str:
    return os.path.join(folder(run_dir), f"shard-{server}{'.prev' if previous else ''}.npz")


def _digest(arrays: dict[str, np.ndarray], meta: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def save(run_dir: str, server: int, arrays: dict[str, np.ndarray], meta: dict) -> str:
    """Make server's latest checkpoint (`arrays`: its shard of w as "w" and the
    optimizer's state; `meta` with its "cut") the one before, and write this one."""
    os.makedirs(folder(run_dir), exist_ok=True)
    path = path_of(run_dir, server)
    if os.path.exists(path):
        os.replace(path, path_of(run_dir, server, previous=True))
    meta = {**meta, "time": time.time()}
    header = json.dumps({"meta": meta, "sha256": _digest(arrays, meta)})
    atomic_write(path, lambda f: np.savez(f, header=np.frombuffer(header.encode(), dtype=np.uint8), **arrays),
                 binary=True)
    return path


def _read(path: str, n_w: int, optimizer: str, model_parallel: int) -> tuple[dict, dict]:
    """(meta, arrays) of one checkpoint file, checked; raises CheckpointError."""
    meta, arrays = read_file(path)
    if meta.get("n_w") != n_w:
        raise CheckpointError(f"{path}: written for {meta.get('n_w')} parameters, not {n_w}: resume with the "
                              "run's --hidden (and its data's features and classes)")
    if meta.get("model_parallel", 1) != model_parallel:
        raise CheckpointError(f"{path}: written with --model-parallel {meta.get('model_parallel', 1)}, not "
                              f"{model_parallel}: resume with the run's --model-parallel")
    if meta.get("optimizer", "sgd") != optimizer:
        raise CheckpointError(f"{path}: written by optimizer {meta.get('optimizer', 'sgd')}, not {optimizer}: "
                              "resume with the run's --optimizer")
    lo, hi = meta["shard"]
    if hi - lo != len(arrays["w"]):
        raise CheckpointError(f"{path}: damaged checkpoint (shard size)")
    return meta, arrays


def read_file(path: str) -> tuple[dict, dict]:
    """(meta, arrays) of one checkpoint file whose checksum holds; raises CheckpointError."""
    try:
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files if k != "header"}
            header = json.loads(z["header"].tobytes().decode())
    except Exception as e:  # a truncated or overwritten file: zip, JSON or npy errors
        raise CheckpointError(f"{path}: damaged checkpoint ({type(e).__name__}: {e})") from None
    meta = header.get("meta", {})
    if header.get("sha256") != _digest(arrays, meta) or "w" not in arrays:
        raise CheckpointError(f"{path}: damaged checkpoint (checksum mismatch)")
    return meta, arrays


def _cuts(run_dir: str, read) -> tuple[list[dict], int]:
    """Per file index, {cut: read(path)} over its latest and previous file, and the newest
    cut every index holds. The file count is the writer's (its shard-0 meta's `servers`)."""
    first = path_of(run_dir, 0)
    if not os.path.exists(first) and not os.path.exists(path_of(run_dir, 0, previous=True)):
        raise CheckpointError(f"{first}: no checkpoint (was the run started with --checkpoint-every?)")
    found = []
    count = None
    s = 0
    while count is None or s < count:
        here = {}
        for previous in (False, True):
            path = path_of(run_dir, s, previous)
            if os.path.exists(path):
                got = read(path)
                here[got[0].get("cut", 0)] = got
                count = count or got[0].get("servers", 1)
        if not here:
            raise CheckpointError(f"{path_of(run_dir, s)}: missing: the run's checkpoint has {count} shard files")
        found.append(here)
        s += 1
    common = set.intersection(*(set(c) for c in found))
    if not common:
        raise CheckpointError(f"{folder(run_dir)}: the servers' checkpoints share no cut "
                              f"({', '.join(f'shard {s}: {sorted(c)}' for s, c in enumerate(found))}): "
                              "not one consistent model")
    return found, max(common)


def newest(run_dir: str) -> dict | None:
    """Shard 0's meta at the newest cut every shard holds (its progress and time), or
    None if the run has no checkpoint to resume from (the restart supervisor asks)."""
    try:
        found, cut = _cuts(run_dir, read_file)
    except CheckpointError:
        return None
    return found[0][cut][0]


def versions(run_dir: str) -> tuple[int, list[int]]:
    """(the newest cut every shard holds, each shard's versions in it): a consistency check
    (with every push applied on every shard, they are all equal). Raises CheckpointError."""
    found, cut = _cuts(run_dir, read_file)
    return cut, [here[cut][0]["rounds"] for here in found]


def load(run_dir: str, n_w: int, optimizer: str = "sgd", model_parallel: int = 1,
         precision: str = "float64") -> tuple[np.ndarray, dict, dict]:
    """The full parameter vector at the newest cut every shard's files hold, shard 0's
    meta of that cut (progress, and the `precision` it was written in), and the
    optimizer's state as full-length arrays (its counters as they were on shard 0), so
    that any shards, as many servers as the resumed run has, take their parts; w and the
    state in `precision`, converted if written in the other (see converted). Any missing,
    damaged or mismatched file, or no cut common to all, raises CheckpointError."""
    found, cut = _cuts(run_dir, lambda path: _read(path, n_w, optimizer, model_parallel))
    w = np.empty(n_w, precision)
    state: dict[str, np.ndarray] = {}
    for here in found:
        meta, arrays = here[cut]
        lo, hi = meta["shard"]
        w[lo:hi] = arrays["w"]
        for k, v in arrays.items():
            if k == "w":
                continue
            if v.ndim:   # a per-parameter state: its part of the whole
                state.setdefault(k, np.empty(n_w, precision))[lo:hi] = v
            else:        # a counter (Adam's t): the first shard's
                state.setdefault(k, v)
    return w, {"precision": WRITTEN_BEFORE_PRECISION, **found[0][cut][0]}, state


WRITTEN_BEFORE_PRECISION = "float64"   # a checkpoint's precision when its meta names none


def converted(run_dir: str, meta: dict, precision: str) -> str | None:
    """The one line saying a checkpoint (shard 0's `meta`, from load) in the other
    precision was converted to `precision`, or None if it was written in it."""
    was = meta.get("precision", WRITTEN_BEFORE_PRECISION)
    if was == precision:
        return None
    how = "exactly" if np.dtype(precision).itemsize > np.dtype(was).itemsize else "rounded to nearest"
    return (f"{run_dir}: its checkpoint is {was}, this run --precision {precision}: w and the optimizer's "
            f"state converted to {precision} ({how})")


class Checkpointing:
    """When and what one server (or allreduce's rank 0) saves: its shard of w, the shard's
    place, `state()` (its optimizer's arrays) and `progress()` (epochs, samples and
    history on rank 0, {} elsewhere)."""

    def __init__(self, run_dir: str, index: int, servers: int, shard: tuple[int, int], n_w: int,
                 w: np.ndarray, every: tuple[str, float] | None, progress, state=dict, optimizer: str = "sgd",
                 model_parallel: int = 1):
        self.run_dir, self.index, self.servers, self.shard, self.n_w = run_dir, index, servers, shard, n_w
        self.w, self.every, self.progress, self.state = w, every, progress, state  # w: the shard, a live view
        self.optimizer, self.model_parallel = optimizer, model_parallel
        self.last_rounds, self.last_time = 0, time.monotonic()

    def due(self, rounds: int) -> bool:
        """--checkpoint-every says it is time for the next cut (the leader asks)."""
        if self.every is None:
            return False
        kind, n = self.every
        return (rounds - self.last_rounds >= n) if kind == "updates" else (time.monotonic() - self.last_time >= n)

    def save(self, rounds: int, cut: int) -> None:
        """Write this shard as it is now, as cut `cut`. A time interval runs from one cut's
        start to the next's, so the training a crash loses stays within it."""
        started = time.monotonic()
        save(self.run_dir, self.index, {"w": self.w, **self.state()},
             {"n_w": self.n_w, "servers": self.servers, "shard": list(self.shard), "rounds": rounds, "cut": cut,
              "optimizer": self.optimizer, "model_parallel": self.model_parallel, "precision": self.w.dtype.name,
              **self.progress()})
        self.last_rounds, self.last_time = rounds, started
