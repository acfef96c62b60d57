"""Every error type ctrkit raises on purpose, in one place. The CLI prints these as one line (no
traceback) and exits 2.

Each error message names what is wrong (file, row, feature, option) and how to fix it. Each type also
derives from the built-in exception a caller would expect (ValueError for bad input, ...), so
``except ValueError`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass


class CtrkitError(Exception):
    """Base class of every error ctrkit raises on purpose."""


class BatchError(CtrkitError, ValueError):
    """A malformed batch (``KeyedJagged`` / ``Batch``): keys, lengths, offsets or weights that do not agree; the
    message names the part."""


class BatchTypeError(BatchError, TypeError):
    """Batch values of the wrong dtype (ids that are not int64); ``except TypeError`` keeps working."""


class CheckpointError(CtrkitError, RuntimeError):
    """A checkpoint that cannot be written or read; the message names the file and the fix."""


class ConfigError(CtrkitError, ValueError):
    """A bad option (config key, model parameter, CLI flag): the message names the option and suggests the valid one."""


class DataError(CtrkitError, ValueError):
    """Raw input that cannot be preprocessed; the message names the file, the line and the fix."""


class ExportError(CtrkitError, ValueError):
    """A model or checkpoint that cannot be exported to TorchScript / ONNX (a model whose forward leaves torch,
    an existing output directory); the message names the model or path and why."""


class IdOutOfRangeError(CtrkitError, IndexError):
    """An id outside its table: the data was preprocessed with another vocabulary than the model's."""


class UnknownKeyError(CtrkitError, KeyError):
    """A feature, table or column name that is not there; the message lists the names there are."""

    def __str__(self) -> str:  # the message as written (KeyError's own str() would quote it)
        return Exception.__str__(self)


class JobError(CtrkitError, ValueError):
    """A job that cannot run as configured; the message names the option or file."""


class LayerConfigError(CtrkitError, ValueError):
    """A bad option or input shape given to an ``nn`` layer; the message names the layer and option."""


class MetricError(CtrkitError, ValueError):
    """A metric that cannot be computed on the given inputs; the message says why."""


class NotFittedError(CtrkitError, RuntimeError):
    """A model whose pre-fitted part (GBDT+LR's trees) is used before it was fitted."""


class RetrievalError(CtrkitError, ValueError):
    """A vector index that cannot be built, searched, saved or loaded as asked (bad k, vectors of another
    dimension, an index from another checkpoint, an existing path); the message names the option and the
    fix. Also raised by the item catalogue (``ctrkit.retrieval.catalogue``)."""


class SchemaError(CtrkitError, ValueError):
    """A schema that cannot be used; the message names the feature and the fix."""


class StoreError(CtrkitError, RuntimeError):
    """A store that cannot be opened or written, or that does not match another store or a checkpoint; the message names the file and the fix."""


class TrainingError(CtrkitError, RuntimeError):
    """Training cannot go on (non-finite loss, empty data, bad resume); the message says where."""


@dataclass(frozen=True)
class Problem:
    """One bad value of one row: ``row`` as the caller counts rows (a 1-based line of a file, a 0-based index
    of a request), ``field`` the raw column (None: the row as a whole), ``reason`` what is wrong."""

    row: int
    field: str | None
    reason: str


class RowErrors(DataError):
    """Rows that break the pipeline's column rules. ``problems`` lists them as structured (row, field, reason)
    entries (the first few when there are many), so a caller (the server's 4xx answer) reports them without
    reading the message; the message says the same in one line."""

    def __init__(self, message: str, problems: list[Problem], *, bad_rows: int | None = None,
                 total: int | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems)
        self.bad_rows = len({p.row for p in problems}) if bad_rows is None else bad_rows  # rows, all counted
        self.total = len(self.problems) if total is None else total  # problems, all counted
