"""How a delimited text file is laid out, found from its first lines: the delimiter
(comma, tab, semicolon, pipe, or any run of white space), whether line 1 is a header of
column names, and which column is the label. Both parsers (formats.read_text, the
reference, and the numba parser in parse.py) take a Dialect and word their messages
with it, so a message names the column as the user knows it: "column 3 ('bill_length')".

Detection (`sniff`, on at most HEAD_BYTES of the file's start, the same bytes on every
rank, so every rank finds the same dialect):
  delimiter  a comma, semicolon or pipe (in that order) that occurs on line 1 as often
             as on most sampled lines; a tab that occurs as often on every sampled line;
             else white space (the paper's format, and files whose tab counts differ, as
             with trailing tabs)
  header     line 1 is a header when none of its fields is a number in the columns that
             are numbers on every other sampled line (and there is such a column), or when
             it starts with '#' (numpy.savetxt's header; the '#' is no part of a name)
  label      --label-column NAME (a header's name) or INDEX (0-based; negative counts
             from the end); default: the last column
A field may be quoted ("a"); a delimiter inside quotes is not supported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HEAD_BYTES = 1 << 16   # the bytes sniffed; more if line 1 and 2 are longer
SAMPLE_LINES = 50      # lines sniffed at most
DELIMITERS = {"comma": ",", "tab": "\t", "semicolon": ";", "pipe": "|", "whitespace": None}
CANDIDATES = (",", "\t", ";", "|")   # detection order
MISSING = ("", "na", "n/a", "nan", "null", "none", "?", "-", "missing")   # what a missing value looks like
BOM = b"\xef\xbb\xbf"


class DialectError(ValueError):
    """A dialect that cannot be: the message is one line (formats wraps it in DataError)."""


def delimiter_option(value: str | None) -> str | None:
    """--delimiter's value -> 'auto' (None given), a one-character delimiter, or
    'whitespace'. Raises ValueError with a one-line message."""
    if value is None or value == "auto":
        return "auto"
    if value in DELIMITERS:
        return DELIMITERS[value] or "whitespace"
    if value in ("\\t", "TAB"):
        return "\t"
    if len(value) == 1 and not value.isalnum() and value not in "\"'.-+":
        return value
    raise ValueError(f"--delimiter must be auto, comma, tab, semicolon, pipe, whitespace or one "
                     f"punctuation character, got {value!r}")


def add_file_options(g) -> None:
    """asgd.train's options that say how to read a data file, for every command that reads
    one as asgd.train does (asgd.data check): --delimiter, --header, --label-column, --classes."""
    g.add_argument("--delimiter", default="auto", metavar="SEP",
                   help="what separates a text file's fields: comma, tab, semicolon, pipe, whitespace, one "
                        "punctuation character, or auto (default: detected from the first lines)")
    g.add_argument("--header", action="store_true", default=None,
                   help="line 1 holds column names (default: detected: a line 1 with no number where the "
                        "other lines have numbers)")
    g.add_argument("--label-column", metavar="NAME|INDEX",
                   help="the label's column: a header's name, or an index from 0 (-1: the last; default: the "
                        "last; error messages count columns from 1, as a spreadsheet does). Labels are class "
                        "indices 0..K-1, or names (any text), mapped to classes in sorted order (OUT/labels.json)")
    g.add_argument("--classes", type=int, help="number of classes (default: from the labels); also accepts a "
                   "label column that looks like a measurement (more than 1,000 classes, most values distinct)")


@dataclass(frozen=True)
class Dialect:
    delimiter: str | None           # None: any run of white space separates fields
    columns: int                    # fields a line has: the features and the label
    label: int | None               # the label's column, 0-based; None: no label (new data to predict)
    names: tuple[str, ...] | None = None   # the header's column names; None: no header
    start: int = 0                  # byte offset of the first data line
    first_line: int = 1             # its line number (1-based)
    line1: str = field(default="", compare=False, repr=False)   # line 1's text, for the hints

    @property
    def features(self) -> int:
        return self.columns - 1

    @property
    def delim_byte(self) -> int:
        """The kernel's delimiter: its byte, or 0 for white space."""
        return 0 if self.delimiter is None else ord(self.delimiter)

    def column(self, c: int) -> str:
        """'column 3' or "column 3 ('bill_length')" (1-based, as a spreadsheet counts)."""
        name = self.names[c] if self.names and c < len(self.names) else None
        return f"column {c + 1}" + (f" ({name!r})" if name else "")

    def label_name(self) -> str:
        """The label's column as a user would find it: "column 8 ('year', the last)"."""
        where = ["the last"] if self.label == self.columns - 1 else ["the first"] if self.label == 0 else []
        name = [repr(self.names[self.label])] if self.names else []
        said = ", ".join(name + where)
        return f"column {self.label + 1}" + (f" ({said})" if said else "")

    def feature_columns(self) -> list[int]:
        """The features' columns, in file order."""
        return [c for c in range(self.columns) if c != self.label]

    def to_dict(self) -> dict:
        """What results.json records, and what asgd.predict reads new files with."""
        return {"delimiter": "whitespace" if self.delimiter is None else self.delimiter,
                "header": list(self.names) if self.names else None, "label_column": self.label,
                "columns": self.columns}

    # -- messages: both parsers word a bad line alike --------------------------------

    def fields_message(self, got: int) -> str:
        like = "the header" if self.names else f"line {self.first_line}"
        msg = f"expected {self.columns} fields like {like}, got {got}"
        return msg + self._separator_hint()

    def not_a_number(self, c: int, token: str) -> str:
        what = "the label" if c == self.label else self.column(c)
        if token.strip().lower() in MISSING:
            return (f"{what} is {token!r}: a missing value; asgd needs every value: drop or fill "
                    "the rows that lack one")
        msg = f"{what}: {token!r} is not a number"
        if self.delimiter is None and any(d in token for d in CANDIDATES):
            sep = next(d for d in CANDIDATES if d in token)
            return msg + f" (are the fields separated by {sep!r}? then --delimiter {_spelled(sep)})"
        if _DECIMAL_COMMA.fullmatch(token):   # "12,77" in a semicolon-separated file: a European spreadsheet's
            return msg + " (a decimal comma? asgd reads '.' decimals)"
        if not is_number(token.lstrip("+-")[:1] or "x"):   # a word, not a mistyped number
            name = self.names[c] if self.names else str(c)
            msg += (f"; features must be numbers: if this column is the label, use --label-column {name}, "
                    "else drop or encode it")
        return msg

    def empty(self, c: int) -> str:
        what = f"the label, {self.column(c)}," if c == self.label else self.column(c)
        return f"{what} is empty; asgd needs every value: drop or fill the rows that lack one"

    def nonfinite(self, c: int) -> str:
        return (f"{self.column(c)} is NaN or infinite; asgd needs every feature a finite number: drop or "
                "fill the rows that lack one")

    def too_few_columns(self, got: int) -> str:
        return f"need at least one feature and a label, got {got} field(s)" + self._separator_hint()

    def _separator_hint(self) -> str:
        return _hint(self.delimiter, self.line1)


