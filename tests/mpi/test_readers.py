"""The readers inside one MPI job: mpiexec -n 4 python -m pytest --with-mpi tests/mpi
Every wait has a deadline; assertions come after the last collective (rank 0 checks
what every rank gathered), so a failure cannot leave the other ranks hanging."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from asgd.data import formats, problem, readers, shares
from asgd.data.formats import DataError
from asgd.mpiutil import Waiter, oversubscribed

pytestmark = pytest.mark.mpi(min_size=2)
comm = MPI.COMM_WORLD


def waiter():
    return Waiter(oversubscribed(comm), time.monotonic() + 60, f"rank {comm.rank}")


def written(path, write):
    """Rank 0 writes a file into the shared folder; every rank returns its name."""
    if comm.rank == 0:
        write(str(path))
    waiter().barrier(comm, "rank 0 to write the file")
    return str(path)


def run(path, reader, servers=1, seed=0, classes=None):
    """Every rank's (lines, X, y, test lines, test X, test y, train_points, classes) or
    its error message, gathered on rank 0 (None elsewhere)."""
    try:
        got = readers.load(comm, waiter(), path, None, reader, shares.Job(servers, seed, classes))
        mine = (got.lines, got.train.X, got.train.y, got.test_lines,
                None if got.test is None else got.test.X, None if got.test is None else got.test.y,
                got.train_points, got.train.classes)
    except DataError as e:
        mine = str(e)
    waiter().barrier(comm, "the other ranks")
    return comm.gather(mine, root=0)


def reference(path, classes=None):
    """X, y by the plain-Python reference parser (or np.load)."""
    if formats.is_binary(path):
        A = np.load(path)
        return A[:, :-1], A[:, -1].astype(np.int64)
    d = formats.read_tsv(path, classes)
    return d.X, d.y


def check_cover(shares, path, test_file, servers):
    """Rank 0: workers' shares are the file exactly once, in line order, with the file's
    values; servers hold nothing; the held-out set is the test file or the rest."""
    X, y = reference(path)
    n = len(y)
    assert all(isinstance(s, tuple) for s in shares), shares
    for r, (lines, Xr, yr, *_) in enumerate(shares):
        assert np.all(np.diff(lines) > 0)
        assert np.array_equal(Xr, X[lines]) and np.array_equal(yr, y[lines])
        if r < servers:
            assert len(lines) == 0
    held = shares[0][3]
    if test_file:
        tX, ty = reference(test_file, classes=1 << 30)  # any labels: it may hold one class
        assert np.array_equal(shares[0][4], tX) and np.array_equal(shares[0][5], ty)
        assert np.array_equal(held, np.arange(len(ty)))
        parts = [s[0] for s in shares]
    else:
        assert len(held) == n // 8
        assert np.array_equal(shares[0][4], X[held]) and np.array_equal(shares[0][5], y[held])
        parts = [s[0] for s in shares] + [held]
    everything = np.concatenate(parts)
    assert len(everything) == n and np.array_equal(np.sort(everything), np.arange(n))
    sizes = [len(s[0]) for s in shares[servers:]]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == shares[0][6]
    for s in shares[1:]:
        assert s[3] is None  # only rank 0 holds the held-out set


@pytest.mark.parametrize("fmt", ["tsv", "npy"])
@pytest.mark.parametrize("points, with_test, servers", [
    (1001, True, 1), (1001, False, 1), (9, False, 1), (3, True, 1), (500, False, 0), (500, True, 2)])
def test_shares_cover_the_file_exactly_once(mpi_tmp_path, fmt, points, with_test, servers):
    """Sizes that do not divide by the workers, fewer points than ranks, held out of the
    file or from a test file, 1 server, 2 servers, none (allreduce: rank 0 trains too)."""
    if servers >= comm.size:
        pytest.skip("needs a worker")
    out = str(mpi_tmp_path / f"d{points}{with_test}{servers}.{fmt}")

    def write(p):
        formats.write(p, problem.rings(points, 5, classes=3))
        if with_test:
            formats.write(formats.test_path(p), problem.rings(37, 6, classes=3))
    path = written(out, write)
    test_file = formats.test_path(path) if with_test else None
    seq, par = run(path, "sequential", servers), run(path, "parallel", servers)
    if comm.rank == 0:
        check_cover(seq, path, test_file, servers)
        check_cover(par, path, test_file, servers)
        for a, b in zip(seq, par):  # the same seeded assignment: the same shares
            assert np.array_equal(a[0], b[0])
        assert seq[0][7] == par[0][7] == 3  # classes


def wide(value: str, fields: int, label: int) -> str:
    return "\t".join([value] * (fields - 1) + [str(label)]) + "\n"


LAYOUTS = {
    "no final newline": "0.1\t0.2\t0\n0.3\t0.4\t1\n0.5\t0.6\t0",
    "crlf and trailing blanks": "".join(f"{i / 7:.5f}\t{i % 3}  \r\n" for i in range(200)) + "\r\n\n",
    "fewer lines than ranks": "0.1\t1\n0.2\t0\n",
    # line 1 (~480 KB) spans several ranks' ranges and ends far past the read margin
    "a line longer than ranges": wide("0.123456789", 40000, 1) + "".join(wide("0", 40000, i % 2) for i in range(4)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_lines_are_cut_right_whatever_the_layout(mpi_tmp_path, layout):
    content = LAYOUTS[layout]

    def write(p):
        open(p, "w").write(content)
        open(formats.test_path(p), "w").write(content.splitlines()[0] + "\n")
    path = written(mpi_tmp_path / f"{layout.replace(' ', '-')}.tsv", write)
    for reader in ("sequential", "parallel"):
        shares = run(path, reader)
        if comm.rank == 0:
            check_cover(shares, path, formats.test_path(path), 1)


def bad_file(defect_line: int, bad: str, n: int = 400) -> str:
    lines = [f"{i / n:.6f}\t{(i * 7 % 11) / 11:.6f}\t{i % 2}" for i in range(n)]
    lines[defect_line - 1] = bad
    return "\n".join(lines) + "\n"


BAD = {  # a defect in the first, a middle and the last rank's bytes, at a chunk's first line, ...
    "line 1": bad_file(1, "0.1\toops\t1"),   # numbers beside it: a bad line, not a header
    "middle, not a number": bad_file(201, "0.5\toops\t1"),
    "last line, fields": bad_file(400, "0.5\t1"),
    "every line after 100 has 2 fields": "".join(f"0.{i}\t0.5\t1\n" for i in range(100)) + "0.5\t1\n" * 300,
    "blank run then data": bad_file(150, "").replace("\n\n", "\n\n\n\n\n\n"),
    "a word among integer labels": bad_file(399, "0.5\t0.5\tx3"),
    "nan": bad_file(350, "0.5\tNaN\t1"),
    "all labels 0": "".join(f"0.{i}\t0.5\t0\n" for i in range(100)),
    "empty": "",
    "only blank lines": "\n \n\r\n",
}


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("reader", ["sequential", "parallel"])
def test_bad_file_same_message_on_every_rank(mpi_tmp_path, case, reader):
    path = written(mpi_tmp_path / f"{case.replace(' ', '-').replace(',', '')}.tsv",
                   lambda p: open(p, "w").write(BAD[case]))
    got = run(path, reader)
    if comm.rank == 0:
        with pytest.raises(DataError) as ref:
            X, y = reference(path)
            if y.max() < 1:
                raise DataError(f"{path}: all labels are 0; need at least 2 classes")
        assert got == [str(ref.value)] * comm.size


@pytest.mark.parametrize("reader", ["sequential", "parallel"])
def test_bad_binary_and_missing_files(mpi_tmp_path, reader):
    A = np.column_stack([problem.rings(300, 0).X, problem.rings(300, 0).y]).astype(np.float64)
    A[297, 1] = np.inf
    inf = written(mpi_tmp_path / "inf.npy", lambda p: np.save(p, A))
    cut = written(mpi_tmp_path / "cut.npy", lambda p: open(p, "wb").write(open(inf, "rb").read()[:-100]))
    expect = {inf: f"{inf}:298: column 2 is NaN or infinite",
              cut: "truncated",
              str(mpi_tmp_path / "missing.tsv"): f"{mpi_tmp_path / 'missing.tsv'}: data file not found",
              str(mpi_tmp_path / "missing.npy"): "data file not found"}
    results = {p: run(p, reader) for p in expect}
    if comm.rank == 0:
        for p, message in expect.items():
            got = results[p]
            assert len(set(got)) == 1 and isinstance(got[0], str) and message in got[0], (p, got)


def test_held_out_file_must_match(mpi_tmp_path):
    path = written(mpi_tmp_path / "m.tsv", lambda p: formats.write(p, problem.rings(100, 0)))
    test = written(mpi_tmp_path / "m.test.tsv", lambda p: open(p, "w").write("0.1\t0.2\t0.3\t1\n"))
    got = [run(path, r) for r in ("sequential", "parallel")]
    if comm.rank == 0:
        for g in got:
            assert g == [f"{test}: 3 features, but {path} has 2"] * comm.size
