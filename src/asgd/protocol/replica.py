"""--model-parallel K: a replica is K ranks that split the hidden layer (Yan et al.'s model
partitioning; net.mlp.Sliced). Every step each member computes its slice's partial
logits, the replica sums them, and each member finishes the step on its own slice.

The sum is point to point on the replica's own communicator: members 1..K-1 send theirs
to member 0, which adds them in member order (the same sum on every run) and sends the
total back; a batch's logits are batch x d_out values, so latency, not bandwidth, is its
cost, and its bytes are exact. The sum also carries what the members must agree on
before they push the step's slices, so that a replica's K pushes are one step:
  cut   member 0's, the last checkpoint cut it heard of (its link's, from server 0: the
        others never talk to server 0) or, with --arch allreduce, whether a checkpoint is
        due after this step; every member stamps this step's push with it
  stop  whether any member was asked to stop (a signal, or its servers' replies), or
        heard the run is done (a target reached): every member ends after the same step,
        never one alone waiting for the others' logits (wire.stop_share: asked or done)
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..core.wire import TAG_REPLICA, stop_share, summed_stop
from .context import Endpoint


class Replica:
    def __init__(self, ep: Endpoint, comm: MPI.Comm, background=None):
        """comm: the replica's K ranks, member k its rank k. background(): a p2p owner's
        serving, run while this member waits for the sum."""
        self.ep, self.comm, self.K, self.member = ep, comm, comm.size, comm.rank
        self.background = background
        self.cut, self.stop = 0, False     # what the last sum agreed on: the cut, whether to stop
        self.asked = False                 # ... and whether the stop was asked (a signal), not the run done
        self.bytes = [0, 0]                # sent, received
        self._buf = self._inbox = None

    def sum(self, Z: np.ndarray, cut: int, asked: bool, done: bool = False) -> None:
        """Z (batch x d_out, this slice's partial logits) becomes the replica's sum; the
        members agree on `cut` (member 0's) and on stopping (any member asked to, or
        heard the run is done)."""
        n = Z.size
        if self._buf is None or len(self._buf) != n + 2 or self._buf.dtype != Z.dtype:
            # Z's dtype (the run's precision); cut and stop ride along, exact (float32: to 2^24 cuts)
            self._buf = np.empty(n + 2, Z.dtype)
            self._inbox = np.empty((max(self.K - 1, 1), n + 2), Z.dtype)
        buf = self._buf
        buf[:n] = Z.ravel()
        buf[n], buf[n + 1] = (cut if self.member == 0 else 0), stop_share(asked, done, self.K)
        if self.K > 1:
            self._exchange(buf, n)
        Z.ravel()[:] = buf[:n]
        self.cut = int(buf[n])
        self.stop, self.asked = summed_stop(buf[n + 1])

    def _exchange(self, buf: np.ndarray, n: int) -> None:
        comm, waiter, nbytes = self.comm, self.ep.waiter, buf.itemsize * (n + 2)   # MPI types: the buffers' dtype
        if self.member == 0:
            inbox = self._inbox[:self.K - 1, :n + 2]
            waiter.all([comm.Irecv(inbox[k - 1], k, TAG_REPLICA) for k in range(1, self.K)],
                       "the replica's partial logits", self.background)
            for k in range(self.K - 1):     # in member order: the same sum every run
                buf += inbox[k]
            waiter.all([comm.Isend(buf, k, TAG_REPLICA) for k in range(1, self.K)],
                       "the replica's members to take the logits' sum", self.background)
            self.bytes[0] += (self.K - 1) * nbytes
            self.bytes[1] += (self.K - 1) * nbytes
        else:
            waiter.all([comm.Isend(buf, 0, TAG_REPLICA)], "member 0 to take my logits",
                       self.background)
            waiter.all([comm.Irecv(buf, 0, TAG_REPLICA)], "the replica's sum of the logits",
                       self.background)
            self.bytes[0] += nbytes
            self.bytes[1] += nbytes
