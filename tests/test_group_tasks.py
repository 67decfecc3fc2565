"""Group tasks pass the measuring gate (torchrec_dreamshard.measure.group_tasks), while the
job group's messaging itself (torchrec_dreamshard.ranks.job_group) knows nothing of it."""

from __future__ import annotations

import pytest

from torchrec_dreamshard.measure.gate import MeasuringForbidden, no_measuring
from torchrec_dreamshard.measure.group_tasks import run_on_group
from torchrec_dreamshard.ranks.job_group import JobGroup, call_on_group, group_task


@group_task
def _rank_of(group: JobGroup) -> int:
    return group.rank


def test_a_group_task_is_refused_where_nothing_may_be_measured():
    with no_measuring("the test's rule"), pytest.raises(MeasuringForbidden, match="run_on_group"):
        run_on_group(_rank_of)


def test_a_group_task_needs_a_driven_group_where_measuring_is_allowed():
    with pytest.raises(RuntimeError, match="needs a driven group"):
        run_on_group(_rank_of)
    with no_measuring("the messaging does not read the gate"):
        with pytest.raises(RuntimeError, match="needs a driven group"):
            call_on_group(_rank_of)
