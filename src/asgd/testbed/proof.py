"""The byte proof: what each host's link carried against what its ranks say they sent.

The root-side veth of host k counts, in its rx_bytes, every byte host k sent and, in its
tx_bytes, every byte it received (Ethernet frames without FCS). results.json counts, per
rank, the payload of its pushes and pulls (`bytes_sent`, `bytes_recv`); summed over the
ranks of a host (and, with S > 1 servers, the shards servers 1..S-1 send rank 0 at the
end, which train.py does not count), that is the application's traffic of the host.

If the ranks' bytes went over the link, then per host and direction
    app  <=  wire  <=  app x (1 + HEADERS) + ACK x (the other direction's app) + SLACK
  HEADERS  Ethernet + IP + TCP headers per segment and MPI/UCX envelopes: at most
           66 bytes per 1448-byte segment (4.6 %) when nothing is coalesced;
  ACK      the acknowledgements of what the host received travel out with what it sends:
           at most one 66-byte ACK per segment received (4.6 %);
  SLACK    the launcher's control traffic (PMI, forwarded output), MPI start-up and the
           job's small collectives: bounded by a constant.
Shared memory instead of TCP shows up as wire << app; anything else on the link as wire >>
app. A host without ranks must carry no more than SLACK.
"""

from __future__ import annotations

from . import links
from .spec import Spec

HEADERS = links.FRAME_HEADERS / links.MSS
ACK = links.FRAME_HEADERS / links.MSS
SLACK = 512 * 1024


def snapshot(spec: Spec) -> list[dict]:
    """Per host, its root-side veth's counters: tx is what the host received, rx what it sent."""
    return [links.counters(spec.veth(k)) for k in range(spec.hosts)]


def wire(before: list[dict], after: list[dict]) -> list[dict]:
    """Bytes and frames each host sent and received between two snapshots."""
    return [{"sent": a["rx_bytes"] - b["rx_bytes"], "recv": a["tx_bytes"] - b["tx_bytes"],
             "frames_sent": a["rx_packets"] - b["rx_packets"], "frames_recv": a["tx_packets"] - b["tx_packets"]}
            for b, a in zip(before, after)]


def app(results: dict, spec: Spec, planned: list[int]) -> list[dict]:
    """Per host: the payload its ranks counted, and which ranks it ran. The host comes from
    results.json's per-rank `host` where recorded, else from the plan."""
    out = [{"sent": 0, "recv": 0, "ranks": []} for _ in range(spec.hosts)]
    ranks = results["ranks"]
    servers = results["config"].get("servers", 0)
    for r in ranks:
        k = spec.index(r["host"]) if r.get("host") else planned[r["rank"]]
        out[k]["sent"] += r["bytes_sent"]
        out[k]["recv"] += r["bytes_recv"]
        out[k]["ranks"].append(r["rank"])
    if servers > 1:   # train.serve: servers 1..S-1 send their final shard to rank 0
        home = {r["rank"]: (spec.index(r["host"]) if r.get("host") else planned[r["rank"]]) for r in ranks}
        for r in ranks[1:servers]:
            lo, hi = r["shard"]
            out[home[r["rank"]]]["sent"] += 8 * (hi - lo)
            out[home[0]]["recv"] += 8 * (hi - lo)
    return out


def check(wire_bytes: list[dict], app_bytes: list[dict], host_name) -> dict:
    """Rows per host (app, wire, ratio per direction, verdict) and ok for the whole job."""
    rows, ok = [], True
    for k, (w, a) in enumerate(zip(wire_bytes, app_bytes)):
        row = {"host": host_name(k), "ranks": a["ranks"]}
        for d, other in (("sent", "recv"), ("recv", "sent")):
            lo = a[d]
            hi = a[d] * (1 + HEADERS) + a[other] * ACK + SLACK
            good = lo <= w[d] <= hi
            row.update({f"app_{d}": a[d], f"wire_{d}": w[d], f"ratio_{d}": (w[d] / a[d]) if a[d] else None,
                        f"bound_{d}": [lo, int(hi)], f"ok_{d}": good})
            ok &= good
        rows.append(row)
    tot = {d: (sum(w[d] for w in wire_bytes), sum(a[d] for a in app_bytes)) for d in ("sent", "recv")}
    return {"ok": ok, "hosts": rows,
            "ratio_sent": tot["sent"][0] / tot["sent"][1] if tot["sent"][1] else None,
            "ratio_recv": tot["recv"][0] / tot["recv"][1] if tot["recv"][1] else None,
            "rule": f"app <= wire <= app x {1 + HEADERS:.4f} + other direction's app x {ACK:.4f} "
                    f"+ {SLACK // 1024} KiB, per host and direction"}


def table(proof: dict) -> str:
    def mb(x):
        return f"{x / 1e6:,.2f}"
    lines = [f"{'host':<14} {'ranks':<12} {'app sent MB':>11} {'wire sent MB':>12} {'ratio':>6}   "
             f"{'app recv MB':>11} {'wire recv MB':>12} {'ratio':>6}  ok"]
    for r in proof["hosts"]:
        def ratio(d):
            return f"{r[f'ratio_{d}']:.3f}" if r[f"ratio_{d}"] is not None else "-"
        lines.append(f"{r['host']:<14} {','.join(map(str, r['ranks'])) or '-':<12} {mb(r['app_sent']):>11} "
                     f"{mb(r['wire_sent']):>12} {ratio('sent'):>6}   {mb(r['app_recv']):>11} "
                     f"{mb(r['wire_recv']):>12} {ratio('recv'):>6}  "
                     f"{'yes' if r['ok_sent'] and r['ok_recv'] else 'NO'}")
    rs, rr = proof["ratio_sent"], proof["ratio_recv"]
    lines.append(f"all hosts: wire/app {rs:.3f} sent, {rr:.3f} received; rule: {proof['rule']}; "
                 f"{'PASS' if proof['ok'] else 'FAIL'}" if rs and rr else
                 f"no application bytes counted; {'PASS' if proof['ok'] else 'FAIL'}")
    return "\n".join(lines)
