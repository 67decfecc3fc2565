"""TorchRec's own ``DLRM`` (in its training wrapper) over tables of one embedding dim, and
its batches: the model the memory benchmark and the tests' ``torchrun`` job train, where
the point is TorchRec's model as a user writes it (:mod:`.step_model` is the package's own
model, of any dims, for the step timer and the demo).

Tables are given as ``(rows, mean ids per sample)``: table ``t<i>`` fed by feature
``f<i>``, each sample's id count drawn from a Poisson of that mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DENSE_IN = 4  # dense features of the DLRM


def dlrm_train(configs: Sequence, is_weighted: bool = False):
    """TorchRec's ``DLRMTrain`` over the meta-device ``configs`` (``EmbeddingBagConfig``\\ s
    of one embedding dim, which TorchRec's DLRM needs): :data:`DENSE_IN` dense features,
    dense and over arches as wide as that dim, a weighted ``EmbeddingBagCollection`` with
    ``is_weighted``."""
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    dim = configs[0].embedding_dim
    ebc = EmbeddingBagCollection(
        tables=list(configs), is_weighted=is_weighted, device=torch.device("meta")
    )
    dlrm = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=DENSE_IN,
        dense_arch_layer_sizes=[dim, dim],
        over_arch_layer_sizes=[dim, 1],
        dense_device=torch.device("cpu"),
    )
    return DLRMTrain(dlrm)


def table_configs(tables: Sequence[tuple[int, float]], dim: int) -> list:
    """One ``EmbeddingBagConfig`` of ``dim`` per ``(rows, mean ids)``: ``t<i>`` fed by
    ``f<i>``."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"]
        )
        for i, (rows, _) in enumerate(tables)
    ]


def poisson_batch(tables: Sequence[tuple[int, float]], batch: int, rank: int, step: int):
    """Rank ``rank``'s batch of step ``step`` (seeded by both): every sample's id count per
    table a Poisson draw of its mean, ids uniform over its rows, :data:`DENSE_IN` normal
    dense features and a 0/1 label."""
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(1000 * rank + step)
    lengths, values = [], []
    for rows, pooling in tables:
        n = torch.poisson(torch.full((batch,), pooling), generator=g).long()
        lengths.append(n)
        values.append(torch.randint(0, rows, (int(n.sum()),), generator=g))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(len(tables))],
        values=torch.cat(values),
        lengths=torch.cat(lengths),
    )
    return Batch(
        dense_features=torch.randn(batch, DENSE_IN, generator=g),
        sparse_features=kjt,
        labels=torch.randint(0, 2, (batch,), generator=g).float(),
    )
