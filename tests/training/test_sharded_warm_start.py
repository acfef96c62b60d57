"""Issue 28 item 2 on sharded tables (torchrec, several processes; training/sharded_warm.py): a warm start from a
sharded checkpoint keeps the fused optimizers' states (fbgemm's, inside the backward) and the replicated tables'
states, grown into a larger vocabulary, at another world size and sharding plan. Checked on 2 ranks (gloo over
loopback) against the checkpoint's own run continued: its next step on known ids is the step that run took, and
the new rows and the rows expiry reset hold a fresh optimizer's state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ctrkit.nn.embedding_torchrec import torchrec_available

pytestmark = pytest.mark.skipif(not torchrec_available(), reason="torchrec is not installed (ctrkit[distributed])")


def whole(files: list[Path]) -> dict[tuple[str, str], torch.Tensor]:
    """The fused states whole, from every rank's local shards with their offsets."""
    out: dict[tuple[str, str], torch.Tensor] = {}
    for f in files:
        for key, (size, shards) in torch.load(f, weights_only=False).items():
            t = out.setdefault(key, torch.full(size, float("nan")))
            for offsets, v in shards:
                t[tuple(slice(o, o + n) for o, n in zip(offsets, v.shape))] = v
    assert all(not t.isnan().any() for t in out.values()), "a state's shards do not cover it"
    return out


def by_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """A state as (blocks, rows, ...): row-wise (K * rows,) -> (K, rows); pointwise (rows, D) -> (1, rows, D)."""
    return t.view(-1, rows) if t.dim() == 1 else t.unsqueeze(0)


@pytest.mark.slow
@pytest.mark.parametrize("dim, saved, warm, blocks", [(8, (2, "table_wise"), (2, "column_wise"), 1),
                                                      (256, (2, "column_wise"), (1, "column_wise"), 2)],
                         ids=["dim8-tw2-to-cw2", "dim256-cw2-to-cw1"])
def test_a_sharded_warm_start_takes_the_step_the_checkpoints_run_takes(tmp_path, dim, saved, warm, blocks):
    """``blocks``: the row-wise state's blocks (column shards: torchrec cuts 256 columns into two of 128)."""
    from training.sharded_warm_workers import OPTIMIZERS, reset_ids, save_phase, schema_of, warm_phase
    from training.sharding_workers import launch

    launch(save_phase, saved[0], str(tmp_path), dim, saved[1], timeout_s=150)
    launch(warm_phase, warm[0], str(tmp_path), dim, warm[1], timeout_s=150)
    old, new, reset = schema_of(dim).tables(), schema_of(dim, grown=True).tables(), torch.tensor(reset_ids())
    assert len(reset) == 2
    for opt in OPTIMIZERS:
        ck = tmp_path / opt
        cont = torch.load(f"{ck}.continued.pt", weights_only=False)
        kept, fresh = (torch.load(f"{ck}.{arm}.pt", weights_only=False) for arm in ("kept", "fresh"))
        assert kept["parts"] == ["dense", "sparse", "fused"], kept["parts"]
        for k, want in cont.items():  # the next step: the checkpoint's run's, on every known row
            got = kept["after"][k][: want.shape[0]]
            keep = torch.ones(want.shape[0], dtype=torch.bool) if want.dim() else torch.tensor(True)
            if k.endswith(".tables.user"):
                keep[reset] = False  # reset by expiry: fresh rows, not the checkpoint's (and not in the batch)
            torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-6,
                                       msg=lambda m, w=f"{opt} {k}": f"{w}: {m}")
        sharded = [k for k in cont if k.startswith("model.embedding.") and ".tables." in k]
        assert len(sharded) == 5
        # the control: the same warm start with fresh fused states takes another step on the sharded tables
        gap = max(float((fresh["after"][k][: cont[k].shape[0]] - cont[k]).abs().max()) for k in sharded)
        assert gap > 1e-3, f"{opt}: the step does not depend on the fused states ({gap})"
        check_states(tmp_path, opt, old, new, reset, blocks if opt == "rowwise_adagrad" else 1)
        check_replicated(kept, fresh, reset)


