"""TorchRec's planner stages as DreamShard fills them: the enumerator, shard estimator,
proposers, partitioner, performance model and stats, and what they read off a search
space.
"""
