"""The fast parser (numba over raw bytes) against the reference parser formats.read_tsv,
whole and cut into chunks as the parallel reader cuts it; the .npy format; the CLI."""

import numpy as np
import pytest

from asgd.data import labels as lab
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
    ("0.1\t0.2\t0\n0.3\tabc\t1\n", ":2: column 2: 'abc' is not a number"),
    ("0.1\t0.2\t0\n0.3\t1e\t1\n", ":2: column 2: '1e' is not a number"),
    ("0.1\t0.2\t0\n0.3\t--1\t1\n", ":2: column 2: '--1' is not a number"),
    ("0.1\t0.2\t0\n0.3\tnan\t1\n", ":2: column 2 is NaN or infinite"),
    ("0.1\t0.2\t0\n0.3\t-Infinity\t1\n", ":2: column 2 is NaN or infinite"),
    ("0.1\t0.2\t0\n0.3\t1e999\t1\n", ":2: column 2 is NaN or infinite"),
    ("0.1\t0.2\t0\n\n0.3\t0.4\t1\n", ":2: empty line"),
    ("0.1\t0.2\t0\n \t\r\n0.3\t0.4\t1\n", ":2: empty line"),
    ("x\ty\tlabel\n0.1\t0.2\t0\n", "all labels are 0; need at least 2 classes"),   # a header: one row
    ("0.1\t0.2\t0\n0.3\t0.4\t0\n", "all labels are 0; need at least 2 classes"),
    ("0.5\n", ":1: need at least one feature and a label, got 1 field(s)"),
    ("0.1\t0.2\t0\n0.3\t\xe9\t1\n", ":2: not a text file (byte 0xe9)"),
    # CSV and the other dialects: the line and the column, by name when there is a header
    ("a,b,c\n1,,0\n3,4,1\n", ":2: column 2 ('b') is empty; asgd needs every value: drop or fill the rows"),
    ("a,b,c\n1,2,0\n3,NA,1\n", ":3: column 2 ('b') is 'NA': a missing value"),
    ("a\tb\tc\n1\t\t0\n3\t4\t1\n", ":2: column 2 ('b') is empty"),                 # tabs do not merge
    ("a;b;c\n1;2;0\n3;nan;1\n", ":3: column 2 ('b') is NaN or infinite"),
    ("a;b;c\n1;2;0\n3;12,77;1\n", ":3: column 2 ('b'): '12,77' is not a number (a decimal comma? asgd reads '.' "
                                   "decimals)"),   # a European spreadsheet's CSV
    ("a,b,c\n1,2,0\n3,4\n5,6,1\n", ":3: expected 3 fields like the header, got 2"),
    ("a,b,c\n1,2,0\n3,4,1,\n", ":3: expected 3 fields like the header, got 4"),
    ("a,b,c\n1,2,\n3,4,1\n", ":2: the label, column 3 ('c'), is empty"),
    ("a,b,c\n1,2,0\n3,4,NA\n", ":3: the label, column 3 ('c', the last), is 'NA': a missing value; drop"),
    ("1 2 0\n3 4 1\n5 x 1\n", ":3: column 2: 'x' is not a number"),
]
GOOD = [
    "0.5\t-1.25\t0 \r\n1e-3\t2\t1\t\r\n\r\n",      # CRLF, trailing blanks and a blank line at the end
    "1.\t.5\t0\n+3\t-0\t1\n1E+05\t2e-5\t01\n",     # every spelling float() and int() take
    "0.1 0.2  1\n0.3\t\t0.4 0",                     # any white space; no final newline
    "x,y,label\r\n0.5, -1.25 ,0\r\n1e-3,2,1\r\n",   # CSV with a header, blanks around fields
    '"x";"y";"label"\n0.5;"2";"b"\n1;2;a\n',         # semicolons, quoted fields, names as labels
    "0.5|1|-1\n2|3|+1\n",                          # signed labels are names
]


def fast(path, content: bytes, classes=None, **dialect):
    """What the sequential reader does with a whole file."""
    path.write_bytes(content)
    return parse.read_file(str(path), classes, **dialect)


