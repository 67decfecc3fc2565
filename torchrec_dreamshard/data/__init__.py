"""What DreamShard plans: tables, their statistics and id batches, tasks and placements,
the synthetic pool, task families, Meta's dataset files and column-wise shards. Nothing
here imports measurement, costs, the policy or the planner.
"""
