"""The headline figures, written once: read the benches' result files, keep each figure with
its run, date, commit, CPU and load in docs/figures.json, and rewrite every generated block
of README.md and docs/{model,simulator,choosing,getting-started,benchmarks}.md from that file, so
those pages quote the figures rather than retype them (tests/test_docs.py checks each block against its rendering).

A block is `<!-- figures: ID ID ... -->` ... `<!-- /figures -->`, a table of the figures with those IDs, or
`<!-- output: ID -->` ... `<!-- /output -->`, a command and the output --capture recorded of it, with its run.

    python bench/headline.py --data DIR --sim DIR --arch DIR --testbed DIR --tta DIR --commit HASH
    python bench/headline.py --capture ID --kind "measured here; predicted" --cwd DIR -- COMMAND ...
    python bench/headline.py                         # only re-render the blocks
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures.json"
PAGES = [ROOT / "README.md", *(ROOT / "docs" / f"{page}.md" for page in ("model", "simulator", "choosing",
                                                                         "getting-started", "benchmarks"))]
BLOCK = re.compile(r"(<!-- (figures|output): ([^>]*?) -->\n)(.*?)(<!-- /\2 -->)", re.S)


def source(j: dict, commit: str | None) -> dict:
    """Where a bench's figures come from: its command, date, commit, CPU and load."""
    m, load = j["machine"], j.get("load") or j.get("load_during_runs") or {}
    return {"command": j["command"], "date": m["date"][:10], "commit": j.get("commit") or commit or "not recorded",
            "cpu": f"{m['cpu']} ({m.get('llvm_cpu')}), {m['cores']} cores",
            "load": (f"{load['loadavg_1min_median']} (1-min median)" if "loadavg_1min_median" in load
                     else f"{m['loadavg_at_start'][0]} at start")}


def pct(x: float) -> str:
    return f"{x:.1f} %"


def from_data(j: dict) -> dict:
    s = j["summary"]
    worst = min(s, key=lambda r: r["gap_to_sklearn"] if r["gap_to_sklearn"] is not None else -1)
    others = [k for k in s[0] if k.startswith("gap_to_float")]
    out = {"data_vs_sklearn": (f"asgd's defaults on {len({r['dataset'] for r in s})} data sets at "
                               f"{', '.join(str(n) for n in sorted({r['ranks'] for r in s}))} ranks against "
                               "scikit-learn's MLPClassifier(): the worst gap", "measured here",
                               f"{worst['gap_to_sklearn']:+.3f} ({worst['dataset']}, {worst['ranks']} ranks); "
                               f"{sum(r['gap_to_sklearn'] >= -0.03 for r in s)} of {len(s)} within 0.03")}
    for ring in (r for r in s if r["dataset"] == "rings" and r["ranks"] == 16):   # the README's default run
        out["default_run"] = ("the default 16-rank run (`mpiexec -n 16 python -m asgd.train`): held-out accuracy "
                              "and mpiexec's wall time", "measured here",
                              f"{ring['default_run_accuracy']:.4f} in {ring['default_run_s']:.1f} s")
    for k in others:   # float32 (the default) against another precision, the same seeds
        gaps = [(abs(r[k]), r) for r in s if r.get(k) is not None]
        big, r = max(gaps, key=lambda g: g[0])
        out[f"data_{k}"] = (f"float32 (the default) against {k[7:]}, the same seeds: the largest accuracy gap over "
                            f"{len(gaps)} data set × rank points", "measured here",
                            f"{big:.4f} ({r['dataset']}, {r['ranks']} ranks); {sum(g <= 0.005 for g, _ in gaps)} of "
                            f"{len(gaps)} within 0.005")
    return out


def spread(by: dict, who: str) -> str:
    meds = [v[who]["median"] for v in by.values() if v.get(who)]
    return f"per architecture {min(meds):.1f}–{max(meds):.1f} %"