INDEX_NAMES = ("", "Unnamed: 0")   # pandas: to_csv's name for its index column, and read_csv's for that one


def index_notes(read_as: dict | None, where: str) -> list[str]:
    """A line when a header's first name is empty (or 'Unnamed: 0'): most likely a pandas
    DataFrame.to_csv() file's row index, which parses as numbers and so would be trained
    on as a feature without a word. Noted, not dropped: it may be a feature after all.
    read_as: Dialect.to_dict() (results.json's `read_as`)."""
    names = (read_as or {}).get("header")
    if not names or names[0] not in INDEX_NAMES or read_as.get("label_column") == 0:
        return []
    named = "has no name" if not names[0] else f"is named {names[0]!r}"
    return [f"{where}: column 1 {named} and looks like a row index (pandas' to_csv writes its index so), yet "
            f"it is trained on as a feature: write the file with to_csv(index=False), or drop the column"]


def _spelled(sep: str) -> str:
    return {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe"}.get(sep, repr(sep))


def _hint(delimiter: str | None, line: str) -> str:
    """A clause that names the delimiter a line seems to have, when it is not the one used."""
    if delimiter is not None:
        return ""
    sep = next((d for d in (",", ";", "|") if d in line), None)
    if sep is None:
        return ""
    return (f"; the line has {sep!r} in it: if that separates the fields, use --delimiter {_spelled(sep)} "
            "(or leave --delimiter out: it is detected)")


_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)",
                     re.IGNORECASE)


_DECIMAL_COMMA = re.compile(r"[+-]?[0-9]*,[0-9]+")


def is_number(s: str) -> bool:
    """What the parsers take as a feature: a decimal number ([+-]digits[.digits][e[+-]digits]),
    or inf/infinity/nan (which they then refuse as not finite)."""
    return _NUMBER.fullmatch(s) is not None


_WS = re.compile(r"[ \t\n\r\x0b\x0c\x1c-\x1f]+")   # the parsers' white space: ASCII's, as str.split() within ASCII
_BLANKS = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"


