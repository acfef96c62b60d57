"""Option names across the commands: ``--out`` for every output, ``--block-rows`` for every read block, and the
old spellings of renamed options kept as hidden aliases that warn."""

from __future__ import annotations

import argparse
import logging

import pytest

from ctrkit.cli import RENAMED_OPTIONS, build_parser, subcommand
from ctrkit.cli_reference import walk

# the arguments each command with a renamed option needs besides it (none of them is read: parsing only)
BASE = {
    ("preprocess", "criteo"): ["in.tsv", "--out", "o"],
    ("preprocess", "table"): ["in.csv", "--schema", "s.yaml", "--out", "o"],
    ("predict",): ["--checkpoint", "c.pt", "--input", "rows.tsv"],
    ("recall",): ["--checkpoint", "c.pt"],
    ("tune",): ["--config", "c.yaml", "--trials", "1"],
}
RENAMES = [(path, old, new) for path, renamed in RENAMED_OPTIONS.items() for old, new in renamed.items()]


def _visible_options() -> dict[tuple[str, ...], list[str]]:
    return {path: [s for a in p._actions if a.help is not argparse.SUPPRESS for s in a.option_strings]
            for path, _, p in walk(build_parser())}


def test_every_output_option_is_out() -> None:
    outputs = {path: [o for o in opts if o.startswith("--out") or o.endswith("-dir")]
               for path, opts in _visible_options().items()}
    assert {path: o for path, o in outputs.items() if o and o != ["--out"]} == {}
    for path in (("predict",), ("recall",), ("tune",), ("export",), ("synth",), ("report",), ("demo",),
                 ("preprocess", "criteo"), ("preprocess", "table"), ("preprocess", "behaviour")):
        assert outputs[path] == ["--out"], path


def test_the_read_block_option_has_one_name() -> None:
    opts = _visible_options()
    for path in (("preprocess", "criteo"), ("preprocess", "table")):
        assert [o for o in opts[path] if o.endswith("-rows")] == ["--block-rows"]


@pytest.mark.parametrize("path, old, new", RENAMES, ids=[f"{' '.join(p)} {o}" for p, o, _ in RENAMES])
def test_an_old_spelling_parses_as_the_new_one_and_warns_once(path, old, new, caplog) -> None:
    value = "77" if new == "--block-rows" else "x.out"
    argv = [*path, *BASE[path]]
    with caplog.at_level(logging.WARNING, logger="ctrkit"):
        want, _ = build_parser().parse_known_args([*argv, new, value])
        assert not caplog.records
        got, rest = build_parser().parse_known_args([*argv, f"{old}={value}"])
    assert rest == [] and vars(got) == vars(want)
    assert [r.getMessage() for r in caplog.records] == [f"{old} is deprecated and will be removed: use {new}"]
    assert old not in subcommand(build_parser(), path).format_help()  # hidden


def test_a_required_output_is_still_required(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["predict", *BASE[("predict",)]])
    assert "the following arguments are required: --out" in capsys.readouterr().err
    assert "--out OUT" in subcommand(build_parser(), ("predict",)).format_usage()  # not [--out OUT]