def from_sim(j: dict) -> dict:
    s, epochs = j["summary"], j["args"]["epochs"] if "args" in j else int(j["command"].split("--epochs ")[1].split()[0])
    runs, tag = s["sim_train"].get("runs", s["runs"]), "" if epochs == 8 else f"_e{epochs}"   # 8: the bench's protocol
    return {f"validation_sim{tag}": (f"the simulator's median error of train time, {runs} runs of {epochs} epochs on "
                                     "shared memory that calibrated nothing (`bench_sim validate`)",
                                     "measured here, simulated",
                                     f"{pct(s['sim_train']['median'])} ({spread(s['by_architecture'], 'sim')})"),
            f"validation_model{tag}": (f"the analytical model's median error of train time, the same {runs} runs",
                                       "measured here, predicted by the model",
                                       f"{pct(s['model_train']['median'])} ({spread(s['by_architecture'], 'model')})"),
            **({"calibrate_time": ("a full `python -m asgd.perf calibrate`", "measured here",
                                   f"{j['calibrate_s']:.0f} s")} if j.get("calibrate_s") else {})}


def from_arch(j: dict) -> dict:
    s, rate = j["summary"], j["summary"]["rate"]
    ape = s["ape"]
    out = {"arch_error": (f"time per iteration on the emulated cluster at {rate}, five architectures: median error "
                          f"over {ape['pred']['all']['runs']} runs", "measured on the emulated cluster; predicted, "
                          "simulated", f"model {pct(ape['pred']['all']['median'])}, simulator "
                          f"{pct(ape['sim']['all']['median'])}")}
    for h, o in s["optimizer"].items():
        first, best = o["optimize_first_swept"], o["best_measured"]
        out[f"pick_{rate}_h{h}"] = (f"optimize's first pick at {rate}, 2-{int(h) // 1000}K-2, against the best of "
                                    "the sweep", "measured on the emulated cluster",
                                    f"{o['ratio']:.3f}× ({first['label']} W={first['workers']} "
                                    f"{first['measured_s']:.1f} s; best {best['label']} W={best['workers']} "
                                    f"{best['measured_s']:.1f} s)")
    for h, o in (s.get("second_rate") or {}).items():   # the winners, each measured at the second rate
        rate2 = next(k for k in o["model_winner"] if k != rate)
        pick = o["model_winner"][rate2]
        got = {k: v for k, v in o["measured_s"][rate2].items() if v is not None}
        mine = got.get(f"{pick['label']} W={pick['workers']}")
        best = min(got, key=got.get)
        alone = len(got) == 1   # both rates picked it: nothing else was measured at rate2
        out[f"pick_{rate2}_h{h}"] = (f"optimize's pick at {rate2}, 2-{int(h) // 1000}K-2, against the other rate's "
                                     "pick, both measured at " + rate2, "measured on the emulated cluster",
                                     (f"{pick['label']} W={pick['workers']} {mine:.1f} s, the pick at {rate} too: "
                                      "no other configuration measured" if alone else
                                      f"{mine / got[best]:.3f}× ({pick['label']} W={pick['workers']} {mine:.1f} s; "
                                      f"best {best} {got[best]:.1f} s)") if mine else "not measured")
    return out


def from_testbed(j: dict) -> dict:
    s, prec = j["summary"]["none"], j["rows"][0]["precision"]
    proof = all(r["proof_ok"] for r in j["rows"] if r.get("proof_ok") is not None)
    return {f"testbed_{prec}": (f"one server's ceiling on {j['args']['bandwidth']} links, {prec} (plain messages), "
                                "the model's median error over the sweep, and the byte proof",
                                "measured on the emulated cluster; predicted",
                                f"{s['ceilings']['1']['ceiling_updates_per_s']:.2f} updates/s; model "
                                f"{pct(s['model_median_ape_pct'])}; bytes {'PASS' if proof else 'FAIL'}")}


def from_kernel(j: dict) -> dict:
    rows = {(r["precision"], r["hidden"]): r for r in j["rows"] if r["impl"] == "numba" and r["batch"] == 256}

    def one(h: int) -> str:
        f32, f64 = rows["float32", h], rows["float64", h]
        return (f"2-{h // 1000}K-2 {f32['samples_per_s'] / f64['samples_per_s']:.2f}× ({f32['pct_of_ceiling']:.0f} % "
                f"/ {f64['pct_of_ceiling']:.0f} % of the ceiling)")
    return {"kernel": ("the worker's step at batch 256 (numba): float32 over float64 samples/s, and each against "
                       "its GEMM ceiling (SGEMM, DGEMM)", "measured here",
                       "; ".join(one(h) for p, h in sorted(rows) if p == "float32"))}


