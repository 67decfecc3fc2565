"""The distributed job's own process group: rank 0 *drives* (:func:`driving`) while the others
*serve* (:func:`serve`) its group tasks (:func:`group_task`, :func:`call_on_group`), every
rank's result or error gathered so one rank's error leaves none waiting."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

_TASKS: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True)
class JobGroup:
    """The process group a plan is measured on, as seen by this rank.

    Attributes:
        rank, world: this rank within ``pg`` and the ranks in it.
        hosts: every rank's host name, in rank order.
    """

    pg: Any
    rank: int
    world: int
    backend: str
    device: torch.device
    hosts: tuple[str, ...]

    @classmethod
    def of(cls, pg: Any) -> JobGroup:
        """This rank's view of ``pg``; every rank of ``pg`` calls it (it gathers the hosts)."""
        import socket

        import torch.distributed as dist

        backend = str(dist.get_backend(pg))
        device = torch.device("cpu")
        if backend == "nccl" and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        world = dist.get_world_size(pg)
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname(), group=pg)
        return cls(pg, dist.get_rank(pg), world, backend, device, tuple(map(str, hosts)))


@dataclass(frozen=True)
class _Request:
    """A group task call, broadcast by rank 0."""

    name: str
    args: tuple


_ACTIVE: list[JobGroup] = []


def active_group() -> JobGroup | None:
    """The group rank 0 is driving measurements on (``None`` outside :func:`driving`)."""
    return _ACTIVE[-1] if _ACTIVE else None


def group_task(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn(group: JobGroup, *args)`` as a group task (a decorator)."""
    _TASKS[_name(fn)] = fn
    return fn


def _name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def _resolve(name: str) -> Callable[..., Any]:
    if name not in _TASKS:  # registered when its module is imported
        importlib.import_module(name.split(":", 1)[0])
    if name not in _TASKS:
        raise ValueError(f"{name!r} is not a registered group task")
    return _TASKS[name]


@contextlib.contextmanager
def driving(group: JobGroup) -> Iterator[JobGroup]:
    """Rank 0: within the block, group tasks run on ``group``; serving ranks leave
    :func:`serve` at the first broadcast that is not a request (the plan)."""
    if group.rank != 0:
        raise ValueError(f"only rank 0 drives a group's measurements, not rank {group.rank}")
    _ACTIVE.append(group)
    try:
        yield group
    finally:
        _ACTIVE.pop()


def broadcast(group: JobGroup, payload: Any) -> Any:
    """``payload`` from rank 0 of ``group`` to every rank (what each rank returns)."""
    import torch.distributed as dist

    box = [payload if group.rank == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group.pg, 0), group=group.pg)
    return box[0]


def serve(group: JobGroup) -> Any:
    """Every rank but 0: run rank 0's group tasks until it broadcasts something else; return it."""
    while True:
        payload = broadcast(group, None)
        if not isinstance(payload, _Request):
            return payload
        _run(group, payload)


def call_on_group(fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run the group task ``fn(group, *args)`` on every rank of the driven group.

    Returns:
        Every rank's result, in rank order.

    Raises:
        RuntimeError: a rank's task failed (every rank's error is named).
    """
    group = active_group()
    if group is None:
        raise RuntimeError("call_on_group needs a driven group (ranks.job_group.driving)")
    request = _Request(_name(fn), tuple(args))
    _resolve(request.name)  # a task not registered fails here, before any rank is asked
    broadcast(group, request)
    gathered = _run(group, request)
    errors = [str(value) for ok, value in gathered if not ok]
    if errors:
        raise RuntimeError(f"measuring on the job's group failed: {'; '.join(errors)}")
    return [value for _, value in gathered]


def _run(group: JobGroup, request: _Request) -> list[tuple[bool, Any]]:
    """Run ``request`` on this rank; every rank's ``(ok, result or error)``."""
    import torch.distributed as dist

    try:
        mine: tuple[bool, Any] = (True, _resolve(request.name)(group, *request.args))
    except Exception as exc:  # gathered, so that no rank is left waiting
        logger.exception("rank %d: group task %s failed", group.rank, request.name)
        mine = (False, f"rank {group.rank}: {type(exc).__name__}: {exc}")
    gathered: list[Any] = [None] * group.world
    dist.all_gather_object(gathered, mine, group=group.pg)
    return gathered


def my_share(items: Sequence[Any], group: JobGroup) -> list[Any]:
    """The items this rank measures of a shared task: ``items[rank::world]``."""
    return list(items[group.rank :: group.world])
