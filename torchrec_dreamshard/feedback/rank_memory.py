"""What each rank of the running job holds per table (``module.table``), measured in bytes:
FBGEMM state (weights, optimizer), per-step buffers of the sampled steps (ids, pooled output,
its gradient), and the peak (held plus the step's highest transient allocation)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

STATES = ("weights", "momentum1", "momentum2", "prev_iter", "row_counter")  # FBGEMM's
BUFFERS = ("inputs", "outputs", "grads")  # per step


def sharded_kernels(dmp: nn.Module | None, plan: Any) -> list[tuple[str, nn.Module]]:
    """``(plan's module path, kernel)`` of every embedding kernel of ``dmp``'s sharded modules."""
    from torchrec.distributed.types import ShardedModule

    from torchrec_dreamshard.torchrec_compat import lookup_kernels

    if dmp is None:
        return []
    keys = list(plan.plan) if plan is not None else []
    out = []
    for name, module in dmp.named_modules():
        if not isinstance(module, ShardedModule):
            continue
        path = next((k for k in keys if name == k or name.endswith("." + k)), name)
        out.extend((path, kernel) for kernel in lookup_kernels(module))
    return out


def _slices(numel: int, offsets: list[int]) -> list[int]:
    """Each table's element count in a tensor of ``numel`` where the tables start at ``offsets``."""
    ends = sorted(set(offsets)) + [numel]
    following = {start: ends[i + 1] for i, start in enumerate(ends[:-1])}
    return [following[o] - o for o in offsets]


def _placed(states: tuple[torch.Tensor, ...]) -> list[int]:
    """Per table, its bytes in one FBGEMM state ``(dev, host, uvm, placements, offsets)``."""
    dev, host, uvm, placements, offsets = states
    where = {0: dev, 1: uvm, 2: uvm, 3: host, 4: dev}  # FBGEMM's EmbeddingLocation
    tensors = [where[int(p)] for p in placements.tolist()]
    starts = [int(o) for o in offsets.tolist()]
    out = []
    for tensor, start in zip(tensors, starts, strict=True):
        same = [o for t, o in zip(tensors, starts, strict=True) if t is tensor]
        size = _slices(tensor.numel(), same)[same.index(start)]
        out.append(size * tensor.element_size())
    return out


def kernel_state_bytes(kernel: nn.Module) -> dict[str, dict[str, int]]:
    """Per table of ``kernel``, its ``weights`` and ``optimizer`` bytes."""
    tables = [t.name for t in kernel.config.embedding_tables]
    module = kernel.emb_module
    out = {name: {"weights": 0, "optimizer": 0} for name in tables}
    if hasattr(module, "get_states"):  # the fused kernel: weights and optimizer state
        for prefix in STATES:
            try:
                states = module.get_states(prefix)
            except Exception as exc:  # FBGEMM's DoesNotHavePrefix: no such state
                if type(exc).__name__ != "DoesNotHavePrefix":
                    raise
                continue
            part = "weights" if prefix == "weights" else "optimizer"
            for name, size in zip(tables, _placed(states), strict=True):
                out[name][part] += size
        return out
    weights = getattr(module, "weights", None)  # the dense kernel of data-parallel tables
    offsets = getattr(module, "weights_offsets", None)
    if weights is not None and offsets is not None and offsets.numel() == len(tables):
        offs = offsets.tolist()
        for name, size in zip(tables, _slices(weights.numel(), offs), strict=True):
            out[name]["weights"] = size * weights.element_size()
    return out


def state_bytes(kernels: Iterable[tuple[str, nn.Module]]) -> dict[str, dict[str, int]]:
    """Per table (``module.table``), its weights and optimizer bytes on this rank."""
    out: dict[str, dict[str, int]] = {}
    for path, kernel in kernels:
        for name, parts in kernel_state_bytes(kernel).items():
            table = out.setdefault(f"{path}.{name}", {"weights": 0, "optimizer": 0})
            for key, value in parts.items():
                table[key] += value
    return out


def _kernel_storages(kernels: Iterable[tuple[str, nn.Module]]) -> list[torch.Tensor]:
    """The kernels' state tensors (every state, device, host and UVM)."""
    out = []
    for _, kernel in kernels:
        module = kernel.emb_module
        out.extend(module.parameters())
        out.extend(module.buffers())
    return out


def held_bytes(dmp: nn.Module | None, kernels: Iterable[tuple[str, nn.Module]]) -> int:
    """Bytes the rank holds between steps: parameters, gradients, buffers and the kernels'
    state, each storage once."""
    tensors: list[torch.Tensor] = _kernel_storages(kernels)
    if dmp is not None:
        for p in dmp.parameters():
            tensors.append(p)
            if p.grad is not None:
                tensors.append(p.grad)
        tensors.extend(dmp.buffers())
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if t.device.type == "meta":
            continue
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a sharded or wrapper tensor
            continue
        if storage.data_ptr() == 0:
            continue
        seen[(t.device.type, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def transient_peak(events: Iterable[Any], cuda: bool = False) -> int:
    """The highest running sum, in time order, of the profiler events' own net allocations
    (``self_cpu_memory_usage``, or CUDA's): what a step allocated beyond what it started with."""
    deltas = []
    for e in events:
        delta = e.self_cuda_memory_usage if cuda else e.self_cpu_memory_usage
        if delta:
            deltas.append((e.time_range.start, delta))
    running = peak = 0
    for _, delta in sorted(deltas):
        running += delta
        peak = max(peak, running)
    return peak


def _kjt_bytes(features: Any, keys: list[str]) -> int:
    """Bytes of ``features`` (a ``KeyedJaggedTensor``) that belong to ``keys``."""
    lengths = features.length_per_key()
    index = {k: i for i, k in enumerate(features.keys())}
    stride = features.stride()
    values = features.values()
    weights = features.weights_or_none()
    out = 0
    for key in keys:
        if key not in index:
            continue
        ids = lengths[index[key]]
        out += ids * values.element_size() + 2 * stride * features.lengths().element_size()
        if weights is not None:
            out += ids * weights.element_size()
    return out


@dataclass
class StepBuffers:
    """One sampled step's per-step buffers per table: ``inputs``, ``outputs``, ``grads``."""

    tables: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, table: str, part: str, size: int) -> None:
        parts = self.tables.setdefault(table, dict.fromkeys(BUFFERS, 0))
        parts[part] += size


class MemoryRecorder:
    """Per-step buffers of the sampled steps (forward hooks) and, on CUDA, the allocator's peak.

    Args:
        dmp: the job's ``DistributedModelParallel`` (``None``: nothing recorded).
        plan: the job's plan (to name the modules as the plan does).
    """

    def __init__(self, dmp: nn.Module | None, plan: Any = None) -> None:
        self.recording = False
        self.steps: list[StepBuffers] = []
        self.cuda_peaks: list[int] = []
        self._current = StepBuffers()
        self._handles: list[Any] = []
        self._held_at_start = 0
        self.attach(dmp, plan)

    def attach(self, dmp: nn.Module | None, plan: Any = None) -> None:
        """Hook ``dmp``'s kernels (again after a reshard), named as ``plan`` (default: the last)."""
        for handle in self._handles:
            handle.remove()
        self._dmp = dmp
        self._plan = plan if plan is not None else getattr(self, "_plan", None)
        self.kernels = sharded_kernels(dmp, self._plan)
        self._handles = [
            kernel.register_forward_hook(self._hook(path, kernel)) for path, kernel in self.kernels
        ]

    def _hook(self, path: str, kernel: nn.Module) -> Any:
        tables = list(kernel.config.embedding_tables)

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if not self.recording or not args or not isinstance(output, torch.Tensor):
                return
            self._record(path, tables, args[0], output)

        return hook

    def _record(self, path: str, tables: list[Any], features: Any, output: torch.Tensor) -> None:
        rows = output.shape[0] if output.dim() == 2 else 0
        step = self._current
        for table in tables:
            name = f"{path}.{table.name}"
            step.add(name, "inputs", _kjt_bytes(features, list(table.feature_names)))
            width = table.local_cols * max(1, len(table.feature_names))
            step.add(name, "outputs", rows * width * output.element_size())
        if output.requires_grad:
            widths = [
                (f"{path}.{t.name}", t.local_cols * max(1, len(t.feature_names))) for t in tables
            ]
            total = sum(w for _, w in widths) or 1

            def on_grad(grad: torch.Tensor, step: StepBuffers = step) -> None:
                for name, w in widths:
                    step.add(name, "grads", grad.numel() * grad.element_size() * w // total)

            output.register_hook(on_grad)

    def start(self, device: torch.device) -> None:
        """Record the step now starting."""
        self._current = StepBuffers()
        self.recording = True
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self._held_at_start = torch.cuda.memory_allocated(device)

    def finish(self, device: torch.device, keep: bool) -> None:
        """Stop recording; keep the step's buffers (and CUDA peak) where ``keep``."""
        self.recording = False
        if not keep:
            return
        self.steps.append(self._current)
        del self.steps[:-MAX_MEMORY_STEPS]
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) - self._held_at_start
            self.cuda_peaks.append(max(0, peak))
            del self.cuda_peaks[:-MAX_MEMORY_STEPS]

    def clear(self) -> None:
        """Drop what was recorded (a plan no longer run)."""
        self.steps.clear()
        self.cuda_peaks.clear()

    def snapshot(self, transient: list[int]) -> dict[str, Any]:
        """This rank's memory: per table state and median buffers, held bytes and peak
        (``transient``: the profiler's peaks, used where no CUDA peak was recorded)."""
        tables = state_bytes(self.kernels)
        for name, parts in median_buffers(self.steps).items():
            tables.setdefault(name, {"weights": 0, "optimizer": 0}).update(parts)
        for parts in tables.values():
            for key in BUFFERS:
                parts.setdefault(key, 0)
        held = held_bytes(self._dmp, self.kernels)
        peaks = self.cuda_peaks or transient
        return {
            "tables": tables,
            "held": held,
            "transient": max(peaks) if peaks else 0,
            "peak": held + (max(peaks) if peaks else 0),
            "steps": len(self.steps),
        }


MAX_MEMORY_STEPS = 16  # sampled steps whose buffers are kept


def median_buffers(steps: Iterable[StepBuffers]) -> dict[str, dict[str, int]]:
    """Per table, the median over ``steps`` of each per-step buffer."""
    collected: dict[str, dict[str, list[int]]] = {}
    for step in steps:
        for table, parts in step.tables.items():
            for key, value in parts.items():
                collected.setdefault(table, {}).setdefault(key, []).append(value)
    return {
        table: {key: int(statistics.median(values)) for key, values in parts.items()}
        for table, parts in collected.items()
    }