def from_messaging(j: dict) -> dict:
    asgd = [r for r in j["rows"] if r["variant"].startswith("asgd")]
    ratios = [r for r in j["float32_over_float64"] if r["variant"].startswith("asgd")]
    worst = max(ratios, key=lambda r: r["float32_over_float64"])
    floor = max((r for r in asgd if r["precision"] == "float32"), key=lambda r: r["vs_reply_first"])
    return {"messaging": ("a push/pull round trip (2 ranks): float32 over float64, and float32's over the reply-first "
                          "floor, the worst optimizer and size of each", "measured here",
                          f"{worst['float32_over_float64']:.2f}× ({worst['variant']}, {worst['model']}); "
                          f"{floor['vs_reply_first']:.2f}× the floor ({floor['variant']}, {floor['model']})")}


def from_server(j: dict) -> dict:
    rows = [r for r in j["rows"] if r["precision"] == "float32" and r["workers"] == 1 and r["path"] == "asgd"
            and r["optimizer"] in ("adagrad", "adam")]
    return {"server": ("the server's update per push in float32, 1 worker: adagrad and adam over sgd",
                       "measured here", "; ".join(f"{r['model']} {r['optimizer']} {r['vs_sgd']:.2f}×" for r in rows))}


def from_e2e(j: dict) -> dict:
    out = {}
    for n in sorted({r["ranks"] for r in j["summary"]}):
        got = {(r["impl"], r["precision"]): r.get("time_to_accuracy_s") for r in j["summary"] if r["ranks"] == n}
        impls = dict.fromkeys(r["impl"] for r in j["rows"] if r["ranks"] == n)   # failed runs are rows too
        def cell(impl: str, p: str) -> str:
            return f"{got[impl, p]:.2f} s" if got.get((impl, p)) else "no result"
        out[f"e2e_{n}"] = (f"time to held-out accuracy {j['target_accuracy']} from process start, {n} ranks, each "
                           "implementation in float32 / float64", "measured here",
                           "; ".join(f"{impl} {cell(impl, 'float32')} / {cell(impl, 'float64')}" for impl in impls))
    return out


def from_tta(j: dict) -> dict:
    """Time to a target per data set: the model's and the simulator's median errors, optimize's pick."""
    where = j.get("where", "shared memory")
    tag = "" if where == "shared memory" else "_testbed"

    def med(s: dict, k: str) -> str:
        return pct(s[k]["median"]) if s.get(k) else "-"
    def noise(s: dict) -> str:   # the repeats' own spread: how close any predictor can get
        return f" (repeats {pct(s['meas_spread'])} apart)" if s.get("meas_spread") is not None else ""
    errs = {who: "; ".join(f"{n} time {med(s, f'{who}_time')}, epochs {med(s, f'{who}_epochs')}"
                           + (noise(s) if who == "model" else "")
                           for n, s in j["summary"].items()) for who in ("model", "sim")}
    picks = "; ".join(f"{n} {s['pick']['ratio']:.2f}× ({s['pick']['tta_pick']}; best {s['pick']['best']}"
                      + (f"; s/epoch pick {s['pick']['per_epoch_pick']} {s['pick']['per_epoch_pick_s']:.2f} s"
                         f" against {s['pick']['tta_pick_s']:.2f} s" if s["pick"]["picks_differ"] else "") + ")"
                      if "ratio" in s["pick"] else f"{n} {s['pick']['skipped']}" for n, s in j["summary"].items())
    kind = "measured " + ("here" if not tag else "on the emulated cluster")
    return {f"tta_model{tag}": (f"time to a target, {where}: the model's median error of time and epochs to it, "
                                "configurations no pilot ran, each judged by its median run (the repeats' "
                                "spread beside)", f"{kind}; predicted", errs["model"]),
            f"tta_sim{tag}": (f"the same, the simulator's ({where})", f"{kind}; simulated", errs["sim"]),
            f"tta_pick{tag}": (f"optimize --target-accuracy's first pick, measured, over the best measured ({where})",
                               f"{kind}; predicted", picks)}


