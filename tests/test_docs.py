"""The docs say what the code does: files they name exist, links resolve, the message
layout, tags, options, results.json keys and modules they describe are the code's, and
--help states the defaults train uses. "The docs": the README, the documentation site's
pages (docs/*.md), and the docstrings and comments of src/ and bench/."""

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCS = [ROOT / "README.md", *PAGES, *sorted((ROOT / "docs").rglob("*.py")), *sorted((ROOT / "src").rglob("*.py")),
        *sorted((ROOT / "bench").glob("*.py"))]
PATH = re.compile(r"(?<![\w/.-])((?:src|tests|bench|scripts|slurm|pbs|docs)/[\w/.-]+\.(?:py|md|sh|sbatch|pbs|png)"
                  r"|[A-Z][\w-]*\.md)\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_the_docs_name_exist(doc):
    named = {m for m in PATH.findall(doc.read_text()) if not m.startswith("bench/results/")}
    missing = sorted(m for m in named if not (ROOT / m).exists())
    assert not missing, f"{doc.name} names files the project does not have: {missing}"


def test_the_design_page_describes_the_message_headers_the_code_sends():
    from asgd.core import wire
    design = (ROOT / "docs" / "design.md").read_text()
    sizes = {int(n) for n in re.findall(r"(\d+)-double header", design)}
    assert sizes == {wire.PUSH_HEADER, wire.PULL_HEADER}, sizes


@pytest.mark.parametrize("doc", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_no_page_states_another_header_size(doc):
    from asgd.core import wire
    sizes = {int(n) for n in re.findall(r"(\d+)-double header", doc.read_text())}
    assert sizes <= {wire.PUSH_HEADER, wire.PULL_HEADER}, sizes


def test_the_design_page_states_the_bytes_the_code_sends():
    """The 1-bit and float64 message sizes the design page quotes are asgd.core.wire's (they
    went stale when the headers grew a field)."""
    from asgd.core import wire
    from asgd.net.mlp import Layout
    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    got = re.search(r"([\d,]+) bytes a push and ([\d,]+) a reply for 2-10K-2 on one server, "
                    r"against ([\d,]+) and ([\d,]+) in float64", design)
    assert got, "docs/design.md no longer quotes the 2-10K-2 message sizes"
    layout = Layout(2, 10000, 2)
    cols = layout.columns()
    want = (wire.push_bytes(layout.n_w, cols), wire.pull_bytes(layout.n_w, cols),
            wire.push_bytes(layout.n_w), wire.pull_bytes(layout.n_w))
    assert tuple(int(g.replace(",", "")) for g in got.groups()) == want, want
    got = re.search(r"in float32, whose scales and values take half the bytes, ([\d,]+) and ([\d,]+) against "
                    r"([\d,]+) and ([\d,]+)", design)
    assert got, "docs/design.md no longer quotes the float32 message sizes"
    want = (wire.push_bytes(layout.n_w, cols, 4), wire.pull_bytes(layout.n_w, cols, 4),
            wire.push_bytes(layout.n_w, itemsize=4), wire.pull_bytes(layout.n_w, itemsize=4))
    assert tuple(int(g.replace(",", "")) for g in got.groups()) == want, want


def test_message_tags_are_distinct_and_defined_in_one_place():
    from asgd.core import wire
    tags = {k: v for k, v in vars(wire).items() if k.startswith("TAG_")}
    assert len(set(tags.values())) == len(tags), tags
    for path in (ROOT / "src").rglob("*.py"):  # no module defines a tag of its own
        if path.name != "wire.py":
            assert not re.search(r"^TAG_\w+\s*=", path.read_text(), re.M), path


def test_help_states_the_learning_rate_default_train_uses():
    from asgd.run import config
    lr = next(a for a in config.build_parser()._actions if "--lr" in a.option_strings)
    assert "sync" in lr.help and "allreduce" in lr.help, lr.help  # the default is scaled there


def test_the_label_column_index_and_the_messages_column_numbers_are_told_apart():
    """--label-column INDEX counts from 0 while a message's "column 4 ('cultivar')" counts
    from 1: the help and the own-data page say so, so that neither is taken for the other."""
    from asgd.run import config
    said = "an index from 0 (-1: the last; default: the last; error messages count columns from 1"
    label = next(a for a in config.build_parser()._actions if "--label-column" in a.option_strings)
    assert said in label.help, label.help
    page = " ".join((ROOT / "docs" / "training.md").read_text().split())
    assert "an index from 0; error messages count columns from 1" in page


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


# -- the front door and the documentation site ---------------------------------------------

README_MAX_LINES = 200
TWO_COMMANDS = [  # the README's set-up commands: the main job, and the tests (.ci/run runs the second)
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[mpich]' && mpiexec -n 16 python -m asgd.train",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[mpich,test]' && python -m pytest",
]


def test_the_readme_is_a_front_door():
    """What asgd is, the two commands, and where to read next: the rest lives in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the detail into docs/"
    for command in TWO_COMMANDS:
        assert command in lines, f"README.md lost its command: {command}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    """Every relative link of the README (into docs/, as GitHub shows it) and of the pages
    (mkdocs build --strict checks those too, with their anchors) names an existing file."""
    broken = []
    for target in LINK.findall(doc.read_text()):
        path = target.split("#")[0]
        if re.match(r"[a-z]+:", target) or not path:
            continue
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.name} links to files that do not exist: {broken}"


BEFORE = re.compile(r"\bbefore\s+(?:version\s+)?(\d+)\.(\d+)\b")


@pytest.mark.parametrize("doc", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_versions_named_as_past_are_past(doc):
    """'before 0.3' says what this version changed: it cannot name a version past this one
    (the README said 'before 0.3' of version 0.2.0)."""
    import asgd
    ours = tuple(int(x) for x in asgd.__version__.split(".")[:2])
    future = [f"{a}.{b}" for a, b in BEFORE.findall(doc.read_text()) if (int(a), int(b)) > ours]
    assert not future, f"{doc.name} names as past versions after {asgd.__version__}: {future}"


def test_the_package_version_is_pyprojects():
    import asgd
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{asgd.__version__}"' in pyproject, asgd.__version__


def test_open_mpi_commands_work_as_root():
    """Open MPI's mpiexec refuses to run as root without its consent (containers and CI run
    as root): every printed command that starts it gives it, or says how."""
    for doc in [ROOT / "README.md", *PAGES]:
        for line in doc.read_text().splitlines():
            if "[openmpi" in line and "mpiexec" in line:
                assert "--allow-run-as-root" in line or "OMPI_ALLOW_RUN_AS_ROOT=1" in line, (doc.name, line)


def section(page: str, heading: str) -> str:
    """The text of `## heading` on docs/page, up to the next heading of its level."""
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_code_map_names_every_module():
    """Each module of src/asgd is in the design page's code map: its own row (`train.py`,
    `net/optimizers.py`), or named in its package's row (`testbed/`: ... `proof.py` ...)."""
    rows = {}
    for line in section("design.md", "Code map").splitlines():
        cells = line.split("|")
        if len(cells) > 2 and cells[1].strip().startswith("`"):
            rows[cells[1].strip().strip("`")] = set(re.findall(r"`([^`]+)`", cells[2]))
    src = ROOT / "src" / "asgd"
    missing = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if path.name == "__init__.py" or "from .cli import main" in path.read_text():  # cli.py is the command
            continue
        package = rel.rpartition("/")[0]
        if rel not in rows and not (package and path.name in rows.get(package + "/", set())):
            missing.append(rel)
    assert not missing, f"docs/design.md's code map misses {missing}"


