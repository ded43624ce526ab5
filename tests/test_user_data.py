"""Issue 28's cases, as a user meets them: a CSV with a header and its label first by
name, string labels, empty fields, NaN, commas read as white space, a year-like label
column; each trains, or stops with one line that names the fix. Then the trained run
applied by asgd.predict (numpy only), and run folders that refuse to be overwritten."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from asgd.data import problem
from asgd.run import folder
from conftest import load_results, mpiexec


def penguins(path, rows=96, bad=None):
    """A small CSV shaped like palmerpenguins' (species first, a year last), separable by
    its measurements; `bad` = (row, column, text) writes one field as given."""
    rng = np.random.default_rng(0)
    species = ["Adelie", "Chinstrap", "Gentoo"]
    lines = ["species,bill_length_mm,bill_depth_mm,flipper_length_mm,year"]
    for i in range(rows):
        k = i % 3
        f = [f"{v:.1f}" for v in (38 + 8 * k + rng.normal(), 18 - 2 * k + rng.normal(0, .3),
                                   190 + 15 * k + rng.normal())]
        fields = [species[k], *f, str(2007 + i % 3)]
        if bad and bad[0] == i:
            fields[bad[1]] = bad[2]
        lines.append(",".join(fields))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_csv_with_a_header_trains_by_the_label_name_and_predict_reproduces_its_accuracy(tmp_path):
    data = penguins(tmp_path / "penguins.csv")
    # the year column is numeric: drop it, as a user would (the label is the species, by name)
    data.write_text("\n".join(ln.rsplit(",", 1)[0] for ln in data.read_text().splitlines()) + "\n")
    out = tmp_path / "run"
    p = mpiexec(2, ["--data", str(data), "--label-column", "species", "--epochs", "40", "--out", str(out), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(out)
    assert r["config"]["features"] == 3 and r["config"]["classes"] == 3 and r["config"]["hidden"] == 256
    assert r["config"]["standardize"] is True                              # the default for a file
    assert json.loads((out / "labels.json").read_text())["classes"] == ["Adelie", "Chinstrap", "Gentoo"]
    d = r["data"]
    assert d["train"]["bytes"] == data.stat().st_size and len(d["train"]["sha256"]) == 64
    assert d["read_as"]["delimiter"] == "," and d["read_as"]["label_column"] == 0
    held = np.load(out / "heldout.npy")
    assert len(held) == 96 // 8 == r["config"]["test_points"]
    assert r["metrics"]["accuracy"] >= 0.9

    got = subprocess.run([sys.executable, "-m", "asgd.predict", str(out), "--held-out"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    acc = float(got.stdout.split("accuracy ")[1].split()[0])
    assert f"accuracy {r['metrics']['accuracy']:.4f}" in got.stdout and acc == round(r["metrics"]["accuracy"], 4)
    assert "Adelie" in got.stdout and "confusion matrix" in got.stdout

    # new rows without labels: predictions and probabilities per row, by name
    new = tmp_path / "new.csv"
    new.write_text("bill_length_mm,bill_depth_mm,flipper_length_mm\n38.2,18.1,190.5\n54.0,14.0,220.0\n")
    pred = tmp_path / "pred.csv"
    got = subprocess.run([sys.executable, "-m", "asgd.predict", str(out), str(new), "--out", str(pred)],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    lines = pred.read_text().splitlines()
    assert lines[0] == "row,prediction,p_Adelie,p_Chinstrap,p_Gentoo"
    assert [ln.split(",")[1] for ln in lines[1:]] == ["Adelie", "Gentoo"]
    assert abs(sum(float(v) for v in lines[1].split(",")[2:]) - 1) < 1e-5

    # the same --out again: refused, naming --force; with --force it trains
    p = mpiexec(2, ["--data", str(data), "--label-column", "species", "--epochs", "1", "--out", str(out), "--quiet"])
    assert p.returncode == 2 and f"--out {out} holds a run (results.json, weights.npy)" in p.stderr
    assert "--force" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_predict_imports_neither_mpi_nor_numba():
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('mpi4py', 'numba', 'llvmlite'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import asgd.predict\n"
            "print('ok')\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "ok", got.stderr


@pytest.mark.parametrize("case, argv, message", [
    ("empty", (5, 2, ""), ":7: column 3 ('bill_depth_mm') is empty; asgd needs every value: drop or fill"),
    ("nan", (9, 1, "NaN"), ":11: column 2 ('bill_length_mm') is NaN or infinite; asgd needs every feature"),
    ("NA", (9, 1, "NA"), ":11: column 2 ('bill_length_mm') is 'NA': a missing value; asgd needs every value"),
    ("year", None, "the label, column 5 ('year', the last), looks like a measurement, not classes: 2,010 "
                   "classes (integer labels up to 2,009)"),
    ("commas", None, ":1: need at least one feature and a label, got 1 field(s); the line has ',' in it: "
                     "if that separates the fields, use --delimiter comma"),
])
@pytest.mark.parametrize("reader", ["parallel", "sequential"])
def test_bad_files_stop_with_one_line_that_names_the_fix(tmp_path, case, argv, message, reader):
    data = penguins(tmp_path / "p.csv", bad=argv)
    extra = []
    if case == "year":   # the species dropped: every feature a number, the year the last column
        data.write_text("\n".join(ln.split(",", 1)[1] for ln in data.read_text().splitlines()) + "\n")
        message = message.replace("column 5", "column 4")
    elif case == "commas":
        extra = ["--delimiter", "whitespace"]
    else:
        extra = ["--label-column", "species"]
    # 2 ranks: each defect here lies in the first rank's part of the file or is agreed on by
    # all (that every rank of 4 reports a reader's error alike, wherever the defect lies:
    # tests/mpi/test_readers.py)
    p = mpiexec(2, ["--data", str(data), "--reader", reader, "--dry-run", "--out", str(tmp_path / "o"), *extra])
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and message in err[0], p.stderr
    if case == "year":
        assert "--label-column NAME or INDEX" in err[0] and "--classes N" in err[0]


def test_data_check_reads_a_file_with_asgd_trains_file_options(tmp_path):
    """asgd.data check's own error named --label-column, which check did not take: it
    takes asgd.train's options for reading a file (the same definitions)."""
    from asgd.data import __main__ as data_cli
    from asgd.run import config
    data = penguins(tmp_path / "p.csv")
    data.write_text("\n".join(ln.rsplit(",", 1)[0] for ln in data.read_text().splitlines()) + "\n")  # no year
    p = mpiexec(2, ["check", str(data), "--reader", "parallel"], module="asgd.data")
    assert p.returncode == 2 and "use --label-column species" in p.stderr, p.stdout + p.stderr
    p = mpiexec(2, ["check", str(data), "--label-column", "species", "--delimiter", "comma", "--header"],
                module="asgd.data")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("exact cover ok") == 2, p.stdout   # both readers
    check = data_cli.build_parser()._subparsers._group_actions[0].choices["check"]
    for opt in ("--label-column", "--delimiter", "--header", "--classes"):
        mine, train = (next(a for a in q._actions if opt in a.option_strings) for q in (check, config.build_parser()))
        assert (mine.help, mine.default, mine.type) == (train.help, train.default, train.type), opt


