"""YAML config -> dataclasses, type-checked overrides, unknown keys with suggestions."""

from __future__ import annotations

import typing

import pytest
import yaml

from ctrkit.models.registry import ConfigError
from ctrkit.training.config import (
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
    ("--train.epochs=0", "'train.epochs' expects int >= 1, got '0'"),
    ("--train.early_stopping.min_delta=nan", r"'train.early_stopping.min_delta' expects float >= 0, got 'nan' \(NaN"),
    ("--train.lr=inf", "'train.lr' expects float > 0, got 'inf'"),
    ("--train.seed=-1", r"'train.seed' expects int in \[0, 4294967295\], got '-1'"),
    ("--data.prefetch=-1", "'data.prefetch' expects int >= 0, got '-1'"),
    ("--train.ftrl_alpha=-1", "'train.ftrl_alpha' expects float > 0"),
    ("--train.metrics=[auc,", r"'train.metrics': '\[auc,' is not valid YAML"),
    ("--model.params.dnn_hidden=[64,", r"'model.params.dnn_hidden': '\[64,' is not valid YAML"),
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


# ---- defaults: base files ---------------------------------------------------------------------------
def _files(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_defaults_merge_in_order_and_the_file_wins(tmp_path):
    _files(tmp_path, {
        "_base/a.yaml": "data: {train: /a/train, batch_size: 64}\ntrain: {lr: 0.1, epochs: 3, "
                        "early_stopping: {metric: auc, patience: 2}}\nrun: {dir: from_a}\n",
        "_base/b.yaml": "data: {batch_size: 128, valid: /b/valid}\ntrain: {early_stopping: {patience: 5}}\n",
        "exp/m.yaml": "defaults: [../_base/a.yaml, ../_base/b.yaml]\n"
                      "model: {name: dlrm, params: {over_arch: [8]}}\ntrain: {lr: 0.5}\n",
    })
    cfg = load_config(tmp_path / "exp" / "m.yaml")
    # a, then b over a (deep: early_stopping.metric survives), then the file's own keys
    assert cfg.data.train == "/a/train" and cfg.data.valid == "/b/valid" and cfg.data.batch_size == 128
    assert cfg.train.lr == 0.5 and cfg.train.epochs == 3
    assert cfg.train.early_stopping.metric == "auc" and cfg.train.early_stopping.patience == 5
    assert cfg.run.dir == "from_a" and cfg.model.params == {"over_arch": [8]}
    # the same dict written out flat resolves to the same config
    flat = {"data": {"train": "/a/train", "valid": "/b/valid", "batch_size": 128},
            "model": {"name": "dlrm", "params": {"over_arch": [8]}},
            "train": {"lr": 0.5, "epochs": 3, "early_stopping": {"metric": "auc", "patience": 5}},
            "run": {"dir": "from_a"}}
    assert cfg == config_from_dict(flat)


def test_defaults_chain_and_overrides_apply_last(tmp_path):
    _files(tmp_path, {
        "root.yaml": "train: {lr: 0.1, seed: 7}\n",
        "mid/base.yaml": "defaults: [../root.yaml]\ntrain: {lr: 0.2}\n",
        "mid/leaf/m.yaml": "defaults: [../base.yaml]\nmodel: {name: dlrm, params: {dense_arch: [4], over_arch: [4]}}\n"
                           "train: {epochs: 2}\n",
    })
    cfg = load_config(tmp_path / "mid/leaf/m.yaml", ["--train.lr=0.3", "--model.params.over_arch=[2]"])
    assert (cfg.train.lr, cfg.train.seed, cfg.train.epochs) == (0.3, 7, 2)
    assert cfg.model.params == {"dense_arch": [4], "over_arch": [2]}
    # a list in the file replaces the base's list (no element-wise merge)
    _files(tmp_path, {"l/base.yaml": "train: {metrics: [auc, logloss, accuracy]}\n",
                      "l/m.yaml": "defaults: [base.yaml]\ntrain: {metrics: [auc]}\n"})
    assert load_config(tmp_path / "l/m.yaml").train.metrics == ["auc"]


def test_missing_base_names_the_file_and_the_config(tmp_path):
    _files(tmp_path, {"exp/m.yaml": "defaults: [../_base/nope.yaml]\n"})
    with pytest.raises(ConfigError, match=r"m\.yaml: base config '\.\./_base/nope\.yaml' \(.*nope\.yaml\) "
                                          r"does not exist; defaults paths are relative to the config file"):
        load_config(tmp_path / "exp" / "m.yaml")


@pytest.mark.parametrize("files, start", [
    ({"a.yaml": "defaults: [b.yaml]\n", "b.yaml": "defaults: [a.yaml]\n"}, "a.yaml"),
    ({"self.yaml": "defaults: [self.yaml]\ntrain: {lr: 0.1}\n"}, "self.yaml"),
    ({"x/a.yaml": "defaults: [../y/b.yaml]\n", "y/b.yaml": "defaults: [c.yaml]\n", "y/c.yaml": "defaults: [../x/a.yaml]\n"},
     "x/a.yaml"),
])
def test_defaults_cycle_is_an_error(tmp_path, files, start):
    _files(tmp_path, files)
    with pytest.raises(ConfigError, match="makes a cycle: .* -> .*") as info:
        load_config(tmp_path / start)
    assert str((tmp_path / start).resolve()) in str(info.value)


def test_defaults_diamond_is_not_a_cycle(tmp_path):
    _files(tmp_path, {"root.yaml": "train: {seed: 3}\n", "a.yaml": "defaults: [root.yaml]\ntrain: {lr: 0.1}\n",
                      "b.yaml": "defaults: [root.yaml]\ntrain: {epochs: 4}\n",
                      "m.yaml": "defaults: [a.yaml, b.yaml]\n"})
    t = load_config(tmp_path / "m.yaml").train
    assert (t.seed, t.lr, t.epochs) == (3, 0.1, 4)


@pytest.mark.parametrize("value", ["../_base/a.yaml", "{a: 1}", "[1]", "[]"])
def test_defaults_must_be_a_list_of_files(tmp_path, value):
    _files(tmp_path, {"m.yaml": f"defaults: {value}\n"})
    if value == "[]":  # an empty list is no base at all
        assert load_config(tmp_path / "m.yaml") == Config()
        return
    with pytest.raises(ConfigError, match="'defaults' must be a list of base config files"):
        load_config(tmp_path / "m.yaml")


def test_a_bad_key_in_a_base_is_reported(tmp_path):
    _files(tmp_path, {"base.yaml": "train: {lrr: 0.1}\n", "m.yaml": "defaults: [base.yaml]\n"})
    with pytest.raises(ConfigError, match=r"m\.yaml: unknown config key 'train\.lrr'.*did you mean 'lr'"):
        load_config(tmp_path / "m.yaml")


def test_one_key_walker_for_overrides_and_search_spaces() -> None:
    """walk_key stops at the first value that is not a config block; set_key creates missing / null blocks and
    refuses to go through a value, for overrides and ctrkit tune's with_values alike."""
    from ctrkit.jobs.tune_space import with_values
    from ctrkit.training.config import set_key, walk_key
    from ctrkit.typecheck import PositiveFloat

    def unknown(here: str, parent: str, part: str, names: list[str]) -> ConfigError:
        return ConfigError(f"{here} in {parent}")

    assert walk_key(["train", "lr"], unknown) == (2, PositiveFloat)  # the field's annotation, range included
    n, leaf = walk_key(["model", "params", "dnn_hidden"], unknown)
    assert n == 2 and typing.get_origin(leaf) is dict  # below model.params the model checks its own names
    with pytest.raises(ConfigError, match="train.lrr in train"):
        walk_key(["train", "lrr"], unknown)
    data: dict = {"train": None}
    set_key(data, ["train", "early_stopping", "patience"], 3, "x")
    assert data == {"train": {"early_stopping": {"patience": 3}}}
    with pytest.raises(ConfigError, match=r"params 'train.lr.x': 'train.lr' is not a mapping"):
        with_values({"train": {"lr": 0.1}}, {"train.lr.x": 1})


@pytest.mark.parametrize("name", ["../../x", "a/b", "/tmp/x", "..", ".", "", " x", "a\\b", "x\0y"])
def test_run_name_is_a_plain_name(tmp_path, name):
    """run.name names one folder inside run.dir: ``--run.name=../../x`` wrote a run outside it (issue 27, 5)."""
    with pytest.raises(ConfigError, match=r"run.name=.* is not a plain name.*put the parent folders in run.dir"):
        config_from_dict({"run": {"name": name}})


def test_plain_run_names_are_kept(tmp_path):
    for name in ("exp1", "dlrm-dot", "trial_3.b", "été 2024"):
        assert load_config(_write(tmp_path), [f"--run.name={name}"]).run.name == name
