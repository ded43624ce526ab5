"""The fast parser (numba over raw bytes) against the reference parser formats.read_tsv,
whole and cut into chunks as the parallel reader cuts it; the .npy format; the CLI."""

import numpy as np
import pytest

from asgd.data import parse
from asgd.run import config
from asgd.data import formats, problem
from asgd.data import __main__ as data_cli
from asgd.data.formats import DataError

# one defect each: the fast parser must name the same line with the same message
BAD = [
    ("", "empty data file"),
    ("\n\n \n", "empty data file"),
    ("0.1\t0.2\t0\n0.3\t1\n", ":2: expected 3 fields like line 1, got 2"),
    ("0.1\t0.2\t0\n0.3\t0.4\t1\t7\n", ":2: expected 3 fields like line 1, got 4"),
    ("0.1\t0.2\t0\n0.3\tabc\t1\n", ":2: feature 'abc' is not a number"),
    ("0.1\t0.2\t0\n0.3\t1e\t1\n", ":2: feature '1e' is not a number"),
    ("0.1\t0.2\t0\n0.3\t--1\t1\n", ":2: feature '--1' is not a number"),
    ("0.1\t0.2\t0\n0.3\tnan\t1\n", ":2: feature is NaN or infinite"),
    ("0.1\t0.2\t0\n0.3\t-Infinity\t1\n", ":2: feature is NaN or infinite"),
    ("0.1\t0.2\t0\n0.3\t1e999\t1\n", ":2: feature is NaN or infinite"),
    ("0.1\t0.2\t0\n0.3\t0.4\t-1\n", ":2: negative label -1"),
    ("0.1\t0.2\t0\n0.3\t0.4\t1.5\n", ":2: label '1.5' is not an integer"),
    ("0.1\t0.2\t0\n0.3\t0.4\t+1\n", ":2: label '+1' is not an integer"),
    ("0.1\t0.2\t0\n\n0.3\t0.4\t1\n", ":2: empty line"),
    ("0.1\t0.2\t0\n \t\r\n0.3\t0.4\t1\n", ":2: empty line"),
    ("x\ty\tlabel\n0.1\t0.2\t0\n", ":1: feature 'x' is not a number"),
    ("0.1\t0.2\t0\n0.3\t0.4\t0\n", "all labels are 0; need at least 2 classes"),
    ("0.5\n", ":1: need at least one feature and a label, got 1 field(s)"),
    ("0.1\t0.2\t0\n0.3\t\xe9\t1\n", ":2: not a text file (byte 0xe9)"),
]
GOOD = [
    "0.5\t-1.25\t0 \r\n1e-3\t2\t1\t\r\n\r\n",      # CRLF, trailing blanks and a blank line at the end
    "1.\t.5\t0\n+3\t-0\t1\n1E+05\t2e-5\t01\n",     # every spelling float() and int() take
    "0.1 0.2  1\n0.3\t\t0.4 0",                     # any white space; no final newline
]


def fast(path, content: bytes, classes=None):
    """What the sequential reader does with a whole file."""
    buf = np.frombuffer(content + b"\n", np.uint8).copy()
    X, y, max_label = parse.parse_bytes(str(path), buf, classes)
    if (classes or max_label + 1) < 2:
        raise DataError(f"{path}: all labels are 0; need at least 2 classes")
    return X, y


def chunked(path, content: bytes, P: int, classes=None):
    """What P ranks of the parallel reader find: rank k owns the lines that start in
    its byte range [k*size/P, (k+1)*size/P) (cut independently of readers.py)."""
    buf = np.frombuffer(content + b"\n", np.uint8).copy()
    size = len(content)
    chunks, parts = [], []
    for k in range(P):
        s, e = k * size // P, (k + 1) * size // P
        lo = hi = 0
        if e > s:
            j = -1 if s == 0 else content.find(b"\n", s - 1)  # my first line starts at j + 1 ...
            if s == 0 or 0 <= j < e - 1:                       # ... if that is inside [s, e)
                lo = j + 1
                end = content.find(b"\n", e - 1)              # my last line ends at the first
                hi = size if end < 0 else end + 1              # '\n' at or after e - 1
        X, y, info = parse.parse_text(buf, lo, hi, classes or 0)
        chunks.append(parse.summarize(info, buf, classes=classes or 0))
        parts.append((X, y))
    offsets, n, features, max_label = parse.resolve(str(path), chunks)
    X = np.concatenate([p[0].reshape(-1, features) for p in parts])  # a chunk with no line: (0, 0)
    return X, np.concatenate([p[1] for p in parts]), offsets


@pytest.mark.parametrize("content, message", BAD)
def test_fast_parser_names_the_same_line_as_the_reference(tmp_path, content, message):
    p = tmp_path / "bad.tsv"
    raw = content.encode("latin-1")
    p.write_bytes(raw)
    with pytest.raises(DataError) as ref:
        formats.read_tsv(str(p))
    with pytest.raises(DataError) as got:
        fast(p, raw)
    assert str(got.value) == str(ref.value) and message in str(got.value)


@pytest.mark.parametrize("P", [2, 3, 5, 8])
@pytest.mark.parametrize("content, message", [c for c in BAD if c[0]])
def test_chunks_agree_on_the_first_bad_line(tmp_path, content, message, P):
    """Wherever the cuts fall (a bad line at a chunk's start, a blank run at a chunk's
    end with data in the next, line 1 alone in a chunk), the verdict is the whole file's."""
    p = tmp_path / "bad.tsv"
    raw = content.encode("latin-1")
    with pytest.raises(DataError) as whole:
        fast(p, raw)
    with pytest.raises(DataError) as got:
        X, y, _ = chunked(p, raw, P)
        if y.max() < 1:
            raise DataError(f"{p}: all labels are 0; need at least 2 classes")
    assert str(got.value) == str(whole.value)


