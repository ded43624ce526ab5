"""The byte proof: what a job added to each host's link against what its ranks counted.

Each host's root-side veth counts every frame the host sent (rx) and received (tx), and
their bytes (Ethernet frames without FCS). results.json counts, per rank, every byte of
asgd's own messages (`bytes_sent`, `bytes_recv`: start-up, training, the end-of-run
records, clock pings and shards). MPI's own traffic is in neither alike (connecting every
pair of ranks, its barriers and start-up agreements): it grows with the ranks, not with
the job. (The launcher's traffic is not on these links at all: it has a control network
of its own, see asgd.testbed.links.) So the proof is differential: `run --check-bytes`
first runs the same command with --dry-run on the same placement (the baseline: the
whole start-up and end-of-run bookkeeping, no training), then the job, and compares per
host and direction what the job added over the baseline: on the wire (Delta-wire,
Delta-frames), in results.json (Delta-app) and in messages (the job's training messages
and final shards, by asgd.protocol's pattern: added_messages).

Every frame on the data links is a TCP/IPv4 segment with timestamps (links.py keeps ARP,
IGMP and IPv6 off them): FRAME (66) bytes of headers and at most MSS (1448) of payload.
So Delta-wire splits exactly into 66 x Delta-frames of headers and the TCP payload, and
the proof checks each:

  payload  Delta-app - EPSILON <= Delta-wire - 66 Delta-frames <= Delta-app + envelopes + EPSILON
           envelopes: MPI's headers and control messages, per message sent or received
           ENVELOPE bytes (ENVELOPE_LARGE above FRAGMENT), and ENVELOPE_SHARE of the bytes
           both ways. Measured with MPICH over UCX's TCP transport here: 13-15 B a
           message up to 48 KiB sent whole; a 40 KiB push written in 8 KiB fragments
           (5 B of header each) 175 B; 51-157 B a message from 64 KiB to 400 KiB and
           193 B at 4 MiB a round trip (rendezvous); but 2 MB shards (2-100K-2 on 2
           servers) 5.2 KB a message, 0.13 % of the bytes both ways (a worker sent
           24.0 MB and 62.4 KB more; a server received 98.0 MB and 250 KB more), which
           the share's first value, 0.1 %, refused;
  frames   Delta-frames <= segments(sent) + segments(received) + EPSILON_FRAMES
           a message up to FRAGMENT (with its header) fills ceil(size / MSS) segments, a
           larger one at most a short segment more per fragment; each segment received
           is acknowledged by at most one frame sent; TSO/GSO only makes fewer frames.
A segment TCP sent twice crossed the link twice: each one the kernel counts (the host's
RetransSegs for what it sent, its duplicate SACKs for what it received twice) allows MSS
bytes and a frame more, in the job's upper bound or the baseline's lower one. Bytes
that bypassed the link (shared memory) show as a payload short of Delta-app; bytes
results.json does not count, as a payload beyond it; anything else on the link, as
either. Added, the two give the wire bound the table shows.

EPSILON and EPSILON_FRAMES are the baseline's own noise, measured by repeating a dry run
on one placement, 3 or 4 times, at 8, 12 and 28 hosts: at most 144 B of payload and 41
frames a host and direction apart (MPI's start-up messages vary by a few bytes, and the
ACKs by whether they ride on data or go alone). It does not grow with the hosts: before
the control network and with TCP's loss probes on, it was 1.5 KB, 54 frames, at 28.
The proof refuses what it cannot check, in one line:
--allreduce mpi (MPI_Iallreduce's bytes are the MPI library's), --arch p2p (its pattern is
not modelled here yet), a results.json without per-part bytes.
"""

from __future__ import annotations

from collections import Counter

from ..core.wire import DONE_BYTES, itemsize
from . import links
from .spec import Spec

FRAME, MSS = links.FRAME_HEADERS, links.MSS
FRAGMENT = 8192             # UCX over TCP writes a message above this in pieces of it
ENVELOPE = 32               # bytes per message up to FRAGMENT, sent or received (measured 13-15)
ENVELOPE_LARGE = 256        # per larger message, sent or received (measured at most 175)
ENVELOPE_SHARE = 0.002      # of the bytes both ways (fragments' headers; measured at most 0.13 %)
EPSILON = 1024              # payload bytes per host and direction: the baseline's noise (seen: 144)
EPSILON_FRAMES = 64         # frames per host and direction: the baseline's noise (seen: 41)
DIRECTIONS = (("sent", "recv"), ("recv", "sent"))


