"""``DreamShardProposal``: what the proposer hands the partitioner."""

from __future__ import annotations

from collections.abc import Iterable

from torchrec.distributed.planner.types import ShardingOption


class DreamShardProposal(list[ShardingOption]):
    """One option per table, as every TorchRec proposal, and which of them the policy places.

    Args:
        options: one sharding option per table (no ranks).
        policy: the fully qualified names of the options the policy places.
        split_widths: the narrowest shard of each policy table that may be split, by fqn.
    """

    def __init__(
        self,
        options: Iterable[ShardingOption] = (),
        policy: Iterable[str] = (),
        split_widths: dict[str, int] | None = None,
    ) -> None:
        super().__init__(options)
        self.policy: frozenset[str] = frozenset(policy)
        self.split_widths: dict[str, int] = dict(split_widths or {})

    def policy_options(self) -> list[ShardingOption]:
        """The options the policy places, in proposal order."""
        return [o for o in self if o.fqn in self.policy]

    def other_options(self) -> list[ShardingOption]:
        """The options TorchRec's partitioner places, in proposal order."""
        return [o for o in self if o.fqn not in self.policy]
