import re

import numpy as np
import pytest

from asgd.data import formats, problem
from asgd.data import __main__ as data_cli
from asgd.data.formats import DataError


def test_rings_is_determined_by_seed():
    a, b, c = problem.rings(1000, 7), problem.rings(1000, 7), problem.rings(1000, 8)
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X)


def test_rings_balanced_with_margin_and_not_linearly_separable():
    d = problem.rings(20000, 0)
    assert d.features == 2 and d.classes == 2
    assert abs(np.mean(d.y) - 0.5) < 0.01
    r = np.hypot(d.X[:, 0], d.X[:, 1])
    # class 0 is the inner disk, class 1 the outer ring, with an empty gap between
    assert r[d.y == 0].max() < r[d.y == 1].min()
    # least-squares linear classifier: no better than chance on rings
    A = np.column_stack([d.X, np.ones(len(d))])
    coef, *_ = np.linalg.lstsq(A, 2.0 * d.y - 1, rcond=None)
    assert np.mean((A @ coef > 0) == d.y) < 0.6
    # ... while the radius alone separates them perfectly (best accuracy 1.0)
    assert np.mean((r > 0.5) == d.y) == 1.0


def test_default_problem_sizes():
    train, test = problem.default_problem()
    assert (len(train), len(test)) == (16384, 4096)
    assert not np.array_equal(train.X[:10], test.X[:10])


def test_tsv_roundtrip_is_exact(tmp_path):
    d = problem.rings(300, 3, classes=3)
    p = tmp_path / "d.tsv"
    formats.write_tsv(str(p), d)
    line = p.read_text().splitlines()[0].split("\t")
    assert len(line) == 3 and line[-1].isdigit()
    back = formats.read_tsv(str(p))
    assert np.array_equal(back.X, d.X) and np.array_equal(back.y, d.y) and back.classes == 3


def test_generate_cli_writes_train_and_test(tmp_path, capsys):
    out = tmp_path / "data.tsv"
    assert data_cli.main(["generate", "--points", "100", "--out", str(out), "--seed", "0"]) == 0
    assert len(out.read_text().splitlines()) == 100
    assert len((tmp_path / "data.test.tsv").read_text().splitlines()) == 25
    again = tmp_path / "again.tsv"
    data_cli.main(["generate", "--points", "100", "--out", str(again), "--seed", "0"])
    assert again.read_text() == out.read_text()


def test_crlf_and_trailing_whitespace_accepted(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_bytes(b"0.5\t-1.25\t0 \r\n1e-3\t2\t1\t\r\n\r\n")
    d = formats.read_tsv(str(p))
    assert d.X.tolist() == [[0.5, -1.25], [1e-3, 2.0]] and d.y.tolist() == [0, 1]


@pytest.mark.parametrize("content, message", [
    ("", "empty data file"),
    ("0.1\t0.2\t0\n0.3\t1\n", ":2: expected 3 fields"),
    ("0.1\t0.2\t0\n0.3\tabc\t1\n", ":2: column 2: 'abc' is not a number"),
    ("0.1\t0.2\t0\n0.3\tnan\t1\n", ":2: column 2 is NaN or infinite"),
    ("0.1\t0.2\t0\n0.3\tinf\t1\n", ":2: column 2 is NaN or infinite"),
    ("0.1\t0.2\t0\n0.3\t0.4\t1.5\n", "looks like a measurement, not classes: numbers with decimals"),
    ("0.1\t0.2\t0\n\n0.3\t0.4\t1\n", ":2: empty line"),
    ("x\ty\tlabel\n0.1\t0.2\t0\n0.3\tq\t1\n", ":3: column 2 ('y'): 'q' is not a number"),
    ("0.1\t0.2\t0\n0.3\t0.4\t0\n", "need at least 2 classes"),
    ("0.5\n", ":1: need at least one feature and a label"),
])
def test_bad_input_names_file_and_line(tmp_path, content, message):
    p = tmp_path / "bad.tsv"
    p.write_text(content)
    with pytest.raises(DataError, match=re.escape(message)) as e:
        formats.read_tsv(str(p))
    assert str(p) in str(e.value)


def test_label_out_of_range_for_classes(tmp_path):
    p = tmp_path / "d.tsv"
    p.write_text("0.1\t0.2\t0\n0.3\t0.4\t2\n")
    with pytest.raises(DataError, match=":2: label 2 out of range for --classes 2"):
        formats.read_tsv(str(p), classes=2)
    assert formats.read_tsv(str(p)).classes == 3


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        formats.read_tsv(str(tmp_path / "nope.tsv"))


def test_shape_of_a_file_is_what_asgd_train_finds(tmp_path):
    """(features, classes) without parsing the features, for the model's predictions of a
    file: a .npy's, a .npz's and a text file's, integer labels (max + 1) or names."""
    rng = np.random.default_rng(0)
    d = formats.Dataset(rng.standard_normal((50, 64)), np.r_[rng.integers(0, 9, 49), 9], 10)
    for name in ("d.npy", "d.tsv"):
        formats.write(str(tmp_path / name), d)
        assert formats.shape_of(str(tmp_path / name)) == (64, 10)
    np.savez(tmp_path / "d.npz", X=d.X, y=d.y)
    assert formats.shape_of(str(tmp_path / "d.npz")) == (64, 10)
    named = tmp_path / "named.csv"
    named.write_text("a,kind,b\n1.0,cat,2\n3,dog,4\n5,cat,6\n")
    assert formats.shape_of(str(named), "kind") == (2, 2)
    with pytest.raises(DataError, match="data file not found"):
        formats.shape_of(str(tmp_path / "none.tsv"))
