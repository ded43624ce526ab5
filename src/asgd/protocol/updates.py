"""A server's updates of its shard: the optimizer (net.optimizers: sgd adds Delta-w;
momentum, adagrad and adam keep their state per shard) moving it, having checked Delta-w
for NaN and inf, into the next version in the message strategy's pool
(protocol.messages: a buffer no reply is being sent from). These are the apply effects
asgd.core.shard asks of the MPI transport (protocol.server)."""

from __future__ import annotations

import numpy as np

from ..net import kernels
from ..net.optimizers import Optimizer


class ShardUpdates:
    def __init__(self, optimizer: Optimizer, msgs, replies: list):
        """replies: the server's reply requests per worker (the list, kept: a fresh
        version goes into a buffer none of them is sent from)."""
        self.optimizer, self.msgs, self.replies = optimizer, msgs, replies
        self.deltas: list = [None] * len(replies)   # each worker's Delta-w as received (1-bit: decoded)
        self.mean = None                            # a sync round's mean (made at the first)

    def apply(self, j: int, share: float) -> bool:
        """Worker j's Delta-w, with `share` of the learning rate; False: not finite."""
        return self.update(self.deltas[j], share)

    def apply_mean(self, weights: list[tuple[int, float]], share: float) -> bool:
        """A sync round: sum(weight * Delta-w_j), added in the order given."""
        if self.mean is None:
            self.mean = np.empty_like(self.msgs.w)
        self.mean[:] = 0.0
        for j, weight in weights:
            if weight:
                kernels.add_scaled(self.mean, self.deltas[j], weight)
        return self.update(self.mean, share)

    def finite(self, j: int) -> bool:
        return kernels.all_finite(self.deltas[j])

    def update(self, d: np.ndarray, share: float) -> bool:
        """The optimizer moves the shard along d into a fresh version, which becomes the
        current one; False (nothing moved) if d is not finite."""
        ok = self.optimizer.update(self.msgs.w, d, self.msgs.fresh(self.replies), 1.0, share)
        if ok:
            self.msgs.commit()
        return ok