def check_states(d: Path, opt: str, old: dict, new: dict, reset: torch.Tensor, blocks: int) -> None:
    """The fused states before the third step: old rows the checkpoint's, new and reset rows a fresh optimizer's."""
    saved, kept, fresh = (whole(sorted(d.glob(f"{opt}.{tag}-*.pt"))) for tag in ("saved", "kept", "fresh"))
    assert set(kept) == set(fresh) == set(saved) and len(kept) == 5, sorted(kept)
    for (param, name), got in kept.items():
        table = name.split("#")[0]
        r_old, r_new = old[table].num_embeddings, new[table].num_embeddings
        got, ref, init = by_rows(got, r_new), by_rows(saved[param, name], r_old), by_rows(fresh[param, name], r_new)
        assert got.shape[0] == ref.shape[0] == blocks, (param, name, got.shape, ref.shape)
        keep = torch.ones(r_old, dtype=torch.bool)
        if table == "user":
            keep[reset] = False
            assert (ref[:, reset] != init[:, reset]).any(), "the reset rows had a trained state"
            torch.testing.assert_close(got[:, reset], init[:, reset], rtol=0, atol=0)
        assert (ref != 0).any(), (param, name)  # trained
        torch.testing.assert_close(got[:, :r_old][:, keep], ref[:, keep], rtol=0, atol=0)
        torch.testing.assert_close(got[:, r_old:], init[:, r_old:], rtol=0, atol=0)
        assert not init.any(), "fbgemm's fresh accumulators start at 0"


def check_replicated(kept: dict, fresh: dict, reset: torch.Tensor) -> None:
    """The replicated (data_parallel, dim 1) tables' states: the checkpoint's, the user table's reset rows fresh."""
    user = next(i for i, n in enumerate(kept["replicated"]) if ".user#" in n)
    assert set(kept["replica"]) == set(fresh["replica"]) and len(kept["replica"]) == 5
    for i, got in kept["replica"].items():
        ref = fresh["replica"][i]  # loaded without resets
        if i == user:
            assert ref[reset].any() and not got[reset].any(), (ref[reset], got[reset])
            keep = torch.ones(got.shape[0], dtype=torch.bool)
            keep[reset] = False
            torch.testing.assert_close(got[keep], ref[keep], rtol=0, atol=0)
        else:
            torch.testing.assert_close(got, ref, rtol=0, atol=0)


# ---- the growing rule on one process (plain tensors: one shard at offset 0), against a loop ----------------------
class _Fused:
    """A fused optimizer as load_grown_fused reads it: params, a state dict of tensors, load_state_dict."""

    def __init__(self, states: dict[str, dict[str, torch.Tensor]], rows: dict[str, int]) -> None:
        self.states, self.params = states, {p: torch.zeros(n, 4) for p, n in rows.items()}

    def state_dict(self) -> dict:
        return {"state": self.states}

    def load_state_dict(self, state: dict) -> None:
        self.states = state["state"]


def test_fused_states_grow_row_by_row_as_a_loop_does(caplog):
    from types import SimpleNamespace

    from ctrkit.training.sharded_warm import load_grown_fused, table_key

    bag, seq = "model.embedding.ebc.ebc.embedding_bags.user#b4.weight", "model.m.ecs.d4.embeddings.item#s4.weight"
    assert table_key(bag) == "model.embedding.ebc.tables.user" and table_key(seq) == "model.m.tables.item"
    assert table_key("model.deep.out.weight") is None
    old_rows, new_rows, reset = 5, 8, [1, 3]
    saved = {bag: {"user#b4.momentum1": torch.arange(2 * old_rows, dtype=torch.float) + 1},  # 2 column shards
             seq: {"item#s4.momentum1": torch.rand(old_rows, 4) + 1, "item#s4.other": torch.rand(3 * old_rows)}}
    fresh = {bag: {"user#b4.momentum1": torch.full((2 * new_rows,), -1.0)},
             seq: {"item#s4.momentum1": torch.full((new_rows, 4), -1.0), "item#s4.other": torch.zeros(2 * new_rows)}}
    fused = _Fused({p: {k: v.clone() for k, v in s.items()} for p, s in fresh.items()}, {bag: new_rows, seq: new_rows})
    rows = {"embedding.ebc.tables.user": old_rows, "m.tables.item": old_rows}
    loaded = load_grown_fused(SimpleNamespace(fused_optimizer=fused), saved, rows, {"user": reset})
    assert sorted(loaded) == [f"{bag}.user#b4.momentum1", f"{seq}.item#s4.momentum1"]
    assert "item#s4.other" in caplog.text and "3 column shards in the checkpoint and 2 now" in caplog.text
    for param, name, blocks in ((bag, "user#b4.momentum1", 2), (seq, "item#s4.momentum1", 0)):
        want = fresh[param][name].clone()
        for b in range(max(blocks, 1)):
            for r in range(old_rows):
                if not (param == bag and r in reset):
                    if blocks:
                        want[b * new_rows + r] = saved[param][name][b * old_rows + r]
                    else:
                        want[r] = saved[param][name][r]
        torch.testing.assert_close(fused.states[param][name], want, rtol=0, atol=0)
    torch.testing.assert_close(fused.states[seq]["item#s4.other"], torch.zeros(2 * new_rows), rtol=0, atol=0)
