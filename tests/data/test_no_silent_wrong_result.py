"""Issue 27 item 3, the input side: no silently wrong result from an input given twice, a quoted field holding
newlines, or a row whose fields are all empty. Each case is run through the command or function a user calls
(preprocess criteo / table / behaviour, the rows ``predict`` scores) and checked against what the file says."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.sources.behaviour import preprocess_behaviour
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.sources.raw_rows import ReadStats, iter_raw
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError
from tests.conftest import write_log

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"


def criteo_file(path: Path, n: int = 200) -> Path:
    with gzip.open(BUNDLED, "rt") as f:
        lines = f.read().splitlines()[:n]
    path.write_text("\n".join(lines) + "\n")
    return path


def table_file(path: Path, n: int = 60, multiline_at: int | None = None, bad_at: int | None = None) -> Path:
    """A CSV of label y, dense x, sparse u and note; row ``multiline_at`` has a quoted note on two lines and
    row ``bad_at`` a dense value that is not a number."""
    lines = ["y,x,u,note"]
    for i in range(n):
        note = f'"two\nlines {i}"' if i == multiline_at else f"n{i % 3}"
        x = "abc" if i == bad_at else str(i)
        lines.append(f"{i % 2},{x},u{i % 5},{note}")
    path.write_text("\n".join(lines) + "\n")
    return path


def spec_file(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"label": "y", "dense": ["x"], "sparse": ["u", "note"]}))
    return path


# ---- the same input twice ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["twice", "symlink", "hardlink", "dir_and_file"])
def test_criteo_refuses_one_file_given_twice(tmp_path: Path, how: str) -> None:
    day = criteo_file(tmp_path / "day_0")
    criteo_file(tmp_path / "day_1")
    other = {"twice": day, "symlink": tmp_path / "link.tsv", "hardlink": tmp_path / "hard.tsv",
             "dir_and_file": day}[how]
    if how == "symlink":
        other.symlink_to(day)
    elif how == "hardlink":
        os.link(day, other)
    inputs = [tmp_path, other] if how == "dir_and_file" else [day, tmp_path / "day_1", other]
    for workers in (None, 2):  # one process, and the count / encode tasks
        with pytest.raises(DataError, match="read twice"):
            preprocess_criteo(inputs, tmp_path / "out", workers=workers, progress=False)
    assert not (tmp_path / "out").exists()


def test_table_refuses_the_input_again_as_valid_or_test(tmp_path: Path) -> None:
    data, spec = table_file(tmp_path / "t.csv"), spec_file(tmp_path / "s.yaml")
    (tmp_path / "link.csv").symlink_to(data)
    with pytest.raises(DataError, match=r"input .*t\.csv and --valid .*link\.csv are the same file"):
        preprocess_table(data, spec, tmp_path / "out", valid=tmp_path / "link.csv")
    valid = table_file(tmp_path / "v.csv")
    with pytest.raises(DataError, match=r"--valid .*v\.csv and --test .*v\.csv are the same path"):
        preprocess_table(data, spec, tmp_path / "out", valid=valid, test=valid)
    assert not (tmp_path / "out").exists()


def test_behaviour_refuses_the_log_as_its_item_attributes(tmp_path: Path) -> None:
    seqs = tmp_path / "seqs.txt"
    seqs.write_text("".join(f"u{u} " + " ".join(f"i{(u + k) % 9}" for k in range(6)) + "\n" for u in range(8)))
    (tmp_path / "attrs.json").symlink_to(seqs)
    with pytest.raises(DataError, match="input .*seqs.txt and --item-attributes .*attrs.json are the same file"):
        preprocess_behaviour(seqs, tmp_path / "out", format="s3rec", item_attributes=tmp_path / "attrs.json")


# ---- physical line numbers -----------------------------------------------------------------------------------
def test_table_preprocessing_names_the_physical_line_after_a_multiline_field(tmp_path: Path) -> None:
    data = table_file(tmp_path / "t.csv", multiline_at=3, bad_at=20)  # row 20 is on line 23 (header, 2 lines)
    assert data.read_text().splitlines()[22].startswith("0,abc,")
    preprocess_table(data, spec_file(tmp_path / "s.yaml"), tmp_path / "out", split="1", max_bad_fraction=0.5)
    bad = Store(tmp_path / "out" / "train").stats["first_bad_lines"]
    assert [(b["line"], b["reason"]) for b in bad] == [(23, "dense 'x' is not a number")]


def test_predict_rows_keep_their_physical_lines(tmp_path: Path) -> None:
    data = table_file(tmp_path / "t.csv", n=8, multiline_at=1)
    text = data.read_text().replace("\n0,4,", "\n\n0,4,")  # a blank line before row 4 too
    data.write_text(text)
    pipe = FeaturePipeline.table(yaml.safe_load(spec_file(tmp_path / "s.yaml").read_text()))
    pipe.fit([{"y": i % 2, "x": i, "u": f"u{i}", "note": "n"} for i in range(4)])
    stats = ReadStats()
    lines = np.concatenate([c.lines for c in iter_raw(pipe, data, stats=stats)])
    physical = text.split("\n")
    starts = [i + 1 for i, ln in enumerate(physical) if ln[:2] in ("0,", "1,")]  # rows start with their label
    assert lines.tolist() == starts == [2, 3, 5, 6, 8, 9, 10, 11]
    assert stats.blank_lines == 1


def test_behaviour_names_the_physical_line_after_a_multiline_field(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.csv")
    lines = log.read_text().splitlines()
    user, item, _, time = lines[1].split(",")
    lines[1] = f'{user},{item},"c\nmore\nlines",{time}'  # an attribute on three lines
    lines[30] = lines[30].rsplit(",", 1)[0] + ",soon"  # a time that is not a number
    log.write_text("\n".join(lines) + "\n")
    want = 1 + lines.index(lines[30]) + 2  # the two extra physical lines of row 1
    assert log.read_text().splitlines()[want - 1].endswith(",soon")
    preprocess_behaviour(log, tmp_path / "out", time_col="time", attr_cols=["cat"], max_bad_fraction=0.5)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [b["line"] for b in report["first_bad_lines"]] == [want]


# ---- rows whose fields are all empty -------------------------------------------------------------------------
def test_one_column_predict_scores_the_empty_row(tmp_path: Path) -> None:
    pipe = FeaturePipeline.table({"label": "y", "sparse": ["u"]}).fit([{"y": i % 2, "u": f"u{i % 3}"}
                                                                        for i in range(10)])
    data = tmp_path / "u.csv"
    data.write_text("u\nu1\n\nu2\n")  # line 3: the row whose only field (u) is empty
    stats = ReadStats()
    chunks = list(iter_raw(pipe, data, stats=stats))
    assert np.concatenate([c.lines for c in chunks]).tolist() == [2, 3, 4]
    assert stats.blank_lines == 0
    enc = pipe.transform(chunks[0].columns, lines=chunks[0].lines)
    assert len(enc["label"] if "label" in enc else enc["u"]) == 3  # three rows scored, the empty one included


def test_criteo_predict_reads_a_block_of_all_empty_rows(tmp_path: Path) -> None:
    pipe = FeaturePipeline.criteo().fit([{"label": 1, **{f"I{j}": j for j in range(1, 14)},
                                          **{f"C{j}": "68fd1e64" for j in range(1, 27)}}])
    data = tmp_path / "empty_rows.tsv"
    data.write_text(("\t" * 38 + "\n") * 3)  # three unlabelled rows, every field missing
    stats = ReadStats()
    lines = np.concatenate([c.lines for c in iter_raw(pipe, data, stats=stats)])
    assert lines.tolist() == [1, 2, 3] and stats.blank_lines == 0
