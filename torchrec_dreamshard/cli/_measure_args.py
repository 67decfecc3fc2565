"""Measurement options shared by ``dreamshard collect`` and ``dreamshard evaluate``."""

from __future__ import annotations

import argparse


def add_measure_args(p: argparse.ArgumentParser) -> None:
    """``--backend``, ``--optimizer``, ``--precision``, ``--device`` and the protocol."""
    p.add_argument("--backend", default="local", choices=["local", "distributed"])
    p.add_argument("--optimizer", default="rowwise_adagrad", help="rowwise_adagrad, sgd, adagrad")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations first")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per round")
    p.add_argument("--rounds", type=int, default=None, help="rounds (minimum of medians)")


def config_from_args(args: argparse.Namespace):
    """A :class:`MeasureConfig` from the parsed options (defaults where not given)."""
    from torchrec_dreamshard.measure import MeasureConfig

    given = {k: getattr(args, k) for k in ("warmup", "iters", "rounds", "seed")}
    given = {k: v for k, v in given.items() if v is not None}
    return MeasureConfig(
        optimizer=args.optimizer, precision=args.precision, device=args.device, **given
    )
