"""python -m asgd.perf: calibrate (quick), predict, compare against real runs, optimize,
and its errors. The equations themselves are in test_analytic.py."""

import csv
import json
import math
import shlex
import subprocess
import sys

import pytest

from asgd.perf import analytic
from asgd.perf import cli
from asgd.run.config import parse
from conftest import mpiexec


def perf(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asgd.perf", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_calibrate_writes_every_parameter_with_units(quick_params):
    got = json.loads(quick_params.read_text())
    assert got["machine"]["mpi"] in ("mpich", "openmpi") and "mpiexec" in got["machine"]["launcher"]
    p = analytic.Params.from_dict(got["params"])
    assert p.cores >= 1 and set(got["units"]) >= {"step_s", "server_update_s", "read_s_per_byte", "startup"}
    # the compute and exchange tables once per precision, the shared ones once
    assert set(got["params"]["precisions"]) == {"float32", "float64"}
    for prec, tables in got["params"]["precisions"].items():
        assert set(tables) == set(analytic.PER_PRECISION) and all(tables.values()), prec
        assert not set(tables) & set(got["params"]), prec
    assert p.precision == "float64" and p.at("float32").step_s != p.step_s
    values = [p.memory_s_per_byte, *p.startup.values(), *(p.r_d(r, f) for r in ("sequential", "parallel")
                                                            for f in ("tsv", "npy")),
              *p.eval_s_per_point.values(), *p.server_update_s.values(), *p.worker_msg_s.values(),
              *p.pingpong_s.values(), *p.startup_by_ranks.values(),
              *(v for t in p.effective_cores.values() for v in t.values()),
              *(v for t in p.step_s.values() for v in t.values()),
              *(v for t in p.contended_update_s.values() for v in t.values())]
    assert all(math.isfinite(v) and v > 0 for v in values)
    assert set(p.read_s_per_byte) == {"sequential", "parallel"} == set(p.select_s_per_point)
    assert all(set(t) == {"tsv", "npy"} for t in p.read_s_per_byte.values())
    assert p.r_d("sequential", "npy") < p.r_d("sequential", "tsv")  # nothing to parse in binary
    for h, t in p.step_s.items():  # a bigger batch costs more per step, less per point
        b = sorted(t)
        assert t[b[-1]] > t[b[0]] and t[b[-1]] / b[-1] < t[b[0]] / b[0], (h, t)
    t1 = p.table1(analytic.Run(workers=4, hidden=10000, batch=256))
    assert t1.c_p > 0 and t1.c_u > 0 and t1.r_d > 0 and t1.point_bytes > 8 * 2  # TSV is bigger than doubles


def test_an_old_float64_params_file_predicts_float32_with_one_warning_line(tmp_path):
    """A params.json from before calibrate measured both precisions still predicts: float64
    silently, float32 (the default) at those rates with one line that says so."""
    from test_analytic import old_file
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"schema": 1, "params": old_file()}))
    args = ("predict", "--params", str(path), "--workers", "1,2", "--hidden", "100")
    f64, f32 = perf(*args, "--precision", "float64"), perf(*args)
    assert f64.returncode == 0 and f64.stderr == "", f64.stderr
    assert f32.returncode == 0 and f32.stderr.splitlines() == [
        "asgd.perf predict: warning: the parameters hold float64 rates only (calibrated before calibrate measured "
        "both precisions): a float32 run's compute and exchanges are priced at float64's; calibrate again for "
        "float32's own"]
    rows = [[ln.split() for ln in p.stdout.splitlines() if ln.split() and ln.split()[0].isdigit()] for p in (f64, f32)]
    assert [r[6] for r in rows[0]] == [r[6] for r in rows[1]]   # compute_s: float64's rates for both


def test_predict_prints_a_row_per_configuration(quick_params):
    p = perf("predict", "--params", str(quick_params), "--workers", "1,2,4,8", "--batch", "64,256",
            "--reader", "sequential", "--points", "200000")
    assert p.returncode == 0, p.stderr
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert len(rows) == 8 and all(r[4] == "sequential" for r in rows)
    init = {(int(r[0]), int(r[3])): float(r[5]) for r in rows}
    # eq. 12: every rank reads the whole file in turn: init grows with the workers
    assert init[(1, 64)] < init[(2, 64)] < init[(4, 64)] < init[(8, 64)]
    j = perf("predict", "--params", str(quick_params), "--workers", "2", "--json")
    got = json.loads(j.stdout.splitlines()[0])
    assert got["total_s"] == pytest.approx(got["init_s"] + got["train_s"])
    assert got["run"]["workers"] == 2 and got["detail"]["bound"] in ("workers", "server", "cores")
    assert got["run"]["precision"] == "float32"   # asgd.train's default: a value of w is 4 bytes
    j = perf("predict", "--params", str(quick_params), "--workers", "2", "--json", "--precision", "float64")
    got64 = json.loads(j.stdout.splitlines()[0])
    assert got64["run"]["precision"] == "float64"
    assert got64["detail"]["working_set_bytes"] == 2 * got["detail"]["working_set_bytes"]   # 8 bytes a value, not 4


