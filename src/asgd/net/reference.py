"""The MLP in plain numpy, with nothing compiled and no MPI: the oracle the numba kernels
are tested against (tests/test_kernels.py), bench_kernel's numpy baseline, and the
forward pass that applies a trained model anywhere. Never on a rank's hot path: the
trainer runs net.kernels through mlp.make_step.
"""

from __future__ import annotations

import numpy as np

from .mlp import Layout


def step(layout: Layout, w: np.ndarray, X: np.ndarray, y: np.ndarray,
                   lr: float, dw: np.ndarray) -> float:
    """One training step: writes Delta-w = -lr * grad(mean loss) into dw and returns the
    batch's mean loss at w (the numba step's contract: mlp.make_step)."""
    W1, b1, W2, b2 = layout.views(w)
    dW1, db1, dW2, db2 = layout.views(dw)
    B = len(y)
    h = 1.0 / (1.0 + np.exp(-(X @ W1 + b1)))
    z = h @ W2 + b2
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    s = p.sum(axis=1, keepdims=True)
    loss = np.mean(np.log(s[:, 0]) - z[np.arange(B), y])  # log-sum-exp: finite when p -> 0
    p /= s
    dz = p
    dz[np.arange(B), y] -= 1.0
    dz *= -lr / B
    dW2[:] = h.T @ dz
    db2[:] = dz.sum(axis=0)
    dh = (dz @ W2.T) * h * (1.0 - h)
    dW1[:] = X.T @ dh
    db1[:] = dh.sum(axis=0)
    return float(loss)


def predict(layout: Layout, w: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Class probabilities (n, d_out) with numpy."""
    W1, b1, W2, b2 = layout.views(w)
    h = 1.0 / (1.0 + np.exp(-(X @ W1 + b1)))
    z = h @ W2 + b2
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)
