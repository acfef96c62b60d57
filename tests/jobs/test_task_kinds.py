"""The task kind: one name per kind, the same in the model class, the run summary and export.json; the former
name of the ranking kind still read."""

from __future__ import annotations

import pytest

from ctrkit.errors import JobError
from ctrkit.jobs.tasks import TASK_KINDS, RankingKind, task_kind
from ctrkit.models.base import CTRModel, TwoTowerModel
from ctrkit.models.registry import get_model_class, list_models


def test_every_model_declares_a_kind_by_the_name_the_summary_writes() -> None:
    for name in list_models():
        kind = get_model_class(name).task_kind
        assert kind in TASK_KINDS and TASK_KINDS[kind].name == kind, name
    assert CTRModel.task_kind == "ranking" and TwoTowerModel.task_kind == "retrieval"


def test_the_former_name_ctr_reads_as_ranking() -> None:
    class Legacy(CTRModel):
        task_kind = "ctr"

    class Unknown(CTRModel):
        task_kind = "regression"

    assert isinstance(task_kind(Legacy()), RankingKind)
    with pytest.raises(JobError, match="task_kind='regression'"):
        task_kind(Unknown())