def test_the_run_folder_check():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        folder.check_out(d, force=False, resuming=False)          # empty: fine
        open(f"{d}/weights.npy", "w").close()
        with pytest.raises(folder.FolderError, match="holds a run \\(weights.npy\\): choose another folder, add "
                                                     "--force to replace it, or --resume"):
            folder.check_out(d, force=False, resuming=False)
        folder.check_out(d, force=True, resuming=False)
        folder.check_out(d, force=False, resuming=True)


def test_npz_with_string_labels_trains(tmp_path):
    d = problem.rings(400, 1, classes=2)
    np.savez(tmp_path / "d.npz", X=d.X, y=np.array(["inner", "outer"])[d.y])
    out = tmp_path / "run"
    p = mpiexec(2, ["--data", str(tmp_path / "d.npz"), "--epochs", "2", "--hidden", "100",
                    "--out", str(out), "--quiet"])
    assert p.returncode == 0, p.stderr
    r = load_results(out)
    assert r["data"]["labels"] == ["inner", "outer"] and r["config"]["classes"] == 2


def labelled(path, labels):
    """A small CSV: two features and a label column (last) holding `labels`, row by row."""
    rng = np.random.default_rng(1)
    lines = ["x1,x2,label"] + [f"{rng.normal():.3f},{rng.normal():.3f},{t}" for t in labels]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_stray_label_value_gets_a_note_naming_it_and_its_rows(tmp_path):
    """Issue 39: a 0/1 label column with one -1 trained a 3-class model (the real classes
    shifted to 1 and 2) without a word. A value that looks like a missing-value code, or
    a class of a handful of rows, gets a note naming it and its rows; a balanced 3-class
    file none."""
    from asgd.data import formats, labels
    stray = labelled(tmp_path / "stray.csv", ["0", "1"] * 150 + ["-1"] + ["1", "0"] * 50)
    d = formats.read_text(str(stray))
    said = labels.notes(labels.Labels(d.classes, d.names), np.bincount(d.y, minlength=d.classes), str(stray))
    assert len(said) == 1 and "label '-1'" in said[0] and " 1 row of 401" in said[0], said
    assert "missing-value code" in said[0] and "3 classes" in said[0]
    rare = labelled(tmp_path / "rare.csv", ["0", "1"] * 200 + ["2"] * 3)
    d = formats.read_text(str(rare))
    said = labels.notes(labels.Labels(d.classes, d.names), np.bincount(d.y, minlength=d.classes), str(rare))
    assert len(said) == 1 and "label '2'" in said[0] and " 3 rows of 403" in said[0], said
    for name, column in (("balanced", ["0", "1", "2"] * 100),
                         ("binary -1/+1", ["-1"] + ["+1"] * 9),   # a binary encoding, not a stray -1
                         ("sentiment", ["-1"] * 12 + ["0", "1"] * 50)):   # -1 on an eighth of the rows: a class
        d = formats.read_text(str(labelled(tmp_path / "ok.csv", column * 10)))
        assert labels.notes(labels.Labels(d.classes, d.names), np.bincount(d.y), "ok.csv") == [], name


