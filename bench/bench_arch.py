"""Parameter servers (1, 2, 4; async and sync) against allreduce, by number of workers.

    python bench/bench_arch.py [--workers 2,4,8,15] [--hidden 10000,100000] [--batch 16]
                               [--quick] [--out bench/results/arch]

Each configuration is one `mpiexec ... python -m asgd.train --epochs 1` run; updates/s
and the time of the epoch (train_s) come from its results.json. Writes arch.csv,
arch.json (with the machine) and arch.png, and prints the table."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (one machine description for every bench)
from asgd import launch  # noqa: E402  (the mpiexec beside this Python, with its flags)

CONFIGS = [("ps", 1, "async"), ("ps", 2, "async"), ("ps", 4, "async"),
           ("ps", 1, "sync"), ("ps", 2, "sync"), ("ps", 4, "sync"), ("allreduce", 0, "sync")]


def label(arch, servers, mode):
    return "allreduce" if arch == "allreduce" else f"{servers} server{'s' * (servers > 1)}, {mode}"


def run_once(arch, servers, mode, workers, hidden, batch, epochs) -> dict | None:
    out = tempfile.mkdtemp(prefix="asgd-bench-arch-")
    args = ["--hidden", str(hidden), "--batch", str(batch), "--epochs", str(epochs), "--quiet",
            "--out", out, "--timeout", "280", "--arch", arch, "--mode", mode]
    if arch == "ps":
        args += ["--servers", str(servers)]
    n = workers + servers
    p = subprocess.run(launch.command(n, sys.executable, "-m", "asgd.train", *args),
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        print(f"  failed: {label(arch, servers, mode)} w={workers}: {p.stderr.strip()[-300:]}", flush=True)
        return None
    with open(os.path.join(out, "results.json")) as f:
        r = json.load(f)
    shutil.rmtree(out)
    return {"config": label(arch, servers, mode), "arch": arch, "servers": servers, "mode": mode,
            "workers": workers, "ranks": n, "hidden": hidden, "batch": batch,
            "updates_per_s": r["throughput"]["updates_per_s"], "samples_per_s": r["throughput"]["samples_per_s"],
            "epoch_s": r["train_s"] / epochs, "accuracy": r["metrics"]["accuracy"],
            "server_busy_pct": max((x.get("busy_pct", 0) for x in r["profile"]["ranks"]), default=0),
            "bound": r["profile"]["bound"]}


def plot(rows, path):
    plt = common.pyplot()
    hiddens = sorted({r["hidden"] for r in rows})
    fig, axes = plt.subplots(2, len(hiddens), figsize=(6 * len(hiddens), 8), squeeze=False)
    for col, h in enumerate(hiddens):
        for cfg in dict.fromkeys(r["config"] for r in rows):
            rs = sorted((r for r in rows if r["hidden"] == h and r["config"] == cfg), key=lambda r: r["workers"])
            if not rs:
                continue
            style = "--" if cfg.endswith(", sync") else "-"  # async solid, sync dashed
            for row, key in enumerate(("updates_per_s", "epoch_s")):
                axes[row][col].plot([r["workers"] for r in rs], [r[key] for r in rs], style, marker="o", label=cfg)
        for row, name in enumerate(("updates/s (model versions)", "seconds per epoch")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("workers")
            ax.set_ylabel(name)
            ax.set_title(f"2-{h}-2, batch {rows[0]['batch']}", fontsize=10)
            ax.grid(alpha=0.3)
        axes[0][col].legend(fontsize=7)
    common.save_figure(fig, path, dpi=110)


def main(argv=None) -> int:
    p = common.parser(__doc__, "arch", plot=False)
    p.add_argument("--workers", type=common.int_list, default="2,4,8,15", help="comma list (default %(default)s)")
    p.add_argument("--hidden", type=common.int_list, default="10000,100000", help="comma list (default %(default)s)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="workers 2,8 and hidden 10000 only")
    a = p.parse_args(argv)
    workers = [2, 8] if a.quick else a.workers
    hiddens = [10000] if a.quick else a.hidden
    run = common.Run("arch", a, load_every_s=None)
    rows = []
    for h in hiddens:
        for w in workers:
            for arch, s, mode in CONFIGS:
                r = run_once(arch, s, mode, w, h, a.batch, a.epochs)
                if r:
                    rows.append(r)
                    print(f"  2-{h}-2 w={w:>2} {r['config']:<18} {r['updates_per_s']:>9,.0f} updates/s "
                          f"{r['epoch_s']:>7.2f} s/epoch  server busy {r['server_busy_pct']:5.1f}%  "
                          f"acc {r['accuracy']:.3f}", flush=True)
    run.write(rows, {"machine": run.machine})
    run.plot(plot, rows)
    run.wrote()
    return 0


if __name__ == "__main__":
    sys.exit(main())
