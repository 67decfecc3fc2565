"""What DreamShard plans: tables and tasks, one concept per module.

* :mod:`~torchrec_dreamshard.data.tables`: ``TableSpec``, reuse histograms, features;
* :mod:`~torchrec_dreamshard.data.table_stats`: statistics from ids and KJT batches, and
  specs from TorchRec's configs;
* :mod:`~torchrec_dreamshard.data.workloads`: id batches drawn to a table's statistics;
* :mod:`~torchrec_dreamshard.data.tasks`: ``Task``, placements and the task file;
* :mod:`~torchrec_dreamshard.data.table_pool`: the synthetic DLRM-shaped table pool;
* :mod:`~torchrec_dreamshard.data.sampler`: tasks drawn from a pool;
* :mod:`~torchrec_dreamshard.data.families`: task families for training and judging;
* :mod:`~torchrec_dreamshard.data.datasets`: Meta's DLRM dataset files;
* :mod:`~torchrec_dreamshard.data.splits`: column-wise shards of tables and tasks of shards.

The bottom of the flow: nothing here imports measurement, costs, the policy or the planner.
"""