def test_integer_labels_that_leave_a_class_empty_get_a_note(tmp_path):
    """Labels 1, 2, 3 (1-based, as UCI wine's) are classes 1..3 of a 4-class model whose
    class 0 has no rows: the mapping stays (saved models depend on it), with a note."""
    from asgd.data import formats, labels

    def said(column):
        d = formats.read_text(str(labelled(tmp_path / "l.csv", column)))
        return labels.notes(labels.Labels(d.classes, d.names), np.bincount(d.y, minlength=d.classes), "l.csv")
    one_based = said(["1", "2", "3"] * 50)
    assert len(one_based) == 1 and "no row has label 0," in one_based[0], one_based
    assert "4 classes (0 .. 3)" in one_based[0] and "look 1-based (1 .. 3)" in one_based[0], one_based
    gap = said(["0", "1", "4"] * 50)
    assert len(gap) == 1 and "no row has labels 2, 3," in gap[0] and "5 classes" in gap[0], gap
    assert "1-based" not in gap[0]
    assert said(["0", "1", "2"] * 50) == [] and said(["b", "c", "d"] * 50) == []


def test_a_stray_label_values_note_reaches_the_user(tmp_path):
    """The note of the test above, where a user sees it: a run's (--dry-run: before any
    training) notes, printed and in results.json, and asgd.data check's report."""
    stray = labelled(tmp_path / "stray.csv", ["0", "1"] * 150 + ["-1"] + ["1", "0"] * 50)
    p = mpiexec(2, ["--data", str(stray), "--dry-run", "--out", str(tmp_path / "o")])
    assert p.returncode == 0, p.stderr
    notes = [line for line in p.stdout.splitlines() if line.startswith("asgd.train: note: ")]
    assert len(notes) == 1 and "label '-1'" in notes[0] and " 1 row of 401" in notes[0], p.stdout
    assert load_results(tmp_path / "o")["notes"] == [notes[0].removeprefix("asgd.train: note: ")]
    p = mpiexec(2, ["check", str(stray), "--reader", "parallel"], module="asgd.data")
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("asgd.data check: note: ") and "label '-1'" in line and " 1 row of 401" in line
               for line in p.stdout.splitlines()), p.stdout


