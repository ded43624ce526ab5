"""Fast parsing of the data formats (numba), and the rules that turn what each chunk of
a file found into one verdict for the whole file.

The TSV parser works on raw bytes: formats.read_tsv, a Python loop over lines, takes about
4 us a line here (two 17-digit features and a label), this about 0.45 us. A rank may
parse only a chunk of the file (the parallel reader), so the kernel reports what the
whole-file checks need to be finished across chunks (`Summary`): the line count
(global line numbers are an exclusive scan of it), the number of fields of the chunk's
first line (it must equal line 1's), and whether the chunk ends in blank lines (an error
only if data follows in a later chunk).
`resolve` then reports the first bad line of the file, with the messages of the
reference parser formats.read_tsv.

Numbers: a feature must be a decimal number ([+-]digits[.digits][e[+-]digits]); it is
converted by the C library's strtod, which rounds correctly, so values are bit-identical
to Python's float(). (float() also takes '1_000'; this parser calls that not a number.)
Lines end at '\\n'; '\\r' (CRLF), tabs, blanks and other ASCII white space separate fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, types

from .formats import DataError, Dataset, file_size, is_binary, npy_header

# strtod from the C library, by symbol name: unlike a ctypes pointer this keeps the
# kernel cacheable (cache=True), so 16 ranks load it instead of compiling it.
_strtod = types.ExternalFunction("strtod", types.float64(types.voidptr, types.voidptr))

# kernel status codes
(OK, EMPTY_LINE, FIELDS, NOT_NUMBER, NOT_INTEGER, NONFINITE, NEGATIVE, OUT_OF_RANGE,
 NOT_TEXT, TOO_LARGE) = range(10)
# slots of the kernel's info array
(I_STATUS, I_LINE, I_TOK0, I_TOK1, I_AUX, I_LINES, I_ROWS, I_FIELDS, I_FIRST_ROW,
 I_BLANK_TAIL, I_MAX_LABEL) = range(11)
MAX_LABEL = 2**31 - 1  # labels index an array of classes; larger is a mistake, not a class


@njit(cache=True)
def _space(c):
    # what Python's str.split() splits on, within ASCII ('\n' ends the line first)
    return c == 32 or (9 <= c <= 13) or (28 <= c <= 31)


@njit(cache=True)
def _digit(c):
    return 48 <= c <= 57


@njit(cache=True)
def _special(buf, a, b):
    """inf, infinity or nan, in any case (float() takes them)."""
    n = b - a
    if n != 3 and n != 8:
        return False
    c0, c1, c2 = buf[a] | 32, buf[a + 1] | 32, buf[a + 2] | 32  # | 32: ASCII lower case
    if n == 3 and c0 == 110 and c1 == 97 and c2 == 110:  # nan
        return True
    if not (c0 == 105 and c1 == 110 and c2 == 102):  # inf
        return False
    if n == 3:
        return True
    tail = (105, 110, 105, 116, 121)  # "inity"
    for i in range(5):
        if buf[a + 3 + i] | 32 != tail[i]:
            return False
    return True


@njit(cache=True)
def _float_kind(buf, a, b):
    """1: a decimal number; 2: inf/infinity/nan (float() takes them: an error of its
    own); 0: not a number."""
    i = a
    if buf[i] == 43 or buf[i] == 45:  # + -
        i += 1
    s = i
    digits = 0
    while i < b and _digit(buf[i]):
        i += 1
        digits += 1
    if i < b and buf[i] == 46:  # .
        i += 1
        while i < b and _digit(buf[i]):
            i += 1
            digits += 1
    if digits == 0:
        return 2 if _special(buf, s, b) else 0
    if i < b and (buf[i] == 101 or buf[i] == 69):  # e E
        i += 1
        if i < b and (buf[i] == 43 or buf[i] == 45):
            i += 1
        e = 0
        while i < b and _digit(buf[i]):
            i += 1
            e += 1
        if e == 0:
            return 0
    return 1 if i == b else 0


@njit(cache=True)
def _fail(info, status, line, t0, t1, aux):
    info[I_STATUS], info[I_LINE], info[I_TOK0], info[I_TOK1], info[I_AUX] = status, line, t0, t1, aux


@njit(cache=True)
def parse_text(buf, lo, hi, classes):
    """Parse lines buf[lo:hi] (the last may lack '\\n'; buf[hi] must exist and not be a
    digit: a sentinel byte). classes <= 0: no upper bound on labels.
    Returns X (rows, fields-1), y (rows,), info (int64, slots I_*); stops at the first
    bad line, whose local 0-based number, token and a value are in info."""
    info = np.zeros(11, np.int64)
    info[I_FIRST_ROW] = info[I_BLANK_TAIL] = info[I_LINE] = -1
    info[I_MAX_LABEL] = -1
    lines = 0
    for i in range(lo, hi):
        if buf[i] == 10:
            lines += 1
    if hi > lo and buf[hi - 1] != 10:
        lines += 1
    info[I_LINES] = lines
    # the first non-blank line sets the number of fields every line must have
    fields = 0
    i = lo
    while i < hi and fields == 0:
        in_tok = False
        while i < hi and buf[i] != 10:
            sp = _space(buf[i])
            if not sp and not in_tok:
                fields += 1
            in_tok = not sp
            i += 1
        i += 1
    info[I_FIELDS] = fields
    nf = max(fields - 1, 0)
    X = np.empty((lines, nf))
    y = np.empty(lines, np.int64)
    end = np.zeros(1, np.int64)  # strtod's end pointer
    base = buf.ctypes.data
    rows = 0
    blank = -1  # first line of the current run of blank lines
    line = 0
    pos = lo
    while pos < hi:
        e = pos
        while e < hi and buf[e] != 10:
            e += 1
        # pass 1: text only, and count the fields
        n = 0
        in_tok = False
        for j in range(pos, e):
            c = buf[j]
            if c >= 128:
                _fail(info, NOT_TEXT, line, j, j + 1, c)
                return X[:rows], y[:rows], info
            sp = _space(c)
            if not sp and not in_tok:
                n += 1
            in_tok = not sp
        if n == 0:
            if blank < 0:
                blank = line
            line += 1
            pos = e + 1
            continue
        if blank >= 0:  # a blank line with data after it
            _fail(info, EMPTY_LINE, blank, 0, 0, 0)
            return X[:rows], y[:rows], info
        if info[I_FIRST_ROW] < 0:
            info[I_FIRST_ROW] = line
        if n != fields:
            _fail(info, FIELDS, line, 0, 0, n)
            return X[:rows], y[:rows], info
        # pass 2: the values. Per line, the reference parser's order: a feature that is
        # not a number, a label that is not an integer, then NaN/inf, negative, range.
        j = pos
        nonfinite = False
        label = 0
        l0 = l1 = 0  # the label's token
        for k in range(fields):
            while _space(buf[j]):
                j += 1
            t0 = j
            while j < e and not _space(buf[j]):
                j += 1
            if k < nf:
                kind = _float_kind(buf, t0, j)
                if kind == 0:
                    _fail(info, NOT_NUMBER, line, t0, j, 0)
                    return X[:rows], y[:rows], info
                if kind == 2:
                    nonfinite = True
                    X[rows, k] = np.nan
                else:
                    v = _strtod(base + t0, end.ctypes.data)
                    if end[0] != base + j:  # cannot happen for a valid token; be sure
                        _fail(info, NOT_NUMBER, line, t0, j, 0)
                        return X[:rows], y[:rows], info
                    if not np.isfinite(v):  # e.g. 1e999
                        nonfinite = True
                    X[rows, k] = v
            else:
                l0, l1 = t0, j
                a = t0 + 1 if buf[t0] == 45 else t0  # -
                if a == j:
                    _fail(info, NOT_INTEGER, line, t0, j, 0)
                    return X[:rows], y[:rows], info
                for q in range(a, j):
                    if not _digit(buf[q]):
                        _fail(info, NOT_INTEGER, line, t0, j, 0)
                        return X[:rows], y[:rows], info
                q = a
                while q < j - 1 and buf[q] == 48:  # leading zeros do not count
                    q += 1
                if j - q > 10:
                    _fail(info, TOO_LARGE, line, t0, j, 0)
                    return X[:rows], y[:rows], info
                for r in range(q, j):
                    label = label * 10 + (buf[r] - 48)
                if a > t0:
                    label = -label
        if nonfinite:
            _fail(info, NONFINITE, line, 0, 0, 0)
            return X[:rows], y[:rows], info
        if label < 0:
            _fail(info, NEGATIVE, line, 0, 0, label)
            return X[:rows], y[:rows], info
        if label > MAX_LABEL:
            _fail(info, TOO_LARGE, line, l0, l1, label)
            return X[:rows], y[:rows], info
        if classes > 0 and label >= classes:
            _fail(info, OUT_OF_RANGE, line, 0, 0, label)
            return X[:rows], y[:rows], info
        y[rows] = label
        if label > info[I_MAX_LABEL]:
            info[I_MAX_LABEL] = label
        rows += 1
        line += 1
        pos = e + 1
    info[I_ROWS] = rows
    info[I_BLANK_TAIL] = blank
    return X[:rows], y[:rows], info


@njit(cache=True)
def check_rows(A, classes):
    """Validate rows of a binary file (features then the label, all float64) the way
    parse_text validates lines. Returns info (I_STATUS, I_LINE: the bad row, I_MAX_LABEL)
    and the bad label's value (or 0.0)."""
    info = np.zeros(11, np.int64)
    info[I_LINE] = info[I_FIRST_ROW] = info[I_BLANK_TAIL] = info[I_MAX_LABEL] = -1
    n, m = A.shape
    info[I_LINES] = n
    info[I_FIELDS] = m
    if n:
        info[I_FIRST_ROW] = 0
    for i in range(n):
        v = A[i, m - 1]
        if not np.isfinite(v) or v != np.floor(v):
            info[I_STATUS], info[I_LINE] = NOT_INTEGER, i
            return info, v
        nonfinite = False
        for k in range(m - 1):
            if not np.isfinite(A[i, k]):
                nonfinite = True
        status = OK
        if nonfinite:
            status = NONFINITE
        elif v < 0:
            status = NEGATIVE
        elif v > MAX_LABEL:
            status = TOO_LARGE
        elif classes > 0 and v >= classes:
            status = OUT_OF_RANGE
        if status != OK:
            info[I_STATUS], info[I_LINE], info[I_AUX] = status, i, int(v) if status != TOO_LARGE else 0
            return info, v
        if v > info[I_MAX_LABEL]:
            info[I_MAX_LABEL] = int(v)
    info[I_ROWS] = n
    return info, 0.0


