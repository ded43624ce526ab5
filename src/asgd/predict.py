"""python -m asgd.predict RUN_DIR [FILE] [--out PRED.csv]: apply a trained run to new data.

    python -m asgd.predict runs/RUN new.csv --out predictions.csv
reads new.csv as the run read its data (the delimiter and header are detected; where
both files have a header, the columns by name, in any order, else by position, the
label's column by its index where the file has one more column than the model has
features), scales it as the run did (standardize.json), and writes a line per row: its
prediction (the run's label names, labels.json, where it had names) and the probability
of each class. Where the file has labels, it prints the accuracy and the confusion matrix.
    python -m asgd.predict runs/RUN --held-out
applies the run to its own held-out points: the accuracy it prints is results.json's.
--held-out reads the run's data file, at the path results.json records (data.train, or
its test file, data.test), unchanged (its sha256 is checked): heldout.npy holds the
held-out rows' indices, not the rows.

numpy only: no MPI, no numba (the reference parser and forward pass). New files are
predicted with the run folder alone; --held-out needs the run's data file too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from . import BadInput
from .data import formats
from .data import labels as lab
from .data.dialect import DELIMITERS, Dialect, delimiter_option
from .net.mlp import Layout
from .net.reference import predict as forward
from .run import signals
from .run.folder import file_digest


class PredictError(BadInput):
    """A run folder or file that cannot be used; one line a user can act on."""


class Run:
    """What a run folder says about the model: its layout, weights, scaling, classes and
    how its data file was read."""

    def __init__(self, folder: str):
        path = os.path.join(folder, "results.json")
        try:
            with open(path) as f:
                self.results = json.load(f)
        except FileNotFoundError:
            raise PredictError(f"{folder}: no results.json: not a finished asgd.train run folder") from None
        except (OSError, json.JSONDecodeError) as e:
            raise PredictError(f"{path}: cannot read it ({e})") from None
        c = self.results["config"]
        if self.results.get("dry_run"):
            raise PredictError(f"{folder}: a --dry-run: nothing was trained")
        self.folder = folder
        self.layout = Layout(c["features"], c["hidden"], c["classes"])
        try:
            self.w = np.load(os.path.join(folder, "weights.npy"))
        except OSError as e:
            raise PredictError(f"{folder}: cannot read weights.npy ({e})") from None
        precision = c.get("precision", "float64")   # a run from before --precision: float64
        if self.w.dtype != np.dtype(precision):
            raise PredictError(f"{folder}: weights.npy holds {self.w.dtype}, the run trained in {precision}")
        if self.w.shape != (self.layout.n_w,):
            raise PredictError(f"{folder}: weights.npy has {self.w.size} values, the {c['features']}-{c['hidden']}-"
                               f"{c['classes']} MLP {self.layout.n_w}")
        scaling = self.results.get("standardize")
        self.scaling = (np.array(scaling["mean"]), np.array(scaling["std"])) if scaling else None
        self.data = self.results.get("data") or {}
        names = self.data.get("labels")
        self.labels = lab.Labels(c["classes"], tuple(names) if names else None)
        self.read_as = self.data.get("read_as") or {}

    @property
    def features(self) -> int:
        return self.layout.d_in

    def probabilities(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities of raw rows: scaled as in training, then the forward pass."""
        if self.scaling is not None:
            X = X.copy()
            X -= self.scaling[0]   # the same operations as training's (data.standardize.apply)
            X /= self.scaling[1]
        # as training: the scaled features cast once to the run's precision; the forward
        # pass then in float64 from those values and the weights (exact in float64)
        X = X.astype(self.w.dtype, copy=False).astype(np.float64, copy=False)
        return forward(self.layout, self.w.astype(np.float64, copy=False), X)