def test_the_formats_page_describes_every_results_key():
    """Every key results.json has (asgd.run.results.build's, and each rank's record's) is
    in docs/formats.md's results.json section."""
    from asgd.core.stats import ServerStats
    from asgd.core.worker import WorkerStats
    from asgd.run import results
    base = {"phases": {"init": 0.5, "compute": 0.3, "comm_wait": 0.2}, "host": "h",
            "timeline": {"start": 0.0, "init_end": 0.5, "end": 1.0}}
    server = {**ServerStats(staleness=[[0]], step_gap=[[0]]).record((0, 4), [1]), "rank": 0, "weight_bytes": 0,
              **base}
    worker = {**WorkerStats().record(), "rank": 1, **base}
    res = results.build(config={"servers": 1}, ranks=[server, worker], wall_s=1.0, meta={},
                        server={"updates": 1, "samples": 1, "history": [], "loss": 0.0, "accuracy": 1.0})
    keys = set(res) | set(res["metrics"]) | set(res["throughput"]) | set(res["profile"]) | set(server) | set(worker)
    keys |= {k for row in res["profile"]["ranks"] for k in row}
    keys |= {"stopped", "notes", "standardize", "dry_run", "bytes", "step_loss", "replicas", "data", "lr_scale",
             "staleness_applied", "step_gap_applied", "replica_pct"}   # what train.py and its roles add
    text = section("formats.md", "results.json")
    missing = sorted(k for k in keys if f"`{k}`" not in text)
    assert not missing, f"docs/formats.md's results.json section does not describe {missing}"


