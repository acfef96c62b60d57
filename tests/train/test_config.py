"""YAML config -> dataclasses, type-checked overrides, unknown keys with suggestions."""

from __future__ import annotations

import pytest
import yaml

from ctrkit.models.registry import ConfigError
from ctrkit.train.config import (
    Config,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)

YAML = """
data: {train: /tmp/train, valid: /tmp/valid, batch_size: 512}
model:
  name: dlrm
  params: {interaction: dot, over_arch: [64, 1]}
train:
  lr: 3e-4
  epochs: 2
  sparse_optimizer: rowwise_adagrad
  early_stopping: {metric: logloss, patience: 2}
run: {dir: runs, name: exp1}
"""


def _write(tmp_path, text=YAML):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_load_yaml_types(tmp_path):
    cfg = load_config(_write(tmp_path))
    assert isinstance(cfg, Config)
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float)  # PyYAML reads "3e-4" as a string
    assert cfg.data.batch_size == 512 and cfg.data.shuffle is True
    assert cfg.model.params == {"interaction": "dot", "over_arch": [64, 1]}
    assert cfg.train.early_stopping.metric == "logloss" and cfg.train.early_stopping.patience == 2
    assert cfg.train.max_steps is None and cfg.train == TrainConfig(
        lr=3e-4, epochs=2, sparse_optimizer="rowwise_adagrad", early_stopping=cfg.train.early_stopping)


def test_overrides_are_typed(tmp_path):
    cfg = load_config(_write(tmp_path), [
        "--train.lr=1e-2", "train.max_steps=100", "--data.shuffle=false", "--train.grad_clip=null",
        "--train.metrics=[auc,gauc]", "--model.params.over_arch=[32,16,1]", "--model.params.new_opt=3",
        "--train.early_stopping.patience=5", "--run.name=abc", "--train.embedding_lr=0.5",
    ])
    assert cfg.train.lr == 1e-2 and cfg.train.max_steps == 100 and cfg.data.shuffle is False
    assert cfg.train.grad_clip is None and cfg.train.metrics == ["auc", "gauc"]
    assert cfg.model.params["over_arch"] == [32, 16, 1] and cfg.model.params["new_opt"] == 3
    assert cfg.train.early_stopping.patience == 5 and cfg.run.name == "abc" and cfg.train.embedding_lr == 0.5


@pytest.mark.parametrize("override, message", [
    ("--train.epochs=1.5", "'train.epochs' expects int"),
    ("--train.lr=fast", "'train.lr' expects float"),
    ("--data.shuffle=maybe", "'data.shuffle' expects bool"),
    ("--train.dense_optimizer=adamm", "did you mean 'adam'"),
    ("--train.lrr=1", "did you mean 'lr'"),
    ("--trian.lr=1", "did you mean 'train'"),
    ("--train.early_stopping.patiense=1", "did you mean 'patience'"),
    ("--train.lr", "key path '=' value"),
    ("--train.epochs=0", "train.epochs must be >= 1"),
])
def test_bad_overrides(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path), [override])


def test_unknown_key_in_file_names_path(tmp_path):
    with pytest.raises(ConfigError, match=r"'train.weight_decy'.*did you mean 'weight_decay'"):
        load_config(_write(tmp_path, YAML.replace("epochs: 2", "weight_decy: 2")))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="expects int"):
        config_from_dict({"data": {"batch_size": True}})


def test_round_trip(tmp_path):
    cfg = load_config(_write(tmp_path), ["--train.precision=bf16"])
    save_config(cfg, tmp_path / "resolved.yaml")
    again = load_config(tmp_path / "resolved.yaml")
    assert again == cfg
    assert config_from_dict(yaml.safe_load(yaml.safe_dump(config_to_dict(cfg)))) == cfg
    assert load_config(None) == Config()
