"""A model trained under ``DistributedModelParallel`` (fused row-wise Adagrad on the tables,
Adagrad on the rest) and the timing of its steps, for the step timer and the sharding-path
measurement."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def sharded_for_training(
    model: nn.Module,
    plan,
    lr: float,
    table_prefixes: tuple[str, ...],
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``model`` (on the meta device) under DMP with ``plan``, and its optimizer: fused
    row-wise Adagrad on parameters named with ``table_prefixes``, Adagrad on the rest."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec_dreamshard.torchrec_compat import apply_optimizer_in_backward

    tables = [p for n, p in model.named_parameters() if n.startswith(table_prefixes)]
    apply_optimizer_in_backward(RowWiseAdagrad, tables, {"lr": lr})
    env = {} if group is None else {"env": ShardingEnv.from_process_group(group)}
    dmp = DistributedModelParallel(
        model,
        device=device or torch.device("cpu"),
        plan=plan,
        sharders=get_default_sharders(),
        **env,
    )
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=lr),
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def timed_steps(
    step: Callable[[], object],
    warmup: int,
    steps: int,
    drain: int = 0,
    group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
) -> float:
    """The mean ms of ``steps`` timed calls of ``step`` after ``warmup`` (``drain`` more after,
    for a pipeline), from a barrier, the maximum over the ranks of ``group``."""
    cuda = device is not None and device.type == "cuda"
    for _ in range(warmup):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    for _ in range(drain):
        step()
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed.item()) * 1000.0 / steps
