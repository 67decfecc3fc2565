"""Packaging for torchrec-dreamshard.

torchrec and FBGEMM are deliberately not in ``install_requires``: ``pip install torchrec``
drags in the CUDA build of ``fbgemm-gpu``, which breaks CPU-only machines. The Makefile
installs ``fbgemm-gpu-cpu`` or ``fbgemm-gpu`` to match the machine, then torchrec with
``--no-deps`` (see README, "Installing by hand").
"""

from setuptools import find_packages, setup

setup(
    name="torchrec-dreamshard",
    version="0.1.0",
    description="A learned embedding-table sharding planner for TorchRec, after DreamShard.",
    python_requires=">=3.11",
    packages=find_packages(include=["torchrec_dreamshard", "torchrec_dreamshard.*"]),
    # py.typed: the package's annotations are its public types (PEP 561), so mypy and
    # pyright check `DreamShardPlanner(...)` against its signature
    package_data={"torchrec_dreamshard": ["py.typed", "checkpoints/*.pt", "checkpoints/*.json"]},
    # matplotlib: the PNG curves of `dreamshard train`, `plan --plot` and `report --plot`
    install_requires=["torch>=2.13,<2.15", "numpy", "tqdm", "matplotlib"],
    entry_points={"console_scripts": ["dreamshard=torchrec_dreamshard.cli:main"]},
)
