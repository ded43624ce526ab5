"""Checkpoints: each server's shard and the training progress, written atomically.

One file per server, RUN_DIR/checkpoint/shard-<s>.npz, holding the shard and a JSON
header (progress, layout, a sha256 of both). It is written to a temporary file, fsynced
and renamed over the previous one, so a crash leaves the last complete checkpoint; a
damaged or mismatched file is refused on --resume with a message that says which.
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


def _digest(w: np.ndarray, meta: dict) -> str:
    h = hashlib.sha256(np.ascontiguousarray(w).tobytes())
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def save(run_dir: str, server: int, w: np.ndarray, meta: dict) -> str:
    """Atomically replace server's checkpoint with (w, meta)."""
    d = folder(run_dir)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"shard-{server}.npz")
    meta = {**meta, "time": time.time()}
    header = json.dumps({"meta": meta, "sha256": _digest(w, meta)})
    atomic_write(path, lambda f: np.savez(f, w=w, header=np.frombuffer(header.encode(), dtype=np.uint8)), binary=True)
    return path


def load(run_dir: str, servers: int, n_w: int) -> tuple[np.ndarray, dict]:
    """The full parameter vector from every server's shard, and server 0's meta
    (progress). Any missing, damaged or mismatched file raises CheckpointError."""
    w = np.empty(n_w)
    metas = []
    for s in range(servers):
        path = os.path.join(folder(run_dir), f"shard-{s}.npz")
        try:
            with np.load(path) as z:
                shard, header = z["w"], json.loads(z["header"].tobytes().decode())
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no checkpoint (was the run started with "
                                  "--checkpoint-every, and with the same --servers?)") from None
        except Exception as e:  # a truncated or overwritten file: zip, JSON or npy errors
            raise CheckpointError(f"{path}: damaged checkpoint ({type(e).__name__}: {e})") from None
        meta = header.get("meta", {})
        if header.get("sha256") != _digest(shard, meta):
            raise CheckpointError(f"{path}: damaged checkpoint (checksum mismatch)")
        if meta.get("n_w") != n_w or meta.get("servers") != servers:
            raise CheckpointError(f"{path}: written for {meta.get('n_w')} parameters and "
                                  f"{meta.get('servers')} server(s), not {n_w} and {servers}: "
                                  "resume with the run's --hidden and --servers")
        lo, hi = meta["shard"]
        if hi - lo != len(shard):
            raise CheckpointError(f"{path}: damaged checkpoint (shard size)")
        w[lo:hi] = shard
        metas.append(meta)
    return w, metas[0]


class Checkpointing:
    """When and what one server (or allreduce's rank 0) saves: its shard of w, the shard's
    place, and `progress()` (epochs, samples and history on rank 0, {} elsewhere)."""

    def __init__(self, run_dir: str, index: int, servers: int, shard: tuple[int, int], n_w: int,
                 w: np.ndarray, every: tuple[str, float] | None, progress):
        self.run_dir, self.index, self.servers, self.shard, self.n_w = run_dir, index, servers, shard, n_w
        self.w, self.every, self.progress = w, every, progress  # w: the shard, a live view
        self.last_rounds, self.last_time = 0, time.monotonic()

    def maybe(self, rounds: int) -> None:
        """After each update: save when --checkpoint-every says it is time."""
        if self.every is None:
            return
        kind, n = self.every
        if (rounds - self.last_rounds >= n) if kind == "updates" else (time.monotonic() - self.last_time >= n):
            self.save(rounds)

    def save(self, rounds: int) -> None:
        save(self.run_dir, self.index, self.w, {"n_w": self.n_w, "servers": self.servers,
                                                "shard": list(self.shard), "rounds": rounds, **self.progress()})
        self.last_rounds, self.last_time = rounds, time.monotonic()
