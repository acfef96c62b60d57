"""Behaviour logs of ratings (issue 27, 7): ``--rating-col --min-rating`` turns a rating into a click (value >=
threshold, as a table label's ``threshold``), and the summary line says how many valid / test users have no
train rows (their keys get group ids of their own)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from ctrkit.cli import main
from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.pipeline.vocab import GROUP_TABLE
from ctrkit.data.sources.behaviour import read_behaviour_log
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError


def _ratings_log(path, n_users=40, per_user=10, seed=0):
    """user,item,rating,time; ratings 1..5 drawn at random, a few malformed."""
    rng = np.random.default_rng(seed)
    lines, kept = ["user,item,rating,time"], 0
    for u in range(n_users):
        for t, i in enumerate(rng.choice(50, per_user, replace=False)):
            r = int(rng.integers(1, 6))
            kept += r >= 4
            lines.append(f"u{u},i{i},{r},{100 * u + t}")
    path.write_text("\n".join(lines) + "\n")
    return path, kept


def test_min_rating_keeps_the_rows_rated_at_least_it(tmp_path):
    path, kept = _ratings_log(tmp_path / "r.csv")
    blog = read_behaviour_log(path, time_col="time", rating_col="rating", min_rating=4)
    assert len(blog.user) == kept and blog.stats["rows_below_min_rating"] == 400 - kept
    assert len(read_behaviour_log(path, time_col="time").user) == 400  # without it, every row is a behaviour
    # the same rows as a reference filter of the file
    rows = [ln.split(",") for ln in path.read_text().splitlines()[1:]]
    want = sorted((u, i) for u, i, r, _ in rows if float(r) >= 4)
    got = sorted(zip(blog.user_keys.take(blog.user).to_pylist(), blog.item_keys.take(blog.item).to_pylist()))
    assert got == want


def test_rating_options_are_checked(tmp_path):
    path, _ = _ratings_log(tmp_path / "r.csv")
    with pytest.raises(DataError, match="--rating-col and --min-rating go together"):
        read_behaviour_log(path, rating_col="rating")
    with pytest.raises(DataError, match="--rating-col and --min-rating go together"):
        read_behaviour_log(path, min_rating=4)
    with pytest.raises(DataError, match="--min-rating nan must be a finite number"):
        read_behaviour_log(path, rating_col="rating", min_rating=float("nan"))
    with pytest.raises(DataError, match=r"no row has 'rating' >= --min-rating 6 \(the ratings read lie in \[1, 5\]\)"):
        read_behaviour_log(path, rating_col="rating", min_rating=6)
    with pytest.raises(DataError, match=r"columns \['stars'\] are not in the CSV header"):
        read_behaviour_log(path, rating_col="stars", min_rating=4)
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text().replace("u3,", "u3x,", 1).replace(",5,", ",five,", 1))
    blog = read_behaviour_log(bad, rating_col="rating", min_rating=4, max_bad_fraction=0.01)
    assert blog.stats["bad_rows"] == 1 and "rating 'rating'" in blog.stats["first_bad_lines"][0]["reason"]


def test_preprocess_behaviour_cli_with_ratings_and_held_out_users(tmp_path, caplog):
    path, kept = _ratings_log(tmp_path / "r.csv", n_users=60, per_user=6)
    out = tmp_path / "st"
    with caplog.at_level(logging.INFO, logger="ctrkit"):
        assert main(["preprocess", "behaviour", str(path), "--out", str(out), "--time-col", "time",
                     "--rating-col", "rating", "--min-rating", "4", "--negatives", "none"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["behaviours"] == kept and report["rows_below_min_rating"] == 360 - kept
    # users with 2-3 clicks have samples in valid / test only: counted, in the summary line too
    per_user = [sum(1 for ln in path.read_text().splitlines()[1:] if ln.startswith(f"u{u},")
                    and int(ln.split(",")[2]) >= 4) for u in range(60)]
    held = {"valid": sum(n == 3 for n in per_user), "test": sum(n in (2, 3) for n in per_user)}
    assert held["test"] > 0 and report["users_without_train_rows"] == held
    line = next(r.getMessage() for r in caplog.records if "users without train rows" in r.getMessage())
    assert f"users without train rows {held}" in line
    # their keys are in the group vocabulary, with ids of their own (not the hashed ids of unseen keys)
    group = load_pipeline(out / "test" / "pipeline").vocabs_[GROUP_TABLE]
    assert {f"u{u}" for u, n in enumerate(per_user) if n >= 2} <= set(group.keys.tolist())
    for split in ("valid", "test"):
        ids = np.asarray(Store(out / split)["group"])
        assert 2 <= ids.min() and ids.max() < group.size  # every user an id of the vocabulary, none hashed
