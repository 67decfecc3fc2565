"""Learning from the job the planner planned: observe the running DMP job, report each
rank's predicted against measured cost, learn from it and re-plan
(:func:`~torchrec_dreamshard.feedback.observer.observe`, with the planner's
:class:`~torchrec_dreamshard.planner.plans.plan_record.PlanRecord`)."""
