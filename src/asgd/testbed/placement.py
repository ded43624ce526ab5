"""Which rank runs on which host.

Servers (ranks 0..S-1) each get a host of their own: server s on host s, nothing else
there, so each server's link carries only its own traffic. Workers (ranks S..N-1) go on
hosts S..H-1: round-robin by default (worker j on host S + j mod (H-S)), or in blocks of
K with ranks_per_host=K (the first K workers on host S, the next K on host S+1, ...).
With S = 0 (allreduce) every rank is a worker and every host takes workers.
"""

from __future__ import annotations


class PlacementError(ValueError):
    pass


def plan(ranks: int, servers: int, hosts: int, ranks_per_host: int | None = None) -> list[int]:
    """Host index of each rank."""
    if ranks < 1:
        raise PlacementError("need at least one rank")
    if not 0 <= servers < ranks:
        raise PlacementError(f"{servers} servers need more than {servers} ranks (got {ranks})")
    if servers and hosts <= servers:
        raise PlacementError(f"{servers} server(s) each on a host of their own and workers on others need at "
                             f"least {servers + 1} hosts; the testbed has {hosts} (up --hosts {servers + 1} or more)")
    worker_hosts = list(range(servers, hosts))
    workers = ranks - servers
    if ranks_per_host is None:
        where = [worker_hosts[j % len(worker_hosts)] for j in range(workers)]
    else:
        if ranks_per_host < 1:
            raise PlacementError("--ranks-per-host must be >= 1")
        if workers > ranks_per_host * len(worker_hosts):
            raise PlacementError(f"{workers} workers at {ranks_per_host} per host need "
                                 f"{-(-workers // ranks_per_host)} worker hosts; the testbed has {len(worker_hosts)}")
        where = [worker_hosts[j // ranks_per_host] for j in range(workers)]
    return list(range(servers)) + where


def describe(where: list[int], servers: int, host_name) -> str:
    """'host asgd-tb-h0: rank 0 (server); host asgd-tb-h1: ranks 1, 3 (workers); ...'"""
    by_host: dict[int, list[int]] = {}
    for r, h in enumerate(where):
        by_host.setdefault(h, []).append(r)
    parts = []
    for h in sorted(by_host):
        rs = by_host[h]
        role = "server" if rs[0] < servers else "worker"
        parts.append(f"{host_name(h)}: rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))} "
                     f"({role}{'s' * (len(rs) > 1)})")
    return "; ".join(parts)
