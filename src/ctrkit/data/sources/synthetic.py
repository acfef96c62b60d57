"""Synthetic Criteo-shaped data: 13 count features, 26 categorical features, a planted signal.

Rows look like the Criteo Kaggle (Display Advertising Challenge, "dac") log: a 0/1 label, 13 integer
counts I1..I13 (log-normal, some missing) and 26 categorical ids C1..C26 with the cardinalities of
the Kaggle set as used by DLRM / torchrec (``KAGGLE_CARDINALITIES``), optionally scaled down.

* ids are Zipf-like: rank r in [0, n) is drawn from a bounded power law with density ~ x^-a on
  [1, n + 1) by inverse CDF, ``x = (1 - u (1 - (n+1)^(1-a)))^(1/(1-a))``, ``r = floor(x) - 1``.
* counts are ``floor(exp(N(mu_j, sigma_j)))`` with a ``missing_rate`` fraction left empty.
* labels are Bernoulli(sigmoid(z)) with a planted logit
  ``z = b + sum_j w_j (ln(x_j + 3) - mu_j) / sigma_j + sum_f e_f(id_f)`` over a few dense columns
  and a few categorical columns, where ``e_f(id)`` is a fixed pseudo-random effect per (feature, id)
  (a hash, so it is the same in every chunk). The "world" (mu, sigma, w, b, effects) does not depend
  on ``seed``: data written with different seeds are train/test splits of one problem, and a model
  can reach a clearly better-than-chance AUC (the Bayes AUC, from the true logit, is about 0.82;
  the dense columns alone give about 0.64; the positive rate is about 0.24).

Output: raw Criteo TSV (``write_criteo_tsv``; categorical values as 8-hex-digit strings of a
bijective hash of the id, as in the real files) or a ctrkit store (``write_synthetic_store``; dense
already ``ln(x + 3)``, ids in [0, n), missing ids -> 0). Rows are generated in chunks of
``chunk_rows`` with generator ``default_rng([seed, chunk_index])``, so the content is a function of
(seed, chunk_rows, options) and identical across the two writers and ``synthetic_arrays``.
"""

from __future__ import annotations

import argparse
import gzip
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from ctrkit.data.pipeline.rows import ColumnSpec
from ctrkit.data.storage.store import StoreWriter, check_replaceable
from ctrkit.errors import DataError, StoreError
from ctrkit.io import atomic_file, make_dir
from ctrkit.schema import DenseFeature, Schema, SparseFeature
from ctrkit.typecheck import Bound, EmbeddingDim, NonNegativeInt, PositiveFloat, Seed, cli_type

log = logging.getLogger(__name__)

# Criteo Kaggle (dac) categorical cardinalities C1..C26, as in DLRM's bench/dlrm_s_criteo_kaggle.sh
# and torchrec's examples (KAGGLE_NUM_EMBEDDINGS_PER_FEATURE).
KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)
NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
SPARSE_NAMES = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]

# ---- the fixed "world" of the planted signal (independent of the data seed) -----------------------
_WORLD = np.random.default_rng(20240611)
_DENSE_MU = _WORLD.uniform(0.5, 4.0, NUM_DENSE)  # log-normal location of each count column
_DENSE_SIGMA = _WORLD.uniform(0.7, 1.6, NUM_DENSE)
_SIGNAL_DENSE = np.array([0, 2, 4, 7, 10])  # I1, I3, I5, I8, I11
_SIGNAL_DENSE_W = np.array([0.6, -0.5, 0.4, 0.35, -0.3])
_SIGNAL_SPARSE = np.array([0, 1, 5, 8, 13, 2])  # C1, C2, C6, C9, C14, C3
_SIGNAL_SPARSE_AMP = np.array([1.2, 1.0, 0.8, 0.6, 0.8, 1.0])  # effects uniform in [-amp, amp]
_BIAS = -1.25  # gives a positive rate near Criteo's ~0.25
_SALT = (np.arange(NUM_SPARSE, dtype=np.uint64) * np.uint64(0x85EBCA6B) + np.uint64(0x27D4EB2F)) & np.uint64(
    0xFFFFFFFF
)
_MAX_COUNT = 10**7


