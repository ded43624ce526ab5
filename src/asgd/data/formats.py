"""The data file formats, and the Dataset every reader returns.

Delimited text (CSV, TSV, the paper's white-space format): one data point a line, the
features as decimal numbers and a label, in the columns a Dialect says (data.dialect:
the delimiter, a header, the label's column, found from the file's first lines or
given). A label is a class index, or a name (data.labels). CRLF line endings, blanks
around fields and trailing blank lines are accepted. read_text here is the reference
parser (plain Python, numpy only: asgd.predict uses it); the readers use the numba
parser in parse.py, which gives the same values and messages.

.npy (binary): one 2-D little-endian float64 array, a row per data point, the label in
a column (the last by default), an integer value. A rank can read any range of rows at
a known offset and nothing needs parsing.

.npz: arrays X (2-D, the features) and y (1-D, the labels: integers or names), or one
2-D array laid out as a .npy file's. Read whole by every rank that reads it (use .npy
for large files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import DataError
from . import labels as lab
from .dialect import HEAD_BYTES, Dialect, DialectError, blank, is_number, sniff, split


@dataclass
class Dataset:
    X: np.ndarray  # (n, n_features) float64
    y: np.ndarray  # (n,) int64 class labels 0..classes-1
    classes: int
    names: tuple[str, ...] | None = None   # class k's label in the file, where labels are names

    @property
    def features(self) -> int:
        return self.X.shape[1]

    def __len__(self) -> int:
        return len(self.y)


def test_path(path: str) -> str:
    """The held-out companion of a data file: data.tsv -> data.test.tsv."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.test{ext}"


def is_binary(path: str) -> bool:
    """The format goes by the file name: .npy is binary, anything else is text (or .npz)."""
    return path.lower().endswith(".npy")


def is_npz(path: str) -> bool:
    return path.lower().endswith(".npz")


def write(path: str, data: Dataset) -> None:
    (write_npy if is_binary(path) else write_tsv)(path, data)


def write_npy(path: str, data: Dataset) -> None:
    with open(path, "wb") as f:  # a file object: np.save would add .npy to a name like X.NPY
        np.save(f, np.column_stack([data.X, data.y.astype(np.float64)]).astype("<f8"))


def file_size(path: str) -> int:
    """Size in bytes of a readable data file; the same messages as read_tsv."""
    try:
        with open(path, "rb") as f:
            return os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read data file: {e.strerror}") from None


def npy_header(path: str) -> tuple[int, int, int]:
    """(byte offset of the data, rows, columns) of a .npy data file, checked: a 2-D
    C-order little-endian float64 array with at least two columns, not truncated."""
    size = file_size(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}[version]
            shape, fortran, dtype = read(f)
        except (ValueError, KeyError, EOFError, OSError):
            raise DataError(f"{path}: not a .npy file numpy can read (format 1.0 or 2.0)") from None
        offset = f.tell()
    if dtype != np.dtype("<f8") or len(shape) != 2 or fortran:
        raise DataError(f"{path}: expected a 2-D float64 array (a row per point: features, then "
                        f"the label), got {dtype} of shape {shape}" + (" in Fortran order" if fortran else ""))
    rows, cols = shape
    if rows and cols < 2:
        raise DataError(f"{path}: need at least one feature and a label, got {cols} column(s)")
    if size < offset + rows * cols * 8:
        raise DataError(f"{path}: truncated: {rows} x {cols} values need {offset + rows * cols * 8} "
                        f"bytes, the file has {size}")
    return offset, rows, cols


def write_tsv(path: str, data: Dataset) -> None:
    # %.17g round-trips a float64 exactly
    cols = np.column_stack([data.X, data.y.astype(np.float64)])
    fmt = ["%.17g"] * data.features + ["%d"]
    np.savetxt(path, cols, fmt=fmt, delimiter="\t")


# -- the reference parser (plain Python) ---------------------------------------------

