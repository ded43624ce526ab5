"""The simulator against calibrate's KIND+step probes: what it must add to, or take from,
each crowded round to meet them.

With more ranks than cores the simulated rounds miss the measured ones both ways: the OS's
turns (a rank waiting at a sum for a partner that is not running) make a real round
longer, and the simulator's per-message costs, measured one server at a time, make its
round longer than a real one whose messages go out together. The analytical model meets
the probes with its crowding term (asgd.perf.architectures.crowding: the probe less the
model's own round of it). The simulator does the same against its own round: each probe
(asgd.probes.exchanges: ps, async, p2p, ring, mpi, replica, after a 2-H-2 step at batch B of
STEP_PROBE, among P ranks on this machine's cores) is simulated without correction, and
the measured round less the simulated one is the correction at P ranks, of either sign.

The probes' simulations take seconds; their rounds are kept in the user's cache, under a
hash of the calibration, so every later simulation from it reads them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from ..perf.analytic import Params
from ..perf.architectures import PROBE_ROUNDS as ROUNDS, STEP, probe_run
from .costs import Costs, Spec
from .machines import here
from .run import simulate_isolated


def simulated_round(kind: str, P: int, p: Params, raw: dict) -> float:
    """Seconds of one round of the probe as the simulator has it, uncorrected (per member
    update for async and replica, as the probe counts them)."""
    run = probe_run(kind, P, precision=p.precision)
    spec = Spec(run=run, machine=here(p.cores))
    res = simulate_isolated(spec, Costs(p, spec, raw, corrections=None), None)
    return res["train_s"] / ROUNDS


@functools.cache
def _code_digest() -> bytes:
    """asgd's own source (the simulator, and the model's tables it reads), as bytes."""
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parents[1].rglob("*.py")):
        h.update(f.read_bytes())
    return h.digest()


def _cache_path(raw: dict, precision: str) -> Path:
    """Keyed by the calibration, the precision of its tables and asgd's code: a changed
    simulator simulates the probes again."""
    h = hashlib.sha256(json.dumps([raw, precision], sort_keys=True, default=str).encode())
    h.update(_code_digest())
    key = h.hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "asgd"
    return root / f"sim-probes-{key}.json"


_memo: dict[Path, dict] = {}


def simulated_rounds(p: Params, raw: dict) -> dict[str, dict[int, float]]:
    """[kind][P]: the simulator's uncorrected round of every KIND+step probe in p (cached)."""
    path = _cache_path(raw, p.precision)
    if path in _memo:
        return _memo[path]
    try:
        got = {k: {int(P): t for P, t in by.items()} for k, by in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        got = {}
    want = {k.removesuffix(STEP): sorted(int(P) for P in by) for k, by in p.exchange_s.items() if k.endswith(STEP)}
    missing = [(k, P) for k, Ps in want.items() for P in Ps if P not in got.get(k, {})]
    for k, P in missing:
        got.setdefault(k, {})[P] = simulated_round(k, P, p, raw)
    if missing:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(got))
            tmp.replace(path)
        except OSError:
            pass    # a read-only home: simulate the probes again next time
    _memo[path] = got
    return got


def corrections(p: Params, raw: dict) -> dict[str, dict[int, float]]:
    """[kind][P]: seconds per round the simulator adds (negative: takes away) so that its
    round of each probe is the measured one."""
    sim = simulated_rounds(p, raw)
    out: dict[str, dict[int, float]] = {}
    for k, by in p.exchange_s.items():
        if not k.endswith(STEP):
            continue
        kind = k.removesuffix(STEP)
        for P, by_n in by.items():
            out.setdefault(kind, {})[int(P)] = by_n[min(by_n)] - sim[kind][int(P)]
    return out
