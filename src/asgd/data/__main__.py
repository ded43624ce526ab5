"""python -m asgd.data generate | convert | check: make, rewrite and check data files.

    python -m asgd.data generate --points 16384 --out data.tsv --seed 0
writes the embedded problem (concentric rings) to data.tsv and its held-out companion
data.test.tsv (--format npy or --out data.npy: the binary format);
    python -m asgd.data convert IN OUT
rewrites one file in the format of OUT's extension (.npy binary, anything else TSV), the
label last, reading IN as asgd.train does (--label-column, --delimiter, --header, --classes);
    mpiexec -n N python -m asgd.data check data.tsv [data.npy ...] [--sizes 2,3,..] [--out DIR]
runs both readers on each file (with the first k ranks, for each k of --sizes) and checks
that the workers' shares are the file exactly once; --out keeps what they read. It reads
a file as asgd.train does, with the same --label-column, --delimiter, --header, --classes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .dialect import add_file_options, delimiter_option, index_notes
from .formats import DataError, is_binary, test_path, write
from .labels import notes
from .problem import DEFAULT_POINTS, rings

from . import READERS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asgd.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write the synthetic rings problem as TSV or .npy")
    g.add_argument("--points", type=int, default=DEFAULT_POINTS, help="training points (default %(default)s)")
    g.add_argument("--test-points", type=int, default=None,
                   help="held-out points written to <out stem>.test.<ext> (default: points/4)")
    g.add_argument("--classes", type=int, default=2, help="number of rings/classes (default %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    g.add_argument("--out", required=True, help="output file, e.g. data.tsv or data.npy")
    g.add_argument("--format", choices=("tsv", "npy"),
                   help="tsv or npy (default: from --out's extension; must agree with it)")
    c = sub.add_parser("convert", help="rewrite a data file in the other format (by extension)")
    c.add_argument("input", metavar="IN", help="a .tsv/.txt or .npy data file")
    c.add_argument("output", metavar="OUT", help="the file to write: .npy for binary, else TSV")
    add_file_options(c.add_argument_group("reading IN (as asgd.train --data IN reads it)"))
    k = sub.add_parser("check", help="(under mpiexec) read FILEs with the readers and check that "
                       "the shares cover them exactly once")
    k.add_argument("files", nargs="+", metavar="FILE", help=".tsv/.txt or .npy data files")
    k.add_argument("--reader", default=",".join(READERS), help="comma list (default: both)")
    k.add_argument("--seed", type=int, default=0)
    add_file_options(k.add_argument_group("reading FILE (as asgd.train --data FILE reads it)"))
    k.add_argument("--servers", type=int, default=1, help="ranks that hold no training points (default 1)")
    k.add_argument("--sizes", help="comma list of world sizes to check on the job's first ranks "
                   "(one launch covers many; default: the job's size)")
    k.add_argument("--timeout", type=float, default=0.0, help="seconds before a wait is an error")
    k.add_argument("--standardize", action="store_true",
                   help="also compute the feature statistics as asgd.train --standardize does (into --out's files)")
    k.add_argument("--out", help="write DIR/<file stem>-<reader>-n<size>.npz: every rank's lines, X, y")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if a.cmd == "check":
        return check(a)
    try:
        if a.cmd == "convert":
            from .parse import read_file  # the fast parser: numba, loaded by the commands that parse only
            try:
                delimiter = delimiter_option(a.delimiter)
            except ValueError as e:
                raise DataError(str(e)) from None
            d = read_file(a.input, a.classes, delimiter, a.header, a.label_column)
            write(a.output, d)
            print(f"wrote {len(d)} points from {a.input} to {a.output}")
            if d.names:   # OUT holds numbers only: the names are lost but for this line
                print(f"labels written as class indices: {class_names(d.names)}")
            return 0
        if a.format and (a.format == "npy") != is_binary(a.out):
            raise DataError(f"--format {a.format} needs --out to end in "
                            f"{'.npy' if a.format == 'npy' else 'something else than .npy, e.g. .tsv'}")
        test_points = a.test_points if a.test_points is not None else max(1, a.points // 4)
        train, test = rings(a.points, a.seed, a.classes), rings(test_points, a.seed + 1, a.classes)
        write(a.out, train)
        write(test_path(a.out), test)
    except (DataError, OSError) as e:
        print(f"asgd.data: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(train)} points to {a.out} and {len(test)} to {test_path(a.out)}")
    return 0


def class_names(names, shown: int = 10) -> str:
    """'0 Adelie, 1 Chinstrap, 2 Gentoo'; for many classes the first few and a count."""
    text = ", ".join(f"{k} {n}" for k, n in enumerate(names[:shown]))
    return text + (f", ... ({len(names)} classes)" if len(names) > shown else "")


def check(a) -> int:
    """mpiexec ... check: both readers on every file and size; exit 1 if a cover fails."""
    # here: only `check` runs under MPI, and importing mpi4py (these modules do) initializes it
    from mpi4py import MPI

    from ..mpiutil import Waiter, agree_on, once_per_node, oversubscribed
    from . import parse, readers, shares, standardize
    world = MPI.COMM_WORLD
    try:
        sizes = [int(k) for k in a.sizes.split(",")] if a.sizes else [world.size]
    except ValueError:
        sizes = []
    names = [r for r in a.reader.split(",") if r]
    try:
        job = shares.Job(a.servers, a.seed, a.classes, 1, delimiter_option(a.delimiter), a.header, a.label_column)
    except ValueError as e:
        if world.rank == 0:
            print(f"asgd.data check: error: {e}", file=sys.stderr)
        return 2
    if not sizes or any(not a.servers < k <= world.size for k in sizes) or any(r not in READERS for r in names):
        if world.rank == 0:
            print(f"asgd.data check: error: sizes must be in {a.servers + 1}..{world.size} and readers in "
                  f"{READERS}", file=sys.stderr)
        return 2
    waiter = Waiter(oversubscribed(world), time.monotonic() + a.timeout if a.timeout else 0.0,
                    f"rank {world.rank}")
    def load(first):   # the readers' numba kernels, one rank per node first (a cold cache compiles once)
        parse.compile_parsers()
        shares.assign(3, 0, 1, 1, False)
    error = once_per_node(world, waiter, load, "load the parsers")
    try:
        agree_on(world, waiter, error, "the other ranks to load the parsers")
    except RuntimeError as e:
        if world.rank == 0:
            print(f"asgd.data check: error: {e}", file=sys.stderr)
        return 1
    ok = True
    for k in sizes:
        comm = world.Split(0 if world.rank < k else MPI.UNDEFINED)  # the first k ranks
        for path in a.files if comm != MPI.COMM_NULL else []:
            for reader in names:
                try:
                    got = readers.load(comm, waiter, path, None, reader, job)
                except DataError as e:
                    if comm.rank == 0:
                        print(f"asgd.data check: error: {e}", file=sys.stderr)
                    return 2
                scaling = standardize.statistics(comm, waiter, got.train.X) if a.standardize else None
                waiter.barrier(comm, "the other ranks")
                gathered = comm.gather((got.lines, got.train.X, got.train.y, got.times), root=0)
                if comm.rank == 0:
                    ok &= _report(path, reader, got, gathered, a.servers, a.out, scaling)
        if comm != MPI.COMM_NULL:
            comm.Free()
        waiter.barrier(world, "the ranks of the last size")
    return 0 if ok else 1


def _report(path, reader, got, shares, servers, out, scaling=None) -> bool:
    """Rank 0: do the workers' shares (and a held-out part of the file) cover the file
    exactly once, with servers holding nothing? Print a line; save the arrays."""
    held_from_file = not os.path.exists(test_path(path))
    parts = [s[0] for s in shares] + ([got.test_lines] if held_from_file else [])
    lines = np.concatenate(parts)
    n = got.train_points + (len(got.test_lines) if held_from_file else 0)
    exact = (len(lines) == n and np.array_equal(np.sort(lines), np.arange(n))
             and not any(len(s[0]) for s in shares[:servers]))
    sizes = [len(s[0]) for s in shares[servers:]]
    slowest = {k: max(s[3][k] for s in shares) for k in shares[0][3]}
    print(f"{path} {reader} n={len(shares)}: {got.train_points} training points, {len(got.test)} held out; worker "
          f"shares {min(sizes)}..{max(sizes)}; exact cover {'ok' if exact else 'FAILED'}; slowest rank "
          + ", ".join(f"{k} {v:.3f} s" for k, v in slowest.items()), flush=True)
    for note in index_notes(got.dialect, path):   # a row index (pandas' to_csv) read as a feature
        print(f"asgd.data check: note: {note}", flush=True)
    if got.labels is not None:   # label values that may be no class: every row's, the held-out ones too
        k = got.train.classes
        counts = sum(np.bincount(s[2], minlength=k) for s in shares) + np.bincount(got.test.y, minlength=k)
        for note in notes(got.labels, counts, path if held_from_file else f"{path} and {test_path(path)}"):
            print(f"asgd.data check: note: {note}", flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        stem = os.path.splitext(os.path.basename(path))[0]
        arrays = {f"{k}{r}": s[i] for r, s in enumerate(shares) for i, k in enumerate(("lines", "X", "y"))}
        np.savez(os.path.join(out, f"{stem}-{reader}-n{len(shares)}.npz"), train_points=got.train_points,
                 world=len(shares), servers=servers, held_from_file=held_from_file,
                 test_lines=got.test_lines, test_X=got.test.X, test_y=got.test.y,
                 classes=got.train.classes, **arrays,
                 **({"mean": scaling[0], "std": scaling[1]} if scaling else {}))
    return exact


if __name__ == "__main__":
    sys.exit(main())
