"""Write the MovieLens-100K CTR table (one row per rating) as a CSV for ``ctrkit preprocess table``.

    python examples/make_movielens_csv.py [--data ../shared/data/movielens_100k] [--out ml100k.csv]

Columns: label (rating >= 4), rating, timestamp, user_id, item_id, age, age_bucket, gender, occupation,
zip_prefix (first 3 characters), genres ("Action|Comedy"), year (release year, empty if unknown) and
hist_items (the user's up to 20 previously rated items, oldest first, "|"-separated). Rows are sorted
by (user, time). MovieLens is GroupLens research data: research use only, do not redistribute.
Schema: examples/movielens_100k.yaml.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "movielens_100k"
AGE_EDGES = np.array([18, 25, 35, 45, 50, 56])  # MovieLens-1M style age buckets
HISTORY = 20


def _read_pipe(path: Path, encoding: str = "latin-1") -> list[list[str]]:
    return [ln.split("|") for ln in path.read_text(encoding=encoding).splitlines() if ln.strip()]


def make_movielens_csv(data_dir: str | Path = DEFAULT_DATA, out: str | Path = "ml100k.csv") -> Path:
    """Join u.data with u.user and u.item and write the CSV -> its path."""
    d = Path(data_dir)
    with gzip.open(d / "u.data.gz", "rt") as f:
        r = np.loadtxt(f, dtype=np.int64, delimiter="\t")  # (100000, 4) user, item, rating, time
    order = np.lexsort((r[:, 3], r[:, 0]))
    r = r[order]
    users = {int(u[0]): u[1:] for u in _read_pipe(d / "u.user")}
    genres = [g[0] for g in _read_pipe(d / "u.genre")]
    items = {}
    for it in _read_pipe(d / "u.item"):
        flags = np.array(it[-19:], dtype=int)
        date = it[2]
        items[int(it[0])] = ("|".join(g for g, on in zip(genres, flags) if on), date[-4:] if date else "")
    uid, iid = r[:, 0], r[:, 1]
    age = np.array([int(users[u][0]) for u in uid])
    # history: items the same user rated before this row (rows are sorted by user, time)
    start = np.r_[0, np.flatnonzero(np.diff(uid)) + 1]
    first = np.repeat(start, np.diff(np.r_[start, len(uid)]))
    hist = ["|".join(map(str, iid[max(f, i - HISTORY):i])) for i, f in enumerate(first)]
    table = pa.table({
        "label": (r[:, 2] >= 4).astype(np.int8),
        "rating": r[:, 2],
        "timestamp": r[:, 3],
        "user_id": uid,
        "item_id": iid,
        "age": age,
        "age_bucket": np.searchsorted(AGE_EDGES, age, side="right"),
        "gender": [users[u][1] for u in uid],
        "occupation": [users[u][2] for u in uid],
        "zip_prefix": [users[u][3][:3] for u in uid],
        "genres": [items[i][0] for i in iid],
        "year": [items[i][1] for i in iid],
        "hist_items": hist,
    })
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(table, out)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--out", default="ml100k.csv")
    a = ap.parse_args()
    print(make_movielens_csv(a.data, a.out))