@pytest.mark.parametrize("content", GOOD)
@pytest.mark.parametrize("P", [1, 2, 3, 7])
def test_fast_parser_values_equal_the_reference(tmp_path, content, P):
    p = tmp_path / "good.tsv"
    p.write_text(content)
    ref = formats.read_tsv(str(p))
    X, y, _ = chunked(p, content.encode(), P)
    assert X.tolist() == ref.X.tolist() and y.tolist() == ref.y.tolist()


def test_values_are_bit_identical_and_lines_numbered(tmp_path):
    d = problem.rings(5000, 3, classes=3)
    d.X[:10] = [[1e-310, -0.0], [5e-324, 1.7976931348623157e308]] * 5  # subnormals, extremes
    p = tmp_path / "d.tsv"
    formats.write_tsv(str(p), d)
    raw = p.read_bytes()
    for P in (1, 4, 9):
        X, y, offsets = chunked(p, raw, P)
        assert np.array_equal(X, d.X) and np.array_equal(y, d.y)
        # a chunk's first point is line offsets[k] of the file
        starts = [0] + [raw.count(b"\n", 0, raw.find(b"\n", k * len(raw) // P - 1) + 1) for k in range(1, P)]
        assert offsets.tolist() == starts


def test_label_bounds(tmp_path):
    p = tmp_path / "d.tsv"
    with pytest.raises(DataError, match=r":2: label 2 out of range for --classes 2"):
        fast(p, b"0.1\t0\n0.2\t2\n", classes=2)
    with pytest.raises(DataError, match=r":2: label '99999999999' is too large"):
        fast(p, b"0.1\t0\n0.2\t99999999999\n")
    X, y = fast(p, b"0.1\t0\n0.2\t0000000000000001\n")  # leading zeros are not size
    assert y.tolist() == [0, 1]


# -- .npy -----------------------------------------------------------------------------

def test_generate_npy_and_convert_roundtrip(tmp_path, capsys):
    npy, tsv = tmp_path / "d.npy", tmp_path / "back.tsv"
    assert data_cli.main(["generate", "--points", "300", "--classes", "3", "--format", "npy", "--out", str(npy)]) == 0
    assert (tmp_path / "d.test.npy").exists()
    d = problem.rings(300, 0, classes=3)
    A = np.load(npy)
    assert A.dtype == np.float64 and A.shape == (300, 3)
    assert np.array_equal(A[:, :2], d.X) and np.array_equal(A[:, 2], d.y)
    assert data_cli.main(["convert", str(npy), str(tsv)]) == 0
    back = formats.read_tsv(str(tsv))
    assert np.array_equal(back.X, d.X) and np.array_equal(back.y, d.y)
    assert data_cli.main(["convert", str(tsv), str(tmp_path / "again.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "again.npy"), A)
    assert data_cli.main(["generate", "--format", "npy", "--out", str(tmp_path / "x.tsv")]) == 2
    assert "--format npy needs --out to end in .npy" in capsys.readouterr().err
    (tmp_path / "bad.tsv").write_text("0.1\t0\n0.2\tzz\n")
    assert data_cli.main(["convert", str(tmp_path / "bad.tsv"), str(tmp_path / "bad.npy")]) == 2
    assert f"{tmp_path / 'bad.tsv'}:2: label 'zz' is not an integer" in capsys.readouterr().err
    assert not (tmp_path / "bad.npy").exists()


@pytest.mark.parametrize("array, message", [
    (np.array([[0.1, 0.0], [0.2, 1.5]]), ":2: label 1.5 is not an integer"),
    (np.array([[0.1, 0.0], [np.nan, 1.0]]), ":2: feature is NaN or infinite"),
    (np.array([[0.1, 0.0], [0.2, -1.0]]), ":2: negative label -1"),
    (np.zeros((0, 3)), "empty data file"),
    (np.zeros((4, 1)), "need at least one feature and a label, got 1 column(s)"),
    (np.zeros((4, 3), np.float32), "expected a 2-D float64 array"),
    (np.zeros(4), "expected a 2-D float64 array"),
    (np.asfortranarray(np.zeros((4, 3))), "in Fortran order"),
])
def test_bad_npy_names_file_and_row(tmp_path, array, message):
    p = tmp_path / "bad.npy"
    np.save(p, array)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        parse.read_file(str(p))
    assert str(p) in str(e.value)


def test_truncated_or_foreign_npy(tmp_path):
    p = tmp_path / "t.npy"
    np.save(p, np.zeros((100, 3)))
    p.write_bytes(p.read_bytes()[:-8])
    with pytest.raises(DataError, match="truncated"):
        formats.npy_header(str(p))
    p.write_bytes(b"0.1\t0.2\t1\n")
    with pytest.raises(DataError, match="not a .npy file"):
        formats.npy_header(str(p))
    with pytest.raises(DataError, match="data file not found"):
        formats.npy_header(str(tmp_path / "none.npy"))


def test_reader_option():
    assert config.parse([], 4).reader == "parallel"
    assert config.parse(["--reader", "sequential"], 4).reader == "sequential"
    with pytest.raises(config.ConfigError, match="invalid choice: 'fast'"):
        config.parse(["--reader", "fast"], 4)
