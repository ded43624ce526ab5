"""python -m asgd.perf report RUN_DIR [RUN_DIR ...] --html [--params P]: one self-contained
page (OUT/report.html) for a run or a sweep, from results.json alone: the configuration and
the verdict, the held-out curve against time, per-rank phase bars, the staleness
histogram, the servers' busy share, the bytes, and with --params predicted against
measured. The figures are asgd.perf.report's, inlined as PNGs; the page loads nothing.

Every number shown from results.json sits in an element whose `data-key` names its path
(`ranks.2.bytes_sent`; a sweep's run by `data-run`, its index in the embedded list), and
the page embeds the results.json files (`<script type="application/json" id="results">`):
a reader, or a test, can check each number against its source (`fmt` formats them all).
"""

from __future__ import annotations

import base64
import io
import json
import os
from html import escape

from . import report

CONFIG_KEYS = ("arch", "mode", "world_size", "servers", "workers", "model_parallel", "features", "hidden",
               "classes", "n_w", "batch", "epochs", "optimizer", "lr", "precision", "compress", "reader",
               "train_points", "test_points", "host", "cores", "oversubscribed", "mpi_library")
SUMMARY_KEYS = ("wall_s", "init_s", "train_s", "metrics.accuracy", "metrics.loss", "throughput.samples_per_s",
                "throughput.updates_per_s", "throughput.updates")
SWEEP_KEYS = ("config.arch", "config.world_size", "config.servers", "config.workers", "wall_s", "init_s",
              "train_s", "metrics.accuracy", "throughput.samples_per_s", "profile.bound")
COMPARE_MEASURED = {"init": "init_s", "train": "train_s", "total": "wall_s"}   # the others are means of phases

STYLE = """body{font-family:sans-serif;margin:1.5em auto;padding:0 1em;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:2px 8px}
td[data-key],td[data-compare]{text-align:right}img{max-width:100%;display:block;margin:.5em 0}
.verdict{font-size:1.1em;background:#f4f4f4;padding:.5em}.none{color:#777}
.side{display:flex;gap:2em;flex-wrap:wrap;align-items:flex-start}"""


def fmt(value) -> str:
    """A results.json value as the page shows it: 4 significant digits below 1000, whole
    numbers with thousands separators, n/a for null, yes/no for booleans."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def lookup(results: dict, key: str):
    """The value at a dotted path (`ranks.2.bytes.train.sent`: list items by index)."""
    value = results
    for part in key.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _cell(r: dict, key: str, tag: str = "td", run: int | None = None) -> str:
    """An element showing results.json's value at `key`, which it names (and its run's index,
    where it is not inside the run's section)."""
    where = "" if run is None else f' data-run="{run}"'
    return f'<{tag}{where} data-key="{key}">{escape(fmt(lookup(r, key)))}</{tag}>'


def _png(draw, *args, plt, alt: str) -> str:
    """A figure of asgd.perf.report's, drawn into memory and inlined as a data: URI."""
    buf = io.BytesIO()
    draw(*args, buf, plt)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def _table(head: list[str], rows: list[str]) -> str:
    return ("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
            + "".join(f"<tr>{row}</tr>" for row in rows) + "</table>")


def _who(x: dict) -> str:
    return f"<td>{x['rank']}</td><td>{escape(x['role'])}</td>"


def _none(why: str) -> str:
    return f'<p class="none">{escape(why)}</p>'


def run_section(r: dict, name: str, plt) -> str:
    """The page of one run: its configuration, verdict, numbers and figures."""
    parts = (_summary, _curve, _phases, _staleness, _busy, _bytes)
    return "\n".join([f"<h2>{escape(name)}: {escape(report.describe(r))}</h2>", *(part(r, plt) for part in parts)])


def _summary(r: dict, plt) -> str:
    out = [f'<p class="verdict">verdict: {_cell(r, "profile.bound", "b")}-bound: {_cell(r, "profile.why", "span")}</p>',
           '<div class="side">',
           _table(["configuration", ""], [f"<th>{k}</th>{_cell(r, f'config.{k}')}"
                                          for k in CONFIG_KEYS if k in r["config"]]),
           _table(["result", ""], [f"<th>{k}</th>{_cell(r, k)}" for k in SUMMARY_KEYS
                                   + (("stopped",) if r.get("stopped") else ())]),
           "</div>"]
    if r.get("target"):
        out.append(_table(["target", ""], [f"<th>{k}</th>{_cell(r, f'target.{k}')}"
                                           for k in ("metric", "value", "reached", "train_s", "epochs")]))
    if r.get("notes"):
        out.append("<ul>" + "".join(f"<li>{_cell(r, f'notes.{i}', 'span')}</li>"
                                    for i in range(len(r["notes"]))) + "</ul>")
    return "\n".join(out)


def _curve(r: dict, plt) -> str:
    head = "<h3>Held-out accuracy and loss against time</h3>"
    curve = r["metrics"].get("curve") or []
    if not curve:
        return head + _none("no held-out curve: with several servers no rank holds all of w during training")
    keys = ("train_s", "samples", "updates", "loss", "accuracy")
    return "\n".join([head, _png(report.curve_png, r, plt=plt, alt="held-out curve"),
                      "<details><summary>the curve's points</summary>" + _table(list(keys), [
                          "".join(_cell(r, f"metrics.curve.{j}.{k}") for k in keys) for j in range(len(curve))])
                      + "</details>"])


def _phases(r: dict, plt) -> str:
    ranks = r["ranks"]
    phases = [p for p in report.STACK if any(p in x["phases"] for x in ranks)]
    return "\n".join([
        "<h3>Where each rank's time goes</h3>",
        _png(report.profile_png, r, plt=plt, alt="per-rank phases"),
        _png(report.timeline_png, r, plt=plt, alt="per-rank timeline"),
        _table(["rank", "role"] + [f"{p} s" for p in phases], [
            _who(x) + "".join(_cell(r, f"ranks.{i}.phases.{p}") if p in x["phases"] else "<td></td>" for p in phases)
            for i, x in enumerate(ranks)])])


