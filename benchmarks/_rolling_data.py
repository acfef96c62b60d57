"""The logs of benchmarks/incremental.py, in time order and cut into periods (weeks, days).

Each loader returns a :class:`Log`: one table of rows sorted by time (the columns a ``ctrkit preprocess table``
spec reads), the period of each row and the spec. Histories look back across periods (a row's history is what
its user did before it, on any earlier day), as a production log would hold them.

* MovieLens-100K (``movielens``): examples/make_movielens_csv.py's table (label = rating >= 4, user and item
  features, the user's 20 previous items) and examples/movielens_100k.yaml; period = week since the first
  rating (31 weeks, the last one partial).
* Taobao UserBehavior head (``taobao``): one row per behaviour of the official window (2017-11-25 .. 12-03,
  China time, UTC+8; the few rows outside it are dropped), label = the behaviour went past a page view (cart,
  fav or buy: about 10% of rows); features user, item, category, hour of day and the user's 20 previous items
  and their categories; period = day (9 days).
"""

from __future__ import annotations

import gzip
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import yaml

REPO = Path(__file__).resolve().parents[1]
WEEK, DAY, CHINA = 7 * 86400, 86400, 8 * 3600
TAOBAO_START, TAOBAO_DAYS = 1511539200, 9  # 2017-11-25 00:00 UTC+8; the dataset's 9 days
HISTORY = 20
TAOBAO_SPEC = {
    "label": "label",
    "group_id": "user_id",
    "sparse": [{"name": "user_id", "group": "user"}, {"name": "item_id", "group": "item"},
               {"name": "cate", "group": "item"}, {"name": "hour", "group": "context"}],
    "sequence": [{"name": "hist_items", "shares": "item_id", "max_len": HISTORY, "delimiter": "|", "pooling": "mean"},
                 {"name": "hist_cates", "shares": "cate", "max_len": HISTORY, "delimiter": "|", "pooling": "mean"}],
    "options": {"min_freq": 1},
}


@dataclass
class Log:
    """Rows sorted by time, ``period[i]`` the period of row i (0, 1, ...), and the spec that reads them."""

    name: str
    rows: pa.Table
    period: np.ndarray
    spec: Path
    unit: str

    def bounds(self, periods: int | None = None) -> np.ndarray:
        """Row offsets where periods 0, 1, ..., T-1 start, then the end: rows ``[b[k], b[k + 1])`` are period k."""
        n = int(self.period.max()) + 1 if periods is None else periods
        return np.searchsorted(self.period, np.arange(n + 1), side="left")


def _history(user: np.ndarray, values: np.ndarray) -> list[str]:
    """For rows sorted by (user, time): the user's up to HISTORY previous ``values``, oldest first, '|'-joined."""
    start = np.r_[0, np.flatnonzero(np.diff(user)) + 1]
    first = np.repeat(start, np.diff(np.r_[start, len(user)]))
    text = values.astype(str)
    return ["|".join(text[max(f, i - HISTORY):i]) for i, f in enumerate(first)]


def movielens(data: Path, work: Path) -> Log:
    sys.path.insert(0, str(REPO / "examples"))
    from make_movielens_csv import make_movielens_csv

    rows = pacsv.read_csv(make_movielens_csv(data, work / "ml100k.csv"))
    ts = rows["timestamp"].to_numpy()
    order = np.argsort(ts, kind="stable")
    week = (ts[order] - ts.min()) // WEEK
    return Log("movielens", rows.take(pa.array(order)), week, REPO / "examples" / "movielens_100k.yaml", "week")


def taobao(data: Path, work: Path) -> Log:
    with gzip.open(data / "UserBehavior_head.csv.gz", "rb") as f:
        raw = pacsv.read_csv(f, read_options=pacsv.ReadOptions(column_names=["user", "item", "cate", "type", "time"]))
    t = raw["time"].to_numpy()
    keep = (t >= TAOBAO_START) & (t < TAOBAO_START + TAOBAO_DAYS * DAY)
    raw = raw.filter(pa.array(keep))
    user, item, cate, t = (raw[c].to_numpy() for c in ("user", "item", "cate", "time"))
    by_user = np.lexsort((t, user))  # histories need each user's rows in time order
    user, item, cate, t = user[by_user], item[by_user], cate[by_user], t[by_user]
    label = pc.not_equal(raw["type"], "pv").to_numpy(zero_copy_only=False)[by_user].astype(np.int8)
    rows = pa.table({"label": label, "time": t, "user_id": user, "item_id": item, "cate": cate,
                     "hour": ((t + CHINA) % DAY) // 3600, "hist_items": _history(user, item),
                     "hist_cates": _history(user, cate)})
    order = np.argsort(t, kind="stable")
    spec = work / "taobao_spec.yaml"
    spec.write_text(yaml.safe_dump(TAOBAO_SPEC, sort_keys=False))
    return Log("taobao", rows.take(pa.array(order)), (t[order] - TAOBAO_START) // DAY, spec, "day")


LOADERS = {"movielens": ("movielens_100k", movielens), "taobao": ("taobao_userbehavior", taobao)}


def load(name: str, shared: Path, work: Path) -> Log:
    folder, loader = LOADERS[name]
    work.mkdir(parents=True, exist_ok=True)
    return loader(shared / folder, work)
