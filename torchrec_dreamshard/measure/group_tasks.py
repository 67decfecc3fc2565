"""Measurements run on the distributed job's own group, through the measuring gate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchrec_dreamshard.measure.gate import check_may_measure
from torchrec_dreamshard.ranks.job_group import call_on_group


def run_on_group(fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run the group task ``fn(group, *args)`` on every rank of the driven group.

    Returns:
        Every rank's result, in rank order.

    Raises:
        MeasuringForbidden: the measuring gate is closed here.
        RuntimeError: no group is driven, or a rank's task failed.
    """
    check_may_measure("run_on_group")
    return call_on_group(fn, *args)
