"""ctrkit's error types: every one a CtrkitError (the CLI prints it as one line, exit 2) and the built-in a
caller expects; the batch and embedding modules raise no bare built-in."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from ctrkit import errors
from ctrkit.batch import KeyedJagged
from ctrkit.cli import main
from ctrkit.errors import BatchError, BatchTypeError, CtrkitError, UnknownKeyError

SRC = Path(__file__).resolve().parents[1] / "src" / "ctrkit"
BUILTIN = {"ValueError", "KeyError", "IndexError", "TypeError", "RuntimeError", "LookupError", "Exception"}


def test_every_error_is_a_ctrkit_error_and_a_builtin() -> None:
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if cls is CtrkitError or not issubclass(cls, BaseException):  # Problem: a record carried by RowErrors
            continue
        assert issubclass(cls, CtrkitError), name
        assert any(b in cls.__mro__ for b in (ValueError, KeyError, IndexError, TypeError, RuntimeError)), name


@pytest.mark.parametrize("module", ["batch.py", "nn/embedding.py", "nn/embedding_interface.py"])
def test_no_bare_builtin_is_raised(module: str) -> None:
    bare = []
    for node in ast.walk(ast.parse((SRC / module).read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BUILTIN:
                bare.append(f"{module}:{node.lineno} raise {exc.id}")
    assert bare == []


def test_batch_errors_keep_the_builtin_a_caller_catches() -> None:
    ids = torch.tensor([1, 2], dtype=torch.int64)
    with pytest.raises(BatchError, match="keys must be unique") as e:
        KeyedJagged(["a", "a"], ids, lengths=torch.ones(2, dtype=torch.int64))
    assert isinstance(e.value, ValueError)
    with pytest.raises(TypeError, match="must be int64 ids") as e:
        KeyedJagged(["a"], ids.float(), lengths=torch.ones(2, dtype=torch.int64))
    assert isinstance(e.value, BatchTypeError) and isinstance(e.value, ValueError)
    kj = KeyedJagged(["a"], ids, lengths=torch.ones(2, dtype=torch.int64))
    with pytest.raises(KeyError) as e:
        kj["b"]
    assert isinstance(e.value, UnknownKeyError)
    assert str(e.value) == "KeyedJagged has no key 'b'; keys: ['a']"  # one line, not KeyError's quoted repr


def test_an_unknown_key_reaches_the_cli_as_one_line(monkeypatch, caplog) -> None:
    def fail(args):
        raise UnknownKeyError("no table 'c'; tables: ['a', 'b']")

    monkeypatch.setattr("ctrkit.data.sources.synthetic.run_synth", fail)
    assert main(["synth", "--rows", "1", "--out", "x"]) == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == ["no table 'c'; tables: ['a', 'b']"]
