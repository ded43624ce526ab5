"""The package is a layered graph (docs: the design's layer table): a module imports only
from its own package or from layers below it, never a private name of another package;
no module imports itself back through others (no circle, inside a package too); and the
wire format is defined once. Every import counts, function-level ones included."""

import ast
import functools
import os
import pathlib
import re
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"

# bottom to top; packages on one level must not import each other
LAYERS = [
    ["asgd"],                         # the root: BadInput, the version
    ["asgd.core"],                    # the protocol with no I/O: wire format, topology, policies, bookkeeping
    ["asgd.net"],                     # the flat layout, numba kernels, optimizers
    ["asgd.mpienv"],                  # finding mpiexec, its flags, the cores (no MPI)
    ["asgd.mpiutil"],                 # waiting without spinning, agreement, clocks
    ["asgd.data"],                    # formats, parsers, readers, shares, scaling
    ["asgd.protocol"],                # who talks to whom
    ["asgd.run"],                     # options, results.json, progress, checkpoints, signals, trace
    # the run top to bottom; its restart supervisor; a trained run applied to new data (numpy only)
    ["asgd.train", "asgd.launch", "asgd.predict"],
    ["asgd.perf"],                    # the performance model, pure: analytic, architectures, report, html
    ["asgd.probes"],                  # the measurements: calibrate, the MPI probes, the exchange rounds
    ["asgd.perf.cli", "asgd.perf.calibrate"],   # the lab's command line; the probes at their old path
    ["asgd.sim", "asgd.testbed", "asgd.perf.__main__"],   # the simulator; the emulated cluster; python -m asgd.perf
    ["asgd.doctor"],                  # checks an install: the launcher, the cache, the optional parts, a self-test
]


def unit_of(module: str) -> str:
    """The layer unit a module belongs to: the longest LAYERS name it falls under."""
    names = [n for level in LAYERS for n in level if module == n or module.startswith(n + ".")]
    names = [n for n in names if n != "asgd" or module == "asgd"]
    assert names, f"{module} is in no layer: add it to LAYERS"
    return max(names, key=len)


LEVEL = {n: i for i, level in enumerate(LAYERS) for n in level}