def test_a_pandas_row_index_column_gets_a_note_and_stays_a_feature(tmp_path):
    """A DataFrame.to_csv() file (index=True, the default) starts its header with an empty
    name; its index column parses as numbers and trained as a feature without a word (a
    5-256-3 model for 4 measurements). It stays a feature, with one note saying what it
    likely is and how to leave it out; a file whose first column has a name gets none."""
    named = penguins(tmp_path / "named.csv")
    lines = named.read_text().splitlines()
    indexed = tmp_path / "indexed.csv"   # what to_csv() writes: ',species,...' then '0,Adelie,...'
    indexed.write_text("\n".join(["," + lines[0]] + [f"{i},{ln}" for i, ln in enumerate(lines[1:])]) + "\n")
    said = {}
    for data in (indexed, named):
        out = tmp_path / f"o-{data.stem}"
        p = mpiexec(2, ["--data", str(data), "--label-column", "species", "--dry-run", "--out", str(out)])
        assert p.returncode == 0, p.stderr
        said[data.stem] = [line for line in p.stdout.splitlines() if line.startswith("asgd.train: note: ")]
        assert load_results(out)["notes"] == [n.removeprefix("asgd.train: note: ") for n in said[data.stem]]
    assert len(said["indexed"]) == 1 and said["named"] == [], said
    assert "column 1 has no name" in said["indexed"][0] and "row index" in said["indexed"][0], said
    assert "to_csv(index=False)" in said["indexed"][0] and "trained on as a feature" in said["indexed"][0], said
    assert load_results(tmp_path / "o-indexed")["config"]["features"] == 5   # noted, not dropped
    p = mpiexec(2, ["check", str(indexed), "--reader", "parallel", "--label-column", "species"], module="asgd.data")
    assert p.returncode == 0, p.stderr
    assert sum(line.startswith("asgd.data check: note: ") and "row index" in line
               for line in p.stdout.splitlines()) == 1, p.stdout
    from asgd.data.dialect import index_notes
    header = ["Unnamed: 0", "a", "label"]   # read_csv's name for it, written back by a second to_csv
    assert "is named 'Unnamed: 0'" in index_notes({"header": header, "label_column": 2}, "f.csv")[0]
    assert index_notes({"header": header, "label_column": 0}, "f.csv") == []   # the label: no feature
    assert index_notes({"header": None, "label_column": 2}, "f.csv") == []


def trained_by_name(path, header=("species", "alcohol", "ash", "proline"), label=0):
    """A run folder as asgd.train writes one (no training: seeded weights) whose data file
    had `header`, the label its column `label`; features on very different scales, as
    wine's are, so a column read in another's place shows."""
    from asgd.net.mlp import Layout, init_params
    config = {"features": 3, "hidden": 8, "classes": 3, "precision": "float64"}
    read_as = {"delimiter": ",", "header": list(header), "label_column": label, "columns": 4}
    data = {"read_as": read_as, "labels": ["a", "b", "c"]}
    scaling = {"mean": [13.0, 2.4, 750.0], "std": [0.8, 0.3, 300.0]}
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"config": config, "data": data, "standardize": scaling}))
    np.save(path / "weights.npy", init_params(Layout(3, 8, 3), 0))
    return path


def predict_rows(run, new, tmp_path, *extra):
    pred = tmp_path / "pred.csv"
    got = subprocess.run([sys.executable, "-m", "asgd.predict", str(run), str(new), "--out", str(pred), *extra],
                         capture_output=True, text=True, timeout=60)
    return got, (pred.read_text().splitlines() if got.returncode == 0 else None)