def compile_parsers() -> None:
    """Compile (or load from numba's cache) the kernels with the argument types of a run
    (a writable buffer: numba compiles read-only arrays separately)."""
    buf = np.array(bytearray(b"0.5\t1\n\n"), np.uint8)
    parse_text(buf, 0, len(buf) - 1, 0)
    find_byte(buf, 0, len(buf), 10)
    check_rows(np.zeros((1, 2)), 0)


@dataclass
class Summary:
    """What one chunk of a file found: all that the whole-file verdict needs (small:
    every rank sends its own to every other)."""
    lines: int        # lines in the chunk (line numbers of later chunks start after them)
    rows: int         # data points parsed
    fields: int       # fields of the chunk's first non-blank line (0: none)
    first_row: int    # local line of that line, -1: none
    blank_tail: int   # local line where a final run of blank lines starts, -1: none
    max_label: int    # -1: no rows
    error: tuple[int, int, str] | None = None  # (local line, precedence, message)


def summarize(info: np.ndarray, buf=None, value: float = 0.0, classes: int = 0,
              binary: bool = False) -> Summary:
    """Turn a kernel's info into a Summary, with the message of its error if any."""
    s = Summary(int(info[I_LINES]), int(info[I_ROWS]), int(info[I_FIELDS]), int(info[I_FIRST_ROW]),
                int(info[I_BLANK_TAIL]), int(info[I_MAX_LABEL]))
    status = int(info[I_STATUS])
    if status == OK:
        return s
    token = (bytes(buf[info[I_TOK0]:info[I_TOK1]]).decode("ascii", "replace")
             if buf is not None and info[I_TOK1] > info[I_TOK0] else "")
    aux = int(info[I_AUX])
    if status == NOT_INTEGER and binary:
        msg = f"label {value:g} is not an integer"
    elif status == TOO_LARGE:
        msg = f"label {token!r} is too large" if token else f"label {value:g} is too large"
    else:
        msg = {
            EMPTY_LINE: "empty line",
            FIELDS: f"expected {s.fields} fields like line 1, got {aux}",
            NOT_NUMBER: f"feature {token!r} is not a number",
            NOT_INTEGER: f"label {token!r} is not an integer",
            NONFINITE: "feature is NaN or infinite",
            NEGATIVE: f"negative label {aux}",
            OUT_OF_RANGE: f"label {aux} out of range for --classes {classes}",
            NOT_TEXT: f"not a text file (byte {aux:#x})",
        }[status]
    # structural problems come first on a line, as in the reference parser
    rank = {NOT_TEXT: 0, EMPTY_LINE: 1, FIELDS: 1}.get(status, 2)
    s.error = (int(info[I_LINE]), rank, msg)
    return s


