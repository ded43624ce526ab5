"""What the label column says the classes are, the same for both parsers and every rank.

Integer labels (every label a non-negative integer, the paper's format and .npy's) are
the classes themselves: label k is class k, classes = max label + 1 (or --classes).
Any other label (a word, a negative or decimal number) makes the column names: the
distinct labels, sorted (by value when all are numbers), are classes 0, 1, ...; the run
folder keeps them (labels.json) and asgd.predict writes them back.

Integer labels with a word among them are refused (a typo, most likely) unless --classes
is given. A column whose values look like a measurement rather than classes is refused, unless
--classes says how many classes there are: more than MAX_CLASSES classes, most values
distinct, integers spread thinly over 0..max (a year: 2,010 classes for 3 values), or
numbers with decimals. A missing label (empty, NA, nan, ...) is an error naming its line.
A label value that may be no class (a handful of rows, or a code such as -1 or 999 that
files write for "unknown") is a class all the same, with a note naming it (`notes`); so is
an integer class below the largest label that no row has (1-based labels: class 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from . import DataError
from .dialect import MISSING, Dialect, is_number

MAX_CLASSES = 1000   # more distinct labels than this: a measurement, or not what asgd is for
FEW_ROWS = 20        # below this many rows, "most values distinct" says nothing
SPARSE_FROM = 20     # integer labels with this many classes or more must use half of them
MAX_LABEL = 2**31 - 1  # an integer label above this is a name, not an index


@dataclass
class FileLabels:
    """What a file's (or a chunk's) label column holds."""
    tokens: dict = field(default_factory=dict)  # distinct label -> first line (1-based; a chunk's: local row)
    more: bool = False       # more distinct labels than kept (MAX_CLASSES + 1)
    names: bool = False      # some label is not a non-negative integer
    max_label: int = -1      # the largest integer label
    out_of_range: int = -1   # the first line (row) of an integer label >= --classes, -1: none

    def add(self, token: str, line: int, classes: int | None) -> None:
        """The reference parser's way in, one label at a time."""
        if token not in self.tokens:
            if len(self.tokens) > MAX_CLASSES:
                self.more = True
            else:
                self.tokens[token] = line
        v = integer(token)
        if v is None:
            self.names = True
            return
        self.max_label = max(self.max_label, v)
        if classes and v >= classes and self.out_of_range < 0:
            self.out_of_range = line


def integer(token: str) -> int | None:
    """A label that is a class index: digits only, at most MAX_LABEL."""
    if not token.isascii() or not token.isdigit():
        return None
    v = int(token)
    return v if v <= MAX_LABEL else None


def merge(parts: list[tuple[FileLabels, int]]) -> FileLabels:
    """One file's labels from its chunks in file order, each with the line number of its
    first row (chunks count rows from 0)."""
    out = FileLabels()
    for p, first in parts:
        for t, row in p.tokens.items():
            if t not in out.tokens:
                if len(out.tokens) > MAX_CLASSES:
                    out.more = True
                else:
                    out.tokens[t] = first + row
        out.more |= p.more
        out.names |= p.names
        out.max_label = max(out.max_label, p.max_label)
        if p.out_of_range >= 0 and out.out_of_range < 0:
            out.out_of_range = first + p.out_of_range
    return out


@dataclass(frozen=True)
class Labels:
    classes: int
    names: tuple[str, ...] | None   # class k's label as the file spells it; None: integer labels

    @cached_property
    def index(self) -> dict[str, int]:
        return {t: k for k, t in enumerate(self.names)} if self.names else {}

    def of(self, token: str) -> int:
        """The class of a label token (-1: a label the model never saw)."""
        if self.names:
            return self.index.get(token, -1)
        v = integer(token)
        return v if v is not None and v < self.classes else -1

    def label(self, k: int) -> str:
        """How class k is written in the file."""
        return self.names[k] if self.names else str(k)


def ordered(names) -> tuple[str, ...]:
    """Distinct labels in class order: by value when all are numbers, else as text."""
    names = sorted(names)
    if all(is_number(t) for t in names):
        names.sort(key=lambda t: (float(t), t))
    return tuple(names)


