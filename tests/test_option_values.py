"""Every declared option refuses a wrong value before any work, with one line naming it: each CLI option typed by
``cli_type`` and each leaf key of the config dataclasses, with values drawn from what its declaration forbids
(wrong types, values outside the declared range, NaN / infinities, YAML that does not parse); and the table
schema's keys. Commands run in-process through ``ctrkit.cli.main``."""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import typing
from contextlib import redirect_stderr
from typing import Annotated, Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrkit.cli import build_parser, main
from ctrkit.cli_reference import walk
from ctrkit.data.pipeline.spec import load_spec
from ctrkit.errors import DataError
from ctrkit.training.config import Config
from ctrkit.typecheck import Bound, OneChar

# what each command needs besides the option under test (never read: the bad option must stop it first)
REQUIRED = {
    ("preprocess", "criteo"): ["in.tsv", "--out", "o"], ("preprocess", "table"): ["in.csv", "--schema", "s.yaml",
                                                                                    "--out", "o"],
    ("preprocess", "behaviour"): ["in.csv", "--out", "o"], ("synth",): ["--rows", "1", "--out", "o"],
    ("evaluate",): ["--checkpoint", "c.pt"], ("predict",): ["--checkpoint", "c.pt", "--input", "i", "--out", "o"],
    ("recall",): ["--checkpoint", "c.pt", "--out", "o"], ("serve",): ["--checkpoint", "c.pt"],
    ("tune",): ["--config", "c.yaml", "--trials", "1"], ("train",): ["--config", "c.yaml"], ("demo",): [],
}


def _typed_options() -> list[tuple[tuple[str, ...], str, Any]]:
    """(command path, option, annotation) of every option whose argparse type is a ``cli_type``."""
    return [(path, a.option_strings[0], a.type.annotation) for path, _, p in walk(build_parser())
            for a in p._actions if a.option_strings and hasattr(a.type, "annotation")]


