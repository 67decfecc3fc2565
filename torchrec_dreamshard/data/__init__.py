"""What DreamShard plans: tables and their statistics, tasks and placements, the synthetic
pool, task families, dataset files and column-wise shards (no measurement, costs, policy
or planner here)."""
