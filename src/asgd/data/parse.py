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

from . import labels as lab
from .dialect import Dialect
from .formats import DataError, Dataset, dialect_of, file_size, is_binary, is_npz, npy_header, npz_labels, read_npz
from .labels import MAX_CLASSES, MAX_LABEL

# strtod from the C library, by symbol name: unlike a ctypes pointer this keeps the
# kernel cacheable (cache=True), so 16 ranks load it instead of compiling it.
_strtod = types.ExternalFunction("strtod", types.float64(types.voidptr, types.voidptr))

# kernel status codes
(OK, EMPTY_LINE, FIELDS, NOT_NUMBER, EMPTY_FIELD, NONFINITE, NOT_TEXT, NOT_INTEGER, NEGATIVE, OUT_OF_RANGE,
 TOO_LARGE) = range(11)
# slots of the kernel's info array
(I_STATUS, I_LINE, I_TOK0, I_TOK1, I_AUX, I_LINES, I_ROWS, I_COL, I_BLANK_TAIL, I_MAX_LABEL, I_NAMES,
 I_MORE, I_OOR) = range(13)
N_INFO = 13
TABLE = 4096   # slots of the kernel's table of distinct labels (a power of two, > 2 x (MAX_CLASSES + 1))
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


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
def _fail(info, status, line, t0, t1, aux, col):
    info[I_STATUS], info[I_LINE], info[I_TOK0], info[I_TOK1], info[I_AUX], info[I_COL] = status, line, t0, t1, aux, col


@njit(cache=True)
def _fields_of(buf, pos, delim):
    """The number of fields of the line starting at pos (a bad line's, for its message)."""
    n = 0
    j = pos
    if delim == 0:
        in_tok = False
        while buf[j] != 10:
            sp = _space(buf[j])
            if not sp and not in_tok:
                n += 1
            in_tok = not sp
            j += 1
        return n
    n = 1
    while buf[j] != 10:
        if buf[j] == delim:
            n += 1
        j += 1
    return n


@njit(cache=True)
def _non_ascii(buf, a, b):
    for q in range(a, b):
        if buf[q] >= 128:
            return buf[q]
    return 0


