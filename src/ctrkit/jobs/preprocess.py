"""``ctrkit preprocess {criteo,table,behaviour}``: the preprocessors of :mod:`ctrkit.data.sources`, with
``--vocab-from`` also naming a checkpoint (a ``.pt`` file or a sharded checkpoint's directory), whose pipeline
this layer reads (the sources sit below checkpoints) and hands down as a
:class:`~ctrkit.data.storage.fitted.FittedSource`."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrkit.checkpoint import SHARDED_META, Checkpoint
from ctrkit.data.storage.fitted import FittedSource

log = logging.getLogger(__name__)


def vocab_source(path: str | Path) -> str | Path | FittedSource:
    """``--vocab-from`` as the preprocessors take it: a store or pipeline directory as given, a checkpoint read
    into the pipeline it was trained with (its vocabularies, their lineage and dense statistics; not the counts of
    values below min_freq, which only stores keep)."""
    p = Path(path)
    if p.is_file() or (p / SHARDED_META).is_file():
        log.info("--vocab-from %s: the feature pipeline of the checkpoint", p)
        return FittedSource(str(p), Checkpoint.load(p).feature_pipeline())
    return path


@dataclass(frozen=True)
class WithVocabSource:
    """``run`` (a source's ``run_preprocess_*``) with ``args.vocab_from`` read by :func:`vocab_source` first.
    A value, not a closure: two parsers built alike hold equal handlers (their parsed options compare equal)."""

    run: Callable[[argparse.Namespace], Any]

    def __call__(self, args: argparse.Namespace) -> Any:
        if getattr(args, "vocab_from", None):
            args.vocab_from = vocab_source(args.vocab_from)
        return self.run(args)
