"""A model trained under ``DistributedModelParallel`` on this rank's process group, and the
timing of its steps: what the end-to-end step timer
(:mod:`torchrec_dreamshard.evaluation.dmp_step`) and the sharding-path measurement
(:mod:`torchrec_dreamshard.measure.sharding_path`) both run.

Embeddings train with TorchRec's fused row-wise Adagrad (``RowWiseAdagrad`` applied in the
backward, fused into the FBGEMM kernel where the plan uses one), the rest with Adagrad.
A timed run's figure is the wall clock over its timed steps, started after a barrier, the
maximum over ranks, divided by the steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def sharded_for_training(
    model: nn.Module, plan, lr: float, table_prefixes: tuple[str, ...]
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``model`` (built on the meta device) under ``DistributedModelParallel`` with
    ``plan`` on CPU, and its optimizer: fused row-wise Adagrad on the parameters whose
    names start with ``table_prefixes`` (the embedding tables), Adagrad on the rest."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec_dreamshard.torchrec_compat import apply_optimizer_in_backward

    tables = [p for n, p in model.named_parameters() if n.startswith(table_prefixes)]
    apply_optimizer_in_backward(RowWiseAdagrad, tables, {"lr": lr})
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), plan=plan, sharders=get_default_sharders()
    )
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=lr),
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def timed_steps(step: Callable[[], object], warmup: int, steps: int, drain: int = 0) -> float:
    """``warmup`` untimed calls of ``step``, ``steps`` timed ones, ``drain`` untimed ones
    after (a pipeline holding batches ahead); the mean timed step in ms, the maximum over
    the ranks of the current process group."""
    for _ in range(warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    for _ in range(drain):
        step()
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item()) * 1000.0 / steps
