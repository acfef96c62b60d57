"""ctrkit export: every registered model's TorchScript and ONNX programs score as the eager model, on batches of
other sizes and bag / history lengths than the export example; a Criteo checkpoint (multi-hot) exported in both
formats scores its test store as the checkpoint does; GBDT+LR is refused; an export is written whole or not at all.

Models are built as the contract test builds them (its first variant, its schema), on tiny dims."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import contract_schema, make_batch, planted_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))  # contract_cases.py
from contract_cases import VARIANTS, schema_for
from export_cases import tiny_checkpoint

from ctrkit.batch import KeyedJagged
from ctrkit.checkpoint import Checkpoint
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import ConfigError, ExportError
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.scoring import predict_store
from ctrkit.jobs.train import train_from_config
from ctrkit.models.base import CTRModel, logits_of
from ctrkit.models.registry import create_model, get_model_class, list_models
from ctrkit.schema import Schema, SequenceFeature
from ctrkit.serving import export
from ctrkit.serving.export import EXAMPLE_ROWS, add_export_args, export_checkpoint, load_exported, run_export
from ctrkit.training.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXPORTABLE = [n for n in list_models() if get_model_class(n).exportable]
TEST_ROWS = (slice(0, 37), slice(37, 38))  # 37 rows and 1 row: neither is the export example's EXAMPLE_ROWS


def eager(model: CTRModel, batch) -> np.ndarray:
    with torch.no_grad():
        return torch.sigmoid(logits_of(model(batch))).numpy()


def assert_varied(batch, schema: Schema) -> None:
    """The batch has empty multi-valued bags and histories of several lengths, 0 among them."""
    lengths = batch.sparse.lengths_2d()
    for i, key in enumerate(batch.sparse.keys):
        f = schema.feature(key)
        if isinstance(f, SequenceFeature) or getattr(f, "multi_valued", False):
            assert (lengths[i] == 0).any() and len(lengths[i].unique()) > 2, key


def check_export_scores_as_the_model(name: str, fmt: str, tmp_path: Path) -> None:
    ckpt, model, schema, data = tiny_checkpoint(name, tmp_path / "model.pt")
    exported = load_exported(export_checkpoint(ckpt, tmp_path / "export", fmt))
    assert exported.meta["check"]["max_abs_diff"] <= 1e-5
    for rows in TEST_ROWS:
        batch = make_batch(data, rows, schema)
        assert len(batch) != EXAMPLE_ROWS
        got, want = exported.score(batch), eager(model, batch)
        assert got.dtype == np.float32 and got.shape == want.shape == (len(batch),)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"{name} {fmt}")
        if len(batch) > 1:
            assert_varied(batch, schema)
            assert want.std() > 1e-4  # scores that differ from row to row


@pytest.mark.parametrize("name", EXPORTABLE)
def test_torchscript_export_scores_as_the_model(name, tmp_path):
    check_export_scores_as_the_model(name, "torchscript", tmp_path)


@pytest.mark.slow  # ONNX conversion takes 2-9 s a model (about 80 s for all); the Criteo test below runs it fast
@pytest.mark.parametrize("name", EXPORTABLE)
def test_onnx_export_scores_as_the_model(name, tmp_path):
    check_export_scores_as_the_model(name, "onnx", tmp_path)


def test_a_model_reading_some_of_the_keys_exports(tmp_path):
    """DLRM on the behaviour schema pools only some keys: under export KeyedJagged.select moves the ids by a scatter
    and leaves the unread histories' ids after offsets[-1]."""
    schema = schema_for("din")
    data = planted_data(60, seed=2, schema=schema)
    params = VARIANTS["dlrm"][0]
    torch.manual_seed(0)
    model = create_model("dlrm", schema, **params).eval()
    assert model.sparse_keys != schema.sparse_keys
    ckpt = Checkpoint.of(model, model_params=params, schema=schema).save(tmp_path / "m.pt")
    exported = load_exported(export_checkpoint(ckpt, tmp_path / "e", "torchscript"))
    batch = make_batch(data, slice(0, 29), schema)
    np.testing.assert_allclose(exported.score(batch), eager(model, batch), rtol=0, atol=1e-5)
    with pytest.raises(ExportError, match="inputs must be dense"):
        exported(batch.dense, batch.sparse.values, batch.sparse.lengths[:-1])


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_model_without_dense_features_exports_and_scores(fmt, tmp_path):
    """DLRM on a schema with no dense features (batch.dense is (B, 0)): the export scores as eager."""
    base = schema_for("dlrm")
    schema = Schema(dense=[], sparse=base.sparse, sequence=base.sequence)
    data = dict(planted_data(60, seed=3, schema=base))
    data["dense"] = data["dense"][:, :0]
    params = VARIANTS["dlrm"][0]
    torch.manual_seed(0)
    model = create_model("dlrm", schema, **params).eval()
    ckpt = Checkpoint.of(model, model_params=params, schema=schema).save(tmp_path / "m.pt")
    exported = load_exported(export_checkpoint(ckpt, tmp_path / "e", fmt))
    batch = make_batch(data, slice(0, 23), schema)
    assert batch.dense.shape == (23, 0) and exported.num_dense == 0
    np.testing.assert_allclose(exported.score(batch), eager(model, batch), rtol=0, atol=1e-5)