def decide(path: str, dialect: Dialect, train: FileLabels, rows: int, classes: int | None,
           test: FileLabels | None = None, test_path: str | None = None) -> Labels:
    """The classes of a run from its files' label columns; raises DataError (one line,
    naming the column and the fix) for a missing label or a column that is no classes."""
    for fl, p in ((train, path), (test, test_path)):
        if fl is None:
            continue
        missing = [(line, t) for t, line in fl.tokens.items() if t.strip().lower() in MISSING]
        if missing:
            line, t = min(missing)
            raise DataError(f"{p}:{line}: the label, {dialect.label_name()}, is {t!r}: a missing value; "
                            "drop the rows that lack one")
    if not classes:   # integer classes and a word among them: a typo more likely than a class
        ints = any(integer(t) is not None for fl in (train, test) if fl for t in fl.tokens)
        for fl, p in ((train, path), (test, test_path)):
            words = [(line, t) for t, line in (fl.tokens.items() if fl else ()) if not is_number(t)]
            if ints and words:
                line, t = min(words)
                raise DataError(f"{p}:{line}: label {t!r} is not an integer, as the column's other labels are: "
                                "fix the line, or give --classes N to take every label as a class name")
    as_names = train.names or (test is not None and test.names)
    fix = _fix(dialect)
    if as_names:
        tokens = set(train.tokens) | (set(test.tokens) if test else set())
        more = train.more or (test is not None and test.more) or len(tokens) > MAX_CLASSES
        if classes:
            if more or len(tokens) > classes:
                got = f"more than {MAX_CLASSES}" if more else f"{len(tokens):,}"
                raise DataError(f"{path}: the label, {dialect.label_name()}, has {got} distinct values, more "
                                f"than --classes {classes}")
        else:
            why = None
            n = len(set(train.tokens))
            if more:
                why = f"more than {MAX_CLASSES:,} distinct values"
            elif rows >= FEW_ROWS and 2 * n > rows:
                why = f"{n:,} distinct values in {rows:,} rows"
            elif all(is_number(t) for t in tokens) and any(float(t) != round(float(t)) for t in tokens):
                why = f"numbers with decimals ({', '.join(sorted(tokens, key=float)[:3])}, ...)"
            if why:
                raise DataError(f"{path}: the label, {dialect.label_name()}, looks like a measurement, not "
                                f"classes: {why}; {fix}")
        names = ordered(tokens)
        if len(names) < 2:
            raise DataError(f"{path}: every label is {names[0]!r}; need at least 2 classes")
        return Labels(max(classes or 0, len(names)), names)
    if classes:
        for fl, p in ((train, path), (test, test_path)):
            if fl is not None and fl.out_of_range >= 0:
                bad = max((int(t) for t in fl.tokens if int(t) >= classes), default=None)
                raise DataError(f"{p}:{fl.out_of_range}: label {bad if bad is not None else 'value'} out of "
                                f"range for --classes {classes}")
        return Labels(classes, None)
    k = max(train.max_label, test.max_label if test else -1) + 1
    distinct = {int(t) for t in train.tokens}
    why = None
    if k > MAX_CLASSES or train.more:
        why = f"{k:,} classes (integer labels up to {k - 1:,})"
    elif rows >= FEW_ROWS and 2 * len(distinct) > rows:
        why = f"{len(distinct):,} distinct values in {rows:,} rows"
    elif k >= SPARSE_FROM and 2 * len(distinct) < k:
        why = f"{k:,} classes (integer labels up to {k - 1:,}) of which {len(distinct):,} occur"
    if why:
        raise DataError(f"{path}: the label, {dialect.label_name()}, looks like a measurement, not classes: "
                        f"{why}; {fix}")
    if k < 2:
        raise DataError(f"{path}: all labels are 0; need at least 2 classes")
    return Labels(k, None)


HANDFUL = 5           # a class of this many rows or fewer ...
RARE_SHARE = 0.1      # ... and under this share of an even split of the rows: a stray value, likely
CODE_SHARE = 0.1      # a missing-value code with under this share of an even split (and 2 classes
                      # besides it: -1/+1 is a binary encoding) is noted, however many its rows
MISSING_CODES = {-1.0, -9.0, -99.0, -999.0, -9999.0, 99.0, 999.0, 9999.0, 99999.0}   # written for "unknown"


def notes(labels: Labels, counts, where: str) -> list[str]:
    """One line for each label value that may not be a class at all, and was made one:
    a class of a handful of rows (at most HANDFUL, under RARE_SHARE of an even split),
    or a value written for "unknown" (MISSING_CODES; the NA-like words are refused as
    missing labels) on fewer than CODE_SHARE of an even split, beside 2 classes or more.
    counts[k]: the rows of class k in the data (all of it: every rank's share and the
    held-out rows)."""
    rows = int(sum(counts))
    even = rows / max(labels.classes, 1)
    out = []
    for k, n in enumerate(int(c) for c in counts):
        token = labels.label(k)
        code = is_number(token) and float(token) in MISSING_CODES and labels.classes > 2
        if not n or not ((n <= HANDFUL and n < RARE_SHARE * even) or (code and n < CODE_SHARE * even)):
            continue
        shown = (", ".join(labels.label(j) for j in range(labels.classes)) if labels.classes <= 10
                 else f"{labels.label(0)} .. {labels.label(labels.classes - 1)}")
        out.append(f"{where}: label {token!r} is on {n:,} row{'s' if n != 1 else ''} of {rows:,}"
                   + (" and looks like a missing-value code" if code else "")
                   + f", yet it is a class of its own: the model has {labels.classes} classes ({shown}"
                   + (f", as classes 0 .. {labels.classes - 1}" if labels.names else "")
                   + "); drop or fix those rows if they are not a class")
    return out + _empty_note(labels, counts, where)


def _empty_note(labels: Labels, counts, where: str) -> list[str]:
    """A line when integer labels leave a class below the largest one without rows: label k
    is class k, so labels 1, 2, 3 (1-based, as UCI wine's) make 4 classes, class 0 empty."""
    present = [k for k, n in enumerate(counts) if n]
    if labels.names or not present:
        return []
    top = present[-1]
    empty = [k for k in range(top) if not counts[k]]
    if not empty:
        return []
    shown = ", ".join(map(str, empty[:6])) + (", ..." if len(empty) > 6 else "")
    return [f"{where}: no row has label{'s' if len(empty) > 1 else ''} {shown}, yet integer labels are class "
            f"indices: the model has {labels.classes} classes (0 .. {labels.classes - 1})"
            + (f"; the labels look 1-based (1 .. {top}): subtract 1 from them for {top} classes"
               if empty == [0] else "")]


def _fix(d: Dialect) -> str:
    pick = "choose the label column with --label-column NAME or INDEX"
    if d.names:
        shown = ", ".join(n for i, n in enumerate(d.names) if i != d.label)
        pick += f" (the others: {shown[:80] + ('...' if len(shown) > 80 else '')})"
    else:
        pick += f" (0..{d.columns - 1})"
    return pick + ", or give --classes N if these are classes"
