"""The docs say what the code does: files they name exist, the message layout and the
tags they describe are the code's, and --help states the defaults train uses."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
PATH = re.compile(r"(?<![\w/.-])((?:src|tests|bench|scripts|slurm|pbs)/[\w/.-]+\.(?:py|md|sh|sbatch|pbs)|[A-Z][\w-]*\.md)\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_the_docs_name_exist(doc):
    named = {m for m in PATH.findall(doc.read_text()) if not m.startswith("bench/results/")}
    missing = sorted(m for m in named if not (ROOT / m).exists())
    assert not missing, f"{doc.name} names files the project does not have: {missing}"


def test_the_readme_describes_the_message_headers_the_code_sends():
    from asgd import wire as comm
    readme = (ROOT / "README.md").read_text()
    sizes = {int(n) for n in re.findall(r"(\d+)-double header", readme)}
    assert sizes == {comm.PUSH_HEADER, comm.PULL_HEADER}, sizes


def test_message_tags_are_distinct_and_defined_in_one_place():
    from asgd import wire as comm
    tags = {k: v for k, v in vars(comm).items() if k.startswith("TAG_")}
    assert len(set(tags.values())) == len(tags), tags
    for path in (ROOT / "src").rglob("*.py"):  # no module defines a tag of its own
        if path.name != "wire.py":
            assert not re.search(r"^TAG_\w+\s*=", path.read_text(), re.M), path


def test_help_states_the_learning_rate_default_train_uses():
    from asgd.run import config
    lr = next(a for a in config.build_parser()._actions if "--lr" in a.option_strings)
    assert "sync" in lr.help and "allreduce" in lr.help, lr.help  # the default is scaled there