def read(run: Run, path: str, delimiter: str = "auto", header: bool | None = None):
    """(X, label tokens or None) of a file to predict. Where it and the run's data file
    have a header, its columns by name (_by_name); else by position, its label column, if
    any, by its index where the file has one more column than the model has features."""
    if formats.is_npz(path):
        X, y, tokens = formats.read_npz(path)
        return _check(run, path, X), (list(y.astype(str)) if tokens is None else list(tokens))
    if formats.is_binary(path):
        _, _, cols = formats.npy_header(path)
        A = np.load(path)
        if cols == run.features:
            return A, None
        label = run.read_as.get("label_column", cols - 1)
        if cols != run.features + 1:
            raise PredictError(f"{path}: {cols} columns; the model takes {run.features} features (and a label)")
        return np.delete(A, label, axis=1), [str(int(v)) if v == int(v) else repr(v) for v in A[:, label]]
    d = formats.dialect_of(path, delimiter, header)
    if d.columns == 0:
        raise PredictError(f"{path}: empty data file")
    trained = run.read_as.get("header")
    label_name = trained[run.read_as["label_column"]] if trained else None
    if trained and d.names and len(set(trained)) == len(trained):   # by name, whatever the file's order
        return _by_name(run, path, d, [n for n in trained if n != label_name], label_name)
    if d.names and label_name in d.names:
        label = d.names.index(label_name)
    elif d.columns == run.features + 1:
        label = run.read_as.get("label_column", d.columns - 1)
    elif d.columns == run.features:
        label = None
    else:
        raise PredictError(f"{path}: {d.columns} columns; the model takes {run.features} features (and perhaps "
                           "a label)")
    d = Dialect(d.delimiter, d.columns, label, d.names, d.start, d.first_line, d.line1)
    X, tokens, _ = formats.parse_reference(path, d)
    return _check(run, path, X), tokens


def _by_name(run: Run, path: str, d: Dialect, features: list[str], label_name: str):
    """(X, label tokens or None) of a file with a header: its columns reordered to the
    run's features by name (a label column is read as the label); a feature it lacks or a
    column the run never saw is refused, not read in another's place."""
    missing = [n for n in features if n not in d.names]
    extra = [n for n in d.names if n not in features and n != label_name]
    twice = sorted({n for n in d.names if d.names.count(n) > 1})
    if missing or extra or twice:
        said = [f"{what}: {', '.join(names)}" for what, names in
                (("missing", missing), ("not features of the run", extra), ("named twice", twice)) if names]
        them = "it" if len(extra) == 1 else "them"   # what to do: the run cannot use a column it never saw
        raise PredictError(f"{path}: its columns are matched to the run's features ({', '.join(features)}) by the "
                           f"header's names; {'; '.join(said)}"
                           + (f"; drop {them} from the file (the run was trained without {them})" if extra else ""))
    label = d.names.index(label_name) if label_name in d.names else None
    d = Dialect(d.delimiter, d.columns, label, d.names, d.start, d.first_line, d.line1)
    X, tokens, _ = formats.parse_reference(path, d)
    order = [n for c, n in enumerate(d.names) if c != label]   # X's columns, in the file's order
    return _check(run, path, X[:, [order.index(n) for n in features]]), tokens


def _check(run: Run, path: str, X: np.ndarray) -> np.ndarray:
    if X.shape[1] != run.features:
        raise PredictError(f"{path}: {X.shape[1]} features; the model takes {run.features}")
    return X


def held_out(run: Run) -> tuple[str, np.ndarray | None]:
    """The run's own held-out points: (file, its rows, None for all of it)."""
    d = run.data
    if d.get("embedded"):
        raise PredictError(f"{run.folder}: trained on the embedded problem; its held-out points are generated "
                           "(asgd.data.problem), not a file")
    if d.get("test"):
        f, rows, which = d["test"], None, "test file (results.json's data.test)"
    else:
        f, which = d["train"], "data file (results.json's data.train)"
        try:
            rows = np.load(os.path.join(run.folder, d.get("heldout") or "heldout.npy"))
        except OSError as e:
            raise PredictError(f"{run.folder}: cannot read its held-out rows ({e})") from None
    if not os.path.exists(f["path"]):
        # the run folder holds the held-out rows' indices only: the rows are in this file
        raise PredictError(f"{f['path']}: not there; --held-out reads the run's {which} for its held-out rows"
                           + (" (heldout.npy holds their indices, not the rows)" if rows is not None else "")
                           + ": put it back there")
    now = file_digest(f["path"])
    if now["sha256"] != f["sha256"]:
        raise PredictError(f"{f['path']}: changed since the run (sha256 {now['sha256'][:12]}..., the run's "
                           f"{f['sha256'][:12]}...): its held-out rows may not be the run's")
    return f["path"], rows