class ProofError(ValueError):
    """The proof cannot check this run; the message says why in one line."""


# -- measuring -------------------------------------------------------------------------

def snapshot(spec: Spec) -> list[dict]:
    """Per host, its root-side veth's counters (tx is what the host received, rx what it
    sent) and its TCP's (segments resent, segments received twice)."""
    return [{**links.counters(spec.veth(k)), **tcp} for k, tcp in enumerate(links.tcp_counters(spec))]


def wire(before: list[dict], after: list[dict]) -> list[dict]:
    """Bytes and frames each host sent and received between two snapshots, and the TCP
    segments it sent again or received twice."""
    return [{"sent": a["rx_bytes"] - b["rx_bytes"], "recv": a["tx_bytes"] - b["tx_bytes"],
             "frames_sent": a["rx_packets"] - b["rx_packets"], "frames_recv": a["tx_packets"] - b["tx_packets"],
             "resent": a["resent"] - b["resent"], "received_twice": a["received_twice"] - b["received_twice"]}
            for b, a in zip(before, after)]


# -- reading results.json ----------------------------------------------------------------

def unprovable(arch: str | None, allreduce: str | None, model_parallel: int = 1) -> str | None:
    """Why a job of this architecture cannot be proved, or None."""
    if model_parallel > 1:
        return ("the byte proof does not know --model-parallel's messages yet (a replica's logit sums and "
                "its data share, between ranks that may share a host); prove a run without it")
    if arch == "allreduce" and allreduce == "mpi":
        return ("the byte proof cannot check --allreduce mpi: MPI_Iallreduce's bytes are the MPI library's "
                "(results.json counts only the least any allreduce moves); use --allreduce ring (the default)")
    if arch == "p2p":
        return ("the byte proof does not know --arch p2p's messages yet (every rank pushes to every owner, "
                "itself and its host's ranks among them, which no link carries); prove ps or allreduce")
    return None


def refusal(results: dict) -> str | None:
    """Why this results.json cannot be proved, or None."""
    cfg = results.get("config", {})
    reason = unprovable(cfg.get("arch"), cfg.get("allreduce"), cfg.get("model_parallel", 1))
    if reason:
        return reason
    if any("bytes" not in r for r in results.get("ranks", [])):
        return ("results.json has no per-part bytes (ranks[].bytes: init, train, finish): this asgd.train "
                "does not count every byte it sends")
    return None


def _host_of(r: dict, spec: Spec, planned: list[int]) -> int:
    """A rank's host: results.json's `host` where recorded, else the plan's."""
    return spec.index(r["host"]) if r.get("host") else planned[r["rank"]]


def app(results: dict, spec: Spec, planned: list[int]) -> list[dict]:
    """Per host: the bytes its ranks counted (results.json's bytes_sent, bytes_recv: every
    message of asgd's own) that cross its link, and which ranks it ran. Known to stay in
    the host, so left out: the end-of-run records and clock pings between rank 0 and the
    ranks that share its host, and the ring's chunks between neighbours on one host."""
    hosts = [_host_of(r, spec, planned) for r in results["ranks"]]
    out = [{"sent": 0, "recv": 0, "ranks": []} for _ in range(spec.hosts)]
    for r, k in zip(results["ranks"], hosts):
        out[k]["sent"] += r["bytes_sent"]
        out[k]["recv"] += r["bytes_recv"]
        out[k]["ranks"].append(r["rank"])
    for r, k in zip(results["ranks"][1:], hosts[1:]):
        if k == hosts[0]:   # everything rank r counts at the end is to or from rank 0
            local = r["bytes"]["finish"]
            out[k]["sent"] -= local["sent"] + local["recv"]
            out[k]["recv"] -= local["sent"] + local["recv"]
    for w in beside_their_server(results, hosts):   # everything a worker trains with is its server's
        local = results["ranks"][w]["bytes"]["train"]
        out[hosts[w]]["sent"] -= local["sent"] + local["recv"]
        out[hosts[w]]["recv"] -= local["sent"] + local["recv"]
    if results["config"].get("arch") == "allreduce":
        P = len(hosts)
        for r in range(P):
            if P > 1 and hosts[r] == hosts[(r + 1) % P]:   # r's chunks go to r + 1
                sent = results["ranks"][r]["bytes"]["train"]["sent"]
                out[hosts[r]]["sent"] -= sent
                out[hosts[r]]["recv"] -= sent
    return out


