"""Every shell command the README and docs/*.md print in a fenced block is checked as
printed: each asgd command it runs is one asgd has, every option it gives that command is
one its parser takes, and every file of the repository it names exists. MPI, testbed and
long commands are not run; the checks read the parsers the commands themselves use.

Blocks checked: ``` with no language, console, bash, sh, shell (a ```text block is output,
not a command). A line ending in a backslash goes on with the next; so does an indented
line starting with `[` or `--` (the usage synopses of docs/model.md and others).

A block right after the line `<!-- test: runs -->` is cheap enough to run: it is run, as
printed, line by line, in a fresh folder that has the repository's examples/."""

import argparse
import importlib
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys

import pytest

from asgd import mpienv

# The public command -> the module and the function that builds its parser. Modules move;
# the commands do not: this table is the one place to update when they do.
COMMANDS = {
    "asgd.train": ("asgd.run.config", "build_parser"),
    "asgd.predict": ("asgd.predict", "build_parser"),
    "asgd.data": ("asgd.data.__main__", "build_parser"),
    "asgd.perf": ("asgd.perf.cli", "build_parser"),
    "asgd.sim": ("asgd.sim.cli", "build_parser"),
    "asgd.testbed": ("asgd.testbed.cli", "parser"),
    "asgd.launch": ("asgd.launch", "parser"),
    "asgd.doctor": ("asgd.doctor.cli", "build_parser"),
}
# Batch scripts -> the asgd command (and subcommand) their trailing arguments go to.
SCRIPTS = {
    "slurm/train.sbatch": ("asgd.train",),
    "slurm/sweep.sbatch": ("asgd.train",),
    "slurm/calibrate.sbatch": ("asgd.perf", "calibrate"),
    "pbs/train.pbs": (),
    "pbs/sweep.pbs": (),
    "pbs/calibrate.pbs": (),
}

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "console", "bash", "sh", "shell"}
FENCE = re.compile(r"^```(\S*)\s*$")
# Paths into the repository's own folders: these must exist (runs/, params.json and other
# files a command writes or a user brings are not the repository's).
REPO_PATH = re.compile(r"^(?:slurm|pbs|examples|bench|scripts|tests|src)/[\w./-]*\w$")
SEPARATORS = {"&&", "||", ";"}


def shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every command in the text's shell blocks, continuation
    lines joined."""
    out: list[tuple[int, str]] = []
    lang = None
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            lang = None if lang is not None else fence.group(1)
            continue
        if lang not in SHELL_BLOCKS or not line.strip():
            continue
        stripped = line.strip()
        continues = out and (out[-1][1].endswith("\\")
                             or (line[:1].isspace() and stripped[:1] in "[-"))
        if continues:
            out[-1] = (out[-1][0], out[-1][1].rstrip("\\").rstrip() + " " + stripped)
        else:
            out.append((number, stripped.removeprefix("$ ")))
    return out


def segments(command: str) -> list[list[str]]:
    """The command's tokens (comments dropped), split at &&, || and ;."""
    tokens = shlex.split(command.rstrip("\\"), comments=True)
    parts: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            parts.append([])
        else:
            parts[-1].append(token.strip("[]"))
    return [p for p in parts if p]


_parsers: dict[str, argparse.ArgumentParser] = {}


def parser_of(command: str) -> argparse.ArgumentParser:
    if command not in _parsers:
        module, build = COMMANDS[command]
        _parsers[command] = getattr(importlib.import_module(module), build)()
    return _parsers[command]


def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for a in p._actions if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()}


def flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def check_asgd(command: str, args: list[str], where: str) -> list[str]:
    """Problems with `python -m <command> <args>`; args after a bare `--` are another
    command line (asgd.testbed run) or asgd.train's options (asgd.launch)."""
    if command not in COMMANDS:
        return [f"{where}: no command {command!r} (asgd has {sorted(COMMANDS)})"]
    rest: list[str] = []
    if "--" in args:
        args, rest = args[:args.index("--")], args[args.index("--") + 1:]
    p, name = parser_of(command), command
    subs = subparsers(p)
    known = flags(p)
    for token in args:
        if token in subs:
            p, name = subs[token], f"{command} {token}"
            known |= flags(p)
            break
    problems = [f"{where}: {name} has no option {option}"
                for option in (t.split("=", 1)[0] for t in args)
                if option.startswith("-") and not re.match(r"-\d", option) and option not in known]
    if command == "asgd.launch":
        problems += check_asgd("asgd.train", rest, where)
    elif rest:
        problems += check_tokens(rest, where)
    return problems


def check_tokens(tokens: list[str], where: str) -> list[str]:
    """Problems with one command line (no separators left in it)."""
    problems = [f"{where}: {t} is not in the repository"
                for t in tokens if REPO_PATH.match(t) and not (ROOT / t).exists()]
    for i, token in enumerate(tokens[:-1]):
        if token == "-m" and tokens[i + 1].startswith("asgd"):
            return problems + check_asgd(tokens[i + 1], tokens[i + 2:], where)
    scripts = [i for i, t in enumerate(tokens) if t in SCRIPTS]
    if scripts and any(t in ("sbatch", "qsub") for t in tokens[:scripts[0]]):
        target = SCRIPTS[tokens[scripts[0]]]
        args = tokens[scripts[0] + 1:]
        if target:
            problems += check_asgd(target[0], list(target[1:]) + args, where)
        elif args:
            problems.append(f"{where}: {tokens[scripts[0]]} takes no arguments (PBS: ASGD_ARGS)")
    else:
        problems += [f"{where}: {t} is not a batch script the repository has"
                     for t in tokens if t.endswith((".sbatch", ".pbs")) and t not in SCRIPTS]
    return problems


