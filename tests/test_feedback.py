"""The job as the measurement: a 2-rank DMP job observes its steps, reports each rank's
predicted against measured embedding cost, learns from them and re-plans; the re-plan is
applied in place where it only moves table-wise tables (one such move forced where it
does not: the moved table's rows arrive on its new rank and the job trains on), and the
returned plan trains (the restart path). And a restarted job's plan learns from what was
observed.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchrec_dreamshard.feedback.observed_job_report import build_report
from torchrec_dreamshard.feedback.profiling import StepProfile, a2a_split, category
from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

STEPS = 45  # 8 sampled steps: the first after 5, then one in 5


def test_event_names_fall_in_their_categories():
    assert category("fbgemm::split_embedding_codegen_lookup_adagrad_function_pt2") == "fwd"
    assert category("fbgemm::split_embedding_codegen_forward_cpu") == "fwd"
    assert category("torch::autograd::CppNode<SplitLookupFunction_adagrad_Op_pt2>") == "bwd"
    assert category("fbgemm::split_embedding_backward_codegen_adagrad_cpu") == "bwd"
    assert category("gloo:all_to_all") == "a2a" and category("nccl:all_to_all") == "a2a"
    assert category("gloo:all_reduce") is None and category("aten::addmm") is None
    # data-parallel tables' dense kernel: apart, though its backward node is a SplitLookup
    assert category("fbgemm::dense_embedding_codegen_lookup_function") == "dp"
    assert category("torch::autograd::CppNode<(anonymous)::SplitLookupFunction_Dense_Op>") == "dp"


def test_a_data_parallel_tables_kernel_is_counted_apart_from_the_fused_kernel():
    """The dense kernel of data-parallel tables, profiled for real, forward and backward:
    none of it lands in the fused kernel's figures (what a re-plan learns from)."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        DenseTableBatchedEmbeddingBagsCodegen,
    )

    from torchrec_dreamshard.feedback.profiling import MARK, step_profile

    dense = DenseTableBatchedEmbeddingBagsCodegen([(1000, 16)], use_cpu=True)
    indices, offsets = torch.randint(0, 1000, (512,)), torch.arange(0, 513, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function(MARK):
            dense(indices, offsets).sum().backward()
    only_dense = step_profile(prof.events(), 10.0, 0.0)
    assert only_dense.dp_ms > 0
    assert only_dense.fwd_ms == 0 and only_dense.bwd_ms == 0


def test_an_all_to_all_is_its_last_start_to_its_first_end_and_the_rest_is_waiting():
    # rank 0 starts at t=0 and ends at 10 ms; rank 1 starts at 6 ms and ends at 10 ms
    split = a2a_split([[(0.0, 10.0)], [(0.006, 4.0)]])
    assert split[0] == pytest.approx((4.0, 6.0)) and split[1] == pytest.approx((4.0, 0.0))
    # sequences that differ: no pairing, every ms is the rank's own
    assert a2a_split([[(0.0, 1.0)], []]) == [(1.0, 0.0), (0.0, 0.0)]


def test_the_report_sets_each_rank_beside_its_prediction():
    from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction

    prediction = PlanPrediction([1.0, 2.0], [2.0, 4.0], [1.0, 1.0], [0.0, 0.0], 7.0, [1, 2])
    steps = [
        [StepProfile(20.0, 1.0, 2.0, [(0.0, 1.0)]), StepProfile(22.0, 1.2, 2.2, [(1.0, 1.0)])],
        [StepProfile(21.0, 2.0, 5.0, [(0.0, 1.0)]), StepProfile(23.0, 2.2, 5.4, [(1.0, 1.0)])],
    ]
    steps[1][1].dp_ms = 0.6  # a data-parallel table's dense kernel, counted in the embedding
    report = build_report(steps, prediction, [["t0"], ["t1", "t2"]], "checkpoint")
    json.dumps(report)  # plain JSON
    r0, r1 = report["ranks"]
    assert r0["measured"]["fwd_ms"] == pytest.approx(1.1) and r1["measured"]["bwd_ms"] == 5.2
    assert r0["measured_ms"] == pytest.approx(1.1 + 2.1 + 1.0)
    assert r1["measured"]["dp_ms"] == pytest.approx(0.3)  # median of 0 and 0.6
    assert r1["predicted_ms"] == 7.0
    assert r1["error"] == pytest.approx(7.0 / (2.1 + 5.2 + 1 + 0.3) - 1)
    assert report["bound_rank"] == 1 and report["predicted_bound_rank"] == 1
    assert report["steps_observed"] == 2 and r1["tables"] == ["t1", "t2"]


def test_sampling_keeps_its_cost_within_its_share_of_the_job():
    from torchrec_dreamshard.feedback.sampling import sampling_interval

    assert sampling_interval(0.0, 10.0, 20, 0.01) == 20  # free: the floor
    assert sampling_interval(1.0, 10.0, 20, 0.01) == 20  # 0.5% at one in 20
    assert sampling_interval(30.0, 3.0, 20, 0.01) == 1000  # 30 ms on 3 ms steps at 1%
    assert sampling_interval(30.0, 0.0, 20, 0.01) == 20  # no plain step yet


PLAIN_S = 2.0**-10  # a plain step on the test's clock (0.98 ms; powers of two add exactly)


def observed_steps(observer, clock, steps: int, sampled_extra_s: float, pause_s: float = 0.0):
    """``steps`` training steps on ``clock``: :data:`PLAIN_S` each, ``sampled_extra_s`` more
    where the step is sampled (the profiler recording it), and one pause of ``pause_s``
    inside the first sample after step 10 (an evaluation, a checkpoint). Returns whether
    it paused."""
    paused = False
    for _ in range(steps):
        clock.advance(PLAIN_S)
        if observer.sampling:
            clock.advance(sampled_extra_s)
            if pause_s and not paused and observer.steps > 10:
                clock.advance(pause_s)
                paused = True
        observer.step()
    observer.close()  # no sample left running under the next observer's profiler
    return paused


def test_the_observer_samples_less_often_where_sampling_is_dear(clock):
    """On a real one-rank group, the real profiler, and steps timed on the test's clock: a
    sampled step costs 8 plain steps more, far more than 0.1% of the job, so the observer
    spaces its samples to keep within it, and says what observing cost; unbounded, it keeps
    to ``every``. (What sampling costs on real steps is ``benchmarks/feedback.py``'s.)"""
    from types import SimpleNamespace

    from torchrec_dreamshard.feedback.observer import JobObserver
    from torchrec_dreamshard.feedback.sampling import sampling_interval

    extra_s = 8 * PLAIN_S  # below a pause's 10 plain steps: a sample, not a pause
    record = SimpleNamespace(plan=object(), prediction=object(), model=None)
    intervals, overheads, samples = [], [], []
    with local_process_group(0, 1, free_port()):
        for max_overhead in (0.001, None):
            observer = JobObserver(record, None, every=5, warmup=5, max_overhead=max_overhead)
            observer.sampler.clock = clock
            observed_steps(observer, clock, 120, extra_s)
            intervals.append(observer.interval)
            overheads.append(observer.overhead)
            samples.append(len(observer.profiles))
    assert observer.dropped == 0
    assert intervals == [sampling_interval(extra_s * 1e3, PLAIN_S * 1e3, 5, 0.001), 5]
    assert intervals[0] > 5000  # 8 plain steps' cost at 0.1%: one sample in 8000 steps
    # the cost said: every sample's extra over the job's plain steps
    for n, overhead in zip(samples, overheads, strict=True):
        total = 120 * PLAIN_S + n * extra_s  # the clock from the first step to the last
        plain = total - PLAIN_S - n * extra_s  # (the first step() starts the count)
        assert overhead == pytest.approx(n * extra_s / plain)
    assert samples[0] < samples[1] and overheads[0] < overheads[1]


def test_a_sample_that_spans_a_pause_is_dropped_not_counted(clock):
    """A sample left open across a pause (an evaluation, a checkpoint) is not one step:
    dropped, and its time is neither a sample's measure nor what sampling costs."""
    from types import SimpleNamespace

    from torchrec_dreamshard.feedback.observer import JobObserver

    extra_s = 4 * PLAIN_S
    record = SimpleNamespace(plan=object(), prediction=object(), model=None)
    with local_process_group(0, 1, free_port()):
        observer = JobObserver(record, None, every=5, warmup=5, max_overhead=None)
        observer.sampler.clock = clock
        paused = observed_steps(observer, clock, 40, extra_s, pause_s=0.5)
    assert paused and observer.dropped == 1
    profiles = observer.profiles
    assert len(profiles) >= 5  # one sample in about 6 steps, one dropped
    assert all(p.step_ms == pytest.approx((PLAIN_S + extra_s) * 1e3) for p in profiles)
    # each kept sample cost its extra; the dropped one, the median of those (not 500 ms)
    assert observer.sampling_ms == pytest.approx((len(profiles) + 1) * extra_s * 1e3)


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        result = observe_and_replan(rank, world)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


EBC = "model.sparse_arch.embedding_bag_collection"


def observe_and_replan(rank: int, world: int) -> dict:
    from conftest import CPU_DENSE_LIKE, GLOO_LIKE
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrun_job import LOCAL_BATCH, build_model, make_batch

    from torchrec_dreamshard import observe
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import torchrec_topology

    sharders = [EmbeddingBagCollectionSharder()]

    def run(dmp, opt, steps, observer=None, first=0) -> list[float]:
        losses = []
        for step in range(first, first + steps):
            loss, _ = dmp(make_batch(rank, step))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            if observer is not None:
                observer.step()
        return losses

    def train(plan, steps, observer=None):
        model = build_model()
        ebc = model.model.sparse_arch.embedding_bag_collection
        _apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.05})
        cpu = torch.device("cpu")
        # a copy: DMP keeps the plan it is given and its reshard rewrites it
        dmp = DistributedModelParallel(
            model, device=cpu, plan=copy.deepcopy(plan), sharders=sharders
        )
        dense = [p for n, p in dmp.named_parameters() if "embedding_bag" not in n]
        opt = torch.optim.SGD(dense, lr=0.05)
        observer = observer(dmp) if observer else None
        return run(dmp, opt, steps, observer), observer, dmp, opt

    planner = DreamShardPlanner(
        topology=torchrec_topology(world, "cpu"),
        batch_size=LOCAL_BATCH,
        calibrate=False,  # the bundled checkpoint as it is: the job teaches it this machine
        collectives=GLOO_LIKE,
        dense_kernel=CPU_DENSE_LIKE,
    )
    plan = planner.collective_plan(build_model(), sharders, dist.GroupMember.WORLD)
    _, observer, dmp, opt = train(  # one step in 5, whatever it costs: a fixed number of samples
        plan, STEPS, lambda dmp: observe(planner, dmp, every=5, warmup=5, max_overhead=None)
    )
    before = observer.report()
    new_plan = observer.replan()
    after = observer.report()
    kept_itself = (new_plan is plan) is not observer.last_replan["changed"]
    in_place = apply_in_place(observer, dmp, new_plan, world)
    in_place["losses"] = run(dmp, opt, 2, observer, first=STEPS)  # it trains where it is
    # the restart path: a new job with the returned plan, observed with the updated
    # network's prediction of it (made before it ran)
    losses, *_ = train(new_plan, 12, lambda dmp: observer.follow(dmp, new_plan) or observer)
    restarted = observer.report()
    return {
        "kept_itself": kept_itself,
        "restarted": restarted,
        "in_place": in_place,
        "before": before,
        "after": after,
        "plan": str(plan),
        "new_plan": str(new_plan),
        "losses": losses,
    }


