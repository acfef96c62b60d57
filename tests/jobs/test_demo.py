"""``ctrkit demo --out DIR`` refuses an earlier demo's output (and a file) without ``--overwrite`` (issue 27, 4)."""

from __future__ import annotations

import logging

import pytest

from ctrkit.cli import main
from ctrkit.jobs import demo


def _tree(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("earlier", ["criteo/train/manifest.json", "runs/dlrm-dot/best.pt"])
def test_existing_demo_output_is_refused_without_overwrite(tmp_path, caplog, monkeypatch, earlier):
    (tmp_path / earlier).parent.mkdir(parents=True)
    (tmp_path / earlier).write_text("an earlier demo's file")
    before = _tree(tmp_path)
    with caplog.at_level(logging.ERROR, logger="ctrkit"):
        assert main(["demo", "--out", str(tmp_path), "--epochs", "1"]) == 2
    assert len(caplog.records) == 1 and "already holds demo output" in caplog.text and "--overwrite" in caplog.text
    assert _tree(tmp_path) == before

    def reached(*args, **kwargs):
        raise KeyboardInterrupt  # the check passed: the demo went on to preprocess

    monkeypatch.setattr("ctrkit.data.sources.criteo.preprocess_criteo", reached)
    assert main(["demo", "--out", str(tmp_path), "--epochs", "1", "--overwrite"]) == 130


def test_a_file_as_out_is_refused(tmp_path, caplog):
    (tmp_path / "f").write_text("x")
    with caplog.at_level(logging.ERROR, logger="ctrkit"):
        assert main(["demo", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in caplog.text and (tmp_path / "f").read_text() == "x"
    assert demo.demo_outputs(tmp_path)[0] == tmp_path / "criteo"
