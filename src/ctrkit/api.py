"""The user's verbs in Python, what ``import ctrkit`` exposes besides the schema and error types:

    stores = ctrkit.preprocess_criteo("day_0.gz", "data/criteo")        # or preprocess_table / _behaviour
    summary = ctrkit.train("configs/criteo/deepfm.yaml", [f"data.{s}={p}" for s, p in stores.items()])
    metrics = ctrkit.evaluate(f"{summary['run_dir']}/best.pt")
    scores = ctrkit.Predictor.from_checkpoint(f"{summary['run_dir']}/best.pt").predict(rows)

Each verb is the function the CLI's command calls (``ctrkit train`` is :func:`train`), so the two give the
same run directory, metrics and files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctrkit.errors import ConfigError
from ctrkit.jobs.evaluate import evaluate_checkpoint
from ctrkit.jobs.train import train_from_config
from ctrkit.training.config import Config, load_config

__all__ = ["evaluate", "train"]


def train(config: Config | str | Path, overrides: Sequence[str] = (), *, resume: str | None = None,
          progress: bool | None = None, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train as ``ctrkit train --config CONFIG OVERRIDES...`` does -> the run's summary (summary.json's content:
    ``run_dir``, ``test`` metrics, ``best`` epoch, ...). ``config``: a YAML path, or a :class:`Config` from
    :func:`~ctrkit.training.config.load_config` (then give its overrides there); ``overrides``:
    ``"train.lr=3e-4"``-style entries, checked like the command line's."""
    if isinstance(config, Config):
        if overrides:
            raise ConfigError("overrides go with a config path; a loaded Config is used as it is "
                              "(load_config(path, overrides) applies them)")
        cfg = config
    else:
        cfg = load_config(config, list(overrides))
    return train_from_config(cfg, resume=resume, progress=progress, callbacks=callbacks)


def evaluate(checkpoint: str | Path, data: str | Path | None = None, *,
             batch_size: int | None = None) -> dict[str, float]:
    """Metrics of the model of ``checkpoint`` on the store ``data`` (default: the checkpoint config's test
    store), as ``ctrkit evaluate`` prints them; ``batch_size`` defaults to what the run evaluated with."""
    return evaluate_checkpoint(str(checkpoint), None if data is None else str(data), batch_size)[1]