@njit(cache=True)
def parse_text(buf, lo, hi, delim, fields, label, classes):
    """Parse lines buf[lo:hi] of `fields` fields each, separated by byte `delim` (0: any run
    of white space), the label in column `label`. Every line ends at a '\\n' at or before
    buf[hi] (the last may lack one: then buf[hi] must be a '\\n' sentinel). classes <= 0:
    no bound on integer labels (else the first row with one >= classes is noted).
    Returns X (rows, fields-1), y (rows,: the integer label, -1 where it is a name),
    h (rows,: a 64-bit hash of the label's text), info (int64, slots I_*), and the table
    of distinct labels (hash; first token's start, end and row), at most MAX_CLASSES + 1;
    stops at the first bad line, whose local 0-based number, token and column are in info."""
    info = np.zeros(N_INFO, np.int64)
    info[I_BLANK_TAIL] = info[I_LINE] = info[I_MAX_LABEL] = info[I_OOR] = -1
    lines = 0
    for i in range(lo, hi):
        if buf[i] == 10:
            lines += 1
    if hi > lo and buf[hi - 1] != 10:
        lines += 1
    info[I_LINES] = lines
    nf = fields - 1
    X = np.empty((lines, nf))
    y = np.empty(lines, np.int64)
    h = np.empty(lines, np.int64)
    tab = np.zeros(TABLE, np.int64)
    tpos = np.zeros((TABLE, 3), np.int64)
    distinct = 0
    end = np.zeros(1, np.int64)  # strtod's end pointer
    base = buf.ctypes.data
    rows = 0
    blank = -1  # first line of the current run of blank lines
    line = 0
    pos = lo
    while pos < hi:
        j = pos
        fi = 0            # the next feature's index
        nonfinite = -1    # the first column that is NaN or inf
        bad = OK
        bt0 = bt1 = bcol = 0
        l0 = l1 = 0       # the label's token
        more = False      # a delimiter after the last field: more fields than expected
        content = False   # delimited: a field that is not blank, or a delimiter that is not (tab)
        k = 0
        while k < fields:
            # -- field k's token [t0, t1) -------------------------------------------
            if delim == 0:
                while buf[j] != 10 and _space(buf[j]):
                    j += 1
                if buf[j] == 10:   # the line ended: k fields
                    break
                t0 = j
                while not _space(buf[j]):
                    j += 1
                t1 = j
            else:
                t0 = j
                while buf[j] != delim and buf[j] != 10:
                    j += 1
                t1 = j
                sep = buf[j] == delim
                while t0 < t1 and _space(buf[t0]):
                    t0 += 1
                while t1 > t0 and _space(buf[t1 - 1]):
                    t1 -= 1
                content = content or t0 < t1 or (sep and not _space(delim))
                if sep:
                    j += 1
                    more = k == fields - 1
                elif k < fields - 1:   # the line ended: k + 1 fields (or a blank line)
                    k = k + 1 if content else 0
                    break
            if t1 - t0 >= 2 and buf[t0] == 34 and buf[t1 - 1] == 34:   # "quoted"
                t0 += 1
                t1 -= 1
            # -- its value: the first bad field of the line is the one named ----------
            if k == label:
                l0, l1 = t0, t1
                if t0 == t1 and bad == OK:
                    bad, bt0, bt1, bcol = EMPTY_FIELD, t0, t1, k
            elif bad == OK:
                if t0 == t1:
                    bad, bt0, bt1, bcol = EMPTY_FIELD, t0, t1, k
                else:
                    kind = _float_kind(buf, t0, t1)
                    if kind == 1:
                        v = _strtod(base + t0, end.ctypes.data)
                        if end[0] != base + t1:  # cannot happen for a valid token; be sure
                            bad, bt0, bt1, bcol = NOT_NUMBER, t0, t1, k
                        else:
                            if nonfinite < 0 and not np.isfinite(v):  # e.g. 1e999
                                nonfinite = k
                            X[rows, fi] = v
                    elif kind == 2:
                        if nonfinite < 0:
                            nonfinite = k
                    else:
                        bad, bt0, bt1, bcol = NOT_NUMBER, t0, t1, k
                fi += 1
            else:
                fi += 1
            k += 1
        if delim != 0 and not content:   # blanks and blank delimiters only (tabs)
            k = 0
            while buf[j] != 10:
                j += 1
        # -- the line's verdict ------------------------------------------------------
        if k == 0:   # a blank line
            if blank < 0:
                blank = line
            line += 1
            pos = j + 1
            continue
        if blank >= 0:  # a blank line with data after it
            _fail(info, EMPTY_LINE, blank, 0, 0, 0, 0)
            return X[:rows], y[:rows], h[:rows], info, tab, tpos
        n = k
        if k == fields:   # more fields after the last?
            if delim == 0:
                while buf[j] != 10 and _space(buf[j]):
                    j += 1
                more = buf[j] != 10
            if more:
                n = _fields_of(buf, pos, delim)
        if n != fields:
            _fail(info, FIELDS, line, 0, 0, n, 0)
            return X[:rows], y[:rows], h[:rows], info, tab, tpos
        if bad != OK:
            c = _non_ascii(buf, bt0, bt1) if bad == NOT_NUMBER else 0
            if c:
                _fail(info, NOT_TEXT, line, bt0, bt1, c, bcol)
            else:
                _fail(info, bad, line, bt0, bt1, 0, bcol)
            return X[:rows], y[:rows], h[:rows], info, tab, tpos
        if nonfinite >= 0:
            _fail(info, NONFINITE, line, 0, 0, 0, nonfinite)
            return X[:rows], y[:rows], h[:rows], info, tab, tpos
        # -- the label: an integer, or a name; its hash into the table ---------------
        hv = _FNV_OFFSET
        isint = True
        value = 0
        q = l0
        while q < l1 - 1 and buf[q] == 48:  # leading zeros do not count
            q += 1
        if l1 - q > 10:
            isint = False
        for r in range(l0, l1):
            c = buf[r]
            hv = (hv ^ np.uint64(c)) * _FNV_PRIME
            if not _digit(c):
                isint = False
            elif isint and r >= q:
                value = value * 10 + (c - 48)
        if isint and value > MAX_LABEL:
            isint = False
        hs = np.int64(hv)
        if hs == 0:
            hs = 1
        if isint:
            y[rows] = value
            if value > info[I_MAX_LABEL]:
                info[I_MAX_LABEL] = value
            if classes > 0 and value >= classes and info[I_OOR] < 0:
                info[I_OOR] = rows
        else:
            y[rows] = -1
            info[I_NAMES] = 1
        h[rows] = hs
        slot = hs & (TABLE - 1)
        while tab[slot] != 0 and tab[slot] != hs:
            slot = (slot + 1) & (TABLE - 1)
        if tab[slot] == 0:
            if distinct <= MAX_CLASSES:
                tab[slot] = hs
                tpos[slot, 0], tpos[slot, 1], tpos[slot, 2] = l0, l1, rows
                distinct += 1
            else:
                info[I_MORE] = 1
        rows += 1
        line += 1
        pos = j + 1
        while buf[pos - 1] != 10:   # to the line's end (j may stop before it)
            pos += 1
    info[I_ROWS] = rows
    info[I_BLANK_TAIL] = blank
    return X[:rows], y[:rows], h[:rows], info, tab, tpos


