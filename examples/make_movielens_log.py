"""Write MovieLens-100K as a behaviour log (one row per rating) for ``ctrkit preprocess behaviour``.

    python examples/make_movielens_log.py [--data ../shared/data/movielens_100k] [--out ml100k_log.csv]
    ctrkit preprocess behaviour --input ml100k_log.csv --attr-cols genre:cate --time-col time \\
        --negatives none --example-age --out stores/ml100k_retrieval

Columns: user, item (MovieLens ids), genre (the item's first flagged genre in u.genre's order; empty if it
has none) and time (the rating's Unix timestamp, seconds). Every rating counts as a behaviour, whatever its
value (the implicit-feedback reading of MovieLens used by retrieval models); rows keep u.data's order, the
builder sorts them by (user, time). MovieLens is GroupLens research data: research use only, do not
redistribute (the CSV is written outside the repository).
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens_100k"
N_GENRES = 19  # u.item ends with one 0/1 flag per genre of u.genre


def item_genres(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """u.item + u.genre -> (item ids [I], first flagged genre name per item [I], '' when none)."""
    names = [ln.split("|")[0] for ln in (data_dir / "u.genre").read_text(encoding="latin-1").splitlines()
             if ln.strip()]
    if len(names) != N_GENRES:
        raise ValueError(f"{data_dir / 'u.genre'}: expected {N_GENRES} genres, found {len(names)}")
    rows = [ln.split("|") for ln in (data_dir / "u.item").read_text(encoding="latin-1").splitlines()
            if ln.strip()]
    ids = np.array([int(r[0]) for r in rows], np.int64)  # (I,)
    flags = np.array([r[-N_GENRES:] for r in rows], np.int8)  # (I, 19)
    first = np.argmax(flags, axis=1)  # (I,) the first flag set (0 when none: checked below)
    genre = np.where(flags.any(axis=1), np.array(names, object)[first], "")
    return ids, genre


def make_movielens_log(data_dir: str | Path = DEFAULT_DATA, out: str | Path = "ml100k_log.csv") -> Path:
    """u.data.gz + item genres -> CSV ``user,item,genre,time`` at ``out``; returns its path."""
    d = Path(data_dir)
    with gzip.open(d / "u.data.gz", "rt") as f:
        r = np.loadtxt(f, dtype=np.int64, delimiter="\t")  # (n, 4) user, item, rating, time
    ids, genre = item_genres(d)
    order = np.argsort(ids)
    pos = np.minimum(np.searchsorted(ids[order], r[:, 1]), len(ids) - 1)  # (n,) each rating's item in u.item
    if not np.array_equal(ids[order][pos], r[:, 1]):
        raise ValueError(f"{d / 'u.data.gz'}: rates items that are not in {d / 'u.item'}")
    table = pa.table({"user": r[:, 0], "item": r[:, 1], "genre": genre[order][pos].astype(str),
                      "time": r[:, 3]})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(table, out)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="the MovieLens-100K folder (u.data.gz, u.item)")
    ap.add_argument("--out", default="ml100k_log.csv", help="the CSV to write")
    a = ap.parse_args()
    print(make_movielens_log(a.data, a.out))
