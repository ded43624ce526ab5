"""asgd.train, `asgd.perf predict`, `asgd.perf optimize` and `asgd.sim` share their
defaults (issue 43): predicting or simulating a default run predicts the run asgd.train
makes, optimizer, batch, --hidden and the --epochs rule included."""

import argparse

import numpy as np
import pytest

from asgd.perf import cli as perf_cli
from asgd.perf.analytic import Params
from asgd.run import config
from asgd.sim import cli as sim_cli
from test_sim import synthetic_params   # the simulator tests' round-number calibration

TRAIN = config.build_parser()


def train_default(option: str):
    return next(a.default for a in TRAIN._actions if option in a.option_strings)


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in perf_cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


SHARED = ("--optimizer", "--batch", "--mode", "--reader", "--arch", "--allreduce", "--servers",
          "--model-parallel", "--staleness")


@pytest.mark.parametrize("command", ["predict", "optimize"])
def test_the_options_default_as_asgd_train(command):
    """(asgd.sim's options all default to None, resolved with the run: tested below.)"""
    parser = subparser(command)
    checked = 0
    for action in parser._actions:
        shared = [o for o in action.option_strings if o in SHARED]
        if not shared or action.default is None:   # None: resolved later (tested below)
            continue
        if isinstance(action.default, list) and len(action.default) > 1:
            continue   # optimize's search space (servers 1,2,4; K 1,2), not a run's default
        want = train_default(shared[0])
        if want is None:   # train's parser leaves it to Config
            want = getattr(config.Config, action.dest)
        got = action.default[0] if isinstance(action.default, list) and len(action.default) == 1 else action.default
        assert got == want, f"{command} {shared[0]} defaults to {action.default!r}, asgd.train to {want!r}"
        checked += 1
    if command == "optimize":   # --mode resolved with the question: train's, and sync beside it to a target
        assert perf_cli.optimize_modes(None, target=False) == [config.Config.mode]
        assert perf_cli.optimize_modes(None, target=True)[0] == config.Config.mode
        checked += 1
    assert checked >= (3 if command == "optimize" else 5)


def params() -> Params:
    return Params.from_dict(synthetic_params())


@pytest.mark.parametrize("points,fmt", [(None, "embedded"), (50_000, "tsv"), (1_000, "tsv")])
def test_hidden_and_epochs_follow_asgd_trains_rule(points, fmt):
    embedded = fmt == "embedded"
    want_epochs = config.default_epochs(None if embedded else points)
    want_hidden = config.default_hidden(embedded)
    argv = [] if embedded else ["--points", str(points), "--format", fmt]
    for cmd in ("predict", "optimize"):
        extra = ["--cores-per-node", "2"] if cmd == "optimize" else []
        a = perf_cli.build_parser().parse_args([cmd, *extra, *argv])
        run = perf_cli._base_run(a, params())
        assert run.epochs == want_epochs and a.epochs == want_epochs
        assert (a.hidden == [want_hidden]) if cmd == "predict" else (a.hidden == want_hidden)
    # the simulator: the same rule where neither its options nor a --like run say
    a = sim_cli.build_parser().parse_args(["-n", "3", *argv])
    spec, _ = sim_cli.spec_from_args(a, params())
    assert (spec.run.epochs, spec.run.hidden, spec.run.optimizer) == (want_epochs, want_hidden,
                                                                      config.Config.optimizer)
    c = config.Config
    assert (spec.run.batch, spec.run.mode, spec.run.reader, spec.arch, spec.staleness, spec.run.allreduce,
            spec.run.servers, spec.run.model_parallel, spec.compress) == \
        (c.batch, c.mode, c.reader, c.arch, c.staleness, c.allreduce, c.servers, c.model_parallel, c.compress)


def test_the_rule_is_asgd_trains():
    """The rule itself: the embedded problem's 2-10K-2 for 5 epochs; a file's hidden layer
    and epochs for about FILE_SAMPLES samples."""
    assert (config.default_hidden(True), config.default_epochs(None)) == (10000, 5)
    assert config.default_hidden(False) == config.FILE_HIDDEN
    assert config.default_epochs(700) == config.FILE_EPOCHS[1]
    assert config.default_epochs(10_000_000) == config.FILE_EPOCHS[0]


def test_a_real_file_is_a_file_to_every_command(tmp_path):
    """--data FILE (no --points or --format): a file's hidden layer and epochs rule in
    predict, optimize and the simulator alike, not the embedded problem's."""
    data = tmp_path / "d.tsv"
    data.write_text("".join(f"{i * 0.1:.1f}\t{-i * 0.2:.1f}\t{i % 3}\n" for i in range(800)))   # the label last
    points = 800 - 800 // perf_cli.HOLDOUT
    want = (config.default_epochs(points), config.default_hidden(False))
    for cmd in ("predict", "optimize"):
        extra = ["--cores-per-node", "2"] if cmd == "optimize" else []
        a = perf_cli.build_parser().parse_args([cmd, *extra, "--data", str(data)])
        run = perf_cli._base_run(a, params())
        assert (run.epochs, run.file_bytes > 0, run.features, run.classes) == (want[0], True, 2, 3)
        assert (a.hidden == [want[1]]) if cmd == "predict" else (a.hidden == want[1])
    spec, _ = sim_cli.spec_from_args(sim_cli.build_parser().parse_args(["-n", "3", "--data", str(data)]), params())
    assert (spec.run.epochs, spec.run.hidden, spec.run.file_bytes > 0, spec.run.classes) == (*want, True, 3)


@pytest.mark.parametrize("header, newline_at_end", [(True, True), (True, False), (False, False)])
def test_a_files_points_are_its_rows_header_excluded(tmp_path, header, newline_at_end):
    """A CSV's header is not a data point, nor is a missing last newline one less: the
    points predict, optimize and the simulator price are the rows asgd.train reads (a
    newcomer's 140-row file was priced as 141)."""
    data = tmp_path / "d.csv"
    rows = [f"{i * 0.1:.1f},{-i * 0.2:.1f},c{i % 3}" for i in range(803)]
    data.write_text("\n".join((["x,y,label"] if header else []) + rows) + ("\n" if newline_at_end else ""))
    got = perf_cli.data_of(str(data), None, "embedded", params())
    assert got["points"] + got["test_points"] == 803
    assert got["test_points"] == 803 // perf_cli.HOLDOUT


def test_an_npz_files_points_are_its_labels(tmp_path):
    """A .npz's points are its rows (its zip's bytes were counted as lines)."""
    data = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(data, X=rng.normal(size=(803, 3)), y=rng.integers(0, 2, 803))
    got = perf_cli.data_of(str(data), None, "embedded", params())
    assert got["points"] + got["test_points"] == 803
