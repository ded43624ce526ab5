"""Checkpoints: each server's shard and the training progress, written atomically.

One file per server, RUN_DIR/checkpoint/shard-<s>.npz, holding the shard, the
optimizer's state for it (opt_* arrays) and a JSON header (progress, layout, the
optimizer, a sha256 of it all). It is written to a temporary file, fsynced
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


def _digest(arrays: dict[str, np.ndarray], meta: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    h.update(json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def save(run_dir: str, server: int, arrays: dict[str, np.ndarray], meta: dict) -> str:
    """Atomically replace server's checkpoint with `arrays` (its shard of w as "w", and
    the optimizer's state) and `meta`."""
    d = folder(run_dir)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"shard-{server}.npz")
    meta = {**meta, "time": time.time()}
    header = json.dumps({"meta": meta, "sha256": _digest(arrays, meta)})
    atomic_write(path, lambda f: np.savez(f, header=np.frombuffer(header.encode(), dtype=np.uint8), **arrays),
                 binary=True)
    return path


def load(run_dir: str, servers: int, n_w: int, optimizer: str = "sgd") -> tuple[np.ndarray, dict, list[dict]]:
    """The full parameter vector from every server's shard, server 0's meta (progress),
    and each shard's optimizer state (its arrays, by name). Any missing, damaged or
    mismatched file raises CheckpointError."""
    w = np.empty(n_w)
    metas, states = [], []
    for s in range(servers):
        path = os.path.join(folder(run_dir), f"shard-{s}.npz")
        try:
            with np.load(path) as z:
                arrays = {k: z[k] for k in z.files if k != "header"}
                header = json.loads(z["header"].tobytes().decode())
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no checkpoint (was the run started with "
                                  "--checkpoint-every, and with the same --servers?)") from None
        except Exception as e:  # a truncated or overwritten file: zip, JSON or npy errors
            raise CheckpointError(f"{path}: damaged checkpoint ({type(e).__name__}: {e})") from None
        meta = header.get("meta", {})
        if header.get("sha256") != _digest(arrays, meta) or "w" not in arrays:
            raise CheckpointError(f"{path}: damaged checkpoint (checksum mismatch)")
        if meta.get("n_w") != n_w or meta.get("servers") != servers:
            raise CheckpointError(f"{path}: written for {meta.get('n_w')} parameters and "
                                  f"{meta.get('servers')} server(s), not {n_w} and {servers}: "
                                  "resume with the run's --hidden and --servers")
        if meta.get("optimizer", "sgd") != optimizer:
            raise CheckpointError(f"{path}: written by optimizer {meta.get('optimizer', 'sgd')}, not {optimizer}: "
                                  "resume with the run's --optimizer")
        lo, hi = meta["shard"]
        if hi - lo != len(arrays["w"]):
            raise CheckpointError(f"{path}: damaged checkpoint (shard size)")
        w[lo:hi] = arrays.pop("w")
        metas.append(meta)
        states.append(arrays)
    return w, metas[0], states


class Checkpointing:
    """When and what one server (or allreduce's rank 0) saves: its shard of w, the shard's
    place, `state()` (its optimizer's arrays) and `progress()` (epochs, samples and
    history on rank 0, {} elsewhere)."""

    def __init__(self, run_dir: str, index: int, servers: int, shard: tuple[int, int], n_w: int,
                 w: np.ndarray, every: tuple[str, float] | None, progress, state=dict, optimizer: str = "sgd"):
        self.run_dir, self.index, self.servers, self.shard, self.n_w = run_dir, index, servers, shard, n_w
        self.w, self.every, self.progress, self.state = w, every, progress, state  # w: the shard, a live view
        self.optimizer = optimizer
        self.last_rounds, self.last_time = 0, time.monotonic()

    def maybe(self, rounds: int) -> None:
        """After each update: save when --checkpoint-every says it is time."""
        if self.every is None:
            return
        kind, n = self.every
        if (rounds - self.last_rounds >= n) if kind == "updates" else (time.monotonic() - self.last_time >= n):
            self.save(rounds)

    def save(self, rounds: int) -> None:
        save(self.run_dir, self.index, {"w": self.w, **self.state()},
             {"n_w": self.n_w, "servers": self.servers, "shard": list(self.shard), "rounds": rounds,
              "optimizer": self.optimizer, **self.progress()})
        self.last_rounds, self.last_time = rounds, time.monotonic()
