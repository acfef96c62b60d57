"""Stores and checkpoints of earlier layouts keep loading and keep agreeing with new ones.

Layouts: *new* (vocabularies once, in ``pipeline/``, with per-table fingerprints), *release* (the first release
with pipelines: ``vocab/`` and ``pipeline/``, no per-table fingerprints; checkpoints carry a ``"vocab"`` payload
of the vocab/ files and a ``"pipeline"`` payload), *vocab-only* (before pipelines: ``vocab/`` only; checkpoints
with the ``"vocab"`` payload only). The older layouts are made from a new store the way those releases wrote
them; with ``CTRKIT_REFERENCE_SRC`` (the ``src/`` of a checkout of that release) a store written by that code
itself is checked too.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.persist import PIPELINE_DIR, load_pipeline, save_pipeline, to_payload
from ctrkit.data.pipeline.vocab import save_vocabularies
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.storage.agree import Vocabularies, check_same_vocabulary
from ctrkit.data.storage.fitted import pipeline_from_store, store_vocab_fingerprint
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import StoreError

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"


def _vocab_files(store: Path) -> dict[str, np.ndarray]:
    """A store's vocab/ files as a checkpoint of the release carried them ({name: uint8 bytes})."""
    return {p.name: np.frombuffer(p.read_bytes(), np.uint8).copy() for p in sorted((store / "vocab").iterdir())}


def release_layout(new: Path, dst: Path) -> Path:
    """A copy of store ``new`` as the release wrote it: vocab/ next to pipeline/, no per-table fingerprints."""
    shutil.copytree(new, dst)
    save_vocabularies(dst / "vocab", load_pipeline(dst).vocabs_, fitted_on="rows of the release")
    meta_path = dst / PIPELINE_DIR / "pipeline.json"
    meta = json.loads(meta_path.read_text())
    del meta["table_fingerprints"]
    meta_path.write_text(json.dumps(meta, indent=1))
    return dst


def vocab_only_layout(new: Path, dst: Path) -> Path:
    """A copy of store ``new`` as written before pipelines: vocab/ only."""
    release_layout(new, dst)
    shutil.rmtree(dst / PIPELINE_DIR)
    return dst


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("layouts")
    with gzip.open(SAMPLE, "rt") as f:
        lines = f.read().splitlines(keepends=True)
    (d / "a.tsv").write_text("".join(lines[:3000]))
    (d / "b.tsv").write_text("".join(lines[3000:4500]))
    run = preprocess_criteo(d / "a.tsv", d / "run", split="0.8,0.1,0.1", embedding_dim=4, progress=False)
    other = preprocess_criteo(d / "b.tsv", d / "other", split="1,0", embedding_dim=4, progress=False)["train"]
    return {"new": run["train"], "new_valid": run["valid"], "other": other,
            "release": release_layout(run["train"], d / "release"),
            "release_valid": release_layout(run["valid"], d / "release_valid"),
            "vocab_only": vocab_only_layout(run["train"], d / "vocab_only"),
            "vocab_only_test": vocab_only_layout(run["test"], d / "vocab_only_test")}


def test_new_stores_hold_vocabularies_once(stores: dict[str, Path]) -> None:
    new = stores["new"]
    assert not (new / "vocab").exists()
    meta = json.loads((new / PIPELINE_DIR / "pipeline.json").read_text())
    assert sorted(meta["table_fingerprints"]) == sorted(load_pipeline(new).vocabs_)
    # every split store links the one copy written by the run
    a, b = new / PIPELINE_DIR / "pipeline.json", stores["new_valid"] / PIPELINE_DIR / "pipeline.json"
    assert os.path.samefile(a, b)


@pytest.mark.parametrize("layout", ["release", "vocab_only"])
def test_older_stores_load(stores: dict[str, Path], layout: str) -> None:
    new, old = Store(stores["new"]), Store(stores[layout])
    pipe = pipeline_from_store(old)
    assert pipe.vocab_fingerprint() == pipeline_from_store(new).vocab_fingerprint()
    assert store_vocab_fingerprint(old) == store_vocab_fingerprint(new)
    batch = next(iter(BatchLoader(old, 64, shuffle=False)))
    want = next(iter(BatchLoader(new, 64, shuffle=False)))
    assert batch.labels.tolist() == want.labels.tolist()


def test_stores_of_every_layout_agree(stores: dict[str, Path]) -> None:
    same = ["new", "new_valid", "release", "release_valid", "vocab_only", "vocab_only_test"]
    for a in same:
        for b in same:
            check_same_vocabulary(stores[a], stores[b], "data.valid")
        with pytest.raises(StoreError, match=r"other vocabularies .*'C1': size"):
            check_same_vocabulary(stores[a], stores["other"], "data.valid")
        with pytest.raises(StoreError, match="other vocabularies"):
            check_same_vocabulary(stores["other"], stores[a], "data.valid")


