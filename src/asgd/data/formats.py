"""The data file formats, and the Dataset every reader returns.

TSV (the paper's): one data point a line, the features as decimal numbers, then an
integer class label, separated by tabs (any whitespace is accepted, as are CRLF line
endings and trailing blanks). read_tsv here is the reference parser (plain Python);
the readers use the numba parser in parse.py, which gives the same messages.

.npy (binary): one 2-D little-endian float64 array, a row per data point: the features,
then the label (an integer value). A rank can read any range of rows at a known offset
and nothing needs parsing. Files ending in .npy are binary, anything else is TSV.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import BadInput


class DataError(BadInput):
    """Bad input data; the message names the file and, where it can, the line."""


@dataclass
class Dataset:
    X: np.ndarray  # (n, n_features) float64
    y: np.ndarray  # (n,) int64 class labels 0..classes-1
    classes: int

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
    """The format goes by the file name: .npy is binary, anything else is text."""
    return path.lower().endswith(".npy")


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


def read_tsv(path: str, classes: int | None = None) -> Dataset:
    """Parse and validate a TSV file; any problem raises DataError naming file and line."""
    lines = _read_lines(path)
    n_fields = None
    rows = []
    for lineno, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            raise DataError(f"{path}:{lineno}: empty line")
        if n_fields is None:
            n_fields = len(fields)
            if n_fields < 2:
                raise DataError(f"{path}:{lineno}: need at least one feature and a label, "
                                f"got {n_fields} field(s)")
        elif len(fields) != n_fields:
            raise DataError(f"{path}:{lineno}: expected {n_fields} fields like line 1, "
                            f"got {len(fields)}")
        rows.append(fields)
    return _validate(path, rows, classes)


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: data file not found") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read data file: {e.strerror}") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not a text file (byte {raw[e.start]:#x})") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():  # trailing blank lines are harmless
        lines.pop()
    if not lines:
        raise DataError(f"{path}: empty data file")
    return lines


def _validate(path: str, rows: list[list[str]], classes: int | None) -> Dataset:
    n_feat = len(rows[0]) - 1
    X = np.empty((len(rows), n_feat))
    y = np.empty(len(rows), dtype=np.int64)
    for i, fields in enumerate(rows):
        try:
            X[i] = [float(v) for v in fields[:n_feat]]
        except ValueError:
            bad = next(v for v in fields[:n_feat] if not _is_float(v))
            raise DataError(f"{path}:{i + 1}: feature {bad!r} is not a number") from None
        label = fields[-1]
        if not label.lstrip("-").isdigit():
            raise DataError(f"{path}:{i + 1}: label {label!r} is not an integer")
        y[i] = int(label)
    bad = np.flatnonzero(~np.isfinite(X).all(axis=1))
    if len(bad):
        raise DataError(f"{path}:{bad[0] + 1}: feature is NaN or infinite")
    if (y < 0).any():
        raise DataError(f"{path}:{np.flatnonzero(y < 0)[0] + 1}: negative label {y[y < 0][0]}")
    k = int(y.max()) + 1 if classes is None else classes
    if classes is not None and (y >= classes).any():
        i = np.flatnonzero(y >= classes)[0]
        raise DataError(f"{path}:{i + 1}: label {y[i]} out of range for --classes {classes}")
    if k < 2:
        raise DataError(f"{path}: all labels are 0; need at least 2 classes")
    return Dataset(X, y, k)


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
