"""The state directory of a testbed, /run/asgd-testbed/<name>/ (tmpfs: a reboot clears it,
as it clears the namespaces):
  state.json       the spec, and status "creating" (up under way or killed) or "up"
  runs/<pid>       one file per `run` in progress: the launcher's pid and start time, so
                   down can end a launcher whose `run` was killed (and runs/rankfile-<pid>,
                   Open MPI's placement)
  rsh              the ssh stand-in the MPI launcher calls (written by up)
  <host>.uts/.ipc  the hosts' persistent namespaces (see hostns)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import spec as specmod
from .spec import Spec


def state_file(spec_or_name) -> Path:
    name = spec_or_name.name if isinstance(spec_or_name, Spec) else spec_or_name
    return specmod.STATE_ROOT / name / "state.json"


def write(spec: Spec, **fields) -> dict:
    """Atomically (re)write state.json with the spec and `fields`."""
    spec.dir.mkdir(parents=True, exist_ok=True)
    old = read(spec.name) or {}
    data = {**old, **spec.to_dict(), **fields, "updated": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = state_file(spec).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, state_file(spec))
    return data


def read(name: str) -> dict | None:
    try:
        return json.loads(state_file(name).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def names() -> list[str]:
    """Testbeds with a state directory (complete or not)."""
    try:
        return sorted(p.name for p in specmod.STATE_ROOT.iterdir() if p.is_dir() and specmod.NAME_RE.match(p.name))
    except OSError:
        return []


def runs_dir(spec: Spec) -> Path:
    return spec.dir / "runs"


def record_run(spec: Spec, pid: int, start: int | None, cmd: list[str]) -> Path:
    d = runs_dir(spec)
    d.mkdir(parents=True, exist_ok=True)
    f = d / str(pid)
    f.write_text(json.dumps({"pid": pid, "start": start, "cmd": cmd}))
    return f


def recorded_runs(name: str) -> list[dict]:
    d = specmod.STATE_ROOT / name / "runs"
    out = []
    for f in sorted(d.glob("[0-9]*")) if d.is_dir() else []:
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out
