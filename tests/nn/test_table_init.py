"""Tables' initial values by blocks of rows (nn/table_init.py) and the torchrec backend built on the meta device:
any part of a table made alone equals that part of the whole table; a meta build and an allocated build of one seed
hold the same values, dense layers included."""

from __future__ import annotations

import pytest
import torch
from conftest import contract_schema

from ctrkit.errors import LayerConfigError
from ctrkit.nn.embedding_torchrec import TorchrecEmbeddingCollection, meta_tables, torchrec_available
from ctrkit.nn.table_init import BLOCK_ROWS, TableInit


@pytest.mark.parametrize("init,std", [("uniform", None), ("normal", 0.05), ("zeros", None)])
def test_any_part_equals_that_part_of_the_whole_table(init, std):
    rows, dim = 2 * BLOCK_ROWS + 123, 6
    t = TableInit(7, "item", rows, dim, init, std)
    whole = t.fill(torch.empty(rows, dim))
    for r0, n, c0, c in [(0, rows, 0, dim), (BLOCK_ROWS - 5, 10, 2, 3), (BLOCK_ROWS, BLOCK_ROWS + 123, 0, 4),
                         (rows - 1, 1, 5, 1), (17, 2 * BLOCK_ROWS, 1, 5)]:
        part = t.fill(torch.full((n, c), float("nan")), r0, c0)
        assert torch.equal(part, whole[r0: r0 + n, c0: c0 + c]), (r0, n, c0, c)
    if init == "uniform":  # U(-sqrt(1/rows), sqrt(1/rows)): its bound and its spread
        bound = rows ** -0.5
        assert whole.abs().max() <= bound and whole.std() == pytest.approx(bound / 3 ** 0.5, rel=0.01)
    elif init == "normal":
        assert whole.mean().abs() < 1e-3 and whole.std() == pytest.approx(std, rel=0.01)
    else:
        assert not whole.any()
    other = TableInit(7, "user", rows, dim, init, std).fill(torch.empty(rows, dim))
    assert torch.equal(other, whole) == (init == "zeros")  # another table, other values
    with pytest.raises(LayerConfigError, match="table 'item'"):
        t.fill(torch.empty(4, dim), rows - 2)


@pytest.mark.skipif(not torchrec_available(), reason="torchrec is not installed (ctrkit[distributed])")
def test_a_meta_build_holds_the_values_of_an_allocated_build_of_the_same_seed():
    from ctrkit.models.registry import create_model

    torch.manual_seed(11)
    allocated = create_model("deepfm", contract_schema(), embedding_backend="torchrec", dnn_hidden=(16,))
    torch.manual_seed(11)
    with meta_tables():
        meta = create_model("deepfm", contract_schema(), embedding_backend="torchrec", dnn_hidden=(16,))
    meta.to("cpu")  # tables on meta stay there; the rest moves
    want, got = allocated.state_dict(), meta.state_dict()
    assert want.keys() == got.keys()
    tables = [k for k, v in got.items() if v.is_meta]
    assert len(tables) == 10 and all(".tables." in k for k in tables)  # 5 embeddings, 5 first-order weights
    for k, v in got.items():
        if not v.is_meta:  # the dense part: the same draws of the global RNG
            assert torch.equal(v, want[k]), k
    for prefix, m in meta.named_modules():  # the tables: what their TableInit makes, as the allocated build holds
        if isinstance(m, TorchrecEmbeddingCollection):
            assert m.on_meta
            for name, init in m.table_inits().items():
                w = want[f"{prefix}.tables.{name}"]
                assert torch.equal(init.fill(torch.empty_like(w)), w), (prefix, name)
    emb = next(m for m in allocated.modules() if isinstance(m, TorchrecEmbeddingCollection))
    before = {k: v.clone() for k, v in emb.table_weights().items()}
    with torch.no_grad():
        for w in emb.table_weights().values():
            w.add_(1.0)
    emb.reset_parameters()  # back to the initial values
    assert all(torch.equal(w, before[k]) for k, w in emb.table_weights().items())


def test_a_rank_checks_only_its_own_shards_and_the_replicated_tables_against_its_memory(monkeypatch):
    from types import SimpleNamespace as NS

    from ctrkit.errors import LayerConfigError
    from ctrkit.nn import table_memory
    from ctrkit.training.sharding import check_shards_fit

    def part(rank: int, r0: int, rows: int) -> NS:
        return NS(placement=NS(rank=lambda: rank), shard_offsets=[r0, 0], shard_sizes=[rows, 16])

    big = NS(sharding_spec=NS(shards=[part(0, 0, 1_000_000), part(1, 1_000_000, 1_000_000)]))
    small = NS(sharding_spec=NS(shards=[part(1, 0, 1000)]))
    plan = NS(plan={"model.ebc": {"big#b16": big, "small#b16": small}})
    monkeypatch.setattr(table_memory, "available_memory", lambda: 100 * 2**20)  # 100 MiB
    check_shards_fit(torch.nn.Module(), plan, 0)  # 61 MiB of shards: fits
    monkeypatch.setattr(table_memory, "available_memory", lambda: 50 * 2**20)
    with pytest.raises(LayerConfigError, match=r"big#b16 rows 1000000\+ columns 0\+: 1,000,000 rows x 16"):
        check_shards_fit(torch.nn.Module(), plan, 1)
