"""The one activation factory and the one layer-configuration error of ctrkit.nn."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from ctrkit.errors import CtrkitError, LayerConfigError
from ctrkit.nn.activation import ACTIVATIONS, make_activation
from ctrkit.nn.cin import CIN
from ctrkit.nn.crossnet import CrossNet, LowRankMixtureCrossNet
from ctrkit.nn.interaction import DotInteraction, ProjectionInteraction
from ctrkit.nn.mlp import MLP

NN = Path(__file__).resolve().parents[2] / "src" / "ctrkit" / "nn"

REFERENCE = {  # name -> the function it must compute
    "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu, "swish": torch.nn.functional.silu,
    "prelu": lambda x: torch.where(x >= 0, x, 0.25 * x),  # PReLU starts at slope 0.25
    "leaky_relu": lambda x: torch.where(x >= 0, x, 0.01 * x),
    "identity": lambda x: x, "linear": lambda x: x,
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_name_computes_its_function(name: str) -> None:
    x = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(make_activation(name)(x), REFERENCE[name](x))
    torch.testing.assert_close(make_activation(name.upper())(x), REFERENCE[name](x))  # case-insensitive


def test_every_reference_is_a_name() -> None:
    assert set(REFERENCE) == set(ACTIVATIONS)


def test_factories_and_modules() -> None:
    a, b = make_activation(nn.Tanh), make_activation(nn.Tanh)
    assert isinstance(a, nn.Tanh) and a is not b  # a factory: a new module each call
    m = nn.ELU()
    assert make_activation(m) is m  # a module: used as is
    with pytest.raises(LayerConfigError, match="factory .* returned int, not an nn.Module"):
        make_activation(lambda: 3)  # type: ignore[arg-type, return-value]
    with pytest.raises(LayerConfigError, match="must be a name, a module factory or a module, got 3"):
        make_activation(3)  # type: ignore[arg-type]


def test_unknown_name_names_the_layer_and_the_valid_names() -> None:
    with pytest.raises(LayerConfigError) as info:
        make_activation("relux", layer="MyLayer")
    msg = str(info.value)
    assert msg.startswith("MyLayer: unknown activation='relux'; valid: ")
    assert all(n in msg for n in ACTIVATIONS)
    assert isinstance(info.value, ValueError) and isinstance(info.value, CtrkitError)


@pytest.mark.parametrize("build, layer", [
    (lambda a: MLP(4, [3], activation=a), "MLP"),
    (lambda a: CIN(3, 4, activation=a), "CIN"),
    (lambda a: LowRankMixtureCrossNet(4, 1, activation=a), "LowRankMixtureCrossNet"),
    (lambda a: ProjectionInteraction(2, 4, [8], [8], activation=a), "MLP"),
])
def test_every_configurable_activation_goes_through_the_factory(build, layer) -> None:
    with pytest.raises(LayerConfigError, match=f"{layer}: unknown activation='nope'; valid: gelu, identity"):
        build("nope")
    built = build("sigmoid")
    assert any(isinstance(m, nn.Sigmoid) for m in built.modules())


@pytest.mark.parametrize("make", [
    lambda: MLP(0, [2]),
    lambda: MLP(2, [2], dropout=-0.1),
    lambda: CrossNet(0, 1),
    lambda: LowRankMixtureCrossNet(4, 1, num_experts=0),
    lambda: DotInteraction(0, 4),
    lambda: DotInteraction(2, 4)(torch.zeros(1, 3), torch.zeros(1, 2, 4)),
    lambda: ProjectionInteraction(2, 4, [6], [8]),
    lambda: ProjectionInteraction(2, 4, [], [8]),
])
def test_bad_layer_options_are_layer_config_errors(make) -> None:
    with pytest.raises(LayerConfigError):
        make()


def _raised_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name):
                names.add(exc.id)
    return names


def test_nn_layers_raise_only_layer_config_errors() -> None:
    """Every layer module of ctrkit.nn (the embedding modules have their own id / schema errors) raises
    LayerConfigError for a bad option or input, never a bare ValueError."""
    files = [p for p in NN.glob("*.py")
             if p.name not in ("embedding.py", "embedding_interface.py", "embedding_factory.py", "embedding_torchrec.py",
                               "inputs.py",
                               "__init__.py")]
    assert len(files) >= 9
    for path in files:
        assert _raised_names(path) <= {"LayerConfigError"}, path.name


def test_nn_imports_neither_models_nor_train() -> None:
    for path in NN.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("ctrkit.models", "ctrkit.training")), (path.name, node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith(("ctrkit.models", "ctrkit.training")), (path.name, alias.name)
