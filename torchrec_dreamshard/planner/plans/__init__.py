"""Plan values and files: the plan record, the per-rank prediction, the plan file, the CLI's
summary and the broadcast to every rank."""
