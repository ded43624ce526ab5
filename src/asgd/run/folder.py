"""What a run folder holds besides results.json (asgd.run.results): the final weights and
the feature scaling, each written atomically, so a reader never sees half a file.

    weights.npy        the flat parameter vector (net.mlp.Layout says which value is which)
    standardize.json   with --standardize: mean and std per feature, to scale new data
"""

from __future__ import annotations

import json
import os

import numpy as np

from .files import atomic_write


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
