"""Learning from the job the planner planned: observe the running DMP job, report each
rank's predicted against measured cost, learn from it and re-plan
(:meth:`~torchrec_dreamshard.planner.DreamShardPlanner.observe`)."""