@njit(cache=True)
def check_rows(A, label, classes):
    """Validate rows of a binary file (all float64, the label in column `label`) the way
    parse_text validates lines. Returns info (I_STATUS, I_LINE: the bad row, I_COL,
    I_MAX_LABEL, I_OOR) and the bad label's value (or 0.0)."""
    info = np.zeros(N_INFO, np.int64)
    info[I_LINE] = info[I_BLANK_TAIL] = info[I_MAX_LABEL] = info[I_OOR] = -1
    n, m = A.shape
    info[I_LINES] = n
    for i in range(n):
        v = A[i, label]
        if not np.isfinite(v) or v != np.floor(v):
            info[I_STATUS], info[I_LINE], info[I_COL] = NOT_INTEGER, i, label
            return info, v
        for k in range(m):
            if k != label and not np.isfinite(A[i, k]):
                info[I_STATUS], info[I_LINE], info[I_COL] = NONFINITE, i, k
                return info, v
        status = OK
        if v < 0:
            status = NEGATIVE
        elif v > MAX_LABEL:
            status = TOO_LARGE
        if status != OK:
            info[I_STATUS], info[I_LINE], info[I_AUX] = status, i, int(v) if status != TOO_LARGE else 0
            return info, v
        if v > info[I_MAX_LABEL]:
            info[I_MAX_LABEL] = int(v)
        if classes > 0 and v >= classes and info[I_OOR] < 0:
            info[I_OOR] = i
    info[I_ROWS] = n
    return info, 0.0


def compile_parsers() -> None:
    """Compile (or load from numba's cache) the kernels with the argument types of a run
    (a writable buffer: numba compiles read-only arrays separately)."""
    buf = np.array(bytearray(b"0.5\t1\n\n"), np.uint8)
    parse_text(buf, 0, len(buf) - 1, 0, 2, 1, 0)
    find_byte(buf, 0, len(buf), 10)
    check_rows(np.zeros((1, 2)), 1, 0)


@dataclass
class Summary:
    """What one chunk of a file found: all that the whole-file verdict needs (small:
    every rank sends its own to every other)."""
    lines: int        # lines in the chunk (line numbers of later chunks start after them)
    rows: int         # data points parsed
    blank_tail: int   # local line where a final run of blank lines starts, -1: none
    labels: lab.FileLabels   # its distinct labels, each with its first (local) row
    error: tuple[int, int, str] | None = None  # (local line, precedence, message)


@dataclass
class Codes:
    """A chunk's labels as the kernel left them: the integer label (-1: a name) and a
    hash of each row's label text, with the text of each distinct hash; `classes`
    turns them into class indices once every rank knows what the classes are."""
    y: np.ndarray
    h: np.ndarray | None = None
    hashes: np.ndarray | None = None   # sorted
    tokens: list | None = None         # the text of each

    def take(self, rows: np.ndarray) -> "Codes":
        """The codes of some rows."""
        return Codes(self.y[rows], None if self.h is None else self.h[rows], self.hashes, self.tokens)

    def classes(self, labels: lab.Labels) -> np.ndarray:
        if labels.names is None:
            return self.y
        if self.h is None:   # .npz: y holds the tokens themselves
            u, inv = np.unique(self.y.astype(str), return_inverse=True)
            return np.array([labels.of(t) for t in u.tolist()], np.int64)[inv].reshape(-1)
        cls = np.array([labels.of(t) for t in self.tokens], np.int64)
        return cls[np.searchsorted(self.hashes, self.h)]