def confusion(y: np.ndarray, pred: np.ndarray, k: int) -> np.ndarray:
    """counts[true, predicted] (rows with a label the model never saw left out)."""
    seen = y >= 0
    return np.bincount(y[seen] * k + pred[seen], minlength=k * k).reshape(k, k)


def report(run: Run, y: np.ndarray, pred: np.ndarray, out=sys.stdout) -> float:
    """Print the accuracy and the confusion matrix; return the accuracy."""
    acc = float(np.mean(pred == y))
    k = run.labels.classes
    unseen = int(np.sum(y < 0))
    print(f"accuracy {acc:.4f} ({int(np.sum(pred == y)):,} of {len(y):,} rows)"
          + (f"; {unseen:,} row(s) have a label the model never saw (counted wrong)" if unseen else ""), file=out)
    m = confusion(y, pred, k)
    names = [run.labels.label(c) for c in range(k)]
    width = max(8, *(len(n) for n in names)) + 1
    print("confusion matrix (rows: true label, columns: predicted)", file=out)
    print(" " * width + "".join(f"{n[:width - 1]:>{width}}" for n in names), file=out)
    for c in range(k):
        print(f"{names[c][:width - 1]:>{width}}" + "".join(f"{v:>{width}}" for v in m[c]), file=out)
    return acc


def write(path: str, run: Run, rows: np.ndarray, P: np.ndarray, pred: np.ndarray) -> None:
    """A CSV: row, prediction, then each class's probability."""
    names = [run.labels.label(c) for c in range(run.labels.classes)]
    with open(path, "w") as f:
        f.write(",".join(["row", "prediction"] + [f"p_{_csv(n)}" for n in names]) + "\n")
        for r, p, probs in zip(rows, pred, P):
            f.write(f"{r},{_csv(names[p])}," + ",".join(f"{v:.6g}" for v in probs) + "\n")


def _csv(s: str) -> str:
    return f'"{s}"' if any(c in s for c in ',"\n') else s


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asgd.predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN_DIR", help="a run folder asgd.train wrote (results.json, weights.npy)")
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="rows to predict: text (as the run's data), .npy or .npz; with or without the label")
    p.add_argument("--held-out", action="store_true",
                   help="predict the run's own held-out points instead of FILE (the accuracy is results.json's), "
                   "read from the run's data file (its path in results.json)")
    p.add_argument("--out", metavar="PRED.csv", help="write each row's prediction and class probabilities here")
    p.add_argument("--delimiter", default="auto", metavar="SEP",
                   help=f"FILE's delimiter: {', '.join(DELIMITERS)}, one character, or auto (default: detected)")
    p.add_argument("--header", action="store_true", default=None, help="FILE's line 1 holds column names "
                   "(default: detected)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        delimiter = delimiter_option(a.delimiter)
    except ValueError as e:
        p.error(str(e))
    if bool(a.file) == a.held_out:
        p.error("give FILE, or --held-out for the run's own held-out points")
    try:
        run = Run(a.run)
        if a.held_out:
            path, rows = held_out(run)
            X, tokens = read(run, path, run.read_as.get("delimiter", delimiter) if run.read_as else delimiter,
                             bool(run.read_as.get("header")) or None)
            if rows is not None:
                X, tokens = X[rows], [tokens[i] for i in rows]
        else:
            path, rows = a.file, None
            X, tokens = read(run, path, delimiter, a.header)
        if rows is None:
            rows = np.arange(len(X))
        P = run.probabilities(X)
        pred = P.argmax(axis=1)
        print(f"asgd.predict: {len(X):,} rows of {path}, the {run.layout.d_in}-{run.layout.d_hidden}-"
              f"{run.layout.d_out} MLP of {run.folder}")
        if tokens is not None:
            report(run, np.array([run.labels.of(t) for t in tokens], np.int64), pred)
        if a.out:
            write(a.out, run, rows, P, pred)
            print(f"predictions: {a.out}")
        elif tokens is None:
            print("(--out FILE writes each row's prediction and class probabilities)")
        sys.stdout.flush()   # here, not at exit: a reader that left is seen inside the try
    except BadInput as e:
        print(f"asgd.predict: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return signals.reader_left()
    return 0


if __name__ == "__main__":
    sys.exit(main())