def problems_in(text: str, name: str) -> list[str]:
    out = []
    for number, command in shell_lines(text):
        try:
            parts = segments(command)
        except ValueError as e:   # not a shell line: output or pseudocode belongs in ```text
            out.append(f"{name}:{number}: not a shell command ({e}): {command[:60]!r}")
            continue
        for tokens in parts:
            out += check_tokens(tokens, f"{name}:{number}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_a_page_prints_exists_as_printed(doc):
    problems = problems_in(doc.read_text(), doc.name)
    assert not problems, "\n".join(problems)


def test_the_pages_print_commands_at_all():
    """The extraction finds the commands it is meant to check (an empty list passes above)."""
    found = {t for doc in DOCS for _, c in shell_lines(doc.read_text()) for s in segments(c) for t in s}
    # (a page whose block cannot be split fails the test above, and this one with it)
    assert {"asgd.train", "asgd.predict", "asgd.perf", "asgd.sim", "asgd.testbed", "asgd.launch",
            "slurm/train.sbatch", "pbs/train.pbs", "examples/penguins.csv"} <= found


@pytest.mark.parametrize("text, expected", [
    ("```\nmpiexec -n 4 python -m asgd.train --epochs 2 --servrs 2\n```", "asgd.train has no option --servrs"),
    ("```bash\npython -m asgd.perf optimize --params p.json \\\n    --nodess 4\n```",
     "asgd.perf optimize has no option --nodess"),
    ("```\npython -m asgd_train --epochs 1\n```", "no command 'asgd_train'"),
    ("```\nsbatch -N 4 slurm/train.sbatch --hiden 10\n```", "asgd.train has no option --hiden"),
    ("```\npython -m asgd.testbed run --name sl -- sbatch slurm/nope.sbatch\n```", "slurm/nope.sbatch is not"),
    ("```\npython -m asgd.launch -n 4 --max-restarts 1 -- --checkpoint-evry 2\n```", "no option --checkpoint-evry"),
    ("```\nmpiexec -n 2 python -m asgd.train --data examples/nope.csv\n```",
     "examples/nope.csv is not in the repository"),
])
def test_a_misspelled_command_is_caught(text, expected):
    problems = problems_in(text, "page.md")
    assert any(expected in p for p in problems), problems


RUNS = re.compile(r"^<!-- test: runs -->\n```(?:|bash|sh|shell|console)\n(.*?)^```", re.S | re.M)
RUNNABLE = [(doc, m[1]) for doc in DOCS for m in RUNS.finditer(doc.read_text())]


def test_the_pages_mark_blocks_to_run():
    """The README's own-data example is among them (the marker is spelled as RUNS reads it)."""
    assert any(doc.name == "README.md" and "--label-column species" in block for doc, block in RUNNABLE)


@pytest.mark.parametrize("doc, block", RUNNABLE, ids=[f"{d.name}-{i}" for i, (d, _) in enumerate(RUNNABLE)])
def test_a_block_marked_to_run_runs_as_printed(tmp_path, doc, block):
    """Each line exits 0 in order, from a folder with the repository's examples/, with this
    venv's python and mpiexec first on PATH (as the README's `. .venv/bin/activate` puts them)."""
    launcher = mpienv.find()
    if launcher is None:
        pytest.skip("no mpiexec on PATH (pip install -e '.[mpich]')")
    if "mpiexec" in block and mpienv.flavour(launcher) != "mpich":
        pytest.skip("Open MPI needs flags on this machine that the pages' lines leave out (cluster.md#open-mpi)")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    lines = [line for _, line in shell_lines(f"```\n{block}```\n")]
    assert lines, f"{doc.name}: a block marked to run has no command"
    for line in lines:
        proc = subprocess.Popen(["bash", "-c", line], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # mpiexec and its ranks with it
            pytest.fail(f"{doc.name}: {line!r} did not end within 150 s:\n{proc.communicate()[0]}")
        assert proc.returncode == 0, f"{doc.name}: {line!r} exited {proc.returncode}:\n{out}"


def test_output_blocks_are_not_checked():
    assert problems_in("```text\npython -m asgd.train --no-such-option\n```", "page.md") == []


def test_the_shipped_example_data_is_what_its_script_writes(tmp_path):
    """examples/penguins.csv, which the README's own-data example trains on, is the
    generator's output: the file and the command that remakes it agree."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        make_penguins = importlib.import_module("make_penguins")
    finally:
        sys.path.remove(str(ROOT / "examples"))
    make_penguins.main(tmp_path)
    for name in ("penguins.csv", "penguins-new.csv"):
        assert (tmp_path / name).read_bytes() == (ROOT / "examples" / name).read_bytes(), name


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_renders_each_option_as_text(command):
    """--help of each command and subcommand: argparse expands %-formats in help strings,
    so a bare '20%' there printed the option's whole internals instead of its text."""
    p = parser_of(command)
    for name, sub in {command: p, **subparsers(p)}.items():
        text = sub.format_help()
        assert "option_strings" not in text and "%(" not in text, f"{name} --help:\n{text}"