def scaled_cardinalities(
    scale: float = 1.0, max_cardinality: int | None = None, base: Sequence[int] = KAGGLE_CARDINALITIES
) -> list[int]:
    """``max(2, round(n * scale))`` for each base cardinality n, capped at ``max_cardinality``."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if max_cardinality is not None and max_cardinality < 2:
        raise ValueError(f"max_cardinality must be >= 2, got {max_cardinality}")
    out = [max(2, round(n * scale)) for n in base]
    if max_cardinality is not None:
        out = [min(n, int(max_cardinality)) for n in out]
    return out


def zipf_ids(rng: np.random.Generator, n_rows: int, cards: np.ndarray, a: float = 1.1) -> np.ndarray:
    """Bounded power-law ranks [n_rows, F] int64, column f in [0, cards[f]); rank 0 the most frequent."""
    cards = np.asarray(cards, dtype=np.float64)
    u = rng.random((n_rows, cards.size))  # (N, F)
    if abs(a - 1.0) < 1e-9:  # density 1/x: x = (n+1)^u
        x = np.exp(u * np.log(cards + 1.0))
    else:
        top = 1.0 - np.power(cards + 1.0, 1.0 - a)  # (F,)
        x = np.power(1.0 - u * top, 1.0 / (1.0 - a))
    r = np.floor(x).astype(np.int64) - 1
    np.clip(r, 0, cards.astype(np.int64) - 1, out=r)
    return r


def _id_hash(ids: np.ndarray, feature_index: np.ndarray) -> np.ndarray:
    """Bijective 32-bit hash of (id + 1) per feature: ``((id + 1) * 0x9E3779B1 + salt_f) mod 2^32``."""
    h = (ids.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B1) + _SALT[feature_index]
    return h & np.uint64(0xFFFFFFFF)


def _id_effect(ids: np.ndarray, feature_index: np.ndarray, amp: np.ndarray) -> np.ndarray:
    """Fixed effect per (feature, id), uniform in [-amp, amp]; a hash so every chunk agrees."""
    h = _id_hash(ids, feature_index)
    h = (h ^ (h >> np.uint64(15))) * np.uint64(0x2C1B3C6D) & np.uint64(0xFFFFFFFF)
    h = h ^ (h >> np.uint64(12))
    u = (h & np.uint64(0xFFFFFF)).astype(np.float64) / float(1 << 24)
    return (2.0 * u - 1.0) * amp


class _Block:
    """One generated chunk. counts int64 [n, 13] (0 where missing), dense_missing bool [n, 13],
    ids int64 [n, 26] (0 where missing), sparse_missing bool [n, 26], labels int8 [n]."""

    def __init__(self, counts, dense_missing, ids, sparse_missing, labels) -> None:
        self.counts, self.dense_missing = counts, dense_missing
        self.ids, self.sparse_missing, self.labels = ids, sparse_missing, labels

    def dense(self) -> np.ndarray:
        """ln(x + 3) with missing -> 0 (seed 000 §3.3), float32 [n, 13]."""
        return np.log(self.counts.astype(np.float64) + 3.0).astype(np.float32)


def _generate(
    rng: np.random.Generator, n: int, cards: np.ndarray, missing_rate: float, sparse_missing_rate: float,
    zipf_a: float,
) -> _Block:
    counts = np.floor(np.exp(rng.normal(_DENSE_MU, _DENSE_SIGMA, (n, NUM_DENSE)))).astype(np.int64)
    np.minimum(counts, _MAX_COUNT, out=counts)
    dense_missing = rng.random((n, NUM_DENSE)) < missing_rate
    counts[dense_missing] = 0
    ids = zipf_ids(rng, n, cards, zipf_a)
    sparse_missing = rng.random((n, NUM_SPARSE)) < sparse_missing_rate
    ids[sparse_missing] = 0
    # planted logit
    t = np.log(counts[:, _SIGNAL_DENSE] + 3.0)  # (n, 5)
    z = _BIAS + ((t - _DENSE_MU[_SIGNAL_DENSE]) / _DENSE_SIGMA[_SIGNAL_DENSE]) @ _SIGNAL_DENSE_W
    eff = _id_effect(ids[:, _SIGNAL_SPARSE], _SIGNAL_SPARSE, _SIGNAL_SPARSE_AMP)  # (n, 6)
    eff[sparse_missing[:, _SIGNAL_SPARSE]] = 0.0
    z = z + eff.sum(1)
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.int8)
    return _Block(counts, dense_missing, ids, sparse_missing, labels)


def _blocks(
    n_rows: int, seed: int, cards: Sequence[int], chunk_rows: int, missing_rate: float,
    sparse_missing_rate: float, zipf_a: float,
) -> Iterator[_Block]:
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if len(cards) != NUM_SPARSE:
        raise ValueError(f"need {NUM_SPARSE} cardinalities, got {len(cards)}")
    if not (0.0 <= missing_rate < 1.0 and 0.0 <= sparse_missing_rate < 1.0):
        raise ValueError("missing_rate and sparse_missing_rate must be in [0, 1)")
    c = np.asarray(cards, dtype=np.int64)
    for k, start in enumerate(range(0, n_rows, chunk_rows)):
        rng = np.random.default_rng([seed, k])
        yield _generate(rng, min(chunk_rows, n_rows - start), c, missing_rate, sparse_missing_rate, zipf_a)


def synthetic_arrays(
    n_rows: int, seed: int = 0, cards: Sequence[int] | None = None, *, missing_rate: float = 0.1,
    sparse_missing_rate: float = 0.02, zipf_a: float = 1.1, chunk_rows: int = 1 << 17,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """In-memory rows: (dense float32 [N, 13] = ln(x + 3), sparse int64 [N, 26] ids in [0, card),
    labels float32 [N]). Same content as ``write_synthetic_store`` with the same arguments."""
    cards = list(KAGGLE_CARDINALITIES) if cards is None else list(cards)
    blocks = list(_blocks(n_rows, seed, cards, chunk_rows, missing_rate, sparse_missing_rate, zipf_a))
    if not blocks:
        return (np.zeros((0, NUM_DENSE), np.float32), np.zeros((0, NUM_SPARSE), np.int64), np.zeros(0, np.float32))
    dense = np.concatenate([b.dense() for b in blocks])
    sparse = np.concatenate([b.ids for b in blocks])
    labels = np.concatenate([b.labels for b in blocks]).astype(np.float32)
    return dense, sparse, labels


# ---- writers ------------------------------------------------------------------------------------
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_SHIFTS = np.arange(28, -1, -4, dtype=np.uint64)


def _hex_column(h: np.ndarray, missing: np.ndarray) -> pa.Array:
    """uint64 hashes [n] (< 2^32) -> pyarrow string array of 8 lower-case hex digits, null where missing."""
    n = h.shape[0]
    digits = _HEX[((h[:, None] >> _SHIFTS) & np.uint64(0xF)).astype(np.intp)]  # (n, 8) uint8
    offsets = np.arange(0, 8 * n + 1, 8, dtype=np.int32)
    valid = np.packbits(~missing, bitorder="little")
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(digits)), pa.py_buffer(valid),
        int(missing.sum()),
    )


def _tsv_table(b: _Block) -> pa.Table:
    cols: list[pa.Array] = [pa.array(b.labels.astype(np.int64))]
    for j in range(NUM_DENSE):
        cols.append(pa.array(b.counts[:, j], mask=b.dense_missing[:, j]))
    h = _id_hash(b.ids, np.arange(NUM_SPARSE))  # (n, 26)
    for f in range(NUM_SPARSE):
        cols.append(_hex_column(np.ascontiguousarray(h[:, f]), b.sparse_missing[:, f]))
    return pa.Table.from_arrays(cols, names=["label", *DENSE_NAMES, *SPARSE_NAMES])


def write_criteo_tsv(
    path: str | Path, n_rows: int, *, seed: int = 0, scale: float = 1.0, max_cardinality: int | None = None,
    missing_rate: float = 0.1, sparse_missing_rate: float = 0.02, zipf_a: float = 1.1, chunk_rows: int = 1 << 17,
    overwrite: bool = False,
) -> Path:
    """Write raw Criteo TSV rows: ``label \\t I1..I13 \\t C1..C26``, missing values empty, categorical
    values 8 hex digits; gzip-compressed when ``path`` ends with ``.gz``. No header (like Criteo).

    An existing file is replaced only with ``overwrite``; a directory never. The rows go to a temporary
    sibling renamed into place at the end, so a failure or Ctrl-C leaves no partial file."""
    path = Path(path)
    if path.is_dir():
        raise StoreError(f"output {path} is a directory; a TSV output is a file path ending in .tsv or .gz "
                         "(or pass --format store to write a store there)")
    check_replaceable(path, overwrite)
    make_dir(path.parent)
    cards = scaled_cardinalities(scale, max_cardinality)
    opts = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with atomic_file(path) as tmp, open(tmp, "wb") as raw:
        sink = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) if path.suffix == ".gz" else raw
        for b in _blocks(n_rows, seed, cards, chunk_rows, missing_rate, sparse_missing_rate, zipf_a):
            pacsv.write_csv(_tsv_table(b), sink, opts)
        if sink is not raw:
            sink.close()
    log.info("wrote %d synthetic Criteo rows to %s", n_rows, path)
    return path


def synthetic_schema(cards: Sequence[int], embedding_dim: int | str = "auto") -> Schema:
    """Schema of a synthetic store: I1..I13 dense, C1..C26 sparse with the cardinalities as vocab sizes."""
    return Schema(
        dense=[DenseFeature(n) for n in DENSE_NAMES],
        sparse=[SparseFeature(n, int(c), embedding_dim) for n, c in zip(SPARSE_NAMES, cards)],
        label="label",
    )


def write_synthetic_store(
    path: str | Path, n_rows: int, *, seed: int = 0, scale: float = 1.0, max_cardinality: int | None = None,
    missing_rate: float = 0.1, sparse_missing_rate: float = 0.02, zipf_a: float = 1.1, chunk_rows: int = 1 << 17,
    embedding_dim: int | str = "auto", overwrite: bool = False,
) -> Path:
    """Write a ctrkit store directly: label float32, I1..I13 float32 (already ln(x + 3)), C1..C26 int32
    ids in [0, card) (missing -> 0), schema vocab sizes = the (scaled) cardinalities."""
    cards = scaled_cardinalities(scale, max_cardinality)
    schema = synthetic_schema(cards, embedding_dim)
    specs = [ColumnSpec("label", "label", "<f4")]
    specs += [ColumnSpec(n, "dense", "<f4") for n in DENSE_NAMES]
    specs += [ColumnSpec(n, "sparse", "<i4") for n in SPARSE_NAMES]
    positives = 0
    with StoreWriter(path, schema, specs, overwrite=overwrite) as w:
        for b in _blocks(n_rows, seed, cards, chunk_rows, missing_rate, sparse_missing_rate, zipf_a):
            dense = b.dense()
            ids = b.ids.astype(np.int32)
            chunk = {"label": b.labels.astype(np.float32)}
            chunk.update({n: dense[:, j] for j, n in enumerate(DENSE_NAMES)})
            chunk.update({n: ids[:, f] for f, n in enumerate(SPARSE_NAMES)})
            w.append(chunk)
            positives += int(b.labels.sum())
        w.set_meta(
            preprocessing={
                "source": "synthetic", "seed": seed, "scale": scale, "max_cardinality": max_cardinality,
                "missing_rate": missing_rate, "sparse_missing_rate": sparse_missing_rate, "zipf_a": zipf_a,
                "chunk_rows": chunk_rows, "dense_transform": "ln(x+3)",
            },
            stats={"rows": n_rows, "positive_rate": positives / max(n_rows, 1)},
        )
    log.info("wrote synthetic store %s (%d rows)", path, n_rows)
    return Path(path)


# ---- CLI helpers (wired as `ctrkit synth` by cli.py) --------------------------------------------
TSV_SUFFIXES = (".tsv", ".gz")  # x.tsv, x.tsv.gz and Criteo's day files (day_0.gz)


def output_format(out: str | Path) -> str:
    """"tsv" when ``out`` names a Criteo TSV file (ends in .tsv or .gz; gzip-compressed when .gz), else "store"."""
    return "tsv" if Path(out).name.endswith(TSV_SUFFIXES) else "store"


def add_synth_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--rows", type=cli_type(NonNegativeInt), required=True,
                        help="number of rows to generate")
    parser.add_argument("--out", required=True,
                        help="output path: a Criteo TSV file when it ends in .tsv or .gz (gzip-compressed when .gz: "
                             "x.tsv.gz, day_0.gz), else a store directory")
    parser.add_argument("--format", choices=("tsv", "store"), default=None,
                        help="raw Criteo TSV or a store, whatever --out is called (default: from --out's suffix)")
    parser.add_argument("--seed", type=cli_type(Seed), default=0,
                        help="row sampling seed (the planted signal is fixed)")
    parser.add_argument("--scale", type=cli_type(PositiveFloat), default=1.0,
                        help="multiply the Kaggle cardinalities by this")
    parser.add_argument("--max-cardinality", type=cli_type(Annotated[int, Bound(lo=2)]), default=None,
                        help="cap every cardinality at this")
    parser.add_argument("--embedding-dim", type=cli_type(EmbeddingDim), default=None,
                        help="the store schema's embedding dim of every table: an integer or 'auto' (default; a "
                             "model may choose its own with model.params.embedding_dim)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output (a TSV file, or a store directory)")
    return parser


def _dim(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}")
    return value


def run_synth(args: argparse.Namespace) -> Path:
    """``ctrkit synth``: an existing ``--out`` (a file, or a non-empty directory) needs ``--overwrite``."""
    fmt = args.format or output_format(args.out)
    overwrite = getattr(args, "overwrite", False)
    if args.rows < 0:
        raise DataError(f"--rows must be >= 0, got {args.rows}")
    try:
        scaled_cardinalities(args.scale, args.max_cardinality)
    except ValueError as e:
        raise DataError(f"--scale / --max-cardinality: {e}") from None
    dim = getattr(args, "embedding_dim", None)
    if fmt == "tsv":
        if dim is not None:
            raise DataError("--embedding-dim goes with a store; a TSV has no schema (preprocess it with "
                            "`ctrkit preprocess criteo --embedding-dim`)")
        return write_criteo_tsv(args.out, args.rows, seed=args.seed, scale=args.scale,
                                max_cardinality=args.max_cardinality, overwrite=overwrite)
    return write_synthetic_store(args.out, args.rows, seed=args.seed, scale=args.scale,
                                 max_cardinality=args.max_cardinality, overwrite=overwrite,
                                 embedding_dim=dim if dim is not None else "auto")
