"""Scoring a ranking model: the one copy of "no grad, eval mode, logits -> click probabilities".

Every reader of scores goes through here: the evaluate / predict / train jobs (:mod:`ctrkit.jobs.scoring`), the
:class:`~ctrkit.serving.predictor.Predictor` (and so the server), the exporter (:class:`~ctrkit.serving.export.
ScoringModule`, its eager-vs-exported check, :class:`~ctrkit.serving.export.ExportedModel`) and the tasks'
evaluation (:mod:`ctrkit.training.tasks`). The numbers::

    p = sigmoid(logits)    logits (B,) float32 (cast up first when a model computed them in lower precision)

:func:`scoring` is the mode: gradients off, the model in eval mode, its training mode put back afterwards.
:func:`probabilities` is the formula on one output; :func:`iter_scores` / :func:`score_batches` run both over
an iterable of :class:`~ctrkit.batch.Batch` (a loader, a list) and give numpy arrays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.models.base import ModelOutput, logits_of

__all__ = ["iter_scores", "probabilities", "score_batches", "scoring"]


def probabilities(output: torch.Tensor | ModelOutput) -> torch.Tensor:
    """``sigmoid(logits)`` (B,) of a model's output, computed in float32."""
    logits = logits_of(output)  # (B,)
    # no cast op for float32 logits: the exported graph (and so its numbers) stays as the model made it
    return torch.sigmoid(logits if logits.dtype == torch.float32 else logits.float())


@contextlib.contextmanager
def scoring(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode with gradients off inside; its training mode is put back on the way out."""
    was_training = model.training
    if was_training or any(m.training for m in model.modules()):  # eval() walks every module: ~0.15 ms a call
        model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        if was_training:
            model.train()


def iter_scores(model: nn.Module, batches: Iterable[Batch]) -> Iterator[tuple[Batch, np.ndarray]]:
    """(batch, its click probabilities (B,) float32 numpy) for every batch of ``batches``, in order (the
    batches on the model's device)."""
    for batch in batches:
        with scoring(model):  # per batch: the caller's code between batches runs in its own grad mode
            p = probabilities(model(batch)).cpu().numpy()
        yield batch, p


def score_batches(model: nn.Module, batches: Iterable[Batch]) -> np.ndarray:
    """Click probabilities (n,) float32 of every row of ``batches``, in order."""
    parts = [p for _, p in iter_scores(model, batches)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)