READERS = {"data": ("data.json", from_data), "sim": ("validate.json", from_sim), "arch": ("arch.json", from_arch),
           "testbed": ("testbed.json", from_testbed), "kernel": ("kernel.json", from_kernel),
           "messaging": ("messaging.json", from_messaging), "server": ("server.json", from_server),
           "e2e": ("e2e.json", from_e2e), "tta": ("tta.json", from_tta)}


def render(ids: list[str], figures: dict) -> str:
    """A block's table: each figure with where it comes from."""
    lines = ["| figure | value | how | run |", "|---|---|---|---|"]
    for i in ids:
        f = figures[i]
        lines.append(f"| {f['what']} | {f['value']} | {f['kind']} | `{f['command']}`, {f['date']}, commit "
                     f"{f['commit']}, {f['cpu']}, load {f['load']} |")
    return "\n".join(lines) + "\n"


def render_output(i: str, figures: dict) -> str:
    """An output block: the command as a user types it, what it printed, and where that ran."""
    f = figures[i]
    return (f"```\n{f['command']}\n```\n\n```text\n{f['value'].rstrip()}\n```\n\n*Output {f['kind']}: "
            f"{f['date']}, commit {f['commit']}, {f['cpu']}, load {f['load']}.*\n")


def render_block(kind: str, ids: str, figures: dict) -> str:
    return render(ids.split(), figures) if kind == "figures" else render_output(ids.strip(), figures)


def rewrite(text: str, figures: dict) -> str:
    return BLOCK.sub(lambda m: m[1] + render_block(m[2], m[3], figures) + m[5], text)


def capture(figure: str, kind: str, cwd: Path, argv: list[str]) -> dict:
    """Run a command a page shows, under the CPU lock, and keep what it printed (stdout and
    stderr as a terminal shows them) with its run: the page quotes it as run, not retyped."""
    import shlex
    import subprocess
    import time

    sys.path.insert(0, str(ROOT / "bench"))
    import common   # here, not at the top: it imports asgd, which re-rendering the blocks needs not

    m, sampler = common.machine(bandwidth=False), common.LoadSampler()
    t0 = time.monotonic()
    with common.cpu_lock():
        got = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=3600)
    if got.returncode:
        sys.exit(f"headline --capture: the command exited with {got.returncode}:\n{got.stdout}")
    print(f"captured {figure}: {len(got.stdout.splitlines())} lines in {time.monotonic() - t0:.0f} s")
    j = {"command": shlex.join(argv), "commit": common.commit(), "machine": m, "load": sampler.summary()}
    return {"what": j["command"], "value": got.stdout, "kind": kind, **source(j, None)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, (file, _) in READERS.items():
        p.add_argument(f"--{name}", type=Path, help=f"a bench_{name} output folder (its {file})")
    p.add_argument("--commit", help="the commit the benches ran, for results that do not record it")
    p.add_argument("--capture", metavar="ID", help="run the command after --, keep its output as figure ID")
    p.add_argument("--kind", default="measured here", help="--capture: what the output is (default: measured here)")
    p.add_argument("--cwd", type=Path, default=Path.cwd(), help="--capture: the folder to run it in")
    p.add_argument("command", nargs=argparse.REMAINDER, help="--capture: -- COMMAND ...")
    a = p.parse_args(argv)
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    if a.capture:
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        if not cmd:
            p.error("--capture needs the command after --")
        figures[a.capture] = capture(a.capture, a.kind, a.cwd, cmd)
    for name, (file, read) in READERS.items():
        if getattr(a, name):
            j = json.loads((getattr(a, name) / file).read_text())
            src = source(j, a.commit)
            for k, (what, kind, value) in read(j).items():
                figures[k] = {"what": what, "value": value, "kind": kind, **src}
    FIGURES.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    missing = {f"{q.name}: {i}" for q in PAGES for m in BLOCK.finditer(q.read_text()) for i in m[3].split()
               if i not in figures}
    if missing:
        print(f"no result gave these figures yet (the pages are left as they were): {', '.join(sorted(missing))}")
        return 1
    for page in PAGES:
        page.write_text(rewrite(page.read_text(), figures))
    print(f"wrote {FIGURES.relative_to(ROOT)} ({len(figures)} figures) and the blocks of "
          + ", ".join(str(q.relative_to(ROOT)) for q in PAGES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
