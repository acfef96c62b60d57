"""The preprocess driver's last step: write a split store from the shuffled spill through a fitted
pipeline, with the vocabularies and pipeline of the fitted source linked in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.persist import PIPELINE_DIR
from ctrkit.data.storage.spill import ShardSpill
from ctrkit.data.storage.store import StoreWriter
from ctrkit.io import link_tree


def write_split_store(path: Path, pipe: FeaturePipeline, spill: ShardSpill, *, shuffle_seed: int | None,
                      luts: dict[str, np.ndarray | None] | None, fitted_dir: Path, meta: dict[str, Any],
                      overwrite: bool = False) -> Path:
    """One store from the encoded rows of ``spill`` (shards read in order; each shuffled with
    ``[shuffle_seed, shard]`` unless None), finalized by ``pipe``; ``fitted_dir`` holds ``vocab/`` and
    ``pipeline/`` to link into it."""
    with StoreWriter(path, pipe.schema, pipe.column_specs(), overwrite=overwrite) as w:
        for shard in spill:
            part = spill.read(shard, seed=None if shuffle_seed is None else [shuffle_seed, shard])
            w.append(pipe.finalize(part, luts))
        link_tree(fitted_dir / "vocab", w.tmp / "vocab")
        link_tree(fitted_dir / PIPELINE_DIR, w.tmp / PIPELINE_DIR)
        w.set_meta(**meta)
    return path