def test_compare_against_real_runs(quick_params, tmp_path):
    data = tmp_path / "d.tsv"
    subprocess.run([sys.executable, "-m", "asgd.data", "generate", "--points", "4000", "--out", str(data)],
                   check=True, capture_output=True, timeout=60)
    runs = []
    for n, reader, arch in ((2, "sequential", "ps"), (3, "parallel", "ps"), (2, "parallel", "allreduce")):
        out = tmp_path / f"run-{n}-{reader}-{arch}"
        # 20 epochs: on a fast core (znver5) one epoch trained in 3-6 ms, and a 3-rank run's
        # slowest init ended after rank 0's wall time: a train_s of 0, too short to compare
        r = mpiexec(n, ["--data", str(data), "--reader", reader, "--arch", arch, "--hidden", "1000",
                        "--epochs", "20", "--quiet", "--out", str(out)], timeout=90)
        assert r.returncode == 0, r.stderr
        runs.append(str(out))
    p = perf("compare", *runs, "--params", str(quick_params), "--csv", str(tmp_path / "rows.csv"))
    assert p.returncode == 0, p.stderr
    # every architecture is predicted now: allreduce too (asgd.perf.architectures)
    assert "APE over 3 runs" in p.stdout and "the paper's own equations" in p.stdout
    with open(tmp_path / "rows.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["arch"], int(r["workers"])) for r in rows] == [("ps", 1), ("ps", 2), ("allreduce", 2)]
    for r in rows:
        for k in cli.PHASES + cli.DETAIL:
            pred, meas = float(r[f"{k}_pred_s"]), float(r[f"{k}_meas_s"])
            assert meas > 0 and (pred > 0 if k != "comm" else pred >= 0)  # all the time may go to compute
            assert float(r[f"{k}_ape"]) == pytest.approx(abs(pred - meas) / meas * 100)
        assert float(r["paper_total_pred_s"]) > 0  # the paper's eq. 9 / 5.3, for contrast
        res = json.loads((tmp_path / r["run"].split("/")[-1] / "results.json").read_text())
        assert float(r["total_meas_s"]) == pytest.approx(res["wall_s"])


def results_of(train_s: float, **top) -> dict:
    """A 2-worker run's results.json, as much of it as compare reads."""
    c = {"train_points": 1000, "test_points": 100, "workers": 2, "servers": 1, "batch": 64, "hidden": 16,
         "epochs": 2, "reader": "parallel", "mode": "async", "features": 2, "classes": 2}
    ranks = [{"role": "server", "phases": {}}, {"role": "worker", "phases": {"compute": 0.8 * train_s}}]
    return {"config": c, "ranks": ranks, "init_s": 0.5, "train_s": train_s, "wall_s": 0.5 + train_s,
            "dry_run": False, **top}


def compared(tmp_path, runs: dict) -> tuple[list[str], list[str]]:
    """compare over these results.json (by name): the rows' runs, and what it skipped."""
    from test_analytic import make_params
    for name, res in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(res))
    rows, skipped = cli.compare([str(tmp_path / f"{name}.json") for name in runs], make_params())
    return [r["run"] for r in rows], skipped


def test_compare_skips_a_dry_run(tmp_path):
    """A dry run trained nothing: scored, its 0 s made a 19,387 % APE and an inf % p90."""
    got = compared(tmp_path, {"dry": results_of(0.0, dry_run=True), "trained": results_of(0.5)})
    assert got == ([str(tmp_path / "trained.json")], [f"{tmp_path / 'dry.json'}: dry run: nothing trained"])


