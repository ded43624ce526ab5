"""Shaping a link: tc `tbf` on the egress of both of its ends, and `netem` delay where the
kernel has it.

A host's link has two ends: its eth0 (in the host: shapes what the host sends) and the
root-side veth (shapes what it receives, since the bridge transmits into the host through
it). Each end gets `tbf rate R`: R is each direction's bandwidth, as on a full-duplex NIC.
  burst  max(16 KiB, R x 1 ms): tokens for about a millisecond, so the rate holds at the
         millisecond scale of a push/pull, not only on average;
  limit  max(8 MiB, R x 1 s): the queue a saturated server link builds (every worker's
         message in flight at once) is delayed, not dropped: TCP losses would add 200 ms
         retransmission timeouts that no cluster with flow control shows.
Latency: each end adds half the one-way latency with netem (root qdisc 1:, tbf below it
as 1:1's child); where netem is not in the kernel (sch_netem), no latency is added and
up says so.
"""

from __future__ import annotations

import re

from .sh import run

MIN_BURST, MIN_LIMIT = 16 * 1024, 8 * 1024 * 1024


def burst_bytes(rate_bit: float) -> int:
    """tbf's bucket at this rate: what a link passes at line speed after a pause."""
    return int(max(MIN_BURST, rate_bit / 8 * 1e-3))


def tbf_args(rate_bit: int) -> list[str]:
    limit = int(max(MIN_LIMIT, rate_bit / 8))
    return ["tbf", "rate", f"{rate_bit}bit", "burst", str(burst_bytes(rate_bit)), "limit", str(limit)]


def _tc(netns: str | None) -> list[str]:
    return ["tc", "-n", netns] if netns else ["tc"]


def netem_available(dev: str, netns: str | None = None) -> bool:
    """Try a netem qdisc on one of the testbed's own interfaces, and take it off again."""
    got = run([*_tc(netns), "qdisc", "replace", "dev", dev, "root", "netem", "delay", "1us"], check=False)
    if got.returncode:
        return False
    run([*_tc(netns), "qdisc", "del", "dev", dev, "root"], check=False)
    return True


def shape(dev: str, rate_bit: int, delay_us: float = 0.0, netns: str | None = None) -> None:
    """Egress of `dev`: tbf at rate_bit, behind a netem delay of delay_us if > 0."""
    tc = _tc(netns)
    if delay_us > 0:
        run([*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem",
             "delay", f"{delay_us:g}us", "limit", "100000"])
        run([*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf_args(rate_bit)])
    else:
        run([*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf_args(rate_bit)])


def qdisc_stats(dev: str, netns: str | None = None) -> dict:
    """Sent bytes, drops and overlimits of dev's qdiscs (summed), from `tc -s qdisc`."""
    out = run([*_tc(netns), "-s", "qdisc", "show", "dev", dev], check=False).stdout
    got = {"kinds": re.findall(r"^qdisc (\w+)", out, re.M), "sent_bytes": 0, "dropped": 0, "overlimits": 0}
    for sent, dropped, over in re.findall(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+), overlimits (\d+)", out):
        got["sent_bytes"] = max(got["sent_bytes"], int(sent))  # a child's bytes are its parent's too
        got["dropped"] += int(dropped)
        got["overlimits"] += int(over)
    return got
