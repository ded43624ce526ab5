"""Rank 0's epochs when workers are lost (--fault-tolerant), without MPI: the tracker
(asgd.run.progress.EpochTracker) fed the pushes of workers whose shares are the data
layer's split, some of them killed at chosen points. Every epoch must end, the last one
with the last sample applied: a lost worker's share priced wrong left the last epoch's
end out of reach (11 of 12 epochs, ssp with 2 of 4 workers killed, Open MPI leg of CI)
or ended it early."""

from collections import deque

import numpy as np
import pytest

from asgd.data.shares import HELD_OUT, HOLDOUT, assign, worker_points
from asgd.run.progress import EpochTracker
from asgd.run.trace import PhaseClock


class Pushes:
    """Rank 0's view of a run: each worker's batches, epoch by epoch over its share (the
    last one short, as asgd.core.schedule cuts them). push(j) applies worker j's next
    batch; kill(j) loses j as a server's on_lost reports it: the samples it pushed (since
    this run started), its share."""

    def __init__(self, n_train: int, workers: int, batch: int, epochs: int, first_epoch: int = 0):
        self.shares = [worker_points(n_train, workers, j) for j in range(workers)]
        self.left = [deque(b for _ in range(first_epoch, epochs) for b in batches(n, batch)) for n in self.shares]
        self.pushed = [0] * workers
        self.lost: list[int] = []
        self.first_epoch, self.epochs = first_epoch, epochs
        self.tracker = EpochTracker(n_train, epochs, None, lambda line: None, 1e9, PhaseClock("train", 0),
                                    epoch=first_epoch, samples=first_epoch * n_train)

    def push(self, j: int, times: int = 1) -> None:
        for _ in range(times):
            m = self.left[j].popleft()
            self.pushed[j] += m
            self.tracker.add(0.5 * m, m)

    def push_to(self, j: int, samples: int) -> None:
        """Worker j pushes until it has pushed `samples` (a batch's end)."""
        while self.pushed[j] < samples:
            self.push(j)
        assert self.pushed[j] == samples

    def rounds(self, k: int | None = None) -> None:
        """k rounds (None: until all is pushed) of one batch from each worker with any left."""
        while any(self.left) and (k is None or k > 0):
            for j, left in enumerate(self.left):
                if left:
                    self.push(j)
            k = None if k is None else k - 1

    def kill(self, j: int) -> None:
        self.left[j].clear()
        self.lost.append(j)
        self.tracker.lose(float(self.pushed[j]), self.shares[j])

    def check_every_epoch_ended(self) -> None:
        """All is pushed: every epoch has ended, the last with the last sample (not before
        it, and not left to close()), and an epoch now brings the survivors' shares."""
        t = self.tracker
        assert not any(self.left)
        assert [h["epoch"] for h in t.history] == list(range(self.first_epoch + 1, self.epochs + 1))
        assert t.history[-1]["samples"] == t.samples == self.first_epoch * sum(self.shares) + sum(self.pushed)
        assert t.size == sum(n for j, n in enumerate(self.shares) if j not in self.lost)
        t.close()
        assert len(t.history) == self.epochs - self.first_epoch


def batches(n: int, batch: int) -> list[int]:
    """An epoch's batch sizes over a share of n points."""
    return [min(batch, n - k) for k in range(0, n, batch)]


@pytest.mark.parametrize("n, workers, holdout", [(1003, 5, False), (16384, 4, False), (10, 3, False), (7, 7, False),
                                                (1150, 5, True)])
def test_worker_points_are_the_shares_assign_deals(n, workers, holdout):
    """Of the training points (a data file's less the 1/HOLDOUT held out of it)."""
    owners = assign(n, 3, 0, workers, holdout)
    train = n - (n // HOLDOUT if holdout else 0)
    dealt = np.bincount(owners[owners != HELD_OUT], minlength=workers).tolist()
    assert [worker_points(train, workers, j) for j in range(workers)] == dealt


def test_workers_lost_at_a_shares_end_and_mid_share_leave_every_epoch_to_end():
    """1,003 points among 5 workers: shares of 201 and 200, not 200.6. Worker 0 is killed
    right at its share's end in epoch 2 (it trained all of it: nothing of this epoch is
    missing), worker 3 before it, half way through its share."""
    run = Pushes(1003, 5, 50, 4)
    run.rounds(6)
    assert run.pushed[3] == 200 + 100
    run.kill(3)
    run.push_to(0, 2 * 201)
    assert run.tracker.epoch == 1
    run.kill(0)
    run.rounds()
    run.check_every_epoch_ended()


def test_two_workers_lost_behind_the_epoch_rank_0_is_in():
    """The CI failure (ssp --staleness 2, 4 workers, the default 16,384 points, batch 256,
    12 epochs, workers 0 and 2 killed): workers 1 and 3 a step into their 4th epoch,
    0 and 2 a step short of their 3rd's end, and rank 0 counts 3 epochs ended. What the
    dead had pushed of their 3rd epoch is not of rank 0's 4th; taking it to be (the
    pushed samples modulo the share) put the last epoch's end two shares out of reach,
    and close() did not end it."""
    run = Pushes(16384, 4, 256, 12)
    run.rounds(2 * 16)
    for j in (1, 3):
        run.push(j, 17)
    for j in (0, 2):
        run.push(j, 15)
    assert run.tracker.epoch == 3
    run.kill(0)
    run.kill(2)
    run.rounds()
    run.check_every_epoch_ended()


@pytest.mark.parametrize("first_epoch", [0, 2])
def test_workers_lost_in_different_epochs_one_ahead_of_rank_0(first_epoch):
    """Worker 4 is lost mid-share in the first epoch trained; later worker 1, having
    finished its share and begun the next epoch's while rank 0's epoch had not ended
    (what it pushed past that end is of the epoch after). Resumed after 2 epochs too: the
    servers count pushes from the resume."""
    run = Pushes(1003, 5, 64, first_epoch + 4, first_epoch)
    run.push(4, 2)
    run.kill(4)
    run.rounds(6)
    run.push_to(1, 2 * 201 + 64)
    assert run.tracker.epoch == first_epoch + 1
    run.kill(1)
    run.rounds()
    run.check_every_epoch_ended()


def test_a_worker_lost_far_behind_ends_the_epochs_it_held_back_at_its_loss():
    """Async: worker 1 had pushed nothing when it died, found only once worker 0 had
    trained all its epochs. Rank 0 counts 2 epochs ended of 4 and no push is to come: the
    loss itself ends the other 2."""
    run = Pushes(1000, 2, 100, 4)
    run.push_to(0, 4 * 500)
    assert run.tracker.epoch == 2
    run.kill(1)
    run.check_every_epoch_ended()
