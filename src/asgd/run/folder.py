"""What a run folder holds besides results.json (asgd.run.results), each written
atomically, so a reader never sees half a file; and whether a folder already holds a run.

    weights.npy        the flat parameter vector (net.mlp.Layout says which value is which),
                       in the run's precision (results.json's config `precision`)
    standardize.json   with --standardize: mean and std per feature, to scale new data
    labels.json        where the labels were names: class k's name, k = 0, 1, ...
    heldout.npy        where the held-out points were a seeded part of the data file: their
                       0-based data rows (line first_line + row of a text file), in the order
                       they were evaluated
asgd.predict reads these (and results.json's config and data) to apply the model to new data.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from .. import BadInput
from .files import atomic_write

RUN_FILES = ("results.json", "weights.npy", "checkpoint")   # any of these: the folder holds a run


class FolderError(BadInput):
    """A run folder that cannot be used as asked; the message names the fix."""


def check_out(out: str, force: bool, resuming: bool) -> None:
    """Refuse to write a run over another unless --force (or --resume, which continues it)."""
    held = [f for f in RUN_FILES if os.path.exists(os.path.join(out, f))]
    if held and not force and not resuming:
        raise FolderError(f"--out {out} holds a run ({', '.join(held)}): choose another folder, add --force to "
                          f"replace it, or --resume {out} to continue it")


def write_labels(out: str, names) -> str:
    """OUT/labels.json: the classes' names, class k = names[k]."""
    path = os.path.join(out, "labels.json")
    atomic_write(path, lambda fh: json.dump({"classes": list(names), "apply": "class k is classes[k]"}, fh,
                                            indent=1))
    return path


def write_heldout(out: str, rows: np.ndarray) -> str:
    path = os.path.join(out, "heldout.npy")
    atomic_write(path, lambda f: np.save(f, np.asarray(rows, np.int64)), binary=True)
    return path


def file_digest(path: str) -> dict:
    """{path, bytes, sha256} of a data file: what the run was trained on."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"path": os.path.abspath(path), "bytes": os.path.getsize(path), "sha256": h.hexdigest()}


def write_weights(out: str, w: np.ndarray) -> str:
    path = os.path.join(out, "weights.npy")
    atomic_write(path, lambda f: np.save(f, w), binary=True)
    return path


def write_scaling(out: str, mean: np.ndarray, std: np.ndarray) -> str:
    """OUT/standardize.json, to scale new data as the model was trained:
    x_scaled = (x - mean) / std."""
    path = os.path.join(out, "standardize.json")
    atomic_write(path, lambda fh: json.dump({"mean": mean.tolist(), "std": std.tolist(),
                                             "apply": "x_scaled = (x - mean) / std, per feature"}, fh, indent=1))
    return path
