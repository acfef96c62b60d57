"""Physical line numbers of CSV records, found while pyarrow reads the file (no second pass).

pyarrow numbers the rows of a CSV by record (a quoted field may hold newlines, so one record can span several
lines) and skips blank lines without a word; an error must name the line a user sees in an editor.
:class:`LineStream` wraps the (decompressed) byte stream pyarrow reads and scans every block it hands over:
newlines, quotes and blank lines, with numpy over whole blocks. It keeps, per record, where its first line
is, as a short list of breakpoints (record number, line - record number), so memory grows with the number of
blank lines and multi-line records in the part of the file not yet consumed, not with rows.

Quoting follows pyarrow's CSV parser (``"`` quotes, ``""`` inside a quoted field is a quote, a quote opens a
quoted field only at the start of a field; elsewhere it is a literal character). A block whose quotes are
all well-formed (every opening quote starts a field, every closing one ends it) is read by quote parity in
numpy; a block with a literal quote inside a field is read quote by quote (a Python loop over its quotes only).
Blank lines (``""`` or ``"\\r"`` outside quotes) are not records unless ``keep_blank`` (a one-column file,
where an empty line is a row whose only field is empty).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from ctrkit.errors import DataError

_NL, _CR, _QUOTE = 10, 13, 34
_BOM = b"\xef\xbb\xbf"


class LineStream:
    """A readable stream over ``path`` (decompressed by extension, as pyarrow does) that records where each
    CSV record starts. Give it to :func:`pyarrow.csv.open_csv` / ``read_csv``; then :meth:`lines_of` maps
    pyarrow's 1-based record numbers (the file's first line being record 1) to physical line numbers."""

    def __init__(self, path: str | Path, delimiter: str = ",", keep_blank: bool = False) -> None:
        if len(delimiter.encode()) != 1:
            raise DataError(f"CSV delimiter {delimiter!r} of {path}: give one ASCII character (e.g. ',' or '\\t')")
        self._f = pa.input_stream(str(path))
        self.closed = False
        self._delim = ord(delimiter)
        self._keep_blank = keep_blank
        self._carry = b""  # bytes after the last newline seen: an incomplete line
        self._line0 = 0  # physical lines before the carry
        self._records = 0  # records started before the carry
        self._in_quote = False  # state at the start of the carry
        self._start = True  # the carry starts the file
        self.blank_lines = 0  # blank lines skipped (not records)
        self._brec = [np.zeros(1, np.int64)]  # breakpoints: from record brec[i] on, line = record + bdelta[i]
        self._bdelta = [np.zeros(1, np.int64)]

    # ---- the stream pyarrow reads -------------------------------------------------------------------------
    def read(self, nbytes: int = -1) -> bytes:
        data = self._f.read(nbytes) if nbytes is not None and nbytes >= 0 else self._f.read()
        self._scan(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._f.close()

    def __enter__(self) -> LineStream:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- record -> line ------------------------------------------------------------------------------------
    def lines_of(self, records: np.ndarray) -> np.ndarray:
        """Physical 1-based line numbers of pyarrow's 1-based ``records`` (each already read)."""
        records = np.asarray(records, np.int64)
        brec, bdelta = self._breakpoints()
        return records + bdelta[np.searchsorted(brec, records, side="right") - 1]

    def forget_before(self, record: int) -> None:
        """Drop what only records before ``record`` need (they were consumed): bounded memory."""
        brec, bdelta = self._breakpoints()
        i = max(int(np.searchsorted(brec, record, side="right")) - 1, 0)
        self._brec, self._bdelta = [brec[i:]], [bdelta[i:]]

    def _breakpoints(self) -> tuple[np.ndarray, np.ndarray]:
        if len(self._brec) > 1:
            self._brec, self._bdelta = [np.concatenate(self._brec)], [np.concatenate(self._bdelta)]
        return self._brec[0], self._bdelta[0]

    # ---- the scan ------------------------------------------------------------------------------------------
    def _scan(self, data: bytes) -> None:
        buf = self._carry + data
        eof = not data
        end = len(buf) if eof else buf.rfind(b"\n") + 1
        if end <= 0:
            self._carry = buf
            return
        self._block(np.frombuffer(buf, np.uint8, count=end), eof)
        self._carry = buf[end:]

    def _block(self, a: np.ndarray, eof: bool) -> None:
        """Account for the complete lines ``a`` (ending with a newline, or at the end of the file)."""
        nl = np.flatnonzero(a == _NL)
        starts = np.concatenate([[0], nl + 1])
        if not eof or (len(nl) and nl[-1] == len(a) - 1):
            starts = starts[:-1]  # the position after the last newline starts the next block
        ends = np.append(nl, len(a))[: len(starts)]
        inside = self._inside(a, np.append(starts, len(a)))
        at_start, self._in_quote = inside[:-1], bool(inside[-1])
        length = ends - starts
        blank = (length == 0) | ((length == 1) & (a[np.minimum(starts, len(a) - 1)] == _CR))
        blank &= ~at_start
        if not self._keep_blank:
            self.blank_lines += int(blank.sum())
        first = ~at_start & (self._keep_blank | ~blank)  # lines that start a record
        line = self._line0 + 1 + np.flatnonzero(first)  # (m,) 1-based lines of the records started here
        delta = line - (self._records + 1 + np.arange(len(line)))
        if len(delta):
            last = self._bdelta[-1][-1]
            change = np.flatnonzero(np.diff(delta, prepend=last) != 0)
            if len(change):
                self._brec.append(self._records + 1 + change)
                self._bdelta.append(delta[change])
        self._records += len(line)
        self._line0 += len(starts)
        self._start = False

    def _inside(self, a: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Whether each position of ``pos`` (sorted) is inside a quoted field."""
        q = np.flatnonzero(a == _QUOTE)
        if not len(q):
            return np.full(len(pos), self._in_quote)
        opening = (np.arange(len(q)) + self._in_quote) % 2 == 0  # by parity
        prev = a[np.maximum(q - 1, 0)]
        prev[q == 0] = _NL  # a block starts a line
        if self._start:
            prev[q == (3 if a[:3].tobytes() == _BOM else 0)] = _NL  # pyarrow drops a byte-order mark
        nxt = a[np.minimum(q + 1, len(a) - 1)]
        nxt[q + 1 >= len(a)] = _NL  # the end of the file ends a field
        bounds = (self._delim, _NL, _CR, _QUOTE)
        well_formed = np.where(opening, np.isin(prev, bounds), np.isin(nxt, bounds))
        if well_formed.all():
            return self._in_quote ^ (np.searchsorted(q, pos, side="left") % 2 == 1)
        return self._inside_exact(q, prev, nxt, pos)

    def _inside_exact(self, q: np.ndarray, prev: np.ndarray, nxt: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """pyarrow's quote rules, quote by quote (blocks with a literal quote inside an unquoted field)."""
        toggles: list[int] = []  # positions where the state flips (after the quote)
        inside, skip = self._in_quote, False
        starts_field = np.isin(prev, (self._delim, _NL, _CR))
        for i, p in enumerate(q.tolist()):
            if skip:
                skip = False
            elif not inside:
                if starts_field[i]:
                    inside = True
                    toggles.append(p)
            elif nxt[i] == _QUOTE:
                skip = True  # "" inside a quoted field: a literal quote
            else:
                inside = False
                toggles.append(p)
        flips = np.searchsorted(np.array(toggles, np.int64), pos, side="left")
        return self._in_quote ^ (flips % 2 == 1)
