"""The planner's baseline is TorchRec's own plan of the user's inputs
(:class:`~torchrec_dreamshard.planner.stages.candidates.TorchRecOwnPlan`): found in the memory
TorchRec counts and offered to the safety net (the partitioner's memory rounds that fall
back to it are tested beside the others, in ``tests/test_planner.py``); and the benchmarks'
check of a plan against TorchRec's storage estimate."""

from __future__ import annotations

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.planner import DreamShardPlanner
from torchrec_dreamshard.planner.adapters.task_inputs import task_inputs
from torchrec_dreamshard.planner.adapters.torchrec_adapter import quiet_torchrec
from torchrec_dreamshard.planner.stages.candidates import (
    TORCHREC_CANDIDATE,
    TorchRecOwnPlan,
    torchrec_placement,
)

from harness.default_planning import (
    task_placement,
    whole_table_constraints,
)
from harness.task_draws import roster


def _planned(task: Task, tmp_path) -> DreamShardPlanner:
    """``DreamShardPlanner`` on ``task``'s whole tables, nothing measured."""
    inputs = task_inputs(task)
    arguments = inputs.planner_arguments()
    arguments["constraints"] = whole_table_constraints(inputs)
    planner = DreamShardPlanner(**arguments, measure=False, cache_dir=tmp_path)
    with quiet_torchrec():
        planner.plan(inputs.model, [EmbeddingBagCollectionSharder()])
    return planner


def _own(planner: DreamShardPlanner) -> TorchRecOwnPlan:
    (own,) = [s for s in planner.partitioner.placer.how.sources if isinstance(s, TorchRecOwnPlan)]
    return own


def test_the_baseline_on_wide_tables_is_torchrecs_own_plan(tmp_path):
    """On the held-out ``wide`` task (tables of up to 316 MB on 375 MB devices) TorchRec's
    planner run in the policy's memory view (each device's share scaled to weights) found
    no plan, and the old candidate fell back to counting weights, another plan. The
    planner's baseline, as the safety net weighed it, is now TorchRec's plan as it ships."""
    [(_, task)] = roster(["wide"], 1)
    shipped = torchrec_placement(task, accounting="torchrec")
    planner = _planned(task, tmp_path)
    [(names, remembered)] = _own(planner).plans.items()
    assert task_placement(task, dict(zip(names, remembered, strict=True))) == shipped
    report = planner.partitioner.last_report
    [offered] = [c for c in report.candidates if c.name == TORCHREC_CANDIDATE and not c.refined]
    by_name = dict(zip(names, (int(d) for d in offered.placement), strict=True))
    assert task_placement(task, by_name) == shipped


def test_the_heuristics_are_judged_within_torchrecs_storage_estimate():
    """The benchmarks' check of a plan against TorchRec's storage estimate: every table
    counts at least its weights, TorchRec's own plan (nothing reserved) passes, and the
    weights-only size heuristic's plan of ``wide`` does not: what the default planner,
    bound by TorchRec's estimate, may not plan."""
    from torchrec_dreamshard.policy.heuristics import HEURISTICS, proxy_greedy

    from harness.default_planning import (
        fits_torchrec_storage,
        torchrec_table_storage,
    )

    [(_, task)] = roster(["wide"], 1)
    storage = torchrec_table_storage(task)
    assert all(s > t.size_bytes for s, t in zip(storage, task.tables, strict=True))
    own = torchrec_placement(task, accounting="unreserved")
    assert fits_torchrec_storage(task, own, storage)
    fits = {
        name: fits_torchrec_storage(task, proxy_greedy(task, proxy), storage)
        for name, proxy in HEURISTICS.items()
    }
    assert not all(fits.values()), fits