def beside_their_server(results: dict, hosts: list[int]) -> list[int]:
    """The parameter-server workers that share a host with their one server (Slurm's block
    placement puts ranks 1..K-1 beside rank 0): their training messages never cross a link.
    Raises ProofError with several servers, one of them beside a worker: its share of
    the worker's bytes is not in results.json."""
    cfg = results["config"]
    if cfg.get("arch", "ps") != "ps":
        return []
    S = cfg["servers"]
    server_hosts = set(hosts[:S])
    near = [w for w in range(S, len(hosts)) if hosts[w] in server_hosts]
    if near and S > 1:
        raise ProofError(f"the byte proof cannot split a worker's bytes among {S} servers when one shares its host "
                         f"(ranks {', '.join(map(str, near[:4]))}{' ...' if len(near) > 4 else ''}): place the servers "
                         "on hosts of their own, or prove a run with one server")
    return near


def added_messages(results: dict, hosts: list[int] | None = None) -> list[dict[str, Counter]]:
    """Per rank, the messages across a link that a job sends and receives and its dry run
    does not, as {"sent": {size: count}, "recv": {size: count}}, by asgd.protocol's
    pattern and the bytes results.json counts for training: with S servers, a worker
    pushes to every server and takes every server's reply per update, then tells every
    server it is done (none that cross no link: a worker beside its one server); a server
    takes and answers every worker's pushes; servers 1..S-1 send rank 0 their shard at
    the end (those on another host than rank 0's); the ring passes 2 (P - 1) chunks each way per step
    (applied or refused) to the next rank, when on another host (hosts: each rank's). A
    dry run: none."""
    ranks = results["ranks"]
    hosts = hosts or list(range(len(ranks)))
    out = [{"sent": Counter(), "recv": Counter()} for _ in ranks]
    if results.get("dry_run"):
        return out
    train = [r["bytes"]["train"] for r in ranks]
    if results["config"].get("arch") == "allreduce":
        P = len(ranks)
        for r, (rank, t) in enumerate(zip(ranks, train)):
            n = 2 * (P - 1) * (rank["updates"] + rank.get("refused", 0))
            nxt = (r + 1) % P
            if n and hosts[r] != hosts[nxt]:
                size = round(t["sent"] / n)
                out[r]["sent"][size] += n
                out[nxt]["recv"][size] += n
        return out
    S = results["config"]["servers"]
    near = set(beside_their_server(results, hosts))
    for w in range(S, len(ranks)):
        if w in near:
            continue
        u = ranks[w]["updates"]
        push, reply = round((train[w]["sent"] - DONE_BYTES * S) / (S * u)) if u else 0, \
            round(train[w]["recv"] / (S * u)) if u else 0
        for s in range(S):
            if u:
                out[w]["sent"][push] += u
                out[w]["recv"][reply] += u
                out[s]["recv"][push] += u
                out[s]["sent"][reply] += u
            out[w]["sent"][DONE_BYTES] += 1
            out[s]["recv"][DONE_BYTES] += 1
    for s in range(1, S):
        if hosts[s] == hosts[0]:   # a server beside rank 0 hands its shard over inside the host
            continue
        lo, hi = ranks[s]["shard"]
        shard = itemsize(results["config"].get("precision", "float64")) * (hi - lo)   # before --precision: float64
        out[s]["sent"][shard] += 1
        out[0]["recv"][shard] += 1
    return out


