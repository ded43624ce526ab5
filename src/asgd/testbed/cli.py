"""python -m asgd.testbed up | down | status | run: an emulated cluster on one machine.

  up      make H hosts (network namespaces with their own hostname and IPC), each with a
          veth into the data bridge, every such link shaped to RATE each way (tc tbf on
          both ends), optional latency (netem, where the kernel has it), and a veth into
          the control bridge (unshaped: the MPI launcher's traffic)
  run     run an MPI job across the hosts: `run [options] -- mpiexec -n N python -m
          asgd.train ...`; the ranks are placed by the launcher itself (MPICH hydra or
          Open MPI, through an ssh stand-in that enters a host's namespaces): servers on
          hosts of their own, workers round-robin (or --ranks-per-host) on the others
  status  the testbeds, their hosts, counters, qdiscs and the processes inside them
  down    remove everything of a testbed: processes inside it, namespaces, veths, qdiscs,
          bridge, state; idempotent, and also after a killed up or run

Needs root, iproute2 (ip, tc) and util-linux (nsenter, unshare). Only one job at a time
per testbed. State: /run/asgd-testbed/<name>/.

examples:
  python -m asgd.testbed up --hosts 4 --bandwidth 100mbit
  python -m asgd.testbed run --check-bytes -- mpiexec -n 4 python -m asgd.train --epochs 1
  python -m asgd.testbed run --ranks-per-host 2 -- mpiexec -n 5 python -m asgd.train
  python -m asgd.testbed down
"""

from __future__ import annotations

import argparse
import json
import sys

from ..run import signals
from . import batch, faults, lifecycle, slurm, state
from .sh import TestbedError
from .spec import format_rate, parse_rate


