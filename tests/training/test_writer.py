"""The checkpoint writer's RNG state: captured and restored for every generator a run draws from."""

from __future__ import annotations

import random

import numpy as np
import torch

from ctrkit.training.writer import rng_state, set_rng_state


def test_rng_state_restores_all_generators():
    state = rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]