def resolve(path: str, chunks: list[Summary]) -> tuple[np.ndarray, int, int, int]:
    """The verdict on a whole file from its chunks in file order: raises DataError for
    the file's first bad line; else returns (line offset of each chunk, data points,
    features, max label). Every rank calls it on the same list, so all agree."""
    offsets = np.concatenate([[0], np.cumsum([c.lines for c in chunks])[:-1]]).astype(np.int64)
    has_rows = [c.first_row >= 0 for c in chunks]
    first = next((k for k, h in enumerate(has_rows) if h), None)
    fields = chunks[first].fields if first is not None else 0
    found = []  # (global 0-based line, precedence, message)
    for k, c in enumerate(chunks):
        if c.error:
            found.append((offsets[k] + c.error[0], c.error[1], c.error[2]))
        if k != first and c.first_row >= 0 and c.fields != fields:
            found.append((offsets[k] + c.first_row, 1, f"expected {fields} fields like line 1, got {c.fields}"))
        if c.blank_tail >= 0 and any(has_rows[k + 1:]):
            found.append((offsets[k] + c.blank_tail, 1, "empty line"))
    if first is not None and fields < 2:
        found.append((offsets[first] + chunks[first].first_row, 1,
                      f"need at least one feature and a label, got {fields} field(s)"))
    if found:
        line, _, msg = min(found, key=lambda f: (f[0], f[1]))
        raise DataError(f"{path}:{line + 1}: {msg}")
    rows = sum(c.rows for c in chunks)
    if rows == 0:
        raise DataError(f"{path}: empty data file")
    return offsets, rows, fields - 1, max(c.max_label for c in chunks)


