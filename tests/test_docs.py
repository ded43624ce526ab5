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
    from asgd import wire
    readme = (ROOT / "README.md").read_text()
    sizes = {int(n) for n in re.findall(r"(\d+)-double header", readme)}
    assert sizes == {wire.PUSH_HEADER, wire.PULL_HEADER}, sizes


def test_message_tags_are_distinct_and_defined_in_one_place():
    from asgd import wire
    tags = {k: v for k, v in vars(wire).items() if k.startswith("TAG_")}
    assert len(set(tags.values())) == len(tags), tags
    for path in (ROOT / "src").rglob("*.py"):  # no module defines a tag of its own
        if path.name != "wire.py":
            assert not re.search(r"^TAG_\w+\s*=", path.read_text(), re.M), path


def test_help_states_the_learning_rate_default_train_uses():
    from asgd.run import config
    lr = next(a for a in config.build_parser()._actions if "--lr" in a.option_strings)
    assert "sync" in lr.help and "allreduce" in lr.help, lr.help  # the default is scaled there


TEXTS = [*DOCS, *sorted((ROOT / "scripts").glob("*")), *sorted((ROOT / "slurm").glob("*")),
         *sorted((ROOT / "pbs").glob("*")), *sorted((ROOT / "tests").rglob("*.py"))]
DOTTED = re.compile(r"(?<![\w./-])asgd(?:\.[A-Za-z_]\w*)+")


def resolves(name: str) -> bool:
    """A dotted asgd name is a module, or an attribute (a class, a function, a constant)
    of its longest module prefix."""
    import importlib
    import importlib.util
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        mod = ".".join(parts[:k])
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            obj = importlib.import_module(mod)
            for attr in parts[k:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


@pytest.mark.parametrize("doc", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_asgd_name_the_texts_use_exists(doc):
    """No comment, docstring or page names a module or function asgd no longer has
    (the batch scripts once named the performance model's module by its old name)."""
    text = doc.read_text(errors="replace")
    names = {m.rstrip(".") for m in DOTTED.findall(text)}
    missing = sorted(n for n in names if not resolves(n))
    assert not missing, f"{doc.relative_to(ROOT)} names what asgd does not have: {missing}"
