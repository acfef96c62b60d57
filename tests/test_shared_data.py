"""The one way tests reach the shared data sets: ``$CTRKIT_SHARED_DATA`` or ../shared/data, skipped only when
the whole folder is absent, failing on a missing file."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, SHARED_DATA_VAR, find_shared, shared_data_root


def test_the_variable_names_the_folder_else_shared_data_beside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv(SHARED_DATA_VAR, raising=False)
    assert shared_data_root() == (REPO.parent / "shared" / "data", False)
    monkeypatch.setenv(SHARED_DATA_VAR, str(tmp_path))
    assert shared_data_root() == (tmp_path, True)


def test_a_file_in_the_folder_is_found(tmp_path):
    (tmp_path / "movielens_100k").mkdir()
    assert find_shared("movielens_100k", tmp_path, named=False) == tmp_path / "movielens_100k"


@pytest.mark.parametrize("named", [False, True])
def test_a_missing_file_in_an_existing_folder_fails(tmp_path, named):
    with pytest.raises(pytest.fail.Exception, match=r"movielens_100k is missing from the shared data folder"):
        find_shared("movielens_100k", tmp_path, named)


def test_an_absent_folder_skips_unless_the_variable_named_it(tmp_path):
    absent = tmp_path / "shared" / "data"
    with pytest.raises(pytest.skip.Exception, match=r"shared data folder .* absent \(set \$CTRKIT_SHARED_DATA"):
        find_shared("movielens_100k", absent, named=False)
    with pytest.raises(pytest.fail.Exception, match=r"\$CTRKIT_SHARED_DATA=.* is not a folder"):
        find_shared("movielens_100k", absent, named=True)


def test_no_test_or_benchmark_names_a_machine_path():
    files = [*(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]
    bad = [str(p.relative_to(REPO)) for p in files if p != Path(__file__) and "/work/" in p.read_text()]
    assert bad == []