def _wrong(tp: Any) -> st.SearchStrategy[str]:
    """Text that annotation ``tp`` must refuse."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    junk = st.sampled_from(["eight", "lots", "", "1,5", "[1,", "{a: 1", "nan", "inf", "-inf", "true", "0x1g"])
    if origin is Annotated:
        inner, *rules = args
        bound = next((r for r in rules if isinstance(r, Bound)), None)
        if any(isinstance(r, OneChar) for r in rules):
            return st.one_of(st.just(""), st.just('"'), st.text(min_size=2, max_size=4))
        if inner is int and bound is not None:
            outs = [st.integers(max_value=int(bound.lo) - 1)] if bound.lo is not None else []
            outs += [st.integers(min_value=int(bound.hi) + 1)] if bound.hi is not None else []
            return st.one_of(*outs, junk, st.sampled_from(["1.5", str(2**64)])).map(str)
        if inner is float and bound is not None:
            lo = [st.floats(max_value=bound.lo, exclude_max=not bound.lo_open, allow_nan=False, allow_infinity=False)
                  ] if bound.lo is not None else []
            hi = [st.floats(min_value=bound.hi, exclude_min=not bound.hi_open, allow_nan=False,
                            allow_infinity=False)] if bound.hi is not None else []
            return st.one_of(*lo, *hi, junk.filter(lambda t: t not in ("true",))).map(str)
    if origin in (typing.Union, __import__("types").UnionType):
        members = [a for a in args if a is not type(None)]
        return _wrong(members[0]).filter(lambda t: t.lower() not in ("", "null", "none", "~", "auto"))
    if tp is int:
        return st.sampled_from(["eight", "1.5", "nan", "[1,", str(2**64)])
    if tp is float:
        return st.sampled_from(["high", "nan", "inf", "-inf", "[1,", "1e999"])
    if tp is bool:
        return st.sampled_from(["maybe", "2", "[1,", "yes please"])
    if origin is Literal:
        return st.sampled_from(["nonsense", "[1,", "''"])
    if origin is list:
        return st.sampled_from(["[1,", "{a: 1}", "5"])
    return st.nothing()


OPTIONS = _typed_options()


def _run(argv: list[str]) -> tuple[Any, list[str]]:
    """(exit code, the non-empty lines written to stderr or logged) of ``ctrkit argv`` in this process."""
    err = io.StringIO()
    handler = logging.StreamHandler(err)
    root = logging.getLogger()
    old = root.handlers[:]
    root.handlers = [handler]
    try:
        with redirect_stderr(err):
            rc = main(argv)
    except SystemExit as e:
        rc = e.code
    finally:
        root.handlers = old
    return rc, [line for line in err.getvalue().splitlines() if line.strip()]


def test_every_numeric_option_declares_its_range():
    """No option is typed by a bare int / float any more: each declares what it allows."""
    bare = [(p, a.option_strings[0]) for p, _, parser in walk(build_parser()) for a in parser._actions
            if a.type in (int, float)]
    assert bare == []
    assert len(OPTIONS) >= 40


@pytest.mark.parametrize("path, option, tp", OPTIONS, ids=[f"{' '.join(p)} {o}" for p, o, _ in OPTIONS])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_wrong_option_value_exits_2_with_one_line(path, option, tp, data):
    value = data.draw(_wrong(tp), label="value")
    rc, lines = _run([*path, *REQUIRED[path], f"{option}={value}"])
    assert rc == 2 and len(lines) == 1, (rc, lines)
    assert f"argument {option}" in lines[0] and "expects" in lines[0], lines


def _config_leaves(cls: type = Config, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls, include_extras=True)[f.name]
        if dataclasses.is_dataclass(tp):
            out += _config_leaves(tp, f"{prefix}{f.name}.")
        elif tp is not str and typing.get_origin(tp) is not dict and not (
                typing.get_origin(tp) in (typing.Union, __import__("types").UnionType)
                and str in typing.get_args(tp)):
            out.append((f"{prefix}{f.name}", tp))
    return out


LEAVES = _config_leaves()


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    path = d / "c.yaml"
    path.write_text(f"data: {{train: {d / 'none'}}}\nmodel: {{name: lr}}\nrun: {{dir: {d / 'runs'}}}\n")
    return path


@pytest.mark.parametrize("key, tp", LEAVES, ids=[k for k, _ in LEAVES])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_wrong_config_value_exits_2_with_one_line_naming_the_key(config_file, key, tp, data):
    value = data.draw(_wrong(tp), label="value")
    rc, lines = _run(["train", "--config", str(config_file), f"--{key}={value}"])
    assert rc == 2 and len(lines) == 1, (rc, lines)
    assert repr(key) in lines[0], lines


def test_the_config_walk_covers_the_keys_the_issue_names():
    keys = dict(LEAVES)
    for key in ("train.early_stopping.min_delta", "data.batch_size", "train.lr", "train.seed", "data.prefetch"):
        assert key in keys


SPEC_CASES = [
    ({"sparse": [{"name": "a", "embedding_dim": "eight"}]}, "'embedding_dim' expects"),
    ({"sparse": [{"name": "a", "min_freq": "lots"}]}, "'min_freq' expects int >= 1, got 'lots'"),
    ({"sparse": [{"name": "a", "multi_valued": True, "max_len": "five"}]}, "'max_len' expects int >= 1"),
    ({"label": {"column": "y", "threshold": "high"}}, "'threshold' expects float, got 'high'"),
    ({"label": {"column": "y", "threshold": math.nan}}, "'threshold' expects float, got nan"),
    ({"sparse": [{"name": 123}]}, "'name' expects str, got 123 (quote a name made of digits"),
    ({"sparse": [{"name": "a", "multi_valued": "false"}]}, "'multi_valued' expects bool, got 'false'"),
    ({"sparse": [{"name": "a", "multi_valued": True, "delimiter": ""}]}, "'delimiter' expects str of one character"),
    ({"sparse": [{"name": "a", "multi_valued": True, "delimiter": "||"}]}, "'delimiter' expects str of one"),
    ({"sparse": [{"name": "a", "pooling": "max"}]}, "'pooling': 'max' is not one of ['sum', 'mean']"),
    ({"sparse": [{"name": "a", "group": "users"}]}, "did you mean 'user'"),
    ({"dense": [{"name": "x", "transform": "sqrt"}]}, "'transform': 'sqrt' is not one of"),
    ({"sequence": [{"name": "h", "shares": "a", "max_len": 0}]}, "'max_len' expects int >= 1, got 0"),
    ({"options": {"max_vocab": 2}}, "'max_vocab' expects int >= 3 | None, got 2"),
    ({"weight": 5}, "'weight' expects str | None, got 5"),
]


@pytest.mark.parametrize("change, message", SPEC_CASES, ids=[m[:40] for _, m in SPEC_CASES])
def test_a_wrong_schema_value_is_refused_naming_the_feature_and_key(change, message):
    spec = {"label": "y", "dense": ["x"], "sparse": [{"name": "a"}], **change}
    with pytest.raises(DataError) as e:
        load_spec(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_schema_value_error_on_the_command_line_is_one_line(tmp_path):
    (tmp_path / "in.csv").write_text("y,a\n1,u\n")
    (tmp_path / "s.yaml").write_text("label: y\nsparse: [{name: a, multi_valued: 'false'}]\n")
    rc, lines = _run(["preprocess", "table", str(tmp_path / "in.csv"), "--schema", str(tmp_path / "s.yaml"),
                      "--out", str(tmp_path / "o")])
    assert rc == 2 and len(lines) == 1 and "sparse feature 'a': key 'multi_valued' expects bool" in lines[0]
    assert not (tmp_path / "o").exists()


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["evaluate", "--checkpoint", "c.pt", "--batch-size", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "argument --batch-size: expects int >= 1, got '0'" in err


def test_parsing_keeps_good_values():
    ns = build_parser().parse_args(["preprocess", "behaviour", "x.csv", "--out", "o", "--delimiter", ";",
                                    "--embedding-dim", "8", "--max-bad-fraction", "0.5"])
    assert (ns.delimiter, ns.embedding_dim, ns.max_bad_fraction) == (";", 8, 0.5)
    assert build_parser().parse_args(["preprocess", "criteo", "x", "--out", "o"]).embedding_dim == 16
