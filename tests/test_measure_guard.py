"""Measuring that cannot fail the plan (``measure/guard.py``): what counts as measuring
failed, the record and the one warning; and each failure (the kernel, an out-of-memory,
the timer, a collective, an FBGEMM operator missing from the build) injected on CPU into
calibration and verification through ``DreamShardPlanner.plan``: a plan comes back, one
warning per measuring step names the cause, and the cause is in ``planner.adaptation``."""

from __future__ import annotations

import logging
import math
import weakref

import pytest
import torch
import torch.distributed as dist

from torchrec_dreamshard import calibration as cal
from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task
from torchrec_dreamshard.measure import MeasureConfig, embedding_kernels, guard
from torchrec_dreamshard.measure.guard import MeasureFailure, guarded
from torchrec_dreamshard.policy import DreamShard

FAST = MeasureConfig(rounds=1, iters=2, warmup=1)
ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"
OOM = "CUDA out of memory. Tried to allocate 8.00 GiB"
EVENTS = "Both events must be recorded before calculating elapsed time."
NCCL_TIMEOUT = "Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLTOALL_BASE)"
MISSING_OP = "no_such_operator_in_this_build"


def raise_(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc

    return fail


def missing_fbgemm_op():
    """What ``torch.ops`` raises for an FBGEMM operator the build lacks (the real error)."""
    return getattr(torch.ops.fbgemm, MISSING_OP)


# ----------------------------------------------------------------------------------------
# The guard
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError(ILLEGAL_ACCESS),
        torch.OutOfMemoryError(OOM),
        dist.DistBackendError(NCCL_TIMEOUT),
        MemoryError(),
        TimeoutError("collective timed out"),
        ModuleNotFoundError("No module named 'fbgemm_gpu'", name="fbgemm_gpu"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_failures_of_the_measuring_stack_become_a_record(exc):
    out = guarded("the kernel of t0", raise_(exc), warn=False)
    assert isinstance(out, MeasureFailure)
    assert out.what == "the kernel of t0" and out.error == type(exc).__name__
    assert out.message == str(exc).splitlines()[0] if str(exc) else out.message == ""
    assert out.out_of_memory == isinstance(exc, torch.OutOfMemoryError | MemoryError)
    assert MeasureFailure(**out.to_dict()) == out  # plain, JSON-able


def test_a_missing_fbgemm_operator_is_a_failure_but_another_attribute_error_is_a_bug():
    out = guarded("reference kernel", missing_fbgemm_op, warn=False)
    assert isinstance(out, MeasureFailure) and MISSING_OP in out.message
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        guarded("reference kernel", lambda: object().nope, warn=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_cuda_asked_of_a_cpu_build_of_torch_is_a_failure_but_another_assertion_is_a_bug():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = guarded("reference kernel", lambda: torch.empty(1, device="cuda"), warn=False)
    # a CPU build of torch says so with an AssertionError, a CUDA build without a GPU (TorchRec
    # 1.9's torch) with a RuntimeError: either is a failed measurement
    expected = "RuntimeError" if torch.backends.cuda.is_built() else "AssertionError"
    assert isinstance(out, MeasureFailure) and out.error == expected, out
    with pytest.raises(AssertionError):
        guarded("reference kernel", raise_(AssertionError("a broken invariant")), warn=False)


@pytest.mark.parametrize(
    "exc",
    [ValueError("bad table"), KeyError("t0"), TypeError("x"), KeyboardInterrupt()],
    ids=lambda e: type(e).__name__,
)
def test_input_errors_bugs_and_interrupts_still_raise(exc):
    with pytest.raises(type(exc)):
        guarded("the kernel of t0", raise_(exc))


def test_the_value_is_returned_and_nothing_is_logged(caplog):
    with caplog.at_level(logging.WARNING):
        assert guarded("x", lambda: 3.5) == 3.5
    assert not caplog.records


def test_one_warning_names_the_cause(caplog):
    with caplog.at_level(logging.WARNING):
        guarded("the reference kernel", raise_(RuntimeError(ILLEGAL_ACCESS)))
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert "the reference kernel failed" in text and ILLEGAL_ACCESS in text


@pytest.mark.parametrize("device, emptied", [("cuda", [True]), ("cpu", [])])
def test_an_out_of_memory_on_cuda_empties_the_cache_once_the_failed_frames_are_gone(
    device, emptied, monkeypatch
):
    """The cache is emptied after the failed measurement's tensors are released (its
    frames dropped with the exception), and only for CUDA."""
    held: list[weakref.ref] = []

    def measure():
        block = torch.empty(1024)  # the failed measurement's own tensor
        held.append(weakref.ref(block))
        raise torch.OutOfMemoryError(OOM)

    seen: list[bool] = []
    monkeypatch.setattr(guard, "empty_cuda_cache", lambda: seen.append(held[0]() is None))
    out = guarded("the kernel of t0", measure, device=device, warn=False)
    assert isinstance(out, MeasureFailure) and out.out_of_memory
    assert seen == emptied


def test_an_out_of_memory_kept_as_text_is_recognised():
    """``measure_placement`` keeps its errors as text (``ok=False``): the record still
    says out-of-memory, so the CUDA cache is emptied."""
    text = f"OutOfMemoryError: {OOM}"
    out = guarded("plan", raise_(RuntimeError(text)), warn=False)
    assert isinstance(out, MeasureFailure) and out.out_of_memory


# ----------------------------------------------------------------------------------------
# Calibration and verification, directly
# ----------------------------------------------------------------------------------------


@pytest.fixture
def private_store(tmp_path, monkeypatch, comm_model):
    monkeypatch.setenv(cal.STORE_ENV, str(tmp_path / "calibration.sqlite"))


def tiny_task() -> Task:
    tables = [
        TableSpec(name=f"t{i}", rows=500 * (i + 1), dim=8, pooling_factor=1.0 + i) for i in range(5)
    ]
    return Task(tables=tables, num_devices=2, memory_bytes=10**7, batch_size=64)


def config(**kw) -> cal.CalibrationConfig:
    kw = {"drift_limit": math.inf, "budget_s": 10.0, **kw}
    return cal.CalibrationConfig(measure=FAST, max_groups=3, progress=False, epochs=20, **kw)


def test_a_kernel_that_fails_is_skipped_and_the_others_are_learned(
    private_store, monkeypatch, caplog
):
    """An out-of-memory building any kernel with table t3: the kernels of t3 are skipped
    with their cause, the others measured and fitted, one warning."""
    real = embedding_kernels.FusedKernel._build

    def build(self, arena):
        if any(t.name == "t3" for t in self.tables):
            raise torch.OutOfMemoryError(OOM)
        return real(self, arena)

    monkeypatch.setattr(embedding_kernels.FusedKernel, "_build", build)
    agent = DreamShard.untrained(seed=0)
    with caplog.at_level(logging.WARNING, logger=guard.LOGGER):
        out = cal.calibrate(agent, tiny_task(), config())
    with_t3 = [f for f in out.failures if "t3" in f.what]
    assert with_t3 and all(f.out_of_memory and OOM in f.message for f in out.failures)
    assert out.measured > 0 and out.skipped == len(with_t3)
    assert out.agent is not agent and out.samples == out.measured
    assert len(caplog.records) == 1 and OOM in caplog.records[0].getMessage()
    assert "measuring failed" in out.note and out.to_dict()["failures"][0]["error"]


def test_a_calibration_that_measures_nothing_returns_the_prior_with_the_cause(
    private_store, monkeypatch
):
    monkeypatch.setattr(embedding_kernels, "_fbgemm", missing_fbgemm_op)
    agent = DreamShard.untrained(seed=0)
    out = cal.calibrate(agent, tiny_task(), config())
    assert out.agent is agent and out.measured == 0 and out.samples == 0
    assert out.failures and all(f.error == "AttributeError" for f in out.failures)
    # the first wave failed, then each of its kernels alone; then measuring stopped
    assert len(out.failures) == 1 + cal.KERNELS_PER_CALL
    assert "the checkpoint is used as it is" in out.note


def test_an_input_error_while_calibrating_still_raises(private_store, monkeypatch):
    monkeypatch.setattr(
        embedding_kernels.FusedKernel, "_build", raise_(ValueError("a bad table spec"))
    )
    with pytest.raises(ValueError, match="a bad table spec"):
        cal.calibrate(DreamShard.untrained(seed=0), tiny_task(), config())


def test_a_verification_that_fails_keeps_the_chosen_plan_with_the_cause(caplog):
    agent, task = DreamShard.untrained(seed=0), tiny_task()
    chosen = agent.place(task)
    calls = []

    def step_ms(task, placement):
        calls.append(placement)
        if len(calls) == 3:
            raise RuntimeError(EVENTS)
        return 1.0

    timing = cal.Timing(step_ms, lambda: 2.0)
    with caplog.at_level(logging.WARNING, logger=guard.LOGGER):
        out = cal.verify(agent, task, 2, FAST, extra={"chosen": chosen}, timing=timing)
    assert out.failure is not None and EVENTS in out.failure.message
    assert "verification: measuring plan" in out.failure.what
    assert out.winner.name == "chosen" and out.winner.placement == list(chosen)
    assert not any(p.rounds_ms for p in out.plans)  # nothing half-measured is compared
    assert "verification failed" in out.summary() and out.to_dict()["failure"]
    assert len(caplog.records) == 1 and EVENTS in caplog.records[0].getMessage()


# ----------------------------------------------------------------------------------------
# Through DreamShardPlanner.plan
# ----------------------------------------------------------------------------------------


def inject_kernel_error(monkeypatch) -> str:
    """FBGEMM's kernel raises in its forward, as after a CUDA fault."""
    tbe, *rest = embedding_kernels._fbgemm()

    class Faulting(tbe):
        def forward(self, *args, **kwargs):
            raise RuntimeError(ILLEGAL_ACCESS)

    monkeypatch.setattr(embedding_kernels, "_fbgemm", lambda: (Faulting, *rest))
    return ILLEGAL_ACCESS


def inject_out_of_memory(monkeypatch) -> str:
    """Building a kernel's tables runs out of device memory."""
    monkeypatch.setattr(
        embedding_kernels.FusedKernel, "_build", raise_(torch.OutOfMemoryError(OOM))
    )
    return OOM


def inject_timer_error(monkeypatch) -> str:
    """The kernel runs, then reading its time fails (as CUDA events do)."""
    real = embedding_kernels.FusedKernel.step

    def step(self):
        real(self)
        raise RuntimeError(EVENTS)

    monkeypatch.setattr(embedding_kernels.FusedKernel, "step", step)
    return EVENTS


def inject_collective_error(monkeypatch) -> str:
    """Every collective times out (the all-to-all that calibration fits and verification
    charges is measured on gloo ranks that are threads: nothing is cached)."""
    from torchrec_dreamshard.measure import collective_timing

    monkeypatch.setattr(
        collective_timing, "_time_on_backend", raise_(dist.DistBackendError(NCCL_TIMEOUT))
    )
    return NCCL_TIMEOUT


def inject_missing_op(monkeypatch) -> str:
    monkeypatch.setattr(embedding_kernels, "_fbgemm", missing_fbgemm_op)
    return MISSING_OP


INJECTIONS = {
    "kernel": inject_kernel_error,
    "out_of_memory": inject_out_of_memory,
    "timer": inject_timer_error,
    "collective": inject_collective_error,
    "missing_op": inject_missing_op,
}


@pytest.mark.parametrize("failure", list(INJECTIONS))
def test_the_planner_plans_through_every_measuring_failure(
    failure, tmp_path, monkeypatch, caplog, request
):
    from test_planner_distributed import LOCAL_BATCH, NUM_TABLES, build_model
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from torchrec_dreamshard.planner import DreamShardPlanner

    if failure != "collective":  # a cached all-to-all fit: only the kernels fail
        request.getfixturevalue("comm_model")
    cause = INJECTIONS[failure](monkeypatch)
    table_wise = ParameterConstraints(sharding_types=["table_wise"])
    planner = DreamShardPlanner(
        topology=Topology(world_size=2, compute_device="cpu"),
        batch_size=LOCAL_BATCH,
        agent=DreamShard.untrained(seed=0),
        calibrate=config(store=str(tmp_path / "calibration.sqlite")),
        verify=2,
        constraints={f"t{i}": table_wise for i in range(NUM_TABLES)},
    )
    with caplog.at_level(logging.WARNING, logger=guard.LOGGER):
        plan = planner.plan(build_model(), [EmbeddingBagCollectionSharder()])
    assert plan.plan, "no plan came back"
    warned = [r.getMessage() for r in caplog.records if r.name == guard.LOGGER]
    # one warning per measuring step that failed (calibration, verification), each naming
    # the cause
    # (the calibration in the profile step before TorchRec's loop, the verification after)
    assert len(warned) == 2 and all(cause in w for w in warned), warned
    assert "calibration" in warned[0] and "verification" in warned[1]
    failures = planner.adaptation["measure_failures"]
    assert failures and all(cause in f["message"] for f in failures)
    assert any("calibration" in f["what"] for f in failures)
    assert failures[-1]["what"].startswith("verification")
    outcome = planner.last_verdict.outcome
    assert outcome.placement == outcome.chosen  # the planner's chosen plan stands
    assert planner.last_verdict.kept is None
    if failure != "collective":  # no kernel could be measured: the checkpoint as it is
        assert not planner.adaptation["calibrated"]
        assert planner.agent.current is planner.agent.prior
