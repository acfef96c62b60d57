"""Model parameters are type-checked like config values: ``create_model`` checks each value against the
annotation of the model's keyword-only ``__init__`` parameter before the model is built."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import contract_schema

from ctrkit.errors import ConfigError
from ctrkit.models.registry import _MODELS, check_model_params, create_model, register_model
from ctrkit.train.config import load_config


@pytest.mark.parametrize("name, params, message", [
    ("dlrm", {"dense_arch": "abc"}, "dlrm: parameter 'dense_arch' expects tuple[int, ...], got 'abc' (a list)"),
    ("dlrm", {"over_arch": 64}, "dlrm: parameter 'over_arch' expects tuple[int, ...], got 64 (a list)"),
    ("dlrm", {"dense_arch": [64, "abc"]},
     "dlrm: parameter 'dense_arch' expects tuple[int, ...], got [64, 'abc'] (item 1: 'abc' is not int)"),
    ("afm", {"attention_dim": 1.5}, "afm: parameter 'attention_dim' expects int, got 1.5"),
    ("afm", {"attention_dim": True}, "afm: parameter 'attention_dim' expects int, got True"),
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
    assert check_model_params("dlrm", {"dense_arch": [8, 4], "interaction": "dcn", "dcn_rank": 2}) == {
        "dense_arch": (8, 4), "interaction": "dcn", "dcn_rank": 2}
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
