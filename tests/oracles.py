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


def held_out_metrics(w: np.ndarray, hidden: int = 10000, seed: int = 0) -> tuple[float, float]:
    """(loss, accuracy) of weights w on the embedded problem's held-out set, with the numpy
    forward pass (asgd.net.reference): the oracle of a run's final metrics."""
    from asgd.data import problem
    from asgd.net import mlp, reference
    test = problem.default_problem(seed)[1]
    p = reference.predict(mlp.Layout(2, hidden, 2), w, test.X)
    return float(-np.log(p[np.arange(len(test.y)), test.y]).mean()), float((p.argmax(1) == test.y).mean())