def apply_in_place(observer, dmp, new_plan, world: int) -> dict:
    """The observer's ``apply_in_place`` of the re-plan, on the running job; where that
    moves nothing (the plan was kept, or it changes more than a table-wise table's rank and
    is refused), of the job's plan with one table-wise table moved to the next rank, so that
    a move is always made. What it did: the refusal, if any, and whether it left the job as
    it was; the moved tables, where each is now (in the DMP's plan and in this rank's
    shards) and whether its rows arrived unchanged (on rank 0)."""
    running = copy.deepcopy(dmp.plan)
    movable = sorted(n for n, ps in running.plan[EBC].items() if ps.sharding_type == "table_wise")
    rows = {name: full_weight(dmp, name) for name in movable}  # only these can move
    out: dict = {"refused": None, "forced": None}
    try:
        target, moved = new_plan, observer.apply_in_place(new_plan)
    except ValueError as exc:
        out["refused"] = str(exc)
        out["left_as_was"] = str(dmp.plan) == str(running) and observer.plan is not new_plan
        moved = []
    if not moved:  # force one: the first table-wise table, to the next rank
        target = copy.deepcopy(running)
        out["forced"] = name = movable[0]
        to_rank = (target.plan[EBC][name].ranks[0] + 1) % world
        target.plan[EBC][name].ranks = [to_rank]
        for shard in target.plan[EBC][name].sharding_spec.shards:
            shard.placement = torch.distributed._remote_device(f"rank:{to_rank}/cpu")
        moved = observer.apply_in_place(target)
    out["moved"] = moved
    out["observes_it"] = observer.plan is target
    out["tables"] = {}
    for name in moved:
        weight = dmp.state_dict()[f"{EBC}.embedding_bags.{name}.weight"]
        now = full_weight(dmp, name)
        out["tables"][name] = {
            "from": running.plan[EBC][name].ranks,
            "to": target.plan[EBC][name].ranks,
            "dmp_ranks": dmp.plan.plan[EBC][name].ranks,
            "held_here": any(s.tensor.numel() > 0 for s in weight.local_shards()),
            "rows_kept": None if now is None else torch.equal(now, rows[name]),
        }
    return out


