"""The joint lookup's fused-row ids in one native pass (nn/embedding_joint.shifted_ids, csrc/embedding_ids.cpp)
against the torch ops it replaces, and its range check."""

from __future__ import annotations

import pytest
import torch

from ctrkit.nn import embedding_joint
from ctrkit.nn.embedding_joint import shifted_ids

pytestmark = pytest.mark.skipif(not embedding_joint.kernel_available(),
                                reason="no C++ compiler: the kernel cannot be built")


@pytest.mark.parametrize("check", [True, False])
def test_shifted_ids_equal_the_torch_ops(check) -> None:
    g = torch.Generator().manual_seed(1)
    per_key = torch.tensor([5, 0, 7, 3])
    sizes, offs = torch.tensor([4, 9, 6, 2]), torch.tensor([0, 4, 13, 19])
    values = torch.cat([torch.randint(0, int(s), (int(n),), generator=g) for n, s in zip(per_key, sizes)])
    ids, ok = shifted_ids(values, per_key, offs, sizes, check)
    assert ok and torch.equal(ids, values + offs.repeat_interleave(per_key))
    bad = values.clone()
    bad[9] = 6  # key 2's size is 6
    assert shifted_ids(bad, per_key, offs, sizes, check)[1] is (not check)
    bad[9] = -1
    assert shifted_ids(bad, per_key, offs, sizes, check)[1] is (not check)


def test_which_path_runs(monkeypatch) -> None:
    per_key, sizes, offs = torch.tensor([2]), torch.tensor([3]), torch.tensor([0])
    values = torch.tensor([0, 2])
    assert shifted_ids(values.int(), per_key, offs, sizes, True) is None
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    assert shifted_ids(values, per_key, offs, sizes, True) is None