def test_compare_skips_a_training_too_short_to_time(tmp_path):
    """Under asgd.train's MIN_TRAIN_S a training phase is clock noise (a newcomer's 2.11 ms,
    which asgd.train called too short to time, was scored 54 %): skipped with asgd.train's reason.
    A simulated run's clock has no noise: its milliseconds are compared."""
    from asgd.run.results import MIN_TRAIN_S
    got = compared(tmp_path, {"short": results_of(0.0021), "zero": results_of(0.0), "timed": results_of(MIN_TRAIN_S),
                              "simulated": results_of(0.0021, simulated={"engine": "SimGrid"})})
    assert got == ([str(tmp_path / "timed.json"), str(tmp_path / "simulated.json")],
                   [f"{tmp_path / 'short.json'}: training took 2.10 ms, under 10 ms: too short to time",
                    f"{tmp_path / 'zero.json'}: no training time: the last rank ended training as the last "
                    "init ended"])


def test_compares_table_names_each_runs_arch_and_mode(tmp_path, capsys):
    """An allreduce run printed `w 1 S 0`, as a p2p one would: the table names both."""
    import dataclasses
    from test_analytic import make_params
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"schema": 1, "params": dataclasses.asdict(make_params())}))
    ps, ring = results_of(0.5), results_of(0.5)
    ring["config"].update(arch="allreduce", servers=0, mode="async")   # allreduce's ranks step in lockstep
    ps["config"]["mode"] = "ssp"
    for name, res in (("ps-ssp", ps), ("ring", ring)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(res))
    assert cli.main(["compare", str(tmp_path / "ps-ssp"), str(tmp_path / "ring"), "--params", str(params)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["run", "arch", "mode", "w"]
    assert [ln.split()[:5] for ln in lines[2:4]] == [["ps-ssp", "ps", "ssp", "2", "1"],
                                                    ["ring", "allreduce", "sync", "2", "0"]]


def test_optimize_ranks_by_predicted_time(quick_params):
    args = ["optimize", "--params", str(quick_params), "--nodes", "2", "--cores-per-node", "4", "--link-gbps", "1",
            "--points", "100000", "--workers", "2,4,6", "--batches", "64,1024"]
    p = perf(*args, "--json")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert [r["total_s"] for r in rows] == sorted(r["total_s"] for r in rows)
    assert all(r["ranks"] <= 8 for r in rows)  # one rank per core by default
    assert {r["arch"] for r in rows} == {"ps", "p2p", "allreduce"} and {r["model_parallel"] for r in rows} == {1, 2}
    assert all(r["workers"] % r["model_parallel"] == 0 for r in rows)
    t = perf(*args, "--top", "3")
    best = rows[0]
    assert t.returncode == 0 and f"best: --arch {best['arch']}" in t.stdout and f"binds it: {best['bound']}" in t.stdout
    # the last line is the winner's command, one asgd.train takes on that many ranks
    run = t.stdout.splitlines()[-1]
    assert run == f"run it: mpiexec -n {best['ranks']} python -m asgd.train {shlex.join(best['argv'])}"
    cfg = parse(shlex.split(run.split(" asgd.train ")[1]), world_size=best["ranks"])
    # --points describes a file, so its default hidden (256) is the row's, as the header says (2-256-2)
    assert (cfg.arch, cfg.batch, cfg.hidden, cfg.model_parallel) == (best["arch"], best["batch"], 256,
                                                                     best["model_parallel"])
    assert "2-256-2" in t.stdout.splitlines()[0]
    p = perf(*args, "--archs", "p2p", "--json")
    assert p.returncode == 0 and {json.loads(ln)["arch"] for ln in p.stdout.splitlines()} == {"p2p"}
    for bad, says in ((["--nodes", "2"], "needs the links between them"),
                      (["--archs", "ps,mesh"], "unknown architecture")):
        p = perf("optimize", "--params", str(quick_params), "--cores-per-node", "2", *bad)
        assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_models_synopses_name_every_option():
    """docs/model.md's usage lines for each command name every option its --help has
    (predict lacked --label-column, --classes and --precision; optimize --label-column):
    test_doc_commands checks the other way, that each option named exists."""
    import argparse
    import re
    from conftest import REPO
    block = (REPO / "docs" / "model.md").read_text().split("## The commands", 1)[1].split("```")[1]
    named, cmd = {}, None
    for ln in block.splitlines():
        if m := re.match(r"python -m asgd.perf (\w+)", ln):
            cmd = m.group(1)
            named[cmd] = set()
        elif not ln.startswith(" "):
            cmd = None
        if cmd:
            named[cmd] |= set(re.findall(r"--[a-z][a-z0-9-]*", ln))
    assert "# every command but calibrate takes --params FILE" in block
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(named) == {"calibrate", "pilot", "predict", "compare", "optimize"}
    for cmd, got in named.items():
        options = {o for a in sub.choices[cmd]._actions for o in a.option_strings if o.startswith("--")}
        assert options - got - {"--help", "--params"} == set(), cmd


def test_errors_are_one_clear_line(tmp_path):
    p = perf("predict", "--params", str(tmp_path / "none.json"))
    assert p.returncode == 2 and "asgd.perf calibrate" in p.stderr and "Traceback" not in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p = perf("compare", str(tmp_path), "--params", str(bad))
    assert p.returncode == 2 and "not a parameters file" in p.stderr
    p = perf("predict", "--workers", "0,2")
    assert p.returncode == 2 and "positive integers" in p.stderr
    p = perf("optimize", "--cores-per-node", "2", "--epochs", "0")
    assert p.returncode == 2 and "positive integer" in p.stderr and "Traceback" not in p.stderr
    # --out where no folder can be made: refused at once, not after minutes of measuring
    (tmp_path / "a-file").write_text("")
    p = perf("calibrate", "--out", str(tmp_path / "a-file" / "params.json"), timeout=20)
    assert p.returncode == 2 and "cannot make its folder" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_predict_counts_the_points_of_an_npy_file(quick_params, tmp_path):
    """A 1,000-row .npy file without a held-out companion: 7/8 of its rows train."""
    from asgd.data import formats, problem
    formats.write(str(tmp_path / "d.npy"), problem.rings(1000, 0))
    for cmd in (["predict", "--workers", "2"], ["optimize", "--cores-per-node", "2", "--workers", "1"]):
        p = perf(*cmd, "--params", str(quick_params), "--data", str(tmp_path / "d.npy"))
        assert p.returncode == 0, p.stderr
        assert "875 training points" in p.stdout or "875 points" in p.stdout, p.stdout


def test_a_files_features_and_classes_are_priced(quick_params, tmp_path):
    """A 64-feature, 10-class file: predict prices 64-256-10 steps (calibrate's shape
    probe) and messages, not the paper's 2-256-2 ones."""
    import numpy as np
    from asgd.data import formats, problem
    rng = np.random.default_rng(0)
    formats.write(str(tmp_path / "wide.npy"), formats.Dataset(rng.standard_normal((1000, 64)),
                                                              rng.integers(0, 10, 1000), 10))
    formats.write(str(tmp_path / "rings.npy"), problem.rings(1000, 0))
    got = {}
    for name in ("wide", "rings"):
        p = perf("predict", "--workers", "1", "--params", str(quick_params), "--data", str(tmp_path / f"{name}.npy"),
                 "--json")
        assert p.returncode == 0 and "ShapeFallback" not in p.stderr, p.stderr
        got[name] = json.loads(p.stdout.splitlines()[0])
    assert (got["wide"]["run"]["features"], got["wide"]["run"]["classes"]) == (64, 10)
    assert got["wide"]["compute_s"] > 5 * got["rings"]["compute_s"]


def test_the_second_window_measures_the_crowded_rounds_alone():
    """calibrate measures the rounds after a training step (KIND+step) twice, minutes
    apart, as it does the step: the second pass starts only the crowded jobs (P > C) and
    asks them for the stepped kinds alone; the first asks every kind at every count."""
    from asgd.probes.calibrate import measure_exchanges

    def fake(n, args, timeout):
        kinds = args[args.index("--kinds") + 1].split(",")
        calls.append((n, kinds))
        precisions = args[args.index("--precisions") + 1].split(",")
        return {"precisions": {prec: {"seconds": {k: {"256" if k.startswith("replica") else "5002": 1e-3 * (i + 1)}
                                                  for k in kinds}} for i, prec in enumerate(precisions)}}
    calls = []
    first = measure_exchanges(None, 2, [5002], False, say=lambda *a: None, run=fake)
    assert [n for n, _ in calls] == [2, 3, 5, 9]
    assert not any(k.endswith("+step") for k in calls[0][1]) and "ring+step" in calls[1][1] and "ring" in calls[1][1]
    # every round in both precisions, in one job per rank count, each precision's table its own
    assert set(first) == {"float32", "float64"}
    assert first["float64"]["ring"][2][5002] == 2 * first["float32"]["ring"][2][5002]
    calls = []
    again = measure_exchanges(None, 2, [5002], False, say=lambda *a: None, run=fake, stepped_only=True)["float32"]
    assert [n for n, _ in calls] == [3, 5, 9] and all(k.endswith("+step") for _, kinds in calls for k in kinds)
    assert set(again) == {k for k in first["float32"] if k.endswith("+step")} and set(again["async+step"]) == {3, 5, 9}


def test_the_label_hint_names_an_option_predict_optimize_pilot_and_sim_take(tmp_path):
    """A column of 1,500 distinct integer labels reads as a measurement; the error's fix,
    --classes N, is an option of every command that reads the file's shape, and with it
    the file is priced at those classes."""
    import numpy as np
    from asgd.data.formats import DataError
    from asgd.sim import cli as sim_cli
    rng = np.random.default_rng(0)
    path = tmp_path / "many.tsv"
    np.savetxt(path, np.column_stack([rng.normal(size=(2000, 3)), rng.permutation(2000) % 1500]), delimiter="\t",
               fmt=["%.4f"] * 3 + ["%d"])
    with pytest.raises(DataError, match="give --classes N if these are classes"):
        cli.data_of(str(path), None, "embedded", None)
    for argv in (["predict"], ["optimize", "--cores-per-node", "2"], ["pilot"]):
        assert cli.parse_args([*argv, "--data", str(path), "--classes", "1500"]).classes == 1500
    assert sim_cli.parse_args(["--data", str(path), "--classes", "1500"]).classes == 1500
    got = cli.data_of(str(path), None, "embedded", None, classes=1500)
    assert (got["features"], got["classes"]) == (3, 1500)
    assert cli.label_args(cli.parse_args(["pilot", "--classes", "1500"])) == ["--classes", "1500"]


def test_the_crowded_rounds_keep_the_least_of_their_windows():
    """crowded_again: windows 2..STEPPED_WINDOWS of the KIND+step rounds, each a pass of
    the crowded jobs alone, and each table's least of all windows kept (the first window's
    included); the rounds without a step are left as the first pass measured them."""
    from asgd.probes.calibrate import STEPPED_WINDOWS, crowded_again

    seconds = iter([4.0, 2.0, 5.0, 1.0] * 100)   # ms, one per job: windows 2, 3 at P = 3, 5, 9

    def fake(n, args, timeout):
        kinds = args[args.index("--kinds") + 1].split(",")
        calls.append((n, kinds))
        value = next(seconds) * 1e-3
        return {"precisions": {"float32": {"seconds": {k: {"5002": value} for k in kinds}}}}
    stepped = ("ps+step", "p2p+step", "ring+step", "mpi+step", "replica+step", "async+step")
    first = {k: {P: {5002: 3.5e-3} for P in (3, 5, 9)} for k in stepped}
    by_prec = {"float32": {"exchange_s": {**first, "ps": {3: {5002: 9e-3}}}}}
    calls = []
    crowded_again(by_prec, None, 2, [5002], say=lambda *a: None, run=fake)
    assert STEPPED_WINDOWS == 3 and [n for n, _ in calls] == [3, 5, 9, 3, 5, 9]
    assert all(set(kinds) == set(stepped) for _, kinds in calls)
    got = by_prec["float32"]["exchange_s"]
    # P=3: 3.5 (first), 4 (second), 1 (third); P=5: 3.5, 2, 4; P=9: 3.5, 5, 2
    assert {P: got["ring+step"][P][5002] for P in (3, 5, 9)} == {3: 1e-3, 5: 2e-3, 9: 2e-3}
    assert got["ps"] == {3: {5002: 9e-3}}   # not a crowded round: as the first pass measured it


def test_a_run_that_ended_at_its_target_is_priced_at_the_epochs_it_trained():
    """compare predicts the epochs a --target-accuracy run began, not the --epochs cap it
    never reached (a newcomer's 2-of-200-epoch run was priced at 200: 6,204 % off); a
    deferred evaluation finds the target after training, every epoch trained."""
    c = {"train_points": 1000, "test_points": 100, "workers": 2, "servers": 1, "batch": 64, "hidden": 16,
         "epochs": 200, "reader": "parallel", "mode": "async", "features": 2, "classes": 2}
    target = {"metric": "accuracy", "value": 0.9, "reached": True, "epochs": 1.3}
    assert cli.run_of({"config": c, "target": target}, None).epochs == 2
    assert cli.run_of({"config": {**c, "eval_deferred": True}, "target": target}, None).epochs == 200
    assert cli.run_of({"config": c, "target": {**target, "reached": False, "epochs": None}}, None).epochs == 200
    assert cli.run_of({"config": c, "target": None}, None).epochs == 200