def _rewrite_pipeline(pipe: FeaturePipeline, store: Path) -> None:
    pipe._fingerprint = None
    shutil.rmtree(store / PIPELINE_DIR)
    save_pipeline(pipe, store / PIPELINE_DIR)


def test_same_sizes_other_keys_refused_across_layouts(stores: dict[str, Path], tmp_path: Path) -> None:
    """Per-table fingerprints catch a vocabulary with the same size and other keys in every layout."""
    changed = tmp_path / "changed"
    shutil.copytree(stores["new"], changed)
    pipe = load_pipeline(changed)
    v = pipe.vocabs_["C7"]
    v.keys = v.keys[::-1].copy()  # same size and ids, other keys
    _rewrite_pipeline(pipe, changed)
    for layout in ("new", "release", "vocab_only"):
        with pytest.raises(StoreError, match=r"\('C7': other keys or ids\)"):
            check_same_vocabulary(stores[layout], changed, "data.test")
    with pytest.raises(StoreError, match=r"\('C7': other keys or ids\)"):
        check_same_vocabulary(vocab_only_layout(changed, tmp_path / "changed_old"), stores["new"], "data.test")


def _release_checkpoint(store: Path) -> dict:
    """What a checkpoint of the release holds about vocabularies: both payloads."""
    s = Store(store)
    return {"schema": s.schema.to_dict(), "vocab": {"arrays": _vocab_files(store), "path": None},
            "pipeline": to_payload(pipeline_from_store(s))}


@pytest.mark.parametrize("kind", ["release", "vocab_payload_only", "path_only", "new"])
def test_checkpoints_agree_with_stores_of_every_layout(stores: dict[str, Path], kind: str) -> None:
    ck = _release_checkpoint(stores["release"])
    if kind == "release":  # from the release's payload: pipeline without per-table fingerprints
        ck["pipeline"]["meta"].pop("table_fingerprints")
    elif kind == "vocab_payload_only":  # checkpoints written before pipelines
        ck["pipeline"] = None
    elif kind == "path_only":  # a checkpoint that named the vocab/ directory instead of copying it
        ck["vocab"], ck["pipeline"] = {"arrays": None, "path": str(stores["release"] / "vocab")}, None
    else:  # what new checkpoints need: the pipeline payload only
        ck["vocab"], ck["pipeline"] = None, to_payload(load_pipeline(stores["new"]))
    ref = Vocabularies.of_checkpoint(ck["vocab"], ck["schema"], "checkpoint best.pt", "data/train",
                                     pipeline=ck["pipeline"])
    assert ref.entries is not None
    for layout in ("new", "new_valid", "release", "vocab_only_test"):
        check_same_vocabulary(ref, stores[layout], "--data")
    with pytest.raises(StoreError, match=r"than checkpoint best\.pt .*--vocab-from data/train"):
        check_same_vocabulary(ref, stores["other"], "--data")


@pytest.mark.skipif(not os.environ.get("CTRKIT_REFERENCE_SRC"), reason="CTRKIT_REFERENCE_SRC not set")
def test_stores_written_by_the_reference_release(stores: dict[str, Path], tmp_path: Path) -> None:
    """A store written by the release's own code (``CTRKIT_REFERENCE_SRC``: its src/) loads and agrees."""
    src = Path(os.environ["CTRKIT_REFERENCE_SRC"])
    out = tmp_path / "ref"
    code = "import sys; from ctrkit.cli import main; sys.exit(main(sys.argv[1:]))"
    subprocess.run([sys.executable, "-c", code, "preprocess", "criteo", str(stores["new"].parent.parent / "a.tsv"),
                    "--out", str(out), "--split", "0.8,0.1,0.1", "--embedding-dim", "4"], check=True,
                   env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True)
    assert (out / "train" / "vocab" / "vocab.json").is_file()
    for split in ("train", "valid", "test"):
        check_same_vocabulary(stores["new"], out / split, "data.valid")
        check_same_vocabulary(out / split, stores["new"], "data.valid")
        with pytest.raises(StoreError, match="other vocabularies"):
            check_same_vocabulary(out / split, stores["other"], "data.valid")
    assert store_vocab_fingerprint(out / "train") == store_vocab_fingerprint(stores["new"])
    for name in ("label.npy", "C1.npy", "I1.npy"):
        assert (out / "train" / name).read_bytes() == (stores["new"] / name).read_bytes()
