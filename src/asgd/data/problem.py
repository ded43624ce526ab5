"""The embedded default problem: concentric rings in 2-D.

Class k fills the ring between radii k/K and (k+1)/K, less a gap between rings. No
linear classifier separates the classes (the hidden layer matters), there is no label
noise (the best accuracy is 1.0), and every point is fixed by the seed.
"""

from __future__ import annotations

import numpy as np

from .formats import DataError, Dataset

DEFAULT_POINTS = 16384  # the paper's data set size
DEFAULT_TEST_POINTS = 4096
RING_GAP = 0.1  # fraction of each ring's width left empty, so the problem has a margin


def rings(points: int, seed: int, classes: int = 2) -> Dataset:
    """`points` points of the concentric-rings problem, balanced over `classes`."""
    if points < 1:
        raise DataError(f"need at least 1 point, got {points}")
    if classes < 2:
        raise DataError(f"need at least 2 classes, got {classes}")
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(points) % classes).astype(np.int64)
    width = 1.0 / classes
    r_in = y * width + (y > 0) * (RING_GAP * width / 2)
    r_out = (y + 1) * width - (y < classes - 1) * (RING_GAP * width / 2)
    # uniform in area: r^2 uniform between the ring's radii squared
    r = np.sqrt(r_in**2 + rng.random(points) * (r_out**2 - r_in**2))
    theta = rng.random(points) * 2 * np.pi
    X = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)
    return Dataset(X, y, classes)


def default_problem(seed: int = 0) -> tuple[Dataset, Dataset]:
    """The embedded default: 16384 training and 4096 held-out points (seeds s, s+1)."""
    return rings(DEFAULT_POINTS, seed), rings(DEFAULT_TEST_POINTS, seed + 1)
