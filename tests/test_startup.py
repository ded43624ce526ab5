"""What a rank loads before its data: only its role's modules and kernels, and the same
as calibrate's start-up probes measure."""

import json
import os
import subprocess
import sys

import pytest

from asgd.run import startup


def _loaded(code: str) -> set:
    """asgd modules and numba dispatchers with a compiled signature after running `code`."""
    probe = code + """
import json, sys
from numba.core.registry import CPUDispatcher
compiled = sorted(f"{m.__name__}.{k}" for m in list(sys.modules.values())
                  if getattr(m, "__name__", "").startswith("asgd")
                  for k, v in vars(m).items() if isinstance(v, CPUDispatcher) and v.signatures)
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("asgd")), "compiled": compiled}))
"""
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_calibrate_imports_what_a_rank_of_train_imports():
    train = _loaded("import asgd.train")["modules"]
    probe = _loaded("import importlib\nfrom asgd.run import startup\n"
                    "for m in startup.RANK_MODULES: importlib.import_module(m)")["modules"]
    assert set(train) - {"asgd.train"} == set(probe)
    assert "asgd.data.parse" not in train and "asgd.data.readers" not in train  # only a run with a file


STEP = {"step_begin", "step_rows", "step_end"}  # the step (mlp.make_step), whole or split by progress
ONEBIT = {"quantize_1bit", "quantize_diff_1bit", "dequantize_1bit", "all_finite"}


@pytest.mark.parametrize("role, rank, reads_file, compress, kernels", [
    ("worker", 1, False, False, STEP | {"_permuted"}),
    ("server", 0, False, False, {"evaluate", "add_into", "add_scaled", "all_finite", "sgd_update"}),
    ("server", 1, False, False, {"add_into", "add_scaled", "all_finite", "sgd_update"}),
    ("worker", 2, True, False, STEP | {"_permuted", "parse_text", "find_byte", "check_rows"}),
    ("worker", 1, False, True, STEP | ONEBIT | {"_permuted"}),
    ("server", 1, False, True, ONEBIT | {"add_into", "add_scaled", "sgd_update"}),
])
def test_each_role_loads_only_its_kernels(role, rank, reads_file, compress, kernels):
    uses = startup.loads(role, rank, reads_file, compress=compress)
    got = _loaded(f"from asgd.run import startup\nstartup.load({uses!r})")["compiled"]
    # a private dispatcher is a public kernel's callee, compiled with it when numba's cache is
    # cold (and not when it loads from the cache): only _permuted is called from Python
    public = {n for n in (name.rsplit(".", 1)[1] for name in got) if not n.startswith("_") or n == "_permuted"}
    assert public == kernels


def test_a_nodes_first_rank_loads_every_roles_kernels():
    for reads_file in (False, True):
        for compress in (False, True):
            union = set(startup.node_loads(reads_file, compress=compress))
            for role, rank in (("server", 0), ("server", 1), ("worker", 1)):
                assert set(startup.loads(role, rank, reads_file, compress=compress)) <= union


def test_a_ranks_kernel_load_leaves_scipy_linalg_unimported(tmp_path):
    """numba's first load probes for a BLAS by importing scipy.linalg (0.7 s per rank where
    SciPy is installed); a rank's load keeps it out (startup._no_blas_probe), and SciPy
    still imports afterwards. A stand-in SciPy whose linalg says when it is imported, so
    the test runs where SciPy is not installed (CI)."""
    (tmp_path / "scipy" / "linalg").mkdir(parents=True)
    (tmp_path / "scipy" / "__init__.py").write_text('__version__ = "1.99.0"\n')   # numba checks it
    (tmp_path / "scipy" / "linalg" / "__init__.py").write_text('print("linalg imported")\n')
    code = ("from asgd.run import startup\nstartup.load(('shares',))\nprint('loaded')\n"
            "import scipy.linalg\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["loaded", "linalg", "imported"], p.stdout