def _staleness(r: dict, plt) -> str:
    head = "<h3>Staleness</h3>"
    owners = report.owners_staleness(r)
    if not owners:
        return head + _none("no staleness recorded")
    return "\n".join([head, _png(report.staleness_png, r, plt=plt, alt="staleness histogram"),
                      _table(["rank", "role", "of", "mean", "max"], [
                          _who(r["ranks"][i]) + f"<td>{key}</td>"
                          + _cell(r, f"ranks.{i}.{key}.mean") + _cell(r, f"ranks.{i}.{key}.max")
                          for i, key in owners])])


def _busy(r: dict, plt) -> str:
    head = "<h3>The servers' busy share</h3>"
    busy = report.busy_ranks(r)
    if not busy:
        return head + _none(f"no server: --arch {r['config'].get('arch', 'ps')}")
    return "\n".join([head, _png(report.busy_png, r, plt=plt, alt="busy share"),
                      _table(["rank", "role", "busy % of training"], [
                          _who(r["profile"]["ranks"][i]) + _cell(r, f"profile.ranks.{i}.busy_pct") for i in busy])])


def _bytes(r: dict, plt) -> str:
    parts = [f"bytes.{p}.{side}" for p in report.BYTE_PARTS for side in ("sent", "recv")]
    return "\n".join([
        "<h3>Bytes</h3>", _png(report.bytes_png, r, plt=plt, alt="bytes per rank"),
        _table(["rank", "role", "sent", "received"] + [p[len("bytes."):] for p in parts], [
            _who(x) + "".join(_cell(r, f"ranks.{i}.{k}") for k in ("bytes_sent", "bytes_recv", *parts))
            for i, x in enumerate(r["ranks"])])])


def sweep_section(runs: list[dict], names: list[str], plt) -> str:
    """A sweep's scaling figure and a row per run."""
    return "\n".join([
        "<h2>Scaling</h2>", _png(report.scaling_png, runs, plt=plt, alt="scaling"),
        _table(["run", *(k.split(".")[-1] for k in SWEEP_KEYS)], [
            f'<td><a href="#run-{i}">{escape(name)}</a></td>'
            + "".join(_cell(r, k, run=i) for k in SWEEP_KEYS)
            for i, (r, name) in enumerate(zip(runs, names))])])


def compare_section(rows: list[dict], phases: tuple[str, ...], index: dict[str, int], names: list[str],
                    plt) -> str:
    """Predicted against measured (asgd.perf.cli.compare's rows, for these phases): a
    predicted or derived number has `data-compare` (its column in the rows), a measured one
    from results.json its `data-key`."""
    out = ["<h2>Predicted against measured</h2>"]
    if not rows:
        return "\n".join(out + [_none("no run the model covers (stopped early, resumed, or 1-bit messages)")])
    labels = [names[index[row["run"]]] for row in rows]
    whole = [k for k in phases if k in COMPARE_MEASURED]   # the figure: the job's phases
    out.append(_png(report.compare_png, rows, labels, whole, plt=plt, alt="predicted against measured"))
    body = []
    for row, label in zip(rows, labels):
        i = index[row["run"]]
        for k in phases:
            meas = (f'<td data-run="{i}" data-key="{COMPARE_MEASURED[k]}">{fmt(row[f"{k}_meas_s"])}</td>'
                    if k in COMPARE_MEASURED else f'<td data-compare="{k}_meas_s">{fmt(row[f"{k}_meas_s"])}</td>')
            body.append(f"<td>{escape(label)}</td><td>{k}</td>"
                        f'<td data-compare="{k}_pred_s">{fmt(row[f"{k}_pred_s"])}</td>{meas}'
                        f'<td data-compare="{k}_ape">{fmt(row[f"{k}_ape"])}</td>')
    return "\n".join(out + [_table(["run", "phase", "predicted s", "measured s", "APE %"], body)])


def page(runs: list[dict], paths: list[str], compared: tuple[list[dict], tuple[str, ...]] | None, plt) -> str:
    names = [os.path.basename(os.path.normpath(os.path.dirname(p) if p.endswith(".json") else p)) for p in paths]
    title = f"asgd report: {names[0]}" if len(runs) == 1 else f"asgd report: a sweep of {len(runs)} runs"
    body = [f"<h1>{escape(title)}</h1>"]
    if len(runs) > 1:
        body.append(sweep_section(runs, names, plt))
    if compared is not None:
        body.append(compare_section(*compared, {p: i for i, p in enumerate(paths)}, names, plt))
    for i, (r, name) in enumerate(zip(runs, names)):
        body.append(f'<section id="run-{i}" data-run="{i}">{run_section(r, name, plt)}</section>')
    # "</" escaped: a string in results.json cannot end the script element
    embedded = json.dumps(runs).replace("</", "<\\/")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body)
            + f'\n<script type="application/json" id="results">{embedded}</script>\n</body></html>\n')


def write_page(run_args: list[str], out: str | None = None,
               compared: tuple[list[dict], tuple[str, ...]] | None = None) -> int:
    """OUT/report.html for the runs (a sweep's folder: its runs); 2 without matplotlib.
    compared: asgd.perf.cli.compare's rows and their phases, for predicted against measured."""
    if (plt := report.pyplot()) is None:
        return 2
    paths = report.expand(run_args)
    runs = [report.load(p) for p in paths]
    out = out or report.default_out(run_args)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page(runs, paths, compared, plt))
    print(f"wrote {path}")
    return 0