def full_weight(dmp, name: str) -> torch.Tensor | None:
    """Table ``name``'s whole weight gathered on rank 0 (None elsewhere); collective."""
    weight = dmp.state_dict()[f"{EBC}.embedding_bags.{name}.weight"]
    full = torch.empty(weight.size()) if dist.get_rank() == 0 else None
    weight.gather(dst=0, out=full)
    return full


@pytest.mark.slow
def test_a_dmp_job_observes_learns_and_replans(tmp_path, comm_model):
    world = 2
    mp.spawn(worker, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    first = results[0]
    assert all(r["before"] == first["before"] and r["after"] == first["after"] for r in results)
    assert all(r["new_plan"] == first["new_plan"] for r in results)
    before, after = first["before"], first["after"]
    assert before["model"] == "checkpoint" and after["model"] == "updated"
    assert before["steps_observed"] == after["steps_observed"] == 8
    for report in (before, after):
        assert [r["rank"] for r in report["ranks"]] == [0, 1]
        for r in report["ranks"]:
            assert r["measured_ms"] > 0 and r["predicted_ms"] > 0
            assert r["measured"]["fwd_ms"] > 0 and r["measured"]["bwd_ms"] > 0
            assert r["measured"]["comm_ms"] > 0  # the all-to-alls were seen
    assert sorted(t for r in after["ranks"] for t in r["tables"] if "t" in t)  # tables named
    decision = after["replan"]
    assert decision["kernels_observed"] == 2  # each rank's fused kernel joined the store
    # the job fed the tables TABLES' pooling, the planner was told TorchRec's default 1.0:
    # the report says so, and the re-plan planned and learnt with what the job fed
    from torchrun_job import TABLES

    fed = {t["table"].rsplit(".", 1)[1]: t for t in after["inputs"]["tables"]}
    assert len(fed) == len(TABLES)
    for i, (_, pooling) in enumerate(TABLES):
        t = fed[f"t{i}"]
        assert t["declared_pooling"] == 1.0
        assert abs(t["observed_pooling"] - pooling) < 0.25 * pooling, (i, t)
    assert sorted(after["inputs"]["mispriced"]) == sorted(decision["inputs_from_job"])
    heavy = {f"t{i}" for i, (_, p) in enumerate(TABLES) if p >= 2}
    assert heavy <= {fqn.rsplit(".", 1)[1] for fqn in decision["inputs_from_job"]}
    assert len(decision["reuse_from_job"]) == len(TABLES)  # every rank's ids reached rank 0
    # these tables' kernels, as the job feeds them, were measured: kept, or discarded where
    # the reference kernel drifted while they were timed (a busy machine; its load is not
    # learnt as the hardware), and then said so
    assert decision["kernels_measured"] + decision["kernels_discarded"] > 0, decision
    # learning from the job brings the prediction of the observed plan to what was measured
    worst_before = max(abs(r["error"]) for r in before["ranks"])
    worst_after = max(abs(r["error"]) for r in after["ranks"])
    assert worst_after < worst_before and worst_after < 0.5, (worst_before, worst_after)
    assert (first["new_plan"] != first["plan"]) is decision["changed"]
    check_in_place([r["in_place"] for r in results], decision["changed"])
    assert all(math.isfinite(x) for r in results for x in r["losses"])
    # a kept plan comes back as the very plan object on every rank (rank 1's plan came
    # through a broadcast): `if new_plan is not plan` means the same on every rank
    assert all(r["kept_itself"] for r in results)
    restarted = first["restarted"]  # the restarted job, observed against its prediction
    assert restarted["model"] == "updated" and restarted["steps_observed"] == 2
    assert all(r["measured_ms"] > 0 and r["predicted_ms"] > 0 for r in restarted["ranks"])


def check_in_place(ranks: list[dict], changed: bool) -> None:
    """What ``apply_in_place`` did on each rank (:func:`apply_in_place`): the same on every
    rank; a kept plan moves nothing and a plan that changes more than table-wise ranks is
    refused with the job left as it was (a move is forced then); every moved table is on its
    new rank, in the DMP's plan and in the shards each rank holds, with its rows unchanged,
    the observer observes the plan moved to, and the job trains on."""
    first = ranks[0]
    for key in ("refused", "forced", "moved"):
        assert all(r[key] == first[key] for r in ranks), key
    if not changed:  # the same plan: nothing to move, so a move was forced
        assert first["refused"] is None and first["forced"] is not None
    elif first["refused"] is not None:  # changes only a restart applies: nothing moved
        assert "restart path" in first["refused"] and first["forced"] is not None
        assert all(r["left_as_was"] for r in ranks)
    else:  # the re-plan's own table-wise moves
        assert first["forced"] is None
    assert first["moved"] and (first["forced"] is None or first["moved"] == [first["forced"]])
    for rank, r in enumerate(ranks):
        assert r["observes_it"]
        for name, table in r["tables"].items():
            assert table["dmp_ranks"] == table["to"] != table["from"], (name, table)
            assert table["held_here"] is (rank in table["to"]), (rank, name, table)
        if rank == 0:
            assert all(t["rows_kept"] for t in r["tables"].values()), r["tables"]
        assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"])


def test_a_restarted_jobs_plan_learns_from_what_was_observed(tmp_path):
    """Automatic mode on a machine the checkpoint prices right: no calibration, until the
    store holds kernels observed in a running job of these tables; then the plan
    fine-tunes on them, measuring nothing."""
    from torchrec_dreamshard.cache.store_keys import job_prefix
    from torchrec_dreamshard.calibration import CalibratingAgent, CalibrationConfig
    from torchrec_dreamshard.calibration.auto import check_machine
    from torchrec_dreamshard.calibration.kernel_samples import OBSERVED, store_kernel
    from torchrec_dreamshard.data.tables import TableSpec
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.policy import DreamShard
    from torchrec_dreamshard.store.cost_store import CostStore

    agent = DreamShard.untrained(seed=0)
    reference = check_machine(agent, None).predicted_ms
    config = CalibrationConfig(budget_s=5.0, store=tmp_path / "store.sqlite", epochs=20)
    tables = [
        TableSpec(name=f"t{i}", rows=1000 * (i + 1), dim=16, pooling_factor=2.0) for i in range(4)
    ]
    task = Task(tables=tables, num_devices=2, memory_bytes=10**8, batch_size=256)

    def planner_agent():
        return CalibratingAgent(agent, config, auto=lambda: reference)

    first = planner_agent()
    first.place(task, mode="greedy")
    assert first.last_calibration is None and not first.learns_from_job
    with CostStore(config.store_path()) as store:
        prefix = job_prefix(store, config.measure, task.batch_size)
        store_kernel(
            store, tables[:2], 256, (3.0, 9.0), 0.0, 0.0, config.measure, prefix + OBSERVED + "a"
        )
    again = planner_agent()
    again.place(task, mode="greedy")
    assert again.learns_from_job and again.last_calibration is not None
    assert again.last_calibration.measured == 0  # nothing measured: the job's kernels
    assert "observed in a running job" in again.adaptation()["why"]


def test_dreamshard_report_prints_and_plots_a_saved_report(tmp_path, capsys, run_cli):
    from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction

    prediction = PlanPrediction([1.0, 2.0], [2.0, 4.0], [1.0, 1.0], [0.0, 0.0], 7.0, [1, 2])
    steps = [
        [StepProfile(20.0, 1.0, 2.0, [(0.0, 1.0)])],
        [StepProfile(21.0, 2.0, 5.0, [(0.0, 1.0)])],
    ]
    path, png = tmp_path / "report.json", tmp_path / "report.png"
    path.write_text(json.dumps(build_report(steps, prediction, [["a"], ["b"]], "updated")))
    assert run_cli(["report", str(path), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "predicted (after learning from the job) against measured per rank" in printed
    assert "bounds the step: rank 1 measured, rank 1 predicted" in printed
    assert png.read_bytes()[:4] == b"\x89PNG"
    path.write_text(json.dumps({"ranks": []}))
    assert run_cli(["report", str(path)]) == 2
    assert "not an observer report" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU topology planned without a GPU")
def test_a_gpu_topology_planned_without_a_gpu_looks_for_no_observations(tmp_path):
    """Planning for CUDA ranks on a machine without one (meta models) with a calibration
    store present: the automatic mode cannot fingerprint the GPU and must not try."""
    from torchrec_dreamshard.calibration import CalibratingAgent, CalibrationConfig
    from torchrec_dreamshard.data.tables import TableSpec
    from torchrec_dreamshard.data.tasks import Task
    from torchrec_dreamshard.measure.config import MeasureConfig
    from torchrec_dreamshard.policy import DreamShard
    from torchrec_dreamshard.store.cost_store import CostStore

    store = tmp_path / "store.sqlite"
    CostStore(store).close()
    config = CalibrationConfig(store=store, measure=MeasureConfig(device="cuda"))
    agent = CalibratingAgent(DreamShard.untrained(seed=0), config, auto=lambda: None)
    tables = [TableSpec(name=f"t{i}", rows=100, dim=8, pooling_factor=1.0) for i in range(3)]
    task = Task(tables=tables, num_devices=2, memory_bytes=10**8, batch_size=64)
    assert len(agent.place(task, mode="greedy")) == 3
    assert agent.last_calibration is None
