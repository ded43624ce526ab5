"""`python -m asgd.perf report --html`: the page renders in headless Chromium (Debian's
`chromium`, driven by Playwright) with no console error and no request beyond itself, and
every number it shows is results.json's (the page's data-key elements: asgd.perf.html).
For a parameter server, p2p, allreduce and a sweep; the runs are the session's lockstep runs
(tests/conftest.py), which test_architectures and test_p2p read too."""

import shutil

import pytest

from asgd.perf import cli, html, report
from conftest import load_results

CHROMIUM = shutil.which("chromium")
# headless as root; no background networking, component updates or sync: the page needs no network
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

# What the page's elements hold, read in the browser: the numbers with their paths (and their
# run: the element's own data-run or its section's), the embedded results, the images.
READ_PAGE = """() => {
  const run = el => Number((el.closest('[data-run]') || {dataset: {run: 0}}).dataset.run);
  return {
    cells: [...document.querySelectorAll('[data-key]')].map(
      el => ({key: el.dataset.key, run: run(el), text: el.textContent})),
    compared: [...document.querySelectorAll('[data-compare]')].map(
      el => ({key: el.dataset.compare, run: run(el), text: el.textContent})),
    embedded: JSON.parse(document.getElementById('results').textContent),
    images: [...document.images].map(img => ({src: img.src.slice(0, 22), width: img.naturalWidth})),
    external: document.querySelectorAll('link, script[src], iframe, object, embed').length,
  };
}"""


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: apt-get install --no-install-recommends chromium (Debian's package)")
    pytest.importorskip("matplotlib")
    sync_api = pytest.importorskip("playwright.sync_api", reason="no Playwright: pip install -e '.[browser]'")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def render(browser, path) -> dict:
    """The page at `path`, loaded in Chromium: READ_PAGE's facts, and `problems`: every
    console error or warning, uncaught exception and request for anything but the page."""
    page = browser.new_page()
    problems, url = [], path.resolve().as_uri()
    page.on("console", lambda m: m.type in ("error", "warning") and problems.append(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    page.on("request", lambda r: r.url != url and not r.url.startswith("data:") and problems.append(r.url))
    page.goto(url, wait_until="load")
    facts = page.evaluate(READ_PAGE)
    page.close()
    return {**facts, "problems": problems}


def shown_as(cell: dict, value) -> None:
    """The page's text is `fmt`'s for the value and, for a number, reads back as it."""
    text = cell["text"]
    assert text == html.fmt(value), cell
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        assert float(text.replace(",", "")) == pytest.approx(value, rel=1e-3, abs=0.5 if abs(value) >= 1000 else 0), \
            cell


def required_keys(r: dict) -> set[str]:
    """The numbers every run's page must show: the verdict, the results, each rank's
    phases and bytes, the owners' staleness, the servers' busy share, the curve."""
    keys = {"profile.bound", "profile.why", "wall_s", "init_s", "train_s", "metrics.accuracy", "metrics.loss",
            "config.arch", "config.workers", "config.hidden"}
    for i, x in enumerate(r["ranks"]):
        keys |= {f"ranks.{i}.bytes_sent", f"ranks.{i}.bytes_recv", f"ranks.{i}.bytes.train.sent"}
        keys |= {f"ranks.{i}.phases.{p}" for p in report.STACK if p in x["phases"]}
    keys |= {f"ranks.{i}.{k}.mean" for i, k in report.owners_staleness(r)}
    keys |= {f"profile.ranks.{i}.busy_pct" for i in report.busy_ranks(r)}
    keys |= {f"metrics.curve.{j}.accuracy" for j in range(len(r["metrics"]["curve"]))}
    return keys


def check_page(got: dict, runs: list[dict], figures: int) -> None:
    assert got["problems"] == []
    assert got["external"] == 0
    assert got["embedded"] == runs
    assert len(got["images"]) == figures
    assert all(img["src"] == "data:image/png;base64," and img["width"] > 0 for img in got["images"])
    for cell in got["cells"]:
        shown_as(cell, html.lookup(runs[cell["run"]], cell["key"]))
    for i, r in enumerate(runs):
        missing = required_keys(r) - {c["key"] for c in got["cells"] if c["run"] == i}
        assert not missing, f"run {i} does not show {sorted(missing)}"


def figures_of(r: dict) -> int:
    """The figures a run's section has: phases, timeline, bytes; the curve, staleness and
    busy share where it has them."""
    return (3 + bool(r["metrics"]["curve"]) + bool(report.owners_staleness(r)) + bool(report.busy_ranks(r)))


ARCHES = {"ps": (4, ()), "p2p": (3, ("--arch", "p2p")), "allreduce": (3, ("--arch", "allreduce"))}


@pytest.mark.parametrize("arch", ARCHES)
def test_a_runs_page_shows_its_results_json(browser, lockstep_run, tmp_path, arch):
    n, args = ARCHES[arch]
    run = lockstep_run(n, *args)
    assert cli.main(["report", str(run), "--html", "--out", str(tmp_path)]) == 0
    r = load_results(run)
    got = render(browser, tmp_path / "report.html")
    check_page(got, [r], figures_of(r))
    assert got["compared"] == []   # no --params, no predictions
    if arch == "allreduce":
        assert "profile.ranks.0.busy_pct" not in {c["key"] for c in got["cells"]}


def test_a_sweeps_page_has_its_scaling_and_a_row_per_run(browser, lockstep_run, tmp_path):
    """A sweep's folder as slurm/sweep.sbatch lays it out (n<K>/results.json), here of
    the parameter server with 2 and 3 workers."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for k in (3, 4):
        (sweep / f"n{k}").symlink_to(lockstep_run(k), target_is_directory=True)
    assert cli.main(["report", str(sweep), "--html", "--out", str(tmp_path / "page")]) == 0
    runs = [load_results(sweep / f"n{k}") for k in (3, 4)]
    got = render(browser, tmp_path / "page" / "report.html")
    check_page(got, runs, 1 + sum(figures_of(r) for r in runs))   # 1: the scaling figure
    for i in (0, 1):   # the sweep's table: the row of each run
        assert {"wall_s", "config.workers", "profile.bound"} <= {
            c["key"] for c in got["cells"] if c["run"] == i and not c["key"].startswith(("ranks.", "metrics."))}
    assert [r["config"]["workers"] for r in got["embedded"]] == [2, 3]


def test_params_add_predicted_against_measured(browser, lockstep_run, quick_params, tmp_path):
    """--params: every predicted, measured and APE number is asgd.perf compare's. 20 epochs:
    compare skips a training under asgd.train's MIN_TRAIN_S, and 2 epochs trained 22 ms here."""
    run = str(lockstep_run(4, "--epochs", "20"))
    assert cli.main(["report", run, "--html", "--params", str(quick_params), "--out", str(tmp_path)]) == 0
    r = load_results(run)
    got = render(browser, tmp_path / "report.html")
    check_page(got, [r], figures_of(r) + 1)   # 1: predicted against measured
    [row], skipped = cli.compare([run], cli.load_params(str(quick_params)))
    assert not skipped
    assert {c["key"] for c in got["compared"]} == {
        f"{k}_{what}" for k in cli.PHASES + cli.DETAIL for what in ("pred_s", "ape")} | {
        f"{k}_meas_s" for k in cli.DETAIL}
    for cell in got["compared"]:
        shown_as(cell, row[cell["key"]])
    measured = {c["key"] for c in got["cells"]}
    assert {"init_s", "train_s", "wall_s"} <= measured
