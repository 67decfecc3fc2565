"""Plan values and files: the plan record a job is handed, the per-rank prediction, the
plan file TorchRec loads, the CLI's summary and the broadcast to every rank.
"""