def summarize(info: np.ndarray, d: Dialect, buf=None, tab=None, tpos=None, value: float = 0.0,
              binary: bool = False) -> tuple[Summary, tuple | None]:
    """A kernel's info as a Summary, with the message of its error if any, and (text)
    this chunk's distinct labels as (sorted hashes, their texts) for Codes."""
    fl = lab.FileLabels(names=bool(info[I_NAMES]), more=bool(info[I_MORE]), max_label=int(info[I_MAX_LABEL]),
                        out_of_range=int(info[I_OOR]))
    table = None
    if tab is not None:
        slots = np.flatnonzero(tab)
        order = np.argsort(tab[slots])
        slots = slots[order]
        texts = [bytes(buf[tpos[i, 0]:tpos[i, 1]]).decode("utf-8", "replace") for i in slots]
        for i, t in sorted(zip(slots.tolist(), texts), key=lambda p: tpos[p[0], 2]):
            fl.tokens.setdefault(t, int(tpos[i, 2]))
        table = (tab[slots], texts)
    s = Summary(int(info[I_LINES]), int(info[I_ROWS]), int(info[I_BLANK_TAIL]), fl)
    status = int(info[I_STATUS])
    if status == OK:
        return s, table
    token = (bytes(buf[info[I_TOK0]:info[I_TOK1]]).decode("utf-8", "replace")
             if buf is not None and info[I_TOK1] > info[I_TOK0] else "")
    aux, col = int(info[I_AUX]), int(info[I_COL])
    if binary:
        msg = {NOT_INTEGER: f"label {value:g} is not an integer",
               NEGATIVE: f"negative label {aux}", TOO_LARGE: f"label {value:g} is too large",
               NONFINITE: d.nonfinite(col)}[status]
    else:
        msg = {
            EMPTY_LINE: "empty line",
            FIELDS: d.fields_message(aux),
            NOT_NUMBER: d.not_a_number(col, token),
            EMPTY_FIELD: d.empty(col),
            NONFINITE: d.nonfinite(col),
            NOT_TEXT: f"not a text file (byte {aux:#x})",
        }[status]
    s.error = (int(info[I_LINE]), 0, msg)
    return s, table


def resolve(path: str, d: Dialect, chunks: list[Summary]) -> tuple[np.ndarray, int, lab.FileLabels]:
    """The verdict on a whole file from its chunks in file order: raises DataError for
    the file's first bad line; else returns (line offset of each chunk, from the first
    data line; data points; the labels, lines numbered in the file). Every rank calls it
    on the same list, so all agree."""
    offsets = np.concatenate([[0], np.cumsum([c.lines for c in chunks])[:-1]]).astype(np.int64)
    has_rows = [c.rows > 0 or (c.error is not None) for c in chunks]
    found = []  # (0-based line from the first data line, message)
    for k, c in enumerate(chunks):
        if c.error:
            found.append((offsets[k] + c.error[0], c.error[2]))
        if c.blank_tail >= 0 and any(has_rows[k + 1:]):
            found.append((offsets[k] + c.blank_tail, "empty line"))
    if found:
        line, msg = min(found, key=lambda f: f[0])
        raise DataError(f"{path}:{line + d.first_line}: {msg}")
    rows = sum(c.rows for c in chunks)
    if rows == 0:
        raise DataError(f"{path}: empty data file")
    labels = lab.merge([(c.labels, int(offsets[k]) + d.first_line) for k, c in enumerate(chunks)])
    return offsets, rows, labels


@njit(cache=True)
def find_byte(buf, a, b, c):
    """Index of the first byte c in buf[a:b], or -1."""
    for i in range(a, b):
        if buf[i] == c:
            return i
    return -1


