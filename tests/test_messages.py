"""A server's versions of its shard (protocol.messages.DenseShard): an update never
writes a buffer a reply is in flight from, a reply goes out of the version it carries,
and the caller's w is brought up to date when asked. Replies in flight are stand-ins
whose Test() says whether they are done, as MPI's would."""

import numpy as np
from mpi4py import MPI

from asgd.protocol.messages import DenseShard
from asgd.core.wire import PULL_HEADER


class Reply:
    """A reply in flight until done(); Test() as MPI.Request's."""

    def __init__(self):
        self.finished = False

    def Test(self):
        return self.finished

    def done(self):
        self.finished = True


def _apply(msgs, replies, d):
    out = msgs.fresh(replies)
    out[:] = msgs.w + d
    msgs.commit()


def test_a_reply_is_sent_out_of_its_version_and_no_update_writes_a_buffer_in_flight():
    n, W = 5, 3
    home = np.arange(n, dtype=float)
    msgs = DenseShard(home, W)
    replies = [MPI.REQUEST_NULL] * W
    sent = {}   # worker -> (buffer, its content when sent)
    for step in range(40):
        j = step % W
        if replies[j] is not MPI.REQUEST_NULL:
            replies[j].done()   # the server waits for j's previous reply before the next
        buf = msgs.reply(j, (step, 0, 0), replies)
        assert buf[n:].tolist() == [step, 0, 0] and len(buf) == n + PULL_HEADER
        np.testing.assert_array_equal(buf[:n], msgs.w)
        replies[j] = Reply()
        sent[j] = (buf, buf.copy())
        _apply(msgs, replies, np.full(n, 1.0))
        for k, (b, content) in sent.items():   # nothing in flight was written
            if not replies[k].finished:
                np.testing.assert_array_equal(b, content)
    assert len(msgs.pool) <= W + 2
    np.testing.assert_array_equal(home, np.arange(n))        # home waits for publish()
    np.testing.assert_array_equal(msgs.publish(), np.arange(n) + 40)
    assert msgs.publish() is home


def test_a_new_header_on_a_version_in_flight_is_a_copy_and_the_same_header_is_not():
    n = 4
    msgs = DenseShard(np.ones(n), 2)
    replies = [MPI.REQUEST_NULL] * 2
    a = msgs.reply(0, (0, 0, 0), replies)
    replies[0] = Reply()
    b = msgs.reply(1, (0, 0, 0), replies)       # sync: every worker, one version, one header
    assert b is a
    replies[1] = Reply()
    replies[1].done()                         # worker 1 took it; worker 0's is still in flight
    c = msgs.reply(1, (0, 1, 0), replies)     # a stop asked since: the same version, a new header
    assert c is not a and c[n:].tolist() == [0, 1, 0] and a[n:].tolist() == [0, 0, 0]
    np.testing.assert_array_equal(c[:n], a[:n])


def test_no_buffer_in_flight_is_given_for_the_next_version():
    msgs = DenseShard(np.zeros(3), 4)
    replies = [MPI.REQUEST_NULL] * 4
    for j in range(4):   # four replies in flight out of four successive versions
        msgs.reply(j, (j, 0, 0), replies)
        replies[j] = Reply()
        _apply(msgs, replies, np.ones(3))
    busy = set(msgs.source)
    out = msgs.fresh(replies)
    assert all(not np.shares_memory(out, msgs.pool[b]) for b in msgs.source)
    assert not np.shares_memory(out, msgs.w)
    assert len(busy) == 4 and len(msgs.pool) == 6
    for r in replies:
        r.done()
    out = msgs.fresh(replies)   # now the oldest is free again: no new buffer
    assert len(msgs.pool) == 6
