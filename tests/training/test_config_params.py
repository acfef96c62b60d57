"""Model parameters are type-checked like config values: ``create_model`` checks each value against the
annotation of the model's keyword-only ``__init__`` parameter before the model is built."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import contract_schema

from ctrkit.errors import ConfigError
from ctrkit.models.registry import (
    _MODELS,
    check_model_params,
    create_model,
    get_model_class,
    model_params,
    register_model,
)
from ctrkit.training.config import load_config


@pytest.mark.parametrize("name, params, message", [
    ("dlrm", {"dense_arch": "abc"}, "dlrm: parameter 'dense_arch' expects tuple[int, ...], got 'abc' (give a list, e.g. [64, 32])"),
    ("dlrm", {"over_arch": 64}, "dlrm: parameter 'over_arch' expects tuple[int, ...], got 64 (give a list, e.g. [64, 32])"),
    ("dlrm", {"dense_arch": [64, "abc"]},
     "dlrm: parameter 'dense_arch' expects tuple[int, ...], got [64, 'abc'] (item 1: 'abc' is not int)"),
    ("afm", {"att_dim": 1.5}, "afm: parameter 'att_dim' expects int, got 1.5"),
    ("afm", {"att_dim": True}, "afm: parameter 'att_dim' expects int, got True"),
    ("deepfm", {"dnn_dropout": "high"}, "deepfm: parameter 'dnn_dropout' expects float, got 'high'"),
    ("fm", {"dense_interaction": "yes"}, "fm: parameter 'dense_interaction' expects bool, got 'yes'"),
    ("autoint", {"head_dim": "x"}, "autoint: parameter 'head_dim' expects int | None, got 'x'"),
    ("ncf", {"user_feature": 3}, "ncf: parameter 'user_feature' expects str | None, got 3"),
    ("wide_deep", {"crosses": [["user"]]},
     ("wide_deep: parameter 'crosses' expects tuple[tuple[str, str], ...], got [['user']] "
      "(item 0: ['user'] is not tuple[str, str])")),
    ("dlrm", {"interaction": "dott"}, "dlrm: unknown interaction='dott' (did you mean 'dot'?); valid: dot, dcn, projection"),
    ("dlrm", {"interaction": 3}, "dlrm: unknown interaction=3; valid: dot, dcn, projection"),
    ("fibinet", {"senet_pooling": "sum"}, "fibinet: unknown senet_pooling='sum'; valid: mean, max"),
])
def test_bad_value_names_model_parameter_type_and_value(name, params, message):
    with pytest.raises(ConfigError) as info:
        create_model(name, contract_schema(), **params)
    assert str(info.value) == message


def test_values_are_converted_to_the_annotation():
    assert check_model_params("dlrm", {"dense_arch": [8, 4], "interaction": "dcn", "cross_rank": 2}) == {
        "dense_arch": (8, 4), "interaction": "dcn", "cross_rank": 2}
    got = check_model_params("deepfm", {"dnn_dropout": 0, "dnn_hidden": []})
    assert got == {"dnn_dropout": 0.0, "dnn_hidden": ()} and isinstance(got["dnn_dropout"], float)
    assert check_model_params("wide_deep", {"crosses": [["user", "item"]]}) == {"crosses": (("user", "item"),)}
    assert check_model_params("autoint", {"head_dim": None}) == {"head_dim": None}
    assert check_model_params("mlr", {"l1": "1e-4"}) == {"l1": 1e-4}  # PyYAML reads 1e-4 as text


def test_unknown_parameter_still_suggests():
    with pytest.raises(ConfigError, match=r"model 'dlrm' has no parameter 'dense_ach' \(did you mean 'dense_arch'\?\)"):
        check_model_params("dlrm", {"dense_ach": [4]})


def test_yaml_lists_build_the_same_model_as_tuples(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {name: dlrm, params: {dense_arch: [16, 8], over_arch: [8], interaction: dcn}}\n")
    cfg = load_config(path)
    assert cfg.model.params["dense_arch"] == [16, 8]  # the config keeps what the file said
    torch.manual_seed(0)
    from_yaml = create_model("dlrm", contract_schema(), **cfg.model.params)
    torch.manual_seed(0)
    direct = create_model("dlrm", contract_schema(), dense_arch=(16, 8), over_arch=(8,), interaction="dcn")
    a, b = from_yaml.state_dict(), direct.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


class _Opaque(torch.nn.Module):
    def __init__(self, schema, *, act: Callable[[], torch.nn.Module] = torch.nn.ReLU, width: int = 2) -> None:
        super().__init__()
        self.act, self.width = act, width


def test_annotations_it_cannot_check_pass_through():
    register_model("_opaque_params")(_Opaque)
    try:
        model = create_model("_opaque_params", contract_schema(), act=torch.nn.Tanh, width=3)
        assert model.act is torch.nn.Tanh and model.width == 3
        with pytest.raises(ConfigError, match="_opaque_params: parameter 'width' expects int, got 'x'"):
            create_model("_opaque_params", contract_schema(), width="x")
    finally:
        _MODELS.pop("_opaque_params")


# ---- option groups: the deep tower's dnn_* options, written once (models/_towers.DNNOptions) ----------
TOWER_MODELS = ["autoint", "dcn", "dcnv2", "deepfm", "fibinet", "ncf", "nfm", "pnn", "wide_deep", "xdeepfm"]


@pytest.mark.parametrize("name", TOWER_MODELS)
def test_every_deep_tower_takes_the_four_dnn_options(name):
    params = model_params(name)
    assert {"dnn_hidden", "dnn_activation", "dnn_dropout", "dnn_batch_norm"} <= set(params)
    expected = {"ncf": (64, 32, 16), "pnn": (128, 64)}.get(name, (256, 128))  # the model's own default
    assert params["dnn_hidden"] == expected
    with pytest.raises(ConfigError, match=rf"model '{name}' has no parameter 'dnn_hiden' \(did you mean 'dnn_hidden'\?\)"):
        check_model_params(name, {"dnn_hiden": [4]})
    with pytest.raises(ConfigError, match=rf"{name}: parameter 'dnn_batch_norm' expects bool, got 'maybe'"):
        check_model_params(name, {"dnn_batch_norm": "maybe"})


@pytest.mark.parametrize("name", TOWER_MODELS)
def test_a_typo_in_a_directly_built_model_is_an_error_too(name):
    """Built by class, not by name (no registry check): the option group still rejects a stray key."""
    cls = get_model_class(name)
    with pytest.raises(ConfigError, match=rf"model '{name}' has no parameter 'dnn_dropuot' \(did you mean 'dnn_dropout'\?\)"):
        cls(contract_schema(), dnn_dropuot=0.5)


def test_dnn_options_build_the_tower_they_name():
    model = create_model("deepfm", contract_schema(), dnn_hidden=[16, 8], dnn_activation="tanh", dnn_dropout=0.25,
                         dnn_batch_norm=True)
    layers = [type(m).__name__ for m in model.deep.tower.modules()]
    linears = [m for m in model.deep.tower.modules() if isinstance(m, torch.nn.Linear)]
    assert [lin.out_features for lin in linears] == [16, 8]
    assert layers.count("Tanh") == 2 and layers.count("BatchNorm1d") == 2 and layers.count("Dropout") == 2
    assert create_model("ncf", contract_schema()).head.tower.out_features == 16  # ncf's own default (64, 32, 16)
    assert create_model("dcn", contract_schema(), dnn_hidden=[]).head.tower is None  # cross-only network
