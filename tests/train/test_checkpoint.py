"""Checkpoint files: weights_only round trip, model rebuild, RNG state, clear errors on bad files."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.models.base import CTRModel, logits_of
from ctrkit.models.registry import register_model
from ctrkit.schema import DenseFeature, Schema, SparseFeature
from ctrkit.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_model,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from ctrkit.train.config import Config, config_to_dict
from ctrkit.train.optim import build_optimizers


@register_model("_test_ckpt_tiny")
class CkptTiny(CTRModel):
    def __init__(self, schema: Schema, *, dim: int = 4) -> None:
        super().__init__()
        self.keys = schema.sparse_keys
        vocab = sum(f.vocab_size for f in schema.sparse)
        self.emb = nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True)
        self.lin = nn.Linear(dim + schema.num_dense, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        values, _, offsets = batch.sparse[self.keys[0]]
        e = self.emb(values, offsets[:-1])  # (B, D)
        return self.lin(torch.cat([e, batch.dense], 1)).squeeze(1)

    def embedding_parameters(self):
        yield self.emb.weight


SCHEMA = Schema(dense=[DenseFeature("d0")], sparse=[SparseFeature("c0", vocab_size=20, embedding_dim=4)])


def _batch(B: int = 6) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (B, 1), generator=g)
    return Batch(dense=torch.randn(B, 1, generator=g), sparse=KeyedJagged.from_dense(["c0"], ids),
                 labels=torch.randint(0, 2, (B,), generator=g).float())


def _trained(tmp_path):
    torch.manual_seed(0)
    model = CkptTiny(SCHEMA, dim=4)
    cfg = Config()
    cfg.model.name, cfg.model.params = "_test_ckpt_tiny", {"dim": 4}
    opt = build_optimizers(model, cfg.train)
    b = _batch()
    opt.zero_grad()
    nn.functional.binary_cross_entropy_with_logits(logits_of(model(b)), b.labels).backward()
    opt.step()
    vocab = {"c0": np.array(["a", "bb", "ccc"]), "c0_ids": np.arange(3, dtype=np.int64)}
    trainer_state = {"epoch": 1, "step": 7, "epoch_complete": False, "best_metric": 0.7, "best_step": 5,
                     "bad_evals": 0, "loader": {"perm": np.arange(5), "pos": 3}, "rng": rng_state()}
    path = save_checkpoint(tmp_path / "ck" / "last.pt", model=model, model_params={"dim": 4}, schema=SCHEMA,
                           config=config_to_dict(cfg), optimizer=opt, trainer_state=trainer_state, vocab=vocab)
    return model, opt, path, cfg


def test_round_trip_weights_only(tmp_path):
    model, opt, path, cfg = _trained(tmp_path)
    raw = torch.load(path, weights_only=True)  # no pickled objects inside
    assert raw["format"] == "ctrkit-checkpoint" and raw["model"] == {"name": "_test_ckpt_tiny", "params": {"dim": 4}}
    ck = load_checkpoint(path)
    assert ck["schema"] == SCHEMA.to_dict()
    np.testing.assert_array_equal(ck["vocab"]["arrays"]["c0"], ["a", "bb", "ccc"])
    np.testing.assert_array_equal(ck["vocab"]["arrays"]["c0_ids"], np.arange(3))
    np.testing.assert_array_equal(ck["trainer"]["loader"]["perm"], np.arange(5))
    assert ck["trainer"]["step"] == 7 and ck["trainer"]["loader"]["pos"] == 3
    for k, v in model.state_dict().items():
        assert torch.equal(ck["model_state"][k], v)
    fresh = CkptTiny(SCHEMA, dim=4)
    opt2 = build_optimizers(fresh, cfg.train)
    opt2.load_state_dict(ck["optimizer"])
    assert torch.equal(opt2.sparse.state_dict()["state"][0]["sum"], opt.sparse.state_dict()["state"][0]["sum"])
    assert not list(path.parent.glob(".*tmp*"))  # atomic write leaves no temporary file


def test_load_model_rebuilds(tmp_path):
    model, _, path, cfg = _trained(tmp_path)
    rebuilt, schema, config = load_model(path)
    assert schema == SCHEMA and isinstance(config, Config) and config == cfg
    assert not rebuilt.training
    model.eval()
    b = _batch(9)
    assert torch.equal(logits_of(rebuilt(b)), logits_of(model(b)))


def test_vocab_path_reference(tmp_path):
    model = CkptTiny(SCHEMA)
    path = save_checkpoint(tmp_path / "a.pt", model=model, schema=SCHEMA, vocab=tmp_path / "vocab")
    assert load_checkpoint(path)["vocab"] == {"arrays": None, "path": str(tmp_path / "vocab")}


def test_rng_state_restores_all_generators():
    state = rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint file .* does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="could not be read"):
        load_checkpoint(tmp_path / "junk.pt")
    _, _, path, _ = _trained(tmp_path)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="could not be read"):
        load_checkpoint(tmp_path / "cut.pt")
    torch.save({"state": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a ctrkit checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_unstorable_object_fails_and_keeps_old_file(tmp_path):
    model = CkptTiny(SCHEMA)
    path = save_checkpoint(tmp_path / "a.pt", model=model, schema=SCHEMA)
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="extra.obj"):
        save_checkpoint(path, model=model, schema=SCHEMA, extra={"obj": object()})
    assert path.read_bytes() == before


# ---- trust: checksum, versions, no unpickling (issue 11) ----------------------------------------------------
def test_flipped_bytes_in_the_weights_are_refused_not_scored(tmp_path):
    model, _, path, _ = _trained(tmp_path)
    data = bytearray(path.read_bytes())
    w = model.lin.weight.detach().contiguous().numpy().tobytes()
    at = bytes(data).find(w)
    assert at > 0  # the weight's bytes as stored
    data[at + 5] ^= 0x10
    (tmp_path / "flipped.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        load_checkpoint(tmp_path / "flipped.pt")
    with pytest.raises(CheckpointError, match="fails its checksum"):
        load_model(tmp_path / "flipped.pt")


def test_any_flipped_byte_is_refused_or_leaves_the_content_unchanged(tmp_path):
    _, _, path, _ = _trained(tmp_path)
    data = path.read_bytes()
    want = load_checkpoint(path)["model_state"]
    rng = np.random.default_rng(1)  # its 400 flips include one that gives a tensor a stride of 5 (once a crash)
    refused = 0
    for i, pos in enumerate(rng.choice(len(data), 400, replace=False)):
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(8))
        f = tmp_path / f"f{i}.pt"
        f.write_bytes(bytes(bad))
        try:
            got = load_checkpoint(f)["model_state"]
        except CheckpointError:
            refused += 1
            continue
        # accepted only when the flip hit bytes that carry no content (zip padding, timestamps)
        assert all(torch.equal(got[k], v) for k, v in want.items()), f"byte {pos} changed weights unnoticed"
    assert refused > 200


def _rewrite(path, dst, **changes):
    raw = torch.load(path, weights_only=True)
    raw.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        del raw[k]
    torch.save(raw, dst)
    return dst


def test_other_format_versions_are_refused_with_the_versions_named(tmp_path):
    _, _, path, _ = _trained(tmp_path)
    with pytest.raises(CheckpointError, match=r"format version 3 .*reads versions \[1, 2\]: upgrade ctrkit"):
        load_checkpoint(_rewrite(path, tmp_path / "v3.pt", version=3))
    with pytest.raises(CheckpointError, match="format version 0 .*retrain"):
        load_checkpoint(_rewrite(path, tmp_path / "v0.pt", version=0))


def test_a_version_1_checkpoint_loads_with_an_unverified_warning(tmp_path, caplog):
    model, _, path, _ = _trained(tmp_path)
    old = _rewrite(path, tmp_path / "v1.pt", version=1, checksum=None)
    ck = load_checkpoint(old)
    assert "without a checksum" in caplog.text
    assert torch.equal(ck["model_state"]["lin.weight"], model.lin.weight)


class _Boom:
    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_pickled_object_is_not_executed_on_load(tmp_path):
    boom = _Boom()
    boom.marker = str(tmp_path / "executed")
    torch.save({"format": "ctrkit-checkpoint", "version": 2, "x": boom}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="could not be read"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not (tmp_path / "executed").exists()
