"""What an export may replace and what a reader trusts (issue 27, items 4 and 5).

``ctrkit export --overwrite`` replaces only an earlier export, never a run directory or another folder;
``load_exported`` refuses an export.json that was edited (every field, one at a time), that names a file outside
its directory, an older unverifiable export, and a program file whose bytes changed, each with an ExportError."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from export_cases import tiny_checkpoint

from ctrkit.cli import main
from ctrkit.errors import ExportError
from ctrkit.serving.export import export_checkpoint, load_exported
from ctrkit.serving.exported import meta_digest


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("trust")
    ckpt, *_ = tiny_checkpoint("lr", d / "m.pt")
    return ckpt, export_checkpoint(ckpt, d / "exp", "torchscript")


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _copy(src: Path, dst: Path) -> Path:
    for rel, data in _tree(src).items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(data)
    return dst


def test_overwrite_never_replaces_a_run_directory_or_another_folder(exported, tmp_path, caplog):
    ckpt, _ = exported
    run = tmp_path / "run"
    run.mkdir()
    for name in ("best.pt", "last.pt", "metrics.jsonl", "config.yaml"):
        (run / name).write_bytes(ckpt.read_bytes() if name.endswith(".pt") else b"{}\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    other_kind = tmp_path / "other"
    other_kind.mkdir()
    (other_kind / "export.json").write_text(json.dumps({"kind": "something-else"}))
    for d in (run, mine, other_kind):
        before = _tree(d)
        for overwrite in (True, False):
            with pytest.raises(ExportError, match=rf"--out {d} is not an earlier export .*choose another --out"):
                export_checkpoint(ckpt, d, "torchscript", overwrite=overwrite)
        assert _tree(d) == before
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="ctrkit"):
            rc = main(["export", "--checkpoint", str(ckpt), "--format", "torchscript", "--out", str(d), "--overwrite"])
        assert rc == 2 and len(caplog.records) == 1 and "not an earlier export" in caplog.text
        assert _tree(d) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "other", "run"]  # no temporary folder left
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match="is a file, not an export directory"):
        export_checkpoint(ckpt, tmp_path / "file", "torchscript", overwrite=True)


def test_overwrite_replaces_an_earlier_export(exported, tmp_path):
    ckpt, src = exported
    out = _copy(src, tmp_path / "exp")
    export_checkpoint(ckpt, out, "onnx", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "model.onnx", "pipeline"]
    assert load_exported(out).meta["format"] == "onnx"


TAMPERED = [None, 0, -1, 1.5, True, "", "x", "../x", "/etc/passwd", [], ["x"], {}, {"a": 1}]


def test_every_tampered_field_is_an_export_error(exported, tmp_path):
    _, src = exported
    meta = json.loads((src / "export.json").read_text())
    assert meta["version"] == 2 and meta["files"].keys() == {"model.pt"} and meta["digest"] == meta_digest(meta)
    out = _copy(src, tmp_path / "exp")
    tried = 0
    for key in meta:
        for value in [*TAMPERED, "<deleted>"]:
            if value == meta[key]:
                continue
            edited = {k: v for k, v in meta.items() if not (k == key and value == "<deleted>")}
            if value != "<deleted>":
                edited[key] = value
            (out / "export.json").write_text(json.dumps(edited))
            with pytest.raises(ExportError, match="export.json"):
                load_exported(out)
            tried += 1
    assert tried > 10 * len(meta)
    for text in ("{not json", "[1, 2]", "\xff\xfe"):
        (out / "export.json").write_text(text, errors="surrogateescape")
        with pytest.raises(ExportError, match="export.json"):
            load_exported(out)


def _rewrite(out: Path, **changes) -> None:
    meta = {**json.loads((out / "export.json").read_text()), **changes}
    meta["digest"] = meta_digest(meta)  # a consistent digest: the reader's own checks must still refuse it
    (out / "export.json").write_text(json.dumps(meta))


def test_files_outside_the_directory_are_refused_even_with_a_matching_digest(exported, tmp_path):
    _, src = exported
    outside = tmp_path / "outside.pt"
    outside.write_bytes((src / "model.pt").read_bytes())
    meta = json.loads((src / "export.json").read_text())
    cases = [{"file": "../outside.pt"}, {"file": str(outside)}, {"pipeline": "../../etc"},
             {"files": {**meta["files"], "../outside.pt": meta["files"]["model.pt"]}}]
    for i, change in enumerate(cases):
        out = _copy(src, tmp_path / f"exp{i}")
        _rewrite(out, **change)
        with pytest.raises(ExportError, match="points outside the export directory"):
            load_exported(out)
    out = _copy(src, tmp_path / "link")
    (out / "model.pt").unlink()
    os.symlink(outside, out / "model.pt")  # a symlink out of the directory
    with pytest.raises(ExportError, match="points outside the export directory"):
        load_exported(out)


def test_a_changed_model_file_and_an_old_export_are_refused(exported, tmp_path):
    _, src = exported
    out = _copy(src, tmp_path / "flip")
    data = bytearray((out / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / "model.pt").write_bytes(bytes(data))
    with pytest.raises(ExportError, match="model.pt fails its checksum"):
        load_exported(out)
    out = _copy(src, tmp_path / "gone")
    (out / "model.pt").unlink()
    with pytest.raises(ExportError, match="model.pt is missing"):
        load_exported(out)
    out = _copy(src, tmp_path / "v1")
    meta = json.loads((out / "export.json").read_text())
    for k in ("files", "digest"):
        meta.pop(k)
    (out / "export.json").write_text(json.dumps({**meta, "version": 1}))
    with pytest.raises(ExportError, match="export version 1.*carry no checksums.*export the checkpoint again"):
        load_exported(out)
    out = _copy(src, tmp_path / "garbage")
    (out / "model.pt").write_bytes(b"not a program")
    _rewrite(out, files={"model.pt": "sha256:" + __import__("hashlib").sha256(b"not a program").hexdigest()})
    with pytest.raises(ExportError, match="cannot be loaded as a torchscript program"):
        load_exported(out)