def parse_chunk(buf: np.ndarray, lo: int, hi: int, d: Dialect, classes: int | None):
    """(X, Codes, Summary) of the lines buf[lo:hi] (see parse_text)."""
    X, y, h, info, tab, tpos = parse_text(buf, lo, hi, d.delim_byte, d.columns, d.label, classes or 0)
    s, table = summarize(info, d, buf, tab, tpos)
    codes = Codes(y, h, *table) if table else Codes(y)
    return X, codes, s


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


def parse_bytes(path: str, buf: np.ndarray, d: Dialect, classes: int | None = None):
    """(X, Codes, rows, FileLabels) of a whole text file read by read_bytes; DataError if bad."""
    if d.columns == 0:
        raise DataError(f"{path}: empty data file")
    X, codes, s = parse_chunk(buf, d.start, len(buf) - 1, d, classes)
    _, rows, fl = resolve(path, d, [s])
    return X, codes, rows, fl


def read_rows(path: str) -> np.ndarray:
    """All rows of a .npy data file (header checked)."""
    offset, rows, cols = npy_header(path)
    try:
        return np.fromfile(path, dtype="<f8", count=rows * cols, offset=offset).reshape(rows, cols)
    except OSError as e:
        raise DataError(f"{path}: cannot read data file: {e.strerror}") from None


def binary_dialect(path: str, columns: int, label_column: str | None) -> Dialect:
    """A .npy file's columns as a Dialect (no names), its label by --label-column."""
    if label_column is None:
        return Dialect(None, columns, columns - 1)
    try:
        i = int(label_column)
    except ValueError:
        raise DataError(f"--label-column {label_column}: {path} is binary and has no column names; give "
                        "the label's column index (0-based)") from None
    if not -columns <= i < columns:
        raise DataError(f"--label-column {label_column}: {path} has {columns} columns")
    return Dialect(None, columns, i % columns)


def check_array(A: np.ndarray, d: Dialect, classes: int | None = None) -> Summary:
    """Validate rows of a binary file: the Summary of A as one chunk (its error, if
    any, not yet raised: resolve does, for the whole file)."""
    info, value = check_rows(A, d.label, classes or 0)
    s, _ = summarize(info, d, value=float(value), binary=True)
    if s.error is None and len(A):   # its distinct labels (they are integers: no text, no first rows)
        y = A[:, d.label]
        top = int(info[I_MAX_LABEL])
        seen = (np.flatnonzero(np.bincount(y.astype(np.int64), minlength=top + 1)) if top < 1 << 22
                else np.unique(y.astype(np.int64)))
        s.labels.more = len(seen) > MAX_CLASSES + 1
        s.labels.tokens = {str(int(v)): 0 for v in seen[:MAX_CLASSES + 1]}
    return s


def split_rows(A: np.ndarray, d: Dialect) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of binary rows: the label's column out of the features."""
    y = A[:, d.label].astype(np.int64)
    if d.label == A.shape[1] - 1:
        return np.ascontiguousarray(A[:, :-1]), y
    return np.ascontiguousarray(np.delete(A, d.label, axis=1)), y


def read_file(path: str, classes: int | None = None, delimiter: str = "auto", header: bool | None = None,
              label_column: str | None = None) -> Dataset:
    """A whole data file of any format with the fast parser (one process, no MPI)."""
    if is_npz(path):
        X, y, tokens = read_npz(path, classes, label_column)
        d = Dialect(None, X.shape[1] + 1, X.shape[1])
        fl = npz_labels(path, y, tokens, classes)
        labels = lab.decide(path, d, fl, len(X), classes)
        return Dataset(X, Codes(y if tokens is None else tokens).classes(labels), labels.classes, labels.names)
    if is_binary(path):
        A = read_rows(path)
        d = binary_dialect(path, A.shape[1], label_column)
        _, rows, fl = resolve(path, d, [check_array(A, d, classes)])
        X, y = split_rows(A, d)
        labels = lab.decide(path, d, fl, rows, classes)
        return Dataset(X, y, labels.classes)
    d = dialect_of(path, delimiter, header, label_column)
    X, codes, rows, fl = parse_bytes(path, read_bytes(path), d, classes)
    labels = lab.decide(path, d, fl, rows, classes)
    return Dataset(X, codes.classes(labels), labels.classes, labels.names)