def read_head(path: str) -> bytes:
    """The file's first bytes, enough for sniff: HEAD_BYTES, more until line 2 ends."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            while head.count(b"\n") < 2 and len(head) % HEAD_BYTES == 0 and head:
                more = f.read(HEAD_BYTES)
                if not more:
                    break
                head += more
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a data file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read data file: {e.strerror}") from None
    return head


def dialect_of(path: str, delimiter: str = "auto", header: bool | None = None,
               label_column: str | None = None, head: bytes | None = None) -> Dialect:
    """The Dialect of a text file (data.dialect.sniff on its first bytes); DataError if bad."""
    try:
        return sniff(path, read_head(path) if head is None else head, delimiter, header, label_column)
    except DialectError as e:
        raise DataError(str(e)) from None


def parse_reference(path: str, d: Dialect, classes: int | None = None):
    """(X, label tokens (None without a label column), FileLabels) of a text file with a
    known dialect, line by line in Python; DataError names the first bad line and column,
    with the numba parser's words (parse.py)."""
    raw = _read_bytes(path)
    lines = raw[d.start:].split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    while lines and blank(lines[-1].decode("latin-1")):   # trailing blank lines are harmless
        lines.pop()
    if not lines:
        raise DataError(f"{path}: empty data file")
    feats = d.feature_columns() if d.label is not None else list(range(d.columns))
    X = np.empty((len(lines), len(feats)))
    tokens = [] if d.label is not None else None
    fl = lab.FileLabels()
    for i, b in enumerate(lines):
        lineno = d.first_line + i
        text = b.decode("latin-1")   # byte for byte: the kernel sees bytes
        if blank(text):
            raise DataError(f"{path}:{lineno}: empty line")
        fields = split(text, d.delimiter)
        if len(fields) != d.columns:
            raise DataError(f"{path}:{lineno}: {d.fields_message(len(fields))}")
        row = []
        for c, f in enumerate(fields):   # in column order: the first bad field is the one named
            if c == d.label:
                if f == "":
                    raise DataError(f"{path}:{lineno}: {d.empty(c)}")
                continue
            if not _is_feature(f):
                if any(ord(ch) >= 128 for ch in f):
                    byte = next(ord(ch) for ch in f if ord(ch) >= 128)
                    raise DataError(f"{path}:{lineno}: not a text file (byte {byte:#x})")
                raise DataError(f"{path}:{lineno}: {d.empty(c) if f == '' else d.not_a_number(c, f)}")
            row.append(float(f))
        X[i] = row
        bad = [c for c, v in zip(feats, row) if not np.isfinite(v)]
        if bad:
            raise DataError(f"{path}:{lineno}: {d.nonfinite(bad[0])}")
        if tokens is not None:
            t = fields[d.label].encode("latin-1").decode("utf-8", "replace")
            tokens.append(t)
            fl.add(t, lineno, classes)
    return X, tokens, fl


def _is_feature(f: str) -> bool:
    return f.isascii() and is_number(f)


def read_text(path: str, classes: int | None = None, delimiter: str = "auto", header: bool | None = None,
              label_column: str | None = None) -> Dataset:
    """Parse and validate a whole text file; any problem raises DataError naming the
    file, the line and the column."""
    d = dialect_of(path, delimiter, header, label_column)
    if d.columns == 0:
        raise DataError(f"{path}: empty data file")
    X, tokens, fl = parse_reference(path, d, classes)
    labels = lab.decide(path, d, fl, len(X), classes)
    y = np.array([labels.of(t) for t in tokens], dtype=np.int64)
    return Dataset(X, y, labels.classes, labels.names)


read_tsv = read_text   # the name before 0.4: the paper's format is one dialect of it


def shape_of(path: str, label_column: str | None = None, classes: int | None = None) -> tuple[int, int]:
    """(features, classes) of a data file as asgd.train finds them, without parsing the
    features: a .npy's columns and label column; a text file's dialect and its label
    column alone (labels.decide); a .npz read whole, as asgd.train reads it. classes:
    asgd.train's --classes."""
    if is_npz(path):
        X, y, tokens = read_npz(path, None, label_column)
        return X.shape[1], lab.decide(path, npz_dialect(path, X.shape[1], label_column),
                                      npz_labels(path, y, tokens, None), len(y), classes).classes
    if is_binary(path):
        offset, rows, cols = npy_header(path)
        c = _column(path, label_column, cols)
        y = np.asarray(np.load(path, mmap_mode="r")[:, c])
        whole = bool((y == np.round(y)).all() and (y >= 0).all())
        fl = npz_labels(path, y.astype(np.int64) if whole else y, None if whole else y.astype(str), None)
        return cols - 1, lab.decide(path, npz_dialect(path, cols - 1, label_column), fl, rows, classes).classes
    d = dialect_of(path, label_column=label_column)
    if d.label is None or d.columns < 2:
        raise DataError(f"{path}: need features and a label column, got {d.columns} column(s)")
    fl = lab.FileLabels()
    lines = _read_bytes(path)[d.start:].split(b"\n")
    for i, b in enumerate(lines):
        text = b.decode("latin-1")
        if not blank(text):
            fields = split(text, d.delimiter)
            if len(fields) == d.columns:   # a bad line is the reader's to report, with its words
                fl.add(fields[d.label].encode("latin-1").decode("utf-8", "replace"), d.first_line + i, None)
    return d.columns - 1, lab.decide(path, d, fl, len(lines), classes).classes


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read data file: {e.strerror}") from None