def _rate(text: str) -> int:
    try:
        return parse_rate(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asgd.testbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{up,down,status,run,fail,heal}")
    name_help = "testbed name, 1-6 lowercase letters or digits (default tb)"

    u = sub.add_parser("up", help="make a testbed", description="Make H hosts joined by shaped links.")
    u.add_argument("--hosts", type=int, required=True, help="number of hosts (namespaces)")
    u.add_argument("--bandwidth", type=_rate, required=True, metavar="RATE",
                   help="each link's rate, each direction, in tc's bit-rate units: 100mbit, 1gbit, 500kbit, "
                        "10mibit (byte rates such as 12mbps, 100MB/s and bare numbers are refused)")
    u.add_argument("--latency", type=float, default=0.0, metavar="US",
                   help="one-way host-to-host latency in microseconds, by netem (half on each end of "
                        "a link); where netem is not in the kernel it is not applied and up says so")
    u.add_argument("--subnet", help="first three octets of the /24 to use (default: a free 10.231.X)")
    u.add_argument("--name", default="tb", help=name_help)
    u.add_argument("--slurm", action="store_true",
                   help="also start a Slurm: slurmctld here, a slurmd on each host (NodeName = its hostname), "
                        "a private munged, one partition of all hosts; its traffic on the control network "
                        "(asgd.testbed.slurm). Clients: export SLURM_CONF=<state dir>/slurm/slurm.conf "
                        "(up and status print it)")
    u.add_argument("--slurm-cpus", type=int, default=None, metavar="N",
                   help="CPUs each Slurm node claims (default 4, with --slurm; more than the machine has is "
                        "allowed: the hosts share its cores)")

    d = sub.add_parser("down", help="remove a testbed (idempotent)",
                       description="Remove everything of a testbed, also after a killed up or run.")
    d.add_argument("--name", default="tb", help=name_help)
    d.add_argument("--all", action="store_true",
                   help="every asgd testbed on this machine (state directory or asgd-<name> objects), "
                        "including other users' testbeds: use with care")

    s = sub.add_parser("status", help="show testbeds")
    s.add_argument("--name", help="only this testbed")
    s.add_argument("--json", action="store_true", help="one JSON document")

    f = sub.add_parser("fail", help="lose a host mid-job (its links down, or its processes killed)",
                       description="Take a host away, as a node is lost on a cluster (asgd.testbed.faults).")
    f.add_argument("--name", default="tb", help=name_help)
    f.add_argument("--host", type=int, required=True, metavar="K", help="the host's index (0..H-1)")
    f.add_argument("--how", choices=faults.HOW, default="link",
                   help="link: both its links down, as a pulled cable (nothing reset, peers wait); kill: "
                        "SIGKILL every process in it (slurmd, slurmstepd, ranks), as a crashed node (default link)")
    h = sub.add_parser("heal", help="bring a failed host back (links up, its slurmd again)",
                       description="Links up again; the host's slurmd started again if it is gone.")
    h.add_argument("--name", default="tb", help=name_help)
    h.add_argument("--host", type=int, required=True, metavar="K", help="the host's index (0..H-1)")

    r = sub.add_parser("run", help="run an MPI job across the hosts",
                       description="run [options] -- mpiexec -n N python -m asgd.train [train options]",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--name", default="tb", help=name_help)
    r.add_argument("--servers", type=int, help="ranks 0..S-1 are servers, each on a host of its own "
                   "(default: asgd.train's --servers, 0 with --arch allreduce or for another program)")
    r.add_argument("--ranks-per-host", type=int, metavar="K",
                   help="workers in blocks of K per host (default: round-robin over the worker hosts)")
    r.add_argument("--check-bytes", action="store_true",
                   help="the byte proof: first the same job with --dry-run (the baseline: start-up and "
                        "end-of-run traffic), then the job; what the job added to each host's link must be "
                        "what its ranks counted in results.json, in TCP (asgd.testbed.proof); exit 3 if not")
    r.add_argument("--timeout", type=float, default=900, help="seconds before the job is killed (default 900)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- mpiexec -n N ...")
    return p


def _print_status(entries: list[dict]) -> None:
    if not entries:
        print("no testbeds")
    for e in entries:
        st = e["state"]
        if not st:
            print(f"{e['name']}: {e['status']}; objects: {', '.join(e.get('objects', [])) or 'none'}")
            continue
        lat = st.get("latency_applied_us") or 0
        print(f"{e['name']}: {e['status']}, {st['hosts']} hosts, {format_rate(st['rate_bit'])} each way per link, "
              f"latency {f'{lat:g} us (netem)' if lat else 'none added'}"
              + (" (asked for, netem unavailable)" if st.get("latency_us") and not lat else "")
              + f", subnet {st['subnet']}.0/24, control network {st.get('control', '?')}.0/24")
        for h in e["hosts"]:
            print(f"  {h['host']:<14} {h['ip']:<14} veth {h['veth']:<12} sent {h.get('sent_bytes', 0):>14,} B  "
                  f"received {h.get('recv_bytes', 0):>14,} B  qdisc {'+'.join(h.get('qdisc', [])) or '-'}  "
                  f"processes {h.get('processes', 0)}")
        if st.get("slurm"):
            sl = st["slurm"]
            print(f"  Slurm: partition {sl['partition']}, {sl['cpus']} CPUs a node, slurmctld port {sl['port']}: "
                  f"export SLURM_CONF={sl['conf']}")
        for prob in e["problems"]:
            print(f"  problem: {prob} (python -m asgd.testbed down --name {e['name']})")


def main(argv: list[str] | None = None) -> int:
    try:
        code = _command(parser().parse_args(argv))
        sys.stdout.flush()   # here, not at exit: a reader that left is seen inside the try
        return code
    except BrokenPipeError:
        return signals.reader_left()


def _command(a: argparse.Namespace) -> int:
    try:
        if a.command == "up":
            if a.slurm_cpus is not None and not a.slurm:
                raise ValueError("--slurm-cpus needs --slurm")
            lifecycle.up(a.name, a.hosts, a.bandwidth, a.latency, a.subnet,
                         slurm_cpus=(a.slurm_cpus or slurm.DEFAULT_CPUS) if a.slurm else None)
        elif a.command == "down":
            names = sorted(set(state.names()) | {e["name"] for e in lifecycle.status()}) if a.all else [a.name]
            for n in names:
                lifecycle.down(n)
        elif a.command in ("fail", "heal"):
            spec = lifecycle.Testbed.open(a.name).spec
            done = faults.fail(spec, a.host, a.how) if a.command == "fail" else faults.heal(spec, a.host)
            print(f"asgd.testbed: {a.command} {spec.host(a.host)}: "
                  + "; ".join(f"{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                              for k, v in done.items() if k != "host"))
        elif a.command == "status":
            entries = lifecycle.status(a.name)
            if a.json:
                print(json.dumps(entries, indent=1))
            else:
                _print_status(entries)
        else:
            cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
            tb = lifecycle.Testbed.open(a.name)
            if slurm.submit_kind(cmd):
                if a.servers is not None or a.ranks_per_host is not None:
                    raise ValueError("Slurm places a batch job's ranks (sbatch -N, -n, --ntasks-per-node): "
                                     "drop --servers and --ranks-per-host")
                job = batch.run(tb.spec, cmd, check_bytes=a.check_bytes, timeout=a.timeout)
                if job.rc:
                    return job.rc
                if job.proof is not None and not job.proof["ok"]:
                    print("asgd.testbed: the bytes on the links do not match results.json (see above)", file=sys.stderr)
                    return 3
                return 0
            res = tb.run(cmd, servers=a.servers, ranks_per_host=a.ranks_per_host, check_bytes=a.check_bytes,
                         timeout=a.timeout)
            if res.rc:
                return res.rc
            if res.proof is not None and not res.proof["ok"]:
                print("asgd.testbed: the bytes on the links do not match results.json (see above)", file=sys.stderr)
                return 3
    except (TestbedError, ValueError) as e:
        print(f"asgd.testbed: error: {e}", file=sys.stderr)
        return 2
    return 0
