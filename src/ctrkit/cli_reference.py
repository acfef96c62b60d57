"""The command-line reference, docs/cli.md, generated from the argparse parser of :mod:`ctrkit.cli`.

    python -m ctrkit.cli_reference            # (re)write docs/cli.md
    python -m ctrkit.cli_reference --check    # exit 1 when docs/cli.md is not what render() gives

:func:`render` walks ``build_parser()``: every sub-command (nested ones such as ``preprocess criteo``
too), in the order the parser registers them, with its help line, its usage and a table of its
arguments (option strings, default, choices, help). The output depends on the parser only: usage is
formatted at a fixed width (not the terminal's), so the same code gives the same file everywhere and
``tests/test_docs.py`` can compare the two.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

WIDTH = 100  # usage lines are wrapped at this width, whatever the terminal
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
REGENERATE = "python -m ctrkit.cli_reference"

HEADER = f"""# Command-line reference

<!-- Generated from the argparse parser (src/ctrkit/cli.py) by `{REGENERATE}`; do not edit by hand.
     tests/test_docs.py fails when this file and the parser differ. -->

Every command takes `-h` / `--help`. Errors of ctrkit's own kinds (bad config, bad data, bad store)
are printed as one line and exit with status 2. `ctrkit -v COMMAND ...` logs at debug level.
`ctrkit train` also takes config overrides after its options, `--block.key=value` (for example
`--train.lr=3e-4 --model.params.dnn_hidden=[128,64]`), each checked against the config's types.
"""


def _fixed_width(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` format its usage at :data:`WIDTH` columns, whatever ``COLUMNS`` says."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH, max_help_position=40)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def walk(parser: argparse.ArgumentParser,
         path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """(command path, help line, parser) of every sub-command under ``parser``, depth first, in the order
    the parser registered them; a command with sub-commands of its own comes before them."""
    sub = _subparsers(parser)
    if sub is None:
        return
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    for name, child in sub.choices.items():
        yield (*path, name), helps.get(name, ""), child
        yield from walk(child, (*path, name))


def _cell(text: str) -> str:
    """``text`` fit for one Markdown table cell: one line, ``|`` escaped, and ``<name>`` placeholders kept
    visible (a Markdown renderer would take them for HTML tags)."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _default(action: argparse.Action) -> str:
    if action.required or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                              argparse._HelpAction, argparse._VersionAction)):
        return ""
    d = action.default
    if d is None or d is argparse.SUPPRESS or d == []:
        return ""
    return f"`{d}`"


def _names(action: argparse.Action) -> str:
    if not action.option_strings:  # a positional
        return f"`{action.metavar or action.dest}`"
    return ", ".join(f"`{s}`" for s in action.option_strings)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help is argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)  # %(default)s and friends, as --help shows them


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help is argparse.SUPPRESS:
            continue
        kind = "required" if action.required and action.option_strings else ""
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices is not None else ""
        nargs = {"*": "zero or more", "+": "one or more", "?": "optional"}.get(str(action.nargs), "")
        notes = "; ".join(x for x in (kind, nargs, f"one of {choices}" if choices else "") if x)
        help_text = _help(parser, action)
        text = f"{help_text} ({notes})" if help_text and notes else (help_text or notes)
        rows.append(f"| {_names(action)} | {_default(action)} | {_cell(text)} |")
    if not rows:
        return []
    return ["| argument | default | description |", "| --- | --- | --- |", *rows]


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The Markdown reference of every command of ``parser`` (default: ctrkit's)."""
    if parser is None:
        from ctrkit.cli import build_parser

        parser = build_parser()
    prog = parser.prog
    out = [HEADER]
    commands = list(walk(parser))
    out.append("Commands: " + ", ".join(f"[`{' '.join(p)}`](#{_anchor(prog, p)})" for p, _, _ in commands) + ".\n")
    _fixed_width(parser)
    out += [f"## {prog}", "", "```text", parser.format_usage().strip(), "```", "", *_arguments(parser), ""]
    for path, help_line, child in commands:
        _fixed_width(child)
        out += [f"## {prog} {' '.join(path)}", ""]
        if help_line:
            out += [help_line[0].upper() + help_line[1:] + ("" if help_line.endswith(".") else "."), ""]
        out += ["```text", child.format_usage().strip(), "```", ""]
        args = _arguments(child)
        out += [*args, ""] if args else []
    out += _renamed(prog, commands)
    return "\n".join(out).rstrip() + "\n"


def _renamed(prog: str, commands: list[tuple[tuple[str, ...], str, argparse.ArgumentParser]]) -> list[str]:
    """The section on renamed options: the hidden old spellings (``ctrkit.cli.CtrkitParser.rename_option``: an
    action with a ``new`` one) of every command; nothing when there are none."""
    rows = [f"| `{prog} {' '.join(path)}` | `{a.option_strings[0]}` | `{a.new.option_strings[0]}` |"
            for path, _, child in commands for a in child._actions if isinstance(getattr(a, "new", None), argparse.Action)]
    if not rows:
        return []
    return ["## Renamed options", "",
            ("Every output directory or file is `--out` and every rows-per-read-block option `--block-rows`. The old "
             "spellings below still work but are hidden from `--help` and log a warning naming the new option; "
             "scripts should move to the new names, as the old ones will be removed."), "",
            "| command | old | new |", "| --- | --- | --- |", *rows, ""]


def _anchor(prog: str, path: Sequence[str]) -> str:
    """GitHub's anchor of the heading ``<prog> <path>``."""
    return "-".join((prog, *path)).lower()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=REGENERATE, description="write (or --check) docs/cli.md")
    p.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale; write nothing")
    p.add_argument("--out", type=Path, default=DOC, help="the file to write or check (default: docs/cli.md)")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
        if current != text:
            sys.stderr.write(f"{args.out} is stale: regenerate it with `{REGENERATE}`\n")
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
