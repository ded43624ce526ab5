"""--standardize: each feature scaled to mean 0 and variance 1, with statistics of the
training points computed by the ranks together from their own shares during init (no
rank reads the file again): each rank's count, mean and sum of squared deviations,
combined in rank order (Chan, Golub and LeVeque's pairwise update), the same on every
rank. The held-out set is scaled with the same statistics (and the run folder keeps them:
asgd.run.folder).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..mpiutil import Waiter


def statistics(comm: MPI.Comm, waiter: Waiter, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, standard deviation) of every feature over all ranks' rows of X (collective).
    A constant feature's deviation is 1: it is centered, not divided by zero."""
    f = X.shape[1]
    mine = np.empty(2 * f + 1)
    mine[0] = len(X)
    mine[1:f + 1] = X.mean(axis=0) if len(X) else 0.0
    mine[f + 1:] = ((X - mine[1:f + 1]) ** 2).sum(axis=0) if len(X) else 0.0
    every = np.empty((comm.size, 2 * f + 1))
    waiter.all([comm.Iallgather(mine, every)], "the other ranks' feature statistics")
    n, mean, m2 = 0.0, np.zeros(f), np.zeros(f)
    for row in every:  # rank order: every rank does the same arithmetic
        k = row[0]
        if not k:
            continue
        delta = row[1:f + 1] - mean
        total = n + k
        mean = mean + delta * (k / total)
        m2 = m2 + row[f + 1:] + delta ** 2 * (n * k / total)
        n = total
    std = np.sqrt(m2 / n) if n else np.ones(f)
    std[std == 0] = 1.0
    return mean, std


def apply(X: np.ndarray, mean: np.ndarray, std: np.ndarray) -> None:
    """X = (X - mean) / std, in place."""
    X -= mean
    X /= std
