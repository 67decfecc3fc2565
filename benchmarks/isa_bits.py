"""Does an instruction-set setting change the package's float results on this CPU?

The fast tests run a second time under another instruction set (``make test-isa``) to
catch a test that holds on one CPU only. That run tests something only where the setting
changes what MKL and ATen compute. This script computes a few things the package computes
(a float32 matmul of an awkward shape, a linear layer, ``log1p(exp(x))``, a sum, and the
bundled cost network rating a batch of placements) and prints a digest of each result's
bits; with ``--against`` it also runs itself under the given environment settings and says
which digests differ.

Usage:
    python benchmarks/isa_bits.py
    python benchmarks/isa_bits.py --against "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2"

With ``--against`` it exits 1 when no digest differs (the setting changes nothing here,
so a second run under it would test nothing); ``--record`` also writes
``results/isa_bits.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import torch

from harness.results_files import RESULTS, machine

PATH = RESULTS / "isa_bits.json"


def digest(t: torch.Tensor) -> str:
    """The first 12 hex digits of the SHA-1 of ``t``'s bytes."""
    return hashlib.sha1(t.detach().contiguous().numpy().tobytes()).hexdigest()[:12]


def computations() -> dict[str, torch.Tensor]:
    """The results whose bits are compared, by name."""
    from torchrec_dreamshard.data.sampler import TaskSampler
    from torchrec_dreamshard.data.table_pool import CPU_POOL_SCALE, synthetic_pool
    from torchrec_dreamshard.policy.checkpoint import load_checkpoint

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 129, generator=gen), torch.randn(129, 61, generator=gen)
    x = torch.randn(4096, generator=gen)
    linear = torch.nn.Linear(129, 61)
    with torch.no_grad():
        linear.weight.copy_(b.T)
        linear.bias.fill_(0.5)
        out = {
            "matmul 37x129 @ 129x61": a @ b,
            "linear 129->61 on 37 rows": linear(a),
            "log1p(exp(x)) on 4096": torch.log1p(torch.exp(x)),
            "sum of 4096": x.sum().reshape(1),
        }
    task = TaskSampler(synthetic_pool(60, scale=CPU_POOL_SCALE), seed=2).sample("test", 24, 5)
    scorer = load_checkpoint(None).scorer(task)
    placements = np.random.default_rng(0).integers(0, 5, size=(33, 24))
    scores = scorer.score_states(*scorer.device_states(placements))
    out["cost network: 33 placements' scores"] = torch.stack([s.double() for s in scores])
    return out


def digests() -> dict[str, str]:
    """:func:`computations`' digests, with this process's settings."""
    return {name: digest(t) for name, t in computations().items()}


def settings() -> dict[str, str]:
    """This process's instruction-set settings: ATen's capability in use and the
    ``ATEN_*`` / ``MKL_*`` environment."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("ATEN_", "MKL_"))}
    return {"aten_capability": torch.backends.cpu.get_cpu_capability(), **env}


def parse_env(text: str) -> dict[str, str]:
    """``"A=1 B=2"`` as a dict; raises ``ValueError`` naming a word without ``=``."""
    pairs = {}
    for word in text.split():
        name, eq, value = word.partition("=")
        if not eq or not name:
            raise ValueError(f"--against takes NAME=VALUE words, got {word!r}")
        pairs[name] = value
    return pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", help='settings to compare with, e.g. "ATEN_CPU_CAPABILITY=avx2"')
    ap.add_argument("--json", action="store_true", help="print this process's digests as JSON")
    ap.add_argument("--record", action="store_true", help=f"with --against: write {PATH}")
    args = ap.parse_args(argv)
    here = digests()
    if args.json:
        print(json.dumps({"settings": settings(), "digests": here}))
        return 0
    if not args.against:
        for name, d in here.items():
            print(f"{d}  {name}")
        return 0
    env = {**os.environ, **parse_env(args.against)}
    run = subprocess.run(
        [sys.executable, __file__, "--json"], env=env, capture_output=True, text=True, check=True
    )
    there = json.loads(run.stdout.splitlines()[-1])
    differ = [name for name in here if here[name] != there["digests"].get(name)]
    for name in here:
        mark = "differs" if name in differ else "same"
        print(f"{here[name]}  {there['digests'][name]}  {mark:7s}  {name}")
    print(f"{settings()} vs {there['settings']}: {len(differ)} of {len(here)} differ")
    if args.record:
        record(here, there, differ)
    return 0 if differ else 1


def record(here: dict[str, str], there: dict, differ: list[str]) -> None:
    """Write :data:`PATH`: both processes' settings and digests, which differ, the machine."""
    PATH.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "machine": machine(),
        "torch": torch.__version__,
        "here": {"settings": settings(), "digests": here},
        "there": there,
        "differ": differ,
    }
    PATH.write_text(json.dumps(data, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