# -- .npz --------------------------------------------------------------------------------

def read_npz(path: str, classes: int | None = None, label_column: str | None = None):
    """(X, label array, Dialect-like column info) of a .npz: arrays X and y, or one 2-D
    array with the label in a column. Labels may be integers, integer-valued floats or
    names (strings)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.keys())
            if "X" in keys and "y" in keys:
                X, y = np.asarray(z["X"]), np.asarray(z["y"])
                if label_column is not None:
                    raise DataError(f"{path}: --label-column does not apply: its labels are its array y")
            elif len(keys) == 1 and z[keys[0]].ndim == 2:
                A = np.asarray(z[keys[0]])
                c = _column(path, label_column, A.shape[1])
                X, y = np.delete(A, c, axis=1), A[:, c]
            else:
                raise DataError(f"{path}: expected arrays X (features) and y (labels), or one 2-D array; "
                                f"got {', '.join(keys) or 'none'}")
    except (OSError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: not a .npz file numpy can read ({e})") from None
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
        raise DataError(f"{path}: X must be 2-D and y 1-D with a label per row; got X {X.shape}, y {y.shape}")
    if X.dtype.kind not in "fiub":
        raise DataError(f"{path}: X must hold numbers, got {X.dtype}")
    X = np.ascontiguousarray(X, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
    if len(bad):
        c = int(np.flatnonzero(~np.isfinite(X[bad[0]]))[0])
        raise DataError(f"{path}:{bad[0] + 1}: column {c + 1} of X is NaN or infinite; asgd needs every feature a "
                        "finite number: drop or fill the rows that lack one")
    if len(X) == 0:
        raise DataError(f"{path}: empty data file")
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise DataError(f"{path}:{np.flatnonzero(~np.isfinite(y))[0] + 1}: the label is NaN: a missing value; "
                            "drop the rows that lack one")
        if (y == np.round(y)).all():
            y = y.astype(np.int64)
    tokens = y.astype(str) if y.dtype.kind in "fUSO" or (y < 0).any() else None
    return X, y, tokens


def _column(path: str, spec: str | None, columns: int) -> int:
    if spec is None:
        return columns - 1
    try:
        i = int(spec)
    except ValueError:
        raise DataError(f"--label-column {spec}: {path} has no column names; give an index") from None
    if not -columns <= i < columns:
        raise DataError(f"--label-column {spec}: {path} has {columns} columns")
    return i % columns


def npz_labels(path: str, y: np.ndarray, tokens, classes: int | None):
    """FileLabels of a .npz's labels (rows as lines, 1-based)."""
    fl = lab.FileLabels()
    if tokens is None:
        u, first = np.unique(y, return_index=True)
        for v, i in zip(u[:lab.MAX_CLASSES + 1], first[:lab.MAX_CLASSES + 1]):
            fl.tokens[str(int(v))] = int(i) + 1
        fl.more = len(u) > lab.MAX_CLASSES + 1
        fl.max_label = int(u[-1])
        if classes and fl.max_label >= classes:
            fl.out_of_range = int(np.flatnonzero(y >= classes)[0]) + 1
        return fl
    u, first = np.unique(tokens, return_index=True)
    for t, i in sorted(zip(u.tolist(), first.tolist()), key=lambda p: p[1])[:lab.MAX_CLASSES + 1]:
        fl.tokens[t] = int(i) + 1
    fl.more = len(u) > lab.MAX_CLASSES + 1
    fl.names = True
    return fl


def npz_dialect(path: str, features: int, label_column: str | None = None) -> Dialect:
    """A Dialect that words a .npz's messages (its label: y, or a column)."""
    return Dialect(None, features + 1, features, None)
