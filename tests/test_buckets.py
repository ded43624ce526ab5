"""tbf's token buckets in the simulator (asgd.sim.buckets): what a message passes at line speed."""

import pytest

from asgd.sim.buckets import TokenBuckets


def test_a_paused_link_passes_its_bucket_at_once_and_the_rest_at_the_rate():
    b = TokenBuckets(hosts=5, bucket=125_000, rate=125e6)   # 1 Gbit/s, 1 ms of line time
    assert b.take(1, 0, 77_000, now=0.0) == 77_000         # a digits push fits: no time on the link
    assert b.take(2, 0, 77_000, now=0.0) == 48_000         # the server's downlink has 48 KB left
    assert b.take(3, 0, 77_000, now=0.0) == 0.0            # ... and then none: at the rate
    b.sent(3, 0, now=0.001)
    assert b.take(0, 4, 77_000, now=0.001) == 77_000       # the server's uplink is another bucket
    assert b.take(4, 0, 1e6, now=0.0015) == pytest.approx(62_500)   # half a ms idle after the transfer


def test_tokens_do_not_refill_while_the_link_sends_at_the_rate_nor_past_the_bucket():
    b = TokenBuckets(hosts=2, bucket=1000, rate=1e6)
    assert b.take(0, 1, 5000, now=0.0) == 1000
    b.sent(0, 1, now=0.004)                                 # 4000 bytes at the rate: busy until 4 ms
    assert b.take(0, 1, 5000, now=0.004) == 0.0             # busy until now: nothing refilled
    assert b.take(0, 1, 5000, now=1.0) == 1000              # a long pause: only the bucket's worth
