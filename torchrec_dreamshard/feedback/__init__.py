"""Learning from the job the planner planned: observe the running DMP job, report predicted
against measured cost, learn from it and re-plan (:func:`~.observer.observe`)."""