def unquote(field: str) -> str:
    return field[1:-1] if len(field) >= 2 and field[0] == field[-1] == '"' else field


def split(line: str, delimiter: str | None) -> list[str]:
    """A line's fields as the parsers cut them: white space runs, or the delimiter with
    the blanks around each field trimmed; quotes around a field removed."""
    if delimiter is None:
        return [unquote(f) for f in _WS.split(line) if f]
    return [unquote(f.strip(_BLANKS)) for f in line.split(delimiter)]


def blank(line: str) -> bool:
    return not line.strip(_BLANKS)


def sniff(path: str, head: bytes, delimiter: str = "auto", header: bool | None = None,
          label_column: str | None = None) -> Dialect:
    """The Dialect of a text file from its first bytes (`head`: the whole file if it is
    short). delimiter: 'auto', 'whitespace' or the character; header: None to detect;
    label_column: a name, an index, or None for the last column. Raises DialectError."""
    start = len(BOM) if head.startswith(BOM) else 0
    text = head[start:].decode("utf-8", "replace")
    lines = text.split("\n")
    if len(head) >= HEAD_BYTES and len(lines) > 1:
        lines = lines[:-1]   # the last may be cut short
    lines = [ln for ln in lines[:SAMPLE_LINES + 1]]
    sample = [ln for ln in lines if not blank(ln)]
    if not sample:
        return Dialect(None, 0, -1, None, start, 1)   # empty: the parser says so, with its line
    delim = delimiter if delimiter != "auto" else _detect(sample)
    delim = None if delim == "whitespace" else delim
    rows = [split(ln, delim) for ln in sample]
    line1_blank = blank(lines[0])
    commented = lines[0].lstrip(_BLANKS).startswith("#")   # numpy.savetxt's header: "# a,b,label"
    if commented:   # its names without the '#' (else the first is '# a'); a data line cannot start so
        rows[0] = split(lines[0].lstrip(_BLANKS).lstrip("#").lstrip(_BLANKS), delim)
    has_header = header if header is not None else (not line1_blank and (commented or _looks_like_header(rows)))
    if header and line1_blank:
        raise DialectError(f"{path}:1: --header, but line 1 is blank")
    names = tuple(rows[0]) if has_header else None
    columns = len(rows[0])
    data_start, first = start, 1
    if has_header:   # the data start after line 1
        nl = head.find(b"\n", start)
        data_start, first = (nl + 1 if nl >= 0 else len(head)), 2
    d = Dialect(delim, columns, columns - 1, names, data_start, first, line1=sample[0])
    if columns < 2 and not line1_blank:
        raise DialectError(f"{path}:1: {d.too_few_columns(columns)}")
    return Dialect(delim, columns, _label_index(path, label_column, columns, names), names, data_start, first,
                   line1=sample[0])


def _detect(sample: list[str]) -> str:
    """A tab when every line has as many (and something after the last); a comma, semicolon or pipe when line 1 has as
    many as most lines (a short or long line is then an error that names it)."""
    for c in CANDIDATES:
        counts = [ln.count(c) for ln in sample]
        if c == "\t":
            trailing = all(not ln.rsplit("\t", 1)[-1].strip() for ln in sample)   # "a\tb\t0 \t": blanks
            if len(set(counts)) == 1 and counts[0] >= 1 and not trailing:
                return c
            continue
        common = max(set(counts), key=counts.count)
        if common >= 1 and counts[0] == common:
            return c
    return "whitespace"


def _looks_like_header(rows: list[list[str]]) -> bool:
    if len(rows) < 2:
        return False
    first, rest = rows[0], rows[1:]
    numeric = [c for c in range(len(first))
               if all(c < len(r) and is_number(r[c]) for r in rest)]
    return bool(numeric) and not any(is_number(first[c]) for c in numeric)


def _label_index(path: str, spec: str | None, columns: int, names) -> int:
    if spec is None:
        return columns - 1
    try:
        i = int(spec)
    except ValueError:
        i = None
    if i is not None:
        if not -columns <= i < columns:
            raise DialectError(f"--label-column {spec}: {path} has {columns} columns (0..{columns - 1}, or "
                               f"-1 for the last)")
        return i % columns
    if names is None:
        raise DialectError(f"--label-column {spec}: {path} has no header line (its line 1 is data), so "
                           "columns have no names: give the label's column index (0-based), or --header")
    if spec not in names:
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        raise DialectError(f"--label-column {spec}: no such column in {path}'s header ({shown})")
    return names.index(spec)
