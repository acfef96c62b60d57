"""Checkpoint files: weights_only round trip, model rebuild, clear errors on bad files, and files written by the
first release (base acff56d) still loading through the typed Checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.checkpoint import Checkpoint, TrainerState, TrainProgress, content_digest, to_plain
from ctrkit.errors import CheckpointError
from ctrkit.jobs.common import checkpoint_config
from ctrkit.models.base import CTRModel, logits_of
from ctrkit.models.registry import register_model
from ctrkit.schema import DenseFeature, Schema, SparseFeature
from ctrkit.training.config import Config, config_to_dict
from ctrkit.training.optim import build_optimizers
from ctrkit.training.writer import CheckpointWriter, rng_state


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
    state = TrainerState(TrainProgress(epoch=1, step=7, best_metric=0.7, best_step=5),
                         loader={"perm": np.arange(5), "pos": 3}, rng=rng_state())
    writer = CheckpointWriter(None, model_params={"dim": 4}, schema=SCHEMA, config=config_to_dict(cfg), vocab=vocab)
    path = writer.write_to(tmp_path / "ck" / "last.pt", model, opt, state)
    return model, opt, path, cfg


def test_round_trip_weights_only(tmp_path):
    model, opt, path, cfg = _trained(tmp_path)
    raw = torch.load(path, weights_only=True)  # no pickled objects inside
    assert raw["format"] == "ctrkit-checkpoint" and raw["model"] == {"name": "_test_ckpt_tiny", "params": {"dim": 4}}
    ck = Checkpoint.load(path)
    assert ck.schema == SCHEMA and ck.model_name == "_test_ckpt_tiny" and ck.model_params == {"dim": 4}
    np.testing.assert_array_equal(ck.vocab_files["c0"], ["a", "bb", "ccc"])
    np.testing.assert_array_equal(ck.vocab_files["c0_ids"], np.arange(3))
    np.testing.assert_array_equal(ck.trainer.loader["perm"], np.arange(5))
    assert ck.trainer.progress.step == 7 and ck.trainer.loader["pos"] == 3
    for k, v in model.state_dict().items():
        assert torch.equal(ck.weights[k], v)
    fresh = CkptTiny(SCHEMA, dim=4)
    opt2 = build_optimizers(fresh, cfg.train)
    opt2.load_state_dict(ck.optimizer)
    assert torch.equal(opt2.sparse.state_dict()["state"][0]["sum"], opt.sparse.state_dict()["state"][0]["sum"])
    assert not list(path.parent.glob(".*tmp*"))  # atomic write leaves no temporary file


def test_build_model_rebuilds(tmp_path):
    model, _, path, cfg = _trained(tmp_path)
    ck = Checkpoint.load(path)
    rebuilt, config = ck.build_model(), checkpoint_config(ck)
    assert isinstance(config, Config) and config == cfg
    assert not rebuilt.training
    model.eval()
    b = _batch(9)
    assert torch.equal(logits_of(rebuilt(b)), logits_of(model(b)))


def test_vocab_path_reference(tmp_path):
    model = CkptTiny(SCHEMA)
    writer = CheckpointWriter(None, schema=SCHEMA, vocab=tmp_path / "vocab")
    path = writer.write_to(tmp_path / "a.pt", model, None, None)
    ck = Checkpoint.load(path)
    assert ck.vocab_files is None and ck.vocab_path == str(tmp_path / "vocab")
    assert torch.load(path, weights_only=True)["vocab"] == {"arrays": None, "path": str(tmp_path / "vocab")}


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint file .* does not exist"):
        Checkpoint.load(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="could not be read"):
        Checkpoint.load(tmp_path / "junk.pt")
    _, _, path, _ = _trained(tmp_path)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="could not be read"):
        Checkpoint.load(tmp_path / "cut.pt")
    torch.save({"state": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a ctrkit checkpoint"):
        Checkpoint.load(tmp_path / "other.pt")


def test_unstorable_object_fails_and_keeps_old_file(tmp_path):
    model = CkptTiny(SCHEMA)
    path = Checkpoint.of(model, schema=SCHEMA).save(tmp_path / "a.pt")
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="extra.obj"):
        Checkpoint.of(model, schema=SCHEMA, extra={"obj": object()}).save(path)
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
        Checkpoint.load(tmp_path / "flipped.pt")
    with pytest.raises(CheckpointError, match="fails its checksum"):
        Checkpoint.load(tmp_path / "flipped.pt").build_model()


def test_any_flipped_byte_is_refused_or_leaves_the_content_unchanged(tmp_path):
    _, _, path, _ = _trained(tmp_path)
    data = path.read_bytes()
    want = Checkpoint.load(path).weights
    rng = np.random.default_rng(1)  # its 400 flips include one that gives a tensor a stride of 5 (once a crash)
    refused = 0
    for i, pos in enumerate(rng.choice(len(data), 400, replace=False)):
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(8))
        f = tmp_path / f"f{i}.pt"
        f.write_bytes(bytes(bad))
        try:
            got = Checkpoint.load(f).weights
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
        Checkpoint.load(_rewrite(path, tmp_path / "v3.pt", version=3))
    with pytest.raises(CheckpointError, match="format version 0 .*retrain"):
        Checkpoint.load(_rewrite(path, tmp_path / "v0.pt", version=0))


def test_a_version_1_checkpoint_loads_with_an_unverified_warning(tmp_path, caplog):
    model, _, path, _ = _trained(tmp_path)
    old = _rewrite(path, tmp_path / "v1.pt", version=1, checksum=None)
    ck = Checkpoint.load(old)
    assert "without a checksum" in caplog.text
    assert torch.equal(ck.weights["lin.weight"], model.lin.weight)


class _Boom:
    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_pickled_object_is_not_executed_on_load(tmp_path):
    boom = _Boom()
    boom.marker = str(tmp_path / "executed")
    torch.save({"format": "ctrkit-checkpoint", "version": 2, "x": boom}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="could not be read"):
        Checkpoint.load(tmp_path / "evil.pt")
    assert not (tmp_path / "executed").exists()


# ---- files written by the first release ------------------------------------------------------------------
def _save_as_release_0_1(path, model, *, schema, config, optimizer, trainer, vocab, extra):
    """A checkpoint file laid out exactly as the base commit's ``ctrkit.training.checkpoint.save_checkpoint`` wrote it
    (the trainer entry with that release's keys, in its order), checksum included."""
    raw = to_plain({
        "format": "ctrkit-checkpoint", "version": 2, "ctrkit_version": "0.1.0", "config": config,
        "schema": schema.to_dict(), "model": {"name": "_test_ckpt_tiny", "params": {"dim": 4}},
        "model_state": model.state_dict(), "optimizer": optimizer.state_dict(), "trainer": trainer,
        "vocab": {"arrays": vocab, "path": None}, "pipeline": None, "extra": extra,
    })
    raw["checksum"] = content_digest(raw)
    torch.save(raw, path)
    return path


def test_a_checkpoint_of_the_first_release_loads_through_the_typed_checkpoint(tmp_path):
    model, opt, _, cfg = _trained(tmp_path)
    trainer = {"epoch": 2, "step": 30, "epoch_complete": True, "loader": {"epoch": 2, "pos": 0}, "best_metric": 0.71,
               "best_step": 20, "bad_evals": 1, "stopped_early": False, "last_eval": {"step": 30, "auc": 0.7},
               "best_eval": {"step": 20, "epoch": 1, "auc": 0.71}, "train_seconds": 1.5, "samples": 960,
               "rng": rng_state(), "weight_average": None}
    extra = {"preprocessing": {"kind": "table"}, "catalogue": {"ids": np.arange(4), "counts": np.ones(4, np.int64)}}
    vocab = {"vocab.json": np.frombuffer(b"{}", np.uint8).copy()}
    path = _save_as_release_0_1(tmp_path / "old.pt", model, schema=SCHEMA, config=config_to_dict(cfg), optimizer=opt,
                                trainer=trainer, vocab=vocab, extra=extra)
    ck = Checkpoint.load(path)
    assert (ck.version, ck.ctrkit_version, ck.model_name, ck.model_params) == (2, "0.1.0", "_test_ckpt_tiny", {"dim": 4})
    assert ck.schema == SCHEMA and checkpoint_config(ck) == cfg and ck.preprocessing == {"kind": "table"}
    np.testing.assert_array_equal(ck.catalogue["ids"], np.arange(4))
    assert bytes(ck.vocab_files["vocab.json"]) == b"{}" and ck.vocab_path is None
    p = ck.trainer.progress
    assert (p.epoch, p.step, p.epoch_complete, p.best_metric, p.best_step, p.bad_evals, p.samples) == (
        2, 30, True, 0.71, 20, 1, 960)
    assert p.best_eval == {"step": 20, "epoch": 1, "auc": 0.71} and ck.trainer.loader == {"epoch": 2, "pos": 0}
    assert torch.equal(ck.trainer.rng["torch"], trainer["rng"]["torch"])
    b = _batch(5)
    model.eval()
    assert torch.equal(logits_of(ck.build_model()(b)), logits_of(model(b)))
    # written again, the file has the same layout: the same entries, and the same content outside "trainer"
    again = torch.load(ck.save(tmp_path / "again.pt"), weights_only=True)
    old = torch.load(path, weights_only=True)
    assert list(again) == list(old) and set(again["trainer"]) == set(old["trainer"])
    for key in ("config", "schema", "model", "model_state", "optimizer", "vocab", "pipeline", "extra"):
        assert content_digest(again[key]) == content_digest(old[key]), key


def test_a_checkpoint_of_the_first_release_without_newer_trainer_keys_gets_their_defaults(tmp_path):
    model, opt, _, _ = _trained(tmp_path)
    trainer = {"epoch": 0, "step": 3, "epoch_complete": False, "loader": {"epoch": 0, "pos": 3}, "best_metric": None,
               "best_step": None, "bad_evals": 0, "rng": rng_state()}
    path = _save_as_release_0_1(tmp_path / "old.pt", model, schema=SCHEMA, config=None, optimizer=opt,
                                trainer=trainer, vocab=None, extra={})
    ck = Checkpoint.load(path)
    assert ck.trainer.progress == TrainProgress(step=3) and ck.trainer.weight_average is None
    assert checkpoint_config(ck) is None and ck.catalogue is None and ck.preprocessing == {}
