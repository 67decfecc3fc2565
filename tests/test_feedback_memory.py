"""Memory the job really uses: each rank's and table's measured bytes (weights and fused
optimizer state read off the FBGEMM kernels' tensors, per-step buffers on the sampled
steps, the step's peak) beside the plan's storage estimate; the correction learnt from
them, which later plans apply; and the check before the job, which builds each rank's
kernels in one process."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchrec_dreamshard.cost.storage_correction import StorageCorrection
from torchrec_dreamshard.feedback.memory_report import (
    build_memory_report,
    corrected_report,
    learn_correction,
    memory_lines,
)
from torchrec_dreamshard.ranks.spawn import exit_spawned_rank, free_port, local_process_group

EBC = "model.sparse_arch.embedding_bag_collection"


# -- the correction, a plain value ---------------------------------------------------------


def test_a_storage_correction_round_trips_through_json_and_refuses_bad_values():
    c = StorageCorrection({"t0": 2.0, "t1": 0.5}, {"fused": 1.5}, "job 1")
    again = StorageCorrection.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c and again.fingerprint() == c.fingerprint()
    assert c.factor("t0", "fused") == 2.0 and c.factor("t9", "fused") == 1.5
    assert c.factor("t9", "dense") == 1.0 and c.corrected("t1", "fused", 101) == 51
    assert c.merged(StorageCorrection({"t0": 3.0})).tables == {"t0": 3.0, "t1": 0.5}
    for bad in ({"version": 1, "tables": {"t0": -1}}, {"version": 1, "tables": {"t0": "x"}},
                {"version": 9}, [1]):  # fmt: skip
        with pytest.raises(ValueError, match="storage correction"):
            StorageCorrection.from_dict(bad)


def test_the_planners_storage_is_the_corrected_estimate():
    """The enumerator's options carry TorchRec's storage estimate times the factor of
    their table (and kernel), for every shard."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
    from torchrec_dreamshard.planner.stages.enumerators import DreamShardEnumerator
    from torchrec_dreamshard.policy import DreamShard

    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=1000 * (i + 1),
                           feature_names=[f"f{i}"])
        for i in range(3)
    ]  # fmt: skip
    model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    topology = torchrec_topology(2, "cpu")
    agent = DreamShard.untrained(seed=0)
    sharders = [EmbeddingBagCollectionSharder()]
    correction = StorageCorrection({"t0": 2.0}, {"fused": 1.25})
    plain = DreamShardEnumerator(topology, 64, agent=agent).enumerate(model, sharders)
    fixed = DreamShardEnumerator(topology, 64, agent=agent, storage_correction=correction)
    corrected = fixed.enumerate(model, sharders)
    assert len(plain) == len(corrected)
    for a, b in zip(plain, corrected, strict=True):
        factor = correction.factor(a.name, a.compute_kernel)
        for sa, sb in zip(a.shards, b.shards, strict=True):
            assert sb.storage.ddr == math.ceil(sa.storage.ddr * factor), (a.name, factor)


# -- the report ----------------------------------------------------------------------------


def _estimate(rank, table, total, weights, optimizer):
    parts = {"total": total, "weights": weights, "optimizer": optimizer,
             "buffers": total - weights - optimizer}  # fmt: skip
    return {"rank": rank, "table": table, "kernel": "fused", "uncorrected": total,
            "predicted": parts}  # fmt: skip


def _measured(tables, held, transient):
    return {"tables": tables, "held": held, "transient": transient, "peak": held + transient,
            "steps": 3}  # fmt: skip


def test_the_report_names_the_part_that_was_off_and_warns_near_the_cap():
    """Rank 1's table holds twice the optimizer state TorchRec counted: the report names
    the rank, the table and the part; its peak is within the margin of its cap, so it is
    warned of. After learning, every rank is predicted as measured."""
    estimates = [_estimate(0, "m.a", 3000, 1000, 1000), _estimate(1, "m.b", 3000, 1000, 0)]
    parts = {"weights": 1000, "optimizer": 1000, "inputs": 500, "outputs": 400, "grads": 100}
    measured = [
        _measured({"m.a": parts}, 5000, 1000),
        _measured({"m.b": dict(parts, inputs=1000, outputs=800, grads=200)}, 9000, 500),
    ]
    report = build_memory_report(estimates, measured, [20000, 10000], 0.15, 0.10)
    json.dumps(report)
    r0, r1 = report["ranks"]
    assert r0["error"] == 0 and r0["off"] == [] and not r0["near_cap"]
    assert r1["error"] == pytest.approx(1000 / 3000) and r1["off"][0] == "optimizer"
    assert r1["tables"][0]["off"] == "optimizer" and r1["tables"][0]["difference"] == 1000
    assert report["near_cap"] == [1] and r1["near_cap"]
    lines = "\n".join(memory_lines(report))
    assert "rank 1 m.b" in lines and "optimizer off" in lines
    assert "WARNING: rank 1 peaks at" in lines
    learned = learn_correction(report)
    assert learned.tables == {"a": 1.0, "b": pytest.approx(4000 / 3000)}
    after = corrected_report(report, learned)
    assert after["worst_error"] == pytest.approx(0, abs=1e-9)


