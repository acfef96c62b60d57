"""Output paths through the CLI: existing outputs need --overwrite, unwritable paths are one error line naming
them, and a failure or Ctrl-C leaves neither a half-written split nor a temporary directory behind."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

import ctrkit.io
from ctrkit.cli import main
from ctrkit.data.storage import store as store_mod
from ctrkit.data.storage.store import Store

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"
SPEC = {"label": "label", "dense": [{"name": "x", "transform": "standardize"}], "sparse": ["c"]}


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """A small Criteo TSV, a CSV with its YAML spec and a behaviour log (CSV)."""
    d = tmp_path / "in"
    d.mkdir()
    with gzip.open(BUNDLED, "rt") as f:
        (d / "c.tsv").write_text("".join(f.readlines()[:300]))
    (d / "t.csv").write_text("label,x,c\n" + "".join(f"{i % 2},{i},c{i % 9}\n" for i in range(300)))
    (d / "spec.yaml").write_text(json.dumps(SPEC))  # JSON is YAML
    rows = [f"u{u},i{(u * 7 + k) % 23},{k}" for u in range(12) for k in range(6)]
    (d / "log.csv").write_text("user,item,time\n" + "\n".join(rows) + "\n")
    return {"criteo": d / "c.tsv", "table": d / "t.csv", "spec": d / "spec.yaml", "log": d / "log.csv"}


def argv(kind: str, inputs: dict[str, Path], out: Path) -> list[str]:
    if kind == "criteo":
        return ["preprocess", "criteo", str(inputs["criteo"]), "--out", str(out)]
    if kind == "table":
        return ["preprocess", "table", str(inputs["table"]), "--schema", str(inputs["spec"]), "--out", str(out)]
    return ["preprocess", "behaviour", str(inputs["log"]), "--time-col", "time", "--out", str(out)]


def one_error(caplog: pytest.LogCaptureFixture) -> str:
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "Traceback" not in caplog.text, caplog.text
    return errors[0]


def leftovers(d: Path) -> list[str]:
    """Temporary or half-written entries under ``d``: hidden (``.*tmp*``, ``.*old*``) names, splits without a
    manifest."""
    if not d.is_dir():
        return []
    bad = [p.name for p in d.iterdir() if p.name.startswith(".")]
    bad += [p.name for p in d.iterdir() if p.is_dir() and not (p / "manifest.json").is_file()]
    return bad


# ---- f) existing outputs need --overwrite ----------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".tsv", ".tsv.gz"])
def test_synth_tsv_onto_an_existing_file_needs_overwrite(tmp_path: Path, caplog, suffix: str) -> None:
    out = tmp_path / f"raw{suffix}"
    out.write_bytes(b"keep me\n")
    assert main(["synth", "--rows", "50", "--out", str(out)]) == 2
    msg = one_error(caplog)
    assert str(out) in msg and "--overwrite" in msg
    assert out.read_bytes() == b"keep me\n"
    assert main(["synth", "--rows", "50", "--out", str(out), "--overwrite"]) == 0
    data = gzip.decompress(out.read_bytes()) if suffix == ".tsv.gz" else out.read_bytes()
    assert data.count(b"\n") == 50 and os.listdir(tmp_path) == [out.name]


def test_synth_store_onto_existing_output_needs_overwrite(tmp_path: Path, caplog) -> None:
    store = tmp_path / "st"
    store.mkdir()  # an empty directory is no output yet
    assert main(["synth", "--rows", "40", "--out", str(store)]) == 0
    assert Store(store).num_rows == 40
    assert main(["synth", "--rows", "30", "--out", str(store)]) == 2
    msg = one_error(caplog)
    assert str(store) in msg and "--overwrite" in msg and Store(store).num_rows == 40
    assert main(["synth", "--rows", "30", "--out", str(store), "--overwrite"]) == 0
    assert Store(store).num_rows == 30
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["synth", "--rows", "30", "--out", str(f), "--format", "store"]) == 2
    assert f.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["file", "st"]


def test_overwrite_never_replaces_a_directory_that_is_not_a_store(tmp_path: Path, caplog) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("precious")
    assert main(["synth", "--rows", "30", "--out", str(d), "--overwrite"]) == 2
    assert "not a ctrkit store" in one_error(caplog) and (d / "notes.txt").read_text() == "precious"
    assert main(["synth", "--rows", "30", "--out", str(d), "--format", "tsv", "--overwrite"]) == 2
    assert (d / "notes.txt").read_text() == "precious" and os.listdir(d) == ["notes.txt"]


@pytest.mark.parametrize("kind", ["criteo", "table", "behaviour"])
def test_preprocess_onto_existing_stores_needs_overwrite(tmp_path: Path, inputs, caplog, kind: str) -> None:
    out = tmp_path / "out"
    assert main(argv(kind, inputs, out)) == 0
    before = (out / "train" / "manifest.json").read_text()
    caplog.clear()
    assert main(argv(kind, inputs, out)) == 2
    msg = one_error(caplog)
    assert str(out / "train") in msg and "--overwrite" in msg
    assert (out / "train" / "manifest.json").read_text() == before
    assert main([*argv(kind, inputs, out), "--overwrite"]) == 0
    assert leftovers(out) == []


# ---- g) unwritable outputs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["criteo", "table", "behaviour"])
def test_output_under_or_at_a_regular_file_is_one_error_line(tmp_path: Path, inputs, caplog, kind: str) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    for out in (f, f / "sub"):
        caplog.clear()
        assert main(argv(kind, inputs, out)) == 2
        msg = one_error(caplog)
        assert str(out) in msg and f"{f} is a file" in msg
    assert f.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["afile", "in"]


def test_permission_denied_is_one_error_line(tmp_path: Path, inputs, monkeypatch, caplog) -> None:
    """What a read-only directory gives a user who is not root (root may write anywhere: simulated)."""
    def denied(*a: object, **k: object) -> None:
        raise PermissionError(13, "Permission denied", str(k.get("dir")))

    monkeypatch.setattr(ctrkit.io.tempfile, "mkdtemp", denied)
    out = tmp_path / "out"
    assert main(argv("table", inputs, out)) == 2
    msg = one_error(caplog)
    assert str(out) in msg and "Permission denied" in msg and "--out" in msg
    assert os.listdir(out) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
@pytest.mark.parametrize("kind", ["criteo", "table", "behaviour"])
def test_read_only_output_directory_is_one_error_line(tmp_path: Path, inputs, caplog, kind: str) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert main(argv(kind, inputs, ro / "out")) == 2
        assert str(ro / "out") in one_error(caplog)
        assert main(argv(kind, inputs, ro)) == 2
        assert os.listdir(ro) == []
    finally:
        ro.chmod(0o755)


# ---- g) Ctrl-C and failures mid-run leave no partial output ---------------------------------------------------
def _interrupt_at(monkeypatch: pytest.MonkeyPatch, split: str, exc: BaseException) -> None:
    """Raise ``exc`` at the first chunk written to the store of ``split`` (after the earlier splits are done)."""
    real = store_mod._AppendArray.append

    def append(self: store_mod._AppendArray, a: object) -> None:
        if self.path.parent.name.startswith(f".{split}.tmp-"):
            raise exc
        return real(self, a)

    monkeypatch.setattr(store_mod._AppendArray, "append", append)


@pytest.mark.parametrize("kind", ["criteo", "table", "behaviour"])
def test_ctrl_c_while_writing_leaves_nothing(tmp_path: Path, inputs, monkeypatch, caplog, kind: str) -> None:
    out = tmp_path / "out"
    _interrupt_at(monkeypatch, "valid", KeyboardInterrupt())  # train is staged by then
    assert main(argv(kind, inputs, out)) == 130
    assert "interrupted" in caplog.text
    assert not out.exists() or os.listdir(out) == []


@pytest.mark.parametrize("kind", ["criteo", "table", "behaviour"])
def test_interrupted_overwrite_keeps_the_old_stores(tmp_path: Path, inputs, monkeypatch, kind: str) -> None:
    out = tmp_path / "out"
    assert main(argv(kind, inputs, out)) == 0
    before = {s: (out / s / "manifest.json").read_text() for s in ("train", "valid", "test")}
    _interrupt_at(monkeypatch, "test", KeyboardInterrupt())
    assert main([*argv(kind, inputs, out), "--overwrite", "--seed", "5"]) == 130
    assert {s: (out / s / "manifest.json").read_text() for s in before} == before
    assert leftovers(out) == [] and sorted(os.listdir(out)) == sorted([*before, *(["report.json"]
                                                                                  if kind == "behaviour" else [])])


def test_disk_error_while_writing_is_one_error_line(tmp_path: Path, inputs, monkeypatch, caplog) -> None:
    out = tmp_path / "out"
    _interrupt_at(monkeypatch, "train", OSError(28, "No space left on device"))
    assert main(argv("table", inputs, out)) == 2
    msg = one_error(caplog)
    assert "No space left on device" in msg and str(out) in msg
    assert os.listdir(out) == []


def test_ctrl_c_while_reading_criteo_leaves_nothing(tmp_path: Path, inputs, monkeypatch) -> None:
    from ctrkit.data.sources import criteo

    def parse_block(buf: bytes) -> None:  # runs in the parser thread; the main thread re-raises it
        raise KeyboardInterrupt

    monkeypatch.setattr(criteo, "parse_block", parse_block)
    out = tmp_path / "out"
    assert main(argv("criteo", inputs, out)) == 130
    assert os.listdir(out) == []


def test_ctrl_c_while_writing_synthetic_outputs(tmp_path: Path, monkeypatch) -> None:
    _interrupt_at(monkeypatch, "st", KeyboardInterrupt())
    assert main(["synth", "--rows", "20", "--out", str(tmp_path / "st")]) == 130
    from ctrkit.data.sources import synthetic

    def boom(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic.pacsv, "write_csv", boom)
    assert main(["synth", "--rows", "20", "--out", str(tmp_path / "raw.tsv")]) == 130
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["criteo", "table", "behaviour"])
def test_a_killed_runs_scratch_is_removed_by_the_next_run(tmp_path: Path, inputs, kind: str) -> None:
    """SIGKILL leaves a run's ``.<kind>-tmp-*`` behind (no cleanup runs); the next run into the same --out removes
    it, keeps the scratch of a run that is still alive and the resumable ``.criteo-stage-*`` (issue 27, 4)."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    out.mkdir()
    live, fd = ctrkit.io.scratch_dir(out, ".table-tmp-")  # a run that is still working: kept
    (out / ".criteo-stage-abc").mkdir()  # resumable --workers results: kept
    code = ("import sys, time; import ctrkit.data.storage.splits as s; from ctrkit.data.pipeline.spec import SPLITS\n"
            f"o = s.SplitOutput({str(out)!r}, SPLITS, overwrite=False, prefix='.{kind}-tmp-'); "
            "(o.tmp / 'part').write_bytes(b'x' * 1000); print(o.tmp, flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    killed = Path(p.stdout.readline().strip())
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    p.stdout.close()
    assert killed.is_dir() and killed.name.startswith(f".{kind}-tmp-")  # what a kill leaves
    t0 = time.monotonic()
    assert main([*argv(kind, inputs, out)]) == 0 and time.monotonic() - t0 < 60
    assert not killed.exists() and live.is_dir() and (out / ".criteo-stage-abc").is_dir()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".criteo-stage-abc", live.name]
    os.close(fd)