def modules():
    for path in sorted((SRC / "asgd").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield ".".join(parts), path, is_pkg


MODULES = {m for m, _, _ in modules()}


def imports(module: str, path: pathlib.Path, is_pkg: bool):
    """(imported module, imported names) for every import in the file, function-level
    ones included; relative imports resolved."""
    package = module if is_pkg else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = [a.name for a in node.names]
            # from P import x: x a module of package P (an import of that module), or a name of P
            modules = [n for n in names if f"{target}.{n}" in MODULES]
            for n in modules:
                yield f"{target}.{n}", []
            if len(modules) < len(names):
                yield target, [n for n in names if n not in modules]


@functools.cache
def edges() -> tuple:
    """(module, imported asgd module, imported names) for every import in the package: parsed
    once, since each of the per-module tests below reads them all (re-parsing every file for
    each module took about 0.5 s a test, 40 s in all)."""
    return tuple((module, target, names) for module, path, is_pkg in modules()
                 for target, names in imports(module, path, is_pkg)
                 if target == "asgd" or target.startswith("asgd."))


@pytest.mark.parametrize("module", [m for m, _, _ in modules()])
def test_no_module_imports_a_layer_above_it(module):
    src = unit_of(module)
    for m, target, _ in edges():
        if m != module:
            continue
        dst = unit_of(target)
        if dst == src:
            continue
        assert LEVEL[dst] < LEVEL[src], (f"{module} (layer {LEVEL[src]}, {src}) imports {target} "
                                         f"(layer {LEVEL[dst]}, {dst}): imports run down the layers only")


def import_graph() -> dict[str, set[str]]:
    """Module -> the asgd modules it imports, every import counted."""
    graph = {m: set() for m in MODULES}
    for m, target, _ in edges():
        if target in MODULES and target != m:
            graph[m].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle in the graph as [a, b, ..., a] (a imports b, ..., which imports a), or None:
    a depth-first search that meets a module still on its own path."""
    state = {}    # module -> "open" while on the search's path, "done" after
    for root in sorted(graph):
        if root in state:
            continue
        path, todo = [root], [iter(sorted(graph[root]))]
        state[root] = "open"
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = "done"
                todo.pop()
            elif state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = "open"
                path.append(nxt)
                todo.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_no_module_imports_itself_back_through_others():
    cycle = find_cycle(import_graph())
    assert cycle is None, "a circle of imports (function-level ones included): " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_circle():
    """The detector itself, on graphs whose answer is known: a circle of three behind a
    module outside it, one of two, and a diamond, which is none."""
    assert find_cycle({"d": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"x", "z"}, "z": set()}) == ["x", "y", "x"]
    assert find_cycle({"top": {"l", "r"}, "l": {"bottom"}, "r": {"bottom"}, "bottom": set()}) is None


def test_no_module_takes_a_private_name_from_another_package():
    bad = []
    for m, target, names in edges():
        if unit_of(m) != unit_of(target):
            bad += [f"{m} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_the_layer_check_sees_what_it_must():
    """The check itself: relative and function-level imports are resolved, so a hidden
    upward import would be caught."""
    got = {(m, t) for m, t, _ in edges()}
    assert ("asgd.run.roles", "asgd.protocol.worker") in got             # from ..protocol.worker import ...
    assert ("asgd.run.startup", "asgd.net.mlp") in got or \
        ("asgd.run.startup", "asgd.net") in got                           # a function-level import
    assert ("asgd.testbed.model", "asgd.probes.ranks") in got             # one inside a function's body
    assert ("asgd.probes.calibrate", "asgd.data.problem") in got          # from ..data import problem: the module
    assert LEVEL[unit_of("asgd.protocol.server")] < LEVEL[unit_of("asgd.run.trace")]
    assert unit_of("asgd.perf.cli") == "asgd.perf.cli" and unit_of("asgd.perf.analytic") == "asgd.perf"


def test_the_model_and_the_orchestrators_start_no_mpi():
    """The performance model imports no MPI, no numba and runs no jobs; the processes that
    start MPI jobs (python -m asgd.perf, the calibration's orchestrator, the supervisor,
    the doctor, which asks a subprocess whether mpi4py's MPI loads) never import mpi4py,
    whose import initializes MPI. Checked in a fresh interpreter: what a module's imports
    pull in, transitively."""
    def loaded(*modules):
        code = (f"import sys; import {', '.join(modules)}; "
                "print(' '.join(m for m in ('mpi4py', 'numba', 'subprocess') if m in sys.modules))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=120).stdout.split()
    assert loaded("asgd.perf.analytic", "asgd.perf.architectures", "asgd.perf.report", "asgd.perf.html") == []
    assert "mpi4py" not in loaded("asgd.perf.cli", "asgd.probes.calibrate", "asgd.launch", "asgd.mpienv",
                                   "asgd.doctor.cli")


def test_the_wire_format_is_written_once():
    """Headers, tags and shard bounds are defined in asgd.core.wire only; protocol, the
    simulator and the testbed model import it."""
    defs = re.compile(r"^(?:PUSH_HEADER|PULL_HEADER|TAG_\w+)\s*[,=]|^def (?:shard_bounds|shards)\b|"
                      r"^\s*edges = \[n_w \* s // ", re.M)
    offenders = [str(p.relative_to(SRC)) for p in (SRC / "asgd").rglob("*.py")
                 if p.name != "wire.py" and defs.search(p.read_text())]
    assert not offenders, offenders
    users = {m for m, t, _ in edges() if t == "asgd.core.wire" or t.startswith("asgd.core.wire.")}
    for package in ("asgd.protocol", "asgd.sim", "asgd.testbed"):
        assert any(u.startswith(package + ".") for u in users), f"{package} does not import asgd.core.wire"


def test_core_imports_nothing_but_numpy_and_the_standard_library():
    """asgd.core is the protocol with no I/O in it: no MPI, numba or SimGrid below it, so
    the model, the simulator and tests without mpiexec run it as the real run does."""
    import sys
    bad = [f"{module} imports {target}" for module, path, is_pkg in modules() if unit_of(module) == "asgd.core"
           for target, _ in imports(module, path, is_pkg)
           if target.split(".")[0] not in {"asgd", "numpy"} | set(sys.stdlib_module_names)]
    assert not bad, bad