def compat_hook():
    spec = importlib.util.spec_from_file_location("docs_compat_hook", ROOT / "docs" / "hooks" / "compat.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


def test_the_compatibility_table_is_the_validators():
    """docs/options.md's table of which asgd.train options combine: a row and a column per
    feature, and each refusal in the validator's words: --arch allreduce with --mode ssp is
    refused, --mode sync --backup-workers 1 with --servers 2 is taken."""
    hook = compat_hook()
    assert hook.MARKER in (ROOT / "docs" / hook.PAGE).read_text()
    page = hook.render()
    header, _, *rows = page.splitlines()
    labels = [label for label, _ in hook.FEATURES]
    assert [c.strip(" `") for c in header.split("|")[2:-1]] == labels
    table = {r.split("|")[1].strip(" `"): [c.strip() for c in r.split("|")[2:-1]] for r in rows[:len(labels)]}
    assert list(table) == labels

    def cell(a, b):
        return table[a][labels.index(b)]
    ssp = cell("--arch allreduce", "--mode ssp")
    assert ssp.startswith("✗")
    assert f"{ssp.split()[1]}. --arch allreduce is synchronous; --mode ssp does not apply" in page
    assert cell("--mode sync --backup-workers 1", "--servers 2") == "✓"
    assert cell("--mode ssp", "--mode sync") == "·"
    for a in labels:   # symmetric: a pair is one parse whichever option comes first
        assert [cell(a, b)[0] for b in labels] == [cell(b, a)[0] for b in labels], a


def options_hook():
    spec = importlib.util.spec_from_file_location("docs_options_hook", ROOT / "docs" / "hooks" / "options.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


def every_parser(hook):
    """(anchor, parser) of every command and subcommand the options page covers."""
    for anchor, _, p in hook.parsers():
        yield anchor, p
        for name, _, sub in hook.subcommands(p):
            yield f"{anchor}-{name}", sub


def test_the_options_page_lists_every_option_of_every_parser():
    """The generated reference has each option (every flag of it) and positional argument
    of each command, in that command's own section."""
    import argparse
    hook = options_hook()
    page = hook.render()
    parsers = list(every_parser(hook))
    assert {a for a, _ in parsers} >= {"asgd-train", "asgd-data-generate", "asgd-perf-predict", "asgd-sim",
                                       "asgd-testbed-run"}
    missing = []
    for anchor, p in parsers:
        start = page.index(f"{{#{anchor}}}")
        end = page.find("\n#", start)
        rows = re.findall(r"^\| `([^`]+)` \|", page[start:end if end >= 0 else len(page)], re.M)
        # '-n RANKS, --ranks RANKS' by word; a metavar with a space ('-- OPTIONS') whole
        shown = {word for row in rows for word in re.split(r"[ ,]+", row)} | set(rows)
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            missing += [f"{anchor}: {n}" for n in a.option_strings or [a.metavar or a.dest] if n not in shown]
    assert not missing, f"the options page lacks {missing}"


def test_the_options_page_names_only_what_asgd_has():
    hook = options_hook()
    names = {m.rstrip(".") for m in DOTTED.findall(hook.render())}
    assert names and all(resolves(n) for n in names), sorted(n for n in names if not resolves(n))


def _headline():
    spec = importlib.util.spec_from_file_location("headline", ROOT / "bench" / "headline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_headline_figures_are_generated_from_one_source():
    """README, model.md and simulator.md quote docs/figures.json through generated blocks
    (bench/headline.py), each block as it renders now, every figure with its run."""
    headline = _headline()
    figures = __import__("json").loads(headline.FIGURES.read_text())
    seen = set()
    for page in headline.PAGES:
        text = page.read_text()
        blocks = list(headline.BLOCK.finditer(text))
        assert blocks, f"{page.name} has no generated figures block"
        for m in blocks:
            ids = m[3].split()
            missing = [i for i in ids if i not in figures]
            assert not missing, f"{page.name} quotes figures docs/figures.json lacks: {missing}"
            assert m[4] == headline.render_block(m[2], m[3], figures), f"{page.name}: run python bench/headline.py"
            seen.update(ids)
    for i in seen:
        assert all(figures[i].get(k) for k in ("value", "kind", "command", "date", "commit", "cpu", "load")), i


# Numbers these pages may state outside the generated blocks: the paper's finding, and a
# rule of the model (a threshold of the code, not a measurement).
NOT_MEASUREMENTS = ("over 90 % of the run", "over 80 %", "1.000× is the best measured")
MEASURED_LOOKING = re.compile(r"\b20\d\d-\d\d-\d\d\b|\d(?:\.\d+)? ?%|\d(?:\.\d+)?×")


def test_no_headline_figure_is_typed_by_hand():
    """README, model.md, simulator.md and choosing.md (benchmarks.md is the record of the runs);
    a command's output is quoted through an output block, as captured."""
    headline = _headline()
    for page in (p for p in headline.PAGES if p.name in ("README.md", "model.md", "simulator.md", "choosing.md")):
        text = headline.BLOCK.sub("", page.read_text())
        for allowed in NOT_MEASUREMENTS:
            text = text.replace(allowed, "")
        typed = [m[0] for m in MEASURED_LOOKING.finditer(text)]
        assert not typed, f"{page.name} types figures by hand ({typed}): put them in docs/figures.json"