# -- a DMP job on gloo ranks ---------------------------------------------------------------

JOB_STEPS = 22  # 4 sampled steps: the first after 5, then one in 5


def rank_worker(rank: int, world: int, port: int, out_dir: str, job) -> None:
    """One spawned rank: ``job(rank, world)`` in the local process group, its result
    written to ``out_dir/rank<r>.json``."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    with local_process_group(rank, world, port):
        result = job(rank, world)
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    exit_spawned_rank()


def observed_memory(rank: int, world: int) -> dict:
    from conftest import CPU_DENSE_LIKE, GLOO_LIKE
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrun_job import LOCAL_BATCH, TABLES, build_model, make_batch

    from torchrec_dreamshard import observe
    from torchrec_dreamshard.feedback.memory_check import check_plan
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import torchrec_topology
    from torchrec_dreamshard.torchrec_compat import apply_optimizer_in_backward, lookup_kernels

    sharders = [EmbeddingBagCollectionSharder()]
    model = build_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.05})
    planner = DreamShardPlanner(
        topology=torchrec_topology(world, "cpu"),
        batch_size=LOCAL_BATCH,
        calibrate=False,
        collectives=GLOO_LIKE,
        dense_kernel=CPU_DENSE_LIKE,
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    opt = torch.optim.SGD([p for n, p in dmp.named_parameters() if "embedding_bag" not in n], 0.05)
    observer = observe(planner, dmp, every=5, warmup=5, max_overhead=None)
    for step in range(JOB_STEPS):
        loss, _ = dmp(make_batch(rank, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        observer.step()
    report = observer.report()
    # what this rank's kernels hold, straight off their tensors
    state = 0
    for module in dmp.modules():
        for kernel in lookup_kernels(module) if hasattr(module, "input_dist") else []:
            for states in kernel.emb_module.get_all_states():
                state += sum(t.numel() * t.element_size() for t in states[:3])
    shards = {}
    for name, ps in plan.plan[EBC].items():
        for shard in ps.sharding_spec.shards:
            if shard.placement.rank() == rank:
                shards[f"{EBC}.{name}"] = math.prod(shard.shard_sizes) * 4
    check = None
    if rank == 0:
        pooling = {f"{EBC}.t{i}": p for i, (_, p) in enumerate(TABLES)}
        check = check_plan(plan, build_model_with_adagrad(), LOCAL_BATCH, world, pooling=pooling)
    return {"report": report, "state": state, "shards": shards, "check": check}


def build_model_with_adagrad():
    from torchrun_job import build_model

    from torchrec_dreamshard.torchrec_compat import apply_optimizer_in_backward

    model = build_model()
    ebc = model.model.sparse_arch.embedding_bag_collection
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.05})
    return model


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.another_size)])
def test_a_dmp_job_reports_predicted_and_measured_memory_per_rank_and_table(
    tmp_path, comm_model, world
):
    mp.spawn(
        rank_worker,
        args=(world, free_port(), str(tmp_path), observed_memory),
        nprocs=world,
        join=True,
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    memory = results[0]["report"]["memory"]
    assert all(r["report"]["memory"] == memory for r in results)  # the same on every rank
    assert [r["rank"] for r in memory["ranks"]] == list(range(world))
    assert memory["steps"] == 4
    for r, result in zip(memory["ranks"], results, strict=True):
        tables = {t["table"]: t for t in r["tables"]}
        assert set(tables) == set(result["shards"]), (r["rank"], sorted(tables))
        # weights and optimizer state: exactly the kernels' tensors, table by table
        held = sum(t["measured"]["weights"] + t["measured"]["optimizer"] for t in tables.values())
        assert held == result["state"]
        for name, weight_bytes in result["shards"].items():
            t = tables[name]
            assert t["measured"]["weights"] == weight_bytes
            assert t["measured"]["optimizer"] == weight_bytes  # Adagrad: one value a weight
            assert t["predicted"]["total"] > 0 and t["measured"]["inputs"] > 0
            assert t["measured"]["outputs"] > 0 and t["measured"]["grads"] > 0
        assert r["predicted"] > 0 and r["peak"] >= r["held"] > 0
    # the check before the job: each rank's bytes within 5% of the job's
    for r, checked in zip(memory["ranks"], results[0]["check"], strict=True):
        assert checked["total"] == pytest.approx(r["measured"], rel=0.05), (r, checked)


# -- a cap the estimate fits and the job does not ------------------------------------------

CAP_TABLES, CAP_ROWS, CAP_BATCH = 8, 20_000, 64
SMALL_CAP = 4_600_000  # rank 1: three tables by TorchRec's estimate, one by what they hold


def _cap_batch(rank: int, step: int):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 * rank + step)
    lengths = torch.ones(CAP_TABLES * CAP_BATCH, dtype=torch.long)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(CAP_TABLES)],
        values=torch.randint(0, CAP_ROWS, (CAP_TABLES * CAP_BATCH,), generator=g),
        lengths=lengths,
    )
    return Batch(
        torch.randn(CAP_BATCH, 4, generator=g),
        kjt,
        torch.randint(0, 2, (CAP_BATCH,), generator=g).float(),
    )


def capped_job(rank: int, world: int) -> dict:
    """Tables whose fused Adagrad state (the sharder's ``fused_params``) TorchRec's
    estimate does not count; rank 1's cap fits three by the estimate, and one by what
    they hold."""
    from conftest import CPU_DENSE_LIKE, GLOO_LIKE
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from test_planner_distributed import dlrm_train
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner.types import Storage
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from torchrec_dreamshard import observe
    from torchrec_dreamshard.planner import DreamShardPlanner
    from torchrec_dreamshard.planner.adapters.torchrec_adapter import torchrec_topology

    def model():
        return dlrm_train([
            EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=CAP_ROWS,
                               feature_names=[f"f{i}"])
            for i in range(CAP_TABLES)
        ])  # fmt: skip

    fused = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.05}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    topology = torchrec_topology(world, "cpu")
    for i, device in enumerate(topology.devices):
        device.storage = Storage(hbm=0, ddr=SMALL_CAP if i == 1 else 200_000_000)
    planner = DreamShardPlanner(
        topology=topology,
        batch_size=CAP_BATCH,
        calibrate=False,
        collectives=GLOO_LIKE,
        dense_kernel=CPU_DENSE_LIKE,
        mode="greedy",
    )
    plan = planner.collective_plan(model(), sharders, dist.GroupMember.WORLD)

    def run(plan, observer):
        dmp = DistributedModelParallel(
            model(), device=torch.device("cpu"), plan=plan, sharders=sharders
        )
        opt = torch.optim.SGD(
            [p for n, p in dmp.named_parameters() if "embedding_bag" not in n], 0.05
        )
        observer = observer(dmp)
        for step in range(JOB_STEPS):
            loss, _ = dmp(_cap_batch(rank, step))
            opt.zero_grad()
            loss.backward()
            opt.step()
            observer.step()
        return observer

    observer = run(plan, lambda dmp: observe(planner, dmp, every=5, warmup=5, max_overhead=None))
    before = observer.report()
    new_plan = observer.replan()
    run(new_plan, lambda dmp: observer.follow(dmp, new_plan) or observer)
    after = observer.report()
    return {"before": before, "after": after, "plan": str(plan), "new_plan": str(new_plan)}


@pytest.mark.slow
def test_a_cap_the_estimate_fits_warns_in_the_job_and_the_corrected_replan_fits(
    tmp_path, comm_model
):
    world = 2
    mp.spawn(
        rank_worker,
        args=(world, free_port(), str(tmp_path), capped_job),
        nprocs=world,
        join=True,
    )
    first = json.loads((tmp_path / "rank0.json").read_text())
    before, after = first["before"]["memory"], first["after"]["memory"]
    r1 = before["ranks"][1]
    assert r1["predicted"] <= r1["cap"] * 0.85  # the uncorrected estimate fits
    assert before["near_cap"] == [1] and "optimizer" in r1["off"]  # the job warns, says why
    decision = first["after"]["replan"]
    assert decision["memory_bound"] and decision["changed"], decision
    assert first["new_plan"] != first["plan"]
    assert after["near_cap"] == []  # the corrected re-plan, measured: every rank fits
    for r in after["ranks"]:
        assert r["peak"] < r["cap"], r
        assert abs(r["error"]) < 0.05, r  # predicted (corrected) within 5% of measured


def test_dreamshard_memory_checks_a_plan_before_the_job(tmp_path, capsys, run_cli):
    """Each device's bytes, built on FBGEMM's CPU kernels: Adagrad's state as large as the
    weights, a device over its memory named; a plan that does not match the task refused."""
    tables = [
        {"name": "t0", "rows": 100_000, "dim": 16, "pooling_factor": 2.0},
        {"name": "t1", "rows": 1_000, "dim": 32, "pooling_factor": 20.0},
    ]
    task = {"num_devices": 2, "memory_bytes": 8_000_000, "batch_size": 256, "tables": tables}
    (tmp_path / "task.json").write_text(json.dumps(task))
    (tmp_path / "plan.json").write_text(json.dumps({"placement": {"t0": 0, "t1": 1}}))
    out = tmp_path / "memory.json"
    args = ["memory", str(tmp_path / "task.json"), str(tmp_path / "plan.json"), "--out", str(out)]
    assert run_cli(args) == 0
    devices = json.loads(out.read_text())
    d0, d1 = devices["devices"]
    assert d0["tables"]["t0"]["weights"] == 100_000 * 16 * 4 == d0["tables"]["t0"]["optimizer"]
    assert d1["tables"]["t1"]["inputs"] > 0 and d1["tables"]["t1"]["grads"] > 0
    assert devices["over"] == [0] and "devices over their memory: [0]" in capsys.readouterr().out
    (tmp_path / "plan.json").write_text(json.dumps({"placement": {"t0": 0}}))
    assert run_cli(args[:3]) == 2
    assert "placement does not match the task" in capsys.readouterr().err


def test_dreamshard_report_prints_and_plots_the_memory(tmp_path, capsys, run_cli):
    from torchrec_dreamshard.feedback.observed_job_report import build_report
    from torchrec_dreamshard.feedback.profiling import StepProfile
    from torchrec_dreamshard.planner.plans.plan_prediction import PlanPrediction

    prediction = PlanPrediction([1.0, 2.0], [2.0, 4.0], [1.0, 1.0], [0.0, 0.0], 7.0, [1, 2])
    steps = [
        [StepProfile(20.0, 1.0, 2.0, [(0.0, 1.0)])],
        [StepProfile(21.0, 2.0, 5.0, [(0.0, 1.0)])],
    ]
    report = build_report(steps, prediction, [["m.a"], ["m.b"]], "checkpoint")
    parts = {"weights": 1000, "optimizer": 1000, "inputs": 500, "outputs": 400, "grads": 100}
    report["memory"] = build_memory_report(
        [_estimate(0, "m.a", 3000, 1000, 1000), _estimate(1, "m.b", 3000, 1000, 0)],
        [
            _measured({"m.a": parts}, 5000, 1000),
            _measured({"m.b": dict(parts, inputs=1000)}, 9500, 100),
        ],
        [20000, 10000],
    )
    path, png = tmp_path / "report.json", tmp_path / "report.png"
    path.write_text(json.dumps(report))
    assert run_cli(["report", str(path), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "memory predicted (the plan's storage estimate) against measured" in printed
    assert "WARNING: rank 1 peaks at" in printed and png.read_bytes()[:4] == b"\x89PNG"


def test_a_profile_keeps_the_storage_correction_and_plans_from_it_apply_it(tmp_path):
    """A plan made with a storage correction keeps it in its machine profile; a planner
    given that profile (and no correction of its own) checks the corrected storage."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from torchrec_dreamshard import DreamShardPlanner
    from torchrec_dreamshard.measure.gate import no_measuring
    from torchrec_dreamshard.planner.adapters.topology import torchrec_topology
    from torchrec_dreamshard.profile.machine_profile import MachineProfile

    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=1000 * (i + 1),
                           feature_names=[f"f{i}"])
        for i in range(3)
    ]  # fmt: skip
    model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    sharders = [EmbeddingBagCollectionSharder()]
    correction = StorageCorrection({"t0": 3.0}, {})

    def t0_storage(planner) -> int:
        return sum(s.storage.ddr for o in planner.best_options if o.name == "t0" for s in o.shards)

    topology = torchrec_topology(2, "cpu")
    plain = DreamShardPlanner(topology=topology, batch_size=32, measure=False)
    plain.plan(model, sharders)
    first = DreamShardPlanner(
        topology=topology, batch_size=32, measure=False, storage_correction=correction
    )
    first.plan(model, sharders)
    assert first.profile.storage_correction == correction
    path = tmp_path / "machine.profile"
    first.profile.save(path)
    assert MachineProfile.load(path).storage_correction == correction
    with no_measuring("a planner given a profile times nothing"):
        later = DreamShardPlanner(topology=topology, batch_size=32, profile=path)
        later.plan(model, sharders)
    assert t0_storage(later) == t0_storage(first) > 2.5 * t0_storage(plain)
    bare = DreamShardPlanner(
        topology=topology, batch_size=32, profile=MachineProfile(stamp=first.profile.stamp)
    )
    bare.plan(model, sharders)
    # the profile's correction is part of the plan's context
    assert later.hash_planner_context_inputs_str() != bare.hash_planner_context_inputs_str()
