"""Physical line numbers of CSV rows (:mod:`ctrkit.data.sources.csv_lines`): rows after a quoted field that
holds newlines, after blank lines and after literal quotes keep the line a user sees in an editor. The reference
is Python's csv module (its ``line_num``); pyarrow's record count is checked against the same file."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrkit.data.sources.csv_lines import LineStream

plain = st.text(alphabet='ab "', max_size=4).filter(lambda s: not s.startswith('"'))  # a quote inside: literal
quoted = st.text(alphabet='ab,\n"', max_size=5).map(lambda s: '"' + s.replace('"', '""') + '"')
rows = st.lists(st.lists(st.one_of(plain, quoted), min_size=2, max_size=2), min_size=1, max_size=12)


def reference_lines(text: str, keep_blank: bool) -> list[int]:
    """The first physical line of every record (blank lines only when ``keep_blank``), by Python's csv."""
    out, before = [], 0
    reader = csv.reader(io.StringIO(text, newline=""))
    for rec in reader:
        if rec or keep_blank:
            out.append(before + 1)
        before = reader.line_num
    return out


def scanned_lines(path: Path, n_records: int, block: int, keep_blank: bool = False) -> np.ndarray:
    with LineStream(path, keep_blank=keep_blank) as s:
        while s.read(block):
            pass
        return s.lines_of(np.arange(1, n_records + 1))


def write_rows(path: Path, records: list[list[str]], newline: str, blank_after: set[int]) -> str:
    lines = ["h1,h2"]
    for i, r in enumerate(records):
        lines.append(",".join(r))
        if i in blank_after:
            lines.append("")
    text = newline.join(lines) + newline
    path.write_bytes(text.encode())
    return text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=rows, newline=st.sampled_from(["\n", "\r\n"]), blank=st.sets(st.integers(0, 11), max_size=3),
       block=st.sampled_from([1, 3, 7, 64, 1 << 20]))
def test_lines_match_python_csv_and_pyarrow_records(tmp_path: Path, records, newline, blank, block) -> None:
    path = tmp_path / "x.csv"
    text = write_rows(path, records, newline, blank)
    want = reference_lines(text, keep_blank=False)
    assert len(want) == len(records) + 1  # the header and every row (the reference parses what we wrote)
    got = scanned_lines(path, len(want), block)
    np.testing.assert_array_equal(got, want)
    table = pacsv.read_csv(LineStream(path), read_options=pacsv.ReadOptions(use_threads=False))
    assert table.num_rows == len(records)  # pyarrow counts the same records


def test_rows_after_a_multiline_field_keep_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text('a,b\n1,"two\nlines"\n\n2,"x ""q""\n\ny"\n3,ab"c\n4,5\n')
    # records: header (1), 1 (2-3), blank (4), 2 (5-7), 3 (8), 4 (9)
    np.testing.assert_array_equal(scanned_lines(path, 5, 1 << 20), [1, 2, 5, 8, 9])
    with LineStream(path) as s:
        while s.read(5):
            pass
        assert s.blank_lines == 1  # the blank line inside the quoted field is part of a row


def test_one_column_blank_line_is_a_record(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("u\nu1\n\nu2\n")
    np.testing.assert_array_equal(scanned_lines(path, 4, 1 << 20, keep_blank=True), [1, 2, 3, 4])


def test_byte_order_mark_then_a_quoted_header(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(b'\xef\xbb\xbf"a\nb",c\n1,2\n')
    np.testing.assert_array_equal(scanned_lines(path, 2, 4), [1, 3])


def test_forget_keeps_later_records(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a\n" + "".join(f'"{i}\n"\n' for i in range(100)))
    with LineStream(path) as s:
        while s.read(17):
            pass
        s.forget_before(50)
        np.testing.assert_array_equal(s.lines_of(np.array([50, 101])), [2 + 2 * 48, 2 + 2 * 99])


def test_multi_character_delimiter_is_refused(tmp_path: Path) -> None:
    from ctrkit.errors import DataError
    path = tmp_path / "x.csv"
    path.write_text("a\n1\n")
    with pytest.raises(DataError, match="one ASCII character"):
        LineStream(path, "::")