def chunked(path, content: bytes, P: int, classes=None, **dialect):
    """What P ranks of the parallel reader find: rank k owns the lines that start in
    its byte range of the data [start + k*n/P, start + (k+1)*n/P) (cut independently of
    readers.py), n the bytes after the header."""
    path.write_bytes(content)
    d = formats.dialect_of(str(path), **dialect)
    if d.columns == 0:
        raise DataError(f"{path}: empty data file")
    buf = np.frombuffer(content + b"\n", np.uint8).copy()
    size, start = len(content), d.start
    chunks, parts = [], []
    for k in range(P):
        s, e = start + k * (size - start) // P, start + (k + 1) * (size - start) // P
        lo = hi = 0
        if e > s:
            j = start - 1 if s == start else content.find(b"\n", s - 1)  # my first line starts at j + 1 ...
            if s == start or 0 <= j < e - 1:                           # ... if that is inside [s, e)
                lo = j + 1
                end = content.find(b"\n", e - 1)                      # my last line ends at the first
                hi = size if end < 0 else end + 1                      # '\n' at or after e - 1
        X, codes, summary = parse.parse_chunk(buf, lo, hi, d, classes)
        chunks.append(summary)
        parts.append((X, codes))
    offsets, n, fl = parse.resolve(str(path), d, chunks)
    labels = lab.decide(str(path), d, fl, n, classes)
    X = np.concatenate([p[0].reshape(-1, d.features) for p in parts])  # a chunk with no line: (0, 0)
    return X, np.concatenate([p[1].classes(labels) for p in parts]), offsets, labels


@pytest.mark.parametrize("content, message", BAD)
def test_fast_parser_names_the_same_line_as_the_reference(tmp_path, content, message):
    p = tmp_path / "bad.csv"
    raw = content.encode("latin-1")
    p.write_bytes(raw)
    with pytest.raises(DataError) as ref:
        formats.read_text(str(p))
    with pytest.raises(DataError) as got:
        fast(p, raw)
    assert str(got.value) == str(ref.value) and message in str(got.value)


@pytest.mark.parametrize("P", [2, 3, 5, 8])
@pytest.mark.parametrize("content, message", [c for c in BAD if c[0]])
def test_chunks_agree_on_the_first_bad_line(tmp_path, content, message, P):
    """Wherever the cuts fall (a bad line at a chunk's start, a blank run at a chunk's
    end with data in the next, line 1 alone in a chunk), the verdict is the whole file's."""
    p = tmp_path / "bad.csv"
    raw = content.encode("latin-1")
    with pytest.raises(DataError) as whole:
        fast(p, raw)
    with pytest.raises(DataError) as got:
        chunked(p, raw, P)
    assert str(got.value) == str(whole.value)


@pytest.mark.parametrize("content", GOOD)
@pytest.mark.parametrize("P", [1, 2, 3, 7])
def test_fast_parser_values_equal_the_reference(tmp_path, content, P):
    p = tmp_path / "good.csv"
    p.write_text(content)
    ref = formats.read_text(str(p))
    X, y, _, labels = chunked(p, content.encode(), P)
    assert X.tolist() == ref.X.tolist() and y.tolist() == ref.y.tolist()
    assert labels.names == ref.names and labels.classes == ref.classes