def traffic(results: dict, spec: Spec, planned: list[int], wire_bytes: list[dict]) -> list[dict]:
    """Per host, one run's bytes and frames on the wire, the TCP segments that crossed it
    twice (`twice`: resent, received twice), the bytes its ranks counted across its link
    (app), the messages they added over a dry run (added_messages), and the end-of-run
    records that cross it (`records`: the job's are larger than its dry run's)."""
    hosts = app(results, spec, planned)
    where = [_host_of(r, spec, planned) for r in results["ranks"]]
    for h, w in zip(hosts, wire_bytes):
        h.update(wire={"sent": w["sent"], "recv": w["recv"]},
                 frames={"sent": w["frames_sent"], "recv": w["frames_recv"]},
                 twice={"sent": w.get("resent", 0), "recv": w.get("received_twice", 0)},
                 app={"sent": h.pop("sent"), "recv": h.pop("recv")}, msgs={"sent": Counter(), "recv": Counter()},
                 records={"sent": 0, "recv": 0})
    for k, m in zip(where, added_messages(results, where)):
        for d in ("sent", "recv"):
            hosts[k]["msgs"][d].update(m[d])
    for k in where[1:]:
        if k != where[0]:
            hosts[k]["records"]["sent"] += 1
            hosts[where[0]]["records"]["recv"] += 1
    return hosts


def job_traffic(runs: list[dict], spec: Spec, wire_bytes: list[dict]) -> list[dict]:
    """traffic() of a batch job that made several runs one after another (a sweep's), on
    the links' counters around the whole job: per host, its ranks' bytes, messages and
    records of every run add up. Each rank's host is results.json's (Slurm placed it)."""
    if not runs:
        raise ProofError("no results.json to prove the bytes against")
    total = None
    for r in runs:
        if any(not x.get("host") for x in r["ranks"]):
            raise ProofError("results.json has no host per rank: this asgd.train does not record where ranks ran")
        t = traffic(r, spec, [spec.index(x["host"]) for x in r["ranks"]], wire_bytes)
        if total is None:
            total = t
            continue
        for h, x in zip(total, t):
            for d in ("sent", "recv"):
                h["app"][d] += x["app"][d]
                h["msgs"][d].update(x["msgs"][d])
                h["records"][d] += x["records"][d]
            h["ranks"] = sorted(set(h["ranks"]) | set(x["ranks"]))
    return total


# -- the rule ------------------------------------------------------------------------------

def envelopes(msgs: Counter, other: Counter, app_d: float, app_o: float) -> float:
    """The most MPI adds to one direction's payload: the headers of the messages sent and
    the control messages for those received (a message above FRAGMENT costs more)."""
    per = sum(n * (ENVELOPE if size <= FRAGMENT else ENVELOPE_LARGE) for size, n in (msgs + other).items())
    return per + ENVELOPE_SHARE * (app_d + app_o)


