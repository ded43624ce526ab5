"""MkDocs hook: the options reference (docs/options.md), rendered at build time from the
argparse parsers the commands themselves parse with, so it cannot drift from them.

docs/options.md holds the page's prose and MARKER; on build, MARKER becomes one section
per command (subcommands included): its usage line, its description and a table of every
option with its flags, metavar, default and help. tests/test_docs.py calls render() and
checks that every option of every parser is on the page.

Imports no MkDocs: render() runs wherever asgd is installed.
"""

from __future__ import annotations

import argparse
import importlib
import textwrap

MARKER = "<!-- options: generated from the parsers by docs/hooks/options.py -->"
PAGE = "options.md"

# (anchor, command as typed, module, the function that builds its parser)
COMMANDS = [
    ("asgd-train", "mpiexec -n N python -m asgd.train", "asgd.run.config", "build_parser"),
    ("asgd-predict", "python -m asgd.predict", "asgd.predict", "build_parser"),
    ("asgd-data", "python -m asgd.data", "asgd.data.__main__", "build_parser"),
    ("asgd-perf", "python -m asgd.perf", "asgd.perf.cli", "build_parser"),
    ("asgd-sim", "python -m asgd.sim", "asgd.sim.cli", "build_parser"),
    ("asgd-testbed", "python -m asgd.testbed", "asgd.testbed.cli", "parser"),
    ("asgd-launch", "python -m asgd.launch", "asgd.launch", "parser"),
    ("asgd-doctor", "python -m asgd.doctor", "asgd.doctor.cli", "build_parser"),
]


def parsers() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(anchor, command, parser) of every command, from the modules that define them."""
    return [(anchor, command, getattr(importlib.import_module(module), build)())
            for anchor, command, module, build in COMMANDS]


def subcommands(p: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order they were added."""
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return out


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options and positional arguments of one parser (not -h, not the subcommands)."""
    return [a for a in p._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, no HTML, no emphasis, no cell breaks."""
    text = " ".join(str(text).split())
    for ch, esc in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*"), ("_", "\\_")):
        text = text.replace(ch, esc)
    return text


def _code(text: str) -> str:
    """A code span for a table cell (Python-Markdown's tables keep a pipe inside one)."""
    return "`" + text + "`"


def flags(p: argparse.ArgumentParser, a: argparse.Action) -> str:
    """As --help shows the option: '-n RANKS, --ranks RANKS', '--reader {sequential,parallel}'."""
    return p._get_formatter()._format_action_invocation(a)


def default(a: argparse.Action) -> str:
    if a.required or (not a.option_strings and a.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE,
                                                                   argparse.REMAINDER)):
        return "required"
    if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if isinstance(a, argparse._StoreTrueAction) else "on"
    if a.default is None or a.default == argparse.SUPPRESS:
        return "—"
    if isinstance(a.default, (list, tuple)):
        return _code(",".join(str(x) for x in a.default))
    return _code(str(a.default))


def help_text(p: argparse.ArgumentParser, a: argparse.Action) -> str:
    """The help as --help prints it (%(default)s and the like expanded)."""
    return p._get_formatter()._expand_help(a) if a.help else ""


def table(p: argparse.ArgumentParser) -> list[str]:
    """The arguments and options in one table, then one table per titled argument group."""
    shown = set(map(id, options(p)))
    plain = ("positional arguments", "options", "optional arguments")
    groups = [("", [a for g in p._action_groups if g.title in plain for a in g._group_actions])]
    groups += [(g.title, g._group_actions) for g in p._action_groups if g.title not in plain]
    lines: list[str] = []
    for title, acts in groups:
        acts = [a for a in acts if id(a) in shown]
        if not acts:
            continue
        if title:
            lines += [f"*{_cell(title)}*", ""]
        lines += ["| option | default | meaning |", "|---|---|---|"]
        lines += [f"| {_code(flags(p, a))} | {default(a)} | {_cell(help_text(p, a))} |" for a in acts]
        lines.append("")
    return lines


def description(p: argparse.ArgumentParser) -> list[str]:
    """Prose as prose; a description laid out by hand (RawDescriptionHelpFormatter) as-is."""
    if not p.description:
        return []
    text = textwrap.dedent(p.description).strip()
    if p.formatter_class is argparse.RawDescriptionHelpFormatter:
        return ["```text", text, "```", ""]
    return [_cell(text), ""]


def usage(p: argparse.ArgumentParser) -> str:
    """The usage line as --help prints it, wrapped at a fixed width (--help's follows the
    terminal's), so the page is the same wherever it is built."""
    f = p.formatter_class(prog=p.prog, width=80)
    f.add_usage(p.usage, p._actions, p._mutually_exclusive_groups)
    return f.format_help().strip()


def section(level: int, title: str, anchor: str, p: argparse.ArgumentParser) -> list[str]:
    lines = [f"{'#' * level} `{title}` {{#{anchor}}}", "", "```text", usage(p), "```", ""]
    lines += description(p) + table(p)
    for name, summary, sub in subcommands(p):
        lines += [f"{'#' * (level + 1)} `{title} {name}` {{#{anchor}-{name}}}", ""]
        if summary:
            lines += [_cell(summary[:1].upper() + summary[1:]) + ".", ""]
        lines += ["```text", usage(sub), "```", ""] + table(sub)
    return lines


def render() -> str:
    """The generated part of docs/options.md: every command, every option."""
    lines: list[str] = []
    for anchor, command, p in parsers():
        title = command.replace("mpiexec -n N ", "").replace("python -m ", "")
        lines += section(2, title, anchor, p)
    return "\n".join(lines)


# -- the MkDocs hook ----------------------------------------------------------------------

def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker {MARKER!r}: the options would be missing")
    return markdown.replace(MARKER, render())