def test_values_are_bit_identical_and_lines_numbered(tmp_path):
    d = problem.rings(5000, 3, classes=3)
    d.X[:10] = [[1e-310, -0.0], [5e-324, 1.7976931348623157e308]] * 5  # subnormals, extremes
    p = tmp_path / "d.tsv"
    formats.write_tsv(str(p), d)
    raw = p.read_bytes()
    for P in (1, 4, 9):
        X, y, offsets, _ = chunked(p, raw, P)
        assert np.array_equal(X, d.X) and np.array_equal(y, d.y)
        # a chunk's first point is line offsets[k] of the file
        starts = [0] + [raw.count(b"\n", 0, raw.find(b"\n", k * len(raw) // P - 1) + 1) for k in range(1, P)]
        assert offsets.tolist() == starts


def test_label_bounds(tmp_path):
    p = tmp_path / "d.tsv"
    with pytest.raises(DataError, match=r":2: label 2 out of range for --classes 2"):
        fast(p, b"0.1\t0\n0.2\t2\n", classes=2)
    d = fast(p, b"0.1\t0\n0.2\t0000000000000001\n")  # leading zeros are not size
    assert d.y.tolist() == [0, 1] and d.names is None
    d = fast(p, b"0.1\t0\n0.2\t99999999999\n")       # past an index's range: a name
    assert d.names == ("0", "99999999999") and d.y.tolist() == [0, 1]


# -- what the label column holds --------------------------------------------------------

PENGUINS = ("species,bill_length_mm,bill_depth_mm,year\n"
            + "".join(f"{s},{39 + i % 7}.{i % 10},{18 + i % 3}.1,{2007 + i % 3}\n"
                      for i, s in enumerate(["Adelie", "Gentoo", "Chinstrap"] * 10)))


@pytest.mark.parametrize("reader", ["reference", "fast"])
def test_a_string_label_first_by_name(tmp_path, reader):
    p = tmp_path / "penguins.csv"
    p.write_text(PENGUINS)
    read = formats.read_text if reader == "reference" else parse.read_file
    d = read(str(p), label_column="species")
    assert d.names == ("Adelie", "Chinstrap", "Gentoo") and d.classes == 3 and d.features == 3
    assert d.y[:3].tolist() == [0, 2, 1] and d.X[0].tolist() == [39.0, 18.1, 2007.0]
    assert read(str(p), label_column="0").names == d.names


@pytest.mark.parametrize("reader", ["reference", "fast"])
def test_a_year_like_label_is_refused_naming_the_column_and_the_fix(tmp_path, reader):
    """Issue 28: the year column, last, taken as the label trained 2,010 'classes' (the
    string column dropped, as the user had to; with it, the parser names it first)."""
    p = tmp_path / "penguins.csv"
    p.write_text(PENGUINS)
    read = formats.read_text if reader == "reference" else parse.read_file
    with pytest.raises(DataError, match=r":2: column 1 \('species'\): 'Adelie' is not a number; features must be "
                                        r"numbers: if this column is the label, use --label-column species"):
        read(str(p))
    p.write_text("".join(line.split(",", 1)[1] + "\n" for line in PENGUINS.splitlines()))
    with pytest.raises(DataError) as e:
        read(str(p))
    msg = str(e.value)
    assert "the label, column 3 ('year', the last), looks like a measurement, not classes: 2,010 classes" in msg
    assert "--label-column NAME or INDEX (the others: bill_length_mm, bill_depth_mm)" in msg
    assert "--classes N" in msg and "\n" not in msg
    assert read(str(p), classes=2010).classes == 2010        # unless --classes says so
    with pytest.raises(DataError, match="numbers with decimals"):
        read(str(p), label_column="bill_depth_mm")   # 3 values, 18.1 19.1 20.1


@pytest.mark.parametrize("labels, why", [
    ([str(i) for i in range(40)], "40 distinct values in 40 rows"),
    (["1", "5000"] * 20, "5,001 classes (integer labels up to 5,000)"),
    (["0", "1", "60"] * 10, "61 classes (integer labels up to 60) of which 3 occur"),
    ([f"id{i}" for i in range(40)], "40 distinct values in 40 rows"),
])
def test_measurement_like_labels(tmp_path, labels, why):
    p = tmp_path / "d.tsv"
    p.write_text("".join(f"{i}\t{t}\n" for i, t in enumerate(labels)))
    with pytest.raises(DataError, match=why.replace("(", r"\(").replace(")", r"\)")):
        formats.read_text(str(p))
    with pytest.raises(DataError, match=why.replace("(", r"\(").replace(")", r"\)")):
        parse.read_file(str(p))


def test_commas_read_as_whitespace_name_the_fix(tmp_path):
    p = tmp_path / "d.csv"
    with pytest.raises(DataError, match=r":1: need at least one feature and a label, got 1 field\(s\); the line "
                                        r"has ',' in it: if that separates the fields, use --delimiter comma"):
        fast(p, b"1,2,0\n3,4,1\n", delimiter="whitespace")
    assert fast(p, b"1,2,0\n3,4,1\n").X.tolist() == [[1, 2], [3, 4]]   # detected


def test_header_option_and_label_by_name_errors(tmp_path):
    p = tmp_path / "d.csv"
    d = fast(p, b"1,2,3\n0.5,0.25,0\n1,2,1\n", header=True)   # a header of numbers: only --header says so
    assert d.X.tolist() == [[0.5, 0.25], [1, 2]]
    with pytest.raises(DataError, match="--label-column z: no such column in .*'s header \\(a, b, c\\)"):
        fast(p, b"a,b,c\n1,2,0\n3,4,1\n", label_column="z")
    with pytest.raises(DataError, match="has no header line"):
        fast(p, b"1,2,0\n3,4,1\n", label_column="c")
    with pytest.raises(DataError, match="--label-column 5: .* has 3 columns"):
        fast(p, b"1,2,0\n3,4,1\n", label_column="5")


def test_a_numpy_savetxt_header_names_its_columns_without_the_hash(tmp_path):
    """numpy.savetxt(header=...) writes '# a,b,label': the first name was '# a', so
    --label-column a found no such column."""
    X = np.array([[0, 0.5, 1.0], [1, 2.0, 3.0], [1, 4.0, 5.0]])   # the label first: a
    for delimiter in (",", " "):
        p = tmp_path / "s.csv"
        np.savetxt(p, X, fmt=["%d", "%g", "%g"], delimiter=delimiter, header=delimiter.join(("a", "b", "label")))
        assert p.read_text().startswith("# a")
        assert formats.dialect_of(str(p)).names == ("a", "b", "label")
        for d in (formats.read_text(str(p), label_column="a"), fast(p, p.read_bytes(), label_column="a")):
            assert d.X.tolist() == [[0.5, 1], [2, 3], [4, 5]] and d.y.tolist() == [0, 1, 1], delimiter


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
    (tmp_path / "bad.tsv").write_text("0.1\t0\nzz\t1\n")
    assert data_cli.main(["convert", str(tmp_path / "bad.tsv"), str(tmp_path / "bad.npy")]) == 2
    assert f"{tmp_path / 'bad.tsv'}:2: column 1: 'zz' is not a number" in capsys.readouterr().err
    assert not (tmp_path / "bad.npy").exists()


@pytest.mark.parametrize("array, message", [
    (np.array([[0.1, 0.0], [0.2, 1.5]]), ":2: label 1.5 is not an integer"),
    (np.array([[0.1, 0.0], [np.nan, 1.0]]), ":2: column 1 is NaN or infinite"),
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


def test_convert_reads_its_input_as_asgd_train_does(tmp_path, capsys):
    """convert's own error says `use --label-column diagnosis`: it takes asgd.train's file options."""
    csv, npy = tmp_path / "d.csv", tmp_path / "d.npy"
    csv.write_text("radius;diagnosis;texture\n1.5;M;2\n2.5;B;3\n3.5;M;4\n")
    assert data_cli.main(["convert", str(csv), str(npy)]) == 2
    assert "use --label-column diagnosis" in capsys.readouterr().err
    assert data_cli.main(["convert", str(csv), str(npy), "--label-column", "diagnosis",
                          "--delimiter", "semicolon", "--header"]) == 0
    assert np.load(npy).tolist() == [[1.5, 2, 1], [2.5, 3, 0], [3.5, 4, 1]]   # the label last
    assert data_cli.main(["convert", str(csv), str(npy), "--delimiter", "letters"]) == 2
    assert "--delimiter must be" in capsys.readouterr().err


def test_convert_says_how_label_names_became_class_indices(tmp_path, capsys):
    """.npy and TSV hold numbers only: convert prints the names' mapping (it lost them silently)."""
    csv, npy = tmp_path / "d.csv", tmp_path / "d.npy"
    csv.write_text("x,species\n1,Gentoo\n2,Adelie\n3,Chinstrap\n4,Adelie\n")
    assert data_cli.main(["convert", str(csv), str(npy)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "labels written as class indices: 0 Adelie, 1 Chinstrap, 2 Gentoo"
    assert np.load(npy)[:, 1].tolist() == [2, 0, 1, 0]
    csv.write_text("x,y\n" + "".join(f"{i},c{i:02d}\n" for i in range(12)))
    assert data_cli.main(["convert", str(csv), str(npy)]) == 0
    first = ", ".join(f"{i} c{i:02d}" for i in range(10))
    assert capsys.readouterr().out.splitlines()[1] == f"labels written as class indices: {first}, ... (12 classes)"
    csv.write_text("x,y\n1,-1\n2,0\n3,1\n")   # -1 is no class index: names too
    assert data_cli.main(["convert", str(csv), str(npy)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "labels written as class indices: 0 -1, 1 0, 2 1"
    csv.write_text("x,y\n1,0\n2,1\n")          # class indices already: nothing to say
    assert data_cli.main(["convert", str(csv), str(npy)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