def segments(msgs: Counter) -> int:
    """The most TCP segments these messages (and their headers) fill: one message up to
    FRAGMENT is one write; a larger one, a write per fragment, each of which may end in
    a short segment."""
    return sum(n * (-(-(size + ENVELOPE) // MSS) if size <= FRAGMENT else -(-size // MSS) + -(-size // FRAGMENT))
               for size, n in msgs.items())


def grown(j: dict, b: dict, d_app: dict, d_msgs: dict, d: str) -> float:
    """The most segments more that the messages both runs send take in the job (its
    end-of-run records are larger): the bytes the job added beyond its added messages,
    and a short segment per record."""
    residual = d_app[d] - sum(size * n for size, n in d_msgs[d].items())
    return max(residual, 0) / MSS + max(j["records"][d], b["records"][d])


def check(job: list[dict], baseline: list[dict], host_name, runs: int = 1) -> dict:
    """Rows per host (what the job added over the baseline, on the wire and in
    results.json, the bounds, the verdicts) and ok for the whole job. job and baseline:
    traffic() of each run (job_traffic() of a job of `runs` runs, each with a start-up
    of its own, so each with its own noise: EPSILON and EPSILON_FRAMES per run)."""
    rows, ok = [], True
    eps, eps_frames = EPSILON * runs, EPSILON_FRAMES * runs
    for k, (j, b) in enumerate(zip(job, baseline)):
        d_app = {d: j["app"][d] - b["app"][d] for d in ("sent", "recv")}
        d_msgs = {d: j["msgs"][d] - b["msgs"][d] for d in ("sent", "recv")}    # Counters: what the job added
        row = {"host": host_name(k), "ranks": j["ranks"]}
        for d, o in DIRECTIONS:
            d_wire, d_frames = j["wire"][d] - b["wire"][d], j["frames"][d] - b["frames"][d]
            payload = d_wire - FRAME * d_frames
            env = envelopes(d_msgs[d], d_msgs[o], d_app[d], d_app[o])
            # the job's segments this way, and at most one ACK for each it received
            frames_max = (segments(d_msgs[d]) + segments(d_msgs[o]) + grown(j, b, d_app, d_msgs, d)
                          + grown(j, b, d_app, d_msgs, o) + j["twice"][d] + eps_frames)
            # a segment TCP sent twice crossed the link twice: in the job, more payload;
            # in the baseline, less of what the job added
            lo = d_app[d] - eps - MSS * b["twice"][d]
            hi = d_app[d] + env + eps + MSS * j["twice"][d]
            good = lo <= payload <= hi and d_frames <= frames_max
            row.update({f"app_{d}": d_app[d], f"wire_{d}": d_wire, f"frames_{d}": d_frames,
                        f"payload_{d}": payload, f"messages_{d}": sum(d_msgs[d].values()),
                        f"twice_{d}": [j["twice"][d], b["twice"][d]],
                        f"ratio_{d}": d_wire / d_app[d] if d_app[d] else None,
                        f"payload_bound_{d}": [int(lo), int(hi)], f"frames_bound_{d}": int(frames_max),
                        f"bound_{d}": [int(lo), int(hi + FRAME * frames_max)], f"ok_{d}": good})
            ok &= good
        rows.append(row)
    tot = {d: (sum(r[f"wire_{d}"] for r in rows), sum(r[f"app_{d}"] for r in rows)) for d in ("sent", "recv")}
    return {"ok": ok, "hosts": rows,
            "ratio_sent": tot["sent"][0] / tot["sent"][1] if tot["sent"][1] > 0 else None,
            "ratio_recv": tot["recv"][0] / tot["recv"][1] if tot["recv"][1] > 0 else None,
            "rule": f"per host and direction, over the dry run: app - {eps} <= wire - {FRAME} x frames <= "
                    f"app + {ENVELOPE} B a message (above {FRAGMENT // 1024} KiB {ENVELOPE_LARGE} B) both ways + "
                    f"{ENVELOPE_SHARE:.1%} + {eps}; frames <= segments both ways + {eps_frames}; "
                    f"{MSS} B and a frame more per segment TCP sent twice"}


def table(proof: dict) -> str:
    """Per host and direction: what the job added over its dry run (app and wire bytes,
    their ratio), the payload's excess over app against what the rule allows, the
    frames against theirs, and the segments TCP sent twice (job/dry run)."""
    lines = ["what the job added over its dry run, per host and direction:",
             f"{'host':<14} {'ranks':<10} {'':4} {'app MB':>9} {'wire MB':>9} {'wire/app':>8}  "
             f"{'payload - app B (allowed)':<31} {'frames (allowed)':<19} {'twice':<7} ok"]
    for r in proof["hosts"]:
        for d in ("sent", "recv"):
            ratio = f"{r[f'ratio_{d}']:.3f}" if r[f"ratio_{d}"] is not None else "-"
            lo, hi = r[f"payload_bound_{d}"]
            excess = f"{r[f'payload_{d}'] - r[f'app_{d}']:+,} ({lo - r[f'app_{d}']:+,}..{hi - r[f'app_{d}']:+,})"
            frames = f"{r[f'frames_{d}']:,} (<= {r[f'frames_bound_{d}']:,})"
            twice = "/".join(map(str, r[f"twice_{d}"]))
            first = d == "sent"
            lines.append(f"{r['host'] if first else '':<14} "
                         f"{(','.join(map(str, r['ranks'])) or '-') if first else '':<10} "
                         f"{d:<4} {r[f'app_{d}'] / 1e6:>9,.3f} {r[f'wire_{d}'] / 1e6:>9,.3f} {ratio:>8}  "
                         f"{excess:<31} {frames:<19} {twice:<7} {'yes' if r[f'ok_{d}'] else 'NO'}")
    rs, rr = proof["ratio_sent"], proof["ratio_recv"]
    lines.append((f"all hosts: wire/app {rs:.3f} sent, {rr:.3f} received; " if rs and rr else
                  "no application bytes added; ") + f"rule: {proof['rule']}; {'PASS' if proof['ok'] else 'FAIL'}")
    return "\n".join(lines)