class JaggedOps(torch.nn.Module):
    """select (a permutation that drops a key), to_padded and bag_sums of a KeyedJagged over keys a, b, c; B is
    read from ``dense`` (B, 1), as in ScoringModule."""

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kj = KeyedJagged(["a", "b", "c"], values, lengths=lengths, stride=dense.shape[0])
        sel = kj.select(["c", "a"])
        n = sel.offsets[-1]  # under export sel.values also holds b's ids, after offsets[-1]
        ids = torch.where(torch.arange(sel.values.shape[0]) < n, sel.values, -1)
        padded, mask = kj.to_padded("b", 3, pad=-1)
        return ids, sel.lengths, padded, mask, kj.bag_sums(values.unsqueeze(1).double())


def test_jagged_operations_under_export_equal_eager():
    g = torch.Generator().manual_seed(0)

    def jagged(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lengths = torch.randint(0, 5, (3 * rows,), generator=g)
        return torch.zeros(rows, 1), torch.randint(0, 100, (int(lengths.sum()),), generator=g), lengths

    B, nnz = torch.export.Dim("B", min=1), torch.export.Dim("nnz", min=0)
    program = torch.export.export(JaggedOps(), jagged(4), dynamic_shapes=({0: B}, {0: nnz}, {0: 3 * B}),
                                  strict=False)
    for rows in (1, 6, 11):
        args = jagged(rows)
        want, got = JaggedOps()(*args), program.module()(*args)
        n = int(want[1].sum())
        assert torch.equal(got[0][:n], want[0]) and (got[0][n:] == -1).all()  # the dropped key's ids follow
        for w, o in zip(want[1:], got[1:]):
            assert torch.equal(w, o)


def test_every_model_that_is_not_exportable_says_why():
    for name in sorted(set(list_models()) - set(EXPORTABLE)):
        assert get_model_class(name).export_blocker, name


def test_gbdt_lr_is_refused_with_the_reason(tmp_path):
    schema = contract_schema()
    model = create_model("gbdt_lr", schema, num_trees=2, num_leaves=4, num_threads=1)  # trees not needed to refuse
    ckpt = Checkpoint.of(model, schema=schema).save(tmp_path / "gbdt.pt")
    for fmt in export.FORMATS:
        with pytest.raises(ExportError, match=r"model 'gbdt_lr' cannot be exported.*LightGBM trees are not torch ops"):
            export_checkpoint(ckpt, tmp_path / "out", fmt)
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["gbdt.pt"]


def test_export_directory_and_its_description(tmp_path):
    ckpt, _, schema, _ = tiny_checkpoint("deepfm", tmp_path / "m.pt")
    out = export_checkpoint(ckpt, tmp_path / "exp", "torchscript")
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.pt", "pipeline"]
    meta = json.loads((out / "export.json").read_text())
    assert meta["format"] == "torchscript" and meta["model"] == "deepfm" and meta["file"] == "model.pt"
    assert meta["sparse_keys"] == schema.sparse_keys and meta["num_dense"] == schema.num_dense == 3
    assert [i["name"] for i in meta["inputs"]] == ["dense", "values", "lengths"] and all(
        i["meaning"] for i in meta["inputs"])
    assert meta["checkpoint"]["sha256"] == "sha256:" + hashlib.sha256(ckpt.read_bytes()).hexdigest()
    pipe = load_exported(out).pipeline()
    assert pipe.schema.sparse_keys == schema.sparse_keys


def test_existing_export_is_kept_unless_overwrite_and_a_failure_leaves_nothing(tmp_path, monkeypatch):
    ckpt, *_ = tiny_checkpoint("lr", tmp_path / "m.pt")
    out = tmp_path / "exp"
    out.mkdir()
    export_checkpoint(ckpt, out, "torchscript")  # an empty directory is fine
    before = (out / "model.pt").read_bytes()
    with pytest.raises(ExportError, match="exists and is not empty; pass --overwrite"):
        export_checkpoint(ckpt, out, "onnx")
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.pt", "pipeline"]

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "write_program", fail)
    with pytest.raises(ExportError, match="could not be exported to onnx: RuntimeError: disk full"):
        export_checkpoint(ckpt, out, "onnx", overwrite=True)
    assert (out / "model.pt").read_bytes() == before  # the old export is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp", "m.pt"]  # no temporary directory left
    monkeypatch.undo()
    export_checkpoint(ckpt, out, "onnx", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.onnx", "pipeline"]
    with pytest.raises(ConfigError, match="export format 'tflite' is not one of"):
        export_checkpoint(ckpt, tmp_path / "other", "tflite")


def test_command_line_arguments(tmp_path):
    ckpt, *_ = tiny_checkpoint("fm", tmp_path / "m.pt")
    parser = add_export_args(argparse.ArgumentParser())
    args = parser.parse_args(["--checkpoint", str(ckpt), "--format", "torchscript", "--out", str(tmp_path / "e")])
    assert run_export(args) == 0 and (tmp_path / "e" / "model.pt").is_file()
    with pytest.raises(SystemExit):
        parser.parse_args(["--checkpoint", str(ckpt), "--format", "tflite", "--out", "x"])


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """DLRM with a multi-hot stage trained 1 epoch on the bundled Criteo sample, and its stores."""
    d = tmp_path_factory.mktemp("export_criteo")
    stores = preprocess_criteo(SAMPLE, d / "st", min_freq=8, embedding_dim=8, progress=False)
    cfg = load_config(ROOT / "configs/criteo/dlrm.yaml", [
        f"data.train={stores['train']}", f"data.valid={stores['valid']}", f"data.test={stores['test']}",
        f"run.dir={d / 'runs'}", "run.name=mh", "train.epochs=1", "model.params.dense_arch=[16]",
        "model.params.over_arch=[16]", "data.multi_hot_size=3", "data.multi_hot_min_table_size=20"])
    train_from_config(cfg, progress=False)
    return {"ckpt": d / "runs" / "mh" / "best.pt", "stores": stores, "dir": d}


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_criteo_checkpoint_export_scores_its_test_rows_as_the_checkpoint(criteo, fmt):
    out = export_checkpoint(criteo["ckpt"], criteo["dir"] / f"export_{fmt}", fmt)
    exported = load_exported(out)
    assert exported.meta["multi_hot"]["size"] == 3 and exported.meta["num_dense"] == 13
    model = Checkpoint.load(criteo["ckpt"]).build_model()
    test = Store(criteo["stores"]["test"])
    want = predict_store(model, test, 300, Checkpoint.load(criteo["ckpt"]).feature_pipeline())
    # the export's own pipeline (saved beside the program) builds the batches: its multi-hot stage included
    loader = BatchLoader(test, 300, shuffle=False, prefetch=0, pipeline=exported.pipeline())
    got = np.concatenate([exported.score(b) for b in loader])
    assert test.num_rows % 300 and len(got) == test.num_rows > 300  # a last batch of another size
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert want.std() > 0
