"""Test oracles: textbook versions, in plain numpy, of what asgd computes faster."""

import numpy as np

from asgd.net.optimizers import BETAS, EPS, MOMENTUM


def optimizer_steps(name: str, lr: float, w: np.ndarray, ds, scales) -> np.ndarray:
    """The optimizer's textbook update, from w over a sequence of directions d (-gradient;
    for sgd the Delta-w itself), each times its scale: the oracle of Optimizer.step."""
    w = w.copy()
    v = np.zeros_like(w)
    m = np.zeros_like(w)
    g2 = np.zeros_like(w)
    for t, (d, c) in enumerate(zip(ds, scales), 1):
        d = d * c
        if name == "sgd":
            w += d
        elif name == "momentum":
            v = MOMENTUM * v + lr * d
            w += v
        elif name == "adagrad":
            g2 += d * d
            w += lr * d / (np.sqrt(g2) + EPS)
        else:
            b1, b2 = BETAS
            m = b1 * m + (1 - b1) * d
            v = b2 * v + (1 - b2) * d * d
            w += lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + EPS)
    return w
