"""Time to a target for optimize's rows: each configuration's epochs to the target (the
pilot's statistics, asgd.perf.statistics) times its predicted seconds per epoch (the
hardware model), plus its start-up; and what binds the winner, Omnivore's split of
speed into hardware efficiency x statistical efficiency."""

from __future__ import annotations

from ..core.schedule import lockstep
from .statistics import Statistics

CLOSE = 1.1   # within this factor of the best of a kind, that kind is not what binds


def rank_to_target(rows: list[dict], stats: Statistics, metric: str, value: float, optimizer: str,
                   ssp_bound: int | None = None) -> list[dict]:
    """optimize's rows (each with its mode) with mean_staleness, update_samples (as the statistics price it: a
    share's where it is less than the batch), epochs_to_target and time_to_target_s
    (init_s + epochs x per_epoch_s), best first."""
    out = []
    for r in rows:
        together = lockstep(r["arch"], r["mode"])
        s = stats.mean_staleness(r["workers"], r["mode"], together, ssp_bound)
        backup = r.get("backup", 0)   # sync's backup workers (optimize's rows have none)
        e = stats.epochs_to_target(optimizer, metric, value, r["batch"], r["replicas"], together, s, backup)
        u = stats.update_samples(optimizer, r["batch"], r["replicas"], together, backup)
        out.append({**r, "mean_staleness": s, "update_samples": u, "epochs_to_target": e,
                    "time_to_target_s": r["init_s"] + e * r["per_epoch_s"]})
    return sorted(out, key=lambda r: r["time_to_target_s"])


def what_binds(ranked: list[dict]) -> str:
    """Whether hardware or statistics binds the winner, and how: its s/epoch against the
    least any configuration has (hardware efficiency) and its epochs to the target against
    the fewest any needs (statistical efficiency); the further from its best binds. Start-up
    first where it is most of the winner's time. Seconds and epochs to 3 significant figures:
    a small problem's epoch takes a millisecond or less."""
    w = ranked[0]
    start = (f"start-up first ({w['init_s']:.3g} s of its {w['time_to_target_s']:.3g} s); then "
             if w["init_s"] >= w["time_to_target_s"] / 2 else "")
    return start + _training_binds(w, ranked)


def _training_binds(w: dict, ranked: list[dict]) -> str:
    fast = min(ranked, key=lambda r: r["per_epoch_s"])
    few = min(ranked, key=lambda r: r["epochs_to_target"])
    hw = w["per_epoch_s"] / fast["per_epoch_s"]
    st = w["epochs_to_target"] / few["epochs_to_target"]
    if st <= CLOSE and hw <= CLOSE:
        return (f"neither: the fewest epochs ({w['epochs_to_target']:.3g}) and within {CLOSE:g}x the least s/epoch; "
                f"its epoch's time is bound by {w['bound']}")
    if st >= hw:
        return (f"statistics: it needs {st:.2f}x the fewest epochs of any ({few['epochs_to_target']:.3g}, "
                f"{_name(few)}), which take {few['per_epoch_s'] / w['per_epoch_s']:.2f}x its s/epoch; "
                f"mean staleness {w['mean_staleness']:.1f}, {w['update_samples']:.0f} samples an update")
    more = fast["epochs_to_target"] / w["epochs_to_target"]
    return (f"hardware: its s/epoch is {hw:.2f}x the least ({fast['per_epoch_s']:.3g}, {_name(fast)}), whose "
            f"{fast['epochs_to_target']:.3g} epochs to the target are {more:.2f}x its own; its epoch's time is "
            f"bound by {w['bound']}")


def _name(r: dict) -> str:
    return f"{r['arch']} {r['workers']} workers x batch {r['batch']}"
