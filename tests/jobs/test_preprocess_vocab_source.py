"""``ctrkit preprocess ... --vocab-from CHECKPOINT [--grow]``: the checkpoint's pipeline is the parent."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.pipeline.persist import to_payload
from ctrkit.data.storage.fitted import fitted_at

SPEC = "label: label\ndense: []\nsparse: [{name: user}, {name: item}]\n"


def _csv(path: Path, rows: list[tuple[int, str, str]]) -> Path:
    path.write_text("label,user,item\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    return path


def test_a_checkpoint_is_a_parent_to_grow_and_to_reuse(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    first = _csv(tmp_path / "a.csv", [(1, "u1", "a"), (0, "u2", "b"), (1, "u1", "c")])
    base = ["preprocess", "table", "--schema", str(tmp_path / "spec.yaml"), "--split", "1"]
    assert main([*base[:2], str(first), *base[2:], "--out", str(tmp_path / "a")]) == 0
    pipe = fitted_at(tmp_path / "a" / "train")
    ckpt = Checkpoint(None, {}, schema=pipe.schema, pipeline=to_payload(pipe)).save(tmp_path / "best.pt")
    new = _csv(tmp_path / "b.csv", [(1, "u3", "d"), (0, "u1", "a")])
    assert main([*base[:2], str(new), *base[2:], "--out", str(tmp_path / "g"), "--vocab-from", str(ckpt),
                 "--grow"]) == 0
    grown = fitted_at(tmp_path / "g" / "train")
    assert grown.vocabs_["item"].keys.tolist() == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(grown.vocabs_["user"].lookup(pipe.vocabs_["user"].keys), pipe.vocabs_["user"].ids)
    assert grown.lineage_["parent_fingerprint"] == pipe.vocab_fingerprint()
    assert grown.lineage_["parent_source"] == str(ckpt)
    assert main([*base[:2], str(new), *base[2:], "--out", str(tmp_path / "r"), "--vocab-from", str(ckpt)]) == 0
    assert fitted_at(tmp_path / "r" / "train").vocab_fingerprint() == pipe.vocab_fingerprint()  # reused unchanged