@njit(cache=True)
def find_byte(buf, a, b, c):
    """Index of the first byte c in buf[a:b], or -1."""
    for i in range(a, b):
        if buf[i] == c:
            return i
    return -1


# -- whole files (the sequential reader, convert) ----------------------------------

def read_bytes(path: str) -> np.ndarray:
    """The whole file, plus one sentinel byte ('\\n') that parse_text needs."""
    size = file_size(path)
    buf = np.empty(size + 1, np.uint8)
    buf[size] = 10
    try:
        with open(path, "rb") as f:
            got = f.readinto(memoryview(buf)[:size])
    except OSError as e:
        raise DataError(f"{path}: cannot read data file: {e.strerror}") from None
    if got != size:
        raise DataError(f"{path}: the file changed while it was read")
    return buf


def parse_bytes(path: str, buf: np.ndarray, classes: int | None = None):
    """(X, y, max label) of a whole text file read by read_bytes; DataError if bad."""
    X, y, info = parse_text(buf, 0, len(buf) - 1, classes or 0)
    _, _, _, max_label = resolve(path, [summarize(info, buf, classes=classes or 0)])
    return X, y, max_label


def read_rows(path: str) -> np.ndarray:
    """All rows of a .npy data file (header checked)."""
    offset, rows, cols = npy_header(path)
    try:
        return np.fromfile(path, dtype="<f8", count=rows * cols, offset=offset).reshape(rows, cols)
    except OSError as e:
        raise DataError(f"{path}: cannot read data file: {e.strerror}") from None


def check_array(A: np.ndarray, classes: int | None = None) -> Summary:
    """Validate rows (features, label) of a binary file: the Summary of A as one chunk
    (its error, if any, not yet raised: resolve does, for the whole file)."""
    info, value = check_rows(A, classes or 0)
    return summarize(info, value=float(value), classes=classes or 0, binary=True)


def split_rows(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(A[:, :-1]), A[:, -1].astype(np.int64)


def read_file(path: str, classes: int | None = None) -> Dataset:
    """A whole data file of either format with the fast parser (one process, no MPI)."""
    if is_binary(path):
        A = read_rows(path)
        _, _, _, max_label = resolve(path, [check_array(A, classes)])
        X, y = split_rows(A)
    else:
        X, y, max_label = parse_bytes(path, read_bytes(path), classes)
    return Dataset(X, y, classes or max(max_label + 1, 2))