def test_predict_matches_a_headers_columns_by_name_and_refuses_missing_or_unknown_ones(tmp_path):
    """A new file's columns in another order than the training file's are matched by name
    (it was read by position: alcohol's values scaled as proline's, one class for all);
    a feature the file lacks, or a column the run never saw, is refused in one line (that
    says to drop the latter: it ended with the names alone)."""
    run = trained_by_name(tmp_path / "run")
    rows = [(12.9, 2.1, 1290.0), (13.8, 2.7, 420.0), (12.2, 2.3, 600.0)]
    same = tmp_path / "same.csv"
    same.write_text("alcohol,ash,proline\n" + "".join(f"{a},{s},{p}\n" for a, s, p in rows))
    got, want = predict_rows(run, same, tmp_path)
    assert got.returncode == 0, got.stderr
    swapped = tmp_path / "swapped.csv"   # proline first, alcohol last, the label between
    swapped.write_text("proline,species,ash,alcohol\n" + "".join(f"{p},a,{s},{a}\n" for a, s, p in rows))
    got, lines = predict_rows(run, swapped, tmp_path)
    assert got.returncode == 0 and "RuntimeWarning" not in got.stderr, got.stderr
    assert lines == want
    # no header in the new file: by position, as before
    bare = tmp_path / "bare.csv"
    bare.write_text("".join(f"{a},{s},{p}\n" for a, s, p in rows))
    got, lines = predict_rows(run, bare, tmp_path)
    assert got.returncode == 0 and lines == want, got.stderr

    for header, message in [("alcohol,proline,colour", "missing: ash; not features of the run: colour; drop it from "
                             "the file (the run was trained without it)"),
                            ("alcohol,proline", "missing: ash"),
                            ("alcohol,ash,proline,colour,hue", "not features of the run: colour, hue; drop them from "
                             "the file (the run was trained without them)")]:
        bad = tmp_path / "bad.csv"
        n = header.count(",") + 1
        bad.write_text(header + "\n" + ",".join(["1.5"] * n) + "\n")
        got, _ = predict_rows(run, bad, tmp_path)
        err = got.stderr.strip().splitlines()
        assert got.returncode == 2 and len(err) == 1, got.stderr
        assert err[0] == (f"asgd.predict: error: {bad}: its columns are matched to the run's features "
                          f"(alcohol, ash, proline) by the header's names; {message}")


def test_predict_ends_quietly_when_its_reader_goes_away(tmp_path):
    """`asgd.predict RUN FILE --out /dev/stdout | head`: the reader leaves after a line;
    that ended in a BrokenPipeError traceback, now quietly (128 + SIGPIPE, as a tool SIGPIPE ended)."""
    run = trained_by_name(tmp_path / "run")
    new = tmp_path / "new.csv"   # far more predictions than a pipe's buffer holds
    new.write_text("alcohol,ash,proline\n" + "".join(f"{12 + i % 3},{2 + i % 5 / 10},{500 + i}\n" for i in range(5000)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}   # a shell's: its summary line waits
    p = subprocess.Popen([sys.executable, "-m", "asgd.predict", str(run), str(new), "--out", "/dev/stdout"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline() == "row,prediction,p_a,p_b,p_c\n"
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 128 + signal.SIGPIPE and err == "", err


def test_held_out_says_it_reads_the_runs_data_file_and_names_it_when_gone(tmp_path):
    """heldout.npy holds the held-out rows' indices, not the rows: --held-out reads the
    data file results.json records. Its help said it ran 'on any machine with the run
    folder'; a moved file said only 'gone'."""
    from asgd.predict import build_parser
    run = trained_by_name(tmp_path / "run")
    r = json.loads((run / "results.json").read_text())
    gone = tmp_path / "wine.csv"
    r["data"].update(train={"path": str(gone), "bytes": 10, "sha256": "0" * 64}, test=None, heldout="heldout.npy")
    (run / "results.json").write_text(json.dumps(r))
    np.save(run / "heldout.npy", np.array([3, 1], np.int64))
    got = subprocess.run([sys.executable, "-m", "asgd.predict", str(run), "--held-out"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 2 and got.stderr.strip().splitlines() == [
        f"asgd.predict: error: {gone}: not there; --held-out reads the run's data file (results.json's "
        "data.train) for its held-out rows (heldout.npy holds their indices, not the rows): put it back there"]
    helps = " ".join(build_parser().format_help().split())
    assert "any machine with the run folder" not in helps
    assert "--held-out reads the run's data file" in helps
    assert "heldout.npy holds the held-out rows' indices, not the rows" in helps
