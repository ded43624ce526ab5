"""tbf's token buckets on the testbed's links (asgd.testbed.shaping), which SimGrid's links
lack: each direction of each host's link holds up to `bucket` bytes of tokens, filled at
the link's rate; a message passes as many of its bytes as there are tokens at line speed,
and only the rest crosses SimGrid's link at the rate. A link spends its tokens as fast as
they come while it sends at the rate, so they refill only while it is idle."""

from __future__ import annotations


class TokenBuckets:
    def __init__(self, hosts: int, bucket: float, rate: float):
        self.bucket, self.rate = bucket, rate
        ends = [(h, way) for h in range(hosts) for way in ("up", "down")]
        self.tokens = dict.fromkeys(ends, bucket)
        self.idle_since = dict.fromkeys(ends, 0.0)   # when the link's last transfer at the rate ended

    def take(self, src: int, dst: int, nbytes: float, now: float) -> float:
        """The bytes of a message from host src to host dst, sent now, that pass at line
        speed: as many as both src's uplink and dst's downlink have tokens for."""
        ends = ((src, "up"), (dst, "down"))
        for e in ends:
            idle = max(now - self.idle_since[e], 0.0)
            self.tokens[e] = min(self.bucket, self.tokens[e] + idle * self.rate)
            self.idle_since[e] = max(self.idle_since[e], now)
        free = min(nbytes, *(self.tokens[e] for e in ends))
        for e in ends:
            self.tokens[e] -= free
        return free

    def sent(self, src: int, dst: int, now: float) -> None:
        """A message's bytes at the rate crossed both links until now: no refill meanwhile."""
        for e in ((src, "up"), (dst, "down")):
            self.idle_since[e] = max(self.idle_since[e], now)
