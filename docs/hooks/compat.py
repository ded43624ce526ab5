"""MkDocs hook: which asgd.train options combine (docs/options.md's compatibility table),
asked of asgd.run.config.parse itself at build time, so the table is the validator's rules
and cannot drift from them.

Each cell is one parse of the two options together on WORLD ranks: ✓ when the validator
takes them, else ✗ and a note number whose text is the validator's own message.
tests/test_docs.py checks cells against parse, and that the page holds the table.

Imports no MkDocs: render() runs wherever asgd is installed.
"""

from __future__ import annotations

MARKER = "<!-- compat: generated from asgd.run.config's validator by docs/hooks/compat.py -->"
PAGE = "options.md"
WORLD = 8   # ranks of every probe: room for 2 servers, replicas of 2, a backup worker

# (label, options): each a choice away from the defaults (--arch ps, --mode async, 1 server)
FEATURES = [
    ("--arch p2p", ["--arch", "p2p"]),
    ("--arch allreduce", ["--arch", "allreduce"]),
    ("--mode ssp", ["--mode", "ssp"]),
    ("--mode sync", ["--mode", "sync"]),
    ("--servers 2", ["--servers", "2"]),
    ("--compress 1bit", ["--compress", "1bit"]),
    ("--mode sync --backup-workers 1", ["--mode", "sync", "--backup-workers", "1"]),
    ("--fault-tolerant", ["--fault-tolerant"]),
    ("--model-parallel 2", ["--model-parallel", "2"]),
]


def verdict(argv: list[str]) -> str | None:
    """None if asgd.train takes these options on WORLD ranks, else the validator's message."""
    from asgd.run.config import ConfigError, parse
    try:
        parse(argv, WORLD, quiet_help=True)
    except ConfigError as e:
        return str(e)
    return None


def same_option(a: list[str], b: list[str]) -> bool:
    """Whether two features set one option (--mode sync and --mode sync --backup-workers 1 do)."""
    return bool({x for x in a if x.startswith("--")} & {x for x in b if x.startswith("--")})


def grid() -> dict[tuple[str, str], str | None]:
    """(row label, column label) -> the validator's message for the pair (None: they combine);
    pairs that set one option twice are left out."""
    return {(ra, cb): verdict(a + b) for ra, a in FEATURES for cb, b in FEATURES
            if ra != cb and not same_option(a, b)}


def render() -> str:
    cells, notes = grid(), {}
    head = "| with | " + " | ".join(f"`{label}`" for label, _ in FEATURES) + " |"
    lines = [head, "|---" * (len(FEATURES) + 1) + "|"]
    for ra, _ in FEATURES:
        row = []
        for cb, _ in FEATURES:
            if (ra, cb) not in cells:
                row.append("·")
            elif cells[ra, cb] is None:
                row.append("✓")
            else:
                n = notes.setdefault(cells[ra, cb], len(notes) + 1)
                row.append(f"✗ {n}")
        lines.append(f"| `{ra}` | " + " | ".join(row) + " |")
    lines += ["", f"Each cell: the two options together on {WORLD} ranks, the rest at their defaults. "
              "✓: asgd.train takes them; ✗ n: it refuses, with note n's message; ·: the same option twice.", ""]
    lines += [f"{n}. {msg.replace('|', '/')}" for msg, n in notes.items()]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker {MARKER!r}: the compatibility table would be missing")
    return markdown.replace(MARKER, render())
