"""``train.warm_start_shrink`` / ``train.warm_start_perturb`` (jobs/warm_start.py ``warm_weights``; Ash & Adams
2020, "shrink and perturb"): after the checkpoint's weights are loaded and its tables grown, every parameter w
becomes shrink * w + perturb * w0, w0 the parameter's fresh initial value in this run (the same seed gives the same
w0); 1 and 0 (the defaults) leave the loaded weights exactly as they were; values outside the ranges are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import contract_schema, planted_data
from warm_cases import trained_checkpoint

from ctrkit.errors import ConfigError
from ctrkit.jobs.warm_start import WarmStart, warm_weights
from ctrkit.models.registry import create_model
from ctrkit.training.config import Config, ModelConfig, TrainConfig, load_config
from ctrkit.training.warm_start import load_grown_weights


def fresh_and_loaded(schema, params, ckpt) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per parameter: the fresh initial value (seed 7) and the value after a plain warm start (reference)."""
    torch.manual_seed(7)
    model = create_model("deepfm", schema, **params)
    fresh = {n: p.detach().clone() for n, p in model.named_parameters()}
    load_grown_weights(model, ckpt, params)
    return fresh, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(("shrink", "perturb"), [(1.0, 0.0), (0.5, 0.0), (0.5, 0.1), (1.0, 0.3)])
def test_every_parameter_is_shrunk_and_perturbed_by_its_fresh_value(shrink, perturb, tmp_path) -> None:
    schema = contract_schema()
    params = {"dnn_hidden": (16,)}
    _, _, ckpt = trained_checkpoint("deepfm", schema, params, TrainConfig(lr=0.05),
                                    planted_data(300, seed=2, schema=schema), tmp_path / "old.pt")
    bigger = replace(schema, sparse=[replace(f, vocab_size=f.vocab_size + 2) for f in schema.sparse])
    fresh, loaded = fresh_and_loaded(bigger, params, ckpt)
    cfg = Config(model=ModelConfig(name="deepfm", params=params),
                 train=TrainConfig(warm_start=str(tmp_path / "old.pt"), warm_start_shrink=shrink,
                                   warm_start_perturb=perturb))
    torch.manual_seed(7)
    model = create_model("deepfm", bigger, **params)
    warm_weights(model, WarmStart(ckpt), cfg)
    got = dict(model.named_parameters())
    assert got.keys() == loaded.keys() and len(got) > 3
    for n, w in loaded.items():
        if shrink == 1 and perturb == 0:
            assert torch.equal(got[n], w), n  # the defaults: the loaded weights bit for bit
        else:
            torch.testing.assert_close(got[n].detach(), shrink * w + perturb * fresh[n], rtol=1e-6, atol=1e-7)
    if perturb:  # the perturbation really is the fresh init: some parameter moved off the scaled checkpoint value
        assert any(not torch.allclose(got[n].detach(), shrink * w) for n, w in loaded.items())


@pytest.mark.parametrize("bad", ["train.warm_start_shrink=0", "train.warm_start_shrink=1.5",
                                 "train.warm_start_perturb=-0.1"])
def test_out_of_range_values_are_refused_by_name(bad, tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: {name: deepfm}\n")
    with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[1]):
        load_config(path, [bad])
