"""Both readers as a user runs them, under mpiexec with a time limit: exact cover for 1
to 8 workers (asgd.data check), and through asgd.train: the same data, timing
sub-phases in results.json, one clear line for a bad file."""

import numpy as np
import pytest

from asgd.data import formats, problem
from asgd.data import __main__ as data_cli
from conftest import load_results, mpiexec


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """1003 points (divides by none of 2..8 workers) held out of a TSV file, and a .npy
    file of 1001 points with a held-out companion file."""
    d = tmp_path_factory.mktemp("readers")
    tsv, npy = d / "a.tsv", d / "b.npy"
    formats.write(str(tsv), problem.rings(1003, 1, classes=3))
    assert data_cli.main(["generate", "--points", "1001", "--test-points", "50", "--classes", "3",
                      "--out", str(npy)]) == 0
    return tsv, npy


@pytest.mark.parametrize("launch, sizes", [(2, [2]), pytest.param(9, range(2, 10), marks=pytest.mark.openmpi)])
def test_exact_cover_for_1_to_8_workers(files, tmp_path, launch, sizes):
    """World sizes 2..9: the 9-rank launch checks each size on its first k ranks (a
    sub-communicator; one launch instead of eight: ranks start slowly on 2 cores). The
    workers' --standardize statistics, computed together, are numpy's over the file's
    training points."""
    tsv, npy = files
    p = mpiexec(launch, ["check", str(tsv), str(npy), "--sizes", ",".join(map(str, sizes)), "--standardize",
                         "--timeout", "60", "--out", str(tmp_path)], module="asgd.data", timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("exact cover ok") == 4 * len(sizes)
    for path, held_from_file in ((tsv, True), (npy, False)):
        ref = formats.read_tsv(str(path)) if path.suffix == ".tsv" else None
        A = np.load(path) if ref is None else np.column_stack([ref.X, ref.y])
        for ranks in sizes:
            shares = {}
            for reader in ("sequential", "parallel"):
                z = np.load(tmp_path / f"{path.stem}-{reader}-n{ranks}.npz")
                assert int(z["world"]) == ranks and bool(z["held_from_file"]) == held_from_file
                lines = [z[f"lines{r}"] for r in range(ranks)]
                assert len(lines[0]) == 0  # the server holds no training point
                for r in range(ranks):  # each point is the file's line it says it is
                    assert np.array_equal(z[f"X{r}"], A[lines[r], :-1])
                    assert np.array_equal(z[f"y{r}"], A[lines[r], -1])
                everything = np.concatenate(lines + ([z["test_lines"]] if held_from_file else []))
                assert np.array_equal(np.sort(everything), np.arange(len(A)))  # all, once
                training = A[np.sort(np.concatenate(lines)), :-1]  # the whole file, less its held-out part
                np.testing.assert_allclose(z["mean"], training.mean(axis=0), rtol=1e-12, atol=1e-15)
                np.testing.assert_allclose(z["std"], training.std(axis=0), rtol=1e-12)
                sizes_ = [len(x) for x in lines[1:]]
                assert max(sizes_) - min(sizes_) <= 1
                shares[reader] = lines
            for a, b in zip(shares["sequential"], shares["parallel"]):
                assert np.array_equal(a, b)


def test_both_readers_train_the_same_model(files, tmp_path):
    """One worker is deterministic (with --overlap on, and --eval-every epoch: auto's
    choices would follow timing): the same share in the same order gives the same run.
    results.json carries init's read/parse/shuffle for every rank."""
    tsv, _ = files
    runs = {}
    for reader in ("sequential", "parallel"):
        out = tmp_path / reader
        p = mpiexec(2, ["--data", str(tsv), "--reader", reader, "--hidden", "200", "--epochs", "2", "--overlap", "on",
                        "--eval-every", "epoch", "--out", str(out), "--quiet", "--timeout", "60"], timeout=60)
        assert p.returncode == 0, p.stderr
        runs[reader] = r = load_results(out)
        assert r["config"]["reader"] == reader
        assert (r["config"]["train_points"], r["config"]["test_points"]) == (1003 - 125, 125)
        for rank in r["ranks"]:
            ph = rank["phases"]
            assert {"read", "parse", "shuffle"} <= set(ph)
            assert 0 < ph["read"] + ph["parse"] + ph["shuffle"] <= ph["init"]
        assert r["init_s"] == max(x["phases"]["init"] for x in r["ranks"])
    seq, par = (runs[k]["metrics"]["history"] for k in ("sequential", "parallel"))
    assert [h["test_loss"] for h in seq] == [h["test_loss"] for h in par]


@pytest.mark.openmpi
def test_trains_on_npy(files, tmp_path):
    _, npy = files
    p = mpiexec(2, ["--data", str(npy), "--hidden", "200", "--epochs", "1", "--out", str(tmp_path),
                    "--quiet", "--timeout", "60"], timeout=60)
    assert p.returncode == 0, p.stderr
    r = load_results(tmp_path)
    assert (r["config"]["train_points"], r["config"]["test_points"], r["config"]["classes"]) == (1001, 50, 3)


def test_bad_line_ends_the_job_with_one_line(tmp_path):
    """The sequential reader (test_train_e2e checks the parallel one, the default)."""
    reader = "sequential"
    f = tmp_path / "bad.tsv"
    f.write_text("".join(f"0.{i}\t0.5\t{i % 2}\n" for i in range(300)) + "0.5\t0.5\t7x\n")
    p = mpiexec(2, ["--data", str(f), "--reader", reader, "--out", str(tmp_path / "o"), "--timeout", "60"],
                timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == (f"asgd.train: error: {f}:301: label '7x' is not an integer, as the column's "
                                "other labels are: fix the line, or give --classes N to take every label as a "
                                "class name")
