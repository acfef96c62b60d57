"""Raw categorical values -> the key arrays a vocabulary holds (integers or strings, with a missing mask) and the
fixed 64-bit hash of keys that hash-mode vocabularies bucket by (:mod:`ctrkit.data.pipeline.vocab`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctrkit.data.pipeline.rows import splitmix64


@dataclass(frozen=True)
class CodedKeys:
    """A column of integer keys [n] held as ``uniques[codes]``: ``codes`` int64 [n] index ``uniques`` int64 [m], the
    distinct keys in first-appearance order (``pandas.factorize``'s output), each used by some row; a negative
    unique means missing. The Criteo block parser gives its categorical columns so (it hashes each value once,
    to find the distinct ones), and vocabularies then count and look up the m distinct keys, not the n rows."""

    codes: np.ndarray
    uniques: np.ndarray

    def __len__(self) -> int:
        return len(self.codes)

    def values(self) -> np.ndarray:
        """The keys row by row [n] (negative = missing)."""
        return self.uniques[self.codes]

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The keys of ``rows`` [r] as a plain array (the uniques of a subset would not all be used)."""
        return self.uniques[self.codes[rows]]


def hash_keys(keys: np.ndarray, seed: int = 0) -> np.ndarray:
    """Deterministic 64-bit hash per key -> uint64 [n]. Integers: SplitMix64(key ^ seed); strings:
    64-bit FNV-1a over the UTF-8 bytes (vectorised over keys, looping over byte positions)."""
    keys = np.asarray(keys)
    if keys.dtype.kind in "iu":
        return splitmix64(keys.astype(np.int64).view(np.uint64) ^ np.uint64(seed))
    b = np.char.encode(keys.astype(str), "utf-8") if keys.dtype.kind != "S" else keys
    width = b.dtype.itemsize
    mat = np.frombuffer(b.tobytes(), np.uint8).reshape(len(b), width) if len(b) else np.zeros((0, 1), np.uint8)
    h = np.full(len(b), 0xCBF29CE484222325 ^ seed, dtype=np.uint64)
    prime = np.uint64(0x100000001B3)
    for j in range(width):  # over byte positions, not rows
        col = mat[:, j].astype(np.uint64)
        live = col != 0
        h = np.where(live, (h ^ col) * prime, h)
    return h


def _as_key_array(values: Any, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Raw values (numpy or pyarrow) -> (numpy keys, missing mask or None). Nulls and, for strings, empty
    strings are missing."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        missing = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
        if kind == "str":
            values = pc.cast(values, pa.string()) if not pa.types.is_string(values.type) else values
            empty = pc.equal(pc.utf8_length(values), 0).fill_null(True).to_numpy(zero_copy_only=False)
            missing = empty if missing is None else (missing | empty)
            arr = values.fill_null("").to_numpy(zero_copy_only=False).astype(str)
        else:
            arr = values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        if missing is not None and not missing.any():
            missing = None
        return arr, missing
    arr = np.asarray(values)
    if kind == "str":
        arr = arr.astype(str)
        missing = arr == ""
        return arr, (missing if missing.any() else None)
    return arr.astype(np.int64, copy=False), None


def _integer_keys_of_text(values: Any) -> tuple[Any, np.ndarray | None]:
    """Values for an integer vocabulary: text holding an integer ("5", " 5 ") becomes that integer, empty
    text stays missing, any other text ("abc", "5.7") is returned as null with an ``unseen`` mask (id 1:
    it cannot be one of the integer keys). Non-text values pass unchanged (unseen None)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "OUS":
        values = pa.array(values, from_pandas=True)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array) or not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return values, None
    text = pc.utf8_trim_whitespace(values)
    is_int = pc.match_substring_regex(text, r"^[+-]?[0-9]{1,18}$").fill_null(False)
    filled = pc.equal(pc.utf8_length(text), 0).fill_null(True)  # null or empty: missing
    unseen = pc.and_(pc.invert(is_int), pc.invert(filled)).to_numpy(zero_copy_only=False)
    ints = pc.cast(pc.if_else(is_int, text, pa.scalar(None, text.type)), pa.int64())
    return ints, (unseen if unseen.any() else None)


def _one_chunk(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``pa.array`` of many strings may come back chunked (over 2 GiB of text, or millions of values in some
    pyarrow versions); dictionary encoding then yields one dictionary per chunk, so make it one array."""
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
