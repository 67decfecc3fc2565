"""The flags of ``dreamshard plan`` (the cluster, calibration and measuring) and what they
make of the task: its cluster (:func:`cluster_task`) and what prices it (:func:`pricing_line`)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any


def table_wise_only(constraints: Mapping[str, Any]) -> dict[str, Any]:
    """The constraints with every table's sharding types set to table-wise."""
    return {
        name: dataclasses.replace(c, sharding_types=["table_wise"])
        for name, c in constraints.items()
    }


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """``--compute-device``, ``--hosts`` and ``--local-world-size`` (over the task file's)."""
    p.add_argument(
        "--compute-device",
        choices=("cpu", "cuda"),
        default=None,
        help="what the devices are (over the task file's compute_device, default cpu): on "
        "cuda memory_bytes is each GPU's HBM; planning for GPUs needs no GPU",
    )
    p.add_argument(
        "--hosts",
        type=int,
        default=None,
        metavar="N",
        help="hosts of --local-world-size devices each (with it; num_devices is hosts x "
        "local world size)",
    )
    p.add_argument(
        "--local-world-size",
        type=int,
        default=None,
        metavar="N",
        help="devices per host (over the task file's local_world_size)",
    )


def add_calibration_args(p: argparse.ArgumentParser, flag: bool = True) -> None:
    """``--calibrate/--no-calibrate`` (when ``flag``), ``--budget-s`` and ``--store``."""
    if flag:
        p.add_argument(
            "--calibrate",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="first measure the task's tables on this machine and fine-tune the cost "
            "network on them (re-uses earlier measurements in the store); default: only "
            "where the checkpoint misprices this machine's reference kernel by over 25%%. "
            "--no-calibrate fine-tunes nothing, but still times the reference kernel and, "
            "where sharding types other than table-wise are offered, the dense kernel, the "
            "collectives and the sharding path (each cached per machine); --no-measure "
            "times nothing",
        )
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="calibration time budget in seconds (default 60)",
    )
    p.add_argument(
        "--store",
        metavar="PATH",
        help="calibration store (default: $DREAMSHARD_CALIBRATION_STORE or "
        "~/.cache/torchrec_dreamshard/calibration.sqlite)",
    )


def add_measuring_args(p: argparse.ArgumentParser) -> None:
    """``--timeout``, ``--profile``, ``--no-measure`` and ``--cache-dir``."""
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the planner's timeout_seconds: it bounds the whole plan, measuring included",
    )
    p.add_argument(
        "--profile",
        metavar="PATH",
        help="a machine profile (dreamshard profile --out) to plan from, measuring nothing",
    )
    p.add_argument(
        "--no-measure",
        action="store_true",
        help="time nothing: the checkpoint's kernels as they are and analytic collectives "
        "from the topology's bandwidths (no calibration, no verification)",
    )
    p.add_argument("--cache-dir", metavar="DIR", help="where measurements are cached")


def cluster_task(task: Any, args: argparse.Namespace) -> Any:
    """``task`` on the cluster the flags describe, over the task file's.

    Raises:
        ValueError: ``--hosts`` without ``--local-world-size``, or a cluster the task's
            memory list does not fit (one entry per device).
    """
    if args.hosts is not None and args.local_world_size is None:
        raise ValueError("--hosts needs --local-world-size (devices per host)")
    changes: dict[str, Any] = {}
    if args.compute_device is not None:
        changes["compute_device"] = args.compute_device
    if args.local_world_size is not None:
        changes["local_world_size"] = args.local_world_size
    if args.hosts is not None:
        changes["num_devices"] = args.hosts * args.local_world_size
    if not changes:
        return task
    try:
        return dataclasses.replace(task, **changes)
    except ValueError as exc:
        raise ValueError(f"{args.task} with the cluster flags: {exc}") from None


def cluster_text(task: Any) -> str:
    """``"cuda, 16 hosts of 8"``: what the task's devices are and how they are hosted."""
    hosts = task.hosts
    per_host = task.num_devices // hosts
    return f"{task.compute_device}, {hosts} host{'s' if hosts > 1 else ''} of {per_host}"


def pricing_line(args: argparse.Namespace, task: Any, profile: Any) -> str:
    """The first line ``dreamshard plan`` prints: what prices the plan, and whether it was
    measured on the devices planned for."""
    import torch

    checkpoint = (
        f"checkpoint {args.checkpoint}'s" if args.checkpoint else "bundled CPU checkpoint's"
    )
    cluster = f"{task.num_devices} devices ({cluster_text(task)})"
    if profile is not None:
        stamp = profile.stamp
        return (
            f"prices: the profile {args.profile} (measured on {stamp.device} "
            f"{stamp.device_name}) for {cluster}; nothing is timed here"
        )
    if args.no_measure:
        why = "--no-measure"
    elif task.compute_device == "cuda" and not torch.cuda.is_available():
        why = "no GPU here; --profile GPU.profile from `dreamshard profile` on one GPU node"
    elif args.calibrate is None:
        return (
            f"prices: the {checkpoint} cost network for {cluster}, checked against this "
            "machine's reference kernel and calibrated on the task's tables here where it "
            "misprices it"
        )
    elif args.calibrate:
        return f"prices: the {checkpoint} cost network, calibrated on this machine for {cluster}"
    else:
        return (
            f"prices: the {checkpoint} cost network as it is for {cluster} (--no-calibrate; "
            "this machine's collectives and dense kernel are timed where other sharding "
            "types are offered)"
        )
    return (
        f"prices: the {checkpoint} cost network, not measured on this cluster of {cluster} ({why})"
    )
